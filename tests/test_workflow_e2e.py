"""The toy workflow end to end on tests/config/ci.yaml: through profiles/local, then the HTML
report's first page opened in headless Chromium, then through a real Slurm (tests/slurm/start.sh)
with the shipped profiles/slurm and only its EDIT values filled in: the same numbers as the local
run; one arm made to fail leaves the others complete; after removing the switch the same command
runs exactly that arm and the comparison; --retries 1 recovers a pilot that fails on its first
attempt only; a SIGKILLed Snakemake followed by the README's recovery (`evil-moe cancel-run`,
`--unlock`, rerun) runs no pilot twice at once; a second Slurm job of one pilot's command refuses.

Each run works in a temporary directory (never the repo's results/).
"""

from __future__ import annotations

import csv
import html
import json
import os
import re
import shutil
import socket
import subprocess
import time

import pandas as pd
import pytest
import yaml

from workflow_util import (BIN, CI_CONFIG, DEFAULT_CONFIG, REPO, SNAKEMAKE, chromium, dump_dom,
                           env, fill_edit_values, finished_rules, job_stats, no_slurm, snakemake)

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
    from evil_moe.rl.arms import ARMS as REGISTRY
    from evil_moe.gate.figures import FIGURES

    for arm in ARMS:
        views = set(pd.read_csv(res / "pilots" / arm / "s0" / "outcomes.tsv", sep="\t")["view"])
        assert views == set(REGISTRY[arm].views) | ({"projected"} if arm == "vanilla" else set()), arm
    for fig in FIGURES:
        assert (res / "compare" / "figures" / f"{fig}.svg").is_file()
    assert (res / "vhack" / "main_checks.tsv").is_file()
    decision = (res / "sweep" / "decision.rst").read_text()
    # the verdict word once, in bold, then the rest of the gate's sentence
    assert gate["sentence"].startswith(gate["verdict"])
    assert f"**Verdict: {gate['verdict']}**" + gate["sentence"][len(gate["verdict"]):] in decision
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
    sentence = re.sub(r"\s+", " ", gate["sentence"])
    assert sentence.startswith(gate["verdict"])
    verdict = f"Verdict: {gate['verdict']}" + sentence[len(gate["verdict"]):]
    assert verdict in text, text[:2000]
    assert text.count(f"Verdict: {gate['verdict']}") == 1
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
    # Two tables: per judged arm (treatments, ceilings, the positive control) with the drops and
    # the verdict; then the held-out rates of every (arm, view) of summary.tsv, in order.
    tables_ = re.findall(r"<table.*?</table>", page, re.S)
    assert len(tables_) >= 2, page[:3000]
    cells = [[[_visible_text(c) for c in re.findall(r"<t[hd][^>]*>(.*?)</t[hd]>", row, re.S)]
              for row in re.findall(r"<tr[^>]*>(.*?)</tr>", t, re.S)] for t in tables_[:2]]
    with open(res / "compare" / "summary.tsv", newline="") as fh:
        rows = list(csv.reader(fh, delimiter="\t"))
    arm_i, view_i = rows[0].index("arm"), rows[0].index("view")
    from evil_moe.rl.arms import ARMS

    judged = [f"{r[arm_i]} ({r[view_i]})" for r in rows[1:] if ARMS[r[arm_i]].role in
              ("treatment", "ceiling", "positive_control") and r[view_i] == ARMS[r[arm_i]].views[0]]
    assert cells[0][0] == ["arm (view)", "hack rate", "drop vs vanilla", "drop vs its control",
                           "share of its ceiling's drop", "verdict"]
    assert [r[0] for r in cells[0][1:]] == judged and judged
    for r in cells[0][1:]:
        arm = r[0].split(" ")[0]
        if ARMS[arm].role == "treatment":
            assert r[-1] == gate["arms"][arm]["verdict"]
    assert cells[1][0][:2] == ["arm", "view"]
    assert [r[:2] for r in cells[1][1:]] == [[r[arm_i], r[view_i]] for r in rows[1:]]
    # The page starts at the top of the window, not centred below blank space (report.css).
    assert "align-items: flex-start" in report.read_text()
    # The per-arm table, then the sentence, the figure and the rates table.
    first, second = page.find("<table"), page.find("<table", page.find("<table") + 1)
    assert first < page.find("Verdict:") < page.find("<img") < second


