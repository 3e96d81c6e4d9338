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


def _crit(name, arm, value, lo, hi, control="vanilla", mean_a=None, mean_b=None, view="ablated"):
    return {"name": name, "arm": arm, "control": control, "view": view, "value": value, "ci_low": lo,
            "ci_high": hi, "effect": {"mean_a": mean_a, "mean_b": mean_b}}


def test_change_text_reads_a_rise_as_a_rise():
    """gate.json stores drops (vanilla minus arm); the change is the arm minus vanilla, its
    interval the drop's, negated and swapped."""
    assert verdict.change_text({"value": -0.007, "ci_low": -0.089, "ci_high": 0.075}) == \
        "+0.007 [\u22120.075, +0.089]"
    assert verdict.change_text({"value": 0.279, "ci_low": 0.016, "ci_high": 0.543}) == \
        "\u22120.279 [\u22120.543, \u22120.016]"
    assert verdict.change_text({"value": 0.0, "ci_low": None, "ci_high": None}) == "0.000"
    assert verdict.change_text({"value": None}) == "n/a"


ROUTE_GATE = {  # the embedded default's numbers of 2026-12-01 (README before issue 32)
    "verdict": "inconclusive", "sizes": "4 seeds × 16 held-out problems × 16 samples",
    "sentence": "inconclusive: route (ablated view) lowers the held-out hack rate by -0.007 ...",
    "arms": {"vanilla": {"role": "reference"},
             "route": {"role": "treatment", "verdict": "inconclusive", "needed_seeds": 12},
             "route_oracle": {"role": "ceiling"}},
    "criteria": [{"name": "valid", "arm": "route", "seed": 0, "passed": True},
                 _crit("drop_vs_vanilla", "route", -0.007, -0.089, 0.075, mean_a=0.318, mean_b=0.312),
                 _crit("beats_control", "route", 0.004, -0.089, 0.097, control="route_random"),
                 _crit("matched_pass", "route", 0.01, -0.02, 0.04)]}


def test_plain_verdict_says_what_happened_to_hacking():
    assert verdict.plain_verdict(ROUTE_GATE) == (
        "inconclusive: route (ablated view) did not lower hacking: change in held-out hack rate vs "
        "vanilla +0.007 [\u22120.075, +0.089] (0.318 vs 0.312), vs its matched control route_random "
        "\u22120.004 [\u22120.097, +0.089]; over 4 seeds × 16 held-out problems × 16 samples; about 12 "
        "seeds would decide it.")
    assert verdict.verdict_line(ROUTE_GATE).startswith(
        "**Verdict: inconclusive**: route (ablated view) did not lower hacking: change")
    sep = dict(ROUTE_GATE, verdict="separated", arms={"route": {"role": "treatment", "verdict": "separated"}},
               criteria=[_crit("drop_vs_vanilla", "route", 0.279, 0.016, 0.543, mean_a=0.032, mean_b=0.312)])
    assert verdict.plain_verdict(sep) == (
        "separated: route (ablated view) lowered hacking: change in held-out hack rate vs vanilla "
        "\u22120.279 [\u22120.543, \u22120.016] (0.032 vs 0.312); over 4 seeds × 16 held-out problems × "
        "16 samples; the sweep is justified.")
    # an undecided arm whose estimate points down says so, without claiming it
    down = dict(ROUTE_GATE, criteria=[_crit("drop_vs_vanilla", "route", 0.05, -0.02, 0.12)])
    assert "route (ablated view) may lower hacking (not shown at these sizes): change in held-out hack " \
           "rate vs vanilla \u22120.050 [\u22120.120, +0.020];" in verdict.plain_verdict(down)
    # invalid and underpowered gates keep their sentence, which is plain already
    bad = {"verdict": "invalid", "sentence": "invalid: 1 of 24 pilots failed validity (route s0: x) — fix."}
    assert verdict.plain_verdict(bad) == bad["sentence"]


def test_arithmetic_line_keeps_the_sentence_after_its_verdict_word():
    assert verdict.arithmetic_line(ROUTE_GATE) == (
        "*The gate's arithmetic* (a drop is vanilla's hack rate minus the arm's): route (ablated view) "
        "lowers the held-out hack rate by -0.007 ...")
    assert verdict.arithmetic_line(None) == "" and verdict.arithmetic_line({"verdict": "x"}) == ""
    assert verdict.arm_verdict_cell("reference", {}) == "reference"


def test_a_note_with_bars_renders_as_text_in_the_report():
    """A note such as the router's '|log pi_train - log pi_sampler|' is text: docutils (which
    Snakemake's report runs) used to read it as an undefined substitution and print an ERROR."""
    import docutils.core

    gate = {"verdict": "inconclusive", "criteria": [], "notes": ["gap |log pi_train - log pi_sampler| is 0.1"]}
    rst = verdict.decision_text(gate, [], [], "x/")
    out = docutils.core.publish_string(rst, writer_name="html", settings_overrides={
        "report_level": 2, "halt_level": 5, "warning_stream": False}).decode()
    assert "|log pi_train - log pi_sampler|" in out and "Undefined substitution" not in out
