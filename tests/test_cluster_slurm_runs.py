"""`evil-moe cancel-run` (evil_moe/cluster/slurm_runs.py): exactly the jobs the Slurm executor plugin
submitted from this folder are cancelled, and the command returns only once they have ended; it
refuses while a Snakemake driver of the folder is alive here. Slurm's answers are faked here; the
CI-cluster run is tests/test_workflow_e2e.py::test_slurm_killed_driver_recovery."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from evil_moe.cluster.slurm_runs import CancelError, cancel_run, driver_pids, run_jobs

U1 = "297c85fb-7648-4ad9-b268-af2d0cae7b8a"
U2 = "0b3e1a52-1111-4c2d-9a6e-3f0d2c9e7b11"


def _squeue_text(work, other):
    rows = [
        ("11", "RUNNING", U1, "rule_pilot_wildcards_erase_0", work),      # ours
        ("12", "PENDING", U1, "rule_compare", work),                               # ours
        ("13", "RUNNING", f"myprefix_{U2}", "rule_pilot_wildcards_vanilla_0", work),  # ours
        ("14", "RUNNING", U1, "rule_pilot_wildcards_erase_0", other),    # another folder
        ("15", "RUNNING", "interactive", "rule_x", work),                          # not the plugin's
        ("16", "RUNNING", U2, "my own comment", work),                             # not the plugin's
    ]
    return "".join("\t".join(r) + "\n" for r in rows)


class FakeSlurm:
    """squeue/scancel answers; after scancel the jobs go COMPLETING for ``linger`` polls."""

    def __init__(self, text, linger=2):
        self.text, self.linger, self.calls, self.cancelled = text, linger, [], []

    def __call__(self, cmd):
        self.calls.append(list(cmd))
        if cmd[0] == "scancel":
            self.cancelled += cmd[1:]
            return subprocess.CompletedProcess(cmd, 0, "", "")
        if "-u" in cmd:
            return subprocess.CompletedProcess(cmd, 0, self.text, "")
        ids = cmd[cmd.index("-j") + 1].split(",")
        self.linger -= 1
        out = "".join(f"{i}\tCOMPLETING\n" for i in ids) if self.linger >= 0 else ""
        return subprocess.CompletedProcess(cmd, 0, out, "")


def test_only_this_folders_plugin_jobs(tmp_path):
    work, other = tmp_path / "work", tmp_path / "other"
    work.mkdir(), other.mkdir()
    fake = FakeSlurm(_squeue_text(str(work), str(other)))
    jobs = run_jobs(work, fake, user="alice")
    assert fake.calls[0][:4] == ["squeue", "-h", "-u", "alice"]
    assert [(j.job_id, j.rule) for j in jobs] == [("11", "pilot"), ("12", "compare"),
                                                  ("13", "pilot")]
    # the folder through a symlink is the same folder
    (tmp_path / "link").symlink_to(work)
    assert [j.job_id for j in run_jobs(tmp_path / "link", fake, user="alice")] == ["11", "12", "13"]


def test_cancel_waits_until_the_jobs_have_ended(tmp_path):
    work = tmp_path / "work"
    (work / ".snakemake" / "log").mkdir(parents=True)
    (work / ".snakemake" / "log" / "2026-12-01T1020.snakemake.log").write_text(
        f"Building DAG of jobs...\nSLURM run ID: {U1}\n")
    fake = FakeSlurm(_squeue_text(str(work), str(tmp_path)), linger=2)
    lines = []
    jobs = cancel_run(work, run=fake, log=lines.append, poll_s=0)
    assert fake.cancelled == ["11", "12", "13"] and len(jobs) == 3
    waits = [c for c in fake.calls if c[0] == "squeue" and "-j" in c]
    assert len(waits) == 3  # COMPLETING twice, then gone
    assert lines[0] == (f"cancelling job 11 RUNNING    rule_pilot_wildcards_erase_0 run "
                        f"{U1} (log .snakemake/log/2026-12-01T1020.snakemake.log)")
    assert lines[-1] == f"cancel-run: cancelled 3 job(s) of run(s) {U1}, myprefix_{U2}; all have ended"
    # a dry run cancels nothing
    fake = FakeSlurm(_squeue_text(str(work), str(tmp_path)))
    cancel_run(work, run=fake, log=lines.append, dry_run=True)
    assert fake.cancelled == []


def test_jobs_that_do_not_end_are_named(tmp_path):
    fake = FakeSlurm(_squeue_text(str(tmp_path), "/elsewhere"), linger=10 ** 6)
    with pytest.raises(CancelError, match=r"job\(s\) 11, 12, 13 have not ended after 0 s"):
        cancel_run(tmp_path, run=fake, log=lambda s: None, wait_s=1e-9, poll_s=0)


def test_nothing_to_cancel(tmp_path):
    lines = []
    assert cancel_run(tmp_path, run=FakeSlurm(""), log=lines.append) == []
    assert lines == [f"cancel-run: no Slurm job of a Snakemake run in {tmp_path.resolve()} is "
                     "queued or running"]


def _fake_snakemake(bin_dir, cwd, *args, env=None):
    exe = bin_dir / "snakemake"
    if not exe.exists():  # written once: rewriting it while an earlier fake's python reads it
        exe.write_text(f"#!{sys.executable}\nimport time\ntime.sleep(60)\n")  # ran an empty script
        exe.chmod(0o755)
    e = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_JOB")}
    return subprocess.Popen([str(exe), *args], cwd=cwd, env={**e, **(env or {})})


def test_refuses_while_a_driver_of_the_folder_lives(tmp_path):
    work, bin_dir = tmp_path / "work", tmp_path / "bin"
    work.mkdir(), bin_dir.mkdir()
    procs = [_fake_snakemake(bin_dir, work, "--profile", "slurm"),               # cwd
             _fake_snakemake(bin_dir, tmp_path, "--directory", "work"),          # --directory
             _fake_snakemake(bin_dir, work, "--unlock"),                         # not a run
             _fake_snakemake(bin_dir, work, "--executor", "slurm-jobstep"),      # a job step
             _fake_snakemake(bin_dir, work, "--target-jobs", "pilot:arm=erase"),  # runs one job
             _fake_snakemake(bin_dir, work, env={"SLURM_JOB_ID": "7"}),         # in a Slurm job
             _fake_snakemake(bin_dir, tmp_path)]                                 # another folder
    try:
        want = sorted(p.pid for p in procs[:2])
        deadline = time.monotonic() + 30  # until every fake has exec'd (its cmdline is its own)
        while sorted(driver_pids(work)) != want and time.monotonic() < deadline:
            time.sleep(0.1)
        assert sorted(driver_pids(work)) == want
        fake = FakeSlurm(_squeue_text(str(work), "/elsewhere"))
        with pytest.raises(CancelError) as err:
            cancel_run(work, run=fake, log=lambda s: None)
        pids = ", ".join(map(str, sorted(driver_pids(work))))
        assert str(err.value).startswith(f"a Snakemake driver of {work} is still running here "
                                         f"(pid {pids}): stop it with Ctrl-C")
        assert fake.cancelled == []
        cancel_run(work, run=fake, log=lambda s: None, force=True, poll_s=0)
        assert fake.cancelled == ["11", "12", "13"]
    finally:
        for p in procs:
            p.kill()
            p.wait()
