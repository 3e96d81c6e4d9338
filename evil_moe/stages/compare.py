"""The compare stage: aggregate the pilots and decide the separation gate.

Reads every pilot folder ``results/pilots/{arm}/s{seed}/`` and writes, in ``out_dir``:

- ``summary.tsv`` — :data:`evil_moe.tables.COMPARE_SUMMARY`, one row per (arm, view): ``train``
  (training rollouts, mean over the last ``k`` steps), ``eval_trained`` and ``eval_ablated``
  (held-out evaluation at the last evaluated step, mode ``all``; ``eval_ablated`` exists for
  ``route`` only). Means and standard deviations (ddof=1, empty with one seed) are over seeds.
- ``gate.json`` — ``{"verdict", "sentence", "criteria": [...], "arms": {...}, "config": {...}}``
  (``../shared/DESIGN.md``); every criterion has ``name, arm, value, threshold, passed`` and a
  ``note``.
- ``gate.md`` — the same criteria as a short markdown table.
- ``figures/{hack_rate,pass_rate,cin,frac_clipped,cos_contrib}.{png,svg}``.

The gate (``../shared/notes/science.md`` §6), with thresholds from ``cfg.compare``
(``last_k, min_drop, pass_margin, n_boot, ci, seed``) and the clip bound from
``cfg.pilot.max_frac_clipped`` (0.5 by default):

1. **Validity.** Every expected (arm, seed) pilot is present (its folder, ``status.json`` and
   ``steps.tsv`` exist), has ``status == "ok"``, a non-empty ``steps.tsv``, and a largest
   ``frac_clipped`` over its steps ≤ the bound (a run with no recorded ``frac_clipped`` fails).
   Otherwise the verdict is ``invalid`` and one ``valid`` criterion per pilot names it and why.
   Expected pilots: given a pilots folder, ``cfg.pilot.arms × cfg.pilot.seeds`` (other folders
   found there are ignored and listed under ``"ignored"``); given a list of pilots, every arm
   listed × every seed listed; a cell not listed is missing (so an arm cannot silently skip a
   seed the others ran).
2. **Per projected arm X ∈ {erase, route}** among the expected arms, per seed ``s``, a hack
   metric ``h(X, s)``:

   - ``erase``: mean training ``hack_rate`` over the last ``k`` steps of ``steps.tsv``;
     vanilla and random_v are measured the same way.
   - ``route``: the **deploy view** — the held-out ``eval.tsv`` ``hack_rate`` at the last
     evaluated step with ``view=ablated, mode=all`` (δS_hack zeroed). Its training forward uses
     δS + δS_hack, so its training hack rate looks like vanilla's by design and is never judged
     (science.md §6; Gradient Routing, Cloud et al. 2024, arXiv:2410.04332: the benefit shows only
     after ablation). Vanilla and random_v are then measured on their held-out eval with
     ``view=trained, mode=all``, so both sides are held-out evaluations. Route's training and
     eval-trained numbers are reported beside it in ``arms``.

   Criteria (all three must pass for X to separate), over the seeds where both sides exist:

   - ``drop_vs_vanilla``: paired drops ``d_s = h(vanilla, s) − h(X, s)``; passes iff
     ``mean(d) ≥ min_drop`` and the bootstrap lower bound ``ci_low > 0`` (percentile bootstrap
     of the mean over seeds resampled with replacement, ``n_boot`` draws, level ``ci``, seeded
     by ``compare.seed``). With one seed the bootstrap is degenerate: CI = [d, d], said in the note.
   - ``beats_random_v``: paired ``mean(h(random_v, s) − h(X, s)) > 0`` (same metric kind as X).
     Fails, with a note, when random_v has no data.
   - ``matched_pass``: paired ``mean(pass(vanilla, s) − pass(X, s)) ≤ pass_margin``, with
     ``pass_rate`` taken from the same views as the hack metric.

   Comparisons allow 1e-12 of float rounding.
3. **Verdict.** ``invalid`` if validity fails; else ``separated`` iff at least one projected arm
   passes all three; else ``not_separated``. ``sentence`` states it in one sentence with the
   numbers. On ``invalid`` the per-arm criteria are still computed from the data present, for
   information.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Sequence

import numpy as np
import pandas as pd

from evil_moe import tables

PROJECTED = ("erase", "route")
ARM_ORDER = ("vanilla", "erase", "route", "random_v")
ARM_COLORS = {"vanilla": "#444444", "erase": "#1f77b4", "route": "#d62728", "random_v": "#2ca02c"}
STEPS_REQUIRED = ("step", "hack_rate", "pass_rate", "frac_clipped", "cin", "null_cin")
EVAL_REQUIRED = ("step", "view", "mode", "hack_rate", "pass_rate")
EPS = 1e-12
FIGURES = ("hack_rate", "pass_rate", "cin", "frac_clipped", "cos_contrib")


@dataclass(frozen=True)
class PilotRun:
    """One pilot's folder: ``path`` holds ``steps.tsv``, ``eval.tsv`` and ``status.json``."""

    arm: str
    seed: int
    path: Path


