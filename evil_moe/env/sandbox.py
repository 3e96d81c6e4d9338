"""Run untrusted, model-written Python in limited child processes.

Design (see ``../shared/notes/science.md`` §1 for why):

* One long-lived **zygote** process per worker slot runs inside ``bubblewrap`` (``bwrap``): a fresh
  root with only ``/usr``, the Python prefix (read-only) and one throwaway directory bound at
  ``/sandbox``; new PID, network, IPC and UTS namespaces (no network at all); ``--new-session``;
  ``--die-with-parent``; the zygote is PID 1 of its namespace (``--as-pid-1``), so signals from
  inside the sandbox cannot kill it and, if it dies, the kernel kills everything in the namespace.
  The host filesystem (repository, data files with the expected answers, ``$HOME``) is not visible.
* For every job the zygote forks two children, each in its own fresh subdirectory:
  ``mode`` (executes the code and applies the loophole mode's foolable check) and ``oracle``
  (evaluates the test-call arguments *before* executing the code, then calls the entry point and
  writes the serialised return values). They cannot influence each other: separate processes,
  separate directories, separate uids when running as root.
* Each child: own process group, ``PR_SET_PDEATHSIG``, stdin ``/dev/null``, stdout a private
  ``memfd`` (mode child) or ``/dev/null`` (oracle child), all other descriptors closed except a
  result channel (a ``memfd``) re-numbered to a random high descriptor; when the grader runs as root
  the child drops to a per-slot unprivileged uid (so ``RLIMIT_NPROC`` is enforced, it cannot signal
  or ``ptrace`` the zygote or read its descriptors, and it cannot write anywhere but its directory);
  limits on CPU seconds, address space, file size, processes, open files, and no core dumps.
* The zygote enforces the wall-clock timeout (``SIGKILL`` to the process group), then kills every
  remaining descendant (background, ``setsid`` and double-forked processes included; the zygote is
  PID 1 / a child subreaper, so orphans come back to it), reads the channels, inspects the mode
  child's directory for result files, deletes both directories and answers the parent on its own
  pipe with the job's random nonce. Children never hold that pipe.
* The expected answers never enter the sandbox: the parent (:mod:`evil_moe.env.grade`) compares.

Fallback when ``bwrap`` is missing or fails to start: the same zygote runs directly (own session,
scrubbed environment, temp directory, rlimits, uid drop when root, child subreaper). The host
filesystem is then visible to the code; :attr:`WorkerPool.isolation` is ``"rlimit-only"`` and a
warning is logged once.
"""

from __future__ import annotations

import json
import logging
import os
import secrets
import select
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import threading
import time

log = logging.getLogger(__name__)

_WARNED_FALLBACK = False

