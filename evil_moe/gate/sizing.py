"""What more data would decide an effect: how many seeds, held-out problems or samples per problem
would make its interval exclude a boundary (:func:`needed`), and its planned SE and MDE at twice
each (:func:`plan`), from the effect's variance components and the planning formulas of
:mod:`evil_moe.gate.power` (the derivation: docs/gate.md).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from evil_moe.gate.effects import Effect
from evil_moe.gate.power import VarianceComponents, critical, finite, planned_df, planned_mde, planned_se


@dataclass(frozen=True)
class Needed:
    """How much more data would make an interval exclude ``boundary`` if the observed mean holds.

    Attributes:
        boundary: the value the interval must exclude (0, ``min_drop`` or ``pass_margin``).
        distance: ``|value − boundary|``, what the half width must fall below.
        seeds: seeds needed at the current problems and samples (``None``: not within
            ``max_seeds``, or a component is unknown).
        samples: samples per problem and side needed at the current seeds and problems
            (``None``: more samples alone cannot decide, because run-to-run and problem noise stay).
        decides: what excluding the boundary would do for the criterion: ``pass`` or
            ``rule_out`` (empty when called directly).
        problems: held-out problems (the same in every seed) needed at the current seeds and
            samples (``None``: not within ``max_problems``: seed noise stays).
    """

    boundary: float
    distance: float
    seeds: int | None
    samples: int | None
    decides: str = ""
    problems: int | None = None


def _half_width(c: VarianceComponents, S: int, P: int, n: int, ci: float, scheme: str) -> float:
    """Planned half width ``t_df · SE`` at sizes (S, P, n) (:func:`planned_se`, :func:`planned_df`)."""
    se = planned_se(c, S, P, n, scheme)
    df = planned_df(c, S, P, n, scheme)
    return critical(df, ci) * se if math.isfinite(se) and df >= 1 else math.inf


def _smallest(lo: int, hi: int, ok) -> int | None:
    """The smallest integer in ``[lo, hi]`` with ``ok`` (bisection: ``ok`` is monotone in it)."""
    if lo > hi or not ok(hi):
        return None
    while lo < hi:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if ok(mid) else (mid + 1, hi)
    return lo


def needed(effect: Effect, boundary: float, *, decides: str = "",
           max_seeds: int = 1000,
           max_problems: int = 100000, max_samples: int = 1000000, ci: float | None = None) -> Needed:
    """Roughly how many seeds, or separately how many held-out problems, or samples per problem,
    would make the interval of ``effect`` exclude ``boundary`` if its observed mean and variance
    components hold.

    Uses the planned half width ``t_df · SE`` (:func:`planned_se`, :func:`planned_df`) with the
    effect's components and sizes (``P`` = its distinct problems for ``crossed``, the mean per
    seed otherwise), changing one size at a time: the smallest ``S'`` (``P'``, ``n'``) whose
    half width is below ``distance`` (found by bisection: the half width falls as any size grows).

    Args:
        effect: the Effect. boundary: the value to exclude. decides: recorded.
        max_seeds, max_problems, max_samples: search limits.
        ci: the level (default the effect's; :func:`evil_moe.gate.rule.decide_gate` passes Holm's adjusted level).

    Raises:
        ValueError: ``max_seeds`` < 2.
    """
    if max_seeds < 2:
        raise ValueError(f"max_seeds must be >= 2, got {max_seeds}")
    level = effect.ci if ci is None else ci
    dist = abs(effect.value - boundary)
    c = effect.components
    scheme = effect.resample
    P = _design_problems(effect)
    n = max(1, effect.n_samples)
    S = effect.n_seeds
    if dist <= 0 or c.is_nan():
        return Needed(boundary, dist, None, None, decides, None)
    seeds = _smallest(max(2, S), max_seeds, lambda k: _half_width(c, k, P, n, level, scheme) < dist)
    problems = samples = None
    if S >= 2:
        problems = _smallest(max(2, P), max_problems, lambda k: _half_width(c, S, k, n, level, scheme) < dist)
        samples = _smallest(1, max_samples, lambda k: _half_width(c, S, P, k, level, scheme) < dist)
    return Needed(boundary, dist, seeds, samples, decides, problems)


def _design_problems(effect: Effect) -> int:
    """``P`` for planning: the distinct problems (crossed), else the mean problems per seed."""
    if effect.resample == "crossed" and effect.n_problems_total:
        return int(effect.n_problems_total)
    return max(1, round(float(np.mean(list(effect.n_problems.values())))))


def plan(effect: Effect, factor: int = 2, *,
         power: float | None = None) -> dict[str, Any]:
    """The planned SE and MDE of ``effect`` now and with ``factor`` × the seeds, the held-out
    problems, or the samples per problem (one at a time), from its variance components
    (:func:`planned_mde`), and which of the three buys the most power (smallest MDE).

    Returns:
        ``{"now": {...}, "seeds": {...}, "problems": {...}, "samples": {...}, "best": name}``,
        each ``{"n_seeds", "n_problems", "n_samples", "se", "mde"}`` (``None`` where not finite);
        ``best`` is ``None`` when the components are unknown (one seed).
    """
    pw = effect.power if power is None else power
    c = effect.components
    S = effect.n_seeds
    P = _design_problems(effect)
    n = max(1, effect.n_samples)
    out: dict[str, Any] = {}
    for name, (s, p, k) in {"now": (S, P, n), "seeds": (factor * S, P, n), "problems": (S, factor * P, n),
                            "samples": (S, P, factor * n)}.items():
        se, mde = planned_mde(c, s, p, k, ci=effect.ci, power=pw, resample=effect.resample)
        out[name] = {"n_seeds": s, "n_problems": p, "n_samples": k, "se": finite(se), "mde": finite(mde)}
    opts = {k: out[k]["mde"] for k in ("seeds", "problems", "samples") if out[k]["mde"] is not None}
    out["best"] = min(opts, key=opts.get) if opts else None
    return out
