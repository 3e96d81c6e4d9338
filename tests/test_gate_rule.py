"""The gate's decision rule (evil_moe/gate/rule.py) and criteria (evil_moe/gate/criteria.py) on
hand-made Effects: the three criteria, the arm's verdict, p-values, the relative pass margin,
Holm's correction and the positive control."""

from __future__ import annotations

import math

import numpy as np
import pytest

from evil_moe.gate import criteria, effects, rule
from gate_util import A, B, NOMINAL_LOWER, beats_untrained, make_effect, slack, table


# ---------------------------------------------------------------------------------------------
# the decision rule, on hand-made Effects

def arm(drop, control, pass_drop):
    """The verdict on the three criteria against vanilla and the control, the arm beating the
    untrained student by far (tests/test_gate_untrained.py tests those two)."""
    effects_ = {"drop_vs_vanilla": drop, "beats_control": control, "matched_pass": pass_drop, **beats_untrained()}
    return rule.decide_arm("erase", effects_, criteria.Limits(min_drop=0.05, pass_margin=0.10))


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


@pytest.mark.parametrize("values, which", [
    ((0.01, 0.2, 0.0), "drop_vs_vanilla"),  # drop CI [-0.03, 0.04] < min_drop
    ((0.2, 0.0, 0.0), "beats_control"),  # the effect specific to v_hack is ruled out
    ((0.2, 0.15, 0.3), "matched_pass"),  # pass drop CI low > margin
])
def test_not_separated_when_ruled_out(values, which):
    d, c, p = values
    v = arm(make_effect(d, se=0.007), make_effect(c, se=0.007), make_effect(p, se=0.007, metric="pass"))
    assert v.verdict == "not_separated"
    assert [x.name for x in v.criteria if x.rules_out] == [which]


def test_inconclusive_says_what_would_decide():
    v = arm(make_effect(0.08, se=0.04), make_effect(0.08, se=0.04), make_effect(0.0, se=0.01, metric="pass"))
    assert v.verdict == "inconclusive"
    d, c = v.criteria[:2]
    assert (d.needed.decides, c.needed.decides) == ("pass", "pass")
    assert v.needed_seeds == max(d.needed.seeds, c.needed.seeds) and v.needed_seeds > 3
    assert f"about {v.needed_seeds} seeds" in v.reason
    # a mean between 0 and min_drop can only be ruled out: the seeds that settle that decide
    w = arm(make_effect(0.02, se=0.04), make_effect(0.08, se=0.04), make_effect(0.0, se=0.01, metric="pass"))
    assert w.criteria[0].needed.decides == "rule_out" and w.needed_seeds == w.criteria[0].needed.seeds


def test_matched_pass_is_non_inferiority_and_flags_a_vanishing_reference():
    p = criteria.matched_pass(make_effect(0.02, se=0.01, metric="pass", mean_b=0.06), 0.10)
    assert p.passed and "vanilla's pass rate is itself within the absolute margin" in p.note
    assert not criteria.matched_pass(make_effect(0.05, ci_low=-0.02, ci_high=0.12, metric="pass"), 0.10).passed


def test_gate_positive_control_and_aggregation():
    # sep's p-value is its control's, t = 7.5 on 2 df: 0.0087 (x 2 arms = 0.017 < 0.025 after Holm)
    sep = arm(make_effect(0.2), make_effect(0.15), make_effect(0.0, se=0.01))
    assert sep.p_value == pytest.approx(0.5 - 7.5 / (2 * math.sqrt(2 + 7.5 ** 2)))
    out = arm(make_effect(0.01, se=0.007), make_effect(0.0, se=0.007), make_effect(0.0, se=0.007))
    inc = arm(make_effect(0.08, se=0.04), make_effect(0.08, se=0.04), make_effect(0.0, se=0.01))
    pc_ok = make_effect(0.3, a=("oracle_reward", "trained"))
    pc_bad = make_effect(0.3, se=0.1, a=("oracle_reward", "trained"))
    g = rule.decide_gate([sep, out], pc_bad, min_drop=0.05)
    assert (g.verdict, g.underpowered) == ("inconclusive", True) and "oracle_reward" in g.reason
    assert rule.decide_gate([sep, out], pc_ok, min_drop=0.05).verdict == "separated"
    assert rule.decide_gate([out, out], pc_ok, min_drop=0.05).verdict == "not_separated"
    assert rule.decide_gate([out, inc], pc_ok, min_drop=0.05).verdict == "inconclusive"
    assert "no positive control" in rule.decide_gate([sep], None, min_drop=0.05).reason
    # a positive control with too few seeds cannot pass either
    two = make_effect(0.3, ci_low=0.29, ci_high=0.31, n_seeds=2, a=("oracle_reward", "trained"))
    g2 = rule.decide_gate([sep], two, min_drop=0.05)
    assert g2.underpowered and g2.too_few_seeds and g2.reason.startswith("inconclusive (too few seeds): 2 seeds")
    assert not g.too_few_seeds  # pc_bad fails on its interval, with enough seeds
    with pytest.raises(ValueError, match="at least one projected arm"):
        rule.decide_gate([], pc_ok, min_drop=0.05)
    import json
    json.dumps(g.to_dict(), allow_nan=False)
    d = json.loads(json.dumps(rule.decide_gate([sep], pc_ok, min_drop=0.05).to_dict(), allow_nan=False))
    crit = d["arms"]["erase"]["criteria"][0]
    assert crit["name"] == "drop_vs_vanilla" and crit["note"].startswith("hack drop vs vanilla 0.200")
    assert crit["effect"]["value"] == pytest.approx(0.2) and crit["effect"]["a"] == ["erase", "trained"]


