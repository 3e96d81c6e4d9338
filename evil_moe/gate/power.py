r"""Power, the minimum detectable effect, and what more data would buy: the planning side of
the separation gate (:mod:`evil_moe.gate`; the whole derivation, with the simulation tables, is
``docs/gate.md``). The variance components and the crossed interval these formulas plan for are
:mod:`evil_moe.gate.effects`.

Power, the minimum detectable effect, and what more data buys
-------------------------------------------------------------
The criterion "lower bound > 0" detects a true effect δ with power ≈ ``F_t(δ/SE − t_c; df)``;
the MDE at power ``1 − β`` is ``(t_{df,(1+ci)/2} + t_{df,1−β}) · SE`` (Bloom 1995, "Minimum
detectable effects", Evaluation Review 19:547–556). :func:`planned_se` gives the expected SE at
other sizes from the components; :func:`needed` the seeds, held-out problems or samples per
problem that would decide a criterion; :func:`plan` the planned SE and MDE at twice each, and
which buys the most (both of an :class:`~evil_moe.gate.effects.Effect`: :mod:`evil_moe.gate.sizing`). Under the crossed model more seeds shrink ``σ_B²/S``, more problems
``σ_C²/P``, more samples only ``σ_e²/(nSP)``: when the arm × problem term dominates, seeds alone
cannot decide.

Few-run RL statistics: the field's reference is rliable (Agarwal et al. 2021, "Deep
Reinforcement Learning at the Edge of the Statistical Precipice", NeurIPS, arXiv:2108.13264). It
is cited, not used: its stratified bootstrap resamples runs within each task and has neither a
paired two-arm difference nor a few-run t correction.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from evil_moe.gate.defaults import CI, POWER, RESAMPLE

#: Resampling schemes: ``crossed`` (the gate's: seeds and problems as crossed factors), ``nested``
#: (problems resampled independently within each drawn seed: the scheme before the crossed gate), ``seed``
#: (seeds only, each seed's problems kept whole), ``problem`` (problems within fixed seeds).
SCHEMES = ("crossed", "nested", "seed", "problem")
_LEVELS = {("seed", "problem"): "nested", ("problem", "seed"): "nested", ("seed",): "seed", ("problem",): "problem"}



def _special():
    """scipy.special, imported on first use: the rules import the verdict text (which imports
    this module) on every snakemake call, and scipy costs about a second to import."""
    from scipy import special

    return special

def resample_scheme(resample: str | Sequence[str]) -> str:
    """Normalise a resampling scheme: one of :data:`SCHEMES`, or the older tuples of levels
    (``("seed", "problem")`` = ``nested``, ``("seed",)`` = ``seed``, ``("problem",)`` = ``problem``).

    Raises:
        ValueError: anything else (names the allowed values).
    """
    if isinstance(resample, str):
        if resample in SCHEMES:
            return resample
    else:
        key = tuple(resample)
        if key in _LEVELS:
            return _LEVELS[key]
    raise ValueError(f"resample must be one of {SCHEMES} (or the levels ('seed', 'problem'), ('seed',), "
                     f"('problem',)), got {resample!r}")



# ---------------------------------------------------------------------------------------------
# critical values, power, planning

@functools.lru_cache(maxsize=4096)
def critical(df: float, ci: float = CI) -> float:
    """Two-sided critical value ``t_{df, (1+ci)/2}`` of Student's t (scipy); ``inf`` for df < 1.

    Raises:
        ValueError: ``ci`` not in (0, 1).
    """
    if not 0.0 < ci < 1.0:
        raise ValueError(f"ci must be in (0, 1), got {ci}")
    return float(_special().stdtrit(df, (1.0 + ci) / 2.0)) if df >= 1 else math.inf


def mde_from_se(se: float, df: float, ci: float = CI, power: float = POWER) -> float:
    """Minimum detectable effect ``(t_{df,(1+ci)/2} + t_{df,power}) · se`` (Bloom 1995).

    The smallest true effect that a "lower bound of the ``ci`` interval > 0" criterion detects with
    probability ``power``, treating ``se`` as the effect's standard error. Units: those of ``se``
    (rate points). ``inf`` when df < 1 or ``se`` is not finite.

    Raises:
        ValueError: ``power`` not in (0, 1) or ``ci`` not in (0, 1).
    """
    if not 0.0 < power < 1.0:
        raise ValueError(f"power must be in (0, 1), got {power}")
    if df < 1 or not math.isfinite(se):
        return math.inf
    return (critical(df, ci) + t_ppf(power, df)) * se


def power_lower(delta: float, se: float, df: float, ci: float = CI, floor: float = 0.0, bound: float = 0.0) -> float:
    """Power of "``D ≥ floor`` and ``ci_low > bound``" at a true effect ``delta``.

    ``1 − F_t((max(floor, bound + t_c·se) − delta) / se; df)``: the approximate probability
    that a future estimate clears both the point threshold ``floor`` (``min_drop`` for
    drop_vs_vanilla, else the bound) and the interval's lower end ``bound`` (0, or
    ``−min_drop`` for hack_vs_untrained's non-inferiority). 0 when df < 1 or ``se`` is not
    finite.
    """
    if df < 1 or not math.isfinite(se):
        return 0.0
    if se <= 0:
        return float(delta > max(floor, bound))
    need = max(floor, bound + critical(df, ci) * se)
    return float(_special().stdtr(df, (delta - need) / se))


def power_upper(delta: float, se: float, df: float, margin: float, ci: float = CI) -> float:
    """Power of "``ci_high ≤ margin``" (non-inferiority) at a true difference ``delta``:
    ``F_t((margin − delta)/se − t_c; df)``. 0 when df < 1 or ``se`` is not finite."""
    if df < 1 or not math.isfinite(se):
        return 0.0
    if se <= 0:
        return float(delta <= margin)
    return float(_special().stdtr(df, (margin - delta) / se - critical(df, ci)))


@functools.lru_cache(maxsize=4096)
def t_ppf(q: float, df: float) -> float:
    """The ``q`` quantile of Student's t with ``df`` degrees of freedom (scipy; cached)."""
    return float(_special().stdtrit(df, q))


