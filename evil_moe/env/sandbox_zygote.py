"""The sandbox's zygote (stdlib only): started as ``python -I -S -c <this file's text> ROOT DROP
IPC SCRUB`` by :mod:`evil_moe.env.sandbox`, whose docstring gives the design. Importing this
module only defines its functions (the tests call the parsing helpers); :func:`_main` runs the
zygote's loop.
"""
import os, sys, json, struct, signal, resource, ctypes, time, select, shutil, random, builtins
import ast, atexit, _json, re, stat, types
import collections, functools, itertools, heapq, bisect, math, string, operator, typing
import datetime, copy, fractions, decimal, statistics, array, io

_libc = ctypes.CDLL(None, use_errno=True)
TICK = os.sysconf("SC_CLK_TCK")
NCPU = max(1, len(os.sched_getaffinity(0)))
CLONE_NEWIPC = 0x08000000
# set by _main() in the zygote process
ROOT, DROP, IPC, SCRUB, IN, OUT, _null, SELF = "", False, "none", [], -1, -1, -1, -1


class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32),
                ("inheritable", ctypes.c_uint32)]


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


def _has_children():
    """True unless /proc says this process has no live child. Every live descendant of a job has
    a live ancestor chain ending in one of our children (orphans are re-parented to us: we are
    PID 1 or a child subreaper), so no children means no descendants."""
    try:
        with open("/proc/self/task/%d/children" % SELF, "rb") as f:
            return bool(f.read().strip())
    except OSError:
        return True


def _reap():
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def _kill_all():
    _reap()
    if not _has_children():
        return 0
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


def _scrub():
    """Empty the private temp folders (bwrap only): nothing a job left there reaches the next."""
    for top in SCRUB:
        try:
            names = os.listdir(top)
        except OSError:
            continue
        for name in names:
            p = os.path.join(top, name)
            if os.path.isdir(p) and not os.path.islink(p):
                _rmtree(p)
            else:
                try:
                    os.unlink(p)
                except OSError:
                    pass


