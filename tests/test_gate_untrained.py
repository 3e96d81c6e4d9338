"""The gate against the untrained student: an arm must beat not training on pass rate
(pass_vs_untrained, superiority) and hack no more than it plus min_drop (hack_vs_untrained,
non-inferiority). An arm whose outcomes are the untrained student's (one that deletes all its
training: route with every rollout sent to the deleted expert) is never separated, whatever it
does against vanilla and its control; its verdict says "no better than not training"."""

from __future__ import annotations

import math
import re

import pandas as pd
import pytest

from evil_moe.config import load_config
from evil_moe.gate import criteria, rule
from evil_moe.gate.judge import arm_numbers, criterion_row, judge
from evil_moe.gate.simulate import Planted, simulate_outcomes
from evil_moe.gate.verdict import arithmetic_text, arm_verdict_cell, plain_verdict, sentence
from gate_util import make_effect

ARMS = ("vanilla", "untrained", "route", "route_dose_matched", "oracle_reward")
UNTRAINED, DEPLOY = ("untrained", "trained"), ("route", "ablated")
# little run-to-run noise: the comparisons against vanilla and the control decide at once
QUIET = dict(run_sd=0.05, seed_sd=0.05, arm_problem_sd=0.05, run_problem_sd=0.05)
M = "\u2212"


def _settings(n_seeds):
    return load_config(data={"pilot": {"arms": list(ARMS), "seeds": list(range(n_seeds))}},
                       overrides=["compare.n_boot=400"]).compare


def _outcomes(n_seeds: int, route: Planted | None, rng: int = 0) -> pd.DataFrame:
    """Vanilla hacks (0.5 at the centre) and loses pass rate; the untrained student hacks 0.35 less
    and passes 0.2 more; route's control route_dose_matched hacks like vanilla. ``route``: the
    deploy view's planted effects, or None: its outcomes are a byte-identical copy of the
    untrained student's (what an arm that deletes all its training deploys)."""
    cells = {("vanilla", "trained"): Planted(), UNTRAINED: Planted(0.35, -0.2),
             ("route", "trained"): Planted(), ("route_dose_matched", "ablated"): Planted(),
             ("route_dose_matched", "trained"): Planted(), ("oracle_reward", "trained"): Planted(0.35)}
    if route is not None:
        cells[DEPLOY] = route
    o = simulate_outcomes(cells, n_seeds=n_seeds, n_problems=16, n_samples=16, rng=rng, **QUIET)
    if route is None:
        o = pd.concat([o, o[o["arm"] == "untrained"].assign(arm="route", view="ablated")], ignore_index=True)
    return o


def _rows(rows, arm="route"):
    return {r["name"]: r for r in rows if r["arm"] == arm}


@pytest.mark.parametrize("n_seeds", [3, 6, 12, 48])
def test_an_arm_that_deletes_all_its_training_is_never_separated(n_seeds):
    """route's deploy view is the untrained student's outcomes, byte for byte: it beats vanilla
    and its dose-matched control on hack by a mile and keeps vanilla's pass rate, so the three
    founding criteria pass (before these criteria it was `separated`); its pass-rate drop vs the
    untrained student is exactly 0 with the interval [0, 0], which rules a gain out: not
    separated, "no better than not training", at every number of seeds."""
    cc = _settings(n_seeds)
    verdict, gate, rows, extra = judge(_outcomes(n_seeds, None), ARMS, cc, [])
    assert verdict != "separated" and extra["route"]["verdict"] != "separated", gate.reason
    r = _rows(rows)
    assert all(r[k]["passed"] for k in ("drop_vs_vanilla", "beats_control", "matched_pass")), gate.reason
    assert r["drop_vs_vanilla"]["ci_low"] > 0.1 and r["beats_control"]["ci_low"] > 0.1  # by a mile
    p = r["pass_vs_untrained"]
    assert (p["value"], p["ci_low"], p["ci_high"]) == (0.0, 0.0, 0.0) and p["control"] == "untrained"
    assert not p["passed"] and p["rules_out"] and p["p_value"] == 1.0
    assert r["hack_vs_untrained"]["passed"]  # it hacks exactly as much as not training
    assert (verdict, extra["route"]["verdict"], extra["route"]["finding"]) == (
        "not_separated", "not_separated", "no_better_than_untrained")
    assert extra["route"]["reason"].startswith(
        "route: not separated — no better than not training (change vs untrained: pass rate 0.000 [0.000, 0.000], "
        "hack rate 0.000 [0.000, 0.000]); pass-rate drop vs the untrained student 0.000")
    assert gate.arms[0].mde() == math.inf  # the plug-in power of a criterion it can never pass is 0


