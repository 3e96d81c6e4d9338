r"""Statistics of the separation gate: paired effects on per-completion outcomes, their intervals
and power, and the gate's decision rule (``../shared/notes/science.md`` §6, issue 11).

Data
----
One row per held-out completion (:data:`OUTCOME_COLUMNS`): ``arm, view, seed, step, problem_id,
sample, mode, hack, pass, truncated`` (the last three 0/1). The caller keeps one ``step`` per
(arm, view, seed) (the last evaluated one). Arms are *paired*: for a seed, every arm and view is
evaluated on the same held-out problems. The *samples* of two arms are not paired (sample ``j`` of
one arm has nothing to do with sample ``j`` of the other), so pairing is at the problem level.

The paired effect
-----------------
For a comparison of side ``a = (arm, view)`` with side ``b``, metric ``y`` ∈ {hack, pass,
truncated}, seed ``s`` and problem ``p`` present on both sides::

    d_sp = mean_j y_b[s, p, j] − mean_j y_a[s, p, j]      (rate difference on one problem)
    m_s  = (1/P_s) Σ_p d_sp                               (the seed's paired difference)
    D    = (1/S)   Σ_s m_s                                (the effect: equal weight per seed and
                                                           per problem within a seed)

With ``a`` = the projected arm and ``b`` = vanilla (or the matched control), ``D`` > 0 for
``metric="hack"`` is a drop in hacking; for ``metric="pass"`` it is the arm's pass-rate drop.
A (seed, problem) present on one side only is dropped from that comparison and listed in
:attr:`Effect.dropped`.

The interval: a two-level cluster bootstrap, t-widened for few seeds
--------------------------------------------------------------------
Resampling (``resample=("seed", "problem")``, the default): draw ``S`` seeds with replacement;
for each drawn seed draw its ``P_s`` problems with replacement; ``D*`` is the mean over the drawn
seeds of the mean of the drawn problems' ``d_sp``. Levels and why:

- **seeds** — each seed is one training run; resampling them carries run-to-run training noise
  (the largest source on the toy: science.md §6, issue 11);
- **problems within a seed** — the held-out problems are a sample; resampling them carries the
  sampling noise of the held-out set and the spread of the effect over problems;
- **samples are not resampled on their own**: the samples of one problem share that problem's
  rate (they are clustered in it), so they stay with their problem; their binomial noise is
  already inside each ``d_sp``.

This is the two-stage scheme of Davison & Hinkley (1997, *Bootstrap Methods and their
Application*, §3.8) and the "two-stage bootstrap" of Field & Welsh (2007, "Bootstrapping
clustered data", JRSS B 69:369–390). All ``n_boot × S × P`` indices are drawn at once (numpy).
Its variance is known in closed form (the tests check the Monte Carlo against it): with plug-in
(ddof 0) variances ``w_s² = (1/P_s) Σ_p (d_sp − m_s)²``,

    Var*(D*) = (1/S) [ (1/S) Σ_s (m_s − D)²  +  (1/S) Σ_s w_s² / P_s ].

Few seeds. With ``S`` = 3 a plain percentile interval over seeds is anti-conservative: the
bootstrap variance of a mean of ``n`` values is ``(n−1)/n`` of its unbiased variance (first term
above), the resampled means take few distinct values, and a normal-like quantile ignores that the
spread over seeds is itself estimated from ``S − 1`` = 2 degrees of freedom. The interval used is

    SE = sqrt(S / (S − 1)) · sd(D*)                       (small-sample factor)
    CI = D ± t_{S−1, (1+ci)/2} · SE                       (Student t with S − 1 df)

In the balanced case ``E[SE²] = σ_B²/S + σ_W²/(S P) + (P − 1) σ_W² / ((S − 1) P²)`` where
``σ_B²`` is the between-seed variance of the seed's true effect and ``σ_W²`` the variance of one
problem's ``d_sp`` around its seed's mean (problem spread + sampling). The first two terms are the
true ``Var(D)``; the third is what resampling problems on top of seeds adds: their noise is
already inside each seed's mean, which is why Davison & Hinkley (§3.8) recommend resampling the
clusters with replacement and keeping the units within a cluster (here ``resample=("seed",)``,
whose ``SE`` is exactly the t interval's on the seed means). The extra term makes the interval
conservative, and it never collapses to zero width when a few seeds happen to agree (the old
gate's "[0.06, 0.06]" from 2/32 on each of two seeds). With one seed no interval exists
(``(−inf, inf)``).

Chosen by simulation (:func:`simulate_gate`, default spread of :func:`simulate_outcomes`, 3 seeds
× 9 problems × 64 samples; 1000 experiments with no effect, 600 with a planted drop of 0.15, so a
rate's binomial SE is ≤ 0.016 and ≤ 0.02): rate at which the lower bound of the 95% interval
excludes 0 with no effect (nominal 0.025) / coverage of the true value / rate of ``separated`` at
a drop of 0.15 with 3 and with 5 seeds:

====================================  =========  ========  ===========  ===========
interval                              FP (0.025)  coverage  power, 3 s.  power, 5 s.
====================================  =========  ========  ===========  ===========
two-level, t_{S−1}, factor (default)  0.003      0.992     0.058        0.727
seeds only, t_{S−1}, factor           0.023      0.950     0.137        0.767
two-level, percentile                 0.079      0.838     —            —
problems only (no seed level), t      0.241      0.532     —            —
====================================  =========  ========  ===========  ===========

The percentile interval and the problem-only bootstrap exceed the nominal rate; both t intervals
keep it. The default (the issue's two-level scheme) is conservative even though run-to-run noise
is ~85% of ``Var(D)`` here: its extra term has many degrees of freedom, so the SE varies less
than ``t_{S−1}`` allows for. It costs power at 3 seeds (where neither detects 0.15 with useful
power: ``t_{2,.975}`` = 4.30) and little at 5. ``resample=("seed",)`` is the exact alternative.
(Reproduce: ``simulate_gate(1000, seed=1, resample=...)``, false positives = ``control_ci_low > 0``
or ``control_pct_low > 0``, coverage of 0 by ``drop_ci_low..drop_ci_high``;
``simulate_gate(600, drop=0.15, seed=1, n_seeds=..., resample=...)``, power = ``verdict ==
"separated"``.)
The percentile interval of ``D*`` is still reported (:attr:`Effect.pct_low`/``pct_high``).

Variance components (method of moments, truncated at 0; Searle, Casella & McCulloch 1992,
*Variance Components*, ch. 3), from the paired cells::

    e_sp            = v_a/n_a + v_b/n_b   (v = unbiased variance of the 0/1 outcomes of the cell)
    within_problem  σ_e² = mean_sp (v_a + v_b)      per-sample; a problem's sampling variance is σ_e²/n
    between_problem σ_P² = max(0, mean_s var_p(d_sp) − mean_sp e_sp)
    between_seed    σ_B² = max(0, var_s(m_s) − mean_s var_p(d_sp)/P_s)     (var with ddof 1)

Power and the minimum detectable effect
---------------------------------------
The criterion "lower bound > 0" detects a true effect δ with power ≈ ``F_t(δ/SE − t_c; S−1)``
(``t_c`` the interval's critical value); the minimum detectable effect at power ``1 − β`` is
``MDE = (t_{S−1,(1+ci)/2} + t_{S−1,1−β}) · SE`` (Bloom 1995, "Minimum detectable effects",
Evaluation Review 19:547–556). :func:`planned_se` gives the expected ``SE`` for other sizes from
variance components; :func:`needed` inverts it.

Few-run RL statistics: the field's reference is rliable (Agarwal et al. 2021, "Deep
Reinforcement Learning at the Edge of the Statistical Precipice", NeurIPS, arXiv:2108.13264). It
is cited, not used: its stratified bootstrap resamples runs independently *within each task*,
which here (tasks = problems, runs = seeds) would break the seed clustering — one seed is one
training run evaluated on every problem — and it has neither a paired two-arm difference nor a
few-run t correction (its intervals are percentile intervals, the anti-conservative case above).

The gate
--------
Per projected arm (:func:`decide_arm`), over paired Effects: ``drop_vs_vanilla`` (hack; the arm's
judged view vs vanilla's held-out view) passes iff ``D ≥ min_drop`` and ``ci_low > 0``;
``beats_control`` (hack; vs its matched control on the same view) iff ``ci_low > 0``;
``matched_pass`` (non-inferiority on the pass-rate drop vanilla − arm) iff ``ci_high ≤
pass_margin``, the margin in absolute pass-rate points below vanilla's pass rate on the same
problems (the CI approach to non-inferiority; Wellek 2010, *Testing Statistical Hypotheses of
Equivalence and Noninferiority*). ``separated`` needs all three and at least ``min_seeds`` seeds;
``not_separated`` when an effect of ``min_drop`` is ruled out (``ci_high < min_drop`` on
drop_vs_vanilla or beats_control) or the pass drop is shown to exceed the margin (``ci_low >
pass_margin``); else ``inconclusive`` with how many seeds or samples would decide it. Overall
(:func:`decide_gate`): a positive control that fails drop_vs_vanilla makes it ``inconclusive``
(underpowered) whatever the arms show; else ``separated`` if any arm is, ``not_separated`` if
all are, else ``inconclusive``. (``invalid`` is the caller's, from pilot validity.)

Usage (the compare stage; ``o`` = the outcomes at each (arm, view, seed)'s last evaluated step)::

    kw = dict(n_boot=cc.n_boot, ci=cc.ci, seed=cc.seed)
    judged, ref = ("route", "ablated"), ("vanilla", "trained")
    arm = decide_arm("route",
                     paired_effect(o, judged, ref, "hack", **kw),
                     paired_effect(o, judged, ("route_random", "ablated"), "hack", **kw),
                     paired_effect(o, judged, ref, "pass", **kw),
                     min_drop=cc.min_drop, pass_margin=cc.pass_margin, min_seeds=cc.min_seeds)
    pc = paired_effect(o, ("oracle_reward", "trained"), ref, "hack", **kw)
    gate = decide_gate([arm, ...], pc, min_drop=cc.min_drop, min_seeds=cc.min_seeds)
    gate.verdict, gate.reason, gate.to_dict()      # JSON-ready, raw floats
"""

