"""The toy workflow end to end on tests/config/ci.yaml: through profiles/local, then the HTML
report opened in headless Chromium, then through a real Slurm (tests/slurm/start.sh) and
profiles/slurm — one arm made to fail leaves the others complete; after removing the switch the
same command runs exactly that arm and the comparison; --retries 1 recovers a pilot that fails on
its first attempt only.

Each run works in a temporary directory (never the repo's results/). The Slurm run starts from
the local run's problem set and toy models (copied with their Snakemake metadata) and submits
every later stage to Slurm, so the toy models are trained once per session.
"""

from __future__ import annotations

import html
import json
import re
import shutil
import subprocess

import pandas as pd
import pytest
import yaml

from workflow_util import (CI_CONFIG, DEFAULT_CONFIG, REPO, chromium, dump_dom, env,
                           finished_rules, job_stats, snakemake)

pytestmark = pytest.mark.slow

ARMS = tuple(yaml.safe_load(CI_CONFIG.read_text())["pilot"]["arms"])
LOCAL = ("--profile", str(REPO / "profiles" / "local"), "--cores", "2")


@pytest.fixture(scope="module")
def toy_run(tmp_path_factory):
    """One finished local run of the toy workflow (CI sizes) in a temporary directory."""
    work = tmp_path_factory.mktemp("local_run")
    proc = snakemake(work, *LOCAL)
    assert proc.returncode == 0, f"{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}"
    return work, proc


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
    from evil_moe.arms import ARMS as REGISTRY
    from evil_moe.stages.compare import FIGURES

    for arm in ARMS:
        views = set(pd.read_csv(res / "pilots" / arm / "s0" / "outcomes.tsv", sep="\t")["view"])
        assert views == set(REGISTRY[arm].views) | ({"projected"} if arm == "vanilla" else set()), arm
    for fig in FIGURES:
        assert (res / "compare" / "figures" / f"{fig}.svg").is_file()
    assert (res / "vhack" / "main_checks.tsv").is_file()
    decision = (res / "sweep" / "decision.rst").read_text()
    assert gate["sentence"] in decision
    ran = finished_rules(proc.stdout + proc.stderr)
    assert ran["pilot"] == len(ARMS) and ran["compare"] == 1 and ran["sweep_decision"] == 1
    if gate["verdict"] != "separated":
        assert "not justified" in decision or "not scheduled" in decision
        assert not (res / "sweep" / "compare").exists()
    # The same command again has nothing to do.
    again = snakemake(work, *LOCAL, "-n")
    assert again.returncode == 0, again.stderr[-4000:]
    assert "Nothing to be done" in again.stdout + again.stderr, again.stdout[-6000:]


@pytest.mark.skipif(chromium() is None, reason="chromium not installed (apt-get install chromium)")
def test_report_in_chromium(toy_run):
    work, _ = toy_run
    report = work / "results" / "report.html"
    proc = snakemake(work, "--report", str(report))
    assert proc.returncode == 0, proc.stderr[-4000:]
    gate = json.loads((work / "results" / "compare" / "gate.json").read_text())
    dom = dump_dom(report)
    # The verdict is rendered on the report's first page (the workflow description), not only
    # present in the page's data scripts ...
    visible = re.sub(r"<script.*?</script>", "", dom, flags=re.S)
    text = re.sub(r"\s+", " ", html.unescape(re.sub(r"<[^>]+>", "", visible)))
    assert f"Verdict: {gate['verdict']}." in text
    assert re.sub(r"\s+", " ", gate["sentence"]) in text
    if gate["verdict"] != "separated":
        assert "Sweep: not run." in text or "Sweep: not scheduled" in text
    # ... and the hack-rate trajectory figure is embedded as a result (an SVG data URI).
    i = dom.find('"results/compare/figures/hack_rate.svg": {')
    assert i >= 0, "hack_rate.svg is not a result of the report"
    assert '"data_uri": "data:image/svg+xml' in dom[i:i + 6000]


# ---- Slurm ---------------------------------------------------------------------------------
def _no_slurm() -> str | None:
    """Why Slurm cannot be used here, or None when a node is idle."""
    if shutil.which("sinfo") is None:
        return "sinfo not found (apt-get install slurm-client; start tests/slurm/start.sh)"
    try:
        ping = subprocess.run(["scontrol", "ping"], env=env(), capture_output=True, text=True,
                              timeout=20)
        if "UP" not in ping.stdout:
            first = ((ping.stdout or ping.stderr).strip().splitlines() or ["no answer"])[0]
            return f"no Slurm controller up (scontrol ping: {first})"
        proc = subprocess.run(["sinfo", "-h", "-N", "-o", "%T"], env=env(), capture_output=True,
                              text=True, timeout=20)
    except subprocess.TimeoutExpired:
        return "scontrol/sinfo timed out"
    if proc.returncode != 0 or not {"idle", "mixed"} & set(proc.stdout.split()):
        return f"no idle Slurm node (sinfo: {proc.stdout.strip() or proc.stderr.strip()})"
    return None