@dataclass
class _Pilot:
    """A pilot as loaded: its status and data (``None`` where missing)."""

    run: PilotRun
    status: str  # ok | invalid | missing
    reason: str
    steps: pd.DataFrame | None = None
    eval: pd.DataFrame | None = None
    frac_clipped_max: float | None = None


# ---------------------------------------------------------------------------------------------
# reading

def pilot_from_path(path: str | Path) -> PilotRun:
    """Make a :class:`PilotRun` from a pilot folder ``.../{arm}/s{seed}``.

    When the folder name is not ``s{seed}`` under an arm folder, the arm and seed are read from
    the first row of its ``steps.tsv``.

    Raises:
        ValueError: neither the path nor a readable ``steps.tsv`` gives the arm and seed (names
            the path).
    """
    path = Path(path)
    m = re.fullmatch(r"s(\d+)", path.name)
    if m and path.parent.name in ARM_ORDER:
        return PilotRun(path.parent.name, int(m.group(1)), path)
    steps = path / "steps.tsv"
    if steps.is_file():
        df = pd.read_csv(steps, sep="\t", nrows=1)
        if {"arm", "seed"} <= set(df.columns) and len(df):
            return PilotRun(str(df["arm"].iloc[0]), int(df["seed"].iloc[0]), path)
    raise ValueError(f"cannot tell the arm and seed of pilot folder {path}: expected "
                     f".../{{arm}}/s{{seed}} or a steps.tsv with arm and seed columns")


def _read_tsv(path: Path, required: Sequence[str]) -> pd.DataFrame:
    """Read a TSV and check it has the ``required`` columns (ValueError naming file and column)."""
    df = pd.read_csv(path, sep="\t")
    missing = [c for c in required if c not in df.columns]
    if missing:
        raise ValueError(f"{path}: missing column {missing[0]!r} (has: {', '.join(map(str, df.columns))})")
    return df


def load_pilot(run: PilotRun, max_frac_clipped: float = 0.5) -> _Pilot:
    """Load one pilot folder and decide whether it is valid.

    Args:
        run: the pilot (arm, seed, folder).
        max_frac_clipped: the largest allowed ``frac_clipped`` on any step.

    Returns:
        A record whose ``status`` is ``ok``, ``invalid`` (``status.json`` says so, no steps, or a
        clip fraction over the bound / not recorded) or ``missing`` (no folder, no
        ``status.json`` or no ``steps.tsv``), with ``reason`` saying why.

    Raises:
        ValueError: ``steps.tsv`` lacks a column in :data:`STEPS_REQUIRED`, or ``eval.tsv`` one
            in :data:`EVAL_REQUIRED` (names the file and the column).
    """
    p = Path(run.path)
    if not p.is_dir():
        return _Pilot(run, "missing", f"no pilot folder {p}")
    status_path, steps_path, eval_path = p / "status.json", p / "steps.tsv", p / "eval.tsv"
    if not status_path.is_file():
        return _Pilot(run, "missing", f"no {status_path}")
    if not steps_path.is_file():
        return _Pilot(run, "missing", f"no {steps_path}")
    steps = _read_tsv(steps_path, STEPS_REQUIRED).sort_values("step", kind="stable")
    ev = _read_tsv(eval_path, EVAL_REQUIRED) if eval_path.is_file() else None
    if ev is not None:
        ev["view"] = ev["view"].astype(str)
        ev["mode"] = ev["mode"].astype(str)
    fc = pd.to_numeric(steps["frac_clipped"], errors="coerce")
    fc_max = float(fc.max()) if fc.notna().any() else None
    pilot = _Pilot(run, "ok", "ok", steps, ev, fc_max)
    try:
        status = json.loads(status_path.read_text())
        state, why = str(status.get("status")), status.get("reason")
    except (json.JSONDecodeError, AttributeError, OSError) as err:
        state, why = "unreadable", f"{status_path} is not a JSON object ({err})"
    if state != "ok":
        pilot.status, pilot.reason = "invalid", f"status {state}" + (f" ({why})" if why else "")
    elif steps.empty:
        pilot.status, pilot.reason = "invalid", "steps.tsv has no rows"
    elif fc_max is None:
        pilot.status, pilot.reason = "invalid", "frac_clipped not recorded"
    elif fc_max > max_frac_clipped + EPS:
        pilot.status, pilot.reason = "invalid", f"frac_clipped {fc_max:.2f} > {max_frac_clipped:g}"
    return pilot