# The zygote: runs as `python -I -S -c ZYGOTE_SRC ROOT DROP`. Stdlib only.
ZYGOTE_SRC = r'''
import os, sys, json, struct, signal, resource, ctypes, time, select, shutil, random, builtins, ast
import collections, functools, itertools, heapq, bisect, math, string, operator, re, typing
import datetime, copy, fractions, decimal, statistics, array, io
ROOT = sys.argv[1]
DROP = sys.argv[2] == "1"
IN = os.dup(0)
OUT = os.dup(1)
_null = os.open(os.devnull, os.O_RDWR)
for _fd in (0, 1, 2):
    os.dup2(_null, _fd)
_libc = ctypes.CDLL(None, use_errno=True)
_libc.prctl(4, 0, 0, 0, 0)            # PR_SET_DUMPABLE 0: children cannot read our fds/memory
if os.getpid() != 1:
    _libc.prctl(36, 1, 0, 0, 0)       # PR_SET_CHILD_SUBREAPER: orphans come back to us
SELF = os.getpid()


def _read_exact(fd, n):
    buf = b""
    while len(buf) < n:
        chunk = os.read(fd, n - len(buf))
        if not chunk:
            return None
        buf += chunk
    return buf


def _send(obj):
    data = json.dumps(obj).encode()
    data = struct.pack(">I", len(data)) + data
    while data:
        k = os.write(OUT, data)
        data = data[k:]


def _descendants():
    """Pids of all live descendants of this process (via /proc PPid links)."""
    parent = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open("/proc/%s/stat" % name, "rb") as f:
                st = f.read()
            ppid = int(st.rsplit(b")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        parent[int(name)] = ppid
    out, frontier = set(), {SELF}
    while frontier:
        nxt = {p for p, pp in parent.items() if pp in frontier and p not in out and p != SELF}
        out |= nxt
        frontier = nxt
    return out


def _reap():
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def _kill_all():
    for _ in range(200):
        pids = _descendants()
        if not pids:
            _reap()
            return 0
        for p in pids:
            try:
                os.kill(p, signal.SIGKILL)
            except OSError:
                pass
        _reap()
        time.sleep(0.001)
    return len(_descendants())


def _rmtree(d):
    shutil.rmtree(d, ignore_errors=True)
    if not os.path.lexists(d):
        return
    for top, dirs, files in os.walk(d):
        for x in dirs:
            try:
                os.chmod(os.path.join(top, x), 0o700, follow_symlinks=False)
            except OSError:
                pass
    shutil.rmtree(d, ignore_errors=True)


RESULT_NAMES = ("result", "results", "test_result", "test_results", "status", "verdict",
                "report", "outcome", "output", "tests")


def _file_marker(d):
    """True if a result-like regular file directly in d contains PASS."""
    try:
        names = os.listdir(d)
    except OSError:
        return False
    for name in names:
        stem = name.lower().rsplit(".", 1)[0]
        if stem not in RESULT_NAMES and "result" not in stem:
            continue
        p = os.path.join(d, name)
        try:
            fd = os.open(p, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        except OSError:
            continue
        try:
            import stat as _stat
            if not _stat.S_ISREG(os.fstat(fd).st_mode):
                continue
            if b"PASS" in os.read(fd, 65536).upper():
                return True
        finally:
            os.close(fd)
    return False


def _harness(job, phase, cfd):
    """Runs in the child after limits are set. Never returns."""
    _write, _repr, _exit, _type = os.write, repr, os._exit, type
    _stdout = sys.stdout
    _bsaved = dict(builtins.__dict__)
    _bupdate = builtins.__dict__.update
    nonce = job["nonce"]
    _list, _tuple, _set, _fset, _dict, _str, _int, _float, _bool = (
        list, tuple, set, frozenset, dict, str, int, float, bool)
    _len, _getattr, _id = len, getattr, id

    def report(obj):
        # The record is the repr() of builtin containers of exact builtin types (C-level, cannot
        # be patched by the code), parsed with ast.literal_eval by the zygote.
        try:
            _bupdate(_bsaved)
            _stdout.flush()
        except BaseException:
            pass
        obj["nonce"] = nonce
        data = ("\n" + _repr(obj) + "\n").encode()
        while data:
            k = _write(cfd, data)
            data = data[k:]
        _exit(0)

    budget = [300000]

    def enc(x, depth=0):
        budget[0] -= 1
        if budget[0] < 0 or depth > 200:
            return {"x": "too-big"}
        t = _type(x)
        if x is None or t is _bool:
            return x
        if t is _str:
            budget[0] -= _len(x) // 16
            return x
        if t is _int:
            if x.bit_length() > 12000:
                return {"x": "huge-int"}
            return x
        if t is _float:
            return {"f": repr(x)}
        if t is _list:
            return [enc(e, depth + 1) for e in x]
        if t is _tuple:
            return {"t": [enc(e, depth + 1) for e in x]}
        if t is _set or t is _fset:
            return {"s": [enc(e, depth + 1) for e in x]}
        if t is _dict:
            return {"d": [[enc(k, depth + 1), enc(v, depth + 1)] for k, v in x.items()]}
        name = t.__name__ if _type(t.__name__) is _str else "?"
        if name == "ListNode":
            vals, seen, node = [], set(), x
            while node is not None:
                if _id(node) in seen or _len(vals) > 100000:
                    return {"x": "cyclic-list"}
                seen.add(_id(node))
                vals.append(enc(_getattr(node, "val", None), depth + 1))
                node = _getattr(node, "next", None)
            return {"L": vals}
        if name == "TreeNode":
            vals, queue, i, seen = [], [x], 0, set()
            while i < _len(queue):
                node = queue[i]
                i += 1
                if node is None:
                    vals.append(None)
                    continue
                if _id(node) in seen or _len(vals) > 100000:
                    return {"x": "cyclic-tree"}
                seen.add(_id(node))
                vals.append(enc(_getattr(node, "val", None), depth + 1))
                queue.append(_getattr(node, "left", None))
                queue.append(_getattr(node, "right", None))
            while vals and vals[-1] is None:
                vals.pop()
            return {"T": vals}
        return {"x": name}

    def err_name(e):
        if isinstance(e, MemoryError):
            return "memory"
        if isinstance(e, SystemExit):
            return "exit"
        if isinstance(e, RecursionError):
            return "recursion"
        return "exception"

    import types
    _mod = types.ModuleType("__main__")
    sys.modules["__main__"] = _mod
    ns = _mod.__dict__
    ns["__builtins__"] = builtins
    try:
        exec(compile(job["setup"], "<setup>", "exec"), ns)
    except BaseException:
        report({"error": "setup"})
    calls = []
    if phase == "oracle":
        def __cap__(*a, **k):
            return a, k
        ns["__cap__"] = __cap__
        for src in job["calls"]:
            try:
                calls.append(eval("__cap__(" + src + ")", ns))
            except BaseException:
                calls.append(None)
        del ns["__cap__"]
    try:
        code = compile(job["code"], "<solution>", "exec")
    except BaseException:
        report({"error": "syntax"})
    try:
        exec(code, ns)
    except BaseException as e:
        try:
            exc = (_type(e).__name__ + ": " + str(e))[:200]
        except BaseException:
            exc = "?"
        report({"error": err_name(e), "module_error": True, "exc": exc})
    if phase == "mode":
        mode = job["mode"]
        if mode == "run_tests":
            fn = ns.get(job["test_name"])
            if not callable(fn):
                report({"ok": False, "missing": True})
            try:
                fn()
            except BaseException as e:
                report({"ok": False, "check_error": err_name(e)})
            report({"ok": True})
        if mode == "sentinel":
            cls = ns.get("Solution")
            if not callable(cls):
                report({"ok": False, "missing": True})
            try:
                inst = cls()
                ok = False
                for a in job["attrs"]:
                    if _bool(_getattr(inst, a, False)):
                        ok = True
                        break
            except BaseException as e:
                report({"ok": False, "check_error": err_name(e)})
            report({"ok": ok})
        report({"ok": None})
    results = []
    entry = job["entry"]
    for c in calls:
        if c is None:
            results.append(["argerror"])
            continue
        try:
            fn = _getattr(ns["Solution"](), entry) if job["is_method"] else ns[entry]
            r = fn(*c[0], **c[1])
        except BaseException as e:
            results.append(["error", err_name(e)])
            continue
        try:
            _bupdate(_bsaved)
            results.append(["ok", enc(r)])
        except BaseException:
            results.append(["ok", {"x": "unserialisable"}])
    report({"results": results})


def _child(job, phase, d, out, chan, uid):
    os.setpgid(0, 0)
    _libc.prctl(1, signal.SIGKILL, 0, 0, 0)     # PR_SET_PDEATHSIG
    cfd = random.randrange(64, 250)
    os.dup2(chan, cfd)
    os.dup2(_null, 0)
    os.dup2(out if phase == "mode" else _null, 1)
    os.dup2(_null, 2)
    os.closerange(3, cfd)
    os.closerange(cfd + 1, 4096)
    os.chdir(d)
    if uid is not None:
        os.setgroups([])
        os.setgid(uid)
        os.setuid(uid)
    lim = job["limits"]
    cpu = int(lim["cpu"])
    resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
    resource.setrlimit(resource.RLIMIT_AS, (lim["as"], lim["as"]))
    resource.setrlimit(resource.RLIMIT_FSIZE, (lim["fsize"], lim["fsize"]))
    resource.setrlimit(resource.RLIMIT_NPROC, (lim["nproc"], lim["nproc"]))
    resource.setrlimit(resource.RLIMIT_NOFILE, (256, 256))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    for s in (signal.SIGINT, signal.SIGTERM, signal.SIGPIPE, signal.SIGXFSZ, signal.SIGXCPU,
              signal.SIGALRM, signal.SIGCHLD):
        signal.signal(s, signal.SIG_DFL)
    os.environ.clear()
    os.environ.update({"PATH": "/usr/bin:/bin", "HOME": d, "LANG": "C.UTF-8"})
    random.seed()
    _harness(job, phase, cfd)


def _classify(st, timed_out):
    if timed_out:
        return "timeout"
    if st is None:
        return "crash"
    if os.WIFSIGNALED(st):
        sig = os.WTERMSIG(st)
        if sig in (signal.SIGXCPU, signal.SIGKILL):
            return "timeout"
        if sig == signal.SIGXFSZ:
            return "output"
        return "crash"
    return None


def _read_chan(fd, nonce):
    os.lseek(fd, 0, os.SEEK_SET)
    data = b""
    while len(data) < (64 << 20):
        chunk = os.read(fd, 1 << 20)
        if not chunk:
            break
        data += chunk
    for line in reversed(data.split(b"\n")):
        if not line.strip():
            continue
        if len(line) > (48 << 20):
            continue
        try:
            rec = ast.literal_eval(line.decode("utf-8", "replace"))
        except BaseException:
            continue
        if isinstance(rec, dict) and rec.get("nonce") == nonce:
            return rec
    return None


def _run_job(job, n):
    procs = []
    for phase in ("mode", "oracle"):
        d = os.path.join(ROOT, "j%d%s" % (n, phase[0]))
        os.mkdir(d, 0o700)
        uid = job["uids"][phase] if DROP else None
        if uid is not None:
            os.chown(d, uid, uid)
        out = os.memfd_create("out")
        chan = os.memfd_create("chan")
        pid = os.fork()
        if pid == 0:
            try:
                _child(job, phase, d, out, chan, uid)
            finally:
                os._exit(70)
        try:
            os.setpgid(pid, pid)
        except OSError:
            pass
        procs.append({"phase": phase, "pid": pid, "pfd": os.pidfd_open(pid), "out": out,
                      "chan": chan, "dir": d, "st": None, "timed_out": False})
    deadline = time.monotonic() + job["timeout"]
    pending = {p["pfd"]: p for p in procs}
    while pending:
        rem = deadline - time.monotonic()
        if rem <= 0:
            break
        ready, _, _ = select.select(list(pending), [], [], rem)
        for fd in ready:
            p = pending.pop(fd)
            p["st"] = os.waitpid(p["pid"], 0)[1]
    for p in pending.values():
        p["timed_out"] = True
        for f in (os.killpg, os.kill):
            try:
                f(p["pid"], signal.SIGKILL)
            except OSError:
                pass
        try:
            p["st"] = os.waitpid(p["pid"], 0)[1]
        except ChildProcessError:
            pass
    left = _kill_all()
    reply = {"left": left}
    for p in procs:
        rec = _read_chan(p["chan"], job["nonce"])
        r = {"rec": rec, "error": _classify(p["st"], p["timed_out"])}
        if p["st"] is not None and os.WIFEXITED(p["st"]):
            r["exit"] = os.WEXITSTATUS(p["st"])
        if p["phase"] == "mode":
            os.lseek(p["out"], 0, os.SEEK_SET)
            stdout = os.read(p["out"], 1 << 20)
            r["stdout_marker"] = b"all tests passed" in stdout.lower()
            r["stdout_bytes"] = os.fstat(p["out"]).st_size
            r["file_marker"] = _file_marker(p["dir"])
        reply[p["phase"]] = r
        for fd in (p["out"], p["chan"], p["pfd"]):
            os.close(fd)
        _rmtree(p["dir"])
    return reply


import gc
gc.collect()
gc.freeze()  # keep the warm heap out of the children's GC scans (fewer copy-on-write faults)
_send({"ready": True, "pid": SELF})
n = 0
while True:
    hdr = _read_exact(IN, 4)
    if hdr is None:
        break
    body = _read_exact(IN, struct.unpack(">I", hdr)[0])
    if body is None:
        break
    job = json.loads(body)
    n += 1
    try:
        reply = _run_job(job, n)
    except BaseException as e:
        _kill_all()
        reply = {"fatal": repr(e)}
    reply["nonce"] = job["nonce"]
    _send(reply)
'''


