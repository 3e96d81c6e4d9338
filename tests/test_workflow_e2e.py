"""The toy workflow end to end on tests/config/ci.yaml through profiles/local (the session's
``toy_run``, tests/conftest.py: made once and shared with tests/test_workflow_slurm.py, which
compares its Slurm runs with it): every stage's `evil-moe` command as the rules call it, every
arm's outputs, the verdict on the first page, the same command again has nothing to do; then the
HTML report's first page opened in headless Chromium.

Each run works in a temporary directory (never the repo's results/).
"""

from __future__ import annotations

import csv
import gzip
import html
import json
import re

import pandas as pd
import pytest
import yaml

from workflow_util import (CI_CONFIG, DEFAULT_CONFIG, REPO, chromium, dump_dom, finished_rules, job_stats,
                           report_layout, snakemake)
from workflow_util import LOCAL_PROFILE as LOCAL

pytestmark = pytest.mark.slow

ARMS = tuple(yaml.safe_load(CI_CONFIG.read_text())["pilot"]["arms"])


def test_local_end_to_end(toy_run):
    work, proc = toy_run
    res = work / "results"
    gate = json.loads((res / "compare" / "gate.json").read_text())
    assert gate["verdict"] in {"separated", "not_separated", "inconclusive", "invalid"}
    assert gate["sentence"]
    for arm in ARMS:
        for name in ("steps.tsv", "eval.tsv", "outcomes.tsv", "status.json", "adapter.safetensors"):
            assert (res / "pilots" / arm / "s0" / name).is_file()
        assert (res / "logs" / "pilot" / f"{arm}_s0.log").is_file()
    # every arm's views were evaluated: the ablated one where delta_s_hack is trained, vanilla's
    # static projection beside subtract
    from evil_moe.rl.arms.registry import ARMS as REGISTRY
    from evil_moe.gate.figures import FIGURES

    for arm in ARMS:
        views = set(pd.read_csv(res / "pilots" / arm / "s0" / "outcomes.tsv", sep="\t")["view"])
        assert views == set(REGISTRY[arm].views) | ({"projected"} if arm == "vanilla" else set()), arm
    for fig in FIGURES:
        assert (res / "compare" / "figures" / f"{fig}.svg").is_file()
    assert (res / "vhack" / "main_checks.tsv").is_file()
    decision = (res / "sweep" / "decision.rst").read_text()
    # the verdict word once, in bold, then the verdict in plain words; the gate's sentence below
    from evil_moe.gate.verdict import arithmetic_line, plain_verdict

    assert gate["sentence"].startswith(gate["verdict"])
    word, plain = gate["verdict"].replace("_", " "), plain_verdict(gate)
    assert plain.startswith(word)
    assert f"**Verdict: {word}**" + plain[len(word):] in decision
    assert arithmetic_line(gate) in decision
    for arm in ARMS:  # the thread count of the config, whatever the executor's cores
        status = json.loads((res / "pilots" / arm / "s0" / "status.json").read_text())
        assert status["torch_threads"] == 1
    # Each job says where its log is when it starts.
    assert "pilot erase seed 0; log: results/logs/pilot/erase_s0.log" in proc.stdout + proc.stderr
    ran = finished_rules(proc.stdout + proc.stderr)
    assert ran["pilot"] == len(ARMS) and ran["compare"] == 1 and ran["sweep_decision"] == 1
    if gate["verdict"] != "separated":
        assert "not justified" in decision or "not scheduled" in decision
        assert not (res / "sweep" / "compare").exists()
    # The same command again has nothing to do.
    again = snakemake(work, *LOCAL, "-n")
    assert again.returncode == 0, again.stderr[-4000:]
    assert "Nothing to be done" in again.stdout + again.stderr, again.stdout[-6000:]


def test_a_deleted_pilot_runs_again_with_the_comparison(toy_run, tmp_path):
    """A pilot folder removed by hand (a newcomer re-running one arm) is remade, and the
    comparison after it, instead of 'Nothing to be done' and a report that fails on the missing
    table (found by a fresh-clone walkthrough, 2026-12-02): the pilots' tables are targets of
    `all`. A dry run on a copy of the finished run: oracle_reward's pilot (nothing else reads it)
    and the compare checkpoint, nothing else of the pilots."""
    import shutil

    work = tmp_path / "copy"
    shutil.copytree(toy_run[0], work, symlinks=True)
    shutil.rmtree(work / "results" / "pilots" / "oracle_reward" / "s0")
    plan = snakemake(work, *LOCAL, "-n")
    assert plan.returncode == 0, plan.stderr[-4000:]
    jobs = job_stats(plan.stdout)
    assert jobs["pilot"] == 1 and jobs["compare"] == 1, plan.stdout[-3000:]
    assert "pilot oracle_reward seed 0" in plan.stdout + plan.stderr


