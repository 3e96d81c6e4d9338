"""The gate's paired effects (evil_moe/gate/effects.py): the point estimate, the bootstrap
schemes against their closed forms, pairing, errors and the variance components, by hand."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from evil_moe.gate import bootstrap, effects, power, sizing
from gate_util import A, B, HAND, table


def test_hand_point_estimate_and_variance_components():
    e = effects.paired_effect(table(), A, B, "hack", n_boot=200, seed=0)
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
    assert effects.paired_effect(table(), A, B, "pass", n_boot=200).value == pytest.approx(-0.125)


def test_hand_nested_bootstrap_support_and_distribution():
    """Each drawn seed's mean m* takes -0.25, 0, 0.25, 0.5 with probabilities 1, 3, 3, 1 (/8):
    seed 0's problems give {0.5, 0} -> m* in {0.5, 0.25, 0.25, 0}, seed 1's {0.25, -0.25} ->
    {0.25, 0, 0, -0.25}, each seed drawn w.p. 1/2. D* = (m*_1 + m*_2)/2 = -0.25 + 0.125 Bin(6, 1/2)."""
    d = np.array([[0.5, 0.0], [0.25, -0.25]])
    n = 40_000
    boot = bootstrap.cluster_bootstrap(d, np.array([2, 2]), n, np.random.default_rng(0), "nested")
    support = [-0.25, -0.125, 0.0, 0.125, 0.25, 0.375, 0.5]
    pmf = np.array([1, 6, 15, 20, 15, 6, 1]) / 64
    vals, counts = np.unique(np.round(boot, 12), return_counts=True)
    assert vals.tolist() == support
    assert np.all(np.abs(counts / n - pmf) < 4.5 * np.sqrt(pmf * (1 - pmf) / n))
    # without the seed level (problems resampled within each fixed seed) the support differs:
    # m*_0 in {0, .25, .5} and m*_1 in {-.25, 0, .25} always both appear
    only_p = bootstrap.cluster_bootstrap(d, np.array([2, 2]), 2000, np.random.default_rng(0), ("problem",))
    assert set(np.round(only_p, 12)) == {-0.125, 0.0, 0.125, 0.25, 0.375}
    # Var(D*) = 0.125^2 * 6/4; SE = sqrt(S/(S-1) Var) = sqrt(2 * 0.0234375); t_{1, .975} = 12.706
    e = effects.paired_effect(table(), A, B, "hack", n_boot=n, seed=1, resample="nested")
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
    boot = bootstrap.cluster_bootstrap(d, n_p, 100_000, np.random.default_rng(4), scheme)
    assert boot.var() == pytest.approx(closed_form_var(d, n_p, scheme), rel=0.03)
    m = np.array([d[i, :k].mean() for i, k in enumerate(n_p)])
    assert boot.mean() == pytest.approx(m.mean(), abs=0.002)
    with pytest.raises(ValueError, match="crossed one is crossed_bootstrap"):
        bootstrap.cluster_bootstrap(d, n_p, 10, rng, "crossed")


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
    boot = bootstrap.crossed_bootstrap(d, n, np.random.default_rng(0))
    vals, counts = np.unique(np.round(boot, 12), return_counts=True)
    assert vals.tolist() == sorted(pmf)
    p = np.array([pmf[v] for v in vals])
    assert np.all(np.abs(counts / n - p) < 4.5 * np.sqrt(p * (1 - p) / n))
    assert crossed_closed_form(d) == pytest.approx(5 / 128)
    # the interval: SE = sqrt(f · Var*), f = max(2/1, 2/1) = 2; df = min(S − 1, P − 1) = 1
    e = effects.paired_effect(table(), A, B, "hack", n_boot=n, seed=1)
    assert e.resample == "crossed" and e.df == 1
    assert e.se == pytest.approx(math.sqrt(2 * 5 / 128), rel=0.02)
    assert e.ci_low == pytest.approx(0.125 - 12.7062 * e.se, rel=1e-4)
    assert e.boot_terms == pytest.approx((2 * 0.125 ** 2 / 2, 2 * 0.25 ** 2 / 2, 0.0))


def test_crossed_bootstrap_variance_matches_closed_form():
    d = np.random.default_rng(7).normal(0, 0.2, (5, 7)) + np.linspace(0, 0.3, 7)[None, :]
    boot = bootstrap.crossed_bootstrap(d, 200_000, np.random.default_rng(8))
    assert boot.var() == pytest.approx(crossed_closed_form(d), rel=0.02)
    assert boot.mean() == pytest.approx(d.mean(), abs=0.002)
    dec = effects.crossed_decomposition(d)
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
    boot = bootstrap.crossed_bootstrap(d, n, np.random.default_rng(2))
    assert np.isnan(boot).mean() == pytest.approx(1 / 16, abs=4.5 * math.sqrt(1 / 16 * 15 / 16 / n))
    fin = np.round(boot[np.isfinite(boot)], 12)
    for v, p in pmf.items():
        if math.isfinite(v):
            assert (fin == v).sum() / n == pytest.approx(p, abs=4.5 * math.sqrt(p * (1 - p) / n)), v
    # through paired_effect: vanilla lacks (seed 1, p1): dropped, m = (.25, .25), D = .25
    t = table()
    t = t[~((t["arm"] == "vanilla") & (t["seed"] == 1) & (t["problem_id"] == "p1"))]
    e = effects.paired_effect(t, A, B, "hack", n_boot=2000, seed=0)
    assert e.value == pytest.approx(0.25) and e.dropped == (("a", 1, "p1"),)
    assert "crossed resamples had no seed with a drawn problem" in e.note


def test_pairing_drops_one_sided_cells_and_keeps_the_paired_value():
    """A problem only erase was evaluated on (all hacks) and a seed only vanilla ran: both are left
    out and named; the value stays the paired 0.125 (an unpaired mean-of-each-side would move)."""
    extra = [{"arm": "erase", "view": "trained", "seed": 0, "step": 20, "problem_id": "p9", "sample": j,
              "mode": "stdout", "hack": 1, "pass": 0, "truncated": 0} for j in range(4)]
    extra += [{"arm": "vanilla", "view": "trained", "seed": 7, "step": 20, "problem_id": "p0", "sample": j,
               "mode": "stdout", "hack": 1, "pass": 0, "truncated": 0} for j in range(4)]
    e = effects.paired_effect(table(extra=extra), A, B, "hack", n_boot=200)
    assert e.value == pytest.approx(0.125)
    assert e.dropped == (("a", 0, "p9"), ("b", 7, "p0"))
    assert e.n_seeds == 2 and e.n_problems == {0: 2, 1: 2}
    assert "2 (seed, problem) on one side only" in e.note
    # mismatched problems: nothing paired is one clear error
    other = {(s, p.replace("p", "q")): v for (s, p), v in HAND.items()}
    t = table()
    t.loc[t["arm"] == "vanilla", "problem_id"] = t.loc[t["arm"] == "vanilla", "problem_id"].str.replace("p", "q")
    with pytest.raises(ValueError, match="no \\(seed, problem\\) evaluated on both"):
        effects.paired_effect(t, A, B, "hack")
    assert other  # (the same table, renamed)


def test_pairing_is_by_problem_not_by_row_order():
    """Shuffling rows and renaming samples must not change anything: samples are not paired."""
    t = table().sample(frac=1.0, random_state=0)
    t["sample"] = t.groupby(["arm", "seed", "problem_id"]).cumcount() + 10
    e = effects.paired_effect(t, A, B, "hack", n_boot=300, seed=5)
    ref = effects.paired_effect(table(), A, B, "hack", n_boot=300, seed=5)
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
        effects.paired_effect(change(table()), A, B, "hack")


def test_bad_arguments():
    with pytest.raises(ValueError, match="metric must be one of"):
        effects.paired_effect(table(), A, B, "hack_rate")
    with pytest.raises(ValueError, match="resample must be one of"):
        effects.paired_effect(table(), A, B, "hack", resample=("sample",))
    with pytest.raises(ValueError, match="resample must be one of"):
        effects.paired_effect(table(), A, B, "hack", resample="pigeon")
    assert power.resample_scheme(("seed", "problem")) == "nested" and power.resample_scheme("crossed") == "crossed"


def test_one_seed_has_no_interval():
    t = table()
    e = effects.paired_effect(t[t["seed"] == 0], A, B, "hack", n_boot=200)
    assert e.value == pytest.approx(0.25)
    assert (e.ci_low, e.ci_high, e.mde) == (-math.inf, math.inf, math.inf) and math.isnan(e.se)
    assert "1 seed" in e.note and math.isnan(e.components.between_seed)
    assert sizing.needed(e, 0.0) == sizing.Needed(0.0, 0.25, None, None, "", None)
    assert e.to_dict()["ci_low"] is None  # JSON-safe


def test_variance_components_are_recovered():
    """The method-of-moments estimates average to the components they were drawn from (normal
    model, the cells' sampling variance known: ē = σ_e²/n)."""
    comp = power.VarianceComponents(between_seed=0.01, between_problem=0.006, within_problem=0.4, seed_problem=0.004)
    S, P, n, R = 6, 16, 16, 1500
    rng = np.random.default_rng(1)
    est = []
    for _ in range(R):
        d = (rng.normal(0, math.sqrt(comp.between_seed), (S, 1)) + rng.normal(0, math.sqrt(comp.between_problem), (1, P))
             + rng.normal(0, math.sqrt(comp.seed_problem), (S, P)) + rng.normal(0, math.sqrt(comp.within_problem / n), (S, P)))
        c = effects._components(effects.crossed_decomposition(d), comp.within_problem / n, comp.within_problem)
        est.append((c.between_seed, c.between_problem, c.seed_problem))
    got = np.mean(est, axis=0)
    assert got == pytest.approx([comp.between_seed, comp.between_problem, comp.seed_problem], rel=0.12)


def test_side_rate_by_hand():
    """One arm's rate: mean over seeds of the mean over problems of the per-problem rates."""
    rows = []
    # seed 0: p1 2/4 hacks, p2 0/2; seed 1: p1 4/4, p2 1/2 → (0.5 + 0) / 2 = 0.25 and (1 + .5) / 2 = 0.75
    for seed, prob, hacks in ((0, "p1", [1, 1, 0, 0]), (0, "p2", [0, 0]), (1, "p1", [1, 1, 1, 1]), (1, "p2", [1, 0])):
        for j, h in enumerate(hacks):
            rows.append({"arm": "x", "view": "trained", "seed": seed, "step": 3, "problem_id": prob, "sample": j,
                         "mode": "m", "hack": h, "pass": 0, "truncated": 0})
    e = effects.side_rate(pd.DataFrame(rows), ("x", "trained"), "hack", n_boot=200)
    assert e.value == pytest.approx(0.5) and e.per_seed == {0: pytest.approx(0.25), 1: pytest.approx(0.75)}
    assert e.ci_low < 0.5 < e.ci_high and e.n_seeds == 2
    with pytest.raises(ValueError, match="no rows for arm 'y'"):
        effects.side_rate(pd.DataFrame(rows), ("y", "trained"), "hack")