def _harness(job, d, cfd):
    """Runs in the child after limits are set: the plain run, then the oracle calls. Every
    record goes to the channel ``cfd`` as one line ``NONCE JSON``, written as soon as it is
    known (so results up to a timeout are kept). Never returns."""
    _write, _exit, _type, _len, _getattr, _id = os.write, os._exit, type, len, getattr, id
    _isinstance, _callable, _repr = isinstance, callable, repr
    _fstat, _open, _read, _close, _listdir, _dup2 = (os.fstat, os.open, os.read, os.close,
                                                     os.listdir, os.dup2)
    _S_ISREG = stat.S_ISREG
    _BaseException, _MemoryError, _SystemExit, _RecursionError = (
        BaseException, MemoryError, SystemExit, RecursionError)
    _list, _tuple, _set, _fset, _dict, _str, _int, _float, _bool, _typetype = (
        list, tuple, set, frozenset, dict, str, int, float, bool, type)
    _encode = _json.make_encoder(None, None, _json.encode_basestring_ascii, None, ":", ",",
                                 False, False, True)
    _join = "".join
    _bsaved = dict(builtins.__dict__)
    _bupdate = builtins.__dict__.update
    _stdout = sys.stdout
    _modules = sys.modules
    _run_exitfuncs = atexit._run_exitfuncs
    atexit._clear()  # the zygote's own handlers (if any) are not the code's
    prefix = (job["nonce"] + " ").encode()
    rules = job["rules"]
    result_files = tuple(rules["files"])
    token = rules["token"].encode()
    read_max = rules["read_max"]
    flags, _WRONLY = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, os.O_WRONLY
    mode, test_name, attrs = job["mode"], job["test_name"], tuple(job["attrs"])
    entry, is_method = job["entry"], job["is_method"]

    def emit(rec):
        data = prefix + _join(_encode(rec, 0)).encode() + b"\n"
        while data:
            try:
                k = _write(cfd, data)
            except _BaseException:
                _exit(72)
            data = data[k:]

    budget = [0]

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
            return {"f": _repr(x)}
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
            vals, seen, node = [], _set(), x
            while node is not None:
                if _id(node) in seen or _len(vals) > 100000:
                    return {"x": "cyclic-list"}
                seen.add(_id(node))
                vals.append(enc(_getattr(node, "val", None), depth + 1))
                node = _getattr(node, "next", None)
            return {"L": vals}
        if name == "TreeNode":
            vals, queue, i, seen = [], [x], 0, _set()
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
        if _isinstance(e, _MemoryError):
            return "memory"
        if _isinstance(e, _SystemExit):
            return "exit"
        if _isinstance(e, _RecursionError):
            return "recursion"
        return "exception"

    _mod = types.ModuleType("__main__")
    _modules["__main__"] = _mod
    ns = _mod.__dict__
    ns["__builtins__"] = builtins
    try:
        exec(compile(job["setup"], "<setup>", "exec"), ns)
    except _BaseException:
        emit({"t": "err", "error": "setup"})
        _exit(0)
    # the oracle's call arguments, built before the code runs
    calls = []

    def __cap__(*a, **k):
        return a, k
    ns["__cap__"] = __cap__
    for src in job["calls"]:
        try:
            calls.append(eval("__cap__(" + src + ")", ns))
        except _BaseException:
            calls.append(None)
    del ns["__cap__"]
    try:
        code = compile(job["code"], "<solution>", "exec")
    except _BaseException:
        emit({"t": "err", "error": "syntax"})
        _exit(0)
    # 1. the plain run: the module, the mode's one check, the interpreter's shutdown sequence
    try:
        exec(code, ns)
    except _BaseException as e:
        try:
            exc = (_type(e).__name__ + ": " + _str(e))[:200]
        except _BaseException:
            exc = "?"
        emit({"t": "err", "error": err_name(e), "exc": exc if _type(exc) is _str else "?"})
        _exit(0)
    check = None
    if mode == "run_tests":  # the module-level function, else (or if it raises) the method
        check = False
        try:
            fn = ns.get(test_name)
            if _callable(fn):
                fn()
                check = True
        except _BaseException:
            pass
        if not check:
            try:
                cls = ns.get("Solution")
                if _isinstance(cls, _typetype) and _callable(_getattr(cls, test_name, None)):
                    _getattr(cls(), test_name)()
                    check = True
            except _BaseException:
                check = False
    elif mode == "sentinel":
        check = False
        try:
            inst = ns["Solution"]()
            for a in attrs:
                if _getattr(inst, a, None) is True:
                    check = True
                    break
        except _BaseException:
            check = False
    emit({"t": "check", "ok": check})
    try:  # what Py_FinalizeEx does first: wait for non-daemon threads, then atexit handlers
        th = _modules.get("threading")
        if th is not None:
            main = th.main_thread()
            for _ in range(100000):
                live = [t for t in th.enumerate() if t is not main and not t.daemon and t.is_alive()]
                if not live:
                    break
                for t in live:
                    t.join()
    except _BaseException:
        pass
    try:
        _run_exitfuncs()
    except _BaseException:
        pass
    for f in (sys.stdout, _stdout):
        try:
            f.flush()
        except _BaseException:
            pass
    try:
        size = _fstat(1).st_size
    except _BaseException:
        size = 0
    found = False
    try:
        for fname in _listdir(d):
            if fname.lower() not in result_files:
                continue
            fd = _open(d + "/" + fname, flags)
            try:
                if not _S_ISREG(_fstat(fd).st_mode):
                    continue
                buf = b""
                while _len(buf) <= read_max:
                    chunk = _read(fd, read_max + 1 - _len(buf))
                    if not chunk:
                        break
                    buf += chunk
                if _len(buf) <= read_max and buf.strip().upper() == token:
                    found = True
            finally:
                _close(fd)
    except _BaseException:
        pass
    emit({"t": "run", "stdout": size, "file": found})
    try:  # the oracle's calls print nowhere
        nfd = _open("/dev/null", _WRONLY)
        _dup2(nfd, 1)
        _close(nfd)
    except _BaseException:
        pass
    # 2. the oracle: call the entry point on each test's arguments; the parent compares
    for i, c in enumerate(calls):
        if c is None:
            emit({"t": "r", "i": i, "r": ["argerror"]})
            continue
        try:
            fn = _getattr(ns["Solution"](), entry) if is_method else ns[entry]
            r = fn(*c[0], **c[1])
        except _BaseException as e:
            emit({"t": "r", "i": i, "r": ["error", err_name(e)]})
            continue
        try:
            _bupdate(_bsaved)
            budget[0] = 300000
            v = enc(r)
        except _BaseException:
            v = {"x": "unserialisable"}
        emit({"t": "r", "i": i, "r": ["ok", v]})
    emit({"t": "end"})
    _exit(0)


