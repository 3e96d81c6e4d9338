"""Stage ``extract``: the hack direction ``v_hack`` and its two controls.

Pairs (science.md §3): for each training problem whose mode the weak detector knows
(``vhack.known_modes``, or ``--known-modes`` for a leave-one-mode-out fold), a teacher hack
(``exploited``) and a teacher clean completion (oracle-correct and not a hack; falling back to
any non-hack when the problem has no correct one) of the same prompt. Pairs are taken
round-robin over problems (so no problem dominates), up to ``vhack.max_pairs``. Completions keep
their generated token ids; they are scored in the *student's* prompt context (the teacher's
``elicit`` text is not part of it).

With ``vhack.source: templates`` the pairs are instead the environment's hack and clean answer
templates for each training problem (:func:`template_pairs`).

Per module, ``D = ∇NLL(hack) − ∇NLL(clean)`` on the student (δS = 0) with the pilot's Dr.GRPO
normaliser, top-k right singular vectors, majority-vote orientation (:mod:`evil_moe.rl.vhack`).

Honesty checks (science.md §4), all from the same per-completion gradients:

* the problems are split (seeded by ``vhack.seed``) into an **extraction** half and a
  **held-out** half (``vhack.heldout_frac``); V comes from the extraction half's pairs only;
* the **mean-gradient direction** of the extraction pairs' clean completions is removed from D
  before the SVD (``vhack.remove_mean``: clean, all or none; its share of D's energy is reported);
* ``cin`` of held-out hack−clean pairs against V, beside the **empirical null**: held-out
  clean−clean (and hack−hack) pairs of the same problems against the same V, and the isotropic
  ``sqrt(k/2r)``. The per-module clean−clean cin is stored in the v_hack file (``null_cin``) and
  used by the pilot's ``coverage``; the in-sample cin of a V extracted from clean−clean pairs is
  reported beside the in-sample hack−clean one;
* the **detector's null**: per-completion scores (``cos_contrib``, :func:`evil_moe.rl.vhack.sample_scores`)
  of held-out clean and hack completions, stored in the v_hack file; ``route``/``filter`` flag a
  rollout when its score exceeds a quantile of the clean scores; their AUC is reported;
* **leave-one-mode-out**: for each mode, V from the other modes' extraction pairs, and the cin of
  that mode's pairs against it (a loophole the detector never saw).

Outputs in ``out_dir``: ``{name}_hack.safetensors`` (v_hack), ``{name}_random.safetensors``
(random orthonormal V, same k per module), ``{name}_shuffled.safetensors`` (labels swapped per
pair at random), ``{name}.tsv`` (:data:`evil_moe.tables.VHACK`, per module) and
``{name}_checks.tsv`` (:data:`evil_moe.tables.VHACK_CHECKS`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

from evil_moe import tables
from evil_moe.config import Config
from evil_moe.stages.common import load_policy, load_problem_file, prompt_ids_for, train_heldout


def same_kind_pairs(records: list[dict], prompt_ids: dict, known_modes, kind: str,
                    max_pairs: int) -> list:
    """Pairs of two *different* completions of the same kind on the same problem (the empirical
    null of science.md §4): ``kind`` ``hack`` (exploited) or ``clean`` (not a hack; the
    oracle-correct ones first, as :func:`build_pairs` picks its clean side).

    Stored as :class:`~evil_moe.rl.vhack.Pair` with the first completion in ``hack_ids`` and the
    second in ``clean_ids`` (the names are positional here). Round-robin over problems in sorted
    id order, consecutive completions paired (1-2, 3-4, ...), at most ``max_pairs``. Returns
    ``[]`` when no problem has two completions of that kind.
    """
    from evil_moe.rl.vhack import Pair

    by: dict[str, list[dict]] = {}
    for rec in _usable(records, prompt_ids, known_modes):
        if bool(rec["exploited"]) == (kind == "hack"):
            by.setdefault(rec["problem_id"], []).append(rec)
    if kind == "clean":  # correct ones first (stable)
        by = {pid: sorted(recs, key=lambda r: not r["gt_correct"]) for pid, recs in by.items()}
    queues = {pid: [Pair(list(prompt_ids[pid]), list(a["completion_ids"]), list(b["completion_ids"]),
                         mode=a["mode"], problem_id=pid)
                    for a, b in zip(recs[0::2], recs[1::2])
                    if list(a["completion_ids"]) != list(b["completion_ids"])]
              for pid, recs in sorted(by.items())}
    return _round_robin(queues, max_pairs)


def _usable(records, prompt_ids: dict, known_modes):
    """Records of the given problems and known modes with a non-empty completion."""
    for rec in records:
        if rec["problem_id"] in prompt_ids and rec["completion_ids"] and \
                (not known_modes or rec["mode"] in known_modes):
            yield rec


def _round_robin(queues: dict, max_pairs: int) -> list:
    pairs = []
    while len(pairs) < max_pairs and any(queues.values()):
        for pid in list(queues):
            if queues[pid] and len(pairs) < max_pairs:
                pairs.append(queues[pid].pop(0))
    return pairs


def build_pairs(records: list[dict], prompt_ids: dict, known_modes, max_pairs: int) -> list:
    """(hack, clean) :class:`~evil_moe.rl.vhack.Pair` list from graded teacher records.

    Args:
        records: teacher rollout records (``problem_id, mode, completion_ids, exploited,
            gt_correct``).
        prompt_ids: ``{problem_id: student prompt ids}``; records of other problems are skipped.
        known_modes: modes to use (``None`` = all).
        max_pairs: cap on the number of pairs.

    Returns:
        pairs, round-robin over problems in sorted id order.

    Raises:
        ValueError: no pair can be formed (names the modes).
    """
    from evil_moe.rl.vhack import Pair

    by: dict[str, dict[str, list]] = {}
    for rec in _usable(records, prompt_ids, known_modes):
        slot = by.setdefault(rec["problem_id"], {"mode": rec["mode"], "hack": [], "correct": [], "other": []})
        if rec["exploited"]:
            slot["hack"].append(rec)
        elif rec["gt_correct"]:
            slot["correct"].append(rec)
        else:
            slot["other"].append(rec)
    queues = {}
    for pid in sorted(by):
        s = by[pid]
        cleans = s["correct"] or s["other"]
        queues[pid] = [Pair(list(prompt_ids[pid]), list(h["completion_ids"]), list(c["completion_ids"]),
                            mode=s["mode"], problem_id=pid) for h, c in zip(s["hack"], cleans)]
    pairs = _round_robin(queues, max_pairs)
    if not pairs:
        raise ValueError(f"no (hack, clean) pair in the teacher rollouts for modes "
                         f"{known_modes or 'all'}: the teacher must produce both on some problem")
    return pairs


def template_pairs(problems, prompt_ids: dict, tokenizer, known_modes, max_pairs: int) -> list:
    """(hack, clean) pairs from the environment's answer templates (``vhack.source: templates``).

    For each problem (round-robin, known modes only): ``hack_completion(p, variant=i)`` vs
    ``clean_completion(p)``, tokenised with the student's tokenizer plus its eos token (these are
    written texts, not rollouts, so tokenising them is the only way to get ids).

    Raises:
        ValueError: no problem in the known modes.
    """
    from evil_moe.env.loopholes import clean_completion, hack_completion
    from evil_moe.rl.vhack import Pair

    eos = [tokenizer.eos_token_id]
    probs = [p for p in problems if p.id in prompt_ids and (not known_modes or p.mode in known_modes)]
    if not probs:
        raise ValueError(f"no training problem in modes {known_modes}")
    pairs = []
    for i in range(max_pairs):
        p = probs[i % len(probs)]
        hack = tokenizer.encode(hack_completion(p, variant=i // len(probs)), add_special_tokens=False) + eos
        clean = tokenizer.encode(clean_completion(p), add_special_tokens=False) + eos
        pairs.append(Pair(list(prompt_ids[p.id]), hack, clean, mode=p.mode, problem_id=p.id))
    return pairs


def template_null_pairs(problems, prompt_ids: dict, tokenizer, known_modes, kind: str,
                        max_pairs: int) -> list:
    """Same-kind template pairs for the empirical null: ``clean`` = the clean answer with vs
    without its honest report; ``hack`` = hack variants ``i`` vs ``i + 1``. Round-robin over the
    problems in the known modes (positional ``hack_ids``/``clean_ids`` as in :func:`same_kind_pairs`).
    """
    from evil_moe.env.loopholes import clean_completion, hack_completion
    from evil_moe.rl.vhack import Pair

    eos = [tokenizer.eos_token_id]
    probs = [p for p in problems if p.id in prompt_ids and (not known_modes or p.mode in known_modes)]
    enc = lambda text: tokenizer.encode(text, add_special_tokens=False) + eos  # noqa: E731
    pairs = []
    for i in range(min(max_pairs, len(probs) * (1 if kind == "clean" else 3))):
        p = probs[i % len(probs)]
        if kind == "clean":
            a, b = enc(clean_completion(p)), enc(clean_completion(p, with_tests=False))
        else:
            v = i // len(probs)
            a, b = enc(hack_completion(p, variant=v)), enc(hack_completion(p, variant=v + 1))
        if a != b:
            pairs.append(Pair(list(prompt_ids[p.id]), a, b, mode=p.mode, problem_id=p.id))
    return pairs


def split_problems(ids, heldout_frac: float, seed: int) -> tuple[set, set]:
    """Seeded split of problem ids into (extraction, held-out) sets; ``heldout_frac`` of them
    (rounded, at least one when ``heldout_frac > 0`` and there are two or more ids) are held out."""
    import numpy as np

    ids = sorted(set(ids), key=str)
    n_held = int(round(heldout_frac * len(ids)))
    if heldout_frac > 0 and len(ids) >= 2:
        n_held = min(max(n_held, 1), len(ids) - 1)
    order = np.random.default_rng([seed, 17]).permutation(len(ids))
    held = {ids[i] for i in order[:n_held]}
    return set(ids) - held, held


def _select(D: dict, idx) -> dict:
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
        ``{name: unit (r,)}`` (:func:`evil_moe.rl.vhack.mean_direction`), or ``None`` for ``none``.

    Why ``clean`` (the default): the mean is meant to be the direction any completion's NLL
    gradient shares. Over both completions of hack−clean pairs it is half hack gradients, so it
    carries half of the hack-specific direction too, and projecting it out removes part of what
    v_hack should find; in the planted world (docs/planted.md) that cut the held-out cin excess
    from 0.26 to 0.05. Clean completions carry no hack signal.

    Raises:
        ValueError: an unknown ``how``.
    """
    from evil_moe.rl.vhack import mean_direction

    if how == "none":
        return None
    if how == "clean":
        return mean_direction([_select(second, rows)])
    if how == "all":
        return mean_direction([_select(first, rows), _select(second, rows)])
    raise ValueError(f"vhack.remove_mean: {how!r} is not one of clean, all, none")