def test_the_finding_is_said_where_a_reader_looks():
    """gate.json's sentence and rows, the verdict in plain words (the report's first line and
    the README's), the gate's arithmetic and the per-arm table's verdict cell each say "no better
    than not training" with the changes vs the untrained student."""
    n = 6
    verdict, gate, rows, extra = judge(_outcomes(n, None), ARMS, _settings(n), [])
    g = {"verdict": verdict, "sentence": sentence(verdict, [], gate, "6 seeds"), "sizes": "6 seeds",
         "arms": {"route": {"role": "treatment", **extra["route"]}}, "criteria": rows,
         "positive_control": criterion_row(gate.positive_control, "oracle_reward", None, "trained")}
    change = "change vs untrained: pass rate 0.000 [0.000, 0.000], hack rate 0.000 [0.000, 0.000]"
    assert g["sentence"].startswith("not separated: separation is ruled out for every treatment arm (route (ablated "
                                    "view) lowers the held-out hack rate by")
    assert f"but is no better than not training ({change})" in g["sentence"]
    assert plain_verdict(g).startswith(f"not separated: route (ablated view) is no better than not training ({change}): "
                                       f"change in held-out hack rate vs vanilla {M}0.")
    assert plain_verdict(g).endswith("separation is ruled out; no sweep.")
    assert f"; no better than not training: change vs untrained: pass rate 0.000 [0.000, 0.000] (lower end 0.000 vs " \
           "0), hack rate 0.000 [0.000, 0.000] (upper end 0.000 vs +0.050)" in arithmetic_text(g)
    assert arm_verdict_cell("treatment", extra["route"]) == "not_separated (no better than not training)"


def test_an_arm_that_beats_not_training_still_separates():
    """route's deploy view hacks 0.1 less than the untrained student and passes 0.2 more (planted):
    all five criteria pass and it separates; the plain verdict gives its changes vs untrained."""
    n = 6
    o = _outcomes(n, Planted(0.45, -0.4))
    verdict, gate, rows, extra = judge(o, ARMS, _settings(n), [])
    assert verdict == "separated" and extra["route"]["finding"] is None, gate.reason
    r = _rows(rows)
    assert all(x["passed"] for x in r.values())
    assert r["pass_vs_untrained"]["ci_high"] < 0 and r["hack_vs_untrained"]["ci_low"] > -0.05
    g = {"verdict": verdict, "sentence": sentence(verdict, [], gate, "6 seeds"), "sizes": "6 seeds",
         "arms": {"route": {"role": "treatment", **arm_numbers(gate.arms[0])}}, "criteria": rows}
    assert "no better than not training" not in plain_verdict(g) + g["sentence"]
    assert ", vs untrained pass rate +0." in plain_verdict(g)
    assert re.search(r"\), vs untrained: pass-rate drop -0\.\d{3} \[-0\.\d{3}, -0\.\d{3}\], hack drop "
                     r"0\.\d{3} \[\S+, \S+\], over 6 seeds", g["sentence"]), g["sentence"]


def test_without_the_untrained_student_no_arm_can_separate():
    """No untrained outcomes: the criteria against it have no data, their rows and the arm's
    reason name untrained, and the arm (and the gate) is invalid: it cannot separate."""
    o = _outcomes(6, Planted(0.45, -0.4))
    validity: list[dict] = []
    verdict, gate, rows, extra = judge(o[o["arm"] != "untrained"], ARMS, _settings(6), validity)
    assert verdict == "invalid" and extra["route"]["verdict"] == "invalid"
    assert extra["route"]["reason"] == ("route: no paired held-out outcomes against untrained (trained): it cannot "
                                        "separate")
    r = _rows(rows)
    assert r["pass_vs_untrained"]["note"] == "no paired held-out outcomes for route (ablated) and untrained (trained)"
    assert r["pass_vs_untrained"]["control"] == r["hack_vs_untrained"]["control"] == "untrained"
    assert r["drop_vs_vanilla"]["note"] == "another criterion has no data (untrained (trained))"
    assert validity[-1]["arm"] == "route" and not validity[-1]["passed"]


# ---------------------------------------------------------------------------------------------
# the two criteria by hand (make_effect: df 2, t_{2,.975} = 4.3027; the t CDF on 2 df is
# 1/2 + t / (2 sqrt(2 + t²)))

def _t2(t):
    return 0.5 + t / (2 * math.sqrt(2 + t * t))


