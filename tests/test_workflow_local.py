"""The toy workflow end to end through profiles/local on tests/config/ci.yaml, then the HTML
report, opened in headless Chromium."""

from __future__ import annotations

import json
import re

import pytest

from workflow_util import REPO, chromium, dump_dom, finished_rules, snakemake

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def toy_run(tmp_path_factory):
    """One finished local run of the toy workflow (CI sizes) in a temporary directory."""
    work = tmp_path_factory.mktemp("local_run")
    proc = snakemake(work, "--profile", str(REPO / "profiles" / "local"), "--cores", "2")
    assert proc.returncode == 0, f"{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}"
    return work, proc


def test_local_end_to_end(toy_run):
    work, proc = toy_run
    res = work / "results"
    gate = json.loads((res / "compare" / "gate.json").read_text())
    assert gate["verdict"] in {"separated", "not_separated", "invalid"}
    assert gate["sentence"]
    for arm in ("vanilla", "erase", "route", "random_v"):
        for name in ("steps.tsv", "eval.tsv", "status.json", "adapter.safetensors"):
            assert (res / "pilots" / arm / "s0" / name).is_file()
        assert (res / "logs" / "pilot" / f"{arm}_s0.log").is_file()
    for fig in ("hack_rate", "pass_rate", "cin", "frac_clipped", "cos_contrib"):
        assert (res / "compare" / "figures" / f"{fig}.svg").is_file()
    decision = (res / "sweep" / "decision.rst").read_text()
    assert gate["sentence"] in decision
    ran = finished_rules(proc.stdout + proc.stderr)
    assert ran["pilot"] == 4 and ran["compare"] == 1 and ran["sweep_decision"] == 1
    if gate["verdict"] != "separated":
        assert "not justified" in decision
        assert not (res / "sweep" / "compare").exists()
    # A second run of the same command has nothing to do.
    again = snakemake(work, "--profile", str(REPO / "profiles" / "local"), "--cores", "2", "-n")
    assert again.returncode == 0 and "Nothing to be done" in again.stdout + again.stderr


@pytest.mark.skipif(chromium() is None, reason="chromium not installed (apt-get install chromium)")
def test_report_in_chromium(toy_run):
    work, _ = toy_run
    report = work / "results" / "report.html"
    proc = snakemake(work, "--report", str(report))
    assert proc.returncode == 0, proc.stderr[-4000:]
    gate = json.loads((work / "results" / "compare" / "gate.json").read_text())
    dom = dump_dom(report)
    # The verdict is rendered on the report's first page (the workflow description) ...
    desc = dom.split('id="brand"')[0] if 'id="brand"' in dom else dom
    text = re.sub(r"<[^>]+>", "", desc)
    assert f"Verdict: {gate['verdict']}" in text
    assert gate["sentence"].split(":")[0] in text.replace("\n", " ")
    # ... and the hack-rate trajectory figure is embedded as a result (an SVG data URI).
    assert re.search(r"compare/figures/hack_rate\.svg.{0,400}data:image/svg\+xml", dom, re.S), \
        "hack_rate.svg not embedded in the report"
