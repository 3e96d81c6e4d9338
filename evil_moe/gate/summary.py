"""Each arm's numbers beside the gate's verdict: the rows of ``compare/summary.tsv``
(:data:`evil_moe.tables.COMPARE_SUMMARY`, one per arm and view: the held-out rates with their
cluster-bootstrap intervals, the training rollouts' last-``k`` means, the removed energy, the
flag quality and the router's audit) and the sizes of the comparison, from the pilots as read
(:class:`evil_moe.pilots.Pilot`). Never criteria (:mod:`evil_moe.gate.judge` decides).
"""

from __future__ import annotations

import math
from typing import Any, Sequence

import numpy as np
import pandas as pd

from evil_moe.gate.effects import Effect, side_rate
from evil_moe.gate.power import finite
from evil_moe.pilots import Pilot
from evil_moe.rl.arms.registry import ARMS


def train_mean(pilots: dict[int, Pilot], col: str, k: int) -> float | None:
    """The mean over seeds of each pilot's mean of ``steps.tsv`` column ``col`` over its last
    ``k`` steps (None where no pilot has a value)."""
    vals = []
    for p in pilots.values():
        if p.steps is not None and col in p.steps.columns:
            v = pd.to_numeric(p.steps[col], errors="coerce").tail(k)
            if v.notna().any():
                vals.append(float(v.mean()))
    return float(np.mean(vals)) if vals else None


def all_steps_max(pilots: dict[int, Pilot], col: str) -> float | None:
    """The largest value of ``steps.tsv`` column ``col`` over every step of every seed (None where
    none has a value)."""
    vals = [float(pd.to_numeric(p.steps[col], errors="coerce").max()) for p in pilots.values()
            if p.steps is not None and col in p.steps.columns and pd.to_numeric(p.steps[col], errors="coerce").notna().any()]
    return max(vals) if vals else None


def all_steps_mean(pilots: dict[int, Pilot], col: str) -> float | None:
    """The mean of ``steps.tsv`` column ``col`` over every step of every seed (None where none
    has a value)."""
    vals = []
    for p in pilots.values():
        if p.steps is not None and col in p.steps.columns:
            v = pd.to_numeric(p.steps[col], errors="coerce").dropna()
            vals += v.tolist()
    return float(np.mean(vals)) if vals else None


def flag_columns(rows: list[dict], by: dict[str, dict[int, Pilot]]) -> None:
    """Each flagging arm's summary rows get its flag rate, precision, recall and false-positive
    rate: means over every training step of every seed (logged only, never gate criteria)."""
    for row in rows:
        cls = ARMS.get(row["arm"])
        if cls is not None and cls.flags_rollouts():
            for col in ("flag_rate", "flag_precision", "flag_recall", "flag_fpr"):
                row[col] = all_steps_mean(by.get(row["arm"], {}), col)


def router_columns(rows: list[dict], routers: dict) -> None:
    """Evil MoE's router audited on its own rollouts (:func:`router_audit`): its AUC, interval and
    placebo percentile on each of the arm's summary rows."""
    for row in rows:
        for k, v in (routers.get(row["arm"]) or {}).items():
            if k in ("auc", "auc_ci_low", "auc_ci_high", "placebo_p95"):
                row[f"router_{k}"] = v


def label_count(source: str, cfg, audit: dict | None, vhack_pairs: int | None) -> int | None:
    """How many labels one training run of an arm read from ``source`` (a name of
    :data:`evil_moe.rl.detectors.registry.LABEL_SOURCES`), or None where the compare stage
    cannot tell: its rollouts' (``rollouts``, ``oracle_pass``): ``pilot.steps × prompts_per_step
    × group``; the calibration runs' (``calibration``: the detector audit's ``n_scored`` of
    ``pilot.detector``; ``calibration_fit``: its ``n_labels``; ``audit`` its pooled row, None
    without an audit); v_hack's pairs (``vhack``): two labelled completions per pair it was
    extracted from (``vhack_pairs``, from ``vhack/main_checks.tsv``; under
    ``vhack.source: authored`` the authored pairs of the known modes); the authored pairs'
    (``authored``): two per pair in the run's format; ``planted``: 0."""
    pc = cfg.pilot
    if source in ("rollouts", "oracle_pass"):
        return int(pc.steps * pc.prompts_per_step * pc.group)
    if source in ("calibration", "calibration_fit"):
        n = (audit or {}).get("n_scored" if source == "calibration" else "n_labels")
        return None if n is None else int(n)
    if source == "vhack" and cfg.vhack.source != "authored":
        return None if vhack_pairs is None else 2 * int(vhack_pairs)
    if source in ("vhack", "authored"):
        from evil_moe.env.authored import load_authored

        fmt = "toy" if cfg.problems.source == "toy" else "leetcode"
        modes = (list(cfg.vhack.known_modes or []) or None) if source == "vhack" else None
        return 2 * sum(len(a.pairs()) for a in load_authored(cfg.moe.pairs, fmt=fmt, modes=modes))
    if source == "planted":
        return 0
    raise ValueError(f"unknown label source {source!r}")