# ---- Slurm ---------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def slurm_up():
    """Skip (before the toy run is made) when no Slurm node is idle."""
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


# Three of the CI config's arms (erase with its matched control; no positive control) keep the
# Slurm runs short on 2 CPUs; every pilot is compared with the local run's of the same arm.
SLURM_ARMS = ("vanilla", "erase", "random_v")


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


@pytest.fixture(scope="module")
def slurm_run(slurm_up, toy_run, tmp_path_factory):
    """The toy default (CI sizes) from nothing through Slurm: every stage a Slurm job."""
    work = tmp_path_factory.mktemp("slurm_run")
    _profile(work)
    proc = _slurm(work)
    return work, proc


@pytest.mark.slurm
def test_slurm_toy_default_same_numbers_as_local(slurm_run, toy_run):
    work, proc = slurm_run
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-6000:]
    ran = finished_rules(out)
    for rule in ("problems", "toy_summary", "teacher", "extract", "distill", "compare"):
        assert ran[rule] == 1, out[-4000:]
    assert ran["toy_model"] == 2, out[-4000:]
    assert ran["pilot"] == len(SLURM_ARMS)
    assert "pilot erase seed 0; log: results/logs/pilot/erase_s0.log" in out
    # The same numbers as the local run of the same config: every pilot's steps (all columns but
    # seconds) and its held-out evaluation. The thread count comes from the config.
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
    proc = _slurm(work, "--report", str(res / "report.html"))
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "Warning" not in proc.stdout + proc.stderr, proc.stderr[-4000:]


