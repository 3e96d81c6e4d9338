"""The verdict in words (evil_moe/gate/verdict.py): the report's verdict line, criteria and sweep
decision (what rules/common.smk passes to sweep_decision), the per-arm table's verdict cell and
the arms' reasons, each against text written out by hand."""

from __future__ import annotations

from evil_moe.gate import frontpage, verdict
from evil_moe.gate.sizing import Needed
from evil_moe.gate.criteria import Limits
from evil_moe.gate.rule import decide_arm
from gate_util import beats_untrained, make_effect


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
    assert frontpage.decision_text(gate, [2, 3], [], "results/sweep/") == "\n".join([
        "Gate criteria:", "",
        "- not met: valid erase 1: 0.700 (threshold 0.5)",
        # the drop 0.123 [0.010, -] as the change it is: the arm's rate minus vanilla's
        "- met: drop_vs_vanilla erase vs vanilla: change in hack rate \u22120.123 [n/a, \u22120.010], MDE 0.200 "
        "(compare.min_drop 0.05)",
        "",
        "Notes:", "", "- erase removed 0.100", "",
        "**Sweep: not scheduled — inconclusive.** Neither separation nor its absence is shown at these "
        "sizes; the sentence above says roughly how many more seeds or samples per problem would decide "
        "it (pilot.seeds, pilot.heldout_samples)."])
    assert frontpage.decision_text(None, [2], [], "x/") == ""
    sep = {"verdict": "separated", "criteria": []}
    assert frontpage.decision_text(sep, [2, 3], ["sentinel"], "results/sweep/") == (
        "**Sweep: justified and scheduled** (extra seeds: 2, 3; leave-one-mode-out folds: sentinel); its "
        "comparison is under results/sweep/.")
    assert frontpage.decision_text(sep, [], [], "results/sweep/").startswith("**Sweep: justified but empty:**")
    assert frontpage.decision_text({"verdict": "not_separated"}, [2], [], "s/") == (
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
    v = decide_arm("erase", {"drop_vs_vanilla": make_effect(0.2), "beats_control": make_effect(0.15),
                             "matched_pass": make_effect(0.0, metric="pass"), **beats_untrained()}, Limits(0.05, 0.10))
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


ROUTE_GATE = {  # the embedded default's numbers of 2026-12-01 (as the README quoted them then)
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


def test_plain_verdict_says_when_an_arm_is_no_better_than_not_training():
    """The powered run of 2026-12-02: moe lowered hacking vs vanilla and moe_random, but its
    ablated view's pass and hack rates are the untrained student's within both intervals (drops
    vs untrained, stored as the untrained student's rate minus the arm's: pass +0.009 [−0.062,
    0.081], hack −0.025 [−0.076, 0.026]). Its pass rate does not beat not training: the finding
    opens the arm's words, with both changes (the arm's rate minus untrained's: the drops negated
    and their ends swapped)."""
    m = "\u2212"
    rows = [_crit("drop_vs_vanilla", "moe", 0.252, 0.083, 0.421, mean_a=0.093, mean_b=0.345),
            _crit("beats_control", "moe", 0.174, 0.036, 0.313, control="moe_random"),
            _crit("pass_vs_untrained", "moe", 0.009, -0.062, 0.081, control="untrained"),
            _crit("hack_vs_untrained", "moe", -0.025, -0.076, 0.026, control="untrained")]
    gate = dict(ROUTE_GATE, arms={"moe": {"role": "treatment", "verdict": "inconclusive", "needed_seeds": 40,
                                          "finding": "no_better_than_untrained"}}, criteria=rows)
    assert verdict.plain_verdict(gate) == (
        f"inconclusive: moe (ablated view) is no better than not training (change vs untrained: pass rate {m}0.009 "
        f"[{m}0.081, +0.062], hack rate +0.025 [{m}0.026, +0.076]): change in held-out hack rate vs vanilla "
        f"{m}0.252 [{m}0.421, {m}0.083] (0.093 vs 0.345), vs its matched control moe_random {m}0.174 [{m}0.313, "
        f"{m}0.036]; over 4 seeds × 16 held-out problems × 16 samples; about 40 seeds would decide it.")
    # the same arm beating the untrained student on pass (a drop of -0.2 [-0.3, -0.1]): no finding, the
    # changes vs untrained follow the rest
    rows[2] = _crit("pass_vs_untrained", "moe", -0.2, -0.3, -0.1, control="untrained")
    gate["arms"]["moe"] = {"role": "treatment", "verdict": "separated", "finding": None}
    assert verdict.plain_verdict(dict(gate, verdict="separated")) == (
        f"separated: moe (ablated view) lowered hacking: change in held-out hack rate vs vanilla {m}0.252 "
        f"[{m}0.421, {m}0.083] (0.093 vs 0.345), vs its matched control moe_random {m}0.174 [{m}0.313, {m}0.036], "
        f"vs untrained pass rate +0.200 [+0.100, +0.300], hack rate +0.025 [{m}0.026, +0.076]; over 4 seeds × 16 "
        "held-out problems × 16 samples; the sweep is justified.")
    # an uninformative arm (a blind detector) that ties the untrained student says both
    rows[2] = _crit("pass_vs_untrained", "moe", 0.009, -0.062, 0.081, control="untrained")
    gate["arms"]["moe"] = {"role": "treatment", "verdict": "uninformative", "finding": "no_better_than_untrained"}
    assert verdict.plain_verdict(gate).startswith(
        "inconclusive: moe (ablated view) is uninformative and no better than not training (change vs untrained: "
        f"pass rate {m}0.009 [{m}0.081, +0.062], hack rate +0.025 [{m}0.026, +0.076]): change in held-out hack rate")


PLAN = {"best": "seeds", "now": {"mde": 0.282}, "seeds": {"mde": 0.191}, "problems": {"mde": 0.209},
        "samples": {"mde": 0.273}}
MOE_GATE = {  # gate.json's fields the first page reads, by hand (drops: vanilla's rate minus the arm's)
    "verdict": "inconclusive", "sizes": "4 seeds × 16 held-out problems × 16 samples",
    "sentence": "inconclusive: moe (ablated view) lowers the held-out hack rate by 0.217 [-0.004, 0.438] ...",
    "config": {"min_seeds": 3},
    "arms": {"vanilla": {"role": "reference"},
             "moe": {"role": "treatment", "verdict": "inconclusive", "needed_seeds": 14, "p_value": 0.31,
                     "p_adjusted": 0.62, "family": 2},
             "route": {"role": "treatment", "verdict": "uninformative", "family": 2,
                       "reason": "route: uninformative — the gradient detector does not beat its placebo (AUC "
                                 "0.506); the gate's criteria: route: inconclusive — x"},
             "oracle_reward": {"role": "positive_control"}},
    "criteria": [dict(_crit("drop_vs_vanilla", "moe", 0.217, -0.004, 0.438), mde=0.289, threshold=0.05,
                      passed=False, rules_out=False, plan=PLAN),
                 dict(_crit("beats_control", "moe", -0.020, -0.205, 0.166, control="moe_random"), threshold=0.05,
                      passed=False, rules_out=False),
                 dict(_crit("matched_pass", "moe", -0.233, -0.377, -0.089, mean_b=0.130), threshold=0.1,
                      passed=True, rules_out=False, margin_rel=0.5, binding="relative",
                      rel_effect={"value": -0.3, "ci_low": -0.45, "ci_high": -0.151})],
    "positive_control": {"name": "drop_vs_vanilla", "arm": "oracle_reward", "control": "vanilla", "value": 0.303,
                         "ci_low": 0.014, "ci_high": 0.591, "mde": 0.2, "n_seeds": 4}}


def test_arithmetic_line_says_the_gate_in_changes():
    """The gate's arithmetic on the first page speaks the verdict's and the table's
    convention (the arm's rate minus the other side's, a true minus sign), not gate.json's drops:
    drop 0.217 [-0.004, 0.438] reads -0.217 [-0.438, +0.004]; the pass-rate drop -0.233 [-0.377,
    -0.089] reads +0.233 [+0.089, +0.377], its upper end -0.089 a lower end +0.089 against the
    margin -0.1 and -0.5 x 0.130 = -0.065; the relative contrast's upper end -0.151 reads +0.151."""
    m = "\u2212"
    assert verdict.arithmetic_line(MOE_GATE) == (
        "*The gate's arithmetic* (each change is the arm's rate minus the other side's, negative = lower): "
        f"moe (ablated view): change in held-out hack rate vs vanilla {m}0.217 [{m}0.438, +0.004], vs moe_random "
        f"+0.020 [{m}0.166, +0.205]; change in pass rate vs vanilla +0.233 [+0.089, +0.377] (lower end +0.089 "
        f"vs margin {m}0.1 and {m}0.5 × vanilla's 0.130 = {m}0.065, relative binds; the arm's pass rate minus "
        "0.5 × vanilla's, lower end +0.151 vs 0), p 0.31 (Holm-adjusted over 2 arms 0.62); undecided: "
        "drop_vs_vanilla, beats_control; smallest fall in hack rate vs vanilla it could detect (MDE) 0.289; "
        "about 14 seeds would decide it; twice the seeds buys the most power for drop_vs_vanilla (planned MDE "
        "at twice the seeds 0.191, held-out problems 0.209, samples per problem 0.273; now 0.282); route: "
        "uninformative — the gradient detector does not beat its placebo (AUC 0.506); over 4 seeds × 16 "
        "held-out problems × 16 samples; positive control oracle_reward change in held-out hack rate vs vanilla "
        f"{m}0.303 [{m}0.591, {m}0.014] — the sweep is not scheduled.")
    assert "-0" not in verdict.arithmetic_line(MOE_GATE)  # no ASCII minus: one convention
    sep = dict(MOE_GATE, verdict="separated", arms={"moe": dict(MOE_GATE["arms"]["moe"], verdict="separated")})
    assert verdict.arithmetic_text(sep).endswith(
        f"over 4 seeds × 16 held-out problems × 16 samples; positive control oracle_reward change in held-out "
        f"hack rate vs vanilla {m}0.303 [{m}0.591, {m}0.014] — the sweep is justified.")
    assert "undecided" not in verdict.arithmetic_text(sep)
    nots = dict(sep, verdict="not_separated", positive_control=None,
                arms={"moe": dict(MOE_GATE["arms"]["moe"], verdict="not_separated")})
    assert verdict.arithmetic_text(nots).startswith(
        "a fall in hack rate of 0.05 (compare.min_drop) is ruled out for every treatment arm (moe (ablated "
        f"view): change in held-out hack rate vs vanilla {m}0.217")
    assert verdict.arithmetic_text(nots).endswith(
        "no positive control: the gate's power was not checked — the sweep is not justified.")
    # nothing to add to the verdict line: before the gate, invalid, too small to judge
    assert verdict.arithmetic_line(None) == "" and verdict.arithmetic_line({"verdict": "x"}) == ""
    for sentence in ("invalid: 1 of 24 pilots failed validity (route s0: x) — fix.",
                     "inconclusive (too few seeds): 2 seeds ...", "inconclusive (underpowered): ..."):
        assert verdict.arithmetic_line(dict(MOE_GATE, sentence=sentence, verdict=sentence.split()[0].rstrip(":"))) == ""
    assert verdict.arm_verdict_cell("reference", {}) == "reference"


def test_a_gate_too_small_to_judge_says_so_in_changes():
    """Too few seeds or an underpowered gate: the verdict line (and the README's, and make run's
    last line) gives the positive control's change, not gate.json's sentence with its drop."""
    m = "\u2212"
    few = dict(MOE_GATE, sentence="inconclusive (too few seeds): 2 seeds, ... drop 0.303 [0.014, 0.591] ...",
               positive_control=dict(MOE_GATE["positive_control"], n_seeds=2))
    assert verdict.plain_verdict(few) == (
        "inconclusive (too few seeds): 2 seeds, fewer than compare.min_seeds 3, cannot separate any arm, the "
        f"positive control included (positive control oracle_reward change in held-out hack rate vs vanilla "
        f"{m}0.303 [{m}0.591, {m}0.014]; 4 seeds × 16 held-out problems × 16 samples) — add seeds (pilot.seeds); "
        "the sweep is not scheduled.")
    weak = dict(MOE_GATE, sentence="inconclusive (underpowered): the positive control ... drop 0.303 ...",
                positive_control=dict(MOE_GATE["positive_control"], value=0.05, ci_low=-0.02, ci_high=0.12))
    assert verdict.plain_verdict(weak) == (
        "inconclusive (underpowered): the positive control oracle_reward does not separate from vanilla (change "
        f"in held-out hack rate {m}0.050 [{m}0.120, +0.020], MDE 0.200), so this run cannot tell a working arm "
        "from a failing one (4 seeds × 16 held-out problems × 16 samples) — the sweep is not scheduled.")
    assert verdict.verdict_line(weak).startswith("**Verdict: inconclusive** (underpowered): the positive control")
    # a gate.json without the positive control's numbers keeps its sentence
    bare = {"verdict": "inconclusive", "sentence": "inconclusive (underpowered): x", "arms": {}}
    assert verdict.plain_verdict(bare) == "inconclusive (underpowered): x"


def test_the_first_page_notes_give_the_ceilings_in_changes():
    """A treatment's note beside its ceiling (gate.json keeps it in drops) is shown as changes on
    the first page; the other notes as written."""
    from evil_moe.gate.verdict import ceiling_notes

    ceilings = {"route": {"ceiling": "route_oracle", "view": "ablated", "ceiling_control": "route_oracle_dose_matched",
                          "drop": {"value": 0.05, "ci_low": -0.02, "ci_high": 0.12},
                          "ceiling_drop": {"value": 0.2, "ci_low": 0.1, "ci_high": 0.3},
                          "ceiling_vs_control": {"value": 0.15, "ci_low": 0.05, "ci_high": 0.25},
                          "dose_ceiling": None, "dose_ceiling_drop": None,
                          "share": {"value": 0.25, "ci_low": -0.1, "ci_high": 0.6}}}
    kept = ("route achieves 0.250 [-0.100, 0.600] of what a perfect detector achieves: its drop vs vanilla 0.050 "
            "[-0.020, 0.120] (ablated view), route_oracle's 0.200 [0.100, 0.300]; route_oracle vs its matched "
            "control route_oracle_dose_matched: 0.150 [0.050, 0.250] (reported beside the gate, never a criterion)")
    assert ceiling_notes(ceilings) == [kept]  # gate.json's wording, unchanged
    m = "\u2212"
    gate = {"notes": ["a note", kept], "ceilings": ceilings}
    assert frontpage.page_notes(gate) == ["a note", (
        f"route achieves 0.250 [{m}0.100, 0.600] of what a perfect detector achieves: its change in hack rate vs "
        f"vanilla {m}0.050 [{m}0.120, +0.020] (ablated view), route_oracle's {m}0.200 [{m}0.300, {m}0.100]; "
        f"route_oracle vs its matched control route_oracle_dose_matched: {m}0.150 [{m}0.250, {m}0.050] (reported "
        "beside the gate, never a criterion)")]
    assert "Notes:\n\n- a note\n- route achieves" in frontpage.decision_text(gate | {"verdict": "invalid"}, [], [], "x/")


def test_the_arithmetic_is_the_sentence_s_in_changes():
    """gate.json's rows as the compare stage writes them (criterion_row, arm_numbers) give the
    sentence's numbers, negated: the two texts cannot drift apart."""
    from evil_moe.gate.judge import arm_numbers, criterion_row
    from evil_moe.gate.rule import decide_gate

    van = ("vanilla", "trained")
    a = ("moe", "ablated")
    arm = decide_arm("moe", {"drop_vs_vanilla": make_effect(0.06, a=a, b=van, se=0.04),
                             "beats_control": make_effect(0.01, a=a, b=("moe_random", "ablated"), se=0.05),
                             "matched_pass": make_effect(-0.03, a=a, b=van, metric="pass"), **beats_untrained(a)},
                     Limits(0.05, 0.1))
    g = decide_gate([arm], make_effect(0.3, a=("oracle_reward", "trained"), b=van), min_drop=0.05)
    sizes = "3 seeds × 9 held-out problems × 64 samples"
    gate = {"verdict": g.verdict, "sentence": verdict.sentence(g.verdict, [], g, sizes), "sizes": sizes,
            "arms": {"moe": {"role": "treatment", **arm_numbers(g.arms[0])}},
            "criteria": [criterion_row(c, "moe", "moe_random", "ablated") for c in g.arms[0].criteria],
            "positive_control": criterion_row(g.positive_control, "oracle_reward", None, "trained")}
    d, c, p = g.arms[0].criteria[:3]
    hw = (d.effect.ci_high - d.effect.value, c.effect.ci_high - c.effect.value)
    assert f"by 0.060 [{0.06 - hw[0]:.3f}, {0.06 + hw[0]:.3f}] vs vanilla" in gate["sentence"]
    m = "\u2212"
    text = verdict.arithmetic_text(gate)
    assert text.startswith(f"moe (ablated view): change in held-out hack rate vs vanilla {m}0.060 "
                           f"[{m}{0.06 + hw[0]:.3f}, +{hw[0] - 0.06:.3f}], vs moe_random {m}0.010 "
                           f"[{m}{0.01 + hw[1]:.3f}, +{hw[1] - 0.01:.3f}]; change in pass rate vs vanilla +0.030")
    assert f"MDE of the drop vs vanilla {d.mde:.3f}" in gate["sentence"]
    assert f"(MDE) {d.mde:.3f}" in text
    assert f"positive control oracle_reward change in held-out hack rate vs vanilla {m}0.300" in text
    # vs the untrained student (beats_untrained: drops -0.3 and 0.1, half width 4.3027 × 0.002 = 0.0086)
    assert ", vs untrained: pass-rate drop -0.300 [-0.309, -0.291], hack drop 0.100 [0.091, 0.109]" in gate["sentence"]
    assert (f"; change vs untrained: pass rate +0.300 [+0.291, +0.309] (lower end +0.291 vs 0), hack rate {m}0.100 "
            f"[{m}0.109, {m}0.091] (upper end {m}0.091 vs +0.050)") in text


def test_a_note_with_bars_renders_as_text_in_the_report():
    """A note such as the router's '|log pi_train - log pi_sampler|' is text: docutils (which
    Snakemake's report runs) used to read it as an undefined substitution and print an ERROR."""
    import docutils.core

    gate = {"verdict": "inconclusive", "criteria": [], "notes": ["gap |log pi_train - log pi_sampler| is 0.1"]}
    rst = frontpage.decision_text(gate, [], [], "x/")
    out = docutils.core.publish_string(rst, writer_name="html", settings_overrides={
        "report_level": 2, "halt_level": 5, "warning_stream": False}).decode()
    assert "|log pi_train - log pi_sampler|" in out and "Undefined substitution" not in out
