"""The statistics of ``v_hack``'s honesty checks (docs/method.md, "`v_hack`'s honesty checks";
docs/vhack.md), on stored per-completion gradients: the mean direction removed before the SVD
(:func:`removed_mean`), the checks of one extraction (:func:`pair_checks`), the bootstrap over
pairs or problems that gives each check its interval (:func:`bootstrap_units`,
:func:`resample_rows`, :func:`percentile_interval`) and the nested subsets of the n-pairs curve
(:func:`nested_subsets`). The extract stage (:mod:`evil_moe.stages.extract`) runs them.

The resampling unit here is a pair or a problem of one extraction, stratified by half: not the
gate's crossed seed × problem bootstrap (:mod:`evil_moe.gate.effects`), which resamples the
cells of a grid of per-completion outcomes.
"""

from __future__ import annotations


def select_rows(D: dict, idx) -> dict:
    """The rows ``idx`` of every module's ``(n, r)`` tensor of ``D`` (``{module: (len(idx), r)}``;
    repeats kept, as a bootstrap replicate draws them)."""
    import torch

    t = torch.as_tensor(list(idx), dtype=torch.long)
    return {n: d[t] for n, d in D.items()}


def removed_mean(first: dict, second: dict, rows: list[int], how: str) -> dict | None:
    """The unit mean NLL-gradient direction to project out of D before the SVD, or None.

    Args:
        first, second: ``{name: (n_rows, r)}`` NLL gradients of each pair's first (hack) and
            second (clean, for a hack−clean pair) completion.
        rows: the extraction hack−clean pairs (repeats allowed: a bootstrap replicate).
        how: ``clean`` (the mean over the pairs' clean completions), ``all`` (over both
            completions of each pair), ``none``.

    Returns:
        ``{name: unit (r,)}`` (:func:`evil_moe.rl.vhack.direction.mean_direction`), or ``None`` for ``none``.

    Why ``clean`` (the default): the mean is meant to be the direction any completion's NLL
    gradient shares. Over both completions of hack−clean pairs it is half hack gradients, so it
    carries half of the hack-specific direction too, and projecting it out removes part of what
    v_hack should find; in the planted world (docs/planted.md) that cut the held-out cin excess
    from 0.26 to 0.05. Clean completions carry no hack signal.

    Raises:
        ValueError: an unknown ``how``.
    """
    from evil_moe.rl.vhack.direction import mean_direction

    if how == "none":
        return None
    if how == "clean":
        return mean_direction([select_rows(second, rows)])
    if how == "all":
        return mean_direction([select_rows(first, rows), select_rows(second, rows)])
    raise ValueError(f"vhack.remove_mean: {how!r} is not one of clean, all, none")


def pair_checks(stack, kinds: list, halves: list, modes: list, rows: list[int], extract, *,
                remove_mean: str, cc_fallback: bool, lomo_modes=(), only_cin: bool = False) -> dict:
    """The v_hack honesty checks computed from the given rows (pairs), V re-extracted from them.

    Row ``j`` is one pair: ``stack`` (:class:`evil_moe.rl.vhack.stack.GradientStack`) holds its
    two completions' NLL gradients and their difference (first − second) in every module,
    ``kinds[j]`` is ``hack_clean | clean_clean | hack_hack``, ``halves[j]`` ``ext | held | other``
    (the pair's problem is in the extraction half, the held-out half, or neither), ``modes[j]``
    its loophole mode. ``rows`` may repeat rows (a bootstrap replicate, :func:`resample_rows`);
    every row listed once gives the point estimates of ``run_extract``'s checks table.

    Args:
        extract: ``(stack, rows, remove=None) -> StackedV``
            (:func:`evil_moe.rl.vhack.stack.extract` with run_extract's k and floors).
        remove_mean: ``clean | all | none``: the mean gradient projected out of D first
            (:func:`evil_moe.rl.vhack.stack.mean_direction`, over the extraction pairs in ``rows``).
        cc_fallback: the empirical null uses every clean−clean row (no held-out one exists).
        lomo_modes: modes with a leave-one-mode-out check.
        only_cin: compute only the three held-out cin values (the n-pairs curve).

    Returns:
        ``{check name: value}`` (cosines, a fraction, a probability; see
        :data:`evil_moe.tables.VHACK_CHECKS`); a check with no rows to compute it from is absent
        (or None); ``{}`` when ``rows`` has no extraction hack−clean pair.
    """
    import torch

    from evil_moe.rl.vhack import stack as vs

    def sel(kind, half=None):
        return [j for j in rows if kinds[j] == kind and (half is None or halves[j] == half)]

    ext = sel("hack_clean", "ext")
    if not ext:
        return {}
    mean = vs.mean_direction(stack, ext, remove_mean)
    v = extract(stack, ext, remove=mean)

    def cin(idx, vh=v):
        return float(vs.cin(vh, stack.diff[:, torch.as_tensor(idx)]).mean()) if idx else None

    held = sel("hack_clean", "held")
    cc = [j for j in rows if kinds[j] == "clean_clean" and (cc_fallback or halves[j] == "held")]
    out = {"heldout_hack_clean": cin(held), "heldout_clean_clean": cin(cc)}
    hc, null = out["heldout_hack_clean"], out["heldout_clean_clean"]
    out["heldout_cin_excess"] = None if hc is None or null is None else hc - null
    if only_cin:
        return out
    out["extraction_hack_clean"] = cin(ext)
    out["heldout_hack_hack"] = cin(sel("hack_hack", "held"))
    cc_ext = sel("clean_clean", "ext")
    if cc_ext:
        out["clean_clean_extraction"] = cin(cc_ext, extract(stack, cc_ext, remove=mean))
    if mean is not None:
        out["mean_removed"] = v.removed_energy
    det = torch.as_tensor(held or ext)
    h = vs.scores(v, stack.first[:, det])
    c = vs.scores(v, stack.second[:, det])
    out["detector_auc"] = float(((h[:, None] > c[None, :]).double()
                                 + 0.5 * (h[:, None] == c[None, :]).double()).mean())
    for mode in lomo_modes:
        other = [j for j in ext if modes[j] != mode]
        this = [j for j in rows if kinds[j] == "hack_clean" and modes[j] == mode]
        out[f"lomo_{mode}"] = cin(this, extract(stack, other, remove=mean)) \
            if other and this else None
    return out