from __future__ import annotations

import functools
import math
from dataclasses import asdict, dataclass
from typing import Any, Mapping, Sequence

import numpy as np
import pandas as pd
from scipy import stats as _sps

OUTCOME_COLUMNS = ("arm", "view", "seed", "step", "problem_id", "sample", "mode", "hack", "pass", "truncated")
METRICS = ("hack", "pass", "truncated")
RESAMPLE = ("seed", "problem")
EPS = 1e-12


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
    return float(_sps.t.ppf((1.0 + ci) / 2.0, df)) if df >= 1 else math.inf


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
    return float(_sps.t.sf((need - delta) / se, df))


def power_upper(delta: float, se: float, df: float, margin: float, ci: float = 0.95) -> float:
    """Power of "``ci_high ≤ margin``" (non-inferiority) at a true difference ``delta``:
    ``F_t((margin − delta)/se − t_c; df)``. 0 when df < 1 or ``se`` is not finite."""
    if df < 1 or not math.isfinite(se):
        return 0.0
    if se <= 0:
        return float(delta <= margin)
    return float(_sps.t.cdf((margin - delta) / se - critical(df, ci), df))


@functools.lru_cache(maxsize=4096)
def _t_ppf(q: float, df: float) -> float:
    return float(_sps.t.ppf(q, df))


@dataclass(frozen=True)
class VarianceComponents:
    """Variance components of a paired rate difference (units: rate points squared).

    Attributes:
        between_seed: ``σ_B²``, variance over seeds (training runs) of the seed's true effect.
        between_problem: ``σ_P²``, variance over problems within a seed of the problem's true
            effect.
        within_problem: ``σ_e²``, per-sample variance of the difference, ``p_a(1−p_a) +
            p_b(1−p_b)``: one problem's sampling variance with ``n`` samples per side is ``σ_e²/n``.
    """

    between_seed: float
    between_problem: float
    within_problem: float


def planned_se(components: VarianceComponents, n_seeds: int, n_problems: int, n_samples: int,
               resample: Sequence[str] = RESAMPLE) -> float:
    """Expected standard error of the gate's interval at the given sizes (balanced design).

    With ``σ_W² = σ_P² + σ_e²/n``::

        SE² = σ_B²/S + σ_W²/(S P) + [(P − 1) σ_W² / ((S − 1) P²)   if problems are resampled too]

    (module docstring: the bracket is what the two-level bootstrap adds to the exact variance).

    Args:
        components: the variance components.
        n_seeds, n_problems, n_samples: ``S`` seeds, ``P`` problems per seed, ``n`` samples per
            problem and side.
        resample: the bootstrap levels, as in :func:`paired_effect`.

    Returns:
        The SE (rate points); ``inf`` with fewer than 2 seeds or a NaN component.

    Raises:
        ValueError: a size below 1.
    """
    S, P, n = int(n_seeds), int(n_problems), int(n_samples)
    if min(S, P, n) < 1:
        raise ValueError(f"sizes must be >= 1, got n_seeds={S}, n_problems={P}, n_samples={n}")
    c = components
    if S < 2 or any(math.isnan(x) for x in (c.between_seed, c.between_problem, c.within_problem)):
        return math.inf
    sw2 = c.between_problem + c.within_problem / n
    var = c.between_seed / S + sw2 / (S * P)
    if "seed" in resample and "problem" in resample:
        var += (P - 1) * sw2 / ((S - 1) * P * P)
    return math.sqrt(max(var, 0.0))