def test_a_cut_gate_json_is_named_with_the_way_out(toy_run, tmp_path):
    """compare/gate.json cut short. Every command that reads it (a run, a dry
    run, the report, make run's verdict line) says in one line which file and what to do,
    instead of a JSONDecodeError traceback (09ede95); removing it, as told, makes the dry run
    plan compare again."""
    import shutil
    import subprocess

    from workflow_util import BIN, env

    work = tmp_path / "copy"
    shutil.copytree(toy_run[0], work, symlinks=True)
    gate = work / "results" / "compare" / "gate.json"
    gate.write_bytes(gate.read_bytes()[:100])
    told = "results/compare/gate.json is damaged: its SHA-256 is "
    for args in (("-n",), ("--report", str(work / "report.html"))):
        proc = snakemake(work, *LOCAL, *args)
        out = proc.stdout + proc.stderr
        assert proc.returncode != 0 and told in out and "remove it and run again" in out, out[-3000:]
        assert "JSONDecodeError" not in out and "Traceback" not in out, out[-3000:]
        assert len([line for line in out.splitlines() if "gate.json" in line]) == 1, out[-3000:]
    verdict = subprocess.run([str(BIN / "evil-moe"), "verdict"], cwd=work, env=env(), capture_output=True,
                             text=True)
    assert verdict.returncode == 1 and verdict.stdout == ""
    assert verdict.stderr.startswith(f"Error: {told}") and verdict.stderr.count("\n") == 1, verdict.stderr
    gate.unlink()
    plan = snakemake(work, *LOCAL, "-n")
    assert plan.returncode == 0 and job_stats(plan.stdout)["compare"] == 1, plan.stderr[-3000:]


def test_local_run_one_seed_cannot_separate_and_compare_prints_the_sentence(toy_run):
    """Once checked by a hand-run CLI chain (tests/test_cli.py), now on the workflow's own run of
    the same commands: with one seed (fewer than compare.min_seeds) no arm separates, and every
    drop_vs_vanilla criterion says why; compare prints the gate's sentence as its last line (its
    log); the teacher wrote teacher.n completions for each training problem."""
    from evil_moe.config import load_config
    from evil_moe.stages.common import load_problem_file, train_heldout

    work, _ = toy_run
    res = work / "results"
    cfg = load_config([DEFAULT_CONFIG, CI_CONFIG])
    assert len(cfg.pilot.seeds) < cfg.compare.min_seeds == 3
    gate = json.loads((res / "compare" / "gate.json").read_text())
    assert gate["verdict"] in {"not_separated", "inconclusive", "invalid"}
    drops = [c for c in gate["criteria"] if c["name"] == "drop_vs_vanilla"]
    assert drops and all(not c["passed"] and "fewer than 3 seeds cannot separate" in c["note"]
                         for c in drops)
    log = (res / "logs" / "compare.log").read_text()
    assert log.strip().splitlines()[-1] == gate["sentence"], log[-2000:]
    train, _ = train_heldout(load_problem_file(res / "problems.jsonl"), cfg)
    with gzip.open(res / "teacher" / "rollouts.jsonl.gz", "rt") as fh:
        ids = [json.loads(line)["problem_id"] for line in fh]
    assert sorted(ids) == sorted(p.id for p in train for _ in range(cfg.teacher.n))


