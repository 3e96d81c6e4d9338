"""``evil-moe cancel-run``: cancel the Slurm jobs that a dead Snakemake left running.

A Snakemake driver killed with SIGKILL (or a lost login session) cancels nothing: its queued and
running Slurm jobs go on, and a rerun would submit the same jobs again beside them. This finds
them and cancels them, then waits until they have ended, so that the rerun starts on a quiet
folder.

Which jobs: those of the current user (``squeue -u``) that the Snakemake Slurm executor plugin
(snakemake-executor-plugin-slurm 2.x) submitted from this working directory. The plugin names
every job after its run's UUID (``--job-name <uuid4>``, or ``<jobname_prefix>_<uuid4>``), gives
it the comment ``rule_<rule>[_wildcards_<wildcards>]`` and the working directory of the run
(``-D <workdir>``); all three must match. The run ids are also in Snakemake's own logs
(``.snakemake/log/*.snakemake.log``: "SLURM run ID: ..."), printed beside each job.

It refuses while a Snakemake driver of this folder is alive on this host (cancelling the jobs of
a live run would make it fail them); a driver on another login node cannot be seen from here.
"""

from __future__ import annotations

import getpass
import os
import re
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

from evil_moe.cluster.runlock import LIVE_STATES

RUN_NAME = re.compile(r"^(?:[A-Za-z0-9_-]{1,50}_)?[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}"
                      r"-[0-9a-f]{12}$")
SQUEUE_FORMAT = "%i\t%T\t%j\t%k\t%Z"


class CancelError(RuntimeError):
    """cancel-run cannot (or must not) go on; the one-line message says why."""


@dataclass(frozen=True)
class RunJob:
    """One Slurm job of a Snakemake run: ``job_id``, ``state``, ``run_id`` (the plugin's job
    name), ``comment`` (``rule_<rule>[_wildcards_...]``), ``workdir``."""

    job_id: str
    state: str
    run_id: str
    comment: str
    workdir: str

    @property
    def rule(self) -> str:
        return self.comment[len("rule_"):].split("_wildcards_")[0]


Runner = Callable[[Sequence[str]], subprocess.CompletedProcess]


def run_command(cmd: Sequence[str], error: type[Exception], hint: str) -> subprocess.CompletedProcess:
    """Run a Slurm command (text output captured, 60 s limit); a missing command raises
    ``error`` with one line naming it and ``hint`` (where to run it)."""
    try:
        return subprocess.run(list(cmd), capture_output=True, text=True, timeout=60)
    except FileNotFoundError as err:
        raise error(f"{cmd[0]} not found: {hint}") from err


def _run(cmd: Sequence[str]) -> subprocess.CompletedProcess:
    return run_command(cmd, CancelError, "run cancel-run where Snakemake submitted the jobs "
                       "(a Slurm login node)")


def _same_dir(a: str | os.PathLike, b: str | os.PathLike) -> bool:
    return os.path.realpath(a) == os.path.realpath(b)


def parse_squeue(text: str) -> list[RunJob]:
    """Jobs from ``squeue -h -o '%i\\t%T\\t%j\\t%k\\t%Z'`` (:data:`SQUEUE_FORMAT`)."""
    jobs = []
    for line in text.splitlines():
        parts = line.split("\t")
        if len(parts) == 5:
            jobs.append(RunJob(*(p.strip() for p in parts)))
    return jobs


def run_jobs(workdir: str | os.PathLike, run: Runner = _run,
             user: str | None = None) -> list[RunJob]:
    """The user's queued or running jobs that a Snakemake run submitted from ``workdir``.

    Raises:
        CancelError: squeue is missing or fails (names its message).
    """
    user = user or os.environ.get("USER") or getpass.getuser()
    proc = run(["squeue", "-h", "-u", user, "-o", SQUEUE_FORMAT])
    if proc.returncode != 0:
        raise CancelError(f"squeue failed: {(proc.stderr or proc.stdout).strip()}")
    return [j for j in parse_squeue(proc.stdout)
            if RUN_NAME.match(j.run_id) and j.comment.startswith("rule_")
            and j.state in LIVE_STATES and _same_dir(j.workdir, workdir)]


def logged_run_ids(workdir: str | os.PathLike) -> dict[str, str]:
    """Run id → Snakemake log file, from ``workdir/.snakemake/log/*.snakemake.log``."""
    out = {}
    for log in sorted(Path(workdir, ".snakemake", "log").glob("*.snakemake.log")):
        try:
            m = re.search(r"^SLURM run ID: (\S+)", log.read_text(errors="replace"), re.M)
        except OSError:
            continue
        if m:
            out[m.group(1)] = str(log)
    return out


