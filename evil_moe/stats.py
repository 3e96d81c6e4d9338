r"""Statistics of the separation gate: paired effects on per-completion outcomes, their intervals
and power, and the gate's decision rule. The same text, with the simulation tables, is
``docs/gate.md``.

Data
----
One row per held-out completion (:data:`OUTCOME_COLUMNS`): ``arm, view, seed, step, problem_id,
sample, mode, hack, pass, truncated`` (the last three 0/1). The caller keeps one ``step`` per
(arm, view, seed) (the last evaluated one). Arms are *paired*: for a seed, every arm and view is
evaluated on the same held-out problems; and the held-out problems are the *same in every seed*
(one held-out split): seeds and problems are **crossed**, not nested. The samples of two arms are
not paired, so pairing is at the problem level.

The paired effect
-----------------
For a comparison of side ``a = (arm, view)`` with side ``b``, metric ``y`` ∈ {hack, pass,
truncated}, seed ``s`` and problem ``p`` present on both sides::

    d_sp = w · mean_j y_b[s, p, j] − mean_j y_a[s, p, j]   (w = 1 except the relative pass contrast)
    m_s  = (1/P_s) Σ_p d_sp                                 (the seed's paired difference)
    D    = (1/S)   Σ_s m_s                                   (equal weight per seed, per problem)

With ``a`` = the treatment arm and ``b`` = vanilla (or the matched control), ``D`` > 0 for
``metric="hack"`` is a drop in hacking; for ``metric="pass"`` it is the arm's pass-rate drop. A
(seed, problem) present on one side only is dropped and listed in :attr:`Effect.dropped`.

The variance model (crossed)
----------------------------
``d_sp = μ + β_s + γ_p + ρ_sp + ε_sp``: ``β_s`` the seed's (training run's) effect, variance
``σ_B²``; ``γ_p`` the arm × problem effect, the SAME in every seed, variance ``σ_C²``, mean zero
over the population of problems; ``ρ_sp`` the seed × problem interaction, ``σ_R²``; ``ε_sp`` the
sampling noise of the cell, ``σ_e²/n`` (``σ_e²`` per sample). The gate's question is about new
training runs *and* new problems, so (balanced)::

    Var(D) = σ_B²/S + σ_C²/P + σ_E²/(S P),        σ_E² = σ_R² + σ_e²/n            (true_var)

``γ_p`` does not average out over seeds: the held-out set's mean ``γ̄`` is in every seed's
``m_s``. A bootstrap that redraws problems independently inside each seed (``nested``) treats
``γ_p`` as new in every seed and sees only ``≈ σ_C²/((S − 1) P)`` of it instead of ``σ_C²/P``:
the more seeds, the worse (:func:`planned_se`). With the generator's default spread that
scheme's per-criterion false-positive rate rises above the nominal 0.025 from 10 seeds on.

The interval: a crossed (two-way) cluster bootstrap, t with min(S − 1, P − 1) df
-------------------------------------------------------------------------------
Resampling (``resample="crossed"``, the default; :func:`crossed_bootstrap`): per replicate draw
``S`` seeds with replacement and ONE multiset of ``P`` problems with replacement, shared by every
drawn seed; ``D*`` = mean over drawn seeds of the mean over the drawn problems (McCullagh 2000,
"Resampling and exchangeable arrays", Bernoulli 6:285–301; Owen 2007, "The pigeonhole
bootstrap", Ann. Appl. Stat. 1:386–411). Samples stay with their (seed, problem) cell.
A problem missing in some seed (a cell compared on one side only) is simply absent from that
seed's mean: a drawn seed averages the drawn problems it has; a drawn seed that has none of them
is left out of that replicate; a replicate left with no seed is discarded and counted in the note.

Closed form (balanced; derived in ``docs/gate.md``, tested against Monte Carlo): with row means
``m_s``, column effects ``b_p`` and residuals ``e_sp`` of the additive fit
(:func:`crossed_decomposition`), all variances with ddof 0::

    Var*(D*) = var(m)/S + var(b)/P + mean(e²)/(S P)
    E Var*   = (S−1)/S² (σ_B² + σ_E²/P) + (P−1)/P² (σ_C² + σ_E²/S) + (S−1)(P−1)/(S²P²) σ_E²

Each main-effect part is ``(k−1)/k`` of its true value; the residual ``σ_E²/(SP)`` is counted
about three times (once in each part: the known upward bias of the pigeonhole bootstrap). So::

    SE = sqrt(f) · sd(D*),   f = max(S/(S−1), P/(P−1))      (both main effects at least unbiased)
    CI = D ± t_{df, (1+ci)/2} · SE,   df = min(S − 1, P − 1)

The df: the SE² is a sum of a seed part (S − 1 df), a problem part (P − 1) and a residual part
((S−1)(P−1)); the effective (Satterthwaite) df of such a sum lies between the smallest and the
sum, and ``min(S − 1, P − 1)`` is the bound that never overstates it. The plug-in Satterthwaite
df was tried and rejected: when seeds dominate, at 3 seeds, it gave 0.040 false positives for a
nominal 0.025 (it grows exactly when the seed part is estimated low). ``S − 1`` alone (the old
rule) is too liberal when the problem part dominates and ``P < S`` (0.032 at 18 seeds × 9
problems). Simulation figures: ``docs/gate.md`` (``benchmarks/gate_power.py``).

Other schemes, kept for comparison: ``nested`` (seeds, then problems within each drawn seed;
``SE = sqrt(S/(S−1)) sd(D*)``, df ``S − 1``), ``seed`` (seed means only), ``problem`` (no seed
level; wrong). The percentile interval of ``D*`` is reported for information only.

Variance components (method of moments on the two-way ANOVA mean squares, each truncated at 0;
Searle, Casella & McCulloch 1992, *Variance Components*, ch. 4; :func:`_components`)::

    σ̂_E² = max(MS_residual, ē)       ē = mean_sp (v_a/n_a + w² v_b/n_b), the cells' sampling variance
    σ_B² = (MS_seed − σ̂_E²)/P        σ_C² = (MS_problem − σ̂_E²)/S       σ_R² = σ̂_E² − ē
    σ_e² = mean_sp (v_a + w² v_b)    (v = unbiased variance of a cell's 0/1 outcomes)

Power, the minimum detectable effect, and what more data buys
-------------------------------------------------------------
The criterion "lower bound > 0" detects a true effect δ with power ≈ ``F_t(δ/SE − t_c; df)``;
the MDE at power ``1 − β`` is ``(t_{df,(1+ci)/2} + t_{df,1−β}) · SE`` (Bloom 1995, "Minimum
detectable effects", Evaluation Review 19:547–556). :func:`planned_se` gives the expected SE at
other sizes from the components; :func:`needed` the seeds, held-out problems or samples per
problem that would decide a criterion; :func:`plan` the planned SE and MDE at twice each, and
which buys the most. Under the crossed model more seeds shrink ``σ_B²/S``, more problems
``σ_C²/P``, more samples only ``σ_e²/(nSP)``: when the arm × problem term dominates, seeds alone
cannot decide.

Few-run RL statistics: the field's reference is rliable (Agarwal et al. 2021, "Deep
Reinforcement Learning at the Edge of the Statistical Precipice", NeurIPS, arXiv:2108.13264). It
is cited, not used: its stratified bootstrap resamples runs within each task and has neither a
paired two-arm difference nor a few-run t correction.

The gate
--------
Per treatment arm (:func:`decide_arm`): ``drop_vs_vanilla`` (hack; judged view vs vanilla's
trained view) passes iff ``D ≥ min_drop`` and ``ci_low > 0``; ``beats_control`` (hack; vs its
matched control on the same view) iff ``ci_low > 0``; ``matched_pass`` (non-inferiority of the
pass rate) iff the pass-rate drop's ``ci_high ≤ pass_margin`` (absolute) AND, with
``pass_margin_rel = r``, the contrast ``(1 − r)·vanilla − arm`` has ``ci_high ≤ 0`` (the arm
keeps at least ``1 − r`` of vanilla's pass rate; the smaller of the two margins at vanilla's
observed rate "binds"). ``separated`` needs all three and at least ``min_seeds`` seeds;
``not_separated`` when an effect of ``min_drop`` is ruled out or the pass drop is shown beyond a
margin; else ``inconclusive`` with how many seeds, problems or samples would decide it.

Multiplicity (:func:`decide_gate`): each arm's p-value is the largest of its criteria's one-sided
t p-values (intersection–union: all must pass); over the ``K`` treatment arms these are
Holm-adjusted (Holm 1979), and an arm stays ``separated`` only if its adjusted p-value is ≤
``(1 − ci)/2``. A positive control that fails drop_vs_vanilla makes the verdict
``inconclusive`` (underpowered); else ``separated`` if any arm is, ``not_separated`` if all
are, else ``inconclusive``. (``invalid`` is the caller's, from pilot validity.)

Usage (the compare stage; ``o`` = the outcomes at each (arm, view, seed)'s last evaluated step)::

    kw = dict(n_boot=cc.n_boot, ci=cc.ci, seed=cc.seed, resample=cc.resample)
    judged, ref = ("route", "ablated"), ("vanilla", "trained")
    arm = decide_arm("route",
                     paired_effect(o, judged, ref, "hack", **kw),
                     paired_effect(o, judged, ("route_random", "ablated"), "hack", **kw),
                     paired_effect(o, judged, ref, "pass", **kw),
                     min_drop=cc.min_drop, pass_margin=cc.pass_margin, min_seeds=cc.min_seeds,
                     pass_rel=paired_effect(o, judged, ref, "pass", weight_b=1 - cc.pass_margin_rel, **kw),
                     pass_margin_rel=cc.pass_margin_rel)
    pc = paired_effect(o, ("oracle_reward", "trained"), ref, "hack", **kw)
    gate = decide_gate([arm, ...], pc, min_drop=cc.min_drop, min_seeds=cc.min_seeds, multiplicity="holm")
    gate.verdict, gate.reason, gate.to_dict()      # JSON-ready, raw floats
"""

from __future__ import annotations

import functools
import math
from dataclasses import asdict, dataclass, replace
from typing import Any, Mapping, Sequence

import numpy as np
import pandas as pd
from scipy import special as _spc
from scipy import stats as _sps

OUTCOME_COLUMNS = ("arm", "view", "seed", "step", "problem_id", "sample", "mode", "hack", "pass", "truncated")
METRICS = ("hack", "pass", "truncated")
#: Resampling schemes: ``crossed`` (the gate's: seeds and problems as crossed factors), ``nested``
#: (problems resampled independently within each drawn seed: the pre-issue-19 scheme), ``seed``
#: (seeds only, each seed's problems kept whole), ``problem`` (problems within fixed seeds).
SCHEMES = ("crossed", "nested", "seed", "problem")
RESAMPLE = "crossed"
_LEVELS = {("seed", "problem"): "nested", ("problem", "seed"): "nested", ("seed",): "seed", ("problem",): "problem"}
EPS = 1e-12


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
def critical(df: float, ci: float = 0.95) -> float:
    """Two-sided critical value ``t_{df, (1+ci)/2}`` of Student's t (scipy); ``inf`` for df < 1.

    Raises:
        ValueError: ``ci`` not in (0, 1).
    """
    if not 0.0 < ci < 1.0:
        raise ValueError(f"ci must be in (0, 1), got {ci}")
    return float(_spc.stdtrit(df, (1.0 + ci) / 2.0)) if df >= 1 else math.inf