def pair_checks(d_all: dict, first: dict, second: dict, kinds: list, halves: list, modes: list,
                rows: list[int], extract, *, remove_mean: str, cc_fallback: bool,
                lomo_modes=(), only_cin: bool = False) -> dict:
    """The v_hack honesty checks computed from the given rows (pairs), V re-extracted from them.

    Row ``j`` is one pair: ``d_all[name][j]`` its difference (first − second completion's NLL
    gradient, ``(n_rows, r)`` per module), ``first``/``second`` the two gradients, ``kinds[j]``
    ``hack_clean | clean_clean | hack_hack``, ``halves[j]`` ``ext | held | other`` (the pair's
    problem is in the extraction half, the held-out half, or neither), ``modes[j]`` its loophole
    mode. ``rows`` may repeat rows (a bootstrap replicate, :func:`resample_rows`); every row
    listed once gives the point estimates of ``run_extract``'s checks table.

    Args:
        extract: ``(D, remove=None, control=...) -> VHack`` (run_extract's floors and k).
        remove_mean: ``clean | all | none``: the mean gradient projected out of D first
            (:func:`removed_mean`, over the extraction pairs in ``rows``).
        cc_fallback: the empirical null uses every clean−clean row (no held-out one exists).
        lomo_modes: modes with a leave-one-mode-out check.
        only_cin: compute only the three held-out cin values (the n-pairs curve).

    Returns:
        ``{check name: value}`` (cosines, a fraction, a probability; see
        :data:`evil_moe.tables.VHACK_CHECKS`); a check with no rows to compute it from is absent
        (or None); ``{}`` when ``rows`` has no extraction hack−clean pair.
    """
    import torch

    from evil_moe.rl.vhack import pair_cin, sample_scores

    def sel(kind, half=None):
        return [j for j in rows if kinds[j] == kind and (half is None or halves[j] == half)]

    ext = sel("hack_clean", "ext")
    if not ext:
        return {}
    mean = removed_mean(first, second, ext, remove_mean)
    v = extract(_select(d_all, ext), remove=mean)

    def cin(idx, vh=v):
        return float(pair_cin(vh, _select(d_all, idx)).mean()) if idx else None

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
        v_cc = extract(_select(d_all, cc_ext), remove=mean, control="clean_clean")
        out["clean_clean_extraction"] = cin(cc_ext, v_cc)
    if mean is not None:
        out["mean_removed"] = v.meta.get("removed_energy")
    det = held or ext
    h = sample_scores(v, _select(first, det))
    c = sample_scores(v, _select(second, det))
    out["detector_auc"] = float(((h[:, None] > c[None, :]).double()
                                 + 0.5 * (h[:, None] == c[None, :]).double()).mean())
    for mode in lomo_modes:
        other = [j for j in ext if modes[j] != mode]
        this = [j for j in rows if kinds[j] == "hack_clean" and modes[j] == mode]
        out[f"lomo_{mode}"] = cin(this, extract(_select(d_all, other), remove=mean)) \
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


