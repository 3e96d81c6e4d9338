r"""The separation gate's paired effects: per-completion outcomes → a paired difference of rates
with its crossed seed × problem cluster-bootstrap interval and variance components. Part of
:mod:`evil_moe.gate` (power and planning: :mod:`evil_moe.gate.power`; the decision rule:
:mod:`evil_moe.gate.rule`); the same text, with the simulation tables, is ``docs/gate.md``.

and power, and the gate's decision rule. The same text, with the simulation tables, is
``docs/gate.md``.

Data
----
One row per held-out completion (:data:`evil_moe.pilots.OUTCOME_COLUMNS`): ``arm, view, seed, step, problem_id,
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
Resampling (``resample="crossed"``, the default; :func:`evil_moe.gate.bootstrap.crossed_bootstrap`): per replicate draw
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
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any, Mapping, Sequence

import numpy as np
import pandas as pd

from evil_moe.gate.bootstrap import cluster_bootstrap, crossed_bootstrap
from evil_moe.gate.defaults import CI, N_BOOT, POWER, RESAMPLE, SEED
from evil_moe.pilots import OUTCOME_COLUMNS
from evil_moe.gate.power import (VarianceComponents, critical, crossed_df, crossed_factor, finite, mde_from_se,
                                 resample_scheme)

METRICS = ("hack", "pass", "truncated")


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
        d["per_seed"] = {str(k): finite(v) for k, v in self.per_seed.items()}
        d["dropped"] = [list(x) for x in self.dropped]
        d["components"] = {k: finite(v) for k, v in d["components"].items()}
        d["boot_terms"] = [finite(x) for x in self.boot_terms]
        return {k: (finite(v) if isinstance(v, float) else v) for k, v in d.items()}


def _py(x: Any) -> Any:
    """A numpy scalar as the Python value (for messages)."""
    return x.item() if hasattr(x, "item") else x


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


def crossed_decomposition(d: np.ndarray) -> dict[str, Any]:
    """The additive seed + problem fit of a seed × problem grid (``NaN`` = missing), the crossed
    bootstrap's variance in closed form, and the two-way ANOVA mean squares.

    With row means ``m_s`` (over present cells), ``D = mean_s m_s``, problem effects
    ``b_p = mean_s (d_sp − m_s)`` and residuals ``e_sp = d_sp − m_s − b_p``::

        T_seed = var(m)/S,  T_problem = var(b)/P,  T_residual = mean(e²)/(S P)   (var: ddof 0)
        Var*(D*) = T_seed + T_problem + T_residual                (exact without missing cells)

    (derivation: the module docstring). Mean squares: ``MS_seed = (N/S) Σ(m_s − D)²/(S−1)``,
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


@dataclass(frozen=True)
class _Grid:
    """The compared cells of a seed × problem grid (rows and columns with a paired cell only).

    ``d``, ``e_cells``, ``s_cells``: ``S × P`` paired differences, their sampling variances and
    per-sample variances (NaN off the paired cells); ``n_p``: paired problems per seed; ``m``: the
    seed means of ``d``; ``counts``: the samples of every paired cell on both sides."""

    seeds: list[int]
    paired: np.ndarray
    d: np.ndarray
    e_cells: np.ndarray
    s_cells: np.ndarray
    n_p: np.ndarray
    m: np.ndarray
    value: float
    mean_a: float
    mean_b: float
    counts: np.ndarray
    weight_b: float


def _paired_grid(a: tuple[str, str], b: tuple[str, str], seeds: Sequence[int], sum_a: np.ndarray,
                 cnt_a: np.ndarray, sum_b: np.ndarray, cnt_b: np.ndarray, weight_b: float) -> _Grid:
    """Keep the seeds and problems with a cell on both sides; per cell the rates, the difference
    ``w·p_b − p_a`` and its variances; the point estimate ``D`` and each side's rate.

    Raises:
        ValueError: no cell has samples on both sides.
    """
    paired = (cnt_a > 0) & (cnt_b > 0)
    if not paired.any():
        raise ValueError(f"outcomes: no (seed, problem) evaluated on both {a} and {b}")
    rows, cols = paired.any(axis=1), paired.any(axis=0)
    seeds = [int(x) for x, k in zip(seeds, rows) if k]
    paired = paired[rows][:, cols]
    sum_a, cnt_a, sum_b, cnt_b = (np.asarray(x, dtype=float)[rows][:, cols] for x in (sum_a, cnt_a, sum_b, cnt_b))
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
    return _Grid(seeds, paired, d, e_cells, s_cells, n_p, m, value, mean_a, mean_b, counts, wb)


def _grid_components(g: _Grid, dec: Mapping[str, Any]) -> VarianceComponents:
    """The variance components of the grid (:func:`_components`), with the cells' mean sampling
    variance ``ē`` and mean per-sample variance ``σ_e²`` over the finite cells."""
    fin_e, fin_s = np.isfinite(g.e_cells), np.isfinite(g.s_cells)
    sampling = float(g.e_cells[fin_e].mean()) if fin_e.any() else 0.0
    return _components(dec, sampling, float(g.s_cells[fin_s].mean()) if fin_s.any() else math.nan)