@pytest.fixture(scope="module")
def slurm_up():
    """Skip (before the toy run is made) when no Slurm node is idle."""
    why = _no_slurm()
    if why:
        pytest.skip(why)


def _slurm(work, *extra, overlay=None):
    configs = [DEFAULT_CONFIG, CI_CONFIG] + ([overlay] if overlay else [])
    return snakemake(work, "--profile", str(REPO / "profiles" / "slurm"),
                     "--workflow-profile", str(REPO / "tests" / "slurm" / "profile"), *extra,
                     configfiles=configs, timeout=1200)


def _mtimes(res, arms):
    return {a: (res / "pilots" / a / "s0" / "steps.tsv").stat().st_mtime_ns for a in arms}


@pytest.mark.slurm
def test_slurm_failed_arm_rerun_and_retries(slurm_up, toy_run, tmp_path):
    assert yaml.safe_load(CI_CONFIG.read_text())["pilot"]["seeds"] == [0]
    work = tmp_path
    res = work / "results"
    # Start from the local run's problems and toy models (with their metadata): every later
    # stage is a Slurm job.
    src = toy_run[0]
    (res / "models").mkdir(parents=True)
    shutil.copy2(src / "results" / "problems.jsonl", res / "problems.jsonl")
    for item in ("student", "teacher", "toy_summary.tsv", "student_summary.tsv", "teacher_summary.tsv"):
        copy = shutil.copytree if (src / "results" / "models" / item).is_dir() else shutil.copy2
        copy(src / "results" / "models" / item, res / "models" / item)
    shutil.copytree(src / ".snakemake" / "metadata", work / ".snakemake" / "metadata")

    # 1. erase fails on purpose: the other arms finish, compare cannot run.
    fail = work / "fail.yaml"
    fail.write_text(yaml.safe_dump({"pilot": {"fail_arm": "erase"}}))
    proc = _slurm(work, overlay=fail)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0, out[-4000:]
    assert "Error in rule pilot" in out and "pilot.fail_arm=erase" in (
        res / "logs" / "pilot" / "erase_s0.log").read_text()
    assert "toy_model" not in finished_rules(out) and "toy_summary" not in finished_rules(out)
    for rule in ("teacher", "extract", "distill"):
        assert finished_rules(out)[rule] == 1, out[-4000:]
    for arm in ("vanilla", "route", "random_v"):
        assert (res / "pilots" / arm / "s0" / "status.json").is_file(), out[-4000:]
    assert not (res / "pilots" / "erase" / "s0" / "status.json").exists()
    assert not (res / "compare" / "gate.json").exists()
    # The jobs went through Slurm: the plugin keeps the failed job's Slurm log.
    assert list((work / ".snakemake" / "slurm_logs" / "rule_pilot").rglob("*.log"))
    before = _mtimes(res, ("vanilla", "route", "random_v"))

    # 2. Without the switch, the same command would run exactly erase's pilot and compare ...
    dry = _slurm(work, "-n")
    assert dry.returncode == 0, dry.stderr[-4000:]
    assert job_stats(dry.stdout) == {"pilot": 1, "compare": 1, "all": 1}, dry.stdout[-3000:]
    assert "arm=erase" in dry.stdout and "arm=vanilla" not in dry.stdout
    # ... and does (plus the gate note written from the new gate.json).
    proc = _slurm(work)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-6000:]
    assert finished_rules(out) == {"pilot": 1, "compare": 1, "sweep_decision": 1, "all": 1}, out[-4000:]
    assert _mtimes(res, ("vanilla", "route", "random_v")) == before
    assert json.loads((res / "compare" / "gate.json").read_text())["verdict"]

    # 3. --retries 1 recovers a pilot that fails on its first attempt only (route: the switch
    #    is in route's params only, so exactly route's pilot and compare rerun).
    once = work / "once.yaml"
    once.write_text(yaml.safe_dump({"pilot": {"fail_once_arm": "route"}}))
    proc = _slurm(work, "--retries", "1", overlay=once)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-6000:]
    assert "Error in rule pilot" in out and "arm=route" in out  # the first attempt failed
    assert (res / "pilots" / "route" / "s0" / ".failed_once").exists()
    assert json.loads((res / "pilots" / "route" / "s0" / "status.json").read_text())["status"] == "ok"
    assert finished_rules(out)["pilot"] == 1
    assert _mtimes(res, ("vanilla", "random_v")) == {a: before[a] for a in ("vanilla", "random_v")}