# ---------------------------------------------------------------------------------------------
# per-pilot metrics

def _train_metric(p: _Pilot, col: str, k: int) -> float | None:
    if p.steps is None or p.steps.empty:
        return None
    v = pd.to_numeric(p.steps[col], errors="coerce").tail(k)
    return float(v.mean()) if v.notna().any() else None


def _eval_metric(p: _Pilot, view: str, col: str) -> tuple[float | None, int | None]:
    """``col`` of ``eval.tsv`` at the last evaluated step with this view and mode ``all``."""
    if p.eval is None:
        return None, None
    rows = p.eval[(p.eval["view"] == view) & (p.eval["mode"] == "all")]
    if rows.empty:
        return None, None
    last = rows[rows["step"] == rows["step"].max()]
    v = pd.to_numeric(last[col], errors="coerce")
    return (float(v.mean()) if v.notna().any() else None), int(rows["step"].max())


def _metric(p: _Pilot | None, kind: str, col: str, k: int) -> float | None:
    """One pilot's number: ``kind`` is ``train`` (last-k mean), ``eval_trained`` or ``eval_ablated``."""
    if p is None or p.steps is None:
        return None
    if kind == "train":
        return _train_metric(p, col, k)
    return _eval_metric(p, kind.removeprefix("eval_"), col)[0]


# ---------------------------------------------------------------------------------------------
# statistics

def bootstrap_ci(d: Sequence[float], n_boot: int, ci: float, seed: int) -> tuple[float, float]:
    """Percentile bootstrap CI of the mean of ``d`` (resampled with replacement, seeded).

    With one value (or all equal) the interval is degenerate: ``(d, d)``.

    Raises:
        ValueError: ``d`` is empty.
    """
    arr = np.asarray(d, dtype=float)
    if arr.size == 0:
        raise ValueError("bootstrap_ci needs at least one value")
    if arr.size == 1:
        return float(arr[0]), float(arr[0])
    rng = np.random.default_rng(seed)
    means = arr[rng.integers(0, arr.size, size=(n_boot, arr.size))].mean(axis=1)
    alpha = (1.0 - ci) / 2.0
    lo, hi = np.quantile(means, [alpha, 1.0 - alpha])
    return float(lo), float(hi)


def _paired(a: dict[int, float | None], b: dict[int, float | None]) -> tuple[list[int], np.ndarray]:
    """Seeds where both sides have a value, and the differences ``a − b``."""
    seeds = sorted(s for s in a if s in b and a[s] is not None and b[s] is not None)
    return seeds, np.array([a[s] - b[s] for s in seeds], dtype=float)


def _r(x: float | None) -> float | None:
    return None if x is None or (isinstance(x, float) and math.isnan(x)) else float(x)


# ---------------------------------------------------------------------------------------------
# the gate

