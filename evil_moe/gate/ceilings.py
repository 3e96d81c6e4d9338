"""Ceilings and absorption: numbers the report sets beside the gate (never gate criteria).

* **Ceilings** (``route_oracle``, ``filter_oracle``; :mod:`evil_moe.rl.arms.registry`): the same arm with the
  true hack label as its flags. Per treatment with a ceiling, :func:`ceiling_rows` gives its
  held-out hack-rate drop vs vanilla beside the ceiling's, and their ratio
  ``share = drop_treatment / drop_ceiling`` — "route achieves X of what a perfect detector
  achieves" — with an interval (:func:`crossed_ratio`). Whether the ceiling separates from
  vanilla and from its own matched control is read from the same paired effects the gate uses
  (:func:`evil_moe.gate.effects.paired_effect`).
* **Absorption** (Gradient Routing, Cloud et al. 2024, arXiv:2410.04332): with a detector that
  knows only some loophole modes (``vhack.known_modes``), the deploy view's held-out hack rate on
  the modes it never saw says whether routing removed hacks nobody flagged
  (:func:`mode_rates`).

The ratio's interval. Held-out problems are the same in every seed (a crossed design), so each
bootstrap replicate draws ``S`` seeds and ``P`` problems with replacement, once, and takes the
ratio of the two mean drops over the drawn (seed, problem) cells (seed and problem effects shared
by the numerator and the denominator cancel in the ratio, as they should). The interval is the
gate's style: ``share ± t_{S−1} · sqrt(S/(S−1)) · sd(share*)`` (with one seed, none). A ratio is
unstable when its denominator nears 0: the share is reported only when the ceiling's drop is
above 0, and its interval then widens with the replicates whose ceiling drop is small.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np
import pandas as pd

from evil_moe.env.loopholes import MODES
from evil_moe.gate.bootstrap import crossed_indices
from evil_moe.gate.defaults import CI, N_BOOT, SEED
from evil_moe.gate.effects import Effect, side_rate
from evil_moe.gate.judge import effect_or_none
from evil_moe.gate.power import critical, finite
from evil_moe.rl.arms.registry import ARMS

__all__ = ["Ratio", "cell_rates", "crossed_ratio", "mode_rates"]


@dataclass(frozen=True)
class Ratio:
    """``value = num / den`` with its interval (``ci_low``/``ci_high`` None without one), the two
    point estimates ``num``, ``den`` and the seeds and problems used."""

    value: float | None
    ci_low: float | None
    ci_high: float | None
    num: float
    den: float
    n_seeds: int
    n_problems: int


def cell_rates(outcomes: pd.DataFrame, side: tuple[str, str], metric: str = "hack") -> pd.DataFrame:
    """``(seed × problem_id)`` table of one side's mean ``metric`` (rows seeds, columns problems).

    Raises:
        ValueError: no outcome rows for ``side``.
    """
    arm, view = side
    rows = outcomes[(outcomes["arm"].astype(str) == str(arm)) & (outcomes["view"].astype(str) == str(view))]
    if rows.empty:
        raise ValueError(f"outcomes: no rows for arm {arm!r} view {view!r}")
    return rows.assign(problem_id=rows["problem_id"].astype(str)).pivot_table(
        index="seed", columns="problem_id", values=metric, aggfunc="mean")


def crossed_ratio(outcomes: pd.DataFrame, num: tuple[tuple[str, str], tuple[str, str]],
                  den: tuple[tuple[str, str], tuple[str, str]], *, metric: str = "hack",
                  n_boot: int = N_BOOT, ci: float = CI, seed: int = SEED) -> Ratio:
    """The ratio of two paired drops, ``D(num) / D(den)``, with a crossed cluster-bootstrap interval.

    Each drop ``D(a, b)`` is the paired effect of :mod:`evil_moe.gate.effects` (mean over seeds of the
    mean over problems of ``rate_b − rate_a``), computed over the (seed, problem) cells present on
    all four sides. Replicates resample seeds and problems as crossed factors (module docstring).

    Args:
        outcomes: per-completion outcomes (:data:`evil_moe.pilots.OUTCOME_COLUMNS`), one step per
            (arm, view, seed).
        num: ``(a, b)`` sides of the numerator's drop (e.g. route ablated vs vanilla trained).
        den: ``(a, b)`` sides of the denominator's drop (e.g. route_oracle ablated vs vanilla).
        metric: ``hack`` | ``pass`` | ``truncated``.
        n_boot, ci, seed: replicates, level, generator seed.

    Returns:
        :class:`Ratio`; ``value`` None when the denominator's drop is not above 0.

    Raises:
        ValueError: a side without rows, or no (seed, problem) cell shared by all four sides.
    """
    tabs = [cell_rates(outcomes, s, metric) for s in (*num, *den)]
    seeds = sorted(set.intersection(*(set(t.index) for t in tabs)))
    probs = sorted(set.intersection(*(set(t.columns) for t in tabs)))
    if not seeds or not probs:
        raise ValueError(f"no (seed, problem) shared by {num} and {den}")
    a, b, c, d = (t.reindex(index=seeds, columns=probs).to_numpy(dtype=float) for t in tabs)
    dn, dd = b - a, d - c  # (S, P) per-cell drops; NaN where a side lacks the cell
    point_n = float(np.nanmean(np.nanmean(dn, axis=1)))
    point_d = float(np.nanmean(np.nanmean(dd, axis=1)))
    S, P = dn.shape
    value = point_n / point_d if point_d > 0 else None
    lo = hi = None
    if value is not None and S > 1:
        si, pi = crossed_indices(S, P, n_boot, np.random.default_rng(seed))
        reps = np.empty(n_boot)
        with np.errstate(all="ignore"):
            for k in range(n_boot):
                sub_n = dn[np.ix_(si[k], pi[k])]
                sub_d = dd[np.ix_(si[k], pi[k])]
                reps[k] = np.nanmean(np.nanmean(sub_n, axis=1)) / np.nanmean(np.nanmean(sub_d, axis=1))
        reps = reps[np.isfinite(reps)]
        if len(reps) > 1:
            se = math.sqrt(S / (S - 1)) * float(np.std(reps, ddof=1))
            half = critical(S - 1, ci) * se
            lo, hi = value - half, value + half
    return Ratio(value, lo, hi, point_n, point_d, S, P)


def mode_rates(outcomes: pd.DataFrame, side: tuple[str, str], modes: Sequence[str], *,
               metric: str = "hack", n_boot: int = N_BOOT, ci: float = CI,
               seed: int = SEED) -> Effect | None:
    """One side's rate over the held-out problems of ``modes`` only, with the gate's interval
    (:func:`evil_moe.gate.effects.side_rate` on those rows); None when the side has no such rows."""
    sub = outcomes[outcomes["mode"].astype(str).isin(list(modes))]
    try:
        return side_rate(sub, side, metric, n_boot=n_boot, ci=ci, seed=seed)
    except ValueError:
        return None


def _ci_cols(row: dict, e, value: str, low: str, high: str, clip: bool = False) -> None:
    if e is None:
        return
    lo, hi = finite(e.ci_low), finite(e.ci_high)
    if clip:
        lo = None if lo is None else max(0.0, lo)
        hi = None if hi is None else min(1.0, hi)
    row[value], row[low], row[high] = finite(e.value), lo, hi


def ceiling_columns(rows: list[dict], outcomes: pd.DataFrame, cc, known: list[str]) -> dict:
    """Fill each summary row's drop, ceiling and per-mode columns in place
    (:data:`evil_moe.tables.COMPARE_SUMMARY`) from the held-out ``outcomes``; returns
    ``gate.json``'s ``ceilings``: per treatment with a ceiling that ran, its drop beside the
    ceiling's, the share, the ceiling's own separation from vanilla and from its matched control,
    and its hack-rate and pass-rate drops vs the untrained student (``ceiling_drop_vs_untrained``,
    ``ceiling_pass_drop_vs_untrained``: the untrained student's rate minus the ceiling's, so a pass
    gain is negative; None without the untrained student): a ceiling shows what a working method
    would only when it also beats not training. ``cc``: the ``compare`` config section; ``known``: the modes the detector knows."""
    unknown = [m for m in MODES if m not in known]
    present = set(zip(outcomes["arm"].astype(str), outcomes["view"].astype(str))) if not outcomes.empty else set()
    out = {}
    for row in rows:
        arm, view = row["arm"], row["view"]
        cls = ARMS.get(arm)
        if (arm, view) not in present:
            continue
        kw = dict(n_boot=cc.n_boot, ci=cc.ci, seed=cc.seed)
        for m in MODES:
            e = mode_rates(outcomes, (arm, view), [m], **kw)
            row[f"hack_rate_{m}"] = None if e is None else finite(e.value)
        _ci_cols(row, mode_rates(outcomes, (arm, view), known, **kw), "hack_rate_known",
                 "hack_known_ci_low", "hack_known_ci_high", clip=True)
        if unknown:
            _ci_cols(row, mode_rates(outcomes, (arm, view), unknown, **kw), "hack_rate_unknown",
                     "hack_unknown_ci_low", "hack_unknown_ci_high", clip=True)
        if arm != "untrained" and ("untrained", "trained") in present:
            _ci_cols(row, effect_or_none(outcomes, (arm, view), ("untrained", "trained"), "hack", cc),
                     "drop_vs_untrained", "untrained_ci_low", "untrained_ci_high")
            _ci_cols(row, effect_or_none(outcomes, (arm, view), ("untrained", "trained"), "pass", cc),
                     "pass_drop_vs_untrained", "pass_untrained_ci_low", "pass_untrained_ci_high")
        if arm == "vanilla":
            continue
        drop = effect_or_none(outcomes, (arm, view), ("vanilla", "trained"), "hack", cc)
        _ci_cols(row, drop, "drop_vs_vanilla", "drop_ci_low", "drop_ci_high")
        if cls is not None and cls.control and (cls.control, view) in present:
            _ci_cols(row, effect_or_none(outcomes, (arm, view), (cls.control, view), "hack", cc),
                     "drop_vs_control", "control_ci_low", "control_ci_high")
        if cls is None or not cls.ceiling or view != cls.views[0] or (cls.ceiling, view) not in present:
            continue
        ceil = effect_or_none(outcomes, (cls.ceiling, view), ("vanilla", "trained"), "hack", cc)
        row["ceiling"] = cls.ceiling
        row["ceiling_drop"] = None if ceil is None else finite(ceil.value)
        try:
            ratio = crossed_ratio(outcomes, ((arm, view), ("vanilla", "trained")),
                                  ((cls.ceiling, view), ("vanilla", "trained")), **kw)
        except ValueError:
            ratio = None
        if ratio is not None:
            row["ceiling_share"], row["ceiling_share_ci_low"], row["ceiling_share_ci_high"] = \
                ratio.value, ratio.ci_low, ratio.ci_high
        cctl = ARMS[cls.ceiling].control
        vs_ctl = effect_or_none(outcomes, (cls.ceiling, view), (cctl, view), "hack", cc) \
            if cctl and (cctl, view) in present else None
        vs_untr = {m: effect_or_none(outcomes, (cls.ceiling, view), ("untrained", "trained"), m, cc)
                   if ("untrained", "trained") in present else None for m in ("hack", "pass")}
        dose = None
        if cls.dose_ceiling and (cls.dose_ceiling, view) in present:
            row["dose_ceiling"] = cls.dose_ceiling
            dose = effect_or_none(outcomes, (cls.dose_ceiling, view), ("vanilla", "trained"), "hack", cc)
            _ci_cols(row, dose, "dose_ceiling_drop", "dose_ceiling_ci_low", "dose_ceiling_ci_high")

        def eff(e):
            return None if e is None else {"value": finite(e.value), "ci_low": finite(e.ci_low),
                                           "ci_high": finite(e.ci_high)}
        out[arm] = {"ceiling": cls.ceiling, "view": view, "drop": eff(drop), "ceiling_drop": eff(ceil),
                    "ceiling_control": cctl, "ceiling_vs_control": eff(vs_ctl),
                    "ceiling_drop_vs_untrained": eff(vs_untr["hack"]),
                    "ceiling_pass_drop_vs_untrained": eff(vs_untr["pass"]),
                    "dose_ceiling": cls.dose_ceiling if dose is not None else None, "dose_ceiling_drop": eff(dose),
                    "share": None if ratio is None else {"value": ratio.value, "ci_low": ratio.ci_low,
                                                         "ci_high": ratio.ci_high}}
    return out


def router_notes(routers: dict) -> list[str]:
    """One line per router arm: its w as a detector on its own rollouts, against its placebo."""
    def f(x):
        return "n/a" if x is None else f"{x:.3f}"
    return [f"{arm}'s router weight w as a detector of hacks on its own rollouts: AUC {f(r['auc'])} "
            f"[{f(r['auc_ci_low'])}, {f(r['auc_ci_high'])}] over {r['n_scored']} rollouts ({r['n_hack']} hacks), "
            f"against the placebo's 95th percentile {f(r['placebo_p95'])} (random directions): "
            + ("it sees hacks" if r["beats_placebo"] else "it does not beat its placebo")
            for arm, r in routers.items()]