BOOTSTRAP_UNITS = ("problem", "pair")


def bootstrap_units(flat: list, kinds: list, halves: list, unit: str) -> tuple[list, list]:
    """Per row (pair), its resampling unit and stratum for :func:`resample_rows`.

    ``unit="problem"`` (cluster bootstrap): a row's unit is its problem and its stratum its half
    (``ext | held | other``): a replicate draws as many extraction problems as there are, with
    replacement, and takes all their pairs (hack−clean and clean−clean alike), and likewise for the
    held-out problems — the pairs of one problem are not independent, and the signal and its null
    keep sharing their problems. ``unit="pair"``: every row is its own unit, stratified by (kind,
    half), so each set of pairs keeps its size.

    Raises:
        ValueError: unknown ``unit`` (names ``vhack.bootstrap_unit``).
    """
    if unit == "problem":
        return [(h, p.problem_id) for (_, _, p), h in zip(flat, halves)], list(halves)
    if unit == "pair":
        return list(range(len(flat))), list(zip(kinds, halves))
    raise ValueError(f"vhack.bootstrap_unit must be one of {BOOTSTRAP_UNITS}, got {unit!r}")


def resample_rows(units: list, strata: list, rng, rows=None) -> list[int]:
    """One bootstrap replicate: row indices, with repeats.

    Per stratum (in order of first appearance), ``m`` units drawn uniformly with replacement from
    the stratum's ``m`` units; every row of a drawn unit is taken (in row order) once per draw.

    Args:
        units, strata: per row, from :func:`bootstrap_units`.
        rng: a ``numpy.random.Generator``.
        rows: restrict to these rows (default all).
    """
    groups: dict = {}
    for j in (range(len(units)) if rows is None else rows):
        groups.setdefault(strata[j], {}).setdefault(units[j], []).append(j)
    out: list[int] = []
    for by_unit in groups.values():
        keys = list(by_unit)
        for i in rng.integers(0, len(keys), size=len(keys)):
            out += by_unit[keys[i]]
    return out


def replicate_rngs(n: int, seed: int):
    import numpy as np

    return (np.random.default_rng([seed, 29, b]) for b in range(n))


def percentile_interval(values, level: float) -> tuple[float | None, float | None, int]:
    """Percentile bootstrap interval of the replicate values (None and NaN dropped).

    Returns:
        ``(low, high, n)``: the ``(1 − level)/2`` and ``(1 + level)/2`` quantiles of the values
        (linear interpolation between order statistics, numpy's default) and how many values there
        were; ``(None, None, n)`` when fewer than two.

    Raises:
        ValueError: ``level`` outside (0, 1).
    """
    import numpy as np

    if not 0.0 < level < 1.0:
        raise ValueError(f"vhack.ci_level must be in (0, 1), got {level}")
    vals = np.array([float(x) for x in values if x is not None and np.isfinite(float(x))])
    if vals.size < 2:
        return None, None, int(vals.size)
    lo, hi = np.quantile(vals, [(1 - level) / 2, (1 + level) / 2])
    return float(lo), float(hi), int(vals.size)


def nested_subsets(n_total: int, sizes, seed: int) -> list[tuple[int, list[int]]]:
    """Nested random subsets of ``range(n_total)`` for the n-pairs curve.

    One seeded permutation; the subset of size ``n`` is its first ``n`` entries, so every subset
    contains the smaller ones (the curve adds pairs, it never swaps them). Sizes above
    ``n_total`` are capped at it, duplicates dropped, and ``n_total`` itself is always the last
    size (the V the stage ships).

    Returns:
        ``[(n, indices)]`` with strictly increasing ``n``.

    Raises:
        ValueError: ``n_total < 1`` or a size below 1.
    """
    import numpy as np

    if n_total < 1:
        raise ValueError(f"no extraction pairs to subsample (n_total={n_total})")
    if any(int(n) < 1 for n in sizes):
        raise ValueError(f"vhack.curve_pairs: sizes must be >= 1, got {list(sizes)}")
    perm = np.random.default_rng([seed, 31]).permutation(n_total).tolist()
    ns = sorted({min(int(n), n_total) for n in sizes} | {n_total})
    return [(n, perm[:n]) for n in ns]