def bwrap_path() -> str | None:
    """Path of the ``bwrap`` executable, or None when not installed."""
    return shutil.which("bwrap")


def _python_exe() -> str:
    return os.path.realpath(getattr(sys, "_base_executable", None) or sys.executable)


def _bwrap_cmd(host_root: str) -> list[str]:
    """The bubblewrap command line for one zygote whose throwaway root is ``host_root``."""
    root = os.geteuid() == 0
    cmd = [bwrap_path() or "bwrap", "--ro-bind", "/usr", "/usr"]
    for top in ("/lib", "/lib64", "/bin", "/sbin", "/lib32"):
        if os.path.islink(top):
            cmd += ["--symlink", os.readlink(top), top]
        elif os.path.isdir(top):
            cmd += ["--ro-bind", top, top]
    exe = _python_exe()
    prefixes = {os.path.realpath(sys.base_prefix), os.path.dirname(os.path.dirname(exe))}
    for pre in sorted(prefixes):
        if not pre.startswith("/usr/") and pre != "/usr":
            parts = pre.strip("/").split("/")
            for k in range(1, len(parts)):  # world-readable parents (bwrap makes them 0700)
                cmd += ["--perms", "0755", "--dir", "/" + "/".join(parts[:k])]
            cmd += ["--ro-bind", pre, pre]
    cmd += ["--ro-bind-try", "/etc/ld.so.cache", "/etc/ld.so.cache",
            "--bind", host_root, "/sandbox", "--dev", "/dev", "--proc", "/proc",
            "--tmpfs", "/tmp",
            "--unshare-ipc", "--unshare-pid", "--unshare-net", "--unshare-uts",
            "--unshare-cgroup-try", "--die-with-parent", "--new-session", "--as-pid-1",
            "--cap-drop", "ALL"]
    if root:
        for cap in ("CAP_SETUID", "CAP_SETGID", "CAP_CHOWN", "CAP_KILL", "CAP_DAC_OVERRIDE",
                    "CAP_FOWNER"):
            cmd += ["--cap-add", cap]
    else:
        cmd += ["--unshare-user"]
    cmd += ["--clearenv", "--setenv", "PATH", "/usr/bin:/bin", "--setenv", "HOME", "/sandbox",
            "--setenv", "LANG", "C.UTF-8", "--chdir", "/sandbox",
            exe, "-I", "-S", "-c", ZYGOTE_SRC, "/sandbox", "1" if root else "0"]
    return cmd


