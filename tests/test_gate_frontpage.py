"""The report's first page (evil_moe/gate/frontpage.py): verdict, embedded figure and the whole
summary table, rendered by docutils as Snakemake's report renders it."""

from __future__ import annotations

import base64
import os
import re

import pytest
from docutils.core import publish_parts

from evil_moe.gate.frontpage import front_page_rst, table_rst

SVG = b'<svg xmlns="http://www.w3.org/2000/svg" width="4" height="4"><rect width="4" height="4"/></svg>'


def _tsv(path, rows):
    path.write_text("\n".join("\t".join(r) for r in rows) + "\n")
    return path


def test_table_keeps_every_row_and_column(tmp_path):
    rows = [["arm", "view", "hack_rate", "note"], ["vanilla", "train", "0.4916666", ""],
            ["route", "eval_ablated", "0.390625", "a|b"]]
    html = publish_parts(table_rst(_tsv(tmp_path / "s.tsv", rows), "Per arm"),
                         writer="html")["body"]
    cells = [[re.sub(r"<[^>]+>", "", c).strip() for c in re.findall(r"<t[hd][^>]*>(.*?)</t[hd]>", r, re.S)]
             for r in re.findall(r"<tr[^>]*>(.*?)</tr>", html, re.S)]
    assert cells == [["arm", "view", "hack_rate", "note"], ["vanilla", "train", "0.492", "–"],
                     ["route", "eval_ablated", "0.391", "a|b"]]  # text shows as written