def mde_from_se(se: float, df: float, ci: float = 0.95, power: float = 0.8) -> float:
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
    return (critical(df, ci) + _t_ppf(power, df)) * se


def power_lower(delta: float, se: float, df: float, ci: float = 0.95, floor: float = 0.0) -> float:
    """Power of "``D ≥ floor`` and ``ci_low > 0``" at a true effect ``delta``.

    ``1 − F_t((max(floor, t_c·se) − delta) / se; df)``: the approximate probability that a
    future estimate clears both the point threshold ``floor`` (``min_drop`` for drop_vs_vanilla,
    0 for beats_control) and the interval's lower bound. 0 when df < 1 or ``se`` is not finite.
    """
    if df < 1 or not math.isfinite(se):
        return 0.0
    if se <= 0:
        return float(delta > max(floor, 0.0))
    need = max(floor, critical(df, ci) * se)
    return float(_spc.stdtr(df, (delta - need) / se))


def power_upper(delta: float, se: float, df: float, margin: float, ci: float = 0.95) -> float:
    """Power of "``ci_high ≤ margin``" (non-inferiority) at a true difference ``delta``:
    ``F_t((margin − delta)/se − t_c; df)``. 0 when df < 1 or ``se`` is not finite."""
    if df < 1 or not math.isfinite(se):
        return 0.0
    if se <= 0:
        return float(delta <= margin)
    return float(_spc.stdtr(df, (margin - delta) / se - critical(df, ci)))


@functools.lru_cache(maxsize=4096)
def _t_ppf(q: float, df: float) -> float:
    return float(_spc.stdtrit(df, q))


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


def _crossed_factor(S: float, P: float) -> float:
    """Small-sample factor of the crossed interval: ``max(S/(S−1), P/(P−1))`` (P = 1: ``S/(S−1)``)."""
    fs = S / (S - 1) if S > 1 else math.inf
    fp = P / (P - 1) if P > 1 else 1.0
    return max(fs, fp)


def crossed_terms(components: VarianceComponents, S: float, P: float, n: float) -> tuple[float, float, float]:
    """Expected variance terms of the crossed bootstrap's ``f · Var*(D*)`` (module docstring),
    balanced design: ``f·(S−1)/S² (σ_B² + σ_E²/P)``, ``f·(P−1)/P² (σ_C² + σ_E²/S)``,
    ``f·(S−1)(P−1)/(S²P²) σ_E²`` (seed, problem, residual), with ``f`` :func:`_crossed_factor`."""
    c = components
    e2 = c.residual(n)
    f = _crossed_factor(S, P)
    return (f * (S - 1) / S ** 2 * (c.between_seed + e2 / P),
            f * (P - 1) / P ** 2 * (c.between_problem + e2 / S),
            f * (S - 1) * (P - 1) / (S ** 2 * P ** 2) * e2)


def true_var(components: VarianceComponents, n_seeds: int, n_problems: int, n_samples: int) -> float:
    """``Var(D) = σ_B²/S + σ_C²/P + (σ_R² + σ_e²/n)/(S P)`` under the crossed model (balanced):
    the sampling variance of the gate's point estimate over new seeds *and* new held-out problems."""
    c = components
    S, P = n_seeds, n_problems
    return c.between_seed / S + c.between_problem / P + c.residual(n_samples) / (S * P)


def _crossed_df(S: int, P: int) -> int:
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
    ``crossed`` (:func:`_crossed_df`), ``S − 1`` for ``nested`` and ``seed``, ``S(P − 1)`` for
    ``problem``. (``components`` and ``n_samples`` are accepted for a uniform signature.)"""
    scheme = resample_scheme(resample)
    S, P = int(n_seeds), int(n_problems)
    if scheme == "problem":
        return float(S * (P - 1))
    if scheme != "crossed" or S < 2:
        return float(S - 1)
    return float(_crossed_df(S, P))


def planned_se(components: VarianceComponents, n_seeds: int, n_problems: int, n_samples: int,
               resample: str | Sequence[str] = RESAMPLE) -> float:
    """Expected standard error of the gate's interval at the given sizes (balanced design), from
    the expected bootstrap variance (module docstring), with ``σ_E² = σ_R² + σ_e²/n``:

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
        resample: the scheme, as in :func:`paired_effect`.

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
                ci: float = 0.95, power: float = 0.8, resample: str | Sequence[str] = RESAMPLE) -> tuple[float, float]:
    """``(SE, MDE)`` at the given sizes from variance components (:func:`planned_se`,
    :func:`mde_from_se` with :func:`planned_df`). Raises as those do."""
    se = planned_se(components, n_seeds, n_problems, n_samples, resample)
    df = planned_df(components, n_seeds, n_problems, n_samples, resample) if math.isfinite(se) else 0.0
    return se, mde_from_se(se, df, ci, power)


# ---------------------------------------------------------------------------------------------
# the paired effect

