"""The sandbox's folders on the host (evil_moe/env/sandbox_dirs.py) are gone once the process that
made them is: closed or not, at a normal exit, on SIGTERM or SIGHUP, and after SIGKILL (no
process can clean after that: the next grader's start sweeps them). Each process runs with its
own TMPDIR, so the folders counted are its own and no other run's."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from evil_moe.env import sandbox_dirs
from stage_fixtures import evil_moe_cmd, set_flags, subprocess_env

# A grader that grades one completion, prints its zygote folders, then ends as argv[1] says.
GRADER = textwrap.dedent("""\
    import os, signal, sys, time
    # The case under test is a process that SIGTERM and SIGHUP end: a disposition inherited as
    # ignored (`nohup make test` ignores SIGHUP) leaves the grader nothing to handle.
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, signal.SIG_DFL)
    from evil_moe.env.grader import Grader
    from evil_moe.env.problems import load_problems

    probs = load_problems("toy")[:2]
    g = Grader(probs, workers=2, isolation=sys.argv[2])
    g.grade_many([(probs[0], "class Solution: pass")])
    print(" ".join(z.dir for z in g._pool._all), flush=True)
    sys.stdin.readline()     # the test has looked at the folders: end as told
    if sys.argv[1] == "abandon":
        sys.exit(0)          # never closed: the interpreter exits with the grader alive
    if sys.argv[1] == "os_exit":
        os._exit(0)          # no exit handlers at all (as after SIGKILL)
    # Wait for a signal in short sleeps: a signal that lands between the interpreter's last
    # check and the sleep's system call only sets a flag, which one long sleep would not look
    # at until it ends (CI saw a 120-s sleep outlast the test's 60-s wait).
    end = time.monotonic() + 120
    while time.monotonic() < end:
        time.sleep(0.05)
    """)


def _folders(tmp: Path) -> list[str]:
    return sorted(p.name for p in tmp.iterdir() if p.name.startswith(sandbox_dirs.PREFIX))


def _isolation() -> str:
    from evil_moe.env.sandbox import probe_bwrap

    return "bwrap" if probe_bwrap() is None else "rlimit-only"


def _grader(tmp: Path, how: str, isolation: str) -> tuple[subprocess.Popen, list[str]]:
    tmp.mkdir(parents=True, exist_ok=True)
    proc = subprocess.Popen([sys.executable, "-c", GRADER, how, isolation], text=True,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                            env={**os.environ, "TMPDIR": str(tmp)})
    dirs = proc.stdout.readline().split()
    try:
        # The grader waits on stdin, so its folders cannot be cleaned away while they are checked
        # (an abandoned grader's exit removes them at once: CI saw them gone under load).
        assert len(dirs) == 2 and all(Path(d).is_dir() and Path(d).parent.parent == tmp for d in dirs), dirs
        assert len({Path(d).parent for d in dirs}) == 1  # one parent folder per grader
    finally:
        proc.stdin.write("\n")
        proc.stdin.close()
    return proc, dirs


@pytest.fixture(scope="module")
def isolation():
    return _isolation()


def test_an_abandoned_grader_leaves_nothing_when_its_process_exits(tmp_path, isolation):
    proc, dirs = _grader(tmp_path, "abandon", isolation)
    assert proc.wait(60) == 0
    assert _folders(tmp_path) == []


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP])
def test_a_signalled_grader_leaves_nothing_and_keeps_its_exit_status(tmp_path, isolation, sig):
    proc, dirs = _grader(tmp_path, "wait", isolation)
    proc.send_signal(sig)
    assert proc.wait(60) == -sig  # the signal's default action, after the clean-up
    assert _folders(tmp_path) == []


def test_a_signal_as_soon_as_the_parent_folder_exists_removes_it(tmp_path):
    """The earliest SIGTERM that can find a folder on disk (sent the moment ``mkdir`` returns,
    as a scheduler's can at start-up) still removes it: CI once saw one left behind when the
    handler was installed after the folder was made."""
    child = textwrap.dedent("""\
        import os, signal
        from evil_moe.env import sandbox_dirs
        real = os.mkdir
        def mkdir_then_sigterm(path, mode=0o777):
            real(path, mode)
            os.kill(os.getpid(), signal.SIGTERM)
        os.mkdir = mkdir_then_sigterm
        sandbox_dirs.make_parent()
        """)
    proc = subprocess.run([sys.executable, "-c", child], env={**os.environ, "TMPDIR": str(tmp_path)},
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == -signal.SIGTERM, proc.stderr
    assert _folders(tmp_path) == []


@pytest.mark.parametrize("how", ["sigkill", "os_exit"])
def test_after_sigkill_the_next_grader_sweeps_the_dead_ones_folders(tmp_path, isolation, how):
    proc, dirs = _grader(tmp_path, "wait" if how == "sigkill" else "os_exit", isolation)
    if how == "sigkill":
        proc.kill()
    proc.wait(60)
    dead = _folders(tmp_path)
    assert len(dead) == 1 and Path(dirs[0]).is_dir()  # nothing could remove them
    nxt, mine = _grader(tmp_path, "wait", isolation)
    try:
        assert _folders(tmp_path) == [Path(mine[0]).parent.name]  # the dead one's are swept
    finally:
        nxt.send_signal(signal.SIGTERM)
        nxt.wait(60)
    assert _folders(tmp_path) == []


def _parent(tmp: Path, name: str, owner) -> Path:
    d = tmp / f"{sandbox_dirs.PREFIX}{name}"
    (d / "z0_x").mkdir(parents=True)
    if owner is not None:
        (d / sandbox_dirs.OWNER).write_text(json.dumps(owner))
    return d


def test_the_sweep_removes_only_folders_whose_owner_is_gone(tmp_path):
    """Gone: a dead pid; a live pid with another start time (reused); another boot of this host.
    Kept: this process's folder, a live owner, another host's, one without an owner file (an
    earlier version's flat folder, or a parent being made)."""
    me = sandbox_dirs.identity()
    parent = sandbox_dirs.identity(os.getppid())
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    gone = {"dead": {**me, "pid": dead.pid, "start": 1},
            "reused": {**parent, "start": (parent["start"] or 0) + 1},
            "reboot": {**me, "boot": "another-boot"}}
    kept = {"self": me, "live": parent, "host": {**me, "pid": dead.pid, "host": socket.gethostname() + "x"},
            "legacy": None}
    for name, owner in {**gone, **kept}.items():
        _parent(tmp_path, name, owner)
    removed = sandbox_dirs.sweep_stale(str(tmp_path))
    assert sorted(Path(r).name for r in removed) == sorted(sandbox_dirs.PREFIX + n for n in gone)
    assert _folders(tmp_path) == sorted(sandbox_dirs.PREFIX + n for n in kept)


def _n_rows(path: Path) -> int:
    return max(0, len(path.read_text().splitlines()) - 1) if path.is_file() else 0


def test_a_sigtermed_pilot_leaves_no_sandbox_folder(world, tmp_path):
    """A pilot stopped by SIGTERM (scancel, Slurm's time limit, Snakemake stopping its jobs)
    leaves no sandbox folder: as soon as its first folder exists (the grader's bubblewrap probe,
    before the pilot handles SIGTERM itself: the default exit, -15, after the clean-up) and after
    its first step (the pilot's own exit, 143, after its checkpoint)."""
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    env = {**subprocess_env(), "TMPDIR": str(tmp)}
    for when, ready in (("first folder", lambda out: _folders(tmp)),
                        ("first step", lambda out: _n_rows(out / "steps.partial.tsv") >= 1)):
        out = tmp_path / when.replace(" ", "_")
        args = ["pilot", *set_flags("pilot.steps=6"), "--problems", str(world.problems),
                "--model", str(world.student), "--vhack", str(world.vhack), "--random-vhack",
                str(world.random_vhack), "--arm", "erase", "--seed", "0", "--out-dir", str(out),
                "--threads", "1"]
        proc = subprocess.Popen([*evil_moe_cmd(), *args], env=env, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL)
        t0 = time.time()
        while not ready(out):
            assert proc.poll() is None and time.time() - t0 < 240, f"the pilot ended before its {when}"
            time.sleep(0.01)
        proc.send_signal(signal.SIGTERM)
        rc = proc.wait(120)
        assert rc in ((-signal.SIGTERM, 143) if when == "first folder" else (143,)), (when, rc)
        assert _folders(tmp) == [], when
