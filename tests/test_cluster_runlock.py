"""The output lock (evil_moe/cluster/runlock.py): one live writer per pilot folder. A live holder on this
host or a running Slurm job elsewhere makes a second run refuse with one line naming it; a dead
holder (SIGKILLed pid, a reused pid, an ended Slurm job, this job before a requeue) is taken over.
Last, two real `evil-moe pilot` processes of one pilot: the second refuses, the first finishes."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from dataclasses import replace

import pytest

from evil_moe.cluster import runlock
from evil_moe.cluster.runlock import LOCK_NAME, Holder, LockHeld, acquire, holder_state, release
from stage_fixtures import evil_moe_cmd, subprocess_env


def _no_squeue(cmd):
    raise AssertionError(f"Slurm must not be asked here: {cmd}")


def _squeue(states: dict, returncode=0, stderr=""):
    """A fake ``squeue -h -j ID -o %T`` answering from ``states`` (job id -> state)."""
    def run(cmd):
        assert cmd[:3] == ["squeue", "-h", "-j"], cmd
        return subprocess.CompletedProcess(cmd, returncode, states.get(cmd[3], "") + "\n", stderr)
    return run


@pytest.fixture
def sleeper():
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    yield proc
    proc.kill()
    proc.wait()


def _holder_of(proc, **kw) -> Holder:
    me = Holder.me()
    return replace(me, pid=proc.pid, start_ticks=runlock._start_ticks(proc.pid), token="other", **kw)


def test_acquire_writes_the_holder_and_release_removes_it(tmp_path):
    lock = tmp_path / LOCK_NAME
    me = acquire(lock, run=_no_squeue)
    rec = json.loads(lock.read_text())
    assert rec["pid"] == os.getpid() and rec["host"] == socket.gethostname()
    assert rec["job_id"] == (os.environ.get("SLURM_JOB_ID") or None)
    assert rec["token"] == me.token and rec["start_ticks"] == runlock._start_ticks(os.getpid())
    assert sorted(p.name for p in tmp_path.iterdir()) == [LOCK_NAME]  # no temp file left
    release(lock, me)
    assert not lock.exists()


def test_a_live_holder_on_this_host_refuses(tmp_path, sleeper):
    lock = tmp_path / LOCK_NAME
    lock.write_text(_holder_of(sleeper, job_id="4242").to_json())
    with pytest.raises(LockHeld) as err:
        acquire(lock, what="pilot erase s0", run=_no_squeue)
    msg = str(err.value)
    assert "\n" not in msg
    assert msg.startswith("pilot erase s0: refusing to start")
    assert f"Slurm job 4242, host {socket.gethostname()}, pid {sleeper.pid}" in msg
    assert str(lock) in msg and "evil-moe cancel-run" in msg
    assert json.loads(lock.read_text())["token"] == "other"  # untouched
    assert sorted(p.name for p in tmp_path.iterdir()) == [LOCK_NAME]


def test_a_dead_holder_on_this_host_is_taken_over(tmp_path):
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    dead = _holder_of(proc)
    proc.wait()  # reaped: its pid is free
    lock = tmp_path / LOCK_NAME
    lock.write_text(dead.to_json())
    notes = []
    me = acquire(lock, what="pilot erase s0", run=_no_squeue, log=notes.append)
    assert json.loads(lock.read_text())["token"] == me.token
    assert notes == [f"pilot erase s0: took over the stale lock {lock} (host {dead.host}, pid "
                     f"{dead.pid}, since {dead.since}; pid {dead.pid} is not running on "
                     f"{dead.host})"]
    assert sorted(p.name for p in tmp_path.iterdir()) == [LOCK_NAME]


def test_a_reused_pid_or_a_reboot_is_stale(sleeper):
    me = Holder.me()
    live = _holder_of(sleeper)
    assert holder_state(live, me=me, run=_no_squeue)[0] is True
    reused = replace(live, start_ticks=live.start_ticks - 1)
    assert holder_state(reused, me=me, run=_no_squeue) == \
        (False, f"pid {sleeper.pid} is another process now (reused pid)")
    rebooted = replace(live, boot_id="another-boot")
    assert holder_state(rebooted, me=me, run=_no_squeue) == (False, "the host rebooted since")


def test_another_host_asks_slurm():
    me = replace(Holder.me(), host="login1", job_id=None)
    other = Holder(host="node7", pid=123, job_id="77", start_ticks=1, boot_id="b", token="t")
    assert holder_state(other, me=me, run=_squeue({"77": "RUNNING"})) == \
        (True, "Slurm job 77 is RUNNING")
    assert holder_state(other, me=me, run=_squeue({"77": "PENDING"}))[0] is True  # requeued
    assert holder_state(other, me=me, run=_squeue({"77": "CANCELLED"})) == \
        (False, "Slurm job 77 has ended (CANCELLED)")
    assert holder_state(other, me=me, run=_squeue({})) == \
        (False, "Slurm job 77 has ended (gone from squeue)")
    gone = _squeue({}, 1, "slurm_load_jobs error: Invalid job id specified\n")
    assert holder_state(other, me=me, run=gone) == (False, "Slurm job 77 no longer exists")
    down = _squeue({}, 1, "slurm_load_jobs error: Unable to contact slurm controller\n")
    alive, why = holder_state(other, me=me, run=down)
    assert alive and "cannot ask Slurm about job 77" in why  # fail closed
    # the same Slurm job on another node: this job before a requeue (a job runs once at a time)
    assert holder_state(other, me=replace(me, job_id="77"), run=_no_squeue) == \
        (False, "it is this Slurm job (77) before a requeue")
    # outside Slurm on another host: cannot be checked, so held
    alive, why = holder_state(replace(other, job_id=None), me=me, run=_no_squeue)
    assert alive and "another host (node7) outside Slurm" in why


def test_a_foreign_file_is_not_overwritten(tmp_path):
    lock = tmp_path / LOCK_NAME
    lock.write_text("not json")
    with pytest.raises(LockHeld, match="is not a lock record"):
        acquire(lock, run=_no_squeue)
    assert lock.read_text() == "not json"


def test_the_decorator_holds_the_folder_during_the_call(tmp_path):
    seen = {}

    @runlock.locks_output("out_dir", lambda arm, **_: f"pilot {arm}")
    def job(*, arm, out_dir):
        seen["rec"] = json.loads((tmp_path / "o" / LOCK_NAME).read_text())
        with pytest.raises(LockHeld, match="^pilot erase: refusing to start"):
            job(arm="erase", out_dir=out_dir)  # a second run of the same folder
        raise SystemExit("fails on purpose")

    with pytest.raises(SystemExit):
        job(arm="erase", out_dir=str(tmp_path / "o"))
    assert seen["rec"]["pid"] == os.getpid()
    assert not (tmp_path / "o" / LOCK_NAME).exists()  # released although the call failed


def test_two_pilot_processes_of_one_folder_the_second_refuses(world, tmp_path):
    from test_stage_pilot import _pilot_args

    out = tmp_path / "erase"
    args = [*evil_moe_cmd(), *_pilot_args(world, out, "erase", "pilot.steps=3"), "--threads", "1"]
    first = subprocess.Popen(args, env=subprocess_env(), cwd=tmp_path, stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True)
    t0 = time.time()
    while not (out / LOCK_NAME).exists():
        assert first.poll() is None and time.time() - t0 < 120, first.communicate()[0]
        time.sleep(0.01)
    second = subprocess.run(args, env=subprocess_env(), cwd=tmp_path, capture_output=True,
                            text=True, timeout=300)
    assert first.poll() is None, "the first pilot ended before the second started"
    assert second.returncode == 1
    err = [line for line in second.stderr.splitlines() if line.strip()]
    assert len(err) == 1, second.stderr
    assert err[0].startswith(f"Error: pilot erase s0: refusing to start, {out / LOCK_NAME} is "
                             f"held by a live run (host {socket.gethostname()}, pid {first.pid}")
    assert first.wait(300) == 0, first.communicate()[0]
    assert json.loads((out / "status.json").read_text())["status"] == "ok"
    assert not (out / LOCK_NAME).exists()


def test_without_hard_links_the_lock_is_still_exclusive(tmp_path, monkeypatch, sleeper):
    def no_links(src, dst):
        raise PermissionError(1, "Operation not permitted")

    monkeypatch.setattr(os, "link", no_links)
    lock = tmp_path / LOCK_NAME
    me = acquire(lock, run=_no_squeue)
    assert json.loads(lock.read_text())["token"] == me.token
    release(lock, me)
    lock.write_text(_holder_of(sleeper).to_json())
    with pytest.raises(LockHeld, match=f"pid {sleeper.pid}"):
        acquire(lock, run=_no_squeue)