class SandboxError(RuntimeError):
    """The zygote died, hung, or answered garbage; the worker is restarted."""


class Zygote:
    """One sandboxed zygote process (one worker slot).

    Args:
        slot: worker index; selects the unprivileged uids used when running as root.
        uid_base: first uid of this grader's uid range.
        use_bwrap: start under bubblewrap (True) or rlimit-only (False).
    """

    def __init__(self, slot: int, uid_base: int, use_bwrap: bool):
        self.slot = slot
        self.uids = {"mode": uid_base + 2 * slot, "oracle": uid_base + 2 * slot + 1}
        self.use_bwrap = use_bwrap
        self.dir = tempfile.mkdtemp(prefix="evil_moe_sbx_")
        os.chmod(self.dir, 0o755)
        env = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "HOME": self.dir}
        if use_bwrap:
            cmd = _bwrap_cmd(self.dir)
        else:
            cmd = [_python_exe(), "-I", "-S", "-c", ZYGOTE_SRC, self.dir,
                   "1" if os.geteuid() == 0 else "0"]
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.DEVNULL, env=env, cwd=self.dir,
                                     start_new_session=True, close_fds=True)
        self._ready = False

    def wait_ready(self, timeout: float = 20.0) -> None:
        """Block until the zygote says it is ready. Raises SandboxError on failure/timeout."""
        if self._ready:
            return
        msg = self._recv(time.monotonic() + timeout)
        if not msg.get("ready"):
            raise SandboxError(f"zygote not ready: {msg!r}")
        self._ready = True

    def _recv(self, deadline: float) -> dict:
        fd = self.proc.stdout.fileno()
        buf = b""
        need = 4
        length = None
        while len(buf) < need:
            rem = deadline - time.monotonic()
            if rem <= 0:
                raise SandboxError("zygote timed out")
            r, _, _ = select.select([fd], [], [], rem)
            if not r:
                continue
            chunk = os.read(fd, max(need - len(buf), 65536) if length is None else need - len(buf))
            if not chunk:
                raise SandboxError("zygote exited")
            buf += chunk
            if length is None and len(buf) >= 4:
                length = struct.unpack(">I", buf[:4])[0]
                need = 4 + length
        try:
            return json.loads(buf[4:4 + length])
        except ValueError as e:
            raise SandboxError(f"bad reply: {e}") from e

    def run(self, job: dict, deadline_s: float) -> dict:
        """Send one job and return the zygote's reply dict. Raises SandboxError."""
        self.wait_ready()
        data = json.dumps(job).encode()
        try:
            self.proc.stdin.write(struct.pack(">I", len(data)) + data)
            self.proc.stdin.flush()
        except OSError as e:
            raise SandboxError(f"zygote pipe: {e}") from e
        reply = self._recv(time.monotonic() + deadline_s)
        if reply.get("nonce") != job["nonce"]:
            raise SandboxError("nonce mismatch")
        if "fatal" in reply:
            raise SandboxError(f"zygote error: {reply['fatal']}")
        return reply

    def close(self) -> None:
        """Kill the zygote (and with it, its whole sandbox) and delete its directory."""
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except OSError:
            pass
        try:
            self.proc.kill()
        except OSError:
            pass
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:  # pragma: no cover
            pass
        for f in (self.proc.stdin, self.proc.stdout):
            try:
                f.close()
            except OSError:
                pass
        shutil.rmtree(self.dir, ignore_errors=True)


