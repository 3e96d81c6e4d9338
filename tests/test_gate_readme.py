"""The README's figure and verdict line come from the run they quote (evil_moe/gate/readme.py,
`make readme-figure`): the committed figure is what the committed table draws, the README's line
is what the committed verdict says, and the verdict's numbers are the table's."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from evil_moe.gate import readme
from evil_moe.gate.verdict import plain_verdict

from workflow_util import REPO

TABLE, FIGURE, VERDICT = REPO / readme.TABLE, REPO / readme.FIGURE, REPO / readme.VERDICT


def _committed():
    """The three files `make readme-figure` commits (they must exist: the README quotes them)."""
    missing = [str(p.relative_to(REPO)) for p in (TABLE, FIGURE, VERDICT) if not p.is_file()]
    assert not missing, f"missing {missing}: run `make run && make readme-figure` and commit them"


def _pixels(path):
    from matplotlib.image import imread

    return imread(str(path))


def test_the_readme_figure_is_drawn_from_the_committed_table(tmp_path):
    _committed()
    drawn = readme.draw_readme_figure(TABLE, tmp_path / "heldout.png")
    want, got = _pixels(FIGURE), _pixels(drawn)
    assert want.shape == got.shape, "docs/img/heldout.png is not the figure of docs/img/heldout.tsv: make readme-figure"
    assert np.array_equal(want, got), "docs/img/heldout.png differs from the figure of docs/img/heldout.tsv: make readme-figure"


def test_the_readme_quotes_the_committed_verdict():
    _committed()
    record = json.loads(VERDICT.read_text())
    assert plain_verdict(record) == record["plain"]
    line = readme.readme_verdict_line(record)
    text = (REPO / "README.md").read_text()
    assert f"{readme.BEGIN}\n{line}\n{readme.END}" in text, "README's verdict line is stale: make readme-figure"
    assert record["sentence"].startswith(record["verdict"])


def test_the_verdict_numbers_are_the_tables():
    """verdict.json comes from the same run as heldout.tsv: every criterion's value and interval
    that the summary has a column for is the summary's drop (rounded to 3 decimals there), its
    rates the summary's."""
    _committed()
    record = json.loads(VERDICT.read_text())
    rows = {(r["arm"], r["view"]): r for r in readme.files.read_tsv_rows(TABLE)}
    cols = {"drop_vs_vanilla": ("drop_vs_vanilla", "drop_ci_low", "drop_ci_high"),
            "beats_control": ("drop_vs_control", "control_ci_low", "control_ci_high"),
            "hack_vs_untrained": ("drop_vs_untrained", "untrained_ci_low", "untrained_ci_high"),
            "pass_vs_untrained": ("pass_drop_vs_untrained", "pass_untrained_ci_low", "pass_untrained_ci_high")}
    checked = 0
    for c in record["criteria"]:
        if c["name"] not in cols:  # matched_pass: summary.tsv has no pass-rate drop vs vanilla
            continue
        row = rows[(c["arm"], c["view"])]
        for key, col in zip(("value", "ci_low", "ci_high"), cols[c["name"]]):
            if c[key] is None or not math.isfinite(c[key]):  # no interval (one seed): an empty cell
                assert row[col] in ("", "nan"), (c["name"], c["arm"], col, row[col])
            else:
                assert float(row[col]) == pytest.approx(round(c[key], 3), abs=1e-9), (c["name"], c["arm"], col)
        if c["name"] == "drop_vs_vanilla" and c["effect"]["mean_a"] is not None:
            assert float(row["hack_rate"]) == pytest.approx(c["effect"]["mean_a"], abs=5e-4)
            assert float(rows[("vanilla", "trained")]["hack_rate"]) == pytest.approx(c["effect"]["mean_b"], abs=5e-4)
        checked += 1
    assert checked >= 2


def _run(tmp_path, gate: dict, summary: str):
    res = tmp_path / "results" / "compare"
    res.mkdir(parents=True)
    (res / "gate.json").write_text(json.dumps(gate))
    (res / "summary.tsv").write_text(summary)
    return tmp_path / "results"