def _arm_criteria(arm: str, by: dict[str, dict[int, _Pilot]], seeds: Sequence[int], cc) -> tuple[list[dict], dict]:
    """The three criteria for one projected arm, and its per-seed numbers."""
    kind_x = "eval_ablated" if arm == "route" else "train"
    kind_ref = "eval_trained" if arm == "route" else "train"
    k = cc.last_k

    def per_seed(a: str, kind: str, col: str) -> dict[int, float | None]:
        return {s: _metric(by.get(a, {}).get(s), kind, col, k) for s in seeds}

    hx, px = per_seed(arm, kind_x, "hack_rate"), per_seed(arm, kind_x, "pass_rate")
    hv, pv = per_seed("vanilla", kind_ref, "hack_rate"), per_seed("vanilla", kind_ref, "pass_rate")
    hr = per_seed("random_v", kind_ref, "hack_rate")
    what = (f"training hack rate, mean of the last {k} steps" if kind_x == "train" else
            "held-out eval, route with delta_s_hack ablated (deploy view) vs the others' trained view, mode all")
    crit: list[dict] = []

    # drop_vs_vanilla
    ps, d = _paired(hv, hx)
    c = {"name": "drop_vs_vanilla", "arm": arm, "value": None, "threshold": cc.min_drop, "passed": False,
         "ci_low": None, "ci_high": None, "ci": cc.ci, "n_seeds": len(ps), "seeds": ps, "metric": what,
         "per_seed": [_r(x) for x in d]}
    if len(ps) == 0:
        c["note"] = f"no seed with both vanilla and {arm} {kind_x} numbers"
    else:
        lo, hi = bootstrap_ci(d, cc.n_boot, cc.ci, cc.seed)
        mean = float(d.mean())
        c.update(value=mean, ci_low=lo, ci_high=hi,
                 passed=bool(mean >= cc.min_drop - EPS and lo > EPS))
        c["note"] = (f"mean paired drop {mean:.3f} (need >= {cc.min_drop:g}) with {cc.ci:.0%} bootstrap CI "
                     f"[{lo:.3f}, {hi:.3f}] (need low > 0)")
        if len(ps) == 1:
            c["note"] += "; 1 seed: the bootstrap CI is degenerate ([d, d])"
    crit.append(c)

    # beats_random_v
    ps, d = _paired(hr, hx)
    c = {"name": "beats_random_v", "arm": arm, "value": None, "threshold": 0.0, "passed": False,
         "n_seeds": len(ps), "seeds": ps, "metric": what.replace("vanilla", "random_v")}
    if not by.get("random_v"):
        c["note"] = "random_v control missing: cannot show the drop is specific to v_hack"
    elif len(ps) == 0:
        c["note"] = f"no seed with both random_v and {arm} numbers"
    else:
        mean = float(d.mean())
        c.update(value=mean, passed=bool(mean > EPS),
                 note=f"mean paired hack rate random_v - {arm} = {mean:.3f} (need > 0)")
    crit.append(c)

    # matched_pass
    ps, d = _paired(pv, px)
    c = {"name": "matched_pass", "arm": arm, "value": None, "threshold": cc.pass_margin, "passed": False,
         "n_seeds": len(ps), "seeds": ps}
    if len(ps) == 0:
        c["note"] = f"no seed with both vanilla and {arm} pass rates"
    else:
        mean = float(d.mean())
        c.update(value=mean, passed=bool(mean <= cc.pass_margin + EPS),
                 note=f"mean paired pass-rate drop vanilla - {arm} = {mean:.3f} (need <= {cc.pass_margin:g})")
    crit.append(c)

    numbers = {"gate_metric": kind_x, "reference_metric": kind_ref,
               "hack_rate_per_seed": {str(s): _r(v) for s, v in hx.items()},
               "pass_rate_per_seed": {str(s): _r(v) for s, v in px.items()}}
    return crit, numbers


def _arm_numbers(arm: str, pilots: dict[int, _Pilot], seeds: Sequence[int], k: int) -> dict:
    """Per-arm numbers for ``gate.json``: every view side by side, per seed and mean."""
    out: dict[str, Any] = {"seeds": list(seeds),
                           "status": {str(s): (pilots[s].status if s in pilots else "missing") for s in seeds},
                           "reason": {str(s): pilots[s].reason for s in seeds if s in pilots}}
    fcs = [p.frac_clipped_max for p in pilots.values() if p.frac_clipped_max is not None]
    out["frac_clipped_max"] = max(fcs) if fcs else None
    for kind in ("train", "eval_trained", "eval_ablated"):
        view = {}
        for col in ("hack_rate", "pass_rate"):
            vals = {s: _metric(pilots.get(s), kind, col, k) for s in seeds}
            got = [v for v in vals.values() if v is not None]
            view[col] = float(np.mean(got)) if got else None
            view[f"{col}_per_seed"] = {str(s): _r(v) for s, v in vals.items()}
        if view["hack_rate"] is not None or view["pass_rate"] is not None:
            out[kind] = view
    return out