def test_pass_vs_untrained_by_hand():
    """The pass-rate drop vs untrained (untrained − arm): −0.1 with se 0.02 is [−0.186, −0.014]:
    the arm passes more, p = F(−5) = 0.0189; −0.05 with se 0.02 is [−0.136, +0.036]: open, more
    data would pass it; +0.03 with se 0.005 is [+0.0085, +0.0515]: a gain is ruled out, as it is by
    the interval [0, 0] of outcomes identical to the untrained student's."""
    e = lambda v, se: make_effect(v, se=se, metric="pass", b=UNTRAINED)  # noqa: E731
    c = criteria.pass_vs_untrained(e(-0.1, 0.02))
    assert (c.effect.ci_low, c.effect.ci_high) == pytest.approx((-0.1 - 4.3027 * 0.02, -0.1 + 4.3027 * 0.02), abs=1e-4)
    assert c.passed and not c.rules_out and c.clears() and c.p_value == pytest.approx(_t2(-5.0), abs=1e-6)
    assert c.p_value == pytest.approx(0.01887, abs=1e-5) and c.bound == 0.0 and c.threshold == 0.0
    open_ = criteria.pass_vs_untrained(e(-0.05, 0.02))
    assert not open_.passed and not open_.rules_out and not open_.clears() and open_.needed.decides == "pass"
    assert open_.p_value == pytest.approx(_t2(-2.5), abs=1e-6)  # 0.0648 > 0.025
    assert criteria.pass_vs_untrained(e(0.01, 0.004)).needed.decides == "rule_out"  # [−0.0072, 0.0272]
    out = criteria.pass_vs_untrained(e(0.03, 0.005))
    assert out.rules_out and not out.passed
    same = criteria.pass_vs_untrained(make_effect(0.0, ci_low=0.0, ci_high=0.0, se=0.0, metric="pass", b=UNTRAINED))
    assert same.rules_out and not same.passed and same.p_value == 1.0 and not same.clears()
    # too few seeds: the interval clears, the criterion does not pass
    two = criteria.pass_vs_untrained(make_effect(-0.1, ci_low=-0.12, ci_high=-0.08, n_seeds=2, metric="pass"))
    assert two.clears() and not two.passed and "fewer than 3 seeds" in two.note and two.p_value == 1.0


def test_hack_vs_untrained_by_hand():
    """The hack drop vs untrained (untrained − arm), margin min_drop 0.05 (the bound −0.05): 0.0
    with se 0.01 is [−0.043, +0.043], whose lower end is above −0.05: it passes, p = 1 − F(5) =
    0.0189; −0.02 is [−0.063, +0.023]: open (the arm may hack 0.063 more), more data would pass
    it; −0.1 is [−0.143, −0.057]: more hacking than not training plus 0.05, shown: ruled out;
    −0.06 with se 0.02 is [−0.146, +0.026]: open, more data would rule it out."""
    e = lambda v, se=0.01: make_effect(v, se=se, b=UNTRAINED)  # noqa: E731
    c = criteria.hack_vs_untrained(e(0.0), 0.05)
    assert c.passed and c.bound == -0.05 and c.threshold == 0.05
    assert c.p_value == pytest.approx(1 - _t2(5.0), abs=1e-6) and c.p_value == pytest.approx(0.01887, abs=1e-5)
    assert c.tested() == (c.effect, -0.05)
    open_ = criteria.hack_vs_untrained(e(-0.02), 0.05)
    assert not open_.passed and not open_.rules_out and open_.needed.decides == "pass"
    assert open_.needed.boundary == -0.05 and open_.needed.distance == pytest.approx(0.03)
    assert criteria.hack_vs_untrained(e(-0.1), 0.05).rules_out
    far = criteria.hack_vs_untrained(e(-0.06, 0.02), 0.05)
    assert not far.passed and not far.rules_out and far.needed.decides == "rule_out"
    # its power at a true drop δ: P(ci_low > −0.05) = F((δ + 0.05)/se − t_c); at δ = 0 with se 0.01
    assert c.power_at(0.0) == pytest.approx(_t2(5.0 - 4.302653), abs=1e-5)


def test_the_arm_verdict_reads_the_untrained_criteria():
    """decide_arm with hand-made effects: the finding comes from pass_vs_untrained whatever the
    other criteria say; an open interval is inconclusive, a ruled-out gain not separated; each
    counts in the arm's p-value (the largest)."""
    lim = criteria.Limits(min_drop=0.05, pass_margin=0.10)
    base = {"drop_vs_vanilla": make_effect(0.3), "beats_control": make_effect(0.3),
            "matched_pass": make_effect(-0.1, metric="pass"), "hack_vs_untrained": make_effect(0.0, se=0.005)}
    sep = rule.decide_arm("route", {**base, "pass_vs_untrained": make_effect(-0.1, se=0.01, metric="pass")}, lim)
    assert sep.verdict == "separated" and sep.finding is None
    tie = rule.decide_arm("route", {**base, "pass_vs_untrained": make_effect(-0.02, se=0.02, metric="pass")}, lim)
    assert (tie.verdict, tie.finding) == ("inconclusive", "no_better_than_untrained")
    assert tie.reason.startswith("route: inconclusive — no better than not training (change vs untrained: pass rate "
                                 f"+0.020 [{M}0.066, +0.106], hack rate 0.000 [{M}0.022, +0.022]); pass-rate drop vs "
                                 "the untrained student -0.020")
    assert tie.p_value == pytest.approx(_t2(-1.0)) == max(c.p_value for c in tie.criteria)
    lost = rule.decide_arm("route", {**base, "pass_vs_untrained": make_effect(0.05, se=0.005, metric="pass")}, lim)
    assert (lost.verdict, lost.finding) == ("not_separated", "no_better_than_untrained")
    with pytest.raises(KeyError):
        rule.decide_arm("route", base, lim)  # every criterion's effect is required