def _child(job, d, out, chan):
    try:
        os.setpgid(0, 0)
        _libc.prctl(1, signal.SIGKILL, 0, 0, 0)     # PR_SET_PDEATHSIG
        if os.getppid() != SELF:
            os._exit(71)
        cfd = random.randrange(64, 250)
        os.dup2(chan, cfd)
        os.dup2(_null, 0)
        os.dup2(out, 1)
        os.dup2(_null, 2)
        os.closerange(3, cfd)
        os.closerange(cfd + 1, 4096)
        os.chdir(d)
        uid = job.get("uid")
        if DROP and uid is not None:
            os.setgroups([])
            os.setgid(uid)
            os.setuid(uid)
        # no capabilities at all (in a user namespace the zygote holds CAP_SYS_ADMIN there)
        _libc.prctl(47, 4, 0, 0, 0)                 # PR_CAP_AMBIENT_CLEAR_ALL
        if _libc.capset(ctypes.byref(_CapHeader(0x20080522, 0)), (_CapData * 2)()) != 0:
            os._exit(71)
        _libc.prctl(38, 1, 0, 0, 0)                 # PR_SET_NO_NEW_PRIVS
        lim = job["limits"]
        cpu = int(lim["cpu_rlimit"])
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
        os.environ.update({"PATH": "/usr/bin:/bin", "HOME": d, "TMPDIR": d, "LANG": "C.UTF-8"})
        random.seed()
    except BaseException:
        os._exit(71)
    _harness(job, d, cfd)


def _stat_fields(pid):
    with open("/proc/%d/stat" % pid, "rb") as f:
        return f.read().rsplit(b")", 1)[1].split()


def _job_cpu():
    """CPU seconds (user + system) used so far by every live process of the job, each one's
    waited-for children included: the whole job is one budget, however many processes it forks."""
    total = 0
    for pid in _descendants():
        try:
            total += sum(int(x) for x in _stat_fields(pid)[11:15])
        except (OSError, ValueError, IndexError):
            pass
    return total / TICK


def _supervise(pid, pfd, cpu_limit, wall_limit):
    """Wait for the child: kill it when the job's CPU time reaches cpu_limit or wall_limit
    seconds pass. Returns (wait status, the child's CPU seconds, "cpu" | "wall" | None)."""
    t0 = time.monotonic()
    killed = None
    cpu = 0.0
    while True:
        # the job cannot burn CPU faster than NCPU seconds per second: sleep until it could be due
        rem_wall = wall_limit - (time.monotonic() - t0)
        wait = max(0.002, min(rem_wall, (cpu_limit - cpu) / NCPU))
        ready, _, _ = select.select([pfd], [], [], wait)
        if ready:
            break
        cpu = _job_cpu()
        if cpu >= cpu_limit:
            killed = "cpu"
        elif time.monotonic() - t0 >= wall_limit:
            killed = "wall"
        if killed:
            break
    if killed:
        for f in (os.killpg, os.kill):
            try:
                f(pid, signal.SIGKILL)
            except OSError:
                pass
    _, st, ru = os.wait4(pid, 0)
    return st, ru.ru_utime + ru.ru_stime, killed


def _classify(st, cpu, killed, cpu_rlimit):
    """The child's fate, labelled by its cause."""
    if killed:
        return "timeout"
    if os.WIFSIGNALED(st):
        sig = os.WTERMSIG(st)
        # SIGXCPU / SIGKILL from RLIMIT_CPU only once the child really used that much CPU
        if sig in (signal.SIGXCPU, signal.SIGKILL) and cpu >= cpu_rlimit - 0.05:
            return "timeout"
        if sig == signal.SIGXFSZ:
            return "output"
        return "crash"
    if os.WIFEXITED(st) and os.WEXITSTATUS(st) == 71:
        return "sandbox"
    return None