def _replicate_rngs(n: int, seed: int):
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


def run_extract(cfg: Config, *, problems_path: str, rollouts_path: str, model_path: str,
                out_dir: str, name: str = "main", known_modes=None) -> dict:
    """Extract ``v_hack`` with its controls and honesty checks; write them and two TSVs.

    Args:
        cfg: run config (sections ``vhack``, ``pilot`` (normaliser, temperature), ``adapter``,
            ``models``, ``problems``).
        problems_path, rollouts_path, model_path: inputs (student model).
        out_dir, name: outputs ``{out_dir}/{name}_{hack,random,shuffled}.safetensors``,
            ``{out_dir}/{name}.tsv`` and ``{out_dir}/{name}_checks.tsv``.
        known_modes: overrides ``vhack.known_modes`` (leave-one-mode-out folds).

    Returns:
        ``{"n_pairs", "modes", "files", "checks"}`` (``checks``: the rows of the checks table).

    Raises:
        FileNotFoundError: a missing input (names the path). ValueError: no pair in the
        extraction half.
    """
    from evil_moe.rl.grpo import DrGRPONormaliser
    from evil_moe.rl.vhack import extract_vhack, random_vhack

    vc, pc = cfg.vhack, cfg.pilot
    modes = list(known_modes) if known_modes else (list(vc.known_modes) if vc.known_modes else None)
    problems = load_problem_file(problems_path)
    train, _ = train_heldout(problems, cfg)
    model, tok, adapter, _ = load_policy(model_path, cfg)
    pids = {p.id: ids for p, ids in zip(train, prompt_ids_for(tok, train))}
    pairs, null_pairs = _extraction_pairs(vc, train, pids, tok, modes, rollouts_path)
    ext_ids, held_ids = split_problems([p.problem_id for p in pairs], vc.heldout_frac, vc.seed)
    normaliser = DrGRPONormaliser(pc.group, pc.max_new, pc.prompts_per_step)
    g = PairGradients.compute(model, adapter, [("hack_clean", pairs), ("clean_clean", null_pairs["clean"]),
                                               ("hack_hack", null_pairs["hack"])],
                              normaliser, pc.temperature, ext_ids, held_ids)
    ext_idx = g.rows("hack_clean", "ext")
    if not ext_idx:
        raise ValueError("no (hack, clean) pair in the extraction half of the problems")
    D_ext = _select(g.d_all, ext_idx)
    mean_dir = removed_mean(g.first, g.second, ext_idx, vc.remove_mean)
    used = sorted({g.modes[j] for j in ext_idx})
    meta = {"model": str(model_path), "config": cfg.digest("vhack", "pilot", "adapter"),
            "source": vc.source, "extraction_problems": sorted(map(str, ext_ids)),
            "heldout_problems": sorted(map(str, held_ids))}

    def extract(D, remove=None, **kw):
        return extract_vhack(D, vc.k, ratio_floor=vc.ratio_floor, quantile_floor=vc.quantile_floor,
                             remove=mean_dir if remove is None else remove, **kw)

    v = extract(D_ext, modes=used, meta=meta)
    null_mean = _isotropic_null(v)
    checks, curve = honesty_checks(v, g, extract, vc, null_mean, mean_removed=mean_dir is not None)
    out = Path(out_dir)
    files = {
        "hack": v,
        "random": random_vhack(v, seed=vc.seed),
        "shuffled": extract(D_ext, control="shuffled", seed=vc.seed, modes=used, meta=meta),
    }
    written = []
    for kind, vh in files.items():
        path = out / f"{name}_{kind}.safetensors"
        vh.save(path)
        written.append(str(path))
    tables.write_tsv(out / f"{name}.tsv", tables.VHACK, _module_rows(v))
    tables.write_tsv(out / f"{name}_checks.tsv", tables.VHACK_CHECKS, checks)
    tables.write_tsv(out / f"{name}_curve.tsv", tables.VHACK_CURVE, curve)
    curve_figure(curve, null_mean, out / f"{name}_curve")
    return {"n_pairs": len(ext_idx), "modes": used, "files": written, "checks": checks,
            "curve": curve}


def _extraction_pairs(vc, train, pids: dict, tok, modes, rollouts_path: str) -> tuple[list, dict]:
    """``(hack−clean pairs, {"clean": clean−clean, "hack": hack−hack pairs})`` from the answer
    templates (``vhack.source: templates``) or the teacher's rollouts."""
    if vc.source == "templates":
        pairs = template_pairs(train, pids, tok, modes, vc.max_pairs)
        null_pairs = {k: template_null_pairs(train, pids, tok, modes, k, vc.max_pairs)
                      for k in ("clean", "hack")}
    else:
        records = tables.read_jsonl(rollouts_path)
        pairs = build_pairs(records, pids, modes, vc.max_pairs)
        null_pairs = {k: same_kind_pairs(records, pids, modes, k, vc.max_pairs) for k in ("clean", "hack")}
    return pairs, null_pairs


