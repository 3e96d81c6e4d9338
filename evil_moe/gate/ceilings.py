"""Ceilings and absorption: numbers the report sets beside the gate (never gate criteria).

* **Ceilings** (``route_oracle``, ``filter_oracle``; :mod:`evil_moe.rl.arms`): the same arm with the
  true hack label as its flags. Per treatment with a ceiling, :func:`ceiling_rows` gives its
  held-out hack-rate drop vs vanilla beside the ceiling's, and their ratio
  ``share = drop_treatment / drop_ceiling`` — "route achieves X of what a perfect detector
  achieves" — with an interval (:func:`crossed_ratio`). Whether the ceiling separates from
  vanilla and from its own random-flag control is read from the same paired effects the gate uses
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

from evil_moe.gate.defaults import CI, N_BOOT, SEED
from evil_moe.gate.effects import Effect, side_rate
from evil_moe.gate.power import critical

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
        outcomes: per-completion outcomes (:data:`evil_moe.gate.effects.OUTCOME_COLUMNS`), one step per
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
        rng = np.random.default_rng(seed)
        si = rng.integers(0, S, size=(n_boot, S))
        pi = rng.integers(0, P, size=(n_boot, P))
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