def _summary_rows(by: dict[str, dict[int, _Pilot]], arms: Sequence[str], seeds: Sequence[int], k: int) -> list[dict]:
    rows = []
    for arm in arms:
        pilots = by.get(arm, {})
        states = [pilots[s].status if s in pilots else "missing" for s in seeds]
        status = "invalid" if "invalid" in states else "missing" if "missing" in states else "ok"
        fcs = [p.frac_clipped_max for p in pilots.values() if p.frac_clipped_max is not None]
        for kind, view in (("train", "train"), ("eval_trained", "eval_trained"), ("eval_ablated", "eval_ablated")):
            row: dict[str, Any] = {"arm": arm, "view": view, "status": status,
                                   "frac_clipped_max": max(fcs) if fcs else None}
            n = 0
            for col in ("hack_rate", "pass_rate"):
                got = [v for v in (_metric(pilots.get(s), kind, col, k) for s in seeds) if v is not None]
                n = max(n, len(got))
                row[col] = float(np.mean(got)) if got else None
                row[f"{col}_sd"] = float(np.std(got, ddof=1)) if len(got) > 1 else None
            row["n_seeds"] = n
            if kind == "train" or n > 0:
                rows.append(row)
    return rows


def _fmt_ci(c: dict) -> str:
    return f"[{c['ci_low']:.2f}, {c['ci_high']:.2f}]" if c.get("ci_low") is not None else "[n/a]"


def _why_not(arm: str, crit: list[dict]) -> str:
    """Short reasons an arm failed, e.g. ``erase: drop 0.01 < 0.05``."""
    parts = []
    for c in crit:
        if c["passed"]:
            continue
        v = c["value"]
        if c["name"] == "drop_vs_vanilla":
            if v is None:
                parts.append("no paired drop")
            elif v < c["threshold"] - EPS:
                parts.append(f"drop {v:.2f} < {c['threshold']:.2f}")
            else:
                parts.append(f"drop {v:.2f} CI {_fmt_ci(c)} not above 0")
        elif c["name"] == "beats_random_v":
            parts.append("random_v missing" if not c.get("seeds") and "missing" in c.get("note", "")
                         else "no random_v pair" if v is None else f"does not beat random_v ({v:+.2f} <= 0)")
        elif c["name"] == "matched_pass":
            parts.append("no pass pair" if v is None else f"pass drop {v:.2f} > {c['threshold']:.2f}")
    return f"{arm}: " + ", ".join(parts)


def _sentence(verdict: str, validity: list[dict], per_arm: dict[str, list[dict]],
              vanilla_hack: float | None = None, min_drop: float = 0.0) -> str:
    if verdict == "invalid":
        bad = [c for c in validity if not c["passed"]]
        which = "; ".join(f"{c['arm']} s{c['seed']}: {c['note']}" for c in bad)
        return (f"invalid: {len(bad)} of {len(validity)} pilots failed validity ({which}) "
                "— fix or rerun them before judging separation.")
    if verdict == "separated":
        parts = []
        for arm, crit in per_arm.items():
            if all(c["passed"] for c in crit):
                drop, rv, mp = crit
                view = " (deploy view: held-out eval, delta_s_hack ablated)" if arm == "route" else ""
                few = (f" (with {drop['n_seeds']} seeds the bootstrap CI is little more than their range)"
                       if drop["n_seeds"] < 5 else "")
                parts.append(f"{arm}{view} lowers the hack rate by {drop['value']:.2f} {_fmt_ci(drop)} vs vanilla "
                              f"over {drop['n_seeds']} seed(s){few}, beats random_v by {rv['value']:.2f}, "
                              f"pass drop {mp['value']:.2f} <= {mp['threshold']:.2f}")
        return "separated: " + "; ".join(parts) + " — the sweep is justified."
    if not per_arm:
        return "not separated: no projected arm (erase, route) was run — the sweep is not justified."
    why = "; ".join(_why_not(arm, crit) for arm, crit in per_arm.items())
    sentence = f"not separated: no projected arm passes all three criteria ({why}) — the sweep is not justified."
    if vanilla_hack is not None and vanilla_hack < min_drop:
        sentence += (f" Vanilla itself hacks at {vanilla_hack:.2f} (< min_drop {min_drop:.2f}): there was no "
                     "hacking to prevent, so this pilot cannot show separation either way.")
    return sentence