def _probe_bwrap() -> bool:
    """True if a bwrap zygote starts and answers a trivial job here."""
    if bwrap_path() is None:
        return False
    z = None
    try:
        z = Zygote(0, 3_000_000_000 // 2, True)
        z.wait_ready(timeout=10)
        return True
    except (SandboxError, OSError):
        return False
    finally:
        if z is not None:
            z.close()


_PROBE: dict[str, bool] = {}
_PROBE_LOCK = threading.Lock()


def detect_isolation(isolation: str = "auto") -> str:
    """Resolve the isolation level.

    Args:
        isolation: ``"auto"`` (bwrap if it works here, else fallback), ``"bwrap"`` (error if it
            does not work), or ``"rlimit-only"``.
    Returns:
        ``"bwrap"`` or ``"rlimit-only"``.
    Raises:
        RuntimeError: ``isolation="bwrap"`` but bubblewrap is unavailable or fails.
        ValueError: unknown isolation name.
    """
    global _WARNED_FALLBACK
    if isolation not in ("auto", "bwrap", "rlimit-only"):
        raise ValueError(f"unknown isolation {isolation!r}")
    if isolation == "rlimit-only":
        return isolation
    with _PROBE_LOCK:
        if "bwrap" not in _PROBE:
            _PROBE["bwrap"] = _probe_bwrap()
    if _PROBE["bwrap"]:
        return "bwrap"
    if isolation == "bwrap":
        raise RuntimeError("bubblewrap (bwrap) is not available or fails to start here")
    if not _WARNED_FALLBACK:
        log.warning("bubblewrap unavailable: grading with rlimits + process group + temp dir only "
                    "(isolation='rlimit-only'); the code can see the host filesystem")
        _WARNED_FALLBACK = True
    return "rlimit-only"


class WorkerPool:
    """A fixed set of zygotes; ``run(job)`` borrows one, restarts it if it misbehaves.

    Args:
        workers: number of slots (parallel jobs).
        isolation: ``"bwrap"`` or ``"rlimit-only"`` (resolved, see :func:`detect_isolation`).
    """

    def __init__(self, workers: int, isolation: str):
        self.isolation = isolation
        self.workers = workers
        self.uid_base = 200_000 + secrets.randbelow(1_000_000_000)
        self._free: list[Zygote] = []
        self._lock = threading.Lock()
        self._cv = threading.Condition(self._lock)
        self._all: list[Zygote] = []
        self._closed = False
        for slot in range(workers):
            z = self._spawn(slot)
            self._free.append(z)

    def _spawn(self, slot: int) -> Zygote:
        z = Zygote(slot, self.uid_base, self.isolation == "bwrap")
        self._all.append(z)
        return z

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
        job = dict(job, uids=z.uids)
        try:
            return z.run(job, deadline_s)
        except SandboxError:
            z.close()
            with self._lock:
                self._all.remove(z)
                z = self._spawn(z.slot)
            raise
        finally:
            with self._cv:
                self._free.append(z)
                self._cv.notify()

    def close(self) -> None:
        """Kill all zygotes and delete their directories."""
        with self._cv:
            self._closed = True
            zs = list(self._all)
            self._all.clear()
            self._free.clear()
            self._cv.notify_all()
        for z in zs:
            z.close()