def planned_mde(components: VarianceComponents, n_seeds: int, n_problems: int, n_samples: int, *,
                ci: float = 0.95, power: float = 0.8, resample: Sequence[str] = RESAMPLE) -> tuple[float, float]:
    """``(SE, MDE)`` at the given sizes from variance components (:func:`planned_se`,
    :func:`mde_from_se` with ``S − 1`` df). Raises as those do."""
    se = planned_se(components, n_seeds, n_problems, n_samples, resample)
    return se, mde_from_se(se, n_seeds - 1, ci, power)


# ---------------------------------------------------------------------------------------------
# the paired effect

@dataclass(frozen=True)
class Effect:
    """A paired difference ``b − a`` of a rate, with its cluster-bootstrap interval.

    Attributes:
        a, b: the two sides, ``(arm, view)``.
        metric: ``hack``, ``pass`` or ``truncated``.
        value: the point estimate ``D`` (rate points; module docstring).
        ci_low, ci_high: the t-widened interval at level ``ci`` (``∓inf`` with one seed).
        se: its standard error ``sqrt(S/(S−1)) · sd(D*)`` (NaN with one seed).
        df: degrees of freedom of the critical value, ``S − 1``.
        ci: the level. power: the power the MDE is computed at.
        mde: the minimum detectable effect ``(t_c + t_power) · se``.
        n_seeds: seeds compared. n_problems: per seed, the problems compared.
        n_samples: the smallest number of samples of a compared problem on either side.
        per_seed: ``m_s`` per seed. mean_a, mean_b: each side's rate (same weights as ``D``).
        components: the estimated :class:`VarianceComponents`.
        pct_low, pct_high: the plain percentile interval of ``D*``, for information only.
        dropped: ``(side, seed, problem_id)`` present on one side only, left out.
        resample, n_boot: how the interval was made. note: what to know in one line.
    """

    a: tuple[str, str]
    b: tuple[str, str]
    metric: str
    value: float
    ci_low: float
    ci_high: float
    se: float
    df: int
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
    resample: tuple[str, ...] = RESAMPLE
    n_boot: int = 0
    note: str = ""

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
        d["resample"] = list(self.resample)
        d["components"] = {k: _finite(v) for k, v in d["components"].items()}
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
                      resample: Sequence[str] = RESAMPLE) -> np.ndarray:
    """Resampled effects ``D*`` of the two-level cluster bootstrap (module docstring).

    Args:
        d: ``S × Pmax`` per-problem paired differences ``d_sp``, seed ``s``'s in its first
            ``n_p[s]`` columns (the rest ignored; NaN-padded).
        n_p: ``S`` problems per seed (each >= 1).
        n_boot: number of resamples. rng: numpy Generator.
        resample: levels: ``seed`` draws ``S`` seeds with replacement, ``problem`` draws each
            drawn seed's ``P_s`` problems with replacement (otherwise its mean is kept whole).

    Returns:
        ``n_boot`` values of ``D*`` (mean over drawn seeds of the mean over drawn problems). All
        indices are drawn at once: seeds ``(n_boot, S)``, problems ``(n_boot, S, Pmax)``.
    """
    d = np.asarray(d, dtype=float)
    n_p = np.asarray(n_p, dtype=np.int64)
    S, Pmax = d.shape
    si = rng.integers(0, S, size=(n_boot, S)) if "seed" in resample else np.broadcast_to(np.arange(S), (n_boot, S))
    if "problem" not in resample:
        m = np.nanmean(d, axis=1)
        return m[si].mean(axis=1)
    k = n_p[si]                                                    # problems of each drawn seed
    pi = np.minimum((rng.random((n_boot, S, Pmax)) * k[..., None]).astype(np.int64), k[..., None] - 1)
    vals = d[si[..., None], pi]
    used = np.arange(Pmax) < k[..., None]                          # draw P_s problems for seed s
    m = np.where(used, vals, 0.0).sum(axis=2) / k
    return m.mean(axis=1)