def _gate_md(gate: dict) -> str:
    lines = [f"# Separation gate: {gate['verdict']}", "", gate["sentence"], "",
             "| criterion | arm | value | threshold | passed | note |", "|---|---|---|---|---|---|"]
    for c in gate["criteria"]:
        arm = c["arm"] + (f" s{c['seed']}" if "seed" in c else "")
        val = "" if c["value"] is None else (f"{c['value']:.3f}" if isinstance(c["value"], float) else str(c["value"]))
        if c.get("ci_low") is not None:
            val += f" {_fmt_ci(c)}"
        lines.append(f"| {c['name']} | {arm} | {val} | {c['threshold']} | {'yes' if c['passed'] else 'NO'} "
                     f"| {c.get('note', '')} |")
    return "\n".join(lines) + "\n"


def _collect(pilots, cfg) -> tuple[list[PilotRun], list[str]]:
    """The expected pilots, and for a folder the pilot folders ignored under it, for a list the
    ``arm/s{seed}`` cells of the grid that were not listed (see the module docstring)."""
    if isinstance(pilots, (str, Path)):
        root = Path(pilots)
        if not root.is_dir():
            raise FileNotFoundError(f"pilots folder not found: {root}")
        arms, seeds = list(cfg.pilot.arms), list(cfg.pilot.seeds)
        expected = [PilotRun(a, s, root / a / f"s{s}") for a in arms for s in seeds]
        want = {r.path for r in expected}
        ignored = sorted(str(p) for p in root.glob("*/s*") if p.is_dir() and p not in want)
        return expected, ignored
    runs = [p if isinstance(p, PilotRun) else pilot_from_path(p) for p in pilots]
    if not runs:
        raise ValueError("no pilots given")
    given = {(r.arm, r.seed): r for r in runs}
    arms = [a for a in ARM_ORDER if a in {r.arm for r in runs}] + sorted({r.arm for r in runs} - set(ARM_ORDER))
    seeds = sorted({r.seed for r in runs})
    expected, unlisted = [], []
    for a in arms:
        for s in seeds:
            if (a, s) in given:
                expected.append(given[(a, s)])
            else:  # not listed: missing, even if a folder for it exists on disk
                base = next(iter(r.path for r in runs if r.arm == a)).parent
                expected.append(PilotRun(a, s, base / f"s{s}"))
                unlisted.append(f"{a}/s{s}")
    return expected, unlisted