def test_front_page_embeds_the_figure_and_orders_the_parts(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    os.makedirs("results/compare/figures")
    (tmp_path / "results/compare/figures/hack_rate.svg").write_bytes(SVG)
    summary = _tsv(tmp_path / "results/compare/summary.tsv", [["arm", "hack_rate"], ["erase", "0.25"]])
    text = front_page_rst(verdict="**Verdict: separated.** route lowers the hack rate.",
                          decision="**Sweep: not run.**", figure="results/compare/figures/hack_rate.svg",
                          caption="Hack-rate\ntrajectory.", summary=summary)
    html = publish_parts(text, writer="html")["body"]
    src = re.search(r'<img[^>]*src="data:image/svg\+xml;base64,([^"]+)"', html)
    assert src and base64.b64decode(src.group(1)) == SVG
    order = [html.find(s) for s in ("Verdict: separated.", "<img", "Hack-rate trajectory.",
                                    "<table", "Sweep: not run.")]
    # with the gate: the verdict, the per-arm table, the gate's arithmetic, then the figure
    from test_gate_verdict import MOE_GATE

    html2 = publish_parts(front_page_rst(verdict="**Verdict: separated.** erase lowered hacking.", decision="",
                                         figure="results/compare/figures/hack_rate.svg", caption="Cap.",
                                         summary=_tsv(tmp_path / "s2.tsv", [["arm", "view", "hack_rate"],
                                                                             ["vanilla", "trained", "0.4"]]),
                                         gate=MOE_GATE), writer="html")["body"]
    order2 = [html2.find(s) for s in ("Verdict: separated.", "<table",
                                      "moe (ablated view): change in held-out hack rate vs vanilla \u22120.217", "<img")]
    assert -1 not in order2 and order2 == sorted(order2), order2
    assert -1 not in order and order == sorted(order)


def test_front_page_missing_figure_names_it(tmp_path):
    summary = _tsv(tmp_path / "s.tsv", [["arm"], ["erase"]])
    with pytest.raises(FileNotFoundError, match="nope.svg"):
        front_page_rst(verdict="v", decision="", figure=tmp_path / "nope.svg", caption="",
                       summary=summary)


def test_arm_table_shows_each_judged_arm_with_control_ceiling_and_verdict(tmp_path):
    """The first table: the references (vanilla, the untrained student) first, then treatments
    (judged view only), their ceiling and the positive control; controls are not rows; cells fold
    the intervals; each arm's pass rate stands beside its hack rate, each with its change vs the
    untrained student; drops are shown as changes (arm minus the other side: a rise reads as a
    rise); each arm's labels used, with their count for one run ("count unknown" where the
    summary has none, a dash for a summary without the columns); verdicts come from gate.json,
    with the finding "no better than not training"."""
    from evil_moe.gate.frontpage import arm_table_rst

    head = ["arm", "view", "hack_rate", "hack_ci_low", "hack_ci_high", "pass_rate", "pass_ci_low", "pass_ci_high",
            "drop_vs_untrained", "untrained_ci_low", "untrained_ci_high", "pass_drop_vs_untrained",
            "pass_untrained_ci_low", "pass_untrained_ci_high", "drop_vs_vanilla", "drop_ci_low",
            "drop_ci_high", "drop_vs_control", "control_ci_low", "control_ci_high", "ceiling_share",
            "ceiling_share_ci_low", "ceiling_share_ci_high", "labels", "labels_n"]
    none = [""] * 9  # no pass rate, no changes vs untrained
    rows = [head,
            ["vanilla", "trained", "0.4", "0.3", "0.5", "0.1", "0.05", "0.15", "-0.3", "-0.4", "-0.2", "0.3", "0.2",
             "0.4", "", "", "", "", "", "", "", "", "", "none", "0"],
            ["route", "ablated", "0.2", "0.1", "0.3", "0.38", "0.3", "0.46", "-0.1", "-0.2", "0", "0.02", "-0.06",
             "0.1", "0.2", "0.05", "0.35", "0.04", "-0.1", "0.18", "0.5", "0.1", "0.9", "vhack+calibration", "324"],
            ["route", "trained", "0.3", "0.2", "0.4"] + none + ["0.1", "0", "0.2"] + [""] * 8,
            ["route_dose_matched", "ablated", "0.24", "0.1", "0.3"] + none + ["0.16", "0", "0.3"] + [""] * 6
            + ["none", "0"],
            ["route_oracle", "ablated", "0.0", "0.0", "0.05"] + none + ["0.4", "0.3", "0.5", "0.3", "0.2", "0.4"]
            + [""] * 3 + ["rollouts", "1440"],
            ["oracle_reward", "trained", "0.05", "0", "0.1"] + none + ["0.35", "0.2", "0.5"] + [""] * 6
            + ["oracle_pass", ""],
            ["untrained", "trained", "0.1", "0.05", "0.15", "0.4", "0.3", "0.5"] + [""] * 6 + ["0.3", "0.2", "0.4"]
            + [""] * 6 + ["none", "0"]]
    gate = {"arms": {"route": {"verdict": "inconclusive", "finding": "no_better_than_untrained"}}}
    html = publish_parts(arm_table_rst(_tsv(tmp_path / "s.tsv", rows), gate), writer="html")["body"]
    cells = [[re.sub(r"<[^>]+>", "", c).strip() for c in re.findall(r"<t[hd][^>]*>(.*?)</t[hd]>", r, re.S)]
             for r in re.findall(r"<tr[^>]*>(.*?)</tr>", html, re.S)]
    assert cells[0] == ["arm (view)", "hack rate", "hack: change vs untrained", "pass rate", "pass: change vs untrained",
                        "hack: change vs vanilla", "hack: change vs its control", "share of its ceiling's change",
                        "labels used (one run)", "verdict"]
    assert [c[0] for c in cells[1:]] == ["vanilla (trained)", "untrained (trained)", "route (ablated)",
                                         "route_oracle (ablated)", "oracle_reward (trained)"]
    # vanilla hacks 0.3 more than not training and passes 0.3 less (drops -0.3 and 0.3 negated)
    assert cells[1][1:] == ["0.400 [0.300, 0.500]", "+0.300 [+0.200, +0.400]", "0.100 [0.050, 0.150]",
                            "−0.300 [−0.400, −0.200]", "–", "–", "–", "none", "reference"]
    assert cells[2][1:4] == ["0.100 [0.050, 0.150]", "–", "0.400 [0.300, 0.500]"]
    assert cells[2][5] == "−0.300 [−0.400, −0.200]"
    assert cells[3][1:] == ["0.200 [0.100, 0.300]", "+0.100 [0.000, +0.200]", "0.380 [0.300, 0.460]",
                            "−0.020 [−0.100, +0.060]", "−0.200 [−0.350, −0.050]",
                            "−0.040 [−0.180, +0.100] vs route_dose_matched", "0.500 [0.100, 0.900]",
                            "vhack + calibration: 324", "inconclusive (no better than not training)"]
    assert cells[4][6] == "−0.300 [−0.400, −0.200] vs route_oracle_dose_matched" and cells[4][9] == "reported (ceiling)"
    assert cells[4][8] == "rollouts: 1440"
    assert cells[5][6] == "–" and cells[5][9] == "reported (positive control)"
    assert cells[5][8] == "oracle_pass: count unknown"
    del rows[0][-2:]  # a summary written before the labels columns
    old = publish_parts(arm_table_rst(_tsv(tmp_path / "s.tsv", [r[:len(rows[0])] for r in rows]), gate),
                        writer="html")["body"]
    assert "labels used (one run)" in old and "vhack + calibration" not in old


def test_the_first_page_speaks_one_convention(tmp_path, monkeypatch):
    """Every difference of rates on the first page (the verdict, the per-arm table, the
    gate's arithmetic, the criteria, the notes) is the arm's rate minus the other side's with a
    true minus sign; gate.json's and summary.tsv's drops (vanilla's rate minus the arm's, ASCII
    minus) never show through. The gate and the summary are made by hand: drops of 0.217
    [-0.004, 0.438] vs vanilla read -0.217 [-0.438, +0.004] in every place."""
    from evil_moe.gate.frontpage import write_front_page
    from evil_moe.gate.frontpage import decision_text
    from evil_moe.gate.verdict import verdict_line
    from test_gate_verdict import MOE_GATE

    monkeypatch.chdir(tmp_path)
    (tmp_path / "f.svg").write_bytes(SVG)
    head = ["arm", "view", "hack_rate", "hack_ci_low", "hack_ci_high", "drop_vs_vanilla", "drop_ci_low",
            "drop_ci_high", "drop_vs_control", "control_ci_low", "control_ci_high", "ceiling_share",
            "ceiling_share_ci_low", "ceiling_share_ci_high"]
    summary = _tsv(tmp_path / "s.tsv", [head, ["vanilla", "trained", "0.3", "0.2", "0.4"] + [""] * 9,
                                        ["moe", "ablated", "0.083", "0.01", "0.2", "0.217", "-0.004", "0.438",
                                         "-0.02", "-0.205", "0.166", "0.5", "-0.1", "0.9"]])
    ceilings = {"moe": {"ceiling": "route_oracle", "view": "ablated", "ceiling_control": "route_oracle_dose_matched",
                        "drop": {"value": 0.217, "ci_low": -0.004, "ci_high": 0.438},
                        "ceiling_drop": {"value": 0.4, "ci_low": 0.3, "ci_high": 0.5}, "ceiling_vs_control": None,
                        "share": {"value": 0.5, "ci_low": -0.1, "ci_high": 0.9}}}
    from evil_moe.gate.verdict import ceiling_notes

    gate = dict(MOE_GATE, ceilings=ceilings, notes=[
        "moe's router sent 0.100 of each step's gradient energy to the hack expert", *ceiling_notes(ceilings)])
    text = write_front_page(tmp_path / "decision.rst", verdict=verdict_line(gate),
                            decision=decision_text(gate, [], [], "x/"), figure="f.svg", caption="Cap.",
                            summary=summary, gate=gate)
    page = re.sub(r"data:image[^\s]*(\n   [A-Za-z0-9+/=]+)*", "", text)
    m = "\u2212"
    change = f"{m}0.217 [{m}0.438, +0.004]"
    # the verdict line, the table's cell, the arithmetic, the criteria list and the ceiling's note
    assert page.count(change) == 5, page
    assert page.count(f"0.500 [{m}0.100, 0.900]") == 2  # the share: the table and the note
    assert not re.search(r"(?<!\w)-\d", page), re.findall(r".{40}(?<!\w)-\d.{20}", page)
    assert "lowers the held-out hack rate by" not in page and not re.search(r"(?<!_)drop [\d\u2212-]", page)


# Text from a config or a result file that tries to act as markup.
HOSTILE = ("m\n\n.. raw:: html\n\n   <script>window.EVIL41=1</script>\n\n.. include:: {secret}\n\n"
           "`click <javascript:alert(41)>`_ javascript:alert(42) |x| :raw-html:`<b>` name_")


def test_config_and_result_text_reaches_the_first_page_as_text(tmp_path, monkeypatch):
    """A pilot's reason that names a path under a hostile results folder, a note and the sweep
    folder, put on the first page and rendered by docutils with its defaults (raw and include on,
    as Snakemake calls it): the page shows the text, runs no script, pulls in no file and links
    nowhere."""
    from evil_moe.gate.frontpage import decision_text
    from evil_moe.gate.verdict import verdict_line

    monkeypatch.chdir(tmp_path)
    secret = tmp_path / "secret.txt"
    secret.write_text("secret-marker-4141\n")
    hostile = HOSTILE.format(secret=secret)
    (tmp_path / "f.svg").write_bytes(SVG)
    summary = _tsv(tmp_path / "s.tsv", [["arm", "view", "status"], ["vanilla", "trained", hostile.replace("\n", " ")]])
    note = f"missing: no {hostile}/pilots/vanilla/s0/status.json"
    gate = {"verdict": "invalid", "sentence": f"invalid: 1 of 1 pilots failed validity (vanilla s0: {note})",
            "criteria": [{"name": "valid", "arm": "vanilla", "seed": 0, "value": None, "threshold": 0.5,
                          "passed": False, "note": note}],
            "notes": [note], "arms": {}}
    separated = {"verdict": "separated", "criteria": []}
    decision = decision_text(gate, [], [], "x/") + "\n\n" + decision_text(separated, [1], [], hostile)
    text = front_page_rst(verdict=verdict_line(gate), decision=decision, figure="f.svg", caption="Cap.",
                          summary=summary, gate=gate)
    html = publish_parts(text, writer="html", settings_overrides={"report_level": 5})["body"]
    assert "<script" not in html and "secret-marker-4141" not in html
    assert "<b>" not in html and "href" not in html and "system-message" not in html
    shown = re.sub(r"<[^>]+>", "", html).replace("&lt;", "<").replace("&gt;", ">")
    # the verdict, the note, the sweep folder, the table cell
    assert shown.count(" ".join(hostile.split())) == 4, shown
