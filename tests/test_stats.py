"""The gate's statistics (evil_moe.stats): hand-computed values, and the gate tested on synthetic
experiments (false-positive rate and power at the default sizes; deterministic seeds)."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from evil_moe import stats as st

A, B = ("erase", "trained"), ("vanilla", "trained")

# Simulation sizes and slack. A rate measured over N experiments has binomial SE sqrt(p(1-p)/N);
# a bound is checked with 3 SE of slack, so a correct gate fails such a check with probability
# ~0.1% (one-sided normal tail) whatever the seed, while the broken variants below miss it by far.
N_NULL, N_ALT, N_AUX = 400, 400, 200
NOMINAL = 0.05  # the full rule: separated at most this often with no effect
NOMINAL_LOWER = 0.025  # one criterion "ci_low > 0" of a two-sided 95% interval
N_BOOT = 500


def slack(p: float, n: int) -> float:
    return 3.0 * math.sqrt(p * (1.0 - p) / n)


# ---------------------------------------------------------------------------------------------
# a table small enough to do by hand: 2 seeds x 2 problems x 4 samples per side

HAND = {  # (seed, problem): (erase's hacks, vanilla's hacks)
    (0, "p0"): ([0, 0, 0, 0], [1, 1, 0, 0]),  # d = 0.50 - 0.00 = 0.50
    (0, "p1"): ([1, 0, 0, 0], [1, 0, 0, 0]),  # d = 0.25 - 0.25 = 0.00
    (1, "p0"): ([1, 1, 0, 0], [1, 1, 1, 0]),  # d = 0.75 - 0.50 = 0.25
    (1, "p1"): ([1, 1, 1, 1], [1, 1, 1, 0]),  # d = 0.75 - 1.00 = -0.25
}


def table(cells=HAND, extra: list[dict] | None = None) -> pd.DataFrame:
    rows = []
    for (s, p), (ya, yb) in cells.items():
        for (arm, view), ys in ((A, ya), (B, yb)):
            for j, y in enumerate(ys):
                rows.append({"arm": arm, "view": view, "seed": s, "step": 20, "problem_id": p, "sample": j,
                             "mode": "stdout", "hack": y, "pass": 1 - y, "truncated": 0})
    return pd.DataFrame(rows + (extra or []))


def test_hand_point_estimate_and_variance_components():
    e = st.paired_effect(table(), A, B, "hack", n_boot=200, seed=0)
    # seed means m_0 = (0.5 + 0)/2 = 0.25, m_1 = (0.25 - 0.25)/2 = 0; D = 0.125
    assert e.value == pytest.approx(0.125)
    assert e.per_seed == pytest.approx({0: 0.25, 1: 0.0})
    assert e.mean_a == pytest.approx((0.125 + 0.75) / 2) and e.mean_b == pytest.approx((0.375 + 0.75) / 2)
    assert (e.n_seeds, e.n_problems, e.n_samples, e.df) == (2, {0: 2, 1: 2}, 4, 1)
    # unbiased cell variances p(1-p)*4/3 summed over both sides, averaged: (1/3 + 1/2 + 7/12 + 1/4)/4
    c = e.components
    assert c.within_problem == pytest.approx(5 / 12)
    # crossed ANOVA on d = [[.5, 0], [.25, -.25]]: it is additive (row effects ±.125, problem effects
    # ±.25, residuals 0), so MS_seed = 2·(2·.125²) = .0625, MS_problem = 2·(2·.25²) = .25, MS_res = 0;
    # the cells' mean sampling variance ē = (1/12 + 1/8 + 7/48 + 1/16)/4 = 5/48 floors the residual:
    # σ_B² = max(0, (.0625 − 5/48)/2) = 0, σ_C² = (.25 − 5/48)/2, σ_R² = 5/48 − 5/48 = 0
    assert c.between_seed == 0.0
    assert c.between_problem == pytest.approx((0.25 - 5 / 48) / 2)
    assert c.seed_problem == pytest.approx(0.0)
    # pass = 1 - hack on every completion: the pass difference is minus the hack difference
    assert st.paired_effect(table(), A, B, "pass", n_boot=200).value == pytest.approx(-0.125)


def test_hand_nested_bootstrap_support_and_distribution():
    """Each drawn seed's mean m* takes -0.25, 0, 0.25, 0.5 with probabilities 1, 3, 3, 1 (/8):
    seed 0's problems give {0.5, 0} -> m* in {0.5, 0.25, 0.25, 0}, seed 1's {0.25, -0.25} ->
    {0.25, 0, 0, -0.25}, each seed drawn w.p. 1/2. D* = (m*_1 + m*_2)/2 = -0.25 + 0.125 Bin(6, 1/2)."""
    d = np.array([[0.5, 0.0], [0.25, -0.25]])
    n = 40_000
    boot = st.cluster_bootstrap(d, np.array([2, 2]), n, np.random.default_rng(0), "nested")
    support = [-0.25, -0.125, 0.0, 0.125, 0.25, 0.375, 0.5]
    pmf = np.array([1, 6, 15, 20, 15, 6, 1]) / 64
    vals, counts = np.unique(np.round(boot, 12), return_counts=True)
    assert vals.tolist() == support
    assert np.all(np.abs(counts / n - pmf) < 4.5 * np.sqrt(pmf * (1 - pmf) / n))
    # without the seed level (problems resampled within each fixed seed) the support differs:
    # m*_0 in {0, .25, .5} and m*_1 in {-.25, 0, .25} always both appear
    only_p = st.cluster_bootstrap(d, np.array([2, 2]), 2000, np.random.default_rng(0), ("problem",))
    assert set(np.round(only_p, 12)) == {-0.125, 0.0, 0.125, 0.25, 0.375}
    # Var(D*) = 0.125^2 * 6/4; SE = sqrt(S/(S-1) Var) = sqrt(2 * 0.0234375); t_{1, .975} = 12.706
    e = st.paired_effect(table(), A, B, "hack", n_boot=n, seed=1, resample="nested")
    assert e.se == pytest.approx(math.sqrt(2 * 0.0234375), rel=0.02)
    assert e.ci_low == pytest.approx(0.125 - 12.7062 * e.se, rel=1e-4)
    assert e.ci_high == pytest.approx(0.125 + 12.7062 * e.se, rel=1e-4)


def closed_form_var(d: np.ndarray, n_p: np.ndarray, scheme: str) -> float:
    """Var*(D*) of the nested schemes, worked out: (1/S)[var_s(m) + mean_s(w_s^2/P_s)] (nested),
    var_s(m)/S (seed), sum_s(w_s^2/P_s)/S^2 (problem)."""
    m = np.array([d[i, :k].mean() for i, k in enumerate(n_p)])
    w2 = np.array([d[i, :k].var() for i, k in enumerate(n_p)])
    S = len(n_p)
    if scheme == "problem":
        return float((w2 / n_p).sum() / S ** 2)
    if scheme == "seed":
        return float(m.var() / S)
    return float((m.var() + (w2 / n_p).mean()) / S)


@pytest.mark.parametrize("scheme", ["nested", "seed", "problem"])
def test_nested_bootstrap_variance_matches_closed_form_unbalanced(scheme):
    rng = np.random.default_rng(3)
    n_p = np.array([5, 3, 4, 2])
    d = np.full((4, 5), np.nan)
    for i, k in enumerate(n_p):
        d[i, :k] = rng.normal(0.1 * i, 0.2, size=k)
    boot = st.cluster_bootstrap(d, n_p, 100_000, np.random.default_rng(4), scheme)
    assert boot.var() == pytest.approx(closed_form_var(d, n_p, scheme), rel=0.03)
    m = np.array([d[i, :k].mean() for i, k in enumerate(n_p)])
    assert boot.mean() == pytest.approx(m.mean(), abs=0.002)
    with pytest.raises(ValueError, match="crossed one is crossed_bootstrap"):
        st.cluster_bootstrap(d, n_p, 10, rng, "crossed")


def crossed_closed_form(d: np.ndarray) -> float:
    """Var*(D*) of the crossed bootstrap on a full grid, derived (docs/gate.md): with the two-way
    ANOVA split d = D + a_s + b_p + e_sp (ddof-0 variances), var(a)/S + var(b)/P + mean(e²)/(S P)."""
    S, P = d.shape
    a = d.mean(axis=1) - d.mean()
    b = d.mean(axis=0) - d.mean()
    e = d - d.mean() - a[:, None] - b[None, :]
    return float(a.var() / S + b.var() / P + (e ** 2).mean() / (S * P))


def test_hand_crossed_bootstrap_exact_distribution():
    """2 seeds × 2 problems: the 16 equally likely draws (two seeds, one shared pair of problems)
    enumerated here by the definition; D* = .125 + (row part) + (problem part), row part ±.125
    w.p. 1/4 each (0 w.p. 1/2), problem part ±.25 likewise. Var* = .125²/2 + .25²/2 = 5/128."""
    import itertools

    d = np.array([[0.5, 0.0], [0.25, -0.25]])
    pmf: dict[float, float] = {}
    for i1, i2, j1, j2 in itertools.product(range(2), repeat=4):
        v = round(np.mean([d[i, j] for i in (i1, i2) for j in (j1, j2)]), 12)
        pmf[v] = pmf.get(v, 0.0) + 1 / 16
    n = 40_000
    boot = st.crossed_bootstrap(d, n, np.random.default_rng(0))
    vals, counts = np.unique(np.round(boot, 12), return_counts=True)
    assert vals.tolist() == sorted(pmf)
    p = np.array([pmf[v] for v in vals])
    assert np.all(np.abs(counts / n - p) < 4.5 * np.sqrt(p * (1 - p) / n))
    assert crossed_closed_form(d) == pytest.approx(5 / 128)
    # the interval: SE = sqrt(f · Var*), f = max(2/1, 2/1) = 2; df = min(S − 1, P − 1) = 1
    e = st.paired_effect(table(), A, B, "hack", n_boot=n, seed=1)
    assert e.resample == "crossed" and e.df == 1
    assert e.se == pytest.approx(math.sqrt(2 * 5 / 128), rel=0.02)
    assert e.ci_low == pytest.approx(0.125 - 12.7062 * e.se, rel=1e-4)
    assert e.boot_terms == pytest.approx((2 * 0.125 ** 2 / 2, 2 * 0.25 ** 2 / 2, 0.0))


def test_crossed_bootstrap_variance_matches_closed_form():
    d = np.random.default_rng(7).normal(0, 0.2, (5, 7)) + np.linspace(0, 0.3, 7)[None, :]
    boot = st.crossed_bootstrap(d, 200_000, np.random.default_rng(8))
    assert boot.var() == pytest.approx(crossed_closed_form(d), rel=0.02)
    assert boot.mean() == pytest.approx(d.mean(), abs=0.002)
    dec = st.crossed_decomposition(d)
    assert sum(dec["terms"]) == pytest.approx(crossed_closed_form(d), rel=1e-12)


def test_crossed_bootstrap_with_a_missing_cell():
    """Seed 1 lacks problem p1. Enumerated by the documented rule: a drawn seed averages the drawn
    problems it has; one with none is left out; a draw with no seed left (seeds (1, 1), problems
    (p1, p1): probability 1/16) is NaN."""
    import itertools

    d = np.array([[0.5, 0.0], [0.25, np.nan]])
    pmf: dict[float, float] = {}
    for i1, i2, j1, j2 in itertools.product(range(2), repeat=4):
        ms = [np.mean(v) for v in ([d[i, j] for j in (j1, j2) if np.isfinite(d[i, j])] for i in (i1, i2)) if v]
        key = round(float(np.mean(ms)), 12) if ms else math.nan
        pmf[key] = pmf.get(key, 0.0) + 1 / 16
    n = 40_000
    boot = st.crossed_bootstrap(d, n, np.random.default_rng(2))
    assert np.isnan(boot).mean() == pytest.approx(1 / 16, abs=4.5 * math.sqrt(1 / 16 * 15 / 16 / n))
    fin = np.round(boot[np.isfinite(boot)], 12)
    for v, p in pmf.items():
        if math.isfinite(v):
            assert (fin == v).sum() / n == pytest.approx(p, abs=4.5 * math.sqrt(p * (1 - p) / n)), v
    # through paired_effect: vanilla lacks (seed 1, p1): dropped, m = (.25, .25), D = .25
    t = table()
    t = t[~((t["arm"] == "vanilla") & (t["seed"] == 1) & (t["problem_id"] == "p1"))]
    e = st.paired_effect(t, A, B, "hack", n_boot=2000, seed=0)
    assert e.value == pytest.approx(0.25) and e.dropped == (("a", 1, "p1"),)
    assert "crossed resamples had no seed with a drawn problem" in e.note


def test_pairing_drops_one_sided_cells_and_keeps_the_paired_value():
    """A problem only erase was evaluated on (all hacks) and a seed only vanilla ran: both are left
    out and named; the value stays the paired 0.125 (an unpaired mean-of-each-side would move)."""
    extra = [{"arm": "erase", "view": "trained", "seed": 0, "step": 20, "problem_id": "p9", "sample": j,
              "mode": "stdout", "hack": 1, "pass": 0, "truncated": 0} for j in range(4)]
    extra += [{"arm": "vanilla", "view": "trained", "seed": 7, "step": 20, "problem_id": "p0", "sample": j,
               "mode": "stdout", "hack": 1, "pass": 0, "truncated": 0} for j in range(4)]
    e = st.paired_effect(table(extra=extra), A, B, "hack", n_boot=200)
    assert e.value == pytest.approx(0.125)
    assert e.dropped == (("a", 0, "p9"), ("b", 7, "p0"))
    assert e.n_seeds == 2 and e.n_problems == {0: 2, 1: 2}
    assert "2 (seed, problem) on one side only" in e.note
    # mismatched problems: nothing paired is one clear error
    other = {(s, p.replace("p", "q")): v for (s, p), v in HAND.items()}
    t = table()
    t.loc[t["arm"] == "vanilla", "problem_id"] = t.loc[t["arm"] == "vanilla", "problem_id"].str.replace("p", "q")
    with pytest.raises(ValueError, match="no \\(seed, problem\\) evaluated on both"):
        st.paired_effect(t, A, B, "hack")
    assert other  # (the same table, renamed)


def test_pairing_is_by_problem_not_by_row_order():
    """Shuffling rows and renaming samples must not change anything: samples are not paired."""
    t = table().sample(frac=1.0, random_state=0)
    t["sample"] = t.groupby(["arm", "seed", "problem_id"]).cumcount() + 10
    e = st.paired_effect(t, A, B, "hack", n_boot=300, seed=5)
    ref = st.paired_effect(table(), A, B, "hack", n_boot=300, seed=5)
    assert (e.value, e.se, e.ci_low) == pytest.approx((ref.value, ref.se, ref.ci_low))


@pytest.mark.parametrize("change, match", [
    (lambda t: t.drop(columns="mode"), "missing column 'mode'"),
    (lambda t: t.assign(hack=t["hack"] * 2), "column 'hack' must be 0/1, got 2 for arm 'erase'"),
    (lambda t: t.assign(step=np.where((t["arm"] == "erase") & (t["problem_id"] == "p1"), 30, 20)),
     "arm 'erase' view 'trained' seed 0 has several steps \\[20, 30\\]"),
    (lambda t: t.assign(sample=0), "seed 0 problem 'p0' sample 0 appears more than once"),
    (lambda t: t[t["arm"] != "vanilla"], "no rows for arm 'vanilla' view 'trained'"),
])
def test_bad_outcomes_give_one_clear_error(change, match):
    with pytest.raises(ValueError, match=match):
        st.paired_effect(change(table()), A, B, "hack")


def test_bad_arguments():
    with pytest.raises(ValueError, match="metric must be one of"):
        st.paired_effect(table(), A, B, "hack_rate")
    with pytest.raises(ValueError, match="resample must be one of"):
        st.paired_effect(table(), A, B, "hack", resample=("sample",))
    with pytest.raises(ValueError, match="resample must be one of"):
        st.paired_effect(table(), A, B, "hack", resample="pigeon")
    assert st.resample_scheme(("seed", "problem")) == "nested" and st.resample_scheme("crossed") == "crossed"


def test_one_seed_has_no_interval():
    t = table()
    e = st.paired_effect(t[t["seed"] == 0], A, B, "hack", n_boot=200)
    assert e.value == pytest.approx(0.25)
    assert (e.ci_low, e.ci_high, e.mde) == (-math.inf, math.inf, math.inf) and math.isnan(e.se)
    assert "1 seed" in e.note and math.isnan(e.components.between_seed)
    assert st.needed(e, 0.0) == st.Needed(0.0, 0.25, None, None, "", None)
    assert e.to_dict()["ci_low"] is None  # JSON-safe


# ---------------------------------------------------------------------------------------------
# critical values, MDE, planning

def test_mde_uses_t_quantiles():
    # Student t table: t_{2}(.975) = 4.3027, t_{2}(.80) = 1.0607; t_{4}: 2.7764, 0.9410; normal: 1.9600, 0.8416
    assert st.mde_from_se(1.0, 2) == pytest.approx(4.3027 + 1.0607, abs=1e-3)
    assert st.mde_from_se(0.01, 4) == pytest.approx(0.01 * (2.7764 + 0.9410), abs=1e-5)
    assert st.mde_from_se(1.0, 10**7) == pytest.approx(1.9600 + 0.8416, abs=1e-3)
    assert st.mde_from_se(1.0, 0) == math.inf
    # power at the MDE is the power it was computed for
    assert st.power_lower(st.mde_from_se(0.03, 2), 0.03, 2) == pytest.approx(0.8)
    assert st.power_upper(0.0, 0.03, 4, margin=st.mde_from_se(0.03, 4)) == pytest.approx(0.8)


def test_planned_se_is_the_expected_interval_se():
    """On the crossed normal model d_sp = β_s + γ_p + ρ_sp + ε_sp (20 000 grids, closed forms worked
    out in this file): the mean of the crossed interval's SE² = f·Var*, of the nested one's, and
    the variance of D over grids are planned_se² (crossed, nested) and true_var."""
    comp = st.VarianceComponents(between_seed=0.004, between_problem=0.003, within_problem=0.4, seed_problem=0.001)
    S, P, n, R = 6, 16, 16, 20_000
    rng = np.random.default_rng(0)
    d = (rng.normal(0, math.sqrt(comp.between_seed), (R, S, 1)) + rng.normal(0, math.sqrt(comp.between_problem), (R, 1, P))
         + rng.normal(0, math.sqrt(comp.seed_problem + comp.within_problem / n), (R, S, P)))
    a = d.mean(axis=2) - d.mean(axis=(1, 2))[:, None]
    b = d.mean(axis=1) - d.mean(axis=(1, 2))[:, None]
    e = d - d.mean(axis=(1, 2))[:, None, None] - a[:, :, None] - b[:, None, :]
    f = max(S / (S - 1), P / (P - 1))
    crossed = f * (a.var(axis=1) / S + b.var(axis=1) / P + (e ** 2).mean(axis=(1, 2)) / (S * P))
    assert crossed.mean() == pytest.approx(st.planned_se(comp, S, P, n) ** 2, rel=0.02)
    m, w2 = d.mean(axis=2), d.var(axis=2)
    nested = S / (S - 1) * (m.var(axis=1) + (w2 / P).mean(axis=1)) / S
    assert nested.mean() == pytest.approx(st.planned_se(comp, S, P, n, "nested") ** 2, rel=0.02)
    true = d.mean(axis=(1, 2)).var()
    assert true == pytest.approx(st.true_var(comp, S, P, n), rel=0.03)
    assert crossed.mean() > true  # conservative
    # the point of issue 19: with a shared arm × problem term the nested SE² falls far below Var(D) at
    # 18 seeds (worked out: 0.000437 vs 0.000937), the crossed one does not
    wide = st.VarianceComponents(between_seed=0.004, between_problem=0.01, within_problem=0.4, seed_problem=0.001)
    assert st.true_var(wide, 18, P, n) == pytest.approx(0.004 / 18 + 0.01 / 16 + 0.026 / 288)
    assert st.planned_se(wide, 18, P, n, "nested") ** 2 < 0.5 * st.true_var(wide, 18, P, n)
    assert st.planned_se(wide, 18, P, n) ** 2 > st.true_var(wide, 18, P, n)
    se, mde = st.planned_mde(comp, S, P, n)
    assert st.planned_df(comp, S, P, n) == 5 and mde == pytest.approx(st.mde_from_se(se, 5))
    assert st.planned_df(comp, 18, 9, n) == 8  # min(S − 1, P − 1)
    assert st.planned_se(comp, 1, P, n) == math.inf
    with pytest.raises(ValueError, match="sizes must be >= 1"):
        st.planned_se(comp, 3, 0, 64)


def test_variance_components_are_recovered():
    """The method-of-moments estimates average to the components they were drawn from (normal
    model, the cells' sampling variance known: ē = σ_e²/n)."""
    comp = st.VarianceComponents(between_seed=0.01, between_problem=0.006, within_problem=0.4, seed_problem=0.004)
    S, P, n, R = 6, 16, 16, 1500
    rng = np.random.default_rng(1)
    est = []
    for _ in range(R):
        d = (rng.normal(0, math.sqrt(comp.between_seed), (S, 1)) + rng.normal(0, math.sqrt(comp.between_problem), (1, P))
             + rng.normal(0, math.sqrt(comp.seed_problem), (S, P)) + rng.normal(0, math.sqrt(comp.within_problem / n), (S, P)))
        c = st._components(st.crossed_decomposition(d), comp.within_problem / n, comp.within_problem)
        est.append((c.between_seed, c.between_problem, c.seed_problem))
    got = np.mean(est, axis=0)
    assert got == pytest.approx([comp.between_seed, comp.between_problem, comp.seed_problem], rel=0.12)


def make_effect(value, ci_low=None, ci_high=None, *, se=0.02, n_seeds=3, mean_b=0.5, a=A, b=B, metric="hack",
                comp=(0.002, 0.001, 0.4), n_problems=9, n_samples=64):
    df = n_seeds - 1
    hw = st.critical(df) * se if df >= 1 else math.inf
    return st.Effect(a=a, b=b, metric=metric, value=value, ci_low=value - hw if ci_low is None else ci_low,
                     ci_high=value + hw if ci_high is None else ci_high, se=se, df=df, ci=0.95, power=0.8,
                     mde=st.mde_from_se(se, df), n_seeds=n_seeds, n_problems={s: n_problems for s in range(n_seeds)},
                     n_samples=n_samples, per_seed={s: value for s in range(n_seeds)}, mean_a=mean_b - value,
                     mean_b=mean_b, components=st.VarianceComponents(*comp), pct_low=value, pct_high=value)


def test_needed_is_the_smallest_size_that_decides():
    e = make_effect(0.08, se=0.04, comp=(0.0002, 0.0005, 0.4))
    comp, P, n = e.components, 9, 64
    nd = st.needed(e, 0.0, decides="pass")
    half = lambda S, P_, n_: st.critical(st.planned_df(comp, S, P_, n_)) * st.planned_se(comp, S, P_, n_)
    assert nd.distance == pytest.approx(0.08) and nd.decides == "pass"
    assert half(nd.seeds, P, n) < 0.08 <= half(nd.seeds - 1, P, n)
    assert half(3, P, nd.samples) < 0.08 <= half(3, P, nd.samples - 1)
    assert half(3, nd.problems, n) < 0.08 <= half(3, nd.problems - 1, n)
    # run-to-run noise alone keeps the half width above the distance: samples and problems cannot decide
    big = make_effect(0.08, se=0.04, comp=(0.01, 0.001, 0.4))
    assert st.needed(big, 0.0).samples is None and st.needed(big, 0.0).problems is None
    assert st.needed(big, 0.0).seeds > 3
    # a large arm × problem term: with 9 problems no number of seeds decides (df and σ_C²/P stay), problems do
    wide = make_effect(0.08, se=0.04, comp=(0.0001, 0.02, 0.4))
    nd = st.needed(wide, 0.0)
    assert nd.seeds is None and nd.problems is not None and nd.problems > 9
    # at 3 seeds twice the seeds buys most (t on 2 df → 5 df); at 10 seeds, with the arm × problem
    # term dominating, twice the problems does (planned MDE 0.113 vs 0.154 for seeds or samples)
    assert st.plan(wide)["best"] == "seeds"
    pl = st.plan(make_effect(0.08, se=0.04, n_seeds=10, comp=(0.0001, 0.02, 0.4)))
    assert pl["best"] == "problems" and pl["problems"]["mde"] == pytest.approx(0.113, abs=5e-4)
    assert pl["seeds"]["mde"] == pytest.approx(0.154, abs=5e-4)
    assert pl["problems"]["se"] == pytest.approx(st.planned_se(wide.components, 10, 18, 64))


# ---------------------------------------------------------------------------------------------
# the decision rule, on hand-made Effects

def arm(drop, control, pass_drop, **kw):
    return st.decide_arm("erase", drop, control, pass_drop, min_drop=0.05, pass_margin=0.10, **kw)


def test_separated_needs_all_three_and_enough_seeds():
    ok = arm(make_effect(0.2), make_effect(0.15), make_effect(0.0, metric="pass"))
    assert ok.verdict == "separated" and all(c.passed for c in ok.criteria)
    # the same numbers with 2 seeds (whatever the interval says) cannot separate
    two = [make_effect(v, ci_low=v - 0.01, ci_high=v + 0.01, n_seeds=2) for v in (0.2, 0.15, 0.0)]
    a2 = arm(*two)
    assert a2.verdict != "separated" and "fewer than 3 seeds" in a2.reason
    assert a2.power_at(0.5) == 0.0
    # mean >= min_drop but the lower bound at 0: not passed; lower bound > 0 but mean < min_drop: not passed
    assert arm(make_effect(0.2, ci_low=-0.01, ci_high=0.4), make_effect(0.15),
               make_effect(0.0)).criteria[0].passed is False
    assert arm(make_effect(0.04, ci_low=0.01, ci_high=0.07), make_effect(0.15),
               make_effect(0.0)).criteria[0].passed is False


@pytest.mark.parametrize("effects, which", [
    ((0.01, 0.2, 0.0), "drop_vs_vanilla"),  # drop CI [-0.03, 0.04] < min_drop
    ((0.2, 0.0, 0.0), "beats_control"),  # the effect specific to v_hack is ruled out
    ((0.2, 0.15, 0.3), "matched_pass"),  # pass drop CI low > margin
])
def test_not_separated_when_ruled_out(effects, which):
    d, c, p = effects
    v = arm(make_effect(d, se=0.007), make_effect(c, se=0.007), make_effect(p, se=0.007, metric="pass"))
    assert v.verdict == "not_separated"
    assert [x.name for x in v.criteria if x.rules_out] == [which]


def test_inconclusive_says_what_would_decide():
    v = arm(make_effect(0.08, se=0.04), make_effect(0.08, se=0.04), make_effect(0.0, se=0.01, metric="pass"))
    assert v.verdict == "inconclusive"
    d, c, _ = v.criteria
    assert (d.needed.decides, c.needed.decides) == ("pass", "pass")
    assert v.needed_seeds == max(d.needed.seeds, c.needed.seeds) and v.needed_seeds > 3
    assert f"about {v.needed_seeds} seeds" in v.reason
    # a mean between 0 and min_drop can only be ruled out: the seeds that settle that decide
    w = arm(make_effect(0.02, se=0.04), make_effect(0.08, se=0.04), make_effect(0.0, se=0.01, metric="pass"))
    assert w.criteria[0].needed.decides == "rule_out" and w.needed_seeds == w.criteria[0].needed.seeds


def test_matched_pass_is_non_inferiority_and_flags_a_vanishing_reference():
    p = st.matched_pass(make_effect(0.02, se=0.01, metric="pass", mean_b=0.06), 0.10)
    assert p.passed and "vanilla's pass rate is itself within the absolute margin" in p.note
    assert not st.matched_pass(make_effect(0.05, ci_low=-0.02, ci_high=0.12, metric="pass"), 0.10).passed


def test_gate_positive_control_and_aggregation():
    # sep's p-value is its control's, t = 7.5 on 2 df: 0.0087 (x 2 arms = 0.017 < 0.025 after Holm)
    sep = arm(make_effect(0.2), make_effect(0.15), make_effect(0.0, se=0.01))
    assert sep.p_value == pytest.approx(0.5 - 7.5 / (2 * math.sqrt(2 + 7.5 ** 2)))
    out = arm(make_effect(0.01, se=0.007), make_effect(0.0, se=0.007), make_effect(0.0, se=0.007))
    inc = arm(make_effect(0.08, se=0.04), make_effect(0.08, se=0.04), make_effect(0.0, se=0.01))
    pc_ok = make_effect(0.3, a=("oracle_reward", "trained"))
    pc_bad = make_effect(0.3, se=0.1, a=("oracle_reward", "trained"))
    g = st.decide_gate([sep, out], pc_bad, min_drop=0.05)
    assert (g.verdict, g.underpowered) == ("inconclusive", True) and "oracle_reward" in g.reason
    assert st.decide_gate([sep, out], pc_ok, min_drop=0.05).verdict == "separated"
    assert st.decide_gate([out, out], pc_ok, min_drop=0.05).verdict == "not_separated"
    assert st.decide_gate([out, inc], pc_ok, min_drop=0.05).verdict == "inconclusive"
    assert "no positive control" in st.decide_gate([sep], None, min_drop=0.05).reason
    # a positive control with too few seeds cannot pass either
    two = make_effect(0.3, ci_low=0.29, ci_high=0.31, n_seeds=2, a=("oracle_reward", "trained"))
    g2 = st.decide_gate([sep], two, min_drop=0.05)
    assert g2.underpowered and g2.too_few_seeds and g2.reason.startswith("inconclusive (too few seeds): 2 seeds")
    assert not g.too_few_seeds  # pc_bad fails on its interval, with enough seeds
    with pytest.raises(ValueError, match="at least one projected arm"):
        st.decide_gate([], pc_ok, min_drop=0.05)
    import json
    json.dumps(g.to_dict(), allow_nan=False)
    d = json.loads(json.dumps(st.decide_gate([sep], pc_ok, min_drop=0.05).to_dict(), allow_nan=False))
    crit = d["arms"]["erase"]["criteria"][0]
    assert crit["name"] == "drop_vs_vanilla" and crit["note"].startswith("hack drop vs vanilla 0.200")
    assert crit["effect"]["value"] == pytest.approx(0.2) and crit["effect"]["a"] == ["erase", "trained"]


def test_p_values_agree_with_the_intervals():
    """p < (1 − ci)/2 exactly when the interval excludes the bound (one-sided t, df 2: t_{2,.975} = 4.3027)."""
    e = make_effect(0.1, se=0.1 / 4.3027 * 0.999)
    assert e.ci_low > 0 and st.p_lower(e) < 0.025
    e = make_effect(0.1, se=0.1 / 4.3027 * 1.001)
    assert e.ci_low < 0 and st.p_lower(e) > 0.025
    assert st.p_lower(make_effect(0.0, se=0.05)) == pytest.approx(0.5)
    u = make_effect(0.02, se=0.01, metric="pass")
    assert (u.ci_high <= 0.10) and st.p_upper(u, 0.10) < 0.025  # (0.02 − 0.10)/0.01 = −8 on 2 df
    assert st.p_upper(u, 0.10) == pytest.approx(0.0076, abs=2e-4)


def test_relative_pass_margin_by_hand():
    """Vanilla passes 0.135 (the embedded default's rate). With r = 0.5 the relative margin is
    0.0675 points, below the absolute 0.10: relative binds. A drop of 0.05 with upper bound 0.09
    passes the absolute margin; its contrast drop − 0.5 × vanilla = 0.05 − 0.0675 = −0.0175 with
    upper bound 0.02 > 0 fails the relative one. At vanilla 0.4 the relative margin is 0.20 and
    the absolute binds."""
    drop = make_effect(0.05, ci_low=0.01, ci_high=0.09, metric="pass", mean_b=0.135)
    rel = make_effect(-0.0175, ci_low=-0.055, ci_high=0.02, metric="pass", mean_b=0.135)
    c = st.matched_pass(drop, 0.10, rel_effect=rel, pass_margin_rel=0.5)
    assert c.binding == "relative" and not c.passed and not c.rules_out
    assert "0.5 × vanilla's pass rate 0.135 = 0.068 (relative; relative binds)" in c.note
    assert c.to_dict()["margin_rel_points"] == pytest.approx(0.0675)
    assert st.matched_pass(drop, 0.10).passed  # the absolute margin alone passes it
    ok = make_effect(-0.04, ci_low=-0.07, ci_high=-0.01, metric="pass", mean_b=0.135)
    assert st.matched_pass(drop, 0.10, rel_effect=ok, pass_margin_rel=0.5).passed
    out = make_effect(0.03, ci_low=0.005, ci_high=0.055, metric="pass", mean_b=0.135)
    assert st.matched_pass(drop, 0.10, rel_effect=out, pass_margin_rel=0.5).rules_out
    high = make_effect(0.05, ci_low=0.01, ci_high=0.09, metric="pass", mean_b=0.4)
    assert st.matched_pass(high, 0.10, rel_effect=ok, pass_margin_rel=0.5).binding == "absolute"
    with pytest.raises(ValueError, match="both rel_effect and pass_margin_rel"):
        st.matched_pass(drop, 0.10, rel_effect=ok)
    # the contrast itself, on the hand table (pass = 1 − hack): d = 0.5·p_vanilla − p_erase per cell
    # = (−.75, −.375 | −.375, .125): seed means −.5625, −.125, D = −.34375 = drop (−.125) − .5 × .4375
    e = st.paired_effect(table(), A, B, "pass", n_boot=200, weight_b=0.5)
    assert e.value == pytest.approx(-0.34375) and e.per_seed == pytest.approx({0: -0.5625, 1: -0.125})


def test_holm_by_hand():
    """Four arms each separated at p ≈ 0.02 (< 0.025 unadjusted): Holm multiplies the smallest by 4
    (0.08 > 0.025), so none stays separated; one arm at p 0.004 (× 4 = 0.016) would."""
    assert st.holm([0.01, 0.04, 0.03, 0.005]) == pytest.approx([0.03, 0.06, 0.06, 0.02])

    def arm_at(t):  # beats_control with t statistic t on 20 df; the rest passes clearly
        return arm(make_effect(0.3, se=0.01, n_seeds=21), make_effect(0.02 * t, se=0.02, n_seeds=21),
                   make_effect(0.0, se=0.01, n_seeds=21, metric="pass"))
    from scipy import stats as sps

    t02, t004 = sps.t.isf(0.02, 20), sps.t.isf(0.004, 20)
    arms = [arm_at(t02) for _ in range(4)]
    assert all(a.verdict == "separated" for a in arms) and arms[0].p_value == pytest.approx(0.02, rel=1e-6)
    pc = make_effect(0.3, n_seeds=21, a=("oracle_reward", "trained"))
    g = st.decide_gate(arms, pc, min_drop=0.05)
    assert g.verdict == "inconclusive" and all(a.verdict == "inconclusive" for a in g.arms)
    assert g.arms[0].p_adjusted == pytest.approx(0.08, rel=1e-6) and g.arms[0].family == 4
    assert "not after Holm's correction for 4 treatment arms" in g.arms[0].reason
    assert st.decide_gate(arms, pc, min_drop=0.05, multiplicity="none").verdict == "separated"
    g = st.decide_gate([arm_at(t004)] + arms[1:], pc, min_drop=0.05)
    assert [a.verdict for a in g.arms] == ["separated"] + ["inconclusive"] * 3 and g.verdict == "separated"
    with pytest.raises(ValueError, match="multiplicity must be one of"):
        st.decide_gate(arms, pc, min_drop=0.05, multiplicity="bonf")


def test_holm_keeps_the_family_wise_rate_with_four_null_arms():
    """Four arms whose beats_control statistic is an exact null t (10 df), everything else passing:
    unadjusted, 'any arm separated' happens 1 − 0.975⁴ ≈ 0.096 of the time; after Holm at most 0.025."""
    rng = np.random.default_rng(0)
    N, K = 1500, 4
    any_raw = any_holm = 0
    pc = make_effect(0.3, n_seeds=11, a=("oracle_reward", "trained"))
    for t in rng.standard_t(10, size=(N, K)):
        arms = [arm(make_effect(0.3, se=0.01, n_seeds=11), make_effect(0.01 * x, se=0.01, n_seeds=11),
                    make_effect(0.0, se=0.01, n_seeds=11, metric="pass")) for x in t]
        any_raw += any(a.verdict == "separated" for a in arms)
        any_holm += st.decide_gate(arms, pc, min_drop=0.05).verdict == "separated"
    assert any_raw / N == pytest.approx(1 - 0.975 ** K, abs=3 * math.sqrt(0.096 * 0.904 / N))
    assert any_holm / N <= NOMINAL_LOWER + slack(NOMINAL_LOWER, N)


# ---------------------------------------------------------------------------------------------
# the generator

def test_generator_shape_and_planted_drops():
    cells = {B: st.Planted(), A: st.Planted(0.15, 0.05), ("erase", "ablated"): st.Planted()}
    o = st.simulate_outcomes(cells, n_seeds=2, n_problems=3, n_samples=5, rng=1)
    assert list(o.columns) == list(st.OUTCOME_COLUMNS) and len(o) == 3 * 2 * 3 * 5
    assert set(o["mode"]) == {"stdout", "raise"} and o[["hack", "pass", "truncated"]].isin([0, 1]).all().all()
    # without seed/run noise and with many problems, the marginal drops come out as planted
    big = st.simulate_outcomes({B: st.Planted(), A: st.Planted(0.15, 0.05)}, n_seeds=1, n_problems=4000,
                               n_samples=8, seed_sd=0.0, run_sd=0.0, rng=2)
    rate = big.groupby("arm")[["hack", "pass"]].mean()
    assert rate.loc["vanilla", "hack"] - rate.loc["erase", "hack"] == pytest.approx(0.15, abs=0.015)
    assert rate.loc["vanilla", "pass"] - rate.loc["erase", "pass"] == pytest.approx(0.05, abs=0.01)
    assert rate.loc["vanilla", "hack"] == pytest.approx(0.5, abs=0.02)
    with pytest.raises(ValueError, match="cannot plant a drop of 0.6"):
        st.simulate_outcomes({B: st.Planted(), A: st.Planted(0.6)}, rng=0)
    with pytest.raises(ValueError, match="unknown spread"):
        st.simulate_counts({B: st.Planted()}, problem_spread=1.0)


def test_arm_by_problem_effect_is_shared_across_seeds():
    """g_{arm,p} is the same in every seed: two seeds' per-problem differences between two arms agree
    (correlation near 1 with only that term and many samples); the run × problem term h does not."""
    def seed_corr(**spread):
        base = dict(problem_sd=0.0, seed_sd=0.0, run_sd=0.0, arm_problem_sd=0.0, run_problem_sd=0.0)
        c = st.simulate_counts({B: st.Planted(), A: st.Planted()}, n_seeds=2, n_problems=400, n_samples=2000,
                               rng=3, **{**base, **spread})["hack"] / 2000
        d = c[1] - c[0]                                             # seeds × problems
        return np.corrcoef(d[0], d[1])[0, 1]
    assert seed_corr(arm_problem_sd=0.5) > 0.9
    assert abs(seed_corr(run_problem_sd=0.5)) < 0.15


def test_fast_simulation_path_equals_the_table_path():
    """simulate_gate's effects (effect_from_cells on counts) are paired_effect's on the same data
    written out as a per-completion table."""
    cells = {B: st.Planted(), A: st.Planted(0.1)}
    cnt = st.simulate_counts(cells, n_seeds=3, n_problems=5, n_samples=6, rng=4)
    rows = []
    for c, (arm_, view) in enumerate(cells):
        for s_ in range(3):
            for p in range(5):
                k = cnt["hack"][c, s_, p]
                for j in range(6):
                    rows.append({"arm": arm_, "view": view, "seed": s_, "step": 1, "problem_id": f"p{p:03d}",
                                 "sample": j, "mode": "m", "hack": int(j < k), "pass": 0, "truncated": 0})
    t = pd.DataFrame(rows).sample(frac=1.0, random_state=0)
    slow = st.paired_effect(t, A, B, "hack", n_boot=300, seed=9)
    full = np.full((3, 5), 6)
    fast = st.effect_from_cells(A, B, "hack", [0, 1, 2], [f"p{p:03d}" for p in range(5)], cnt["hack"][1], full,
                                cnt["hack"][0], full, n_boot=300, seed=9)
    assert (fast.value, fast.se, fast.ci_low, fast.df, fast.components) == (slow.value, slow.se, slow.ci_low, slow.df,
                                                                          slow.components)


# ---------------------------------------------------------------------------------------------
# the gate, tested on synthetic experiments at the default sizes (3 seeds, 9 problems, 64 samples)

@pytest.fixture(scope="module")
def null():
    return st.simulate_gate(N_NULL, n_boot=N_BOOT, seed=11)


@pytest.fixture(scope="module")
def planted():
    return st.simulate_gate(N_ALT, drop=0.15, n_boot=N_BOOT, seed=12)


def test_null_false_positive_rate_is_at_most_nominal(null):
    assert (null["verdict"] == "separated").mean() <= NOMINAL_LOWER + slack(NOMINAL_LOWER, N_NULL)
    assert (null["gate"] == "separated").mean() <= NOMINAL_LOWER + slack(NOMINAL_LOWER, N_NULL)
    # each lower-bound criterion alone at most its one-sided nominal 2.5%
    for name in ("drop_vs_vanilla", "beats_control"):
        assert null[f"{name}_passed"].mean() <= NOMINAL_LOWER + slack(NOMINAL_LOWER, N_NULL)
    # the positive control (planted 0.3) separates at least as often as its plug-in power says; with
    # crossed intervals at 3 seeds × 9 problems that is only ~1/3 of the time (measured 0.355: t on
    # min(S − 1, P − 1) = 2 df, and the arm × problem term no longer averages out over seeds)
    pc_rate = ((null["pc_value"] >= 0.05) & (null["pc_ci_low"] > 0)).mean()
    # the plug-in power overstates it (0.45: with 2 df the SE is itself noisy), by less than 0.15
    reported = np.mean([st.power_lower(0.3, se, df, floor=0.05) for se, df in zip(null["pc_se"], null["pc_df"])])
    assert 0.2 < pc_rate < 0.6 and reported - 0.15 < pc_rate < reported


def test_without_the_lower_bound_the_false_positive_rate_exceeds_nominal(null):
    """What keeps the rate down is the interval: the point thresholds alone (the old gate: mean drop
    >= min_drop, mean beats the control) say 'passed' far more often than nominal with no effect."""
    assert (null["drop_value"] >= 0.05).mean() > NOMINAL + slack(NOMINAL, N_NULL)
    assert (null["control_value"] > 0).mean() > 0.3


def test_percentile_interval_is_anti_conservative_with_three_seeds(null):
    """The plain percentile interval of the same bootstrap excludes 0 too often; the t interval
    (checked above) does not."""
    assert (null["control_pct_low"] > 0).mean() > NOMINAL_LOWER + slack(NOMINAL_LOWER, N_NULL)


def test_without_the_seed_level_the_false_positive_rate_exceeds_nominal():
    """Resampling problems only treats run-to-run noise as absent: with the default run-level
    spread its lower bound excludes 0 several times more often than nominal."""
    only_p = st.simulate_gate(N_AUX, n_boot=N_BOOT, seed=13, resample="problem", with_power=False)
    assert (only_p["control_ci_low"] > 0).mean() > NOMINAL_LOWER + 3 * slack(NOMINAL_LOWER, N_AUX)


def test_default_components_are_what_the_generator_gives(null):
    """DEFAULT_COMPONENTS re-measured (mean of the estimates over the null experiments)."""
    c = st.DEFAULT_COMPONENTS
    assert null["drop_between_seed"].mean() == pytest.approx(c.between_seed, rel=0.25)
    assert null["drop_between_problem"].mean() == pytest.approx(c.between_problem, rel=0.25)
    assert null["drop_within_problem"].mean() == pytest.approx(c.within_problem, rel=0.05)
    assert null["drop_seed_problem"].mean() == pytest.approx(c.seed_problem, rel=0.5, abs=0.001)


def test_planted_drop_is_found_at_least_at_the_reported_power(planted):
    rate = (planted["verdict"] == "separated").mean()
    reported = planted["power"].mean()
    assert rate >= reported - slack(reported, N_ALT)


# ---------------------------------------------------------------------------------------------
# the crossed design at 3, 6, 10 and 18 seeds (16 held-out problems × 16 samples, make run's size;
# default spread, with the arm × problem effect shared across seeds)

N_SEEDS_NULL = 500
CROSSED = dict(n_problems=16, n_samples=16, n_boot=300, with_power=False)


@pytest.mark.parametrize("n_seeds", [3, 6, 10, 18])
def test_crossed_false_positive_rate_at_most_nominal(n_seeds):
    """With no true effect, each lower-bound criterion and the whole separated rule stay at or
    under the one-sided nominal 0.025, and the crossed SE does not understate the variance of D
    over experiments (mean SE² ≥ 0.9 Var(D); the interval is a little conservative by design)."""
    r = st.simulate_gate(N_SEEDS_NULL, n_seeds=n_seeds, seed=100 + n_seeds, **CROSSED)
    bound = NOMINAL_LOWER + slack(NOMINAL_LOWER, N_SEEDS_NULL)
    assert (r["drop_ci_low"] > 0).mean() <= bound
    assert (r["control_ci_low"] > 0).mean() <= bound
    assert (r["verdict"] == "separated").mean() <= bound
    for k in ("drop", "control"):
        assert (r[f"{k}_se"] ** 2).mean() >= 0.9 * r[f"{k}_value"].var()


def test_nested_scheme_exceeds_nominal_at_18_seeds():
    """The old nested scheme on the same model: its SE misses the shared arm × problem term, so at 18
    seeds its lower bound excludes 0 several times the nominal rate (issue 19 measured 0.07–0.16)."""
    r = st.simulate_gate(N_SEEDS_NULL, n_seeds=18, seed=118, resample="nested", **CROSSED)
    bound = NOMINAL_LOWER + slack(NOMINAL_LOWER, N_SEEDS_NULL)
    assert (r["control_ci_low"] > 0).mean() > bound and (r["drop_ci_low"] > 0).mean() > bound
    assert (r["control_se"] ** 2).mean() < 0.6 * r["control_value"].var()


def test_planning_predicts_the_se_at_more_seeds_and_more_problems():
    """Components estimated at 6 seeds × 16 problems predict (planned_se) the mean SE² the gate
    then shows at 12 seeds and at 32 problems, and true_var the variance of D over experiments."""
    base = st.simulate_gate(200, n_seeds=6, seed=21, **CROSSED)
    comp = st.VarianceComponents(*(base[f"control_{f}"].mean() for f in
                                   ("between_seed", "between_problem", "within_problem", "seed_problem")))
    assert (base["control_se"] ** 2).mean() == pytest.approx(st.planned_se(comp, 6, 16, 16) ** 2, rel=0.15)
    for S, P in ((12, 16), (6, 32)):
        r = st.simulate_gate(200, n_seeds=S, seed=22 + S + P, **{**CROSSED, "n_problems": P})
        assert (r["control_se"] ** 2).mean() == pytest.approx(st.planned_se(comp, S, P, 16) ** 2, rel=0.15), (S, P)
        assert r["control_value"].var() == pytest.approx(st.true_var(comp, S, P, 16), rel=0.3), (S, P)


def test_side_rate_by_hand():
    """One arm's rate: mean over seeds of the mean over problems of the per-problem rates."""
    from evil_moe.stats import side_rate

    rows = []
    # seed 0: p1 2/4 hacks, p2 0/2; seed 1: p1 4/4, p2 1/2 → (0.5 + 0) / 2 = 0.25 and (1 + .5) / 2 = 0.75
    for seed, prob, hacks in ((0, "p1", [1, 1, 0, 0]), (0, "p2", [0, 0]), (1, "p1", [1, 1, 1, 1]), (1, "p2", [1, 0])):
        for j, h in enumerate(hacks):
            rows.append({"arm": "x", "view": "trained", "seed": seed, "step": 3, "problem_id": prob, "sample": j,
                         "mode": "m", "hack": h, "pass": 0, "truncated": 0})
    e = side_rate(pd.DataFrame(rows), ("x", "trained"), "hack", n_boot=200)
    assert e.value == pytest.approx(0.5) and e.per_seed == {0: pytest.approx(0.25), 1: pytest.approx(0.75)}
    assert e.ci_low < 0.5 < e.ci_high and e.n_seeds == 2
    with pytest.raises(ValueError, match="no rows for arm 'y'"):
        side_rate(pd.DataFrame(rows), ("y", "trained"), "hack")


def test_operating_characteristics_table():
    tab = st.operating_characteristics(4, seeds=(3,), n_boot=100)
    assert list(tab["resample"]) == ["crossed", "nested"] and set(tab["n_seeds"]) == {3}
    row = tab.iloc[0]
    assert (row["n_problems"], row["n_samples"]) == (16, 16)
    assert 0 <= row["fpr_separated"] <= 1 and 0 <= row["power_separated"] <= 1
    assert row["binomial_se"] == pytest.approx(math.sqrt(0.025 * 0.975 / 4))