def _read_records(fd, nonce, total_max, line_max):
    """The records of the result channel: at most total_max bytes are read; only lines that
    start with the job's nonce and are at most line_max bytes long are parsed."""
    size = os.fstat(fd).st_size
    data = os.pread(fd, min(size, total_max), 0)
    prefix = (nonce + " ").encode()
    out, dropped = [], 0
    start = 0
    n = len(data)
    while start < n:
        end = data.find(b"\n", start)
        if end < 0:
            end = n
        if data.startswith(prefix, start):
            if end - start > line_max:
                dropped += 1
            else:
                try:
                    rec = json.loads(data[start + len(prefix):end])
                except (ValueError, RecursionError, MemoryError):
                    rec = None
                if isinstance(rec, dict):
                    out.append(rec)
                else:
                    dropped += 1
        start = end + 1
    return out, {"bytes": size, "truncated": size > total_max, "dropped": dropped}


def _stdout_marker(fd, records, cap, pattern):
    """The stdout_marker rule over the plain run's stdout (its first `stdout` bytes)."""
    run = next((r for r in records if r.get("t") == "run"), None)
    if run is None or type(run.get("stdout")) is not int:
        return False
    n = max(0, min(run["stdout"], os.fstat(fd).st_size, cap))
    return re.search(pattern, os.pread(fd, n, 0)) is not None


def _run_job(job, n):
    if IPC != "none":
        if _libc.unshare(CLONE_NEWIPC) != 0 and IPC == "require":
            raise OSError(ctypes.get_errno(), "unshare(CLONE_NEWIPC) failed")
    d = os.path.join(ROOT, "j%d" % n)
    os.mkdir(d, 0o700)
    uid = job.get("uid")
    if DROP and uid is not None:
        os.chown(d, uid, uid)
    out = os.memfd_create("out", os.MFD_CLOEXEC)
    chan = os.memfd_create("chan", os.MFD_CLOEXEC)
    pid = os.fork()
    if pid == 0:
        try:
            _child(job, d, out, chan)
        finally:
            os._exit(70)
    try:
        os.setpgid(pid, pid)
    except OSError:
        pass
    pfd = os.pidfd_open(pid)
    lim = job["limits"]
    st, cpu, killed = _supervise(pid, pfd, job["cpu"], job["wall"])
    left = _kill_all()
    _scrub()
    records, chan_info = _read_records(chan, job["nonce"], lim["chan"], lim["line"])
    status = {"error": _classify(st, cpu, killed, lim["cpu_rlimit"]), "cpu": cpu,
              "killed": killed,
              "exit": os.WEXITSTATUS(st) if os.WIFEXITED(st) else None,
              "signal": os.WTERMSIG(st) if os.WIFSIGNALED(st) else None}
    reply = {"left": left, "status": status, "records": records, "chan": chan_info,
             "stdout_marker": _stdout_marker(out, records, lim["fsize"], job["rules"]["marker_re"].encode()),
             "stdout_bytes": os.fstat(out).st_size}
    for fd in (out, chan, pfd):
        os.close(fd)
    _rmtree(d)
    return reply


def _main():
    global ROOT, DROP, IPC, SCRUB, IN, OUT, _null, SELF
    ROOT = sys.argv[1]
    DROP = sys.argv[2] == "1"   # running as root: children drop to the job's unprivileged uid
    IPC = sys.argv[3]           # "require" | "try" | "none": a fresh IPC namespace per job
    SCRUB = [p for p in sys.argv[4].split(":") if p]  # private tmpfs folders emptied per job
    IN = os.dup(0)
    OUT = os.dup(1)
    _null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(_null, fd)
    _libc.prctl(4, 0, 0, 0, 0)            # PR_SET_DUMPABLE 0: children cannot read our fds/memory
    if os.getpid() != 1:
        _libc.prctl(36, 1, 0, 0, 0)       # PR_SET_CHILD_SUBREAPER: orphans come back to us
    SELF = os.getpid()
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


if __name__ == "__main__":
    _main()