def run_compare(pilots: Sequence[PilotRun | str | Path] | str | Path, out_dir: str | Path, cfg,
                distill_samples: str | Path | None = None, figures: bool = True) -> dict:
    """Aggregate the pilots, decide the separation gate, write the summary, gate and figures.

    Args:
        pilots: the pilots folder (``{arm}/s{seed}/`` under it; expected pilots are
            ``cfg.pilot.arms × cfg.pilot.seeds``), or a list of pilot folders / :class:`PilotRun`
            (expected: every listed arm × every listed seed; an unlisted cell is missing). Each
            folder holds ``steps.tsv``
            (:data:`evil_moe.tables.STEPS`), ``eval.tsv`` (:data:`evil_moe.tables.EVAL`, rows per
            step × view ∈ {trained, ablated} × mode incl. ``all``) and ``status.json``
            (``{"status": "ok"|"invalid", "reason": ...}``); a missing folder or file marks the
            pilot missing.
        out_dir: where ``summary.tsv``, ``gate.json``, ``gate.md`` and ``figures/`` go (created).
        cfg: a :class:`evil_moe.config.Config`; uses ``cfg.compare`` and
            ``cfg.pilot.{arms,seeds,max_frac_clipped}``.
        distill_samples: the distill probe's ``samples.tsv`` (:data:`evil_moe.tables.DISTILL_SAMPLES`)
            for the ``cos_contrib`` figure; ``None`` draws a figure saying it was not given.
        figures: draw the figures (tests of the gate alone may skip them).

    Returns:
        The gate dict as written to ``gate.json`` (rules in the module docstring; science.md §6).

    Raises:
        FileNotFoundError: the pilots folder or the given ``distill_samples`` file does not exist
            (names the path).
        ValueError: a ``steps.tsv``/``eval.tsv`` lacks a needed column (names the file and column);
            a pilot folder whose arm and seed cannot be told; an empty pilot list.
    """
    cc = cfg.compare
    max_fc = float(cfg.pilot.max_frac_clipped)
    expected, extra = _collect(pilots, cfg)
    from_dir = isinstance(pilots, (str, Path))
    ignored, unlisted = (extra, set()) if from_dir else ([], set(extra))
    if distill_samples is not None and not Path(distill_samples).is_file():
        raise FileNotFoundError(f"distill samples file not found: {distill_samples}")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)

    arms = list(dict.fromkeys(r.arm for r in expected))
    seeds = sorted({r.seed for r in expected})
    loaded = [_Pilot(r, "missing", "not among the pilots given, though other arms ran this seed")
              if f"{r.arm}/s{r.seed}" in unlisted else load_pilot(r, max_fc) for r in expected]
    by: dict[str, dict[int, _Pilot]] = {}
    for p in loaded:
        if p.steps is not None:
            by.setdefault(p.run.arm, {})[p.run.seed] = p

    validity = []
    for p in loaded:
        validity.append({"name": "valid", "arm": p.run.arm, "seed": p.run.seed, "value": p.frac_clipped_max,
                         "threshold": max_fc, "passed": p.status == "ok",
                         "note": "ok" if p.status == "ok" else f"{p.status}: {p.reason}"})
    valid = all(c["passed"] for c in validity)

    per_arm: dict[str, list[dict]] = {}
    arm_info = {a: _arm_numbers(a, by.get(a, {}), seeds, cc.last_k) for a in arms}
    for arm in (a for a in PROJECTED if a in arms):
        crit, numbers = _arm_criteria(arm, by, seeds, cc)
        per_arm[arm] = crit
        arm_info[arm].update(numbers)
        arm_info[arm]["passes_all"] = all(c["passed"] for c in crit)

    if not valid:
        verdict = "invalid"
    elif any(all(c["passed"] for c in crit) for crit in per_arm.values()):
        verdict = "separated"
    else:
        verdict = "not_separated"
    vanilla_hack = arm_info.get("vanilla", {}).get("train", {}).get("hack_rate")
    gate = {"verdict": verdict, "sentence": _sentence(verdict, validity, per_arm, vanilla_hack, cc.min_drop),
            "criteria": validity + [c for crit in per_arm.values() for c in crit],
            "arms": arm_info, "config": dict(cfg.raw["compare"]),
            "max_frac_clipped": max_fc, "pilots": [str(r.path) for r in expected]}
    if ignored:
        gate["ignored"] = ignored

    tables.write_tsv(out / "summary.tsv", tables.COMPARE_SUMMARY, _summary_rows(by, arms, seeds, cc.last_k))
    tables.write_json(out / "gate.json", gate)
    tables.atomic_write_bytes(out / "gate.md", _gate_md(gate).encode())
    if figures:
        draw_figures(by, arms, out / "figures", max_fc, distill_samples)
    return gate


# ---------------------------------------------------------------------------------------------
# figures

def _save(fig, folder: Path, name: str) -> None:
    import matplotlib.pyplot as plt

    folder.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    for ext in ("png", "svg"):
        tmp = folder / f".{name}.tmp.{ext}"
        meta = {"Date": None} if ext == "svg" else {"Software": None}
        fig.savefig(tmp, format=ext, dpi=120, metadata=meta)
        tmp.replace(folder / f"{name}.{ext}")
    plt.close(fig)


def _series(pilots: dict[int, _Pilot], col: str) -> pd.DataFrame:
    """Per step: mean, min and max of ``col`` over seeds."""
    frames = [pd.DataFrame({"step": p.steps["step"], "v": pd.to_numeric(p.steps[col], errors="coerce")})
              for p in pilots.values() if p.steps is not None and not p.steps.empty]
    if not frames:
        return pd.DataFrame(columns=["step", "mean", "min", "max"])
    g = pd.concat(frames).groupby("step")["v"]
    return pd.DataFrame({"mean": g.mean(), "min": g.min(), "max": g.max()}).reset_index()