@dataclass(frozen=True)
class VarianceComponents:
    """Variance components of a paired per-problem rate difference ``d_sp`` under the crossed
    model ``d_sp = μ + β_s + γ_p + ρ_sp + ε_sp`` (units: rate points squared).

    Attributes:
        between_seed: ``σ_B²``, variance over seeds (training runs) of ``β_s``, the seed's effect.
        between_problem: ``σ_C²``, variance over held-out problems of ``γ_p``, the arm × problem
            effect *shared by every seed* (the same problems are evaluated in every seed).
        within_problem: ``σ_e²``, per-sample variance of the difference, ``p_a(1−p_a) +
            p_b(1−p_b)``: one cell's sampling variance with ``n`` samples per side is ``σ_e²/n``.
        seed_problem: ``σ_R²``, variance of ``ρ_sp``, the seed × problem interaction beyond
            sampling (a run's problem-specific deviation). Default 0.
    """

    between_seed: float
    between_problem: float
    within_problem: float
    seed_problem: float = 0.0

    def residual(self, n_samples: float) -> float:
        """``σ_E² = σ_R² + σ_e²/n``: the variance of one (seed, problem) cell around the additive
        model, at ``n`` samples per problem and side."""
        return self.seed_problem + self.within_problem / n_samples

    def is_nan(self) -> bool:
        return any(math.isnan(x) for x in (self.between_seed, self.between_problem, self.within_problem,
                                           self.seed_problem))


def satterthwaite(terms: Sequence[float], dfs: Sequence[float]) -> float:
    """Welch–Satterthwaite degrees of freedom of a sum of independent variance terms,
    ``(Σ T_k)² / Σ (T_k² / ν_k)`` (Satterthwaite 1946, Biometrics Bulletin 2:110–114). Terms
    with ``ν_k < 1`` or ``T_k = 0`` are left out; ``nan`` when nothing is left.
    The result lies between the smallest and the sum of the ``ν_k`` kept."""
    t = np.asarray(terms, dtype=float)
    v = np.asarray(dfs, dtype=float)
    keep = (v >= 1) & (t > 0)
    if not keep.any():
        return math.nan
    t, v = t[keep], v[keep]
    return float(t.sum() ** 2 / (t ** 2 / v).sum())


def crossed_factor(S: float, P: float) -> float:
    """Small-sample factor of the crossed interval: ``max(S/(S−1), P/(P−1))`` (P = 1: ``S/(S−1)``)."""
    fs = S / (S - 1) if S > 1 else math.inf
    fp = P / (P - 1) if P > 1 else 1.0
    return max(fs, fp)


def crossed_terms(components: VarianceComponents, S: float, P: float, n: float) -> tuple[float, float, float]:
    """Expected variance terms of the crossed bootstrap's ``f · Var*(D*)`` (:mod:`evil_moe.gate.effects`),
    balanced design: ``f·(S−1)/S² (σ_B² + σ_E²/P)``, ``f·(P−1)/P² (σ_C² + σ_E²/S)``,
    ``f·(S−1)(P−1)/(S²P²) σ_E²`` (seed, problem, residual), with ``f`` :func:`crossed_factor`."""
    c = components
    e2 = c.residual(n)
    f = crossed_factor(S, P)
    return (f * (S - 1) / S ** 2 * (c.between_seed + e2 / P),
            f * (P - 1) / P ** 2 * (c.between_problem + e2 / S),
            f * (S - 1) * (P - 1) / (S ** 2 * P ** 2) * e2)


def true_var(components: VarianceComponents, n_seeds: int, n_problems: int, n_samples: int) -> float:
    """``Var(D) = σ_B²/S + σ_C²/P + (σ_R² + σ_e²/n)/(S P)`` under the crossed model (balanced):
    the sampling variance of the gate's point estimate over new seeds *and* new held-out problems."""
    c = components
    S, P = n_seeds, n_problems
    return c.between_seed / S + c.between_problem / P + c.residual(n_samples) / (S * P)