def test_local_run_jobs_within_their_sizes_and_extract_logs_each_phase(toy_run):
    """Every model job's peak memory (its Snakemake benchmark file) stays within what its job
    size asks (evil_moe/cluster/resources.py), and extract shows each phase's progress in its
    log: the toy sizes of what tests/test_workflow_smollm2.py (-m realmodel) checks on SmolLM2."""
    from evil_moe.cluster.resources import job_size
    from evil_moe.config import load_config

    res = toy_run[0] / "results"
    sized = load_config([DEFAULT_CONFIG, CI_CONFIG]).raw
    benches = {"toy_models": ["toy_model_student.tsv", "toy_model_teacher.tsv"],
               "teacher": ["teacher.tsv"], "extract": ["extract_main.tsv"],
               "distill": ["distill.tsv"], "pilot": [f"pilot/{a}_s0.tsv" for a in ARMS]}
    for stage, files in benches.items():
        for name in files:
            with open(res / "benchmarks" / name, newline="") as fh:
                row = next(csv.DictReader(fh, delimiter="\t"))
            assert float(row["max_rss"]) <= job_size(sized, stage).mem_mb, (name, row["max_rss"])
    log = (res / "logs" / "extract" / "main.log").read_text()
    for phase in ("extract: gradients", "extract: bootstrap", "extract: n-pairs curve"):
        assert f"{phase}: 100%" in log, phase


def _visible_text(fragment: str) -> str:
    return re.sub(r"\s+", " ", html.unescape(re.sub(r"<[^>]+>", " ", fragment))).strip()


@pytest.mark.skipif(chromium() is None, reason="chromium not installed (apt-get install chromium)")
def test_report_first_page_in_chromium(toy_run):
    work, _ = toy_run
    report = work / "results" / "report.html"
    proc = snakemake(work, *LOCAL, "--report", str(report))
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "Warning" not in proc.stdout + proc.stderr, proc.stderr[-4000:]
    res = work / "results"
    gate = json.loads((res / "compare" / "gate.json").read_text())
    dom = dump_dom(report)
    # The first page is the workflow description (the "prose" block beside the rule graph) as
    # the browser rendered it: the title (a question, not a claim), the per-arm table, the verdict
    # (its word once), then the figure and the rates table, inline.
    m = re.search(r'<div class="prose prose-sm max-w-lg">(.*?)</div><div id="brand"', dom, re.S)
    assert m, dom[:3000]
    page = m.group(1)
    text = _visible_text(page)
    assert text.startswith("evil_moe: can reward hacking be stopped at the gradient? "), text[:600]
    from evil_moe.gate.verdict import plain_verdict

    word = gate["verdict"].replace("_", " ")
    plain = re.sub(r"\s+", " ", plain_verdict(gate))
    verdict = f"Verdict: {word}" + plain[len(word):]
    assert verdict in text, text[:2000]
    assert text.count(f"Verdict: {word}") == 1
    # the gate's arithmetic in the verdict's convention (changes, not gate.json's drops), when it
    # adds to the verdict line (a gate too small to judge says it all there)
    from evil_moe.gate.verdict import arithmetic_text

    arithmetic = re.sub(r"\s+", " ", arithmetic_text(gate))
    assert arithmetic in text and ("The gate's arithmetic" in text) == bool(arithmetic)
    if plain_verdict(gate) != gate["sentence"]:  # gate.json's sentence (its drops) is not shown
        assert re.sub(r"\s+", " ", gate["sentence"])[len(gate["verdict"]):].lstrip(": ") not in text
    if gate["verdict"] != "separated":
        assert "Sweep: not run." in text or "Sweep: not scheduled" in text
    # The figure is an image embedded in the page (a data URI of the SVG file), with its caption.
    img = re.search(r'<img[^>]*src="data:image/svg\+xml;base64,([^"]+)"', page)
    assert img, page[:3000]
    import base64

    figure = re.search(r'^FRONT_FIGURE = "(\w+)"', (REPO / "rules" / "common.smk").read_text(), re.M)[1]
    assert base64.b64decode(img.group(1)) == (res / "compare" / "figures" / f"{figure}.svg").read_bytes()
    caption = (REPO / "report" / f"fig_{figure}.rst").read_text()
    # (compared without whitespace: inline literals render as their own elements)
    assert "".join(caption.replace("``", "").split()) in "".join(text.split())
    # Two tables: per judged arm (treatments, ceilings, the positive control) with the changes and
    # the verdict; then the held-out rates of every (arm, view) of summary.tsv, in order.
    tables_ = re.findall(r"<table.*?</table>", page, re.S)
    assert len(tables_) >= 2, page[:3000]
    cells = [[[_visible_text(c) for c in re.findall(r"<t[hd][^>]*>(.*?)</t[hd]>", row, re.S)]
              for row in re.findall(r"<tr[^>]*>(.*?)</tr>", t, re.S)] for t in tables_[:2]]
    with open(res / "compare" / "summary.tsv", newline="") as fh:
        rows = list(csv.reader(fh, delimiter="\t"))
    arm_i, view_i = rows[0].index("arm"), rows[0].index("view")
    from evil_moe.rl.arms.registry import ARMS

    def judged_rows(roles):
        return [f"{r[arm_i]} ({r[view_i]})" for r in rows[1:] if ARMS[r[arm_i]].role in roles
                and r[view_i] == ARMS[r[arm_i]].views[0]]

    # the references first: vanilla and the untrained student
    judged = judged_rows(("reference",)) + judged_rows(("treatment", "ceiling", "positive_control"))
    assert {"vanilla (trained)", "untrained (trained)"} <= set(judged[:2])
    assert cells[0][0] == ["arm (view)", "hack rate", "hack: change vs untrained", "pass rate",
                           "pass: change vs untrained", "hack: change vs vanilla", "hack: change vs its control",
                           "share of its ceiling's change", "labels used (one run)", "verdict"]
    assert [r[0] for r in cells[0][1:]] == judged and judged
    for r in cells[0][1:]:
        arm = r[0].split(" ")[0]
        if ARMS[arm].role == "treatment":  # the verdict, with its finding's words when it has one
            assert r[-1].split(" (")[0] == gate["arms"][arm]["verdict"]
    assert cells[1][0][:2] == ["arm", "view"]
    assert [r[:2] for r in cells[1][1:]] == [[r[arm_i], r[view_i]] for r in rows[1:]]
    # The page starts at the top of the window, not centred below blank space (report.css).
    assert "align-items: flex-start" in report.read_text()
    # The verdict, the per-arm table, the gate's arithmetic, the figure and the rates table.
    first, second = page.find("<table"), page.find("<table", page.find("<table") + 1)
    arith = page.find("The gate's arithmetic") if arithmetic else first + 1
    assert page.find("Verdict:") < first < arith < page.find("<img") < second
    # What was tested, in three lines above the verdict: the question, the model, the arms and sizes.
    head = text[:text.find("Verdict:")]
    assert head.count("Question.") == head.count("Model.") == head.count("Arms and sizes.") == 1, head
    pl = yaml.safe_load(CI_CONFIG.read_text())["pilot"]
    assert f"{len(pl['seeds'])} seeds × {pl['steps']} steps × {pl['prompts_per_step']} prompts × a group of " \
           f"{pl['group']} rollouts" in head, head
    _first_screen(report, work / "screenshots", gate)