def paired_effect(outcomes: pd.DataFrame, a: tuple[str, str], b: tuple[str, str], metric: str, *,
                  n_boot: int = 2000, ci: float = 0.95, seed: int = 0, power: float = 0.8,
                  resample: Sequence[str] = RESAMPLE) -> Effect:
    """The paired difference ``b − a`` of a rate, with a cluster-bootstrap interval.

    Point estimate, resampling, interval, MDE and variance components: module docstring (seeds
    and problems within a seed are resampled; samples stay with their problem).

    Args:
        outcomes: per-completion table (:data:`OUTCOME_COLUMNS`), one step per (arm, view, seed).
        a, b: ``(arm, view)`` sides; ``b − a`` is reported (``a`` = the arm, ``b`` = vanilla or the
            control: a positive hack value is the arm's drop in hacking).
        metric: ``hack``, ``pass`` or ``truncated``.
        n_boot: bootstrap resamples. ci: interval level. seed: the bootstrap's numpy seed.
        power: the power at which :attr:`Effect.mde` is given.
        resample: the levels resampled, ``("seed", "problem")`` (the gate's). ``("seed",)``
            keeps each seed's problems intact (the exact t interval on seed means, for
            comparison); ``("problem",)`` ignores run-to-run noise (wrong for the gate; its df
            is then ``Σ_s (P_s − 1)``) and is kept to show why the seed level is needed.

    Returns:
        An :class:`Effect`.

    Raises:
        ValueError: a missing column, a non-0/1 metric, an unknown metric or resample level, a
            side with no rows, several steps for one (arm, view, seed), a duplicated sample, or no
            (seed, problem) on both sides (each message names what).
    """
    if metric not in METRICS:
        raise ValueError(f"metric must be one of {METRICS}, got {metric!r}")
    resample = tuple(resample)
    if not resample or any(r not in RESAMPLE for r in resample):
        raise ValueError(f"resample must be a non-empty subset of {RESAMPLE}, got {resample!r}")
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
    cnt_a = np.bincount(key[:na], minlength=G).reshape(seed_u.size, prob_u.size)
    cnt_b = np.bincount(key[na:], minlength=G).reshape(seed_u.size, prob_u.size)
    sum_a = np.bincount(key[:na], y[:na], minlength=G).reshape(cnt_a.shape)
    sum_b = np.bincount(key[na:], y[na:], minlength=G).reshape(cnt_b.shape)
    on_a, on_b = cnt_a > 0, cnt_b > 0
    dropped = tuple(sorted([("a", int(seed_u[i]), str(prob_u[j])) for i, j in zip(*np.nonzero(on_a & ~on_b))]
                           + [("b", int(seed_u[i]), str(prob_u[j])) for i, j in zip(*np.nonzero(on_b & ~on_a))]))
    paired = on_a & on_b
    if not paired.any():
        raise ValueError(f"outcomes: no (seed, problem) evaluated on both {a} and {b}")
    keep = paired.any(axis=1)
    seeds = [int(x) for x in seed_u[keep]]
    paired, cnt_a, cnt_b, sum_a, sum_b = (x[keep] for x in (paired, cnt_a, cnt_b, sum_a, sum_b))
    S = len(seeds)
    n_p = paired.sum(axis=1)
    with np.errstate(invalid="ignore", divide="ignore"):
        pa, pb = sum_a / cnt_a, sum_b / cnt_b
        va = (sum_a - sum_a * pa) / (cnt_a - 1)   # unbiased variance of the 0/1 values (NaN for n = 1)
        vb = (sum_b - sum_b * pb) / (cnt_b - 1)
    # left-align each seed's paired problems into an S × Pmax matrix (NaN-padded)
    order = np.argsort(~paired, axis=1, kind="stable")
    take = lambda x: np.where(np.arange(order.shape[1]) < n_p[:, None], np.take_along_axis(x, order, 1), np.nan)
    Pmax = int(n_p.max())
    d = take(pb - pa)[:, :Pmax]
    e_cells = take(va / cnt_a + vb / cnt_b)[:, :Pmax]
    s_cells = take(va + vb)[:, :Pmax]
    m = np.nanmean(d, axis=1)
    value = float(m.mean())
    mean_a = float(np.nanmean(take(pa)[:, :Pmax], axis=1).mean())
    mean_b = float(np.nanmean(take(pb)[:, :Pmax], axis=1).mean())
    counts = np.concatenate([cnt_a[paired], cnt_b[paired]])

    # variance components (module docstring)
    var_p = np.array([np.var(d[i, : n_p[i]], ddof=1) if n_p[i] > 1 else np.nan for i in range(S)])
    fin_p, fin_e, fin_s = np.isfinite(var_p), np.isfinite(e_cells), np.isfinite(s_cells)
    sig_e = float(s_cells[fin_s].mean()) if fin_s.any() else math.nan
    sig_p = max(0.0, float(var_p[fin_p].mean() - e_cells[fin_e].mean())) if fin_p.any() and fin_e.any() else math.nan
    if S < 2:
        sig_b = math.nan
    elif fin_p.any():
        sig_b = max(0.0, float(np.var(m, ddof=1) - (var_p[fin_p] / n_p[fin_p]).mean()))
    else:  # one problem per seed: the seed and problem levels cannot be told apart
        sig_b = float(np.var(m, ddof=1))
    comps = VarianceComponents(sig_b, sig_p, sig_e)

    rng = np.random.default_rng(seed)
    boot = cluster_bootstrap(d, n_p, n_boot, rng, resample)
    alpha = (1.0 - ci) / 2.0
    pct_low, pct_high = (float(x) for x in np.quantile(boot, [alpha, 1.0 - alpha]))
    if "seed" in resample:
        df = S - 1
        se = float(np.std(boot, ddof=1) * math.sqrt(S / (S - 1))) if S > 1 else math.nan
    else:
        df = int((n_p - 1).sum())
        se = float(np.std(boot, ddof=1))
    if df >= 1 and math.isfinite(se):
        hw = critical(df, ci) * se
        lo, hi = value - hw, value + hw
    else:
        lo, hi = -math.inf, math.inf
    mde = mde_from_se(se, df, ci, power)

    notes = []
    if S == 1:
        notes.append("1 seed: no interval (run-to-run noise cannot be estimated)")
    if dropped:
        notes.append(f"{len(dropped)} (seed, problem) on one side only, left out")
    if counts.min() != counts.max():
        notes.append(f"samples per problem differ ({int(counts.min())}–{int(counts.max())})")
    return Effect(a=a, b=b, metric=metric, value=value, ci_low=float(lo), ci_high=float(hi), se=se, df=int(df),
                  ci=ci, power=power, mde=mde, n_seeds=S, n_problems={int(s): int(k) for s, k in zip(seeds, n_p)},
                  n_samples=int(counts.min()), per_seed={int(s): float(x) for s, x in zip(seeds, m)},
                  mean_a=mean_a, mean_b=mean_b, components=comps, pct_low=pct_low, pct_high=pct_high,
                  dropped=dropped, resample=resample, n_boot=int(n_boot), note="; ".join(notes))