def label_columns(rows: list[dict], cfg, audit: dict | None = None, vhack_pairs: int | None = None) -> None:
    """Each summary row's ``labels`` (the arm's label sources, :meth:`evil_moe.rl.arms.base.Arm.label_sources`,
    joined by ``+``, or ``none``) and ``labels_n`` (their :func:`label_count` summed; empty when
    one is unknown)."""
    for row in rows:
        cls = ARMS.get(row["arm"])
        if cls is None:
            continue
        sources = cls.label_sources(cfg.pilot)
        counts = [label_count(s, cfg, audit, vhack_pairs) for s in sources]
        row["labels"] = "+".join(sources) or "none"
        row["labels_n"] = None if None in counts else sum(counts)


def _rate(outcomes: pd.DataFrame, side: tuple[str, str], metric: str, cc) -> Effect | None:
    try:
        return side_rate(outcomes, side, metric, n_boot=cc.n_boot, ci=cc.ci, seed=cc.seed, resample=cc.resample)
    except ValueError:
        return None


def summary_rows(by: dict[str, dict[int, Pilot]], arms: Sequence[str], outcomes: pd.DataFrame,
                 seeds: Sequence[int], cc) -> list[dict]:
    """One :data:`evil_moe.tables.COMPARE_SUMMARY` row per arm and held-out view (raw floats):
    the arm's status over ``seeds``, its held-out hack, pass and truncation rates with intervals
    (:func:`evil_moe.gate.effects.side_rate`; ``cc``: the ``compare`` section), the training
    rollouts' last-``k`` means, its largest clip fraction and mean removed energy."""
    rows = []
    for arm in arms:
        pilots = by.get(arm, {})
        states = [pilots[s].status if s in pilots else "missing" for s in seeds]
        status = "invalid" if "invalid" in states else "missing" if "missing" in states else "ok"
        fcs = [p.frac_clipped_max for p in pilots.values() if p.frac_clipped_max is not None]
        views = sorted(set(outcomes.loc[outcomes["arm"] == arm, "view"]),
                       key=lambda v: ("trained", "ablated", "projected").index(v) if v in ("trained", "ablated", "projected") else 9)
        for view in views or ["trained"]:
            iso = ",".join(sorted({p.isolation for p in pilots.values() if p.isolation}))
            row: dict[str, Any] = {"arm": arm, "role": ARMS[arm].role if arm in ARMS else "",
                                   "view": view, "status": status, "isolation": iso or None,
                                   "frac_clipped_max": max(fcs) if fcs else None,
                                   "train_hack_rate": train_mean(pilots, "hack_rate", cc.last_k),
                                   "train_pass_rate": train_mean(pilots, "pass_rate", cc.last_k),
                                   "removed_frac": all_steps_mean(pilots, "removed_frac"),
                                   "hack_expert_share": all_steps_mean(pilots, "hack_expert_share"),
                                   "update_span_frac": all_steps_mean(pilots, "update_span_frac")}
            for metric, col in (("hack", "hack_rate"), ("pass", "pass_rate"), ("truncated", "truncated_rate")):
                e = _rate(outcomes, (arm, view), metric, cc)
                if e is None:
                    continue
                row[col] = e.value
                row["n_seeds"], row["n_problems"], row["n_samples"] = e.n_seeds, _mean_problems(e), e.n_samples
                if metric != "truncated":  # a rate's interval, clipped to [0, 1]
                    low, high = finite(e.ci_low), finite(e.ci_high)
                    row[f"{col.removesuffix('_rate')}_ci_low"] = None if low is None else max(0.0, low)
                    row[f"{col.removesuffix('_rate')}_ci_high"] = None if high is None else min(1.0, high)
            rows.append(row)
    return rows


def rounded(row: dict, digits: int = 3) -> dict:
    """A summary row with floats rounded for reading (gate.json keeps the raw values)."""
    return {k: round(v, digits) if isinstance(v, float) and math.isfinite(v) else v for k, v in row.items()}


def _mean_problems(e) -> float:
    return float(np.mean(list(e.n_problems.values()))) if e.n_problems else 0.0


def sizes(outcomes: pd.DataFrame) -> str:
    """``"S seeds × P held-out problems × n samples"`` of the compared outcomes (P: mean per seed;
    n: the fewest samples of any (arm, view, seed, problem))."""
    n_prob = outcomes.groupby("seed")["problem_id"].nunique().mean() if not outcomes.empty else 0
    n_samp = int(outcomes.groupby(["arm", "view", "seed", "problem_id"]).size().min()) if not outcomes.empty else 0
    return (f"{outcomes['seed'].nunique() if not outcomes.empty else 0} seeds × {n_prob:.0f} held-out problems "
            f"× {n_samp} samples")