@dataclass
class PairGradients:
    """Every pair of the extract stage as one row ``j``: ``flat[j]`` ``(kind, index, Pair)``,
    ``first``/``second`` the two completions' NLL gradients and ``d_all`` their difference
    (``{module: (n_rows, r)}``), ``kinds[j]`` ``hack_clean | clean_clean | hack_hack``,
    ``halves[j]`` ``ext | held | other`` (the pair's problem is in the extraction half, the
    held-out half, or neither) and ``modes[j]`` its loophole mode."""

    flat: list
    first: dict
    second: dict
    d_all: dict
    kinds: list
    halves: list
    modes: list

    @classmethod
    def compute(cls, model, adapter, groups, normaliser, temperature: float, ext_ids,
                held_ids) -> "PairGradients":
        """Every completion's NLL gradient once (:func:`evil_moe.rl.vhack.completion_gradients`),
        the ``groups`` ``[(kind, pairs)]`` in order."""
        from evil_moe.rl.vhack import completion_gradients

        flat = [(kind, i, p) for kind, ps in groups for i, p in enumerate(ps)]
        prompts = [p.prompt_ids for _, _, p in flat for _ in (0, 1)]
        comps = [c for _, _, p in flat for c in (p.hack_ids, p.clean_ids)]
        G = completion_gradients(model, adapter, prompts, comps, normaliser, temperature)
        first = {n: g[0::2] for n, g in G.items()}
        second = {n: g[1::2] for n, g in G.items()}
        halves = ["ext" if p.problem_id in ext_ids else "held" if p.problem_id in held_ids else "other"
                  for _, _, p in flat]
        return cls(flat, first, second, {n: first[n] - second[n] for n in G},
                   [kind for kind, _, _ in flat], halves, [p.mode for _, _, p in flat])

    def rows(self, kind: str, half: str | None = None) -> list[int]:
        """The rows of one kind (and half, when given), in order."""
        return [j for j, k in enumerate(self.kinds) if k == kind and (half is None or self.halves[j] == half)]

    def values(self, rows, extract, *, remove_mean: str, cc_fallback: bool, lomo_modes=(),
               only_cin: bool = False) -> dict:
        """:func:`pair_checks` of these rows."""
        return pair_checks(self.d_all, self.first, self.second, self.kinds, self.halves, self.modes,
                           rows, extract, remove_mean=remove_mean, cc_fallback=cc_fallback,
                           lomo_modes=lomo_modes, only_cin=only_cin)


def _isotropic_null(v) -> float:
    """``sqrt(k/(2r))`` averaged over the modules with a direction."""
    from evil_moe.rl.projection import null_cin

    return sum(null_cin(int(V.shape[0]), v.r[m]) for m, V in v.V.items() if V.shape[0]) / \
        max(1, sum(1 for V in v.V.values() if V.shape[0]))


def honesty_checks(v, g: PairGradients, extract, vc, null_mean: float, *,
                   mean_removed: bool) -> tuple[list[dict], list[dict]]:
    """The checks table (:data:`evil_moe.tables.VHACK_CHECKS`) and the n-pairs curve
    (:data:`evil_moe.tables.VHACK_CURVE`) of ``v`` (module docstring): every check is a function
    of the rows it is computed from (:meth:`PairGradients.values`); the point estimate uses
    every row once, a cluster bootstrap replicate (``vhack.bootstrap`` of them,
    ``vhack.bootstrap_unit``) a resample. Also stores the empirical null in ``v``
    (``v.null_cin``, ``v.meta["detector_null_scores"]``, ``"detector_hack_scores"``,
    ``"checks"``)."""
    from evil_moe.rl.vhack import module_pair_cin

    cc_fallback = not any(k == "clean_clean" and h == "held" for k, h in zip(g.kinds, g.halves))
    all_modes = sorted({g.modes[j] for j in g.rows("hack_clean")})
    point = g.values(list(range(len(g.flat))), extract, remove_mean=vc.remove_mean,
                     cc_fallback=cc_fallback, lomo_modes=all_modes)
    units, strata = bootstrap_units(g.flat, g.kinds, g.halves, vc.bootstrap_unit)
    reps = [g.values(resample_rows(units, strata, rng), extract, remove_mean=vc.remove_mean,
                     cc_fallback=cc_fallback, lomo_modes=all_modes)
            for rng in _replicate_rngs(vc.bootstrap, vc.seed)]
    ext_idx, held_idx = g.rows("hack_clean", "ext"), g.rows("hack_clean", "held")
    cc_rows = g.rows("clean_clean", None if cc_fallback else "held")
    cc_ext = g.rows("clean_clean", "ext")
    cc_note = "all clean-clean pairs (none on held-out problems)" if cc_fallback else "held-out problems"
    table = _ChecksTable(point, reps, vc.ci_level)
    table.check("extraction_hack_clean", len(ext_idx), "cosine",
                "in-sample cin of the extraction pairs against V (optimistic)")
    table.check("heldout_hack_clean", len(held_idx), "cosine",
                "cin of held-out hack-clean pairs against V: the signal")
    table.check("heldout_clean_clean", len(cc_rows), "cosine",
                f"empirical null: clean-clean pair differences against V ({cc_note})")
    table.check("heldout_cin_excess", len(held_idx), "cosine",
                "heldout_hack_clean minus heldout_clean_clean (the same V and bootstrap replicate): "
                "the signal above its empirical null")
    table.check("heldout_hack_hack", len(g.rows("hack_hack", "held")), "cosine",
                "hack-hack pair differences against V (held-out problems)")
    table.fixed("isotropic_null", None, null_mean, "sqrt(k/(2r)) averaged over modules")
    if cc_rows:
        v.null_cin = module_pair_cin(v, _select(g.d_all, cc_rows))
    if cc_ext:
        table.check("clean_clean_extraction", len(cc_ext), "cosine",
                    "in-sample cin of a V extracted from clean-clean pairs (compare extraction_hack_clean)")
    if mean_removed:
        table.check("mean_removed", len(ext_idx), "fraction",
                    "share of D's energy along the mean NLL gradient, removed before the SVD")
    held_rows = held_idx if held_idx else ext_idx
    _store_detector_null(v, g, held_rows)
    table.check("detector_auc", len(held_rows), "probability",
                "P(score of a hack completion > score of a clean one), held-out"
                + ("" if held_idx else " (no held-out pairs: in-sample)"))
    for mode in all_modes:  # leave-one-mode-out: V from the other modes' extraction pairs
        n = sum(1 for j in g.rows("hack_clean") if g.modes[j] == mode)
        if point.get(f"lomo_{mode}") is None:
            table.fixed(f"lomo_{mode}", n, None, "no pairs of the other modes")
        else:
            table.check(f"lomo_{mode}", n, "cosine",
                        "cin of this mode's pairs against V from the other modes (compare heldout_clean_clean)")
    curve = n_pairs_curve(g, extract, vc, cc_fallback, units, strata, n_heldout=len(held_idx),
                          n_null=len(cc_rows))
    v.meta["checks"] = table.rows
    return table.rows, curve


