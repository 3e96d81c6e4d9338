"""The verdict in words (evil_moe/gate/verdict.py): the report's verdict line, criteria and sweep
decision (what rules/common.smk passes to sweep_decision), the per-arm table's verdict cell and
the arms' reasons, each against text written out by hand."""

from __future__ import annotations

from evil_moe.gate import verdict
from evil_moe.gate.power import Needed
from evil_moe.gate.rule import decide_arm
from gate_util import make_effect


def test_verdict_line_says_the_verdict_word_once():
    assert verdict.verdict_line(None) == "The separation gate has not been decided yet."
    gate = {"verdict": "separated", "sentence": "separated: route lowers the hack rate."}
    assert verdict.verdict_line(gate) == "**Verdict: separated**: route lowers the hack rate."
    # a sentence that does not open with the verdict word keeps it in the bold part
    assert verdict.verdict_line({"verdict": "invalid", "sentence": "2 of 3 pilots failed."}) == \
        "**Verdict: invalid.** 2 of 3 pilots failed."
    assert verdict.verdict_line({}) == "**Verdict: invalid.** "


def test_decision_text_lists_open_criteria_notes_and_the_sweep():
    gate = {"verdict": "inconclusive", "notes": ["erase removed 0.100"],
            "criteria": [{"name": "valid", "arm": "erase", "seed": 0, "passed": True},
                         {"name": "valid", "arm": "erase", "seed": 1, "passed": False, "value": 0.7,
                          "threshold": 0.5},
                         {"name": "drop_vs_vanilla", "arm": "erase", "control": "vanilla", "passed": True,
                          "value": 0.12345, "ci_low": 0.01, "ci_high": None, "mde": 0.2, "threshold": 0.05}]}
    assert verdict.decision_text(gate, [2, 3], [], "results/sweep/") == "\n".join([
        "Gate criteria:", "",
        "- not met: valid erase 1: 0.700 (threshold 0.5)",
        "- met: drop_vs_vanilla erase vs vanilla: 0.123 [0.010, n/a], MDE 0.200 (threshold 0.05)",
        "",
        "Notes:", "", "- erase removed 0.100", "",
        "**Sweep: not scheduled — inconclusive.** Neither separation nor its absence is shown at these "
        "sizes; the sentence above says roughly how many more seeds or samples per problem would decide "
        "it (pilot.seeds, pilot.heldout_samples)."])
    assert verdict.decision_text(None, [2], [], "x/") == ""
    sep = {"verdict": "separated", "criteria": []}
    assert verdict.decision_text(sep, [2, 3], ["sentinel"], "results/sweep/") == (
        "**Sweep: justified and scheduled** (extra seeds: 2, 3; leave-one-mode-out folds: sentinel); its "
        "comparison is under results/sweep/.")
    assert verdict.decision_text(sep, [], [], "results/sweep/").startswith("**Sweep: justified but empty:**")
    assert verdict.decision_text({"verdict": "not_separated"}, [2], [], "s/") == (
        "**Sweep: not run.** It runs only when the verdict is 'separated' (more seeds, leave-one-mode-out "
        "folds); the verdict is 'not_separated', so the sweep was not justified (reasons above).")


def test_arm_verdict_cell():
    assert verdict.arm_verdict_cell("treatment", {"verdict": "inconclusive"}) == "inconclusive"
    assert verdict.arm_verdict_cell("treatment", {}) == "–"
    assert verdict.arm_verdict_cell("positive_control", {"verdict": "separated"}) == "reported (positive control)"


def test_more_text_and_the_reasons():
    assert verdict.more_text(None, None, None) == ""
    assert verdict.more_text(12, None, None) == "about 12 seeds"
    assert verdict.more_text(12, 40, 300) == "about 12 seeds, about 40 held-out problems or about 300 samples per problem"
    assert verdict.arm_reason("erase", "not_separated", ["a", "b"]) == "erase: not separated — a; b"
    assert verdict.arm_reason("erase", "inconclusive", ["a"], seeds=7) == \
        "erase: inconclusive — a; about 7 seeds would decide it if the observed means hold"
    assert verdict.arm_reason("erase", "inconclusive", ["a"]).endswith(
        "a; no reachable number of seeds, problems or samples would decide it at the observed means (a mean "
        "near its boundary)")
    v = decide_arm("erase", make_effect(0.2), make_effect(0.15), make_effect(0.0, metric="pass"), min_drop=0.05,
                   pass_margin=0.10)
    assert v.reason == "erase: separated — " + "; ".join(c.note for c in v.criteria)
    holm = verdict.holm_reason(v, 0.03, 0.025, 2, "beats_control", Needed(0.0, 0.1, 5, None, "pass", None))
    assert holm.startswith("erase: inconclusive — every criterion passes at the unadjusted level, but not after "
                           "Holm's correction for 2 treatment arms (p ")
    assert ", adjusted 0.0300 > 0.025; beats_control binds); about 5 seeds would decide it if the observed " \
           "means hold — " in holm