@pytest.mark.slurm
def test_slurm_failed_arm_rerun_and_retries(slurm_run, toy_run):
    assert yaml.safe_load(CI_CONFIG.read_text())["pilot"]["seeds"] == [0]
    work = slurm_run[0]
    assert slurm_run[1].returncode == 0
    res = work / "results"
    before = _mtimes(res, SLURM_ARMS)

    # 1. erase fails on purpose (the switch is in erase's params only): the other arms stay,
    #    compare cannot run.
    fail = work / "fail.yaml"
    fail.write_text(yaml.safe_dump({"pilot": {"fail_arm": "erase"}}))
    proc = _slurm(work, overlay=fail)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0, out[-4000:]
    assert "Error in rule pilot" in out and "pilot.fail_arm=erase" in (
        res / "logs" / "pilot" / "erase_s0.log").read_text()
    assert finished_rules(out) == {}, out[-4000:]
    assert not (res / "pilots" / "erase" / "s0" / "status.json").exists()
    # The stage config is passed as a file named by its content: the failed job's command and
    # Snakemake's "Params have changed" reason name it instead of printing the config (twice).
    assert re.search(r"Params have changed since last execution.*before: '@results/configs/"
                     r"pilot-\w+\.json' now: '@results/configs/pilot-\w+\.json'", out), out[-4000:]
    assert '"heldout_samples"' not in out, out[-4000:]
    assert _mtimes(res, ("vanilla", "random_v")) == {a: before[a] for a in ("vanilla", "random_v")}
    # The Slurm logs of the failed job and of the finished ones are kept
    # (slurm-keep-successful-logs in the profile; the plugin deletes the latter by default).
    slurm_logs = work / ".snakemake" / "slurm_logs"
    assert list((slurm_logs / "rule_pilot").rglob("*.log"))
    for rule in ("problems", "teacher", "extract", "distill", "compare"):
        assert list((slurm_logs / f"rule_{rule}").rglob("*.log")), rule
    for arm in ("vanilla", "random_v"):  # the finished pilots of the first run
        assert list((slurm_logs / "rule_pilot" / f"{arm}_0").glob("*.log")), arm

    # 2. Without the switch, the same command would run exactly erase's pilot and compare ...
    dry = _slurm(work, "-n")
    assert dry.returncode == 0, dry.stderr[-4000:]
    assert job_stats(dry.stdout) == {"pilot": 1, "compare": 1, "all": 1}, dry.stdout[-3000:]
    assert "pilot erase seed 0" in dry.stdout and "pilot vanilla" not in dry.stdout
    # ... and does, with erase's numbers as before. The comparison then writes a byte-identical
    # gate.json, so Snakemake (which compares checksums) finds the first page and `all` up to
    # date and stops at "2 of 3 steps (67%) done": nothing is left to do.
    page = (res / "sweep" / "decision.rst").read_text()
    proc = _slurm(work)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-6000:]
    assert finished_rules(out) == {"pilot": 1, "compare": 1}, out[-4000:]
    assert '"heldout_samples"' not in out, out[-4000:]
    assert _mtimes(res, ("vanilla", "random_v")) == {a: before[a] for a in ("vanilla", "random_v")}
    local = toy_run[0] / "results" / "pilots" / "erase" / "s0" / "steps.tsv"
    assert _without_seconds(res / "pilots" / "erase" / "s0" / "steps.tsv") == _without_seconds(local)
    assert (res / "sweep" / "decision.rst").read_text() == page
    dry = _slurm(work, "-n")
    assert "Nothing to be done" in dry.stdout + dry.stderr, dry.stdout[-3000:]

    # 3. --retries 1 recovers a pilot that fails on its first attempt only (random_v: exactly
    #    random_v's pilot and compare rerun).
    once = work / "once.yaml"
    once.write_text(yaml.safe_dump({"pilot": {"fail_once_arm": "random_v"}}))
    proc = _slurm(work, "--retries", "1", overlay=once)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-6000:]
    assert "Error in rule pilot" in out and "pilots/random_v/s0" in out  # the first attempt failed
    assert (res / "pilots" / "random_v" / "s0" / ".failed_once").exists()
    assert json.loads((res / "pilots" / "random_v" / "s0" / "status.json").read_text())["status"] == "ok"
    assert finished_rules(out)["pilot"] == 1
    assert _mtimes(res, ("vanilla",)) == {"vanilla": before["vanilla"]}


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
def test_slurm_killed_driver_recovery(slurm_run, toy_run):
    work = slurm_run[0]
    assert slurm_run[1].returncode == 0
    res = work / "results"
    # 1. Every pilot again (--forcerun pilot); the driver is SIGKILLed once a pilot has started.
    cmd = [SNAKEMAKE, "--snakefile", str(REPO / "Snakefile"), "--directory", str(work),
           "--configfile", str(DEFAULT_CONFIG), str(CI_CONFIG), str(work / "arms.yaml"),
           "--profile", str(work / "profile")]
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
    unlock = _slurm(work, "--unlock")
    assert unlock.returncode == 0, unlock.stderr[-3000:]
    proc = _slurm(work)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-6000:]
    assert finished_rules(out)["pilot"] == len(SLURM_ARMS), out[-4000:]
    # Each pilot ran once in the rerun (one Slurm job each, completed), and never beside an old one.
    run_id = re.search(r"SLURM run ID: (\S+)", out).group(1)
    new = [r for r in _squeue("--name", run_id) if r[3].startswith("rule_pilot")]
    # (the plugin's comment: rule_pilot_wildcards_<arm>_<seed>)
    arms = sorted(r[3].removeprefix("rule_pilot_wildcards_").rsplit("_", 1)[0] for r in new)
    assert arms == sorted(SLURM_ARMS) and {r[1] for r in new} == {"COMPLETED"}, new
    local = toy_run[0] / "results" / "pilots"
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
    assert slurm_run[1].returncode == 0
    # vanilla's pilot command exactly as the workflow runs it, into a folder of its own
    dry = _slurm(work, "-n", "-p", "--forcerun", "pilot")
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