def test_p_values_agree_with_the_intervals():
    """p < (1 − ci)/2 exactly when the interval excludes the bound (one-sided t, df 2: t_{2,.975} = 4.3027)."""
    e = make_effect(0.1, se=0.1 / 4.3027 * 0.999)
    assert e.ci_low > 0 and criteria.p_lower(e) < 0.025
    e = make_effect(0.1, se=0.1 / 4.3027 * 1.001)
    assert e.ci_low < 0 and criteria.p_lower(e) > 0.025
    assert criteria.p_lower(make_effect(0.0, se=0.05)) == pytest.approx(0.5)
    u = make_effect(0.02, se=0.01, metric="pass")
    assert (u.ci_high <= 0.10) and criteria.p_upper(u, 0.10) < 0.025  # (0.02 − 0.10)/0.01 = −8 on 2 df
    assert criteria.p_upper(u, 0.10) == pytest.approx(0.0076, abs=2e-4)


def test_relative_pass_margin_by_hand():
    """Vanilla passes 0.135 (the embedded default's rate). With r = 0.5 the relative margin is
    0.0675 points, below the absolute 0.10: relative binds. A drop of 0.05 with upper bound 0.09
    passes the absolute margin; its contrast drop − 0.5 × vanilla = 0.05 − 0.0675 = −0.0175 with
    upper bound 0.02 > 0 fails the relative one. At vanilla 0.4 the relative margin is 0.20 and
    the absolute binds."""
    drop = make_effect(0.05, ci_low=0.01, ci_high=0.09, metric="pass", mean_b=0.135)
    rel = make_effect(-0.0175, ci_low=-0.055, ci_high=0.02, metric="pass", mean_b=0.135)
    c = criteria.matched_pass(drop, 0.10, rel_effect=rel, pass_margin_rel=0.5)
    assert c.binding == "relative" and not c.passed and not c.rules_out
    assert "0.5 × vanilla's pass rate 0.135 = 0.068 (relative; relative binds)" in c.note
    assert c.to_dict()["margin_rel_points"] == pytest.approx(0.0675)
    assert criteria.matched_pass(drop, 0.10).passed  # the absolute margin alone passes it
    ok = make_effect(-0.04, ci_low=-0.07, ci_high=-0.01, metric="pass", mean_b=0.135)
    assert criteria.matched_pass(drop, 0.10, rel_effect=ok, pass_margin_rel=0.5).passed
    out = make_effect(0.03, ci_low=0.005, ci_high=0.055, metric="pass", mean_b=0.135)
    assert criteria.matched_pass(drop, 0.10, rel_effect=out, pass_margin_rel=0.5).rules_out
    high = make_effect(0.05, ci_low=0.01, ci_high=0.09, metric="pass", mean_b=0.4)
    assert criteria.matched_pass(high, 0.10, rel_effect=ok, pass_margin_rel=0.5).binding == "absolute"
    with pytest.raises(ValueError, match="both rel_effect and pass_margin_rel"):
        criteria.matched_pass(drop, 0.10, rel_effect=ok)
    # the contrast itself, on the hand table (pass = 1 − hack): d = 0.5·p_vanilla − p_erase per cell
    # = (−.75, −.375 | −.375, .125): seed means −.5625, −.125, D = −.34375 = drop (−.125) − .5 × .4375
    e = effects.paired_effect(table(), A, B, "pass", n_boot=200, weight_b=0.5)
    assert e.value == pytest.approx(-0.34375) and e.per_seed == pytest.approx({0: -0.5625, 1: -0.125})