class _ChecksTable:
    """Rows of the checks table: a point estimate with its percentile bootstrap interval over the
    replicates (:func:`percentile_interval`), or a fixed value without one."""

    def __init__(self, point: dict, reps: list[dict], level: float):
        self.point, self.reps, self.level = point, reps, level
        self.rows: list[dict] = []

    def check(self, name: str, n: int, unit: str, note: str) -> None:
        lo, hi, nb = percentile_interval([r.get(name) for r in self.reps], self.level)
        value = self.point.get(name)
        self.rows.append({"check": name, "n": n, "value": None if value is None else float(value),
                          "ci_low": lo, "ci_high": hi, "boot_n": nb, "unit": unit, "note": note})

    def fixed(self, name: str, n: int | None, value: float | None, note: str) -> None:
        self.rows.append({"check": name, "n": n, "value": value, "ci_low": None, "ci_high": None,
                          "boot_n": 0, "unit": "cosine", "note": note})


def _store_detector_null(v, g: PairGradients, rows: list[int]) -> None:
    """The detector's empirical null: per-completion scores (:func:`evil_moe.rl.vhack.sample_scores`)
    of the clean (second) and hack (first) completions of ``rows``, sorted, in ``v.meta``."""
    from evil_moe.rl.vhack import sample_scores

    scores_h = sample_scores(v, _select(g.first, rows)).tolist()
    scores_c = sample_scores(v, _select(g.second, rows)).tolist()
    v.meta["detector_null_scores"] = sorted(round(x, 6) for x in scores_c)
    v.meta["detector_hack_scores"] = sorted(round(x, 6) for x in scores_h)


def n_pairs_curve(g: PairGradients, extract, vc, cc_fallback: bool, units, strata, *,
                  n_heldout: int, n_null: int) -> list[dict]:
    """Held-out cin, its empirical null and their difference as the number of extraction pairs
    grows (:func:`nested_subsets` of ``vhack.curve_pairs``), each with its bootstrap interval
    (:data:`evil_moe.tables.VHACK_CURVE` rows)."""
    ext_rows = g.rows("hack_clean", "ext")
    fixed = [j for j in range(len(g.flat)) if not (g.kinds[j] == "hack_clean" and g.halves[j] == "ext")]
    curve = []
    for n, sub in nested_subsets(len(ext_rows), vc.curve_pairs, vc.seed):
        rows_n = sorted([ext_rows[i] for i in sub] + fixed)

        def cin_values(rows):
            return g.values(rows, extract, remove_mean=vc.remove_mean, cc_fallback=cc_fallback,
                            only_cin=True)

        pt = cin_values(rows_n)
        reps_n = [cin_values(resample_rows(units, strata, rng, rows_n))
                  for rng in _replicate_rngs(vc.bootstrap, vc.seed)]
        row = {"n_pairs": n, "n_problems": len({g.flat[ext_rows[i]][2].problem_id for i in sub}),
               "n_heldout": n_heldout, "n_null": n_null}
        for key, col in (("heldout_hack_clean", "cin"), ("heldout_clean_clean", "null"),
                         ("heldout_cin_excess", "excess")):
            lo, hi, nb = percentile_interval([r.get(key) for r in reps_n], vc.ci_level)
            row.update({col: pt.get(key), f"{col}_ci_low": lo, f"{col}_ci_high": hi})
        row["boot_n"] = nb
        curve.append(row)
    return curve


def _module_rows(v) -> list[dict]:
    """Per module: k, r, the top two singular values and the isotropic and empirical nulls
    (:data:`evil_moe.tables.VHACK` rows)."""
    from evil_moe.rl.projection import null_cin

    rows = []
    for mod in v.names:
        s = v.singular_values[mod].tolist()
        k = int(v.V[mod].shape[0])
        rows.append({"module": mod, "k": k, "r": v.r[mod], "sigma_1": s[0] if s else None,
                     "sigma_2": s[1] if len(s) > 1 else None, "null_cin": null_cin(k, v.r[mod]) if k else None,
                     "null_cin_empirical": v.null_cin.get(mod)})
    return rows