def _resampled_se(g: _Grid, dec: Mapping[str, Any], scheme: str, n_boot: int,
                  rng: np.random.Generator) -> tuple[np.ndarray, float, float, tuple[float, ...], list[str]]:
    """Bootstrap the grid with ``scheme``: ``(D* kept, SE, df, boot_terms, notes)`` (SE and df as
    in the module docstring: ``crossed`` ``sqrt(f)·sd(D*)`` with ``min(S − 1, P − 1)`` df; ``nested``
    and ``seed`` ``sqrt(S/(S−1))·sd(D*)`` with ``S − 1``; ``problem`` ``sd(D*)`` with ``Σ(P_s − 1)``)."""
    S, P = g.paired.shape
    notes: list[str] = []
    terms: tuple[float, ...] = ()
    if scheme == "crossed":
        boot = crossed_bootstrap(g.d, n_boot, rng)
        empty = int((~np.isfinite(boot)).sum())
        boot = boot[np.isfinite(boot)]
        if empty:
            notes.append(f"{empty} of {n_boot} crossed resamples had no seed with a drawn problem, left out")
        f = crossed_factor(S, P)
        se = float(np.std(boot, ddof=1) * math.sqrt(f)) if S > 1 and boot.size > 1 else math.nan
        terms = tuple(f * t for t in dec["terms"]) if S > 1 else ()
        df = float(crossed_df(S, P))
    else:
        order = np.argsort(~g.paired, axis=1, kind="stable")
        dl = np.take_along_axis(np.where(g.paired, g.d, np.nan), order, 1)[:, : int(g.n_p.max())]
        boot = cluster_bootstrap(dl, g.n_p, n_boot, rng, scheme)
        if scheme == "problem":
            df = float((g.n_p - 1).sum())
            se = float(np.std(boot, ddof=1))
        else:
            df = float(S - 1)
            se = float(np.std(boot, ddof=1) * math.sqrt(S / (S - 1))) if S > 1 else math.nan
    return boot, se, df, terms, notes


def _t_interval(value: float, se: float, df: float, ci: float) -> tuple[float, float]:
    """``value ∓ t_{df,(1+ci)/2}·se``; ``(−inf, inf)`` without df ≥ 1 or a finite SE."""
    if df >= 1 and math.isfinite(se):
        hw = critical(df, ci) * se
        return value - hw, value + hw
    return -math.inf, math.inf


def effect_from_cells(a: tuple[str, str], b: tuple[str, str], metric: str, seeds: Sequence[int],
                      problems: Sequence[str], sum_a: np.ndarray, cnt_a: np.ndarray, sum_b: np.ndarray,
                      cnt_b: np.ndarray, *, dropped: tuple = (), n_boot: int = N_BOOT, ci: float = CI,
                      seed: int = SEED, power: float = POWER, resample: str | Sequence[str] = RESAMPLE,
                      weight_b: float = 1.0) -> Effect:
    """The paired effect from per-cell sums and counts (what :func:`paired_effect` computes from
    the per-completion table; :func:`evil_moe.gate.simulate.simulate_gate` calls it directly on
    simulated counts).

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
    g = _paired_grid(a, b, seeds, sum_a, cnt_a, sum_b, cnt_b, weight_b)
    S, P = g.paired.shape
    dec = crossed_decomposition(g.d)
    comps = _grid_components(g, dec)
    boot, se, df, terms, notes = _resampled_se(g, dec, scheme, n_boot, np.random.default_rng(seed))
    alpha = (1.0 - ci) / 2.0
    pct_low, pct_high = (float(x) for x in np.quantile(boot, [alpha, 1.0 - alpha]))
    lo, hi = _t_interval(g.value, se, df, ci)
    mde = mde_from_se(se, df, ci, power)

    counts = g.counts
    if S == 1:
        notes.insert(0, "1 seed: no interval (run-to-run noise cannot be estimated)")
    if dropped:
        notes.append(f"{len(dropped)} (seed, problem) on one side only, left out")
    if counts.min() != counts.max():
        notes.append(f"samples per problem differ ({int(counts.min())}–{int(counts.max())})")
    return Effect(a=a, b=b, metric=metric, value=g.value, ci_low=float(lo), ci_high=float(hi), se=se, df=float(df),
                  ci=ci, power=power, mde=mde, n_seeds=S, n_problems={int(s): int(k) for s, k in zip(g.seeds, g.n_p)},
                  n_samples=int(counts.min()), per_seed={int(s): float(x) for s, x in zip(g.seeds, g.m)},
                  mean_a=g.mean_a, mean_b=g.mean_b, components=comps, pct_low=pct_low, pct_high=pct_high,
                  dropped=tuple(dropped), resample=scheme, n_boot=int(n_boot), note="; ".join(notes),
                  weight_b=g.weight_b, boot_terms=terms, n_problems_total=int(P))


def paired_effect(outcomes: pd.DataFrame, a: tuple[str, str], b: tuple[str, str], metric: str, *,
                  n_boot: int = N_BOOT, ci: float = CI, seed: int = SEED, power: float = POWER,
                  resample: str | Sequence[str] = RESAMPLE, weight_b: float = 1.0) -> Effect:
    """The paired difference ``w·b − a`` of a rate (``w`` = ``weight_b``, default 1), with a
    cluster-bootstrap interval.

    Point estimate, resampling, interval, MDE and variance components: module docstring.

    Args:
        outcomes: per-completion table (:data:`evil_moe.pilots.OUTCOME_COLUMNS`), one step per (arm, view, seed).
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


def side_rate(outcomes: pd.DataFrame, side: tuple[str, str], metric: str, *, n_boot: int = N_BOOT,
              ci: float = CI, seed: int = SEED, power: float = POWER,
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


