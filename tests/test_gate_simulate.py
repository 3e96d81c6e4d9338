"""The generator and the gate simulated on it (evil_moe/gate/simulate.py): planted drops come
out as planted, the fast path equals the table path, and the gate's false-positive rate and
power at the default sizes and in the crossed design at 3 to 18 seeds (deterministic seeds)."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from evil_moe.gate import effects, power, simulate
from evil_moe.pilots import OUTCOME_COLUMNS
from gate_util import A, B, CROSSED, NOMINAL, NOMINAL_LOWER, slack


# Simulation sizes (slack: tests/gate_util.py).
N_NULL, N_ALT, N_AUX = 400, 400, 200
N_BOOT = 500


# ---------------------------------------------------------------------------------------------
# the generator

def test_generator_shape_and_planted_drops():
    cells = {B: simulate.Planted(), A: simulate.Planted(0.15, 0.05), ("erase", "ablated"): simulate.Planted()}
    o = simulate.simulate_outcomes(cells, n_seeds=2, n_problems=3, n_samples=5, rng=1)
    assert list(o.columns) == list(OUTCOME_COLUMNS) and len(o) == 3 * 2 * 3 * 5
    assert set(o["mode"]) == {"stdout", "raise"} and o[["hack", "pass", "truncated"]].isin([0, 1]).all().all()
    # without seed/run noise and with many problems, the marginal drops come out as planted
    big = simulate.simulate_outcomes({B: simulate.Planted(), A: simulate.Planted(0.15, 0.05)}, n_seeds=1, n_problems=4000,
                               n_samples=8, seed_sd=0.0, run_sd=0.0, rng=2)
    rate = big.groupby("arm")[["hack", "pass"]].mean()
    assert rate.loc["vanilla", "hack"] - rate.loc["erase", "hack"] == pytest.approx(0.15, abs=0.015)
    assert rate.loc["vanilla", "pass"] - rate.loc["erase", "pass"] == pytest.approx(0.05, abs=0.01)
    assert rate.loc["vanilla", "hack"] == pytest.approx(0.5, abs=0.02)
    with pytest.raises(ValueError, match="cannot plant a drop of 0.6"):
        simulate.simulate_outcomes({B: simulate.Planted(), A: simulate.Planted(0.6)}, rng=0)
    with pytest.raises(ValueError, match="unknown spread"):
        simulate.simulate_counts({B: simulate.Planted()}, problem_spread=1.0)


def test_arm_by_problem_effect_is_shared_across_seeds():
    """g_{arm,p} is the same in every seed: two seeds' per-problem differences between two arms agree
    (correlation near 1 with only that term and many samples); the run × problem term h does not."""
    def seed_corr(**spread):
        base = dict(problem_sd=0.0, seed_sd=0.0, run_sd=0.0, arm_problem_sd=0.0, run_problem_sd=0.0)
        c = simulate.simulate_counts({B: simulate.Planted(), A: simulate.Planted()}, n_seeds=2, n_problems=400, n_samples=2000,
                               rng=3, **{**base, **spread})["hack"] / 2000
        d = c[1] - c[0]                                             # seeds × problems
        return np.corrcoef(d[0], d[1])[0, 1]
    assert seed_corr(arm_problem_sd=0.5) > 0.9
    assert abs(seed_corr(run_problem_sd=0.5)) < 0.15


def test_fast_simulation_path_equals_the_table_path():
    """simulate_gate's effects (effect_from_cells on counts) are paired_effect's on the same data
    written out as a per-completion table."""
    cells = {B: simulate.Planted(), A: simulate.Planted(0.1)}
    cnt = simulate.simulate_counts(cells, n_seeds=3, n_problems=5, n_samples=6, rng=4)
    rows = []
    for c, (arm_, view) in enumerate(cells):
        for s_ in range(3):
            for p in range(5):
                k = cnt["hack"][c, s_, p]
                for j in range(6):
                    rows.append({"arm": arm_, "view": view, "seed": s_, "step": 1, "problem_id": f"p{p:03d}",
                                 "sample": j, "mode": "m", "hack": int(j < k), "pass": 0, "truncated": 0})
    t = pd.DataFrame(rows).sample(frac=1.0, random_state=0)
    slow = effects.paired_effect(t, A, B, "hack", n_boot=300, seed=9)
    full = np.full((3, 5), 6)
    fast = effects.effect_from_cells(A, B, "hack", [0, 1, 2], [f"p{p:03d}" for p in range(5)], cnt["hack"][1], full,
                                cnt["hack"][0], full, n_boot=300, seed=9)
    assert (fast.value, fast.se, fast.ci_low, fast.df, fast.components) == (slow.value, slow.se, slow.ci_low, slow.df,
                                                                          slow.components)


# ---------------------------------------------------------------------------------------------
# the gate, tested on synthetic experiments at the default sizes (3 seeds, 9 problems, 64 samples)

@pytest.fixture(scope="module")
def null():
    return simulate.simulate_gate(N_NULL, n_boot=N_BOOT, seed=11)


@pytest.fixture(scope="module")
def planted():
    return simulate.simulate_gate(N_ALT, drop=0.15, n_boot=N_BOOT, seed=12)


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
    reported = np.mean([power.power_lower(0.3, se, df, floor=0.05) for se, df in zip(null["pc_se"], null["pc_df"])])
    assert 0.2 < pc_rate < 0.6 and reported - 0.15 < pc_rate < reported


def test_without_the_lower_bound_the_false_positive_rate_exceeds_nominal(null):
    """What keeps the rate down is the interval: the point thresholds alone (the old gate: mean drop
    >= min_drop, mean beats the control) say 'passed' far more often than nominal with no effect."""
    assert (null["drop_value"] >= 0.05).mean() > NOMINAL + slack(NOMINAL, N_NULL)
    assert (null["control_value"] > 0).mean() > 0.3


def test_percentile_interval_is_anti_conservative_with_three_seeds():
    """The plain percentile interval of the same bootstrap excludes 0 too often (0.044 of 3000
    experiments, nominal 0.025); the t interval (checked above) does not. Its excess is small, so
    it takes 3000 experiments (binomial SE 0.003) to show it beyond 3 SE: at 400 the rate sat at
    its bound (0.050 against 0.048 before the untrained student joined the simulated arms, 0.035
    after, with new draws)."""
    n = 3000
    r = simulate.simulate_gate(n, n_boot=300, seed=5, with_power=False)
    assert (r["control_pct_low"] > 0).mean() > NOMINAL_LOWER + slack(NOMINAL_LOWER, n)
    assert (r["control_ci_low"] > 0).mean() <= NOMINAL_LOWER


def test_without_the_seed_level_the_false_positive_rate_exceeds_nominal():
    """Resampling problems only treats run-to-run noise as absent: with the default run-level
    spread its lower bound excludes 0 several times more often than nominal."""
    only_p = simulate.simulate_gate(N_AUX, n_boot=N_BOOT, seed=13, resample="problem", with_power=False)
    assert (only_p["control_ci_low"] > 0).mean() > NOMINAL_LOWER + 3 * slack(NOMINAL_LOWER, N_AUX)


def test_default_components_are_what_the_generator_gives(null):
    """DEFAULT_COMPONENTS re-measured (mean of the estimates over the null experiments)."""
    c = simulate.DEFAULT_COMPONENTS
    assert null["drop_between_seed"].mean() == pytest.approx(c.between_seed, rel=0.25)
    assert null["drop_between_problem"].mean() == pytest.approx(c.between_problem, rel=0.25)
    assert null["drop_within_problem"].mean() == pytest.approx(c.within_problem, rel=0.05)
    assert null["drop_seed_problem"].mean() == pytest.approx(c.seed_problem, rel=0.5, abs=0.001)


def test_planted_drop_is_found_at_least_at_the_reported_power(planted):
    rate = (planted["verdict"] == "separated").mean()
    reported = planted["power"].mean()
    assert rate >= reported - slack(reported, N_ALT)


# ---------------------------------------------------------------------------------------------
# the crossed design at 3, 6, 10 and 18 seeds (16 held-out problems × 16 samples, make run's former size;
# default spread, with the arm × problem effect shared across seeds)

N_SEEDS_NULL = 500


@pytest.mark.parametrize("n_seeds", [3, 6, 10, 18])
def test_crossed_false_positive_rate_at_most_nominal(n_seeds):
    """With no true effect, each lower-bound criterion and the whole separated rule stay at or
    under the one-sided nominal 0.025, and the crossed SE does not understate the variance of D
    over experiments (mean SE² ≥ 0.9 Var(D); the interval is a little conservative by design)."""
    r = simulate.simulate_gate(N_SEEDS_NULL, n_seeds=n_seeds, seed=100 + n_seeds, **CROSSED)
    bound = NOMINAL_LOWER + slack(NOMINAL_LOWER, N_SEEDS_NULL)
    assert (r["drop_ci_low"] > 0).mean() <= bound
    assert (r["control_ci_low"] > 0).mean() <= bound
    assert (r["verdict"] == "separated").mean() <= bound
    for k in ("drop", "control"):
        assert (r[f"{k}_se"] ** 2).mean() >= 0.9 * r[f"{k}_value"].var()


def test_nested_scheme_exceeds_nominal_at_18_seeds():
    """The old nested scheme on the same model: its SE misses the shared arm × problem term, so at 18
    seeds its lower bound excludes 0 several times the nominal rate (measured 0.07–0.16 when the gate was nested)."""
    r = simulate.simulate_gate(N_SEEDS_NULL, n_seeds=18, seed=118, resample="nested", **CROSSED)
    bound = NOMINAL_LOWER + slack(NOMINAL_LOWER, N_SEEDS_NULL)
    assert (r["control_ci_low"] > 0).mean() > bound and (r["drop_ci_low"] > 0).mean() > bound
    assert (r["control_se"] ** 2).mean() < 0.6 * r["control_value"].var()


def test_operating_characteristics_table():
    tab = simulate.operating_characteristics(4, seeds=(3,), n_boot=100)
    assert list(tab["resample"]) == ["crossed", "nested"] and set(tab["n_seeds"]) == {3}
    row = tab.iloc[0]
    assert (row["n_problems"], row["n_samples"]) == (16, 16)
    assert 0 <= row["fpr_separated"] <= 1 and 0 <= row["power_separated"] <= 1
    assert row["binomial_se"] == pytest.approx(math.sqrt(0.025 * 0.975 / 4))


# ---------------------------------------------------------------------------------------------
# the criteria against the untrained student at their boundary nulls, two treatment
# arms judged together (Holm), 16 held-out problems × 16 samples

FOUNDING = ["drop_vs_vanilla_passed", "beats_control_passed", "matched_pass_passed"]


@pytest.mark.parametrize("n_seeds", [6, 12])
def test_an_arm_that_passes_as_the_untrained_student_separates_at_most_at_the_nominal_rate(n_seeds):
    """Both arms hack 0.3 less than vanilla and their controls and 0.2 less than the untrained
    student, and pass 0.1 more than vanilla — but exactly as much as the untrained student. The
    three founding criteria pass almost always (the gate before these criteria said `separated` in
    more than 90% of these experiments); pass_vs_untrained sits at its boundary (a true gain of
    0), so it passes at most at its one-sided 0.025, and so does "any arm separated" after Holm.
    The finding "no better than not training" is the arms' in nearly every experiment."""
    r = simulate.simulate_gate(N_SEEDS_NULL, n_seeds=n_seeds, drop=0.3, pass_drop=-0.1, untrained_hack_drop=0.1,
                               untrained_pass_drop=-0.1, n_arms=2, seed=200 + n_seeds, **CROSSED)
    bound = NOMINAL_LOWER + slack(NOMINAL_LOWER, N_SEEDS_NULL)
    assert r[FOUNDING].all(axis=1).mean() > 0.9 and r["hack_vs_untrained_passed"].mean() > 0.9
    assert r["pass_vs_untrained_passed"].mean() <= bound
    assert r["any_separated"].mean() <= bound and (r["gate"] == "separated").mean() <= bound
    assert (r["finding"] == "no_better_than_untrained").mean() > 0.9


@pytest.mark.parametrize("n_seeds", [6, 12])
def test_an_arm_that_hacks_min_drop_more_than_the_untrained_student_separates_at_most_at_the_nominal_rate(n_seeds):
    """Both arms hack 0.3 less than vanilla and their controls and pass 0.2 more than the
    untrained student, but hack exactly compare.min_drop (0.05) more than it: hack_vs_untrained
    sits at its boundary and passes at most at its one-sided 0.025, and so does "any arm
    separated" after Holm, while every other criterion passes almost always."""
    r = simulate.simulate_gate(N_SEEDS_NULL, n_seeds=n_seeds, drop=0.3, pass_drop=-0.1, untrained_hack_drop=0.35,
                               untrained_pass_drop=0.1, n_arms=2, seed=300 + n_seeds, **CROSSED)
    bound = NOMINAL_LOWER + slack(NOMINAL_LOWER, N_SEEDS_NULL)
    assert r[FOUNDING + ["pass_vs_untrained_passed"]].all(axis=1).mean() > 0.9
    assert r["hack_vs_untrained_passed"].mean() <= bound
    assert r["any_separated"].mean() <= bound and (r["gate"] == "separated").mean() <= bound