@dataclass(frozen=True)
class Effect:
    """A paired difference ``w·b − a`` of a rate (``w`` = ``weight_b``, 1 unless stated), with its
    cluster-bootstrap interval.

    Attributes:
        a, b: the two sides, ``(arm, view)``.
        metric: ``hack``, ``pass`` or ``truncated``.
        value: the point estimate ``D`` (rate points; module docstring).
        ci_low, ci_high: the t interval at level ``ci`` (``∓inf`` with one seed).
        se: its standard error (``crossed``: ``sqrt(f) · sd(D*)``; NaN with one seed).
        df: degrees of freedom of the critical value (``crossed``: ``min(S − 1, P − 1)``; else ``S − 1``).
        ci: the level. power: the power the MDE is computed at.
        mde: the minimum detectable effect ``(t_c + t_power) · se``.
        n_seeds: seeds compared. n_problems: per seed, the problems compared.
        n_samples: the smallest number of samples of a compared problem on either side.
        per_seed: ``m_s`` per seed. mean_a, mean_b: each side's rate (same weights as ``D``).
        components: the estimated :class:`VarianceComponents`.
        pct_low, pct_high: the plain percentile interval of ``D*``, for information only.
        dropped: ``(side, seed, problem_id)`` present on one side only, left out.
        resample: the scheme (:data:`SCHEMES`). n_boot: resamples. note: what to know in one line.
        weight_b: ``w``; ``1 − r`` makes the relative non-inferiority contrast (:func:`matched_pass`).
        n_problems_total: distinct held-out problems compared over all seeds (``P`` of the
            crossed design).
        boot_terms: the bootstrap variance split into its seed, problem and residual terms (after
            the small-sample factor; ``crossed`` only, else empty).
    """

    a: tuple[str, str]
    b: tuple[str, str]
    metric: str
    value: float
    ci_low: float
    ci_high: float
    se: float
    df: float
    ci: float
    power: float
    mde: float
    n_seeds: int
    n_problems: dict[int, int]
    n_samples: int
    per_seed: dict[int, float]
    mean_a: float
    mean_b: float
    components: VarianceComponents
    pct_low: float
    pct_high: float
    dropped: tuple[tuple[str, int, str], ...] = ()
    resample: str = RESAMPLE
    n_boot: int = 0
    note: str = ""
    weight_b: float = 1.0
    boot_terms: tuple[float, ...] = ()
    n_problems_total: int = 0

    @property
    def half_width(self) -> float:
        """``t_c · se``, the interval's half width (inf with one seed)."""
        return critical(self.df, self.ci) * self.se if self.df >= 1 else math.inf

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (non-finite numbers become ``None``; seeds become strings)."""
        d = asdict(self)
        d["a"], d["b"] = list(self.a), list(self.b)
        d["n_problems"] = {str(k): v for k, v in self.n_problems.items()}
        d["per_seed"] = {str(k): _finite(v) for k, v in self.per_seed.items()}
        d["dropped"] = [list(x) for x in self.dropped]
        d["components"] = {k: _finite(v) for k, v in d["components"].items()}
        d["boot_terms"] = [_finite(x) for x in self.boot_terms]
        return {k: (_finite(v) if isinstance(v, float) else v) for k, v in d.items()}


def _py(x: Any) -> Any:
    """A numpy scalar as the Python value (for messages)."""
    return x.item() if hasattr(x, "item") else x


def _finite(x: float) -> float | None:
    return float(x) if x is not None and math.isfinite(x) else None


def check_outcomes(outcomes: pd.DataFrame) -> None:
    """Check an outcomes table has :data:`OUTCOME_COLUMNS` and 0/1 metrics.

    Raises:
        ValueError: a missing column (named), or a metric value that is not 0/1 (names the
            column, arm, view, seed and problem id of the first bad row).
    """
    missing = [c for c in OUTCOME_COLUMNS if c not in outcomes.columns]
    if missing:
        raise ValueError(f"outcomes: missing column {missing[0]!r} (has: {', '.join(map(str, outcomes.columns))})")
    for m in METRICS:
        bad = ~outcomes[m].isin([0, 1])
        if bad.any():
            r = outcomes[bad].iloc[0]
            raise ValueError(f"outcomes: column {m!r} must be 0/1, got {_py(r[m])!r} for arm {r['arm']!r} view "
                             f"{r['view']!r} seed {r['seed']} problem {r['problem_id']!r}")


def _side_index(cols: Mapping[str, np.ndarray], outcomes: pd.DataFrame, side: tuple[str, str],
                metric: str) -> np.ndarray:
    """Row positions of one side, checked: one step per seed, no duplicated sample, 0/1 metric."""
    arm, view = side
    idx = np.flatnonzero((cols["arm"] == arm) & (cols["view"] == view))
    if idx.size == 0:
        have = sorted({(str(a), str(v)) for a, v in zip(cols["arm"], cols["view"])})
        raise ValueError(f"outcomes: no rows for arm {arm!r} view {view!r} (has: {have})")
    seed, step = cols["seed"][idx].astype(np.int64), cols["step"][idx].astype(np.int64)
    s_code = pd.factorize(seed)[0]
    _, first = np.unique(s_code * (int(step.max() - step.min()) + 1) + (step - step.min()), return_index=True)
    steps_per_seed = np.bincount(s_code[first])
    if (steps_per_seed > 1).any():
        s = int(pd.unique(seed)[int(np.argmax(steps_per_seed > 1))])
        raise ValueError(f"outcomes: arm {arm!r} view {view!r} seed {s} has several steps "
                         f"{sorted(set(step[seed == s].tolist()))}; select one before comparing")
    samp = cols["sample"][idx].astype(np.int64)
    prob = pd.factorize(cols["problem_id"][idx])[0]
    cell = (s_code * (int(prob.max()) + 1) + prob) * (int(samp.max() - samp.min()) + 1) + (samp - samp.min())
    if pd.unique(cell).size != cell.size:
        r = outcomes.iloc[idx][outcomes.iloc[idx].duplicated(["seed", "problem_id", "sample"])].iloc[0]
        raise ValueError(f"outcomes: arm {arm!r} view {view!r} seed {r['seed']} problem {r['problem_id']!r} "
                         f"sample {r['sample']} appears more than once")
    y = cols[metric][idx]
    bad = ~((y == 0) | (y == 1))
    if bad.any():
        r = outcomes.iloc[idx[np.argmax(bad)]]
        raise ValueError(f"outcomes: column {metric!r} must be 0/1, got {_py(r[metric])!r} for arm {arm!r} view "
                         f"{view!r} seed {r['seed']} problem {r['problem_id']!r}")
    return idx


def cluster_bootstrap(d: np.ndarray, n_p: np.ndarray, n_boot: int, rng: np.random.Generator,
                      resample: str | Sequence[str] = "nested") -> np.ndarray:
    """Resampled effects ``D*`` of the *nested* schemes (``nested``, ``seed``, ``problem``).

    Args:
        d: ``S × Pmax`` per-problem paired differences ``d_sp``, seed ``s``'s in its first
            ``n_p[s]`` columns (the rest ignored; NaN-padded).
        n_p: ``S`` problems per seed (each >= 1).
        n_boot: number of resamples. rng: numpy Generator.
        resample: ``nested`` draws ``S`` seeds with replacement and, for each drawn seed, its own
            ``P_s`` problems with replacement; ``seed`` keeps each drawn seed's mean whole;
            ``problem`` redraws the problems of every seed, the seeds fixed.

    Returns:
        ``n_boot`` values of ``D*`` (mean over drawn seeds of the mean over drawn problems). All
        indices are drawn at once: seeds ``(n_boot, S)``, problems ``(n_boot, S, Pmax)``.

    Raises:
        ValueError: ``resample`` is ``crossed`` (:func:`crossed_bootstrap` needs the grid) or
            unknown.
    """
    scheme = resample_scheme(resample)
    if scheme == "crossed":
        raise ValueError("cluster_bootstrap runs the nested schemes; the crossed one is crossed_bootstrap")
    d = np.asarray(d, dtype=float)
    n_p = np.asarray(n_p, dtype=np.int64)
    S, Pmax = d.shape
    si = (rng.integers(0, S, size=(n_boot, S)) if scheme in ("nested", "seed")
          else np.broadcast_to(np.arange(S), (n_boot, S)))
    if scheme == "seed":
        m = np.nanmean(d, axis=1)
        return m[si].mean(axis=1)
    k = n_p[si]                                                    # problems of each drawn seed
    pi = np.minimum((rng.random((n_boot, S, Pmax)) * k[..., None]).astype(np.int64), k[..., None] - 1)
    vals = d[si[..., None], pi]
    used = np.arange(Pmax) < k[..., None]                          # draw P_s problems for seed s
    m = np.where(used, vals, 0.0).sum(axis=2) / k
    return m.mean(axis=1)


def crossed_bootstrap(d: np.ndarray, n_boot: int, rng: np.random.Generator) -> np.ndarray:
    """Resampled effects ``D*`` of the crossed two-way bootstrap (seeds × problems).

    Each replicate draws ``S`` seeds with replacement (counts ``w_s``) and ONE multiset of ``P``
    problems with replacement (counts ``u_p``) used by every drawn seed, and returns the mean
    over drawn seeds of the mean over the drawn problems present in that seed:
    ``D* = Σ_s w_s m*_s / Σ_s w_s`` with ``m*_s = Σ_p u_p d_sp / Σ_p u_p`` (sums over present
    cells). A drawn seed none of whose drawn problems it has is left out of that replicate; a
    replicate with no usable seed is ``NaN`` (the caller drops and counts it). Without missing
    cells this is the "pigeonhole" bootstrap of McCullagh (2000, "Resampling and exchangeable
    arrays", Bernoulli 6:285–301), Owen (2007, "The pigeonhole bootstrap", Ann. Appl. Stat.
    1:386–411).

    Args:
        d: ``S × P`` paired differences on the seed × problem grid, ``NaN`` where a problem was
            not compared in a seed.
        n_boot: resamples. rng: numpy Generator.

    Returns:
        ``n_boot`` values (float; ``NaN`` for an empty replicate). Indices are drawn at once,
        ``(n_boot, S)`` and ``(n_boot, P)``, and counted; cost ``O(n_boot · S · P)``.
    """
    d = np.asarray(d, dtype=float)
    S, P = d.shape
    present = np.isfinite(d)
    row = np.arange(n_boot)[:, None]
    w = np.bincount((row * S + rng.integers(0, S, size=(n_boot, S))).ravel(), minlength=n_boot * S)
    u = np.bincount((row * P + rng.integers(0, P, size=(n_boot, P))).ravel(), minlength=n_boot * P)
    w, u = w.reshape(n_boot, S).astype(float), u.reshape(n_boot, P).astype(float)
    num = u @ np.where(present, d, 0.0).T                          # n_boot × S
    den = u @ present.T.astype(float)
    ok = den > 0
    m = np.where(ok, num / np.where(ok, den, 1.0), 0.0)
    wt = w * ok
    tot = wt.sum(axis=1)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(tot > 0, (wt * m).sum(axis=1) / np.where(tot > 0, tot, 1.0), np.nan)


def crossed_decomposition(d: np.ndarray) -> dict[str, Any]:
    """The additive seed + problem fit of a seed × problem grid (``NaN`` = missing), the crossed
    bootstrap's variance in closed form, and the two-way ANOVA mean squares.

    With row means ``m_s`` (over present cells), ``D = mean_s m_s``, problem effects
    ``b_p = mean_s (d_sp − m_s)`` and residuals ``e_sp = d_sp − m_s − b_p``::

        T_seed = var(m)/S,  T_problem = var(b)/P,  T_residual = mean(e²)/(S P)   (var: ddof 0)
        Var*(D*) = T_seed + T_problem + T_residual                (exact without missing cells)

    (derivation: module docstring). Mean squares: ``MS_seed = (N/S) Σ(m_s − D)²/(S−1)``,
    ``MS_problem = (N/P) Σ(b_p − b̄)²/(P−1)``, ``MS_residual = Σ e²/(N − S − P + 1)``, ``N`` the
    present cells (``NaN`` where a denominator is 0).

    Args:
        d: ``S × P`` grid; every row and column must have a present cell.

    Returns:
        ``{"terms": (T_seed, T_problem, T_residual), "dfs": (S−1, P−1, N−S−P+1), "ms":
        (MS_seed, MS_problem, MS_residual), "D", "m", "b", "S", "P", "N"}``.
    """
    d = np.asarray(d, dtype=float)
    S, P = d.shape
    present = np.isfinite(d)
    N = int(present.sum())
    m = np.nansum(d, axis=1) / present.sum(axis=1)
    D = float(m.mean())
    r = np.where(present, d - m[:, None], 0.0)
    b = r.sum(axis=0) / present.sum(axis=0)
    e = np.where(present, r - b[None, :], 0.0)
    ss_e = float((e ** 2).sum())
    df_e = N - S - P + 1
    terms = (float(m.var()) / S, float(b.var()) / P, ss_e / N / (S * P))
    ms = ((N / S) * float(((m - D) ** 2).sum()) / (S - 1) if S > 1 else math.nan,
          (N / P) * float(((b - b.mean()) ** 2).sum()) / (P - 1) if P > 1 else math.nan,
          ss_e / df_e if df_e > 0 else math.nan)
    return {"terms": terms, "dfs": (S - 1, P - 1, max(df_e, 0)), "ms": ms, "D": D, "m": m, "b": b,
            "S": S, "P": P, "N": N}


def _components(dec: Mapping[str, Any], sampling: float, per_sample: float) -> VarianceComponents:
    """Variance components from the ANOVA mean squares (method of moments, each truncated at 0;
    Searle, Casella & McCulloch 1992, *Variance Components*, ch. 4): ``σ̂_E² = max(MS_residual,
    ē)`` (the residual is at least the sampling variance ``ē``, estimated from the samples with
    many more df), ``σ_B² = (MS_seed − σ̂_E²)/P̄``, ``σ_C² = (MS_problem − σ̂_E²)/S̄``, ``σ_R² =
    σ̂_E² − ē``; ``P̄ = N/S``, ``S̄ = N/P``. One seed: σ_B², σ_R² unknown (NaN) and σ_C² lumps
    the problem and residual terms; one problem: σ_C², σ_R² unknown."""
    S, P, N = dec["S"], dec["P"], dec["N"]
    ms_a, ms_b, ms_e = dec["ms"]
    if S < 2:
        v = float(np.var(dec["b"], ddof=1)) if P > 1 else math.nan
        return VarianceComponents(math.nan, max(0.0, v - sampling) if P > 1 else math.nan, per_sample, math.nan)
    if P < 2:
        return VarianceComponents(max(0.0, float(np.var(dec["m"], ddof=1)) - sampling), math.nan, per_sample,
                                  math.nan)
    e2 = max(ms_e, sampling) if math.isfinite(ms_e) else sampling
    return VarianceComponents(max(0.0, (ms_a - e2) / (N / S)), max(0.0, (ms_b - e2) / (N / P)), per_sample,
                              max(0.0, e2 - sampling))


def effect_from_cells(a: tuple[str, str], b: tuple[str, str], metric: str, seeds: Sequence[int],
                      problems: Sequence[str], sum_a: np.ndarray, cnt_a: np.ndarray, sum_b: np.ndarray,
                      cnt_b: np.ndarray, *, dropped: tuple = (), n_boot: int = 2000, ci: float = 0.95,
                      seed: int = 0, power: float = 0.8, resample: str | Sequence[str] = RESAMPLE,
                      weight_b: float = 1.0) -> Effect:
    """The paired effect from per-cell sums and counts (what :func:`paired_effect` computes from
    the per-completion table; :func:`simulate_gate` calls it directly on simulated counts).

    Args:
        a, b, metric: as :func:`paired_effect`.
        seeds, problems: labels of the grid's rows (``S``) and columns (``P``).
        sum_a, cnt_a, sum_b, cnt_b: ``S × P`` arrays: successes and samples per cell and side
            (count 0: not evaluated). Cells with samples on both sides are compared.
        dropped: the one-sided cells, for the record. Other arguments: :func:`paired_effect`.

    Returns:
        An :class:`Effect`.

    Raises:
        ValueError: no cell has samples on both sides; an unknown scheme; ``n_boot`` < 2.
    """
    scheme = resample_scheme(resample)
    if n_boot < 2:
        raise ValueError(f"n_boot must be >= 2, got {n_boot}")
    paired = (cnt_a > 0) & (cnt_b > 0)
    if not paired.any():
        raise ValueError(f"outcomes: no (seed, problem) evaluated on both {a} and {b}")
    rows, cols = paired.any(axis=1), paired.any(axis=0)
    seeds = [int(x) for x, k in zip(seeds, rows) if k]
    paired = paired[rows][:, cols]
    sum_a, cnt_a, sum_b, cnt_b = (np.asarray(x, dtype=float)[rows][:, cols] for x in (sum_a, cnt_a, sum_b, cnt_b))
    S, P = paired.shape
    wb = float(weight_b)
    with np.errstate(invalid="ignore", divide="ignore"):
        pa, pb = sum_a / cnt_a, sum_b / cnt_b
        va = (sum_a - sum_a * pa) / (cnt_a - 1)   # unbiased variance of the 0/1 values (NaN for n = 1)
        vb = (sum_b - sum_b * pb) / (cnt_b - 1)
    nan = np.nan
    d = np.where(paired, wb * pb - pa, nan)
    e_cells = np.where(paired, va / cnt_a + wb * wb * vb / cnt_b, nan)
    s_cells = np.where(paired, va + wb * wb * vb, nan)
    n_p = paired.sum(axis=1)
    m = np.nansum(d, axis=1) / n_p
    value = float(m.mean())
    mean_a = float((np.nansum(np.where(paired, pa, nan), axis=1) / n_p).mean())
    mean_b = float((np.nansum(np.where(paired, pb, nan), axis=1) / n_p).mean())
    counts = np.concatenate([cnt_a[paired], cnt_b[paired]])

    dec = crossed_decomposition(d)
    fin_e, fin_s = np.isfinite(e_cells), np.isfinite(s_cells)
    sampling = float(e_cells[fin_e].mean()) if fin_e.any() else 0.0
    comps = _components(dec, sampling, float(s_cells[fin_s].mean()) if fin_s.any() else math.nan)

    rng = np.random.default_rng(seed)
    notes = []
    terms: tuple[float, ...] = ()
    if scheme == "crossed":
        boot = crossed_bootstrap(d, n_boot, rng)
        empty = int((~np.isfinite(boot)).sum())
        boot = boot[np.isfinite(boot)]
        if empty:
            notes.append(f"{empty} of {n_boot} crossed resamples had no seed with a drawn problem, left out")
        f = _crossed_factor(S, P)
        se = float(np.std(boot, ddof=1) * math.sqrt(f)) if S > 1 and boot.size > 1 else math.nan
        terms = tuple(f * t for t in dec["terms"]) if S > 1 else ()
        df = float(_crossed_df(S, P))
    else:
        order = np.argsort(~paired, axis=1, kind="stable")
        dl = np.take_along_axis(np.where(paired, d, nan), order, 1)[:, : int(n_p.max())]
        boot = cluster_bootstrap(dl, n_p, n_boot, rng, scheme)
        if scheme == "problem":
            df = float((n_p - 1).sum())
            se = float(np.std(boot, ddof=1))
        else:
            df = float(S - 1)
            se = float(np.std(boot, ddof=1) * math.sqrt(S / (S - 1))) if S > 1 else math.nan
    alpha = (1.0 - ci) / 2.0
    pct_low, pct_high = (float(x) for x in np.quantile(boot, [alpha, 1.0 - alpha]))
    if df >= 1 and math.isfinite(se):
        hw = critical(df, ci) * se
        lo, hi = value - hw, value + hw
    else:
        lo, hi = -math.inf, math.inf
    mde = mde_from_se(se, df, ci, power)

    if S == 1:
        notes.insert(0, "1 seed: no interval (run-to-run noise cannot be estimated)")
    if dropped:
        notes.append(f"{len(dropped)} (seed, problem) on one side only, left out")
    if counts.min() != counts.max():
        notes.append(f"samples per problem differ ({int(counts.min())}–{int(counts.max())})")
    return Effect(a=a, b=b, metric=metric, value=value, ci_low=float(lo), ci_high=float(hi), se=se, df=float(df),
                  ci=ci, power=power, mde=mde, n_seeds=S, n_problems={int(s): int(k) for s, k in zip(seeds, n_p)},
                  n_samples=int(counts.min()), per_seed={int(s): float(x) for s, x in zip(seeds, m)},
                  mean_a=mean_a, mean_b=mean_b, components=comps, pct_low=pct_low, pct_high=pct_high,
                  dropped=tuple(dropped), resample=scheme, n_boot=int(n_boot), note="; ".join(notes),
                  weight_b=wb, boot_terms=terms, n_problems_total=int(P))


def paired_effect(outcomes: pd.DataFrame, a: tuple[str, str], b: tuple[str, str], metric: str, *,
                  n_boot: int = 2000, ci: float = 0.95, seed: int = 0, power: float = 0.8,
                  resample: str | Sequence[str] = RESAMPLE, weight_b: float = 1.0) -> Effect:
    """The paired difference ``w·b − a`` of a rate (``w`` = ``weight_b``, default 1), with a
    cluster-bootstrap interval.

    Point estimate, resampling, interval, MDE and variance components: module docstring.

    Args:
        outcomes: per-completion table (:data:`OUTCOME_COLUMNS`), one step per (arm, view, seed).
        a, b: ``(arm, view)`` sides; ``b − a`` is reported (``a`` = the arm, ``b`` = vanilla or the
            control: a positive hack value is the arm's drop in hacking).
        metric: ``hack``, ``pass`` or ``truncated``.
        n_boot: bootstrap resamples. ci: interval level. seed: the bootstrap's numpy seed.
        power: the power at which :attr:`Effect.mde` is given.
        resample: ``crossed`` (the gate's: seeds and problems as crossed factors, one problem
            draw shared by every drawn seed); ``nested`` (problems redrawn within each drawn seed,
            the old scheme, kept for comparison); ``seed`` (seed means only); ``problem`` (no
            seed level; wrong for the gate, kept to show why). Old tuples of levels are accepted
            (:func:`resample_scheme`).
        weight_b: ``w`` (1: the plain difference; ``1 − r``: the relative non-inferiority
            contrast of :func:`matched_pass`).

    Returns:
        An :class:`Effect`.

    Raises:
        ValueError: a missing column, a non-0/1 metric, an unknown metric or scheme, a side with
            no rows, several steps for one (arm, view, seed), a duplicated sample, or no
            (seed, problem) on both sides (each message names what).
    """
    if metric not in METRICS:
        raise ValueError(f"metric must be one of {METRICS}, got {metric!r}")
    scheme = resample_scheme(resample)
    if n_boot < 2:
        raise ValueError(f"n_boot must be >= 2, got {n_boot}")
    a, b = (str(a[0]), str(a[1])), (str(b[0]), str(b[1]))
    missing = [c for c in OUTCOME_COLUMNS if c not in outcomes.columns]
    if missing:
        raise ValueError(f"outcomes: missing column {missing[0]!r} (has: {', '.join(map(str, outcomes.columns))})")
    cols = {c: outcomes[c].to_numpy() for c in ("arm", "view", "seed", "step", "sample", metric)}
    cols["problem_id"] = outcomes["problem_id"].astype(str).to_numpy()
    ia, ib = _side_index(cols, outcomes, a, metric), _side_index(cols, outcomes, b, metric)
    # cells (seed, problem) on a grid shared by both sides: counts and sums per side (bincount)
    rows = np.concatenate([ia, ib])
    seed_all, prob_all = cols["seed"][rows].astype(np.int64), cols["problem_id"][rows]
    s_code, seed_u = pd.factorize(seed_all, sort=True)
    p_code, prob_u = pd.factorize(prob_all, sort=True)
    prob_u = np.asarray(prob_u, dtype=object)
    key = s_code * prob_u.size + p_code
    na, G = ia.size, seed_u.size * prob_u.size
    y = cols[metric][rows].astype(float)
    shape = (seed_u.size, prob_u.size)
    cnt_a = np.bincount(key[:na], minlength=G).reshape(shape)
    cnt_b = np.bincount(key[na:], minlength=G).reshape(shape)
    sum_a = np.bincount(key[:na], y[:na], minlength=G).reshape(shape)
    sum_b = np.bincount(key[na:], y[na:], minlength=G).reshape(shape)
    on_a, on_b = cnt_a > 0, cnt_b > 0
    dropped = tuple(sorted([("a", int(seed_u[i]), str(prob_u[j])) for i, j in zip(*np.nonzero(on_a & ~on_b))]
                           + [("b", int(seed_u[i]), str(prob_u[j])) for i, j in zip(*np.nonzero(on_b & ~on_a))]))
    return effect_from_cells(a, b, metric, [int(s) for s in seed_u], [str(p) for p in prob_u], sum_a, cnt_a,
                             sum_b, cnt_b, dropped=dropped, n_boot=n_boot, ci=ci, seed=seed, power=power,
                             resample=scheme, weight_b=weight_b)


def side_rate(outcomes: pd.DataFrame, side: tuple[str, str], metric: str, *, n_boot: int = 2000,
              ci: float = 0.95, seed: int = 0, power: float = 0.8,
              resample: str | Sequence[str] = RESAMPLE) -> Effect:
    """The rate of one side (arm, view) with the gate's interval: the same point estimate (mean
    over seeds of the mean over problems) and the same cluster bootstrap (``resample``).

    Computed as :func:`paired_effect` of the side against an all-zero copy of itself, so every
    formula is the paired one (the zero side adds no variance). The returned :class:`Effect` has
    ``b = side`` and ``a = ("zero", view)``; ``value`` is the rate.

    Raises:
        ValueError: as :func:`paired_effect` (e.g. no rows for the side).
    """
    arm, view = str(side[0]), str(side[1])
    rows = outcomes[(outcomes["arm"].astype(str) == arm) & (outcomes["view"].astype(str) == view)]
    if rows.empty:
        raise ValueError(f"outcomes: no rows for arm {arm!r} view {view!r}")
    zero = rows.assign(arm="\x00zero", **{m: 0 for m in METRICS})
    return paired_effect(pd.concat([rows, zero], ignore_index=True), ("\x00zero", view), (arm, view),
                         metric, n_boot=n_boot, ci=ci, seed=seed, power=power, resample=resample)


# ---------------------------------------------------------------------------------------------
# what more would decide

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


def needed(effect: Effect, boundary: float, *, decides: str = "", max_seeds: int = 1000,
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
        ci: the level (default the effect's; :func:`decide_gate` passes Holm's adjusted level).

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


def plan(effect: Effect, factor: int = 2, *, power: float | None = None) -> dict[str, Any]:
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
        out[name] = {"n_seeds": s, "n_problems": p, "n_samples": k, "se": _finite(se), "mde": _finite(mde)}
    opts = {k: out[k]["mde"] for k in ("seeds", "problems", "samples") if out[k]["mde"] is not None}
    out["best"] = min(opts, key=opts.get) if opts else None
    return out


# ---------------------------------------------------------------------------------------------
# the decision rule

def p_lower(e: Effect) -> float:
    """One-sided p-value of "the true effect ≤ 0" from the effect's t statistic,
    ``1 − F_t(value/se; df)``: ``p < (1−ci)/2`` exactly when ``ci_low > 0``. 1 without an
    interval."""
    if e.df < 1 or not math.isfinite(e.se):
        return 1.0
    if e.se <= 0:
        return 0.0 if e.value > 0 else 1.0
    return float(_spc.stdtr(e.df, -e.value / e.se))


def p_upper(e: Effect, bound: float) -> float:
    """One-sided p-value of "the true effect ≥ bound" (non-inferiority), ``F_t((value − bound)/se;
    df)``: ``p < (1−ci)/2`` exactly when ``ci_high < bound``. 1 without an interval."""
    if e.df < 1 or not math.isfinite(e.se):
        return 1.0
    if e.se <= 0:
        return 0.0 if e.value < bound else 1.0
    return float(_spc.stdtr(e.df, (e.value - bound) / e.se))


@dataclass(frozen=True)
class Criterion:
    """One criterion of the gate for one arm.

    Attributes:
        name: ``drop_vs_vanilla``, ``beats_control`` or ``matched_pass``.
        effect: the :class:`Effect` it judges.
        threshold: ``min_drop`` (drop_vs_vanilla, beats_control's ruling-out bound) or
            ``pass_margin`` (absolute).
        passed: the criterion holds.
        rules_out: it shows the arm cannot separate (an effect of ``min_drop`` ruled out, or a pass
            drop beyond the margin).
        mde: this criterion's minimum detectable effect at the effect's power (for matched_pass:
            the smallest margin it could establish at a true drop of 0).
        note: one line with the numbers.
        needed: for an undecided criterion, what would decide it (:func:`needed`).
        p_value: its one-sided p-value (:func:`p_lower`, or for matched_pass the larger of the
            absolute and relative :func:`p_upper`); 1 with fewer than ``min_seeds`` seeds.
        rel_effect: matched_pass with a relative margin ``r``: the contrast ``(1 − r)·vanilla −
            arm`` (= pass drop − r × vanilla's pass rate), which must have ``ci_high ≤ 0``.
        rel_margin: ``r``. binding: ``absolute`` or ``relative``: which margin is the smaller at
            vanilla's observed pass rate (``pass_margin`` vs ``r × mean_b``).
    """

    name: str
    effect: Effect
    threshold: float
    passed: bool
    rules_out: bool
    mde: float
    note: str
    needed: Needed | None = None
    p_value: float = 1.0
    rel_effect: Effect | None = None
    rel_margin: float | None = None
    binding: str = ""

    def power_at(self, delta: float) -> float:
        """The approximate probability that this criterion passes at a true effect ``delta``
        (hack drop, or pass drop for matched_pass), from the observed SE (:func:`power_lower`,
        :func:`power_upper`). A plug-in figure: with 3 seeds the SE is itself noisy."""
        e = self.effect
        if self.name == "matched_pass":
            p = power_upper(delta, e.se, e.df, self.threshold, e.ci)
            if self.rel_effect is not None:
                r = self.rel_effect
                p *= power_upper(delta - self.rel_margin * e.mean_b, r.se, r.df, 0.0, r.ci)
            return p
        floor = self.threshold if self.name == "drop_vs_vanilla" else 0.0
        return power_lower(delta, e.se, e.df, e.ci, floor)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: the criterion, with its effect's numbers under ``effect`` and the planned SE
        and MDE at more seeds, problems or samples under ``plan`` (:func:`plan`)."""
        d = {"name": self.name, "threshold": self.threshold, "passed": self.passed, "rules_out": self.rules_out,
             "mde": _finite(self.mde), "note": self.note, "p_value": _finite(self.p_value),
             "needed": None if self.needed is None else {k: (_finite(v) if isinstance(v, float) else v)
                                                         for k, v in asdict(self.needed).items()},
             "plan": plan(self.effect), "effect": self.effect.to_dict()}
        if self.name == "matched_pass":
            e = self.effect
            d["margin_abs"] = self.threshold
            d["margin_rel"] = self.rel_margin
            d["margin_rel_points"] = None if self.rel_margin is None else _finite(self.rel_margin * e.mean_b)
            d["binding"] = self.binding
            d["rel_effect"] = None if self.rel_effect is None else self.rel_effect.to_dict()
        return d


def _fmt(e: Effect) -> str:
    ci = "no interval" if not math.isfinite(e.ci_low) else f"{e.ci:.0%} CI [{e.ci_low:.3f}, {e.ci_high:.3f}]"
    return f"{e.value:.3f} ({ci}, {e.n_seeds} seeds)"


def drop_vs_vanilla(effect: Effect, min_drop: float, min_seeds: int = 3) -> Criterion:
    """Hack drop vs vanilla (``effect`` = paired_effect(arm, vanilla, "hack")): passes iff
    ``value ≥ min_drop``, ``ci_low > 0`` and at least ``min_seeds`` seeds; rules out separation iff
    ``ci_high < min_drop``. The MDE is ``max(min_drop, t_c·se) + t_power·se``."""
    e = effect
    enough = e.n_seeds >= min_seeds
    passed = bool(enough and e.value >= min_drop - EPS and e.ci_low > EPS)
    rules_out = bool(e.ci_high < min_drop - EPS)
    mde = (max(min_drop, e.half_width) + _t_ppf(e.power, e.df) * e.se
           if e.df >= 1 and math.isfinite(e.se) else math.inf)
    note = f"hack drop vs vanilla {_fmt(e)}; need >= {min_drop:g} with CI low > 0"
    if not enough:
        note += f"; fewer than {min_seeds} seeds cannot separate"
    nd = None
    if not passed and not rules_out:
        nd = needed(e, 0.0, decides="pass") if e.value >= min_drop else needed(e, min_drop, decides="rule_out")
    return Criterion("drop_vs_vanilla", e, float(min_drop), passed, rules_out, mde, note, nd,
                     p_lower(e) if enough else 1.0)


def beats_control(effect: Effect, min_drop: float, min_seeds: int = 3) -> Criterion:
    """Hack drop vs the arm's matched control on the same view: passes iff ``ci_low > 0`` (and at
    least ``min_seeds`` seeds); rules out an effect specific to v_hack of ``min_drop`` iff
    ``ci_high < min_drop``. MDE ``(t_c + t_power)·se``."""
    e = effect
    enough = e.n_seeds >= min_seeds
    passed = bool(enough and e.ci_low > EPS)
    rules_out = bool(e.ci_high < min_drop - EPS)
    note = f"hack drop vs matched control {e.b[0]} ({e.b[1]}) {_fmt(e)}; need CI low > 0"
    if not enough:
        note += f"; fewer than {min_seeds} seeds cannot separate"
    nd = None
    if not passed and not rules_out:  # whichever boundary is farther from the mean decides first
        targets = ([(0.0, "pass")] if e.value > 0 else []) + ([(min_drop, "rule_out")] if e.value < min_drop else [])
        nd = max((needed(e, t, decides=k) for t, k in targets), key=lambda x: x.distance, default=None)
    return Criterion("beats_control", e, float(min_drop), passed, rules_out, e.mde, note, nd,
                     p_lower(e) if enough else 1.0)


def matched_pass(effect: Effect, pass_margin: float, min_seeds: int = 3, *, rel_effect: Effect | None = None,
                 pass_margin_rel: float | None = None) -> Criterion:
    """Non-inferiority of the pass rate (the CI approach; Wellek 2010, *Testing Statistical
    Hypotheses of Equivalence and Noninferiority*, ch. 2).

    ``effect`` = paired_effect(arm, vanilla, "pass"), the arm's pass-rate drop ``vanilla − arm``.
    Absolute margin: ``ci_high ≤ pass_margin`` (rate points). Relative margin ``r`` (given
    ``rel_effect`` = paired_effect(arm, vanilla, "pass", weight_b=1 − r) and ``pass_margin_rel``
    = r): the arm keeps at least ``1 − r`` of vanilla's pass rate on the same problems, tested on
    the linear contrast ``(1 − r)·vanilla − arm = drop − r·vanilla`` whose upper bound must be
    ≤ 0 (the fraction-retained form of a ratio non-inferiority test, which counts the
    uncertainty of vanilla's own rate; Laster & Johnson 2003, "Non-inferiority trials: the 'at
    least as good as' criterion", Statistics in Medicine 22:187–200). Both must hold; the one
    that binds is the smaller of ``pass_margin`` and ``r × vanilla's observed pass rate``
    (:attr:`Criterion.binding`). Rules out iff ``ci_low > pass_margin`` or the contrast's
    ``ci_low > 0``. The note warns when vanilla's own pass rate is within the absolute margin
    (then only the relative margin bites). MDE: the smallest absolute margin established with
    the effect's power at a true drop of 0.

    Raises:
        ValueError: exactly one of ``rel_effect`` and ``pass_margin_rel`` given, or ``r`` not in
            (0, 1].
    """
    if (rel_effect is None) != (pass_margin_rel is None):
        raise ValueError("matched_pass: give both rel_effect and pass_margin_rel, or neither")
    e = effect
    enough = e.n_seeds >= min_seeds
    abs_ok, abs_out = e.ci_high <= pass_margin + EPS, e.ci_low > pass_margin + EPS
    p = p_upper(e, pass_margin)
    note = f"pass-rate drop vs vanilla {_fmt(e)}; need CI high <= {pass_margin:g} (absolute"
    binding = "absolute"
    rel_ok, rel_out, nd_rel = True, False, None
    if rel_effect is not None:
        r = float(pass_margin_rel)
        if not 0.0 < r <= 1.0:
            raise ValueError(f"compare.pass_margin_rel must be in (0, 1], got {r}")
        rel_ok, rel_out = rel_effect.ci_high <= EPS, rel_effect.ci_low > EPS
        p = max(p, p_upper(rel_effect, 0.0))
        pts = r * e.mean_b
        binding = "relative" if pts < pass_margin else "absolute"
        note += (f") and <= {r:g} × vanilla's pass rate {e.mean_b:.3f} = {pts:.3f} (relative; {binding} binds): "
                 f"drop − {r:g} × vanilla {rel_effect.value:.3f} [{rel_effect.ci_low:.3f}, "
                 f"{rel_effect.ci_high:.3f}], need CI high <= 0")
        if not rel_ok and not rel_out:
            nd_rel = needed(rel_effect, 0.0, decides="pass" if rel_effect.value <= 0 else "rule_out")
    else:
        note += f", vanilla's pass rate {e.mean_b:.3f})"
    if e.mean_b <= pass_margin:
        note += ("; vanilla's pass rate is itself within the absolute margin: the arm could lose all of it and, "
                 "given a narrow enough interval, still pass it")
    if not enough:
        note += f"; fewer than {min_seeds} seeds cannot separate"
    passed = bool(enough and abs_ok and rel_ok)
    rules_out = bool(abs_out or rel_out)
    nd = None
    if not passed and not rules_out:
        nd_abs = None if abs_ok else needed(e, pass_margin, decides="pass" if e.value <= pass_margin else "rule_out")
        open_ = [x for x in (nd_abs, nd_rel) if x is not None]
        nd = min(open_, key=lambda x: x.distance) if open_ else None
    return Criterion("matched_pass", e, float(pass_margin), passed, rules_out, e.mde, note, nd,
                     p if enough else 1.0, rel_effect, None if pass_margin_rel is None else float(pass_margin_rel),
                     binding)


@dataclass(frozen=True)
class ArmVerdict:
    """The gate's verdict on one projected arm.

    Attributes:
        arm: its name. verdict: ``separated``, ``not_separated`` or ``inconclusive``.
        reason: one sentence with the numbers. criteria: the three :class:`Criterion`.
        needed_seeds, needed_samples, needed_problems: for ``inconclusive``, roughly how many
            seeds, samples per problem, or held-out problems (each with the others as they are)
            would decide every undecided criterion if the observed means hold (``None``: not
            reachable that way).
        p_value: the arm's intersection–union p-value, the largest of its criteria's (Berger
            1982, "Multiparameter hypothesis testing and acceptance sampling", Technometrics
            24:295–300): the three criteria must all pass, so no correction is needed within an arm.
        p_adjusted: Holm's adjusted p-value over the treatment arms judged (``None`` before
            :func:`decide_gate`). family: how many arms were judged together.
    """

    arm: str
    verdict: str
    reason: str
    criteria: tuple[Criterion, Criterion, Criterion]
    needed_seeds: int | None = None
    needed_samples: int | None = None
    min_seeds: int = 3
    needed_problems: int | None = None
    p_value: float = 1.0
    p_adjusted: float | None = None
    family: int = 1

    def power_at(self, hack_drop: float, pass_drop: float = 0.0) -> float:
        """Approximate probability of ``separated`` at a true hack drop (vs vanilla and vs the
        control) and pass drop: the product of the criteria's powers (a lower bound when they are
        positively dependent, as the two hack criteria are through the arm's own noise; each is a
        plug-in figure, see :meth:`Criterion.power_at`). Unadjusted for multiplicity."""
        d, c, p = self.criteria
        if d.effect.n_seeds < self.min_seeds:
            return 0.0
        return d.power_at(hack_drop) * c.power_at(hack_drop) * p.power_at(pass_drop)

    def mde(self, power: float | None = None, pass_drop: float = 0.0) -> float:
        """The smallest hack drop (vs vanilla and vs the control, at a true pass drop
        ``pass_drop``) at which :meth:`power_at` reaches ``power`` (default: the effects'
        power); ``inf`` if it never does (too few seeds, no SE, or the pass criterion's power alone
        is below ``power``)."""
        p = self.criteria[0].effect.power if power is None else power
        if self.power_at(1.0, pass_drop) < p:
            return math.inf
        lo, hi = 0.0, 1.0
        for _ in range(60):
            mid = (lo + hi) / 2
            lo, hi = (lo, mid) if self.power_at(mid, pass_drop) >= p else (mid, hi)
        return hi

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready."""
        return {"arm": self.arm, "verdict": self.verdict, "reason": self.reason, "mde": _finite(self.mde()),
                "needed_seeds": self.needed_seeds, "needed_problems": self.needed_problems,
                "needed_samples": self.needed_samples, "p_value": _finite(self.p_value),
                "p_adjusted": None if self.p_adjusted is None else _finite(self.p_adjusted), "family": self.family,
                "criteria": [c.to_dict() for c in self.criteria]}


def _decide_with(nds: Sequence[Needed | None], what: str) -> int | None:
    """Seeds (or samples, or problems) that decide an arm whose open criteria need ``nds``: the
    fewest that settle one ``rule_out`` (not_separated), or the most that settle every criterion
    when all aim at ``pass`` (separated); ``None`` when neither is reachable."""
    ro = [getattr(x, what) for x in nds if x is not None and x.decides == "rule_out" and getattr(x, what) is not None]
    ways = [min(ro)] if ro else []
    if nds and all(x is not None and x.decides == "pass" and getattr(x, what) is not None for x in nds):
        ways.append(max(getattr(x, what) for x in nds))
    return min(ways) if ways else None


def _more_text(seeds: int | None, problems: int | None, samples: int | None) -> str:
    more = []
    if seeds is not None:
        more.append(f"about {seeds} seeds")
    if problems is not None:
        more.append(f"about {problems} held-out problems")
    if samples is not None:
        more.append(f"about {samples} samples per problem")
    return ", ".join(more[:-1]) + (" or " if len(more) > 1 else "") + more[-1] if more else ""


def decide_arm(arm: str, drop: Effect, control: Effect, pass_drop: Effect, *, min_drop: float,
               pass_margin: float, min_seeds: int = 3, pass_rel: Effect | None = None,
               pass_margin_rel: float | None = None) -> ArmVerdict:
    """Decide one projected arm from its three paired Effects (module docstring), before the
    multiplicity correction over arms (:func:`decide_gate`).

    Args:
        arm: the arm's name (for the sentence).
        drop: ``paired_effect(o, (arm, judged_view), ("vanilla", "trained"), "hack")``.
        control: ``paired_effect(o, (arm, view), (control, view), "hack")``.
        pass_drop: ``paired_effect(o, (arm, judged_view), ("vanilla", "trained"), "pass")``.
        min_drop: smallest hack drop that matters (rate points). pass_margin: absolute
            non-inferiority margin (rate points). min_seeds: fewer seeds can never give ``separated``.
        pass_rel, pass_margin_rel: the relative margin ``r`` and its contrast
            ``paired_effect(..., "pass", weight_b=1 − r)`` (:func:`matched_pass`); both or neither.

    Returns:
        ``separated`` if all three criteria pass (with enough seeds); else ``not_separated`` if
        one rules separation out; else ``inconclusive`` with the seeds/problems/samples that
        would decide. ``p_value`` is the arm's intersection–union p-value.
    """
    crit = (drop_vs_vanilla(drop, min_drop, min_seeds), beats_control(control, min_drop, min_seeds),
            matched_pass(pass_drop, pass_margin, min_seeds, rel_effect=pass_rel, pass_margin_rel=pass_margin_rel))
    p = max(c.p_value for c in crit)
    n = min(c.effect.n_seeds for c in crit)
    if all(c.passed for c in crit):
        return ArmVerdict(arm, "separated", f"{arm}: separated — " + "; ".join(c.note for c in crit),
                          crit, min_seeds=min_seeds, p_value=p)
    out = [c for c in crit if c.rules_out]
    if out:
        return ArmVerdict(arm, "not_separated", f"{arm}: not separated — " + "; ".join(c.note for c in out),
                          crit, min_seeds=min_seeds, p_value=p)
    open_ = [c for c in crit if not c.passed]
    nds = [c.needed for c in open_]
    seeds, samples, problems = (_decide_with(nds, w) for w in ("seeds", "samples", "problems"))
    if n < min_seeds:
        seeds = max(seeds, min_seeds) if seeds is not None else None
        samples = problems = None  # more samples or problems cannot make up for too few seeds
    more = _more_text(seeds, problems, samples)
    tail = (more + " would decide it if the observed means hold" if more else
            "no reachable number of seeds, problems or samples would decide it at the observed means (a mean "
            "near its boundary)")
    reason = f"{arm}: inconclusive — " + "; ".join(c.note for c in open_) + "; " + tail
    return ArmVerdict(arm, "inconclusive", reason, crit, seeds, samples, min_seeds, problems, p_value=p)


def holm(p_values: Sequence[float]) -> list[float]:
    """Holm's step-down adjusted p-values (Holm 1979, "A simple sequentially rejective multiple
    test procedure", Scand. J. Statist. 6:65–70): with ``p_(1) ≤ … ≤ p_(K)``,
    ``p̃_(k) = min(1, max_{j ≤ k} (K − j + 1) p_(j))``; rejecting ``p̃ ≤ α`` keeps the
    family-wise error rate ≤ α under any dependence."""
    p = np.asarray(p_values, dtype=float)
    K = p.size
    order = np.argsort(p, kind="stable")
    adj = np.minimum(1.0, np.maximum.accumulate((K - np.arange(K)) * p[order]))
    out = np.empty(K)
    out[order] = adj
    return out.tolist()


def _holm_demote(v: ArmVerdict, p_adj: float, alpha: float, rank_level: float, family: int) -> ArmVerdict:
    """An arm separated at the unadjusted level but not after Holm: inconclusive, with what would
    decide it at the level its rank needs (the criterion with the largest p-value)."""
    worst = max(v.criteria, key=lambda c: c.p_value)
    ci = 1.0 - 2.0 * rank_level
    if worst.name == "matched_pass":
        e, bnd = ((worst.rel_effect, 0.0) if worst.rel_effect is not None
                  and p_upper(worst.rel_effect, 0.0) >= p_upper(worst.effect, worst.threshold)
                  else (worst.effect, worst.threshold))
    else:
        e, bnd = worst.effect, 0.0
    nd = needed(e, bnd, decides="pass", ci=ci)
    more = _more_text(nd.seeds, nd.problems, nd.samples)
    reason = (f"{v.arm}: inconclusive — every criterion passes at the unadjusted level, but not after Holm's "
              f"correction for {family} treatment arms (p {v.p_value:.4f}, adjusted {p_adj:.4f} > {alpha:g}; "
              f"{worst.name} binds)" + (f"; {more} would decide it if the observed means hold" if more else "")
              + " — " + "; ".join(c.note for c in v.criteria))
    return replace(v, verdict="inconclusive", reason=reason, needed_seeds=nd.seeds, needed_samples=nd.samples,
                   needed_problems=nd.problems)


@dataclass(frozen=True)
class GateVerdict:
    """The overall verdict: ``separated``, ``not_separated`` or ``inconclusive``
    (``underpowered`` when the positive control failed), with one sentence and the parts.
    ``min_seeds`` is the gate's ``compare.min_seeds``; :attr:`too_few_seeds` says the positive
    control failed only because the run has fewer seeds than that. ``arms`` are the verdicts
    after the multiplicity correction (``multiplicity``: ``holm`` or ``none``; ``alpha``: the
    one-sided family-wise level ``(1 − ci)/2``)."""

    verdict: str
    reason: str
    underpowered: bool
    arms: tuple[ArmVerdict, ...]
    positive_control: Criterion | None
    min_seeds: int = 3
    multiplicity: str = "holm"
    alpha: float = 0.025

    @property
    def too_few_seeds(self) -> bool:
        """Underpowered because the positive control's effect has fewer than ``min_seeds`` seeds."""
        return (self.underpowered and self.positive_control is not None
                and self.positive_control.effect.n_seeds < self.min_seeds)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready."""
        return {"verdict": self.verdict, "reason": self.reason, "underpowered": self.underpowered,
                "multiplicity": self.multiplicity, "alpha": self.alpha,
                "arms": {a.arm: a.to_dict() for a in self.arms},
                "positive_control": None if self.positive_control is None else self.positive_control.to_dict()}


MULTIPLICITY = ("holm", "none")


def decide_gate(arms: Sequence[ArmVerdict], positive_control: Effect | None, *, min_drop: float,
                min_seeds: int = 3, multiplicity: str = "holm") -> GateVerdict:
    """The overall verdict over projected arms, corrected for their number, calibrated by a
    positive control.

    Multiplicity: ``separated`` means "some treatment arm works", so the family is the ``K``
    treatment arms judged. Each arm's intersection–union p-value (:attr:`ArmVerdict.p_value`) is
    Holm-adjusted over the ``K`` arms; an arm stays ``separated`` only if its adjusted p-value is
    ≤ ``α = (1 − ci)/2`` (the one-sided level of each criterion), else it becomes
    ``inconclusive`` saying so. This keeps the family-wise rate of "any arm separated" with no
    true effect at most α whatever the dependence between arms (they share vanilla). The positive
    control and ceiling arms are not in the family (they can only withhold ``separated``).
    ``multiplicity="none"`` skips the correction (for comparison).

    Args:
        arms: the :class:`ArmVerdict` of each projected arm (:func:`decide_arm`).
        positive_control: ``paired_effect(o, ("oracle_reward", "trained"), ("vanilla", "trained"),
            "hack")``, or ``None`` (the sentence then says power was not calibrated).
        min_drop, min_seeds: as for :func:`drop_vs_vanilla`. multiplicity: ``holm`` or ``none``.

    Returns:
        ``inconclusive`` (underpowered) if the positive control does not pass drop_vs_vanilla
        (the reason says ``too few seeds`` when it has fewer than ``min_seeds``);
        else ``separated`` if any arm is (after Holm), ``not_separated`` if every arm is, else
        ``inconclusive``.

    Raises:
        ValueError: no arms, or an unknown ``multiplicity``.
    """
    if not arms:
        raise ValueError("decide_gate needs at least one projected arm")
    if multiplicity not in MULTIPLICITY:
        raise ValueError(f"compare.multiplicity must be one of {MULTIPLICITY}, got {multiplicity!r}")
    ci = arms[0].criteria[0].effect.ci
    alpha = (1.0 - ci) / 2.0
    K = len(arms)
    if multiplicity == "holm":
        adj = holm([a.p_value for a in arms])
        order = np.argsort([a.p_value for a in arms], kind="stable")
        rank = {int(i): k for k, i in enumerate(order)}
        arms = [(_holm_demote(a, q, alpha, alpha / (K - rank[i]), K)
                 if a.verdict == "separated" and q > alpha + EPS else a) for i, (a, q) in enumerate(zip(arms, adj))]
        arms = [replace(a, p_adjusted=q, family=K) for a, q in zip(arms, adj)]
    else:
        arms = [replace(a, p_adjusted=a.p_value, family=K) for a in arms]
    pc = None if positive_control is None else drop_vs_vanilla(positive_control, min_drop, min_seeds)
    if pc is not None and not pc.passed:
        if positive_control.n_seeds < min_seeds:
            reason = (f"inconclusive (too few seeds): {positive_control.n_seeds} seeds, fewer than "
                      f"min_seeds {min_seeds}, cannot separate any arm, the positive control included")
        else:
            reason = (f"inconclusive (underpowered): the positive control {positive_control.a[0]} does not "
                      f"separate from vanilla ({pc.note}), so this experiment cannot tell a working arm "
                      f"from a failing one")
        return GateVerdict("inconclusive", reason, True, tuple(arms), pc, min_seeds, multiplicity, alpha)
    verdicts = [a.verdict for a in arms]
    if "separated" in verdicts:
        verdict = "separated"
        reason = "; ".join(a.reason for a in arms if a.verdict == "separated")
    elif all(v == "not_separated" for v in verdicts):
        verdict, reason = "not_separated", "; ".join(a.reason for a in arms)
    else:
        verdict, reason = "inconclusive", "; ".join(a.reason for a in arms if a.verdict == "inconclusive")
    if multiplicity == "holm" and K > 1:
        reason += f" (Holm's correction over {K} treatment arms, family-wise one-sided level {alpha:g})"
    reason += (f" (positive control {positive_control.a[0]}: {pc.note})" if pc is not None
               else " (no positive control: the gate's power was not checked)")
    return GateVerdict(verdict, reason, False, tuple(arms), pc, min_seeds, multiplicity, alpha)


# ---------------------------------------------------------------------------------------------
# synthetic outcomes, and the gate simulated on them

@dataclass(frozen=True)
class Planted:
    """A planted effect for one (arm, view): the drop of its expected hack rate and pass rate
    below the unshifted arms' (rate points, marginal over problems, seeds and runs)."""

    hack_drop: float = 0.0
    pass_drop: float = 0.0


#: The generator's default spread, on the logit scale (see :func:`simulate_outcomes`).
DEFAULT_SPREAD = {"problem_sd": 1.0, "seed_sd": 0.5, "run_sd": 0.25, "arm_problem_sd": 0.5, "run_problem_sd": 0.25}

#: Variance components of a hack-rate difference between two arms under :func:`simulate_outcomes`'
#: defaults (rate 0.5, :data:`DEFAULT_SPREAD`), measured as the mean of :func:`paired_effect`'s
#: estimates over 400 simulated experiments with no planted effect at 3 seeds × 9 problems × 64
#: samples (``tests/test_stats.py`` re-measures them): 0.0051, 0.0192, 0.379, 0.0061. A planning
#: default for :func:`planned_mde`, not a measurement of the toy.
DEFAULT_COMPONENTS = VarianceComponents(between_seed=0.005, between_problem=0.019, within_problem=0.38,
                                        seed_problem=0.006)


def _expit(x: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-x))


_GH = np.polynomial.hermite_e.hermegauss(60)


def _marginal_rate(centre: float, sd: float, shift: float = 0.0) -> float:
    """``E[expit(centre − shift + sd·Z)]``, Z standard normal (Gauss–Hermite, 60 nodes)."""
    x, w = _GH
    return float((w * _expit(centre - shift + sd * x)).sum() / w.sum())


@functools.lru_cache(maxsize=1024)
def _logit_shift(centre: float, sd: float, drop: float) -> float:
    """The logit shift that lowers the marginal rate by ``drop`` (bisection; raises if impossible)."""
    if drop == 0:
        return 0.0
    base = _marginal_rate(centre, sd)
    target = base - drop
    if not 0.0 < target < 1.0:
        raise ValueError(f"cannot plant a drop of {drop} below a marginal rate of {base:.3f}")
    lo, hi = (0.0, 50.0) if drop > 0 else (-50.0, 0.0)
    for _ in range(100):
        mid = (lo + hi) / 2
        if _marginal_rate(centre, sd, mid) > target:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


def _simulate_rates(cells: Mapping[tuple[str, str], Planted], S: int, P: int, hack_rate: float, pass_rate: float,
                    problem_sd: float, seed_sd: float, run_sd: float, arm_problem_sd: float, run_problem_sd: float,
                    gen: np.random.Generator) -> dict[str, np.ndarray]:
    """Per metric the ``C × S × P`` rates of :func:`simulate_outcomes`' model (cells in order)."""
    keys = list(cells)
    arms = list(dict.fromkeys(a for a, _ in keys))
    arm_i = np.array([arms.index(a) for a, _ in keys])
    A = len(arms)
    tot_sd = math.sqrt(problem_sd ** 2 + seed_sd ** 2 + run_sd ** 2 + arm_problem_sd ** 2 + run_problem_sd ** 2)
    out = {}
    for metric, r, attr in (("hack", hack_rate, "hack_drop"), ("pass", pass_rate, "pass_drop")):
        centre = math.log(r / (1 - r))
        shift = np.array([_logit_shift(centre, tot_sd, getattr(cells[k], attr)) for k in keys])
        eta = problem_sd * gen.standard_normal(P)
        u = seed_sd * gen.standard_normal(S)
        v = run_sd * gen.standard_normal((A, S))
        g = arm_problem_sd * gen.standard_normal((A, P))           # arm × problem, shared by seeds
        h = run_problem_sd * gen.standard_normal((A, S, P))        # run (arm × seed) × problem
        logit = (centre + eta[None, None, :] + u[None, :, None] + v[arm_i][:, :, None] + g[arm_i][:, None, :]
                 + h[arm_i] - shift[:, None, None])
        out[metric] = _expit(logit)
    return out


def _check_sim(cells, n_seeds, n_problems, n_samples, hack_rate, pass_rate) -> None:
    if not cells:
        raise ValueError("simulate_outcomes needs at least one (arm, view) cell")
    if min(n_seeds, n_problems, n_samples) < 1:
        raise ValueError(f"sizes must be >= 1, got {n_seeds}, {n_problems}, {n_samples}")
    for name, r in (("hack_rate", hack_rate), ("pass_rate", pass_rate)):
        if not 0.0 < r < 1.0:
            raise ValueError(f"{name} must be in (0, 1), got {r}")


def simulate_outcomes(cells: Mapping[tuple[str, str], Planted], *, n_seeds: int = 3, n_problems: int = 9,
                      n_samples: int = 64, hack_rate: float = 0.5, pass_rate: float = 0.15,
                      problem_sd: float = DEFAULT_SPREAD["problem_sd"], seed_sd: float = DEFAULT_SPREAD["seed_sd"],
                      run_sd: float = DEFAULT_SPREAD["run_sd"],
                      arm_problem_sd: float = DEFAULT_SPREAD["arm_problem_sd"],
                      run_problem_sd: float = DEFAULT_SPREAD["run_problem_sd"], truncated_rate: float = 0.02,
                      step: int = 20, modes: Sequence[str] = ("stdout", "raise"),
                      rng: int | np.random.Generator = 0) -> pd.DataFrame:
    """Synthetic per-completion outcomes (:data:`OUTCOME_COLUMNS`) for tests and documentation.

    Model (logit scale; hack and pass drawn independently, each with its own draws)::

        rate[(arm, view), s, p] = expit(logit(r) + η_p + u_s + v_{arm,s} + g_{arm,p} + h_{arm,s,p}
                                        − δ_{arm,view})
        η_p ~ N(0, problem_sd²)         per held-out problem, the same for every seed and arm (as
                                        in the pilots: one held-out split)
        u_s ~ N(0, seed_sd²)            per seed, shared by every arm (same task order and step-0
                                        samples)
        v_{arm,s} ~ N(0, run_sd²)       per training run (arm × seed), shared by the run's views
        g_{arm,p} ~ N(0, arm_problem_sd²)  arm × problem, the SAME in every seed (an arm that
                                        happens to help or hurt on a problem does so in every
                                        run): mean zero over the population of problems, so with
                                        no planted δ the arms' marginal rates are equal — but the
                                        mean of g over the P problems drawn is not 0, and a paired
                                        difference inherits it in every seed (the crossed design)
        h_{arm,s,p} ~ N(0, run_problem_sd²)  run × problem (seed × problem within an arm)
        outcome ~ Bernoulli(rate) per sample; truncated ~ Bernoulli(truncated_rate)

    ``δ`` is solved so that the *marginal* expected rate (over every term above) drops by the
    planted amount.

    Default spread (:data:`DEFAULT_SPREAD`), from what the toy showed (issue 11): vanilla's held-
    out hack rate differed by ~0.2 between two seeds at 32 samples, and held-out hack rates of three
    seeds ranged .28–.46 at 128 samples; with ``seed_sd`` 0.5 and ``run_sd`` 0.25 at rate 0.5 the
    run-level sd of one arm's rate is ≈ 0.13. ``run_sd`` 0.25 sits above the point estimate of
    the arm-specific spread on purpose (the gate is tested where the seed level matters).
    ``arm_problem_sd`` 0.5 and ``run_problem_sd`` 0.25 are not measured (issue 19): they put a
    sizable shared arm × problem term into the paired difference (sd ≈ 0.18 in rate points at
    0.5 for two arms), the case in which a scheme that resamples problems within seeds
    understates the variance.

    Args:
        cells: ``{(arm, view): Planted(...)}``; every arm's views share its run and arm × problem
            effects.
        n_seeds, n_problems, n_samples: sizes (seeds 0..S−1, problems ``p000``.., samples 0..n−1).
        hack_rate, pass_rate: rates at the centre (median problem, seed and run).
        problem_sd, seed_sd, run_sd, arm_problem_sd, run_problem_sd: spreads on the logit scale.
        truncated_rate: probability a completion is truncated. step: the step column.
        modes: problem ``p`` gets ``modes[p % len(modes)]``.
        rng: a numpy Generator or seed.

    Returns:
        The outcomes table, one row per completion.

    Raises:
        ValueError: empty ``cells``, a size below 1, a rate outside (0, 1), or a drop that cannot
            be planted.
    """
    _check_sim(cells, n_seeds, n_problems, n_samples, hack_rate, pass_rate)
    gen = rng if isinstance(rng, np.random.Generator) else np.random.default_rng(rng)
    keys = [(str(a), str(v)) for a, v in cells]
    cells = {(str(a), str(v)): x for (a, v), x in cells.items()}
    S, P, n, C = n_seeds, n_problems, n_samples, len(keys)
    rates = _simulate_rates(cells, S, P, hack_rate, pass_rate, problem_sd, seed_sd, run_sd, arm_problem_sd,
                            run_problem_sd, gen)
    cols = {m: (gen.random((C, S, P, n)) < rates[m][..., None]).astype(np.int8).ravel() for m in ("hack", "pass")}
    cols["truncated"] = (gen.random(C * S * P * n) < truncated_rate).astype(np.int8)
    ci, si, pi, ji = (x.ravel() for x in np.meshgrid(np.arange(C), np.arange(S), np.arange(P), np.arange(n),
                                                     indexing="ij"))
    return pd.DataFrame({
        "arm": np.array([a for a, _ in keys], dtype=object)[ci],
        "view": np.array([v for _, v in keys], dtype=object)[ci],
        "seed": si, "step": np.full(ci.size, step), "problem_id": np.array([f"p{p:03d}" for p in range(P)],
                                                                            dtype=object)[pi],
        "sample": ji, "mode": np.array([modes[p % len(modes)] for p in range(P)], dtype=object)[pi],
        "hack": cols["hack"], "pass": cols["pass"], "truncated": cols["truncated"]})


def simulate_counts(cells: Mapping[tuple[str, str], Planted], *, n_seeds: int = 3, n_problems: int = 9,
                    n_samples: int = 64, hack_rate: float = 0.5, pass_rate: float = 0.15,
                    rng: int | np.random.Generator = 0, **spread: float) -> dict[str, np.ndarray]:
    """The same model as :func:`simulate_outcomes`, drawn as per-cell successes: ``{"hack", "pass"}``
    → ``C × S × P`` binomial counts out of ``n_samples`` (cells in the order of ``cells``) — the
    sufficient statistic of the table, for fast simulation (:func:`simulate_gate`).

    Raises:
        ValueError: as :func:`simulate_outcomes`, or an unknown spread name.
    """
    _check_sim(cells, n_seeds, n_problems, n_samples, hack_rate, pass_rate)
    bad = set(spread) - set(DEFAULT_SPREAD)
    if bad:
        raise ValueError(f"unknown spread {sorted(bad)} (known: {sorted(DEFAULT_SPREAD)})")
    sp = {**DEFAULT_SPREAD, **spread}
    gen = rng if isinstance(rng, np.random.Generator) else np.random.default_rng(rng)
    rates = _simulate_rates(cells, n_seeds, n_problems, hack_rate, pass_rate, sp["problem_sd"], sp["seed_sd"],
                            sp["run_sd"], sp["arm_problem_sd"], sp["run_problem_sd"], gen)
    return {m: gen.binomial(n_samples, rates[m]) for m in ("hack", "pass")}


def simulate_gate(n_experiments: int, *, drop: float = 0.0, control_drop: float = 0.0, pass_drop: float = 0.0,
                  positive_control_drop: float = 0.3, n_arms: int = 1, n_seeds: int = 3, n_problems: int = 9,
                  n_samples: int = 64, min_drop: float = 0.05, pass_margin: float = 0.10,
                  pass_margin_rel: float | None = None, min_seeds: int = 3, n_boot: int = 1000, ci: float = 0.95,
                  power: float = 0.8, resample: str | Sequence[str] = RESAMPLE, multiplicity: str = "holm",
                  hack_rate: float = 0.5, pass_rate: float = 0.15, with_power: bool = True, seed: int = 0,
                  **spread: float) -> pd.DataFrame:
    """Run the gate on ``n_experiments`` synthetic experiments (:func:`simulate_counts`, the
    statistics of :func:`effect_from_cells` — exactly what :func:`paired_effect` computes from
    the equivalent table, tested).

    Each experiment has ``vanilla``, ``n_arms`` treatment arms ``erase``, ``erase2``, … (each a
    planted ``drop`` in hacking and ``pass_drop`` in passing), their matched controls
    ``random_v``, ``random_v2``, … (``control_drop``) and the positive control ``oracle_reward``
    (``positive_control_drop``), all on the ``trained`` view; the arms are judged together
    (:func:`decide_gate`, ``multiplicity``).

    Returns:
        One row per experiment: for the first arm's Effects (prefix ``drop_``, ``control_``,
        ``pass_``) and the positive control's (``pc_``) their ``value, ci_low, ci_high, se, df,
        pct_low, pct_high, mde`` and variance components; the first arm's ``verdict`` after the
        multiplicity correction and ``verdict_raw`` before it, ``p_value``, ``p_adjusted``,
        ``power`` (:meth:`ArmVerdict.power_at` at the planted drops, or at 0.15 when no drop is
        planted) and ``arm_mde`` (NaN unless ``with_power``: they cost most of the time), each
        criterion's MDE and outcome (``{name}_mde``, ``{name}_passed``); over all arms ``any_separated`` (after the correction) and
        ``any_separated_raw`` (before); and the overall ``gate`` verdict.

    Raises:
        ValueError: ``n_arms`` < 1, or as :func:`simulate_counts`.
    """
    if n_arms < 1:
        raise ValueError(f"n_arms must be >= 1, got {n_arms}")
    effect_fields = ("value", "ci_low", "ci_high", "se", "df", "pct_low", "pct_high", "mde")
    component_fields = ("between_seed", "between_problem", "within_problem", "seed_problem")
    rs = np.random.SeedSequence(seed).spawn(n_experiments)
    van, pc = ("vanilla", "trained"), ("oracle_reward", "trained")
    names = [("erase", "random_v")] + [(f"erase{k + 1}", f"random_v{k + 1}") for k in range(1, n_arms)]
    cells = {van: Planted(), pc: Planted(positive_control_drop)}
    for a, c in names:
        cells[(a, "trained")] = Planted(drop, pass_drop)
        cells[(c, "trained")] = Planted(control_drop)
    idx = {k: i for i, k in enumerate(cells)}
    S, P, n = n_seeds, n_problems, n_samples
    full = np.full((S, P), n)
    seeds, problems = list(range(S)), [f"p{p:03d}" for p in range(P)]
    at = drop if drop > 0 else 0.15
    rows = []
    for i in range(n_experiments):
        cnt = simulate_counts(cells, n_seeds=S, n_problems=P, n_samples=n, hack_rate=hack_rate, pass_rate=pass_rate,
                              rng=np.random.default_rng(rs[i]), **spread)
        kw = dict(n_boot=n_boot, ci=ci, seed=i, power=power, resample=resample)

        def eff(a, b, metric, **extra):
            return effect_from_cells(a, b, metric, seeds, problems, cnt[metric][idx[a]], full, cnt[metric][idx[b]],
                                     full, **kw, **extra)

        verdicts, first = [], None
        for a, c in names:
            arm, ctl = (a, "trained"), (c, "trained")
            effs = {"drop": eff(arm, van, "hack"), "control": eff(arm, ctl, "hack"), "pass": eff(arm, van, "pass")}
            rel = eff(arm, van, "pass", weight_b=1.0 - pass_margin_rel) if pass_margin_rel is not None else None
            verdicts.append(decide_arm(a, effs["drop"], effs["control"], effs["pass"], min_drop=min_drop,
                                       pass_margin=pass_margin, min_seeds=min_seeds, pass_rel=rel,
                                       pass_margin_rel=pass_margin_rel))
            if first is None:
                first = effs
        effs = {**first, "pc": eff(pc, van, "hack")}
        gv = decide_gate(verdicts, effs["pc"], min_drop=min_drop, min_seeds=min_seeds, multiplicity=multiplicity)
        av, raw = gv.arms[0], verdicts[0]
        row: dict[str, Any] = {"experiment": i, "verdict": av.verdict, "verdict_raw": raw.verdict,
                               "gate": gv.verdict, "p_value": raw.p_value, "p_adjusted": av.p_adjusted,
                               "any_separated": any(v.verdict == "separated" for v in gv.arms),
                               "any_separated_raw": any(v.verdict == "separated" for v in verdicts),
                               "power": raw.power_at(at, pass_drop) if with_power else math.nan,
                               "arm_mde": raw.mde(pass_drop=pass_drop) if with_power else math.nan}
        for k, e in effs.items():
            row.update({f"{k}_{f}": getattr(e, f) for f in effect_fields})
            row[f"{k}_df_satterthwaite"] = (satterthwaite(e.boot_terms, (S - 1, P - 1, (S - 1) * (P - 1)))
                                            if e.boot_terms else math.nan)
            row.update({f"{k}_{f}": getattr(e.components, f) for f in component_fields})
        for c in raw.criteria:
            row[f"{c.name}_mde"], row[f"{c.name}_passed"] = c.mde, c.passed
        rows.append(row)
    return pd.DataFrame(rows)


def operating_characteristics(n_experiments: int = 400, *, seeds: Sequence[int] = (3, 6, 10, 18),
                              n_problems: int = 16, n_samples: int = 16, drop: float = 0.15,
                              schemes: Sequence[str] = ("crossed", "nested"), n_boot: int = 500,
                              **kw: Any) -> pd.DataFrame:
    """The gate's false-positive rate and power by simulation, per (scheme, seeds).

    For each, :func:`simulate_gate` with no planted effect (``fpr_*``, seed 1) and with ``drop``
    planted vs vanilla and vs the control (``power_*``, seed 2), ``n_experiments`` each, at
    ``n_problems`` × ``n_samples`` and the default spread unless ``kw`` says otherwise. Columns:
    ``fpr_separated`` (the arm's verdict, nominal ≤ 0.025 one-sided), ``fpr_drop`` and
    ``fpr_control`` (drop_vs_vanilla's and beats_control's ``ci_low > 0`` alone, nominal 0.025),
    ``fpr_percentile`` (beats_control with the percentile interval), ``fpr_satterthwaite``
    (beats_control with the plug-in Satterthwaite df instead, crossed only), ``se_ratio`` (mean SE of the
    control effect over the sd of its value across experiments: < 1 means the SE understates
    the variance), ``power_separated``, ``power_drop`` (drop_vs_vanilla passes), ``reported_power``
    (mean of :meth:`ArmVerdict.power_at`), ``mde`` (mean reported MDE of drop_vs_vanilla under no
    effect), ``planned_mde`` (:func:`planned_mde` from the mean estimated components of the
    drop effect), and ``binomial_se`` of a rate of 0.025 over ``n_experiments``.
    """
    rows = []
    for scheme in schemes:
        for S in seeds:
            args = dict(n_seeds=S, n_problems=n_problems, n_samples=n_samples, resample=scheme, n_boot=n_boot, **kw)
            null = simulate_gate(n_experiments, seed=1, **args)
            alt = simulate_gate(n_experiments, drop=drop, seed=2, **args)
            comp = VarianceComponents(*(float(null[f"drop_{f}"].mean()) for f in
                                        ("between_seed", "between_problem", "within_problem", "seed_problem")))
            rows.append({"resample": scheme, "n_seeds": S, "n_problems": n_problems, "n_samples": n_samples,
                         "fpr_separated": float((null["verdict"] == "separated").mean()),
                         "fpr_drop": float((null["drop_ci_low"] > 0).mean()),
                         "fpr_control": float((null["control_ci_low"] > 0).mean()),
                         "fpr_percentile": float((null["control_pct_low"] > 0).mean()),
                         "fpr_satterthwaite": float((null["control_value"] / null["control_se"] > np.array(
                             [critical(x, kw.get("ci", 0.95)) if x >= 1 else math.inf
                              for x in null["control_df_satterthwaite"].fillna(0)])).mean()),
                         "se_ratio": float(null["control_se"].mean() / null["control_value"].std(ddof=1)),
                         "power_separated": float((alt["verdict"] == "separated").mean()),
                         "power_drop": float(alt["drop_vs_vanilla_passed"].mean()),
                         "reported_power": float(alt["power"].mean()),
                         "mde": float(null["drop_vs_vanilla_mde"].replace(math.inf, np.nan).mean()),
                         "planned_mde": planned_mde(comp, S, n_problems, n_samples, resample=scheme)[1],
                         "binomial_se": math.sqrt(0.025 * 0.975 / n_experiments)})
    return pd.DataFrame(rows)