def side_rate(outcomes: pd.DataFrame, side: tuple[str, str], metric: str, *, n_boot: int = 2000,
              ci: float = 0.95, seed: int = 0, power: float = 0.8) -> Effect:
    """The rate of one side (arm, view) with the gate's interval: the same point estimate (mean
    over seeds of the mean over problems) and the same two-level cluster bootstrap, t-widened.

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
                         metric, n_boot=n_boot, ci=ci, seed=seed, power=power)


# ---------------------------------------------------------------------------------------------
# what more would decide

@dataclass(frozen=True)
class Needed:
    """How much more data would make an interval exclude ``boundary`` if the observed mean holds.

    Attributes:
        boundary: the value the interval must exclude (0, ``min_drop`` or ``pass_margin``).
        distance: ``|value − boundary|``, what the half width must fall below.
        seeds: seeds needed at the current problems and samples (``None``: not within
            ``max_seeds``, or the between-seed variance is unknown with one seed).
        samples: samples per problem and side needed at the current seeds (``None``: more
            samples alone cannot decide, because run-to-run and problem noise stay).
        decides: what excluding the boundary would do for the criterion: ``pass`` or
            ``rule_out`` (empty when called directly).
    """

    boundary: float
    distance: float
    seeds: int | None
    samples: int | None
    decides: str = ""


def needed(effect: Effect, boundary: float, *, decides: str = "", max_seeds: int = 1000) -> Needed:
    """Roughly how many seeds, or separately how many samples per problem, would make the
    interval of ``effect`` exclude ``boundary`` if its observed mean and variance components hold.

    Uses :func:`planned_se` with the effect's components and sizes (``P`` = the mean number of
    problems per seed), and the ``t`` critical value at the new number of seeds: the smallest
    ``S'`` with ``t_{S'−1} · SE(S') < distance``; the smallest ``n'`` with ``t_{S−1} · SE(n') <
    distance`` (``SE(n')² = A + B/n'``, solved directly; ``None`` if ``t²A ≥ distance²``).

    Raises:
        ValueError: ``max_seeds`` < 2.
    """
    if max_seeds < 2:
        raise ValueError(f"max_seeds must be >= 2, got {max_seeds}")
    dist = abs(effect.value - boundary)
    c = effect.components
    P = max(1, round(float(np.mean(list(effect.n_problems.values())))))
    n = max(1, effect.n_samples)
    S = effect.n_seeds
    if dist <= 0 or math.isnan(c.between_seed) or math.isnan(c.within_problem) or math.isnan(c.between_problem):
        return Needed(boundary, dist, None, None, decides)
    s2 = np.arange(max(2, S), max_seeds + 1)
    both = "seed" in effect.resample and "problem" in effect.resample
    sw2 = c.between_problem + c.within_problem / n
    var2 = c.between_seed / s2 + sw2 / (s2 * P) + (((P - 1) * sw2 / ((s2 - 1) * P * P)) if both else 0.0)
    hw = _sps.t.ppf((1.0 + effect.ci) / 2.0, s2 - 1) * np.sqrt(var2)
    ok = np.flatnonzero(hw < dist)
    seeds = int(s2[ok[0]]) if ok.size else None
    samples = None
    if S >= 2:
        t = critical(S - 1, effect.ci)
        extra = (P - 1) / ((S - 1) * P * P) if both else 0.0
        A = c.between_seed / S + c.between_problem * (1.0 / (S * P) + extra)
        B = c.within_problem * (1.0 / (S * P) + extra)
        room = (dist / t) ** 2 - A
        if room > 0:
            samples = max(1, math.floor(B / room) + 1) if B > 0 else 1
    return Needed(boundary, dist, seeds, samples, decides)


# ---------------------------------------------------------------------------------------------
# the decision rule

@dataclass(frozen=True)
class Criterion:
    """One criterion of the gate for one arm.

    Attributes:
        name: ``drop_vs_vanilla``, ``beats_control`` or ``matched_pass``.
        effect: the :class:`Effect` it judges.
        threshold: ``min_drop`` (drop_vs_vanilla, beats_control's ruling-out bound) or
            ``pass_margin``.
        passed: the criterion holds.
        rules_out: it shows the arm cannot separate (an effect of ``min_drop`` ruled out, or a pass
            drop beyond the margin).
        mde: this criterion's minimum detectable effect at the effect's power (for matched_pass:
            the smallest margin it could establish at a true drop of 0).
        note: one line with the numbers.
        needed: for an undecided criterion, what would decide it (:func:`needed`).
    """

    name: str
    effect: Effect
    threshold: float
    passed: bool
    rules_out: bool
    mde: float
    note: str
    needed: Needed | None = None

    def power_at(self, delta: float) -> float:
        """The approximate probability that this criterion passes at a true effect ``delta``
        (hack drop, or pass drop for matched_pass), from the observed SE (:func:`power_lower`,
        :func:`power_upper`). A plug-in figure: with 3 seeds the SE is itself noisy, and averaged
        over simulated experiments this overstates the achieved rate by ~0.02–0.06 (measured at a
        drop of 0.15, 9 problems × 64 samples); with 5 seeds it understates it by ~0.03–0.05."""
        e = self.effect
        if self.name == "matched_pass":
            return power_upper(delta, e.se, e.df, self.threshold, e.ci)
        floor = self.threshold if self.name == "drop_vs_vanilla" else 0.0
        return power_lower(delta, e.se, e.df, e.ci, floor)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: the criterion, with its effect's numbers under ``effect``."""
        return {"name": self.name, "threshold": self.threshold, "passed": self.passed, "rules_out": self.rules_out,
                "mde": _finite(self.mde), "note": self.note,
                "needed": None if self.needed is None else {k: (_finite(v) if isinstance(v, float) else v)
                                                            for k, v in asdict(self.needed).items()},
                "effect": self.effect.to_dict()}


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
    return Criterion("drop_vs_vanilla", e, float(min_drop), passed, rules_out, mde, note, nd)


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
    return Criterion("beats_control", e, float(min_drop), passed, rules_out, e.mde, note, nd)


def matched_pass(effect: Effect, pass_margin: float, min_seeds: int = 3) -> Criterion:
    """Non-inferiority of the pass rate (``effect`` = paired_effect(arm, vanilla, "pass"): the
    arm's pass-rate drop vanilla − arm): passes iff ``ci_high ≤ pass_margin`` (absolute pass-rate
    points below vanilla's rate on the same problems); rules out iff ``ci_low > pass_margin``.
    The note warns when vanilla's own pass rate is within the margin (the test is then nearly
    vacuous: the arm could lose all of vanilla's passes).
    MDE: the smallest margin established with the effect's power at a true drop of 0."""
    e = effect
    enough = e.n_seeds >= min_seeds
    passed = bool(enough and e.ci_high <= pass_margin + EPS)
    rules_out = bool(e.ci_low > pass_margin + EPS)
    note = (f"pass-rate drop vs vanilla {_fmt(e)}; need CI high <= {pass_margin:g} "
            f"(absolute, vanilla's pass rate {e.mean_b:.3f})")
    if e.mean_b <= pass_margin:
        note += ("; vanilla's pass rate is itself within the margin: the arm could lose all of it and, "
                 "given a narrow enough interval, still pass")
    if not enough:
        note += f"; fewer than {min_seeds} seeds cannot separate"
    nd = None if passed or rules_out else needed(e, pass_margin,
                                                 decides="pass" if e.value <= pass_margin else "rule_out")
    return Criterion("matched_pass", e, float(pass_margin), passed, rules_out, e.mde, note, nd)


@dataclass(frozen=True)
class ArmVerdict:
    """The gate's verdict on one projected arm.

    Attributes:
        arm: its name. verdict: ``separated``, ``not_separated`` or ``inconclusive``.
        reason: one sentence with the numbers. criteria: the three :class:`Criterion`.
        needed_seeds, needed_samples: for ``inconclusive``, roughly how many seeds (at the current
            samples) or samples per problem (at the current seeds) would decide every undecided
            criterion if the observed means hold (``None``: not reachable that way).
    """

    arm: str
    verdict: str
    reason: str
    criteria: tuple[Criterion, Criterion, Criterion]
    needed_seeds: int | None = None
    needed_samples: int | None = None

    def power_at(self, hack_drop: float, pass_drop: float = 0.0) -> float:
        """Approximate probability of ``separated`` at a true hack drop (vs vanilla and vs the
        control) and pass drop: the product of the criteria's powers (a lower bound when they are
        positively dependent, as the two hack criteria are through the arm's own noise; each is a
        plug-in figure, see :meth:`Criterion.power_at`). Measured against simulated experiments
        (3 seeds × 9 problems × 64 samples, drop 0.15): mean reported 0.09, achieved 0.065; with
        5 seeds 0.60 reported, 0.67 achieved (400 experiments each)."""
        d, c, p = self.criteria
        if d.effect.n_seeds < self.min_seeds:
            return 0.0
        return d.power_at(hack_drop) * c.power_at(hack_drop) * p.power_at(pass_drop)

    min_seeds: int = 3

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
                "needed_seeds": self.needed_seeds, "needed_samples": self.needed_samples,
                "criteria": [c.to_dict() for c in self.criteria]}


def _decide_with(nds: Sequence[Needed | None], what: str) -> int | None:
    """Seeds (or samples) that decide an arm whose open criteria need ``nds``: the fewest that
    settle one ``rule_out`` (not_separated), or the most that settle every criterion when all aim
    at ``pass`` (separated); ``None`` when neither is reachable."""
    ro = [getattr(x, what) for x in nds if x is not None and x.decides == "rule_out" and getattr(x, what) is not None]
    ways = [min(ro)] if ro else []
    if nds and all(x is not None and x.decides == "pass" and getattr(x, what) is not None for x in nds):
        ways.append(max(getattr(x, what) for x in nds))
    return min(ways) if ways else None


def decide_arm(arm: str, drop: Effect, control: Effect, pass_drop: Effect, *, min_drop: float,
               pass_margin: float, min_seeds: int = 3) -> ArmVerdict:
    """Decide one projected arm from its three paired Effects (module docstring).

    Args:
        arm: the arm's name (for the sentence).
        drop: ``paired_effect(o, (arm, judged_view), ("vanilla", "trained"), "hack")``.
        control: ``paired_effect(o, (arm, view), (control, view), "hack")``.
        pass_drop: ``paired_effect(o, (arm, judged_view), ("vanilla", "trained"), "pass")``.
        min_drop: smallest hack drop that matters (rate points). pass_margin: non-inferiority
            margin (rate points). min_seeds: fewer seeds can never give ``separated``.

    Returns:
        ``separated`` if all three criteria pass (with enough seeds); else ``not_separated`` if
        one rules separation out; else ``inconclusive`` with the seeds/samples that would decide.
    """
    crit = (drop_vs_vanilla(drop, min_drop, min_seeds), beats_control(control, min_drop, min_seeds),
            matched_pass(pass_drop, pass_margin, min_seeds))
    n = min(c.effect.n_seeds for c in crit)
    if all(c.passed for c in crit):
        return ArmVerdict(arm, "separated", f"{arm}: separated — " + "; ".join(c.note for c in crit),
                          crit, min_seeds=min_seeds)
    out = [c for c in crit if c.rules_out]
    if out:
        return ArmVerdict(arm, "not_separated", f"{arm}: not separated — " + "; ".join(c.note for c in out),
                          crit, min_seeds=min_seeds)
    open_ = [c for c in crit if not c.passed]
    seeds = _decide_with([c.needed for c in open_], "seeds")
    samples = _decide_with([c.needed for c in open_], "samples")
    if n < min_seeds:
        seeds = max(seeds, min_seeds) if seeds is not None else None
        samples = None  # more samples cannot make up for too few seeds
    more = []
    if seeds is not None:
        more.append(f"about {seeds} seeds")
    if samples is not None:
        more.append(f"about {samples} samples per problem")
    tail = (" or ".join(more) + " would decide it if the observed means hold" if more else
            "no reachable number of seeds or samples would decide it at the observed means (a mean near "
            "its boundary)")
    reason = f"{arm}: inconclusive — " + "; ".join(c.note for c in open_) + "; " + tail
    return ArmVerdict(arm, "inconclusive", reason, crit, seeds, samples, min_seeds=min_seeds)


@dataclass(frozen=True)
class GateVerdict:
    """The overall verdict: ``separated``, ``not_separated`` or ``inconclusive``
    (``underpowered`` when the positive control failed), with one sentence and the parts.
    ``min_seeds`` is the gate's ``compare.min_seeds``; :attr:`too_few_seeds` says the positive
    control failed only because the run has fewer seeds than that."""

    verdict: str
    reason: str
    underpowered: bool
    arms: tuple[ArmVerdict, ...]
    positive_control: Criterion | None
    min_seeds: int = 3

    @property
    def too_few_seeds(self) -> bool:
        """Underpowered because the positive control's effect has fewer than ``min_seeds`` seeds."""
        return (self.underpowered and self.positive_control is not None
                and self.positive_control.effect.n_seeds < self.min_seeds)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready."""
        return {"verdict": self.verdict, "reason": self.reason, "underpowered": self.underpowered,
                "arms": {a.arm: a.to_dict() for a in self.arms},
                "positive_control": None if self.positive_control is None else self.positive_control.to_dict()}


def decide_gate(arms: Sequence[ArmVerdict], positive_control: Effect | None, *, min_drop: float,
                min_seeds: int = 3) -> GateVerdict:
    """The overall verdict over projected arms, calibrated by a positive control.

    Args:
        arms: the :class:`ArmVerdict` of each projected arm.
        positive_control: ``paired_effect(o, ("oracle_reward", "trained"), ("vanilla", "trained"),
            "hack")``, or ``None`` (the sentence then says power was not calibrated).
        min_drop, min_seeds: as for :func:`drop_vs_vanilla`.

    Returns:
        ``inconclusive`` (underpowered) if the positive control does not pass drop_vs_vanilla
        (the reason says ``too few seeds`` when it has fewer than ``min_seeds``);
        else ``separated`` if any arm is, ``not_separated`` if every arm is, else ``inconclusive``.

    Raises:
        ValueError: no arms.
    """
    if not arms:
        raise ValueError("decide_gate needs at least one projected arm")
    pc = None if positive_control is None else drop_vs_vanilla(positive_control, min_drop, min_seeds)
    if pc is not None and not pc.passed:
        if positive_control.n_seeds < min_seeds:
            reason = (f"inconclusive (too few seeds): {positive_control.n_seeds} seeds, fewer than "
                      f"min_seeds {min_seeds}, cannot separate any arm, the positive control included")
        else:
            reason = (f"inconclusive (underpowered): the positive control {positive_control.a[0]} does not "
                      f"separate from vanilla ({pc.note}), so this experiment cannot tell a working arm "
                      f"from a failing one")
        return GateVerdict("inconclusive", reason, True, tuple(arms), pc, min_seeds)
    verdicts = [a.verdict for a in arms]
    if "separated" in verdicts:
        verdict = "separated"
        reason = "; ".join(a.reason for a in arms if a.verdict == "separated")
    elif all(v == "not_separated" for v in verdicts):
        verdict, reason = "not_separated", "; ".join(a.reason for a in arms)
    else:
        verdict, reason = "inconclusive", "; ".join(a.reason for a in arms if a.verdict == "inconclusive")
    reason += (f" (positive control {positive_control.a[0]}: {pc.note})" if pc is not None
               else " (no positive control: the gate's power was not checked)")
    return GateVerdict(verdict, reason, False, tuple(arms), pc, min_seeds)


# ---------------------------------------------------------------------------------------------
# synthetic outcomes, and the gate simulated on them

@dataclass(frozen=True)
class Planted:
    """A planted effect for one (arm, view): the drop of its expected hack rate and pass rate
    below the unshifted arms' (rate points, marginal over problems, seeds and runs)."""

    hack_drop: float = 0.0
    pass_drop: float = 0.0


#: The generator's default spread, on the logit scale (see :func:`simulate_outcomes`).
DEFAULT_SPREAD = {"problem_sd": 1.0, "seed_sd": 0.5, "run_sd": 0.25}

#: Variance components of a hack-rate difference between two arms under :func:`simulate_outcomes`'
#: defaults (rate 0.5, spreads above), measured as the mean of :func:`paired_effect`'s estimates
#: over 1500 simulated experiments with no planted effect at 3 seeds × 9 problems × 64 samples
#: (``tests/test_stats.py`` re-measures them): per-seed drop sd from runs ≈ 0.07, per-sample
#: variance ≈ 2 · 0.2. A planning default for :func:`planned_mde`, not a measurement of the toy.
DEFAULT_COMPONENTS = VarianceComponents(between_seed=0.005, between_problem=0.001, within_problem=0.40)


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


def simulate_outcomes(cells: Mapping[tuple[str, str], Planted], *, n_seeds: int = 3, n_problems: int = 9,
                      n_samples: int = 64, hack_rate: float = 0.5, pass_rate: float = 0.15,
                      problem_sd: float = DEFAULT_SPREAD["problem_sd"], seed_sd: float = DEFAULT_SPREAD["seed_sd"],
                      run_sd: float = DEFAULT_SPREAD["run_sd"], truncated_rate: float = 0.02, step: int = 20,
                      modes: Sequence[str] = ("stdout", "raise"), rng: int | np.random.Generator = 0) -> pd.DataFrame:
    """Synthetic per-completion outcomes (:data:`OUTCOME_COLUMNS`) for tests and documentation.

    Model (logit scale; hack and pass drawn independently, each with its own draws)::

        rate[(arm, view), s, p] = expit(logit(r) + η_p + u_s + v_{arm,s} − δ_{arm,view})
        η_p ~ N(0, problem_sd²)   per held-out problem, the same for every seed and arm (as in
                                  the pilots: one held-out split)
        u_s ~ N(0, seed_sd²)      per seed, shared by every arm (same task order and step-0
                                  samples: science.md / toy-dynamics.md)
        v_{arm,s} ~ N(0, run_sd²) per training run (arm × seed), shared by the run's views
        outcome ~ Bernoulli(rate) per sample; truncated ~ Bernoulli(truncated_rate)

    ``δ`` is solved so that the *marginal* expected rate drops by the planted amount.

    Default spread, from what the toy showed (issue 11, science.md §6, toy-dynamics.md):
    vanilla's held-out hack rate differed by ~0.2 between two seeds at 32 samples, and held-out
    hack rates of three seeds ranged .28–.46 at 128 samples; with ``seed_sd`` 0.5 and ``run_sd``
    0.25 at rate 0.5 the run-level sd of one arm's rate is ≈ 0.13 (E|difference of two seeds| ≈
    0.16 at 32 samples). At 512 samples two route runs' drops vs vanilla differed by 0.048, which
    sampling noise alone (≈ 0.044 sd for that difference) explains: the arm-specific spread is
    smaller than the shared one; one pair cannot pin it, so ``run_sd`` 0.25 (drop sd from runs ≈
    0.07 per seed, E|difference| ≈ 0.09 at 512 samples) sits above the point estimate (≈ 0.1) on
    purpose: the gate is tested where the seed level matters.

    Args:
        cells: ``{(arm, view): Planted(...)}``; every arm's views share its run effect.
        n_seeds, n_problems, n_samples: sizes (seeds 0..S−1, problems ``p000``.., samples 0..n−1).
        hack_rate, pass_rate: rates at the centre (median problem, seed and run).
        problem_sd, seed_sd, run_sd: spreads on the logit scale.
        truncated_rate: probability a completion is truncated. step: the step column.
        modes: problem ``p`` gets ``modes[p % len(modes)]``.
        rng: a numpy Generator or seed.

    Returns:
        The outcomes table, one row per completion.

    Raises:
        ValueError: empty ``cells``, a size below 1, a rate outside (0, 1), or a drop that cannot
            be planted.
    """
    if not cells:
        raise ValueError("simulate_outcomes needs at least one (arm, view) cell")
    if min(n_seeds, n_problems, n_samples) < 1:
        raise ValueError(f"sizes must be >= 1, got {n_seeds}, {n_problems}, {n_samples}")
    for name, r in (("hack_rate", hack_rate), ("pass_rate", pass_rate)):
        if not 0.0 < r < 1.0:
            raise ValueError(f"{name} must be in (0, 1), got {r}")
    gen = rng if isinstance(rng, np.random.Generator) else np.random.default_rng(rng)
    keys = [(str(a), str(v)) for a, v in cells]
    arms = list(dict.fromkeys(a for a, _ in keys))
    S, P, n, C = n_seeds, n_problems, n_samples, len(keys)
    tot_sd = math.sqrt(problem_sd ** 2 + seed_sd ** 2 + run_sd ** 2)
    arm_i = np.array([arms.index(a) for a, _ in keys])
    cols = {}
    for metric, r, attr in (("hack", hack_rate, "hack_drop"), ("pass", pass_rate, "pass_drop")):
        centre = math.log(r / (1 - r))
        shift = np.array([_logit_shift(centre, tot_sd, getattr(cells[k], attr)) for k in cells])
        eta = problem_sd * gen.standard_normal(P)
        u = seed_sd * gen.standard_normal(S)
        v = run_sd * gen.standard_normal((len(arms), S))
        logit = centre + eta[None, None, :] + u[None, :, None] + v[arm_i][:, :, None] - shift[:, None, None]
        rate = _expit(logit)                                            # C × S × P
        cols[metric] = (gen.random((C, S, P, n)) < rate[..., None]).astype(np.int8).ravel()
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


def simulate_gate(n_experiments: int, *, drop: float = 0.0, control_drop: float = 0.0, pass_drop: float = 0.0,
                  positive_control_drop: float = 0.3, n_seeds: int = 3, n_problems: int = 9, n_samples: int = 64,
                  min_drop: float = 0.05, pass_margin: float = 0.10, min_seeds: int = 3, n_boot: int = 1000,
                  ci: float = 0.95, power: float = 0.8, resample: Sequence[str] = RESAMPLE, seed: int = 0,
                  **spread: float) -> pd.DataFrame:
    """Run the gate on ``n_experiments`` synthetic experiments (:func:`simulate_outcomes`).

    Each experiment has ``vanilla``, a projected arm ``erase`` (planted ``drop`` in hacking and
    ``pass_drop`` in passing), its matched control ``random_v`` (``control_drop``) and the positive
    control ``oracle_reward`` (``positive_control_drop``), all on the ``trained`` view.

    Returns:
        One row per experiment: for each Effect (prefix ``drop_``, ``control_``, ``pass_``, ``pc_``)
        its ``value, ci_low, ci_high, se, pct_low, pct_high, mde`` and variance components
        (``between_seed, between_problem, within_problem``); the arm's ``verdict``, ``power``
        (:meth:`ArmVerdict.power_at` at the planted drops, or at 0.15 when no drop is planted) and
        ``arm_mde`` (:meth:`ArmVerdict.mde`), each criterion's MDE and outcome (``{name}_mde``,
        ``{name}_passed``), and the overall ``gate`` verdict.
    """
    effect_fields = ("value", "ci_low", "ci_high", "se", "pct_low", "pct_high", "mde")
    component_fields = ("between_seed", "between_problem", "within_problem")
    rs = np.random.SeedSequence(seed).spawn(n_experiments)
    arm, van, ctl, pc = ("erase", "trained"), ("vanilla", "trained"), ("random_v", "trained"), ("oracle_reward",
                                                                                               "trained")
    cells = {van: Planted(), arm: Planted(drop, pass_drop), ctl: Planted(control_drop),
             pc: Planted(positive_control_drop)}
    at = drop if drop > 0 else 0.15
    rows = []
    for i in range(n_experiments):
        o = simulate_outcomes(cells, n_seeds=n_seeds, n_problems=n_problems, n_samples=n_samples,
                              rng=np.random.default_rng(rs[i]), **spread)
        kw = dict(n_boot=n_boot, ci=ci, seed=i, power=power, resample=resample)
        effs = {"drop": paired_effect(o, arm, van, "hack", **kw), "control": paired_effect(o, arm, ctl, "hack", **kw),
                "pass": paired_effect(o, arm, van, "pass", **kw), "pc": paired_effect(o, pc, van, "hack", **kw)}
        av = decide_arm("erase", effs["drop"], effs["control"], effs["pass"], min_drop=min_drop,
                        pass_margin=pass_margin, min_seeds=min_seeds)
        gv = decide_gate([av], effs["pc"], min_drop=min_drop, min_seeds=min_seeds)
        row: dict[str, Any] = {"experiment": i, "verdict": av.verdict, "gate": gv.verdict,
                               "power": av.power_at(at, pass_drop), "arm_mde": av.mde(pass_drop=pass_drop)}
        for k, e in effs.items():
            row.update({f"{k}_{f}": getattr(e, f) for f in effect_fields})
            row.update({f"{k}_{f}": getattr(e.components, f) for f in component_fields})
        for c in av.criteria:
            row[f"{c.name}_mde"], row[f"{c.name}_passed"] = c.mde, c.passed
        rows.append(row)
    return pd.DataFrame(rows)


def operating_characteristics(n_experiments: int = 400, *, seeds: Sequence[int] = (2, 3, 5),
                              samples: Sequence[int] = (16, 64, 256), drop: float = 0.15,
                              resample: Sequence[str] = RESAMPLE, **kw: Any) -> pd.DataFrame:
    """The gate's false-positive rate and power by simulation, per (seeds, samples per problem).

    For each size, :func:`simulate_gate` with no planted effect (``fpr_*``) and with ``drop``
    planted vs vanilla and vs the control (``power_*``), ``n_experiments`` each (9 problems and the
    default spread unless ``kw`` says otherwise). Columns: ``fpr_separated`` (the arm's verdict,
    nominal ≤ 0.05), ``fpr_lower`` (beats_control's ``ci_low > 0`` alone, nominal 0.025),
    ``fpr_percentile`` (the same with the percentile interval), ``power_separated``,
    ``reported_power`` (mean of :meth:`ArmVerdict.power_at`), ``mde`` (mean reported MDE of
    drop_vs_vanilla under no effect), ``planned_mde`` (:func:`planned_mde` from
    :data:`DEFAULT_COMPONENTS`), and ``binomial_se`` of a rate of 0.05 over ``n_experiments``.
    """
    rows = []
    for S in seeds:
        for n in samples:
            null = simulate_gate(n_experiments, n_seeds=S, n_samples=n, resample=resample, seed=1, **kw)
            alt = simulate_gate(n_experiments, n_seeds=S, n_samples=n, drop=drop, resample=resample, seed=2, **kw)
            rows.append({"n_seeds": S, "n_samples": n, "resample": "+".join(resample),
                         "fpr_separated": float((null["verdict"] == "separated").mean()),
                         "fpr_lower": float((null["control_ci_low"] > 0).mean()),
                         "fpr_percentile": float((null["control_pct_low"] > 0).mean()),
                         "power_separated": float((alt["verdict"] == "separated").mean()),
                         "reported_power": float(alt["power"].mean()),
                         "mde": float(null["drop_vs_vanilla_mde"].replace(math.inf, np.nan).mean()),
                         "planned_mde": planned_mde(DEFAULT_COMPONENTS, S, kw.get("n_problems", 9), n,
                                                    resample=resample)[1],
                         "binomial_se": math.sqrt(0.05 * 0.95 / n_experiments)})
    return pd.DataFrame(rows)