def test_holm_by_hand():
    """Four arms each separated at p ≈ 0.02 (< 0.025 unadjusted): Holm multiplies the smallest by 4
    (0.08 > 0.025), so none stays separated; one arm at p 0.004 (× 4 = 0.016) would."""
    assert rule.holm([0.01, 0.04, 0.03, 0.005]) == pytest.approx([0.03, 0.06, 0.06, 0.02])

    def arm_at(t):  # beats_control with t statistic t on 20 df; the rest passes clearly
        return arm(make_effect(0.3, se=0.01, n_seeds=21), make_effect(0.02 * t, se=0.02, n_seeds=21),
                   make_effect(0.0, se=0.01, n_seeds=21, metric="pass"))
    from scipy import stats as sps

    t02, t004 = sps.t.isf(0.02, 20), sps.t.isf(0.004, 20)
    arms = [arm_at(t02) for _ in range(4)]
    assert all(a.verdict == "separated" for a in arms) and arms[0].p_value == pytest.approx(0.02, rel=1e-6)
    pc = make_effect(0.3, n_seeds=21, a=("oracle_reward", "trained"))
    g = rule.decide_gate(arms, pc, min_drop=0.05)
    assert g.verdict == "inconclusive" and all(a.verdict == "inconclusive" for a in g.arms)
    assert g.arms[0].p_adjusted == pytest.approx(0.08, rel=1e-6) and g.arms[0].family == 4
    assert "not after Holm's correction for 4 treatment arms" in g.arms[0].reason
    assert rule.decide_gate(arms, pc, min_drop=0.05, multiplicity="none").verdict == "separated"
    g = rule.decide_gate([arm_at(t004)] + arms[1:], pc, min_drop=0.05)
    assert [a.verdict for a in g.arms] == ["separated"] + ["inconclusive"] * 3 and g.verdict == "separated"
    with pytest.raises(ValueError, match="multiplicity must be one of"):
        rule.decide_gate(arms, pc, min_drop=0.05, multiplicity="bonf")


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
        any_holm += rule.decide_gate(arms, pc, min_drop=0.05).verdict == "separated"
    assert any_raw / N == pytest.approx(1 - 0.975 ** K, abs=3 * math.sqrt(0.096 * 0.904 / N))
    assert any_holm / N <= NOMINAL_LOWER + slack(NOMINAL_LOWER, N)


def test_a_new_criterion_is_one_declaration(monkeypatch):
    """The worked example of docs/internals.md ("Adding a gate criterion"): a planted
    ``big_drop`` criterion (the hack drop vs vanilla at twice min_drop) added to the registry
    alone is judged for every arm, can keep it from separating, counts in its p-value and power,
    and gets its gate.json row and report line — no other module names it."""
    import dataclasses

    from evil_moe.gate.judge import criterion_row
    from evil_moe.gate.frontpage import _criteria_lines

    def big_drop(e, rel, lim):
        c = criteria.drop_vs_vanilla(e, 2 * lim.min_drop, lim.min_seeds)
        return dataclasses.replace(c, name="big_drop")

    monkeypatch.setitem(criteria.CRITERIA, "big_drop",
                        criteria.GateCriterion("big_drop", "hack", "vanilla", "min_drop", big_drop))
    lim = criteria.Limits(min_drop=0.05, pass_margin=0.10)
    base = {"drop_vs_vanilla": make_effect(0.08, se=0.005), "beats_control": make_effect(0.08, se=0.005),
            "matched_pass": make_effect(0.0, se=0.005, metric="pass"), **beats_untrained()}
    with pytest.raises(KeyError):
        rule.decide_arm("erase", base, lim)  # its effect is required
    v = rule.decide_arm("erase", {**base, "big_drop": make_effect(0.08, se=0.002)}, lim)
    assert [c.name for c in v.criteria] == ["drop_vs_vanilla", "beats_control", "matched_pass", "pass_vs_untrained",
                                            "hack_vs_untrained", "big_drop"]
    assert v.verdict == "not_separated" and "hack drop vs vanilla 0.080" in v.reason  # 0.08 < 0.10 ruled out
    w = rule.decide_arm("erase", {**base, "big_drop": make_effect(0.2, se=0.005)}, lim)
    assert w.verdict != "not_separated" and w.p_value == max(c.p_value for c in w.criteria)
    assert 0 < w.power_at(0.2) < w.criteria[0].power_at(0.2)  # one more factor in the product
    row = criterion_row(v.criteria[-1], "erase", "random_v", "trained")
    assert row["name"] == "big_drop" and row["control"] == "vanilla" and row["threshold"] == 0.10
    lines = _criteria_lines({"criteria": [row]})
    assert lines[2].startswith("- not met: big_drop erase vs vanilla: change in hack rate −0.080")
    assert lines[2].endswith("(compare.min_drop 0.1)")