def test_update_readme_rewrites_the_four_files(tmp_path):
    from test_gate_verdict import ROUTE_GATE

    summary = ("arm\tview\thack_rate\thack_ci_low\thack_ci_high\tpass_rate\tpass_ci_low\tpass_ci_high\n"
               "vanilla\ttrained\t0.312\t0.042\t0.581\t0.4\t0.3\t0.5\n"
               "route\tablated\t0.318\t0.047\t0.59\t0.41\t0.3\t0.52\n")
    results = _run(tmp_path, ROUTE_GATE, summary)
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "README.md").write_text(f"# x\n\n{readme.BEGIN}\nold line\n{readme.END}\n\nrest\n")
    written = readme.update_readme(results, repo)
    assert [p.relative_to(repo).as_posix() for p in written] == [
        "docs/img/heldout.tsv", "docs/img/verdict.json", "docs/img/heldout.png", "README.md"]
    assert (repo / readme.TABLE).read_text() == summary
    record = json.loads((repo / readme.VERDICT).read_text())
    assert record["plain"] == plain_verdict(ROUTE_GATE)
    assert (repo / "README.md").read_text() == (
        f"# x\n\n{readme.BEGIN}\n{readme.readme_verdict_line(record)}\n{readme.END}\n\nrest\n")
    assert "+0.007 [\u22120.075, +0.089]" in readme.readme_verdict_line(record)
    assert np.array_equal(_pixels(repo / readme.FIGURE),
                          _pixels(readme.draw_readme_figure(repo / readme.TABLE, tmp_path / "again.png")))
    # bad input: one clear error, nothing lost
    with pytest.raises(FileNotFoundError, match="nowhere/compare/gate.json"):
        readme.update_readme(tmp_path / "nowhere", repo)
    (repo / "README.md").write_text("no markers\n")
    with pytest.raises(ValueError, match="verdict markers"):
        readme.update_readme(results, repo)
    assert (repo / "README.md").read_text() == "no markers\n"


def test_the_line_states_routes_detector_quality_with_its_interval():
    """Beside the verdict, route's detector audit (gate.json 'detector'): the AUC with
    its interval against the placebos' 95th percentile, and the operating point's FPR."""
    det = {"detector": "gradient", "auc": 0.5684, "auc_ci_low": 0.508, "auc_ci_high": 0.625,
           "placebo_p95": 0.602, "beats_placebo": False, "fpr": 0.11, "fpr_ci_low": 0.066, "fpr_ci_high": 0.169}
    assert readme.detector_clause(det) == (
        "Route's gradient detector on the policy's own rollouts: AUC 0.57 [0.51, 0.62], which does not "
        "beat its placebos (95th percentile 0.60), false-positive rate 0.11 [0.07, 0.17]. ")
    assert readme.detector_clause({"auc": None}) == "" and readme.detector_clause({}) == ""
    assert "which beats its placebos" in readme.detector_clause(det | {"beats_placebo": True})
    from test_gate_verdict import ROUTE_GATE

    record = readme.verdict_record(ROUTE_GATE | {"detector": det | {"mode": "all"}})
    assert record["detector"]["auc"] == 0.5684 and "mode" not in record["detector"]
    assert readme.detector_clause(record["detector"]) in readme.readme_verdict_line(record)


def test_the_readme_and_make_run_say_the_first_page_s_verdict(tmp_path):
    """The README's line (verdict.json's ``plain``) and the last line of `make run`
    (the Makefile's VERDICT, evil-moe verdict) are the first page's verdict in plain words, in its
    convention (changes, a true minus sign), also for a gate too small to judge: its record keeps
    the positive control's numbers, so the README does not fall back to gate.json's drop."""
    import re
    import subprocess
    import sys

    from evil_moe.gate.verdict import verdict_line
    from test_gate_verdict import MOE_GATE

    few = dict(MOE_GATE, sentence="inconclusive (too few seeds): 2 seeds ... drop 0.303 [0.014, 0.591] ...",
               positive_control=dict(MOE_GATE["positive_control"], n_seeds=2))
    m = "\u2212"
    tie = [dict(name="pass_vs_untrained", arm="moe", control="untrained", view="ablated", value=0.009, ci_low=-0.062,
                ci_high=0.081), dict(name="hack_vs_untrained", arm="moe", control="untrained", view="ablated",
                                     value=-0.025, ci_low=-0.076, ci_high=0.026)]
    untrained = dict(MOE_GATE, arms={**MOE_GATE["arms"], "moe": dict(MOE_GATE["arms"]["moe"],
                                                                     finding="no_better_than_untrained")},
                     criteria=MOE_GATE["criteria"] + tie)
    for gate in (MOE_GATE, few, untrained):
        record = json.loads(json.dumps(readme.verdict_record(gate)))  # as verdict.json stores it
        assert record["plain"] == plain_verdict(record) == plain_verdict(gate)
        assert verdict_line(gate).endswith(record["plain"].split(":", 1)[1]), verdict_line(gate)
    assert (f"moe (ablated view) is no better than not training (change vs untrained: pass rate {m}0.009 [{m}0.081, "
            f"+0.062], hack rate +0.025 [{m}0.026, +0.076]): change in held-out") in readme.verdict_record(untrained)["plain"]
    assert f"vs vanilla {m}0.303 [{m}0.591, {m}0.014]" in readme.verdict_record(few)["plain"]
    make = (REPO / "Makefile").read_text()
    command = re.search(r"^VERDICT := \$\(BIN\)/(.*)$", make, re.M).group(1).split()
    (tmp_path / "results" / "compare").mkdir(parents=True)
    (tmp_path / "results" / "compare" / "gate.json").write_text(json.dumps(few))
    out = subprocess.run([str(Path(sys.executable).parent / command[0]), *command[1:]], cwd=tmp_path,
                         capture_output=True, text=True, check=True).stdout
    assert out == f"verdict: {plain_verdict(few)}\n"