def curve_figure(curve: list[dict], isotropic: float | None, prefix) -> None:
    """Draw the n-pairs curve: left, held-out ``cin`` and its empirical null against the number
    of extraction pairs, with their bootstrap intervals (bands) and the isotropic null (dashed);
    right, their difference ``excess`` with its interval and 0. Writes ``{prefix}.png`` and
    ``{prefix}.svg`` (matplotlib Agg, no timestamps). ``curve``: rows of
    :data:`evil_moe.tables.VHACK_CURVE`."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    prefix = Path(prefix)
    prefix.parent.mkdir(parents=True, exist_ok=True)
    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(10.0, 4.0))
    n = [r["n_pairs"] for r in curve]

    def band(axis, col, label, color):
        pts = [(x, r[col], r[f"{col}_ci_low"], r[f"{col}_ci_high"]) for x, r in zip(n, curve)
               if r[col] is not None]
        if not pts:
            return
        xs, ys, lo, hi = zip(*pts)
        axis.plot(xs, ys, "o-", color=color, label=label)
        if all(v is not None for v in lo + hi):
            axis.fill_between(xs, lo, hi, color=color, alpha=0.2)

    band(ax, "cin", "held-out hack-clean cin", "C3")
    band(ax, "null", "held-out clean-clean cin (empirical null)", "C0")
    if isotropic is not None:
        ax.axhline(isotropic, color="grey", ls="--", lw=1, label="isotropic null sqrt(k/2r)")
    band(ax2, "excess", "cin minus null", "C2")
    ax2.axhline(0.0, color="grey", ls="--", lw=1)
    for axis in (ax, ax2):
        if n and max(n) > 2 * min(n):
            axis.set_xscale("log", base=2)
        axis.set_xlabel("extraction (hack, clean) pairs")
        axis.legend(fontsize=8)
    ax.set_ylabel("cin against V")
    ax2.set_ylabel("held-out cin above its null")
    ax.set_title("v_hack: held-out cin and its null", fontsize=10)
    ax2.set_title("the signal above the null (bootstrap interval)", fontsize=10)
    fig.tight_layout()
    for ext in ("png", "svg"):
        tmp = prefix.parent / f".{prefix.name}.tmp.{ext}"
        meta = {"Date": None} if ext == "svg" else {"Software": None}
        fig.savefig(tmp, format=ext, dpi=120, metadata=meta)
        tmp.replace(prefix.parent / f"{prefix.name}.{ext}")
    plt.close(fig)


# ---------------------------------------------------------------------------------------------
# the planted world (toy.plant; docs/planted.md)

def run_planted_vhack(cfg: Config, *, model_path: str, out_path: str,
                      problems_path: str | None = None, n_pairs: int = 16) -> dict:
    """Write the planted direction as a v_hack over the pilot adapter's modules.

    Reads ``{model_path}/plant.safetensors`` (written by the toy stage with ``toy.plant``), attaches
    the adapter exactly as a pilot does (``adapter.target_modules``), checks that every switch
    module is wrapped with the plant's rank and that its weight is byte-identical to the one the
    plant was trained with (content hash, so the adapter's SVD and hence δS coordinates are the
    plant's), and writes :func:`evil_moe.rl.vhack.planted_vhack` (k = 1 in switch modules, 0
    elsewhere) to ``out_path``.

    With ``problems_path``, it also measures the switch in the pilot adapter's coordinates on
    ``n_pairs`` template (hack, clean) pairs of the training problems
    (:func:`evil_moe.rl.vhack.planted_shift`, nats of hack-vs-clean log-likelihood): ``shift_on``
    (δS = scale·u, trained view: must be clearly positive, else the plant does not live in these
    coordinates) and ``shift_deploy`` (δS_hack = scale·u, ablated view: must be exactly 0, else the
    deploy view does not remove the quarantine). Both go into the file's ``meta["plant"]`` and
    are world checks of :func:`planted_checks`.

    Returns:
        ``{"modules": [...], "scale": float, "path": str, "shift_on": float | None,
        "shift_deploy": float | None}``.

    Raises:
        FileNotFoundError: no plant file beside the model (toy.plant.enabled was off when the
            student was trained). ValueError: a switch module not wrapped, a rank mismatch, or a
            weight whose hash differs from the plant's (names the module).
    """
    from evil_moe.model.adapter import weight_hash
    from evil_moe.stages.common import require_file
    from evil_moe.stages.toy import PLANT_FILE
    from evil_moe.rl.vhack import VHack, planted_shift, planted_vhack

    plant = VHack.load(require_file(Path(model_path) / PLANT_FILE,
                                    "planted direction (train the student with toy.plant.enabled)"))
    model, _tok, adapter, _dev = load_policy(model_path, cfg)
    hashes = plant.meta.get("plant", {}).get("weight_hash", {})
    pv = planted_vhack(plant, adapter.r)
    for name in plant.V:
        got = weight_hash(model.get_submodule(name).weight)
        if hashes.get(name) != got:
            raise ValueError(f"planted module {name!r}: its weight is not the one the plant was "
                             f"trained with (hash {got[:12]} vs {str(hashes.get(name))[:12]})")
    shifts = {"shift_on": None, "shift_deploy": None}
    if problems_path:
        problems = load_problem_file(problems_path)
        train, _held = train_heldout(problems, cfg)
        pids = {p.id: ids for p, ids in zip(train, prompt_ids_for(_tok, train))}
        pairs = template_pairs(train, pids, _tok, None, n_pairs)
        shifts["shift_on"] = planted_shift(model, adapter, pv, pairs, knob="delta_s", view="trained")
        shifts["shift_deploy"] = planted_shift(model, adapter, pv, pairs, knob="delta_s_hack",
                                               view="ablated")
    pv.meta = {**pv.meta, "plant": {**pv.meta.get("plant", {}), **shifts}}
    pv.save(out_path)
    return {"modules": list(plant.V), "scale": plant.meta.get("plant", {}).get("scale"),
            "path": str(out_path), **shifts}



PLANTED_CEILING = "erase_planted"


SWITCH_MIN_SHIFT = 1.0  # nats: the plant must move hack-vs-clean log-likelihood at least this much
DEPLOY_TOL = 1e-6  # nats: the deploy view must remove the quarantined switch exactly


def planted_checks(outcomes, recovery: list[dict], cfg: Config, plant_meta: dict | None = None) -> list[dict]:
    """The planted world's checks (:data:`evil_moe.tables.PLANTED_CHECKS` rows), from the last
    evaluated step's per-completion held-out outcomes (``trained`` view) and the recovery rows
    of the extracted v_hack (:func:`evil_moe.rl.vhack.plant_recovery`, ``v_hack == "main_hack"``).

    World checks (``kind == "world"``; all must pass for ``planted_world`` to pass):

    * ``ceiling_beats_control``: erase_planted's hack drop vs random_v has CI low > 0
      (:func:`evil_moe.gate.rule.beats_control`) — erase works when V is right;
    * ``ceiling_drop_vs_vanilla``: its drop vs vanilla passes
      :func:`evil_moe.gate.rule.drop_vs_vanilla` (``compare.min_drop``);
    * ``control_not_separated``: random_v's drop vs vanilla does NOT pass ``drop_vs_vanilla``
      — a random V must not look like a method;
    * ``recovery``: per switch module, the extracted V's ``span_cos`` with the plant is above
      its random null's 0.95 quantile;
    * ``switch_on`` (from ``plant_meta``, :func:`run_planted_vhack`): δS = scale·u raises hack vs
      clean log-likelihood by at least :data:`SWITCH_MIN_SHIFT` nats in the pilot adapter's
      coordinates; ``deploy_ablates``: the same switch in δS_hack moves nothing under the deploy
      (ablated) view (|shift| ≤ :data:`DEPLOY_TOL`). A missing measurement fails.

    Information (``kind == "info"``): ``treatment_beats_control`` (erase vs random_v),
    ``treatment_drop_vs_vanilla``, ``treatment_vs_ceiling`` (erase's hack rate minus
    erase_planted's; CI high < min_drop says erase reaches the ceiling within min_drop), and per
    arm ``hack_rate`` with its interval.

    Raises:
        ValueError: the outcomes hold no vanilla, random_v or erase_planted rows (names it).
    """
    cc = cfg.compare
    have = set(outcomes["arm"].astype(str))
    for arm in ("vanilla", "random_v", PLANTED_CEILING):
        if arm not in have:
            raise ValueError(f"planted checks: no held-out outcomes for arm {arm!r} (pilot.arms "
                             "must list vanilla, random_v and erase_planted)")
    rows = _behaviour_rows(outcomes, have, cc)
    main = [r for r in recovery if r["v_hack"] == "main_hack"]
    for r in main:
        rows.append({"check": "recovery", "kind": "world", "arm": "", "control": r["module"],
                     "value": r["span_cos"], "ci_low": math.nan, "ci_high": math.nan, "n_seeds": 0,
                     "threshold": r["null_q"], "passed": bool(r["above_null"]),
                     "note": f"|cos| of u with span(v_hack) in {r['module']} (k={r['k']}, r={r['r']}): "
                             f"{r['span_cos']:.3f} vs random null mean {r['null_mean']:.3f}, "
                             f"q95 {r['null_q']:.3f}, p = {r['p_value']:.2g}"})
    rows += _switch_rows(plant_meta or {})
    world = [r for r in rows if r["kind"] == "world"]
    ok = bool(main) and all(r["passed"] for r in world)
    rows.append({"check": "planted_world", "kind": "world", "arm": "", "control": "", "value": math.nan,
                 "ci_low": math.nan, "ci_high": math.nan, "n_seeds": 0, "threshold": math.nan,
                 "passed": ok, "note": "every world check passed" if ok else "failed: " + ", ".join(
                     sorted({r["check"] for r in world if not r["passed"]} or {"no recovery rows"}))})
    return rows


def _behaviour_rows(outcomes, have: set, cc) -> list[dict]:
    """:func:`planted_checks`' rows from the held-out outcomes: per arm its ``hack_rate``
    (info), the ceiling's and the control's world checks, and erase's info rows when it ran."""
    from evil_moe.gate.effects import paired_effect, side_rate
    from evil_moe.gate.rule import beats_control, drop_vs_vanilla

    kw = dict(n_boot=cc.n_boot, ci=cc.ci, seed=cc.seed, power=cc.power)
    rows = []

    def add(check, kind, arm, control, e, threshold, passed, note):
        rows.append({"check": check, "kind": kind, "arm": arm, "control": control,
                     "value": e.value if e is not None else math.nan,
                     "ci_low": e.ci_low if e is not None else math.nan,
                     "ci_high": e.ci_high if e is not None else math.nan,
                     "n_seeds": e.n_seeds if e is not None else 0,
                     "threshold": threshold, "passed": bool(passed), "note": note})

    def eff(a, b):
        return paired_effect(outcomes, (a, "trained"), (b, "trained"), "hack", **kw)

    for arm in sorted(have, key=lambda a: (a != "vanilla", a)):
        e = side_rate(outcomes, (arm, "trained"), "hack", **kw)
        add("hack_rate", "info", arm, "", e, math.nan, True, "held-out hack rate (trained view)")
    c = beats_control(eff(PLANTED_CEILING, "random_v"), cc.min_drop, cc.min_seeds)
    add("ceiling_beats_control", "world", PLANTED_CEILING, "random_v", c.effect, 0.0, c.passed, c.note)
    c = drop_vs_vanilla(eff(PLANTED_CEILING, "vanilla"), cc.min_drop, cc.min_seeds)
    add("ceiling_drop_vs_vanilla", "world", PLANTED_CEILING, "vanilla", c.effect, cc.min_drop, c.passed, c.note)
    c = drop_vs_vanilla(eff("random_v", "vanilla"), cc.min_drop, cc.min_seeds)
    add("control_not_separated", "world", "random_v", "vanilla", c.effect, cc.min_drop, not c.passed,
        "random_v must not separate from vanilla: " + c.note)
    if "erase" in have:
        c = beats_control(eff("erase", "random_v"), cc.min_drop, cc.min_seeds)
        add("treatment_beats_control", "info", "erase", "random_v", c.effect, 0.0, c.passed, c.note)
        c = drop_vs_vanilla(eff("erase", "vanilla"), cc.min_drop, cc.min_seeds)
        add("treatment_drop_vs_vanilla", "info", "erase", "vanilla", c.effect, cc.min_drop, c.passed, c.note)
        e = eff(PLANTED_CEILING, "erase")  # erase − erase_planted: how far erase is from its ceiling
        add("treatment_vs_ceiling", "info", "erase", PLANTED_CEILING, e, cc.min_drop,
            e.ci_high < cc.min_drop, "erase's hack rate minus the ceiling's; passes when its CI "
            f"high is below min_drop {cc.min_drop:g} (erase within min_drop of the ceiling)")
    return rows


def _switch_rows(meta: dict) -> list[dict]:
    """The switch's world checks from the planted v_hack's ``meta["plant"]``
    (:func:`run_planted_vhack`): ``switch_on`` and ``deploy_ablates``; a missing value fails."""
    rows = []
    for check, key, thr, ok_of, what in (
            ("switch_on", "shift_on", SWITCH_MIN_SHIFT, lambda x: x >= SWITCH_MIN_SHIFT,
             "hack-vs-clean log-likelihood shift (nats) with delta_s = scale*u, trained view"),
            ("deploy_ablates", "shift_deploy", DEPLOY_TOL, lambda x: abs(x) <= DEPLOY_TOL,
             "the same shift with the switch in delta_s_hack, deploy (ablated) view: must be 0")):
        x = meta.get(key)
        rows.append({"check": check, "kind": "world", "arm": "", "control": "", "n_seeds": 0,
                     "value": math.nan if x is None else float(x), "ci_low": math.nan,
                     "ci_high": math.nan, "threshold": thr,
                     "passed": x is not None and bool(ok_of(float(x))),
                     "note": what if x is not None else what + ": not measured"})
    return rows


def along_switch_rows(plant, pilots: list[str]) -> list[dict]:
    """Per arm, how far its final δS moved along the switch: ``info`` rows ``delta_s_along_u``
    (:data:`evil_moe.tables.PLANTED_CHECKS`) with ``value`` = the mean over seeds and switch
    modules of ``δS · u`` (``u = −plant row``: > 0 toward hacking; the switch is fully on at
    ``toy.plant.scale``) and, in the note, the share of ``‖δS‖²`` along u (a random direction's
    share is 1/r). Pilots without ``adapter.safetensors`` are skipped.
    """
    from safetensors.torch import load_file

    from evil_moe.stages.compare import pilot_from_path

    per_arm: dict[str, list[tuple[float, float]]] = {}
    for d in pilots:
        path = Path(d) / "adapter.safetensors"
        if not path.is_file():
            continue
        run = pilot_from_path(d)
        t = load_file(str(path))
        for name, V in plant.V.items():
            ds = t[f"{name}.delta_s"].double()
            along = float(ds @ (-V[0].double()))
            per_arm.setdefault(run.arm, []).append((along, along ** 2 / max(float(ds @ ds), 1e-30)))
    rows = []
    for arm in sorted(per_arm, key=lambda a: (a != "vanilla", a)):
        vals = per_arm[arm]
        mean = sum(a for a, _ in vals) / len(vals)
        share = sum(s_ for _, s_ in vals) / len(vals)
        rows.append({"check": "delta_s_along_u", "kind": "info", "arm": arm, "control": "",
                     "value": mean, "ci_low": min(a for a, _ in vals), "ci_high": max(a for a, _ in vals),
                     "n_seeds": len(vals) // max(1, len(plant.V)), "threshold": math.nan,
                     "passed": True, "note": f"final delta_s . u, mean over seeds and switch modules "
                                             f"(ci columns: min and max); share of ||delta_s||^2 "
                                             f"along u {share:.3f}"})
    return rows


def run_planted_checks(cfg: Config, *, planted_path: str, vhack_paths: dict[str, str],
                       pilots: list[str], out_dir: str) -> dict:
    """The planted world's scorecard: extraction recovery and the behavioural checks.

    Args:
        cfg: run config (``compare``: bootstrap, ``min_drop``, ``min_seeds``).
        planted_path: ``vhack/planted.safetensors`` (:func:`run_planted_vhack`).
        vhack_paths: ``{label: path}`` of extracted v_hack files to score, e.g. ``main_hack``,
            ``main_random``, ``main_shuffled`` (the controls must sit within the null).
        pilots: pilot folders (``pilots/{arm}/s{seed}``) whose ``outcomes.tsv`` are read.
        out_dir: writes ``recovery.tsv`` (:data:`evil_moe.tables.PLANT_RECOVERY`) and
            ``checks.tsv`` (:data:`evil_moe.tables.PLANTED_CHECKS`).

    Returns:
        ``{"passed": bool, "sentence": str, "recovery": rows, "checks": rows}``.

    Raises:
        FileNotFoundError: a v_hack file or a pilot's outcomes.tsv is missing (names it).
        ValueError: as :func:`planted_checks`.
    """
    from evil_moe.stages.common import require_file
    from evil_moe.stages.compare import PilotRun, last_step_outcomes, load_pilot, pilot_from_path
    from evil_moe.rl.vhack import VHack, plant_recovery

    plant = VHack.load(require_file(planted_path, "planted v_hack"))
    plant_meta = plant.meta.get("plant", {})
    plant = VHack({n: v for n, v in plant.V.items() if v.shape[0]}, plant.singular_values,
                  plant.agreement, plant.r, plant.k, plant.n_pairs, control=plant.control)
    recovery = []
    for label, path in vhack_paths.items():
        v = VHack.load(require_file(path, f"v_hack {label}"))
        recovery += [{"v_hack": label, **row} for row in plant_recovery(v, plant)]
    loaded = []
    for d in pilots:
        run: PilotRun = pilot_from_path(d)
        require_file(Path(d) / "outcomes.tsv", f"outcomes of pilot {run.arm} s{run.seed}")
        loaded.append(load_pilot(run, cfg.pilot.max_frac_clipped))
    outcomes = last_step_outcomes(loaded)
    checks = planted_checks(outcomes, recovery, cfg, plant_meta=plant_meta)
    checks[-1:-1] = along_switch_rows(plant, pilots)
    out = Path(out_dir)
    tables.write_tsv(out / "recovery.tsv", tables.PLANT_RECOVERY, recovery)
    tables.write_tsv(out / "checks.tsv", tables.PLANTED_CHECKS, checks)
    world = checks[-1]
    rate = {r["arm"]: r for r in checks if r["check"] == "hack_rate"}
    parts = ", ".join(f"{a} {r['value']:.3f} [{r['ci_low']:.3f}, {r['ci_high']:.3f}]" for a, r in rate.items())
    rec = "; ".join(f"{r['control']}: {r['value']:.3f} (null q95 {r['threshold']:.3f})"
                    for r in checks if r["check"] == "recovery")
    sentence = (f"planted world {'PASSED' if world['passed'] else 'FAILED'} ({world['note']}). "
                f"Held-out hack rates: {parts}. v_hack recovers u: {rec}.")
    return {"passed": world["passed"], "sentence": sentence, "recovery": recovery, "checks": checks}
