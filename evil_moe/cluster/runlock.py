"""One live writer per output folder: a lock file that names its holder.

A pilot (``evil-moe pilot``) takes ``<out_dir>/run.lock`` before it touches its folder and
removes it when it ends, so a second run of the same pilot (a rerun submitted while a killed
Snakemake's Slurm job still runs, a second terminal) refuses to start instead of writing the same
checkpoint and tables. The file records who holds it (JSON): the Slurm job id
(``SLURM_JOB_ID``, None outside Slurm), the host name, the pid, the process's start time and the
kernel's boot id, a random token and when it was taken.

A lock is *stale* (its holder is gone, e.g. SIGKILLed) and is taken over when

- the holder ran on this host and its pid is not alive, or is alive but started at another time
  (a reused pid), or the host rebooted since (another boot id);
- the holder ran on another host and its Slurm job is no longer running (``squeue`` does not list
  it as pending, running, completing, suspended or stopped), or it is this very Slurm job run
  again (``slurm-requeue``: a requeued job keeps its id, and a job runs once at a time).

A holder on another host without a Slurm job id cannot be checked: the lock is then held (the
message says how to remove it by hand), and so is one whose Slurm job cannot be asked about
(``squeue`` missing or failing): fail closed.

Taking the lock is atomic, also on NFS: the record is written to a file of its own and then
hard-linked to ``run.lock`` (``link`` fails when the name exists; ``O_EXCL`` where the
filesystem has no hard links). A stale lock is renamed away
(atomic) and checked to be the one judged stale before it is deleted.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import json
import os
import secrets
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator, Sequence

LOCK_NAME = "run.lock"
# squeue states of a job that may still have processes on a node (a requeued job is PENDING).
LIVE_STATES = {"PENDING", "RUNNING", "COMPLETING", "CONFIGURING", "SUSPENDED", "STOPPED",
               "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "RESIZING", "SIGNALING", "STAGE_OUT"}


class LockHeld(RuntimeError):
    """Another live process holds the lock; the one-line message names it and the lock file."""


Runner = Callable[[Sequence[str]], subprocess.CompletedProcess]


def _run(cmd: Sequence[str]) -> subprocess.CompletedProcess:
    return subprocess.run(list(cmd), capture_output=True, text=True, timeout=60)


def _boot_id() -> str | None:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return None


def _start_ticks(pid: int) -> int | None:
    """The process's start time in clock ticks after boot (``/proc/<pid>/stat`` field 22), None
    where unreadable (no such process, or no /proc)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # the command name (field 2) is in parentheses and may hold spaces: split after the last ')'
    return int(stat[stat.rindex(")") + 2:].split()[19])


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, another user's
        return True
    return True


@dataclass(frozen=True)
class Holder:
    """Who holds a lock (the file's JSON)."""

    host: str
    pid: int
    job_id: str | None
    start_ticks: int | None
    boot_id: str | None
    token: str
    since: str = ""

    @classmethod
    def me(cls) -> "Holder":
        """This process."""
        pid = os.getpid()
        return cls(host=socket.gethostname(), pid=pid,
                   job_id=os.environ.get("SLURM_JOB_ID") or None, start_ticks=_start_ticks(pid),
                   boot_id=_boot_id(), token=secrets.token_hex(8),
                   since=time.strftime("%Y-%m-%dT%H:%M:%S%z"))

    def to_json(self) -> str:
        return json.dumps(self.__dict__, sort_keys=True) + "\n"

    @classmethod
    def parse(cls, text: str) -> "Holder":
        """A holder from the lock file's text.

        Raises:
            ValueError: not a lock record (the file was cut short or is something else).
        """
        try:
            d = json.loads(text)
            return cls(host=str(d["host"]), pid=int(d["pid"]),
                       job_id=str(d["job_id"]) if d.get("job_id") else None,
                       start_ticks=d.get("start_ticks"), boot_id=d.get("boot_id"),
                       token=str(d["token"]), since=str(d.get("since", "")))
        except (ValueError, KeyError, TypeError) as err:
            raise ValueError(f"not a lock record: {text[:200]!r}") from err

    def describe(self) -> str:
        job = f"Slurm job {self.job_id}, " if self.job_id else ""
        return f"{job}host {self.host}, pid {self.pid}, since {self.since or '?'}"


def holder_state(holder: Holder, *, me: Holder | None = None,
                 run: Runner = _run) -> tuple[bool, str]:
    """``(alive, why)``: whether the process that wrote the lock may still be running.

    Args:
        holder: the lock's record.
        me: this process (default :meth:`Holder.me`).
        run: runs ``squeue`` (a test seam).

    Returns:
        ``(True, reason)`` when it is (or may be) alive, ``(False, reason)`` when it is gone.
    """
    me = me or Holder.me()
    if holder.host == me.host:
        if holder.boot_id and me.boot_id and holder.boot_id != me.boot_id:
            return False, "the host rebooted since"
        if not _pid_alive(holder.pid):
            return False, f"pid {holder.pid} is not running on {holder.host}"
        if holder.start_ticks is not None:
            now = _start_ticks(holder.pid)
            if now is not None and now != holder.start_ticks:
                return False, f"pid {holder.pid} is another process now (reused pid)"
        return True, f"pid {holder.pid} is running on this host"
    if holder.job_id is None:
        return True, (f"it runs on another host ({holder.host}) outside Slurm, which cannot be "
                      "checked from here")
    if me.job_id is not None and holder.job_id == me.job_id:
        return False, f"it is this Slurm job ({me.job_id}) before a requeue"
    try:
        proc = run(["squeue", "-h", "-j", holder.job_id, "-o", "%T"])
    except (OSError, subprocess.SubprocessError) as err:
        return True, f"cannot ask Slurm about job {holder.job_id} ({err})"
    out = proc.stdout.strip().split()
    if proc.returncode != 0:
        if "Invalid job id" in proc.stderr:
            return False, f"Slurm job {holder.job_id} no longer exists"
        first = (proc.stderr.strip().splitlines() or ["failed"])[0]
        return True, f"cannot ask Slurm about job {holder.job_id} (squeue: {first})"
    if out and out[0] in LIVE_STATES:
        return True, f"Slurm job {holder.job_id} is {out[0]}"
    return False, f"Slurm job {holder.job_id} has ended ({out[0] if out else 'gone from squeue'})"