FIRST_SCREEN = 800  # px: a laptop's browser window


def _first_screen(report, shots, gate):
    """At 1024 and 1400 px wide, the first 800 px of the page show the question, the model, the
    arms and sizes, the verdict in one sentence and the per-arm table's vanilla and untrained
    rows, and nothing of the page lies under the navigation bar or off the window's right edge."""
    from evil_moe.gate.verdict import plain_verdict

    word = gate["verdict"].replace("_", " ")
    for width in (1024, 1400):
        lay = report_layout(report, width, 2000, screenshot=shots / f"first_page_{width}.png")
        assert lay["page"] is not None and lay["tables"], lay
        paras = {t.split(" ")[0] + (" " + t.split(" ")[1] if t.startswith("Arms") else ""): (t, b)
                 for t, b in lay["paragraphs"]}
        for key in ("Question.", "Model.", "Arms and", "Verdict:"):
            assert key in paras, (width, list(paras))
            assert paras[key][1][3] <= FIRST_SCREEN, (width, key, paras[key][1])
        verdict = paras["Verdict:"][0]
        assert verdict == f"Verdict: {word}" + re.sub(r"\s+", " ", plain_verdict(gate))[len(word):]
        assert not re.search(r"[.;:]\s+[A-Z]", verdict[len("Verdict: ") + len(word) + 1:]), verdict  # one sentence
        rows = {cell: box for cell, box in lay["tables"][0]["rows"]}
        for arm in ("vanilla (trained)", "untrained (trained)"):
            assert arm in rows and rows[arm][3] <= FIRST_SCREEN, (width, arm, rows.get(arm))
        nav_right = lay["nav"][2] if lay["nav"] else 0
        for box in [lay["page"], lay["tables"][0]["box"]]:
            assert box[0] >= nav_right - 1, (width, "under the navigation bar", box, lay["nav"])
            assert box[2] <= lay["viewport"][0] + 1, (width, "off the right edge", box, lay["viewport"])