def crossed_df(S: int, P: int) -> int:
    """Degrees of freedom of the crossed interval: ``min(S − 1, P − 1)`` (``S − 1`` with one
    problem). The interval's variance is a sum of a seed term (``S − 1`` df), a problem term
    (``P − 1``) and a residual term (``(S − 1)(P − 1)``); the Satterthwaite df of such a sum lies
    between the smallest and the sum of its parts, and the smallest is the one bound that never
    overstates it. (The plug-in Satterthwaite df overstates it exactly when the seed term is
    estimated low: 0.040 false positives instead of 0.025 at 3 seeds when seeds dominate;
    docs/gate.md.)"""
    return S - 1 if P < 2 else min(S - 1, P - 1)


def planned_df(components: VarianceComponents, n_seeds: int, n_problems: int, n_samples: int,
               resample: str | Sequence[str] = RESAMPLE) -> float:
    """Degrees of freedom of the interval at the given sizes: ``min(S − 1, P − 1)`` for
    ``crossed`` (:func:`crossed_df`), ``S − 1`` for ``nested`` and ``seed``, ``S(P − 1)`` for
    ``problem``. (``components`` and ``n_samples`` are accepted for a uniform signature.)"""
    scheme = resample_scheme(resample)
    S, P = int(n_seeds), int(n_problems)
    if scheme == "problem":
        return float(S * (P - 1))
    if scheme != "crossed" or S < 2:
        return float(S - 1)
    return float(crossed_df(S, P))


def planned_se(components: VarianceComponents, n_seeds: int, n_problems: int, n_samples: int,
               resample: str | Sequence[str] = RESAMPLE) -> float:
    """Expected standard error of the gate's interval at the given sizes (balanced design), from
    the expected bootstrap variance (:mod:`evil_moe.gate.effects`), with ``σ_E² = σ_R² + σ_e²/n``:

    - ``crossed``: ``SE² = f·[(S−1)/S² (σ_B² + σ_E²/P) + (P−1)/P² (σ_C² + σ_E²/S)
      + (S−1)(P−1)/(S²P²) σ_E²]``, ``f = max(S/(S−1), P/(P−1))``;
    - ``nested``: ``SE² = σ_B²/S + σ_E²/(S P) + (P − 1)(σ_C² + σ_E²)/((S − 1) P²)`` — σ_C² enters
      only through the last term, ≈ ``σ_C²/((S−1)P)`` instead of the true ``σ_C²/P``: the nested
      scheme treats the shared arm × problem effect as if it were new in every seed;
    - ``seed``: ``(σ_B² + σ_E²/P)/S`` (again without the true ``σ_C²/P``);
    - ``problem``: ``(P − 1)(σ_C² + σ_E²)/(S P²)``.

    Args:
        components: the variance components.
        n_seeds, n_problems, n_samples: ``S`` seeds, ``P`` problems (the same in every seed),
            ``n`` samples per problem and side.
        resample: the scheme, as in :func:`evil_moe.gate.effects.paired_effect`.

    Returns:
        The SE (rate points); ``inf`` with fewer than 2 seeds or a NaN component.

    Raises:
        ValueError: a size below 1, or an unknown scheme.
    """
    scheme = resample_scheme(resample)
    S, P, n = int(n_seeds), int(n_problems), int(n_samples)
    if min(S, P, n) < 1:
        raise ValueError(f"sizes must be >= 1, got n_seeds={S}, n_problems={P}, n_samples={n}")
    c = components
    if S < 2 or c.is_nan():
        return math.inf
    e2 = c.residual(n)
    if scheme == "crossed":
        var = sum(crossed_terms(c, S, P, n))
    elif scheme == "nested":
        var = c.between_seed / S + e2 / (S * P) + (P - 1) * (c.between_problem + e2) / ((S - 1) * P * P)
    elif scheme == "seed":
        var = (c.between_seed + e2 / P) / S
    else:
        var = (P - 1) * (c.between_problem + e2) / (S * P * P)
    return math.sqrt(max(var, 0.0))


def planned_mde(components: VarianceComponents, n_seeds: int, n_problems: int, n_samples: int, *,
                ci: float = CI, power: float = POWER, resample: str | Sequence[str] = RESAMPLE) -> tuple[float, float]:
    """``(SE, MDE)`` at the given sizes from variance components (:func:`planned_se`,
    :func:`mde_from_se` with :func:`planned_df`). Raises as those do."""
    se = planned_se(components, n_seeds, n_problems, n_samples, resample)
    df = planned_df(components, n_seeds, n_problems, n_samples, resample) if math.isfinite(se) else 0.0
    return se, mde_from_se(se, df, ci, power)



# ---------------------------------------------------------------------------------------------
# what more would decide

def finite(x: float) -> float | None:
    """``x`` as a float, or ``None`` when it is ``None``, NaN or infinite (JSON-ready numbers)."""
    return float(x) if x is not None and math.isfinite(x) else None