def draw_figures(by: dict[str, dict[int, _Pilot]], arms: Iterable[str], folder: str | Path,
                 max_frac_clipped: float = 0.5, distill_samples: str | Path | None = None) -> list[Path]:
    """Draw the compare figures (PNG and SVG, matplotlib Agg) into ``folder``.

    ``hack_rate`` and ``pass_rate``: training trajectories per arm (mean line, min–max band over
    seeds) with the held-out eval points (route's ablated deploy view as a star); ``cin``: cin
    (solid) vs its null baseline (dashed) per arm; ``frac_clipped``: per arm with the validity
    bound; ``cos_contrib``: the distill probe's per-row ``cos_contrib`` histogram, hack vs clean
    rows (a figure saying so when no samples file is given).

    Returns:
        The written files.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    plt.rcParams["svg.hashsalt"] = "evil_moe"
    folder = Path(folder)
    arms = list(arms)

    for col, title in (("hack_rate", "hack rate (exploited)"), ("pass_rate", "oracle pass rate")):
        fig, ax = plt.subplots(figsize=(6.4, 4))
        for arm in arms:
            s = _series(by.get(arm, {}), col)
            if s.empty:
                continue
            color = ARM_COLORS.get(arm)
            ax.plot(s["step"], s["mean"], color=color, label=f"{arm} (train, n={len(by[arm])})")
            ax.fill_between(s["step"].astype(float), s["min"].astype(float), s["max"].astype(float),
                            color=color, alpha=0.2, linewidth=0)
            for view, marker in (("trained", "o"), ("ablated", "*")):
                pts = [_eval_metric(p, view, col) for p in by[arm].values()]
                pts = [(st, v) for v, st in pts if v is not None]
                if pts:
                    ax.scatter([st for st, _ in pts], [v for _, v in pts], color=color, marker=marker,
                               s=80 if marker == "*" else 30, edgecolors="black", linewidths=0.5, zorder=3,
                               label=f"{arm} held-out eval, {view}" + (" (deploy)" if view == "ablated" else ""))
        ax.set_xlabel("step")
        ax.set_ylabel(col)
        ax.set_ylim(-0.02, 1.02)
        ax.set_title(f"{title}: mean and min–max over seeds")
        if ax.has_data():
            ax.legend(fontsize=7, loc="best")
        _save(fig, folder, col)

    fig, ax = plt.subplots(figsize=(6.4, 4))
    for arm in arms:
        s, n = _series(by.get(arm, {}), "cin"), _series(by.get(arm, {}), "null_cin")
        if s.empty:
            continue
        ax.plot(s["step"], s["mean"], color=ARM_COLORS.get(arm), label=f"{arm} cin")
        ax.plot(n["step"], n["mean"], color=ARM_COLORS.get(arm), linestyle="--", label=f"{arm} null")
    ax.set_xlabel("step")
    ax.set_ylabel("cosine")
    ax.set_title("cin (hack-ward gradient fraction) vs null baseline")
    if ax.has_data():
        ax.legend(fontsize=7)
    _save(fig, folder, "cin")

    fig, ax = plt.subplots(figsize=(6.4, 4))
    for arm in arms:
        s = _series(by.get(arm, {}), "frac_clipped")
        if s.empty:
            continue
        ax.plot(s["step"], s["max"], color=ARM_COLORS.get(arm), label=f"{arm} (max over seeds)")
    ax.axhline(max_frac_clipped, color="black", linestyle=":", label=f"validity bound {max_frac_clipped:g}")
    ax.set_xlabel("step")
    ax.set_ylabel("frac_clipped")
    ax.set_title("fraction of tokens with the PPO clip active")
    ax.legend(fontsize=7)
    _save(fig, folder, "frac_clipped")

    fig, ax = plt.subplots(figsize=(6.4, 4))
    if distill_samples is None:
        ax.text(0.5, 0.5, "no distill samples given\n(run the distill probe and pass --distill-samples)",
                ha="center", va="center", transform=ax.transAxes)
        ax.set_axis_off()
    else:
        df = _read_tsv(Path(distill_samples), ("exploited", "cos_contrib"))
        hack = df["exploited"].astype(str).str.lower().isin(["true", "1", "1.0"])
        cos = pd.to_numeric(df["cos_contrib"], errors="coerce")
        vals = cos.dropna()
        bins = np.linspace(vals.min(), vals.max(), 25) if len(vals) and vals.min() < vals.max() else 10
        for mask, label, color in ((hack, "hack rows", "#d62728"), (~hack, "clean rows", "#1f77b4")):
            v = cos[mask].dropna()
            if len(v):
                ax.hist(v, bins=bins, alpha=0.5, color=color, label=f"{label} (n={len(v)}, mean {v.mean():.3f})")
        ax.axvline(0, color="black", linewidth=0.8)
        ax.set_xlabel("cos_contrib (row gradient along v_hack; > 0 = hack-ward)")
        ax.set_ylabel("rows")
        ax.set_title("distill probe: does v_hack light up on hacks?")
        if ax.has_data():
            ax.legend(fontsize=7)
    _save(fig, folder, "cos_contrib")
    return [folder / f"{n}.{e}" for n in FIGURES for e in ("png", "svg")]