def _create(tmp: Path, path: Path) -> None:
    """Make ``path`` hold ``tmp``'s record, failing with FileExistsError when it exists: a hard
    link (atomic, also on NFS), or ``O_CREAT | O_EXCL`` where the filesystem has no hard links."""
    try:
        os.link(tmp, path)
    except FileExistsError:
        raise
    except OSError:  # EPERM / ENOTSUP: no hard links here (some FUSE and SMB mounts)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        with os.fdopen(fd, "w") as fh:
            fh.write(tmp.read_text())


def acquire(path: str | os.PathLike, *, what: str = "this run", run: Runner = _run,
            me: Holder | None = None, log: Callable[[str], None] = print) -> Holder:
    """Take the lock file ``path`` for this process, taking over a stale one.

    Args:
        path: the lock file (its folder must exist).
        what: names the run in the error (e.g. ``"pilot erase s0"``).
        run: runs ``squeue`` (a test seam).
        me: the record to write (default :meth:`Holder.me`).
        log: where the one-line note on a taken-over stale lock goes.

    Returns:
        the record written (pass it to :func:`release`).

    Raises:
        LockHeld: a live (or uncheckable) holder has it; names the holder and the file.
    """
    path = Path(path)
    me = me or Holder.me()
    tmp = path.with_name(f"{path.name}.{me.host}.{me.pid}.{me.token}")
    tmp.write_text(me.to_json())
    try:
        for _ in range(10):
            try:
                _create(tmp, path)
                return me
            except FileExistsError:
                pass
            try:
                text = path.read_text()
            except FileNotFoundError:
                continue  # released meanwhile: try again
            try:
                holder = Holder.parse(text)
            except ValueError:
                # a record is linked complete, never written in place: this is not our lock file
                raise LockHeld(f"{what}: {path} exists but is not a lock record; remove it if no "
                               "other run uses this folder") from None
            alive, why = holder_state(holder, me=me, run=run)
            if alive:
                raise LockHeld(f"{what}: refusing to start, {path} is held by a live run "
                               f"({holder.describe()}; {why}); wait for it or cancel it "
                               f"(`evil-moe cancel-run`), or remove the file if it is dead")
            aside = path.with_name(f"{path.name}.stale.{me.token}")
            try:
                os.rename(path, aside)
            except FileNotFoundError:
                continue
            if aside.read_text() != text:  # another run took it over meanwhile: give it back
                with contextlib.suppress(FileExistsError):
                    os.link(aside, path)
                aside.unlink()
                continue
            aside.unlink()
            log(f"{what}: took over the stale lock {path} ({holder.describe()}; {why})")
        raise LockHeld(f"{what}: could not take {path} (it changed hands 10 times)")
    finally:
        tmp.unlink(missing_ok=True)


def release(path: str | os.PathLike, me: Holder) -> None:
    """Remove the lock file when it is still ``me``'s (a lock taken over meanwhile is left)."""
    path = Path(path)
    try:
        if Holder.parse(path.read_text()).token == me.token:
            path.unlink()
    except (FileNotFoundError, ValueError):
        pass


@contextlib.contextmanager
def held(path: str | os.PathLike, *, what: str = "this run",
         run: Runner = _run) -> Iterator[Holder]:
    """``with held(path): ...``: :func:`acquire` around the block, :func:`release` after it
    (also when it raises; a SIGKILLed process leaves a stale lock, taken over by the next run)."""
    me = acquire(path, what=what, run=run)
    try:
        yield me
    finally:
        release(path, me)


def locks_output(out_arg: str, what: Callable[..., str] | None = None):
    """Decorator: the wrapped function runs holding ``<its out_arg argument>/run.lock`` (the
    folder is created first, and removed again if the call left it empty: a run refused for bad
    input leaves nothing behind).

    Args:
        out_arg: name of the wrapped function's output-folder parameter.
        what: the run's name from the bound arguments (for messages), e.g.
            ``lambda arm, seed, **_: f"pilot {arm} s{seed}"``.

    Raises (from the wrapped call):
        LockHeld: another live run holds the folder.
    """

    def deco(func):
        sig = inspect.signature(func)

        @functools.wraps(func)
        def wrapper(*args, **kwargs):
            bound = sig.bind(*args, **kwargs)
            bound.apply_defaults()
            out = Path(bound.arguments[out_arg])
            created = not out.exists()
            out.mkdir(parents=True, exist_ok=True)
            name = what(**bound.arguments) if what else str(out)
            try:
                with held(out / LOCK_NAME, what=name):
                    return func(*args, **kwargs)
            finally:
                if created and out.is_dir() and not any(out.iterdir()):
                    out.rmdir()

        return wrapper

    return deco
