"""`make run`'s own logic (the Makefile's run target) around Snakemake, with a stand-in Snakemake:
one make run at a time per folder, and a failed job told from a Snakemake that could not start.
The stand-in takes Snakemake's folder lock as Snakemake does (refusing with
its LockException message while another holds it) and logs every call."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from workflow_util import REPO

pytestmark = pytest.mark.skipif(not (shutil.which("make") and shutil.which("flock")),
                                reason="needs make and flock (util-linux)")

# A stand-in for .venv/bin/snakemake: logs its arguments; refuses while .snakemake/locks/ holds a
# lock (Snakemake's message); a run (not --report) holds the lock until the file `release` exists
# when `hold` exists, and fails as a job failure when `fail_job` exists, or as a config error when
# `fail_config` exists.
SNAKEMAKE = """#!/bin/bash
echo "$*" >> calls.log
if ls .snakemake/locks/*.lock >/dev/null 2>&1; then
  echo "LockException: Error: Directory cannot be locked. Please make sure that no other Snakemake process is trying to create the same files" >&2
  exit 1
fi
case " $* " in *" --report "*) exit 0;; esac
mkdir -p .snakemake/locks && touch .snakemake/locks/$$.lock
trap 'rm -f .snakemake/locks/$$.lock' EXIT
if [ -e hold ]; then
  touch started
  for _ in $(seq 600); do [ -e release ] && break; sleep 0.1; done
fi
if [ -e fail_job ] && [[ " $* " != *allow_missing* ]]; then
  echo "Error in rule pilot:" >&2; echo "Exiting because a job execution failed. Look above for error messages" >&2
  exit 1
fi
if [ -e fail_config ]; then echo "WorkflowError: results/compare/gate.json is damaged: ..." >&2; exit 1; fi
exit 0
"""


def _tree(tmp_path: Path) -> Path:
    """A folder where `make -f <repo>/Makefile run BIN=fakebin` finds an installed venv of
    stand-ins (python: the sandbox check passes; evil-moe: prints a verdict)."""
    work = tmp_path / "work"
    fake = work / "fakebin"
    fake.mkdir(parents=True)
    for name in ("requirements.txt", "requirements-dev.txt", "pyproject.toml"):
        (work / name).touch()
        os.utime(work / name, (1, 1))  # older than .installed: make does not reinstall
    (fake / ".installed").touch()
    scripts = {"snakemake": SNAKEMAKE, "python": "#!/bin/sh\nexit 0\n",
               "evil-moe": "#!/bin/sh\necho \"verdict: stand-in ($*)\"\n"}
    for name, text in scripts.items():
        (fake / name).write_text(text)
        (fake / name).chmod(0o755)
    return work


def _make(work: Path, **kw):
    cmd = ["make", "-s", "-f", str(REPO / "Makefile"), "-C", str(work), "run", "BIN=fakebin", "CORES=1"]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kw)


def _calls(work: Path) -> list[str]:
    log = work / "calls.log"
    return log.read_text().splitlines() if log.is_file() else []


def test_a_second_make_run_says_another_holds_the_folder(tmp_path):
    """While one make run runs, a second one in the same folder stops at once, saying another
    make run holds the folder (and who), starts no Snakemake, compares nothing and prints no
    verdict; the first finishes undisturbed. On 09ede95 the second said "a job failed" and
    printed the previous verdict."""
    work = _tree(tmp_path)
    (work / "hold").touch()
    first = _make(work)
    try:
        for _ in range(300):
            if (work / "started").exists():
                break
            time.sleep(0.1)
        assert (work / "started").exists(), first.communicate(timeout=5)
        second = _make(work)
        out, err = second.communicate(timeout=60)
        assert second.returncode != 0
        assert "another make run holds this folder" in err and "pid " in err, err
        assert "a job failed" not in err and "verdict:" not in out, (out, err)
        assert len(_calls(work)) == 1  # only the first make run's Snakemake
    finally:
        (work / "release").touch()
        out, err = first.communicate(timeout=60)
    assert first.returncode == 0, err
    assert out.splitlines()[-1].startswith("verdict: stand-in"), out
    # the lock went with the first make run: the next one runs
    (work / "hold").unlink()
    again = _make(work)
    out, err = again.communicate(timeout=60)
    assert again.returncode == 0, err


def test_a_folder_locked_by_another_snakemake_is_named_not_compared(tmp_path):
    """Snakemake's own lock held (a Snakemake started by hand, or one killed that left it): make
    run says so and how to clear a stale one, and runs no comparison; on 09ede95 it said "a job
    failed" and ran the comparison."""
    work = _tree(tmp_path)
    (work / ".snakemake" / "locks").mkdir(parents=True)
    (work / ".snakemake" / "locks" / "0.input.lock").touch()
    proc = _make(work)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode != 0
    assert "another Snakemake holds this folder's lock" in err and "snakemake --unlock" in err, err
    assert "a job failed" not in err and "verdict:" not in out
    assert len(_calls(work)) == 1


def test_a_snakemake_error_before_any_job_failed_is_not_a_failed_job(tmp_path):
    """Snakemake stopping on an error of its own (here a damaged gate.json read while it builds
    the DAG) is not "a job failed": no comparison, no verdict."""
    work = _tree(tmp_path)
    (work / "fail_config").touch()
    proc = _make(work)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode != 0
    assert "gate.json is damaged" in err and "Snakemake stopped with the error above" in err, err
    assert "a job failed" not in err and "verdict:" not in out and len(_calls(work)) == 1


def test_a_failed_job_still_compares_what_finished(tmp_path):
    """A job failure keeps make run's fallback: compare and report what finished
    (config/allow_missing.yaml), print that verdict, exit non-zero."""
    work = _tree(tmp_path)
    (work / "fail_job").touch()
    proc = _make(work)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode != 0
    assert "a job failed" in err
    calls = _calls(work)
    assert len(calls) == 3 and all("allow_missing" in c for c in calls[1:]) and "--report" in calls[2], calls
    assert out.splitlines()[-1].startswith("verdict: stand-in"), out
