"""Stage ``extract``: the hack direction ``v_hack`` and its two controls.

Pairs (docs/method.md, "The hack direction"; docs/vhack.md): for each training problem whose mode the weak detector knows
(``vhack.known_modes``, or ``--known-modes`` for a leave-one-mode-out fold), a teacher hack
(``exploited``) and a teacher clean completion (oracle-correct and not a hack; falling back to
any non-hack when the problem has no correct one) of the same prompt. Pairs are taken
round-robin over problems (so no problem dominates), up to ``vhack.max_pairs``. Completions keep
their generated token ids; they are scored in the *student's* prompt context (the teacher's
``elicit`` text is not part of it).

With ``vhack.source: templates`` the pairs are instead the environment's hack and clean answer
templates for each training problem (:func:`template_pairs`).

Per module, ``D = ∇NLL(hack) − ∇NLL(clean)`` on the student (δS = 0) with the pilot's Dr.GRPO
normaliser, top-k right singular vectors, majority-vote orientation (:mod:`evil_moe.rl.vhack.direction`).

Honesty checks (docs/method.md, "`v_hack`'s honesty checks"), all from the same per-completion gradients:

* the problems are split (seeded by ``vhack.seed``) into an **extraction** half and a
  **held-out** half (``vhack.heldout_frac``); V comes from the extraction half's pairs only;
* the **mean-gradient direction** of the extraction pairs' clean completions is removed from D
  before the SVD (``vhack.remove_mean``: clean, all or none; its share of D's energy is reported);
* ``cin`` of held-out hack−clean pairs against V, beside the **empirical null**: held-out
  clean−clean (and hack−hack) pairs of the same problems against the same V, and the isotropic
  ``sqrt(k/2r)``. The per-module clean−clean cin is stored in the v_hack file (``null_cin``) and
  used by the pilot's ``coverage``; the in-sample cin of a V extracted from clean−clean pairs is
  reported beside the in-sample hack−clean one;
* the **detector's null**: per-completion scores (``cos_contrib``, :func:`evil_moe.rl.vhack.direction.sample_scores`)
  of held-out clean and hack completions, stored in the v_hack file; ``route``/``filter`` flag a
  rollout when its score exceeds a quantile of the clean scores; their AUC is reported;
* **leave-one-mode-out**: for each mode, V from the other modes' extraction pairs, and the cin of
  that mode's pairs against it (a loophole the detector never saw).

How it scales: every completion's gradient is computed once (``vhack.micro_batch`` rows per
forward and ONE backward, :func:`evil_moe.rl.vhack.direction.completion_gradients`); the checks and every
bootstrap replicate then resample those stored gradients, written once in the coordinates of
their own span and stacked over modules (:mod:`evil_moe.rl.vhack.stack`), so a replicate costs a
batched SVD of ``(modules, rows, ≤ 2·completions)`` and keeps only its check values: memory does
not grow with ``vhack.bootstrap``. Each phase (gradients, bootstrap, n-pairs curve) prints a
progress bar to the log.

Outputs in ``out_dir``: ``{name}_hack.safetensors`` (v_hack), ``{name}_random.safetensors``
(random orthonormal V, same k per module), ``{name}_shuffled.safetensors`` (labels swapped per
pair at random), ``{name}.tsv`` (:data:`evil_moe.tables.VHACK`, per module) and
``{name}_checks.tsv`` (:data:`evil_moe.tables.VHACK_CHECKS`).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

from evil_moe import files, tables
from evil_moe.config import Config
from evil_moe.gate.figures import vhack_curve_figure
from evil_moe.rl.vhack.pairs import (authored_pairs, build_pairs, same_kind_pairs, split_problems,
                                     template_null_pairs, template_pairs)
from evil_moe.rl.policy.rollout import prompt_ids_for
from evil_moe.rl.vhack.checks import (bootstrap_units, nested_subsets, pair_checks, percentile_interval,
                                      removed_mean, replicate_rngs, resample_rows, select_rows)
from evil_moe.stages.common import load_policy, load_problem_file, train_heldout


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
    from evil_moe.rl.policy.grpo import DrGRPONormaliser
    from evil_moe.rl.vhack.direction import extract_vhack, random_vhack

    vc, pc = cfg.vhack, cfg.pilot
    modes = list(known_modes) if known_modes else (list(vc.known_modes) if vc.known_modes else None)
    problems = load_problem_file(problems_path)
    train, _ = train_heldout(problems, cfg)
    model, tok, adapter, _ = load_policy(model_path, cfg)
    prompts = prompt_ids_for(tok, train, template_kwargs=cfg.models.chat_template_kwargs)
    pids = {p.id: ids for p, ids in zip(train, prompts)}
    if vc.source == "authored":
        pairs, null_pairs, _ = authored_pairs(cfg, tok, modes)
    else:
        pairs, null_pairs = _extraction_pairs(vc, train, pids, tok, modes, rollouts_path)
    ext_ids, held_ids = split_problems([p.problem_id for p in pairs], vc.heldout_frac, vc.seed)
    normaliser = DrGRPONormaliser(pc.group, pc.max_new, pc.prompts_per_step)
    g = PairGradients.compute(model, adapter, [("hack_clean", pairs), ("clean_clean", null_pairs["clean"]),
                                               ("hack_hack", null_pairs["hack"])],
                              normaliser, pc.temperature, ext_ids, held_ids,
                              micro_batch=vc.micro_batch)
    del model, adapter  # the checks read the stored gradients only
    ext_idx = g.rows("hack_clean", "ext")
    if not ext_idx:
        raise ValueError("no (hack, clean) pair in the extraction half of the problems")
    D_ext = select_rows(g.d_all, ext_idx)
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
    checks, curve = honesty_checks(v, g, vc, null_mean, mean_removed=mean_dir is not None)
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
    vhack_curve_figure(curve, null_mean, out / f"{name}_curve")
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
        records = files.read_jsonl(rollouts_path)
        pairs = build_pairs(records, pids, modes, vc.max_pairs)
        null_pairs = {k: same_kind_pairs(records, pids, modes, k, vc.max_pairs) for k in ("clean", "hack")}
    return pairs, null_pairs


@dataclass
class PairGradients:
    """Every pair of the extract stage as one row ``j``: ``flat[j]`` ``(kind, index, Pair)``,
    ``first``/``second`` the two completions' NLL gradients and ``d_all`` their difference
    (``{module: (n_rows, r)}``), ``kinds[j]`` ``hack_clean | clean_clean | hack_hack``,
    ``halves[j]`` ``ext | held | other`` (the pair's problem is in the extraction half, the
    held-out half, or neither) and ``modes[j]`` its loophole mode. ``stack`` holds the same
    gradients in the coordinates of their span (:class:`evil_moe.rl.vhack.stack.GradientStack`),
    which every check and bootstrap replicate reads."""

    flat: list
    first: dict
    second: dict
    d_all: dict
    kinds: list
    halves: list
    modes: list
    stack: object = None

    def __post_init__(self):
        if self.stack is None:
            from evil_moe.rl.vhack.stack import GradientStack

            self.stack = GradientStack.from_gradients(self.first, self.second)

    @classmethod
    def compute(cls, model, adapter, groups, normaliser, temperature: float, ext_ids,
                held_ids, *, micro_batch: int = 1) -> "PairGradients":
        """Every completion's NLL gradient once (:func:`evil_moe.rl.vhack.direction.completion_gradients`,
        ``micro_batch`` rows per forward+backward), the ``groups`` ``[(kind, pairs)]`` in order;
        a progress bar on stderr (the stage's log)."""
        from evil_moe.rl.vhack.direction import completion_gradients

        flat = [(kind, i, p) for kind, ps in groups for i, p in enumerate(ps)]
        prompts = [p.prompt_ids for _, _, p in flat for _ in (0, 1)]
        comps = [c for _, _, p in flat for c in (p.hack_ids, p.clean_ids)]
        lens = [len(p) + len(c) for p, c in zip(prompts, comps)]
        counts = ", ".join(f"{len(ps)} {kind.replace('_', '-')}" for kind, ps in groups)
        print(f"extract: gradients of {len(comps)} completions ({counts} pairs), "
              f"{min(lens)}-{max(lens)} tokens with the prompt, {micro_batch} per micro-batch",
              file=sys.stderr, flush=True)
        with _bar(len(comps), "extract: gradients", "completion") as bar:
            G = completion_gradients(model, adapter, prompts, comps, normaliser, temperature,
                                     micro_batch=micro_batch, progress=bar.update)
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
        return pair_checks(self.stack, self.kinds, self.halves, self.modes, rows, extract,
                           remove_mean=remove_mean, cc_fallback=cc_fallback,
                           lomo_modes=lomo_modes, only_cin=only_cin)


def _bar(total: int, desc: str, unit: str):
    """A tqdm progress bar on stderr (the stage's log), refreshed at most every 10 s, so that a
    long phase shows it moves."""
    from tqdm import tqdm

    return tqdm(total=total, desc=desc, unit=unit, file=sys.stderr, mininterval=10, ascii=True)


def _isotropic_null(v) -> float:
    """``sqrt(k/(2r))`` averaged over the modules with a direction."""
    from evil_moe.rl.vhack.projection import null_cin

    return sum(null_cin(int(V.shape[0]), v.r[m]) for m, V in v.V.items() if V.shape[0]) / \
        max(1, sum(1 for V in v.V.values() if V.shape[0]))


def stacked_extract(vc):
    """``(stack, rows, remove=None) -> StackedV`` with the config's k and floors
    (:func:`evil_moe.rl.vhack.stack.extract`), as :func:`pair_checks` takes it."""
    from functools import partial

    from evil_moe.rl.vhack.stack import extract

    return partial(extract, k=vc.k, ratio_floor=vc.ratio_floor, quantile_floor=vc.quantile_floor)


def honesty_checks(v, g: PairGradients, vc, null_mean: float, *,
                   mean_removed: bool) -> tuple[list[dict], list[dict]]:
    """The checks table (:data:`evil_moe.tables.VHACK_CHECKS`) and the n-pairs curve
    (:data:`evil_moe.tables.VHACK_CURVE`) of ``v`` (module docstring): every check is a function
    of the rows it is computed from (:meth:`PairGradients.values`, V re-extracted from them with
    ``vhack.k`` and the floors); the point estimate uses every row once, a cluster bootstrap
    replicate (``vhack.bootstrap`` of them, ``vhack.bootstrap_unit``) a resample of the stored
    gradients (nothing is recomputed from the model; a replicate keeps only its check values).
    Also stores the empirical null in ``v`` (``v.null_cin``, ``v.meta["detector_null_scores"]``,
    ``"detector_hack_scores"``, ``"checks"``)."""
    from evil_moe.rl.vhack.direction import module_pair_cin

    extract = stacked_extract(vc)
    cc_fallback = not any(k == "clean_clean" and h == "held" for k, h in zip(g.kinds, g.halves))
    all_modes = sorted({g.modes[j] for j in g.rows("hack_clean")})
    point = g.values(list(range(len(g.flat))), extract, remove_mean=vc.remove_mean,
                     cc_fallback=cc_fallback, lomo_modes=all_modes)
    units, strata = bootstrap_units(g.flat, g.kinds, g.halves, vc.bootstrap_unit)
    reps = []
    with _bar(vc.bootstrap, "extract: bootstrap", "replicate") as bar:
        for rng in replicate_rngs(vc.bootstrap, vc.seed):
            reps.append(g.values(resample_rows(units, strata, rng), extract,
                                 remove_mean=vc.remove_mean, cc_fallback=cc_fallback,
                                 lomo_modes=all_modes))
            bar.update(1)
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
        v.null_cin = module_pair_cin(v, select_rows(g.d_all, cc_rows))
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
    """The detector's empirical null: per-completion scores (:func:`evil_moe.rl.vhack.direction.sample_scores`)
    of the clean (second) and hack (first) completions of ``rows``, sorted, in ``v.meta``."""
    from evil_moe.rl.vhack.direction import sample_scores

    scores_h = sample_scores(v, select_rows(g.first, rows)).tolist()
    scores_c = sample_scores(v, select_rows(g.second, rows)).tolist()
    v.meta["detector_null_scores"] = sorted(round(x, 6) for x in scores_c)
    v.meta["detector_hack_scores"] = sorted(round(x, 6) for x in scores_h)


def n_pairs_curve(g: PairGradients, extract, vc, cc_fallback: bool, units, strata, *,
                  n_heldout: int, n_null: int) -> list[dict]:
    """Held-out cin, its empirical null and their difference as the number of extraction pairs
    grows (:func:`nested_subsets` of ``vhack.curve_pairs``), each with its bootstrap interval
    (:data:`evil_moe.tables.VHACK_CURVE` rows). ``extract`` as :func:`pair_checks` takes it."""
    ext_rows = g.rows("hack_clean", "ext")
    fixed = [j for j in range(len(g.flat)) if not (g.kinds[j] == "hack_clean" and g.halves[j] == "ext")]
    curve = []
    sizes = nested_subsets(len(ext_rows), vc.curve_pairs, vc.seed)

    def cin_values(rows):
        return g.values(rows, extract, remove_mean=vc.remove_mean, cc_fallback=cc_fallback,
                        only_cin=True)

    with _bar(len(sizes) * (1 + vc.bootstrap), "extract: n-pairs curve", "replicate") as bar:
        for n, sub in sizes:
            rows_n = sorted([ext_rows[i] for i in sub] + fixed)
            pt = cin_values(rows_n)
            bar.update(1)
            reps_n = []
            for rng in replicate_rngs(vc.bootstrap, vc.seed):
                reps_n.append(cin_values(resample_rows(units, strata, rng, rows_n)))
                bar.update(1)
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
    from evil_moe.rl.vhack.projection import null_cin

    rows = []
    for mod in v.names:
        s = v.singular_values[mod].tolist()
        k = int(v.V[mod].shape[0])
        rows.append({"module": mod, "k": k, "r": v.r[mod], "sigma_1": s[0] if s else None,
                     "sigma_2": s[1] if len(s) > 1 else None, "null_cin": null_cin(k, v.r[mod]) if k else None,
                     "null_cin_empirical": v.null_cin.get(mod)})
    return rows
