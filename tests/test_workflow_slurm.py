"""The toy workflow through a real Slurm (tests/slurm/start.sh) and profiles/slurm: one arm made
to fail leaves the others complete; after removing the switch the same command runs exactly that
arm and the comparison; --retries 1 recovers a pilot that fails on its first attempt only."""

from __future__ import annotations

import json
import shutil
import subprocess

import pytest
import yaml

from workflow_util import CI_CONFIG, DEFAULT_CONFIG, REPO, env, finished_rules, job_stats, snakemake

pytestmark = [pytest.mark.slow, pytest.mark.slurm]

ARMS = ("vanilla", "erase", "route", "random_v")


def _idle_node() -> str | None:
    """Why Slurm cannot be used here, or None when a node is idle."""
    if shutil.which("sinfo") is None:
        return "sinfo not found (apt-get install slurm-client; start tests/slurm/start.sh)"
    try:
        proc = subprocess.run(["sinfo", "-h", "-N", "-o", "%T"], env=env(), capture_output=True,
                              text=True, timeout=20)
    except subprocess.TimeoutExpired:
        return "sinfo timed out"
    states = proc.stdout.split()
    if proc.returncode != 0 or not any(s in {"idle", "mixed"} for s in states):
        return f"no idle Slurm node (sinfo: {proc.stdout.strip() or proc.stderr.strip()})"
    return None


@pytest.fixture(scope="module")
def slurm_dir(tmp_path_factory):
    why = _idle_node()
    if why:
        pytest.skip(why)
    return tmp_path_factory.mktemp("slurm_run")


def _run(work, *extra, overlay=None, retries=None):
    configs = [DEFAULT_CONFIG, CI_CONFIG] + ([overlay] if overlay else [])
    args = ["--profile", str(REPO / "profiles" / "slurm"),
            "--workflow-profile", str(REPO / "tests" / "slurm" / "profile")]
    if retries is not None:
        args += ["--retries", str(retries)]
    return snakemake(work, *args, *extra, configfiles=configs, timeout=900)


def _mtimes(res, arms):
    return {a: (res / "pilots" / a / "s0" / "steps.tsv").stat().st_mtime_ns for a in arms}


def test_slurm_failed_arm_rerun_and_retries(slurm_dir):
    work = slurm_dir
    res = work / "results"
    seeds = yaml.safe_load(CI_CONFIG.read_text())["pilot"]["seeds"]
    assert seeds == [0]

    # 1. erase fails on purpose: the other arms finish, compare cannot run.
    fail = work / "fail.yaml"
    fail.write_text(yaml.safe_dump({"pilot": {"fail_arm": "erase"}}))
    proc = _run(work, overlay=fail)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0, out[-4000:]
    assert "Error in rule pilot" in out and "arm=erase" in out
    assert "executor: slurm" in out.lower() or "slurm" in out.lower()
    for arm in ("vanilla", "route", "random_v"):
        assert (res / "pilots" / arm / "s0" / "status.json").is_file(), out[-4000:]
    assert not (res / "pilots" / "erase" / "s0" / "status.json").exists()
    assert not (res / "compare" / "gate.json").exists()
    # The jobs went through Slurm (the plugin keeps the failed job's Slurm log).
    assert list((work / ".snakemake" / "slurm_logs" / "rule_pilot").rglob("*.log"))
    before = _mtimes(res, ("vanilla", "route", "random_v"))

    # 2. Without the switch, the same command would run exactly erase's pilot and compare ...
    dry = _run(work, "-n")
    assert dry.returncode == 0, dry.stderr[-4000:]
    assert job_stats(dry.stdout) == {"pilot": 1, "compare": 1, "all": 1}, dry.stdout[-3000:]
    assert "arm=erase" in dry.stdout and "arm=vanilla" not in dry.stdout
    # ... and does.
    proc = _run(work)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-6000:]
    assert finished_rules(out) == {"pilot": 1, "compare": 1, "sweep_decision": 1, "all": 1}, out[-4000:]
    assert _mtimes(res, ("vanilla", "route", "random_v")) == before
    gate = json.loads((res / "compare" / "gate.json").read_text())
    assert gate["verdict"] in {"separated", "not_separated", "invalid"}

    # 3. --retries 1 recovers a pilot that fails on its first attempt only (route; its params
    #    change, so route's pilot and compare rerun).
    once = work / "once.yaml"
    once.write_text(yaml.safe_dump({"pilot": {"fail_once_arm": "route"}}))
    proc = _run(work, overlay=once, retries=1)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-6000:]
    assert "Error in rule pilot" in out and "arm=route" in out  # the first attempt failed
    assert (res / "pilots" / "route" / "s0" / ".failed_once").exists()
    assert json.loads((res / "pilots" / "route" / "s0" / "status.json").read_text())["status"]
    assert finished_rules(out)["pilot"] == 1