def test_the_line_says_whether_the_ceiling_separates_from_its_control():
    """The default decides its own ceiling; the README's line says so from gate.json's
    ``ceilings`` (stored as drops: the control's rate minus the ceiling's), worked by hand: a drop
    of 0.177 [0.022, 0.332] is a change of −0.177 [−0.332, −0.022], separated; one interval that
    holds 0 is not. One entry per ceiling, though route and moe both sit beside it."""
    m = "\u2212"
    vs = {"value": 0.17708, "ci_low": 0.02168, "ci_high": 0.33249}
    gate = {"verdict": "inconclusive", "sentence": "x", "sizes": "6 seeds", "arms": {}, "criteria": [],
            "ceilings": {a: {"ceiling": "route_oracle", "view": "ablated", "ceiling_control": "route_oracle_dose_matched",
                             "ceiling_vs_control": vs} for a in ("route", "moe")}}
    record = readme.verdict_record(gate)
    assert list(record["ceilings"]) == ["route_oracle"]
    clause = readme.ceiling_clause(record["ceilings"])
    assert clause == ("The ceiling route_oracle (ablated view) vs its matched control route_oracle_dose_matched: "
                      f"change in held-out hack rate {m}0.177 [{m}0.332, {m}0.022], so the run tells perfect "
                      "flags from deleting as much at random. ")
    assert clause in readme.readme_verdict_line(record)
    held = readme.verdict_record(gate | {"ceilings": {"route": dict(gate["ceilings"]["route"], ceiling_vs_control=dict(
        vs, ci_low=-0.024))}})
    assert "cannot tell perfect flags from deleting as much at random at these sizes" in readme.ceiling_clause(held["ceilings"])
    assert readme.ceiling_clause({}) == "" and readme.verdict_record(dict(gate, ceilings=None))["ceilings"] == {}


def test_the_line_says_whether_the_ceiling_beats_not_training():
    """The ceiling's pass-rate drop vs the untrained student (gate.json stores the untrained
    student's rate minus the ceiling's) reads as a change: a drop of −0.070 [−0.158, 0.018] is a
    change of +0.070 [−0.018, +0.158], which does not tell it from not training; a drop whose upper
    end is below 0 beats it."""
    m = "\u2212"
    vs = {"value": 0.08984, "ci_low": 0.00624, "ci_high": 0.17345}
    held = {"value": -0.07031, "ci_low": -0.15818, "ci_high": 0.01755}
    gate = {"verdict": "inconclusive", "sentence": "x", "sizes": "8 seeds", "arms": {}, "criteria": [],
            "ceilings": {"route": {"ceiling": "route_oracle", "view": "ablated",
                                   "ceiling_control": "route_oracle_dose_matched", "ceiling_vs_control": vs,
                                   "ceiling_pass_drop_vs_untrained": held}}}
    clause = readme.ceiling_clause(readme.verdict_record(gate)["ceilings"])
    assert clause.endswith("; against the untrained student its pass rate changes +0.070 "
                           f"[{m}0.018, +0.158], which does not tell it from not training. ")
    beats = dict(held, ci_high=-0.004)
    clause = readme.ceiling_clause(readme.verdict_record(
        gate | {"ceilings": {"route": dict(gate["ceilings"]["route"], ceiling_pass_drop_vs_untrained=beats)}})["ceilings"])
    assert clause.endswith(f"changes +0.070 [+0.004, +0.158], so it beats not training. ")