def driver_pids(workdir: str | os.PathLike, proc_root: str = "/proc") -> list[int]:
    """Pids of Snakemake drivers on this host whose working directory is ``workdir`` (its cwd,
    or its ``--directory``/``-d``); the Snakemakes that run one job (``--target-jobs``, the
    plugin's ``slurm-jobstep``, anything inside a Slurm job) are not drivers."""
    pids = []
    for entry in Path(proc_root).iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().decode(errors="replace").split("\0")
            cwd = os.readlink(entry / "cwd")
        except OSError:
            continue
        if not any(os.path.basename(a) == "snakemake" for a in argv[:3]):
            continue
        # a job's own Snakemake (--target-jobs; the plugin's job step) or an unlock is no driver
        if "--target-jobs" in argv or "slurm-jobstep" in argv or "--unlock" in argv:
            continue
        try:
            if b"\0SLURM_JOB_ID=" in b"\0" + (entry / "environ").read_bytes():
                continue  # runs inside a Slurm job
        except OSError:
            pass
        where = cwd
        for i, a in enumerate(argv):
            if a in ("--directory", "-d") and i + 1 < len(argv):
                where = os.path.join(cwd, argv[i + 1])
            elif a.startswith("--directory="):
                where = os.path.join(cwd, a.split("=", 1)[1])
        if _same_dir(where, workdir):
            pids.append(int(entry.name))
    return sorted(pids)


def cancel_run(workdir: str | os.PathLike = ".", *, dry_run: bool = False, force: bool = False,
               wait_s: float = 300.0, run: Runner = _run, log: Callable[[str], None] = print,
               poll_s: float = 1.0) -> list[RunJob]:
    """Cancel (``scancel``) the Slurm jobs of the Snakemake runs of ``workdir`` and wait until
    they have ended (each job gets SIGTERM, then SIGKILL after Slurm's ``KillWait``; a pilot
    writes its checkpoint on SIGTERM).

    Args:
        workdir: the folder Snakemake ran in (its ``--directory``).
        dry_run: only list the jobs.
        force: go on although a Snakemake driver of this folder is alive on this host.
        wait_s: seconds to wait for the cancelled jobs to end (0: do not wait).
        run: runs squeue/scancel (a test seam).
        log: one line per job and a summary.

    Returns:
        the jobs found (cancelled unless ``dry_run``).

    Raises:
        CancelError: a live driver (without ``force``), squeue/scancel failing, or jobs still
            not ended after ``wait_s`` (names them).
    """
    workdir = os.path.realpath(workdir)
    drivers = driver_pids(workdir)
    if drivers and not force and not dry_run:
        raise CancelError(f"a Snakemake driver of {workdir} is still running here (pid "
                          f"{', '.join(map(str, drivers))}): stop it with Ctrl-C (SIGINT), which "
                          "cancels its own jobs, or pass --force")
    jobs = run_jobs(workdir, run)
    logs = logged_run_ids(workdir)
    for j in jobs:
        where = f" (log {os.path.relpath(logs[j.run_id], workdir)})" if j.run_id in logs else ""
        log(f"{'would cancel' if dry_run else 'cancelling'} job {j.job_id} {j.state:<10} "
            f"{j.comment} run {j.run_id}{where}")
    if not jobs:
        log(f"cancel-run: no Slurm job of a Snakemake run in {workdir} is queued or running")
        return jobs
    if dry_run:
        return jobs
    ids = [j.job_id for j in jobs]
    proc = run(["scancel", *ids])
    if proc.returncode != 0:
        raise CancelError(f"scancel failed: {(proc.stderr or proc.stdout).strip()}")
    deadline = time.monotonic() + wait_s
    left = ids
    while wait_s > 0:
        q = run(["squeue", "-h", "-j", ",".join(left), "-o", "%i\t%T"])
        states = dict(line.split("\t", 1) for line in q.stdout.splitlines() if "\t" in line)
        if q.returncode != 0 and "Invalid job id" not in q.stderr:
            raise CancelError(f"squeue failed while waiting: {q.stderr.strip()}")
        left = [i for i in left if states.get(i, "").strip() in LIVE_STATES]
        if not left:
            break
        if time.monotonic() > deadline:
            raise CancelError(f"cancelled, but job(s) {', '.join(left)} have not ended after "
                              f"{wait_s:.0f} s; wait, check `squeue -j {','.join(left)}`, then "
                              "rerun")
        time.sleep(poll_s)
    runs = sorted({j.run_id for j in jobs})
    log(f"cancel-run: cancelled {len(jobs)} job(s) of run(s) {', '.join(runs)}"
        + ("; all have ended" if wait_s > 0 else ""))
    return jobs
