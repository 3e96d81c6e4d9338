"""The sandbox's zygote (stdlib only): started as ``python -I -S -c <this file's text> ROOT DROP
IPC SCRUB`` by :mod:`evil_moe.env.sandbox`, whose docstring gives the design. Importing this
module only defines its functions (the tests call the parsing helpers); :func:`_main` runs the
zygote's loop.
"""
import os, sys, json, struct, signal, resource, ctypes, time, select, random, builtins
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


def _open_dir(name, dir_fd=None):
    """A descriptor of directory ``name`` (relative to ``dir_fd``), never through a symlink; made
    readable and writable for us first when its mode shuts us out."""
    flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        fd = os.open(name, flags, dir_fd=dir_fd)
    except PermissionError:
        os.chmod(name, 0o700, dir_fd=dir_fd)
        fd = os.open(name, flags, dir_fd=dir_fd)
    try:
        os.fchmod(fd, 0o700)
    except OSError:
        pass
    return fd


def rmtree(path):
    """Delete ``path`` and everything below it, without recursion and without building paths:
    one directory descriptor at a time (``openat``/``unlinkat`` relative to it, ``..`` to climb
    back), so a tree of any depth (a job can leave one deeper than Python's recursion limit or
    than ``PATH_MAX``) costs time linear in its entries and a constant number of descriptors.
    Entries that cannot be removed are skipped (never retried in a loop). Never raises."""
    try:
        st = os.lstat(path)
    except OSError:
        return
    if not stat.S_ISDIR(st.st_mode):
        try:
            os.unlink(path)
        except OSError:
            pass
        return
    try:
        fd = _open_dir(path)
    except OSError:
        return
    names, skips = [], [set()]     # the directories below `path` we are in; entries left alone
    while True:
        sub = None
        try:
            with os.scandir(fd) as it:
                for e in it:
                    if e.name in skips[-1]:
                        continue
                    try:
                        isdir = e.is_dir(follow_symlinks=False)
                    except OSError:
                        isdir = False
                    if isdir:
                        sub = e.name
                        break
                    try:
                        os.unlink(e.name, dir_fd=fd)
                    except OSError:
                        skips[-1].add(e.name)
        except OSError:
            pass
        if sub is not None:
            try:
                cfd = _open_dir(sub, fd)
            except OSError:
                skips[-1].add(sub)
                continue
            os.close(fd)
            fd = cfd
            names.append(sub)
            skips.append(set())
            continue
        if not names:          # `path` itself is empty (or holds only what we must leave)
            os.close(fd)
            try:
                os.rmdir(path)
            except OSError:
                pass
            return
        try:
            pfd = os.open("..", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC, dir_fd=fd)
        except OSError:
            os.close(fd)
            return
        os.close(fd)
        fd = pfd
        name = names.pop()
        skips.pop()
        try:
            os.rmdir(name, dir_fd=fd)
        except OSError:
            skips[-1].add(name)


def _scrub():
    """Empty the private temp folders (bwrap only): nothing a job left there reaches the next."""
    for top in SCRUB:
        try:
            names = os.listdir(top)
        except OSError:
            continue
        for name in names:
            rmtree(os.path.join(top, name))


# --- seccomp: the system calls a job may not make ---------------------------------------------
# (machine, AUDIT_ARCH, {name: number}); the numbers are the kernel's syscall tables
# (arch/x86/entry/syscalls/syscall_64.tbl, include/uapi/asm-generic/unistd.h for aarch64).
_SYSCALLS = {
    "x86_64": (0xC000003E, {"memfd_create": 319, "shmget": 29, "msgget": 68, "add_key": 248,
                            "request_key": 249, "keyctl": 250, "rt_sigaction": 13}),
    "aarch64": (0xC00000B7, {"memfd_create": 279, "shmget": 194, "msgget": 186, "add_key": 217,
                             "request_key": 218, "keyctl": 219, "rt_sigaction": 134}),
}
# Refused outright (EPERM): memory outside the address-space limit (memfd, System V shared
# memory and message queues) and the kernel keyring (not namespaced per job).
DENIED = ("memfd_create", "shmget", "msgget", "add_key", "request_key", "keyctl")


class _SockFilter(ctypes.Structure):
    _fields_ = [("code", ctypes.c_ushort), ("jt", ctypes.c_ubyte), ("jf", ctypes.c_ubyte),
                ("k", ctypes.c_uint32)]


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.POINTER(_SockFilter))]


def seccomp_program(machine=None):
    """The job's seccomp filter as (code, jt, jf, k) BPF instructions, or None on an unknown
    machine. Refuses (EPERM) the calls in :data:`DENIED` and ``rt_sigaction(SIGCHLD, act)`` with a
    new action (ignoring SIGCHLD or ``SA_NOCLDWAIT`` would let the kernel reap children unseen,
    taking their CPU time out of the job's account); a foreign ABI (x32, 32-bit) gets ENOSYS."""
    machine = machine or os.uname().machine
    if machine not in _SYSCALLS:
        return None
    arch, nr = _SYSCALLS[machine]
    LD, JEQ, JGE, RET = 0x20, 0x15, 0x35, 0x06
    ALLOW, EPERM, ENOSYS = 0x7FFF0000, 0x00050000 | 1, 0x00050000 | 38
    prog = [(LD, 0, 0, 4)]                                   # seccomp_data.arch
    prog.append((JEQ, 1, 0, arch))
    prog.append((RET, 0, 0, ENOSYS))
    prog.append((LD, 0, 0, 0))                               # seccomp_data.nr
    prog.append((JGE, 0, 1, 0x40000000))                     # x32 calls on x86_64
    prog.append((RET, 0, 0, ENOSYS))
    for name in DENIED:
        prog.append((JEQ, 0, 1, nr[name]))
        prog.append((RET, 0, 0, EPERM))
    prog.append((JEQ, 1, 0, nr["rt_sigaction"]))
    prog.append((RET, 0, 0, ALLOW))
    prog.append((LD, 0, 0, 16))                              # args[0] (low half): the signal
    prog.append((JEQ, 1, 0, int(signal.SIGCHLD)))
    prog.append((RET, 0, 0, ALLOW))
    prog.append((LD, 0, 0, 24))                              # args[1] (low half): the new action
    prog.append((JEQ, 0, 3, 0))
    prog.append((LD, 0, 0, 28))                              # args[1] (high half)
    prog.append((JEQ, 0, 1, 0))
    prog.append((RET, 0, 0, ALLOW))                          # a NULL action: only reads it
    prog.append((RET, 0, 0, EPERM))
    return prog


def install_seccomp():
    """Install :func:`seccomp_program` on the calling process (after ``no_new_privs``); every
    process it forks inherits it. Raises OSError when the kernel refuses or the machine is
    unknown (the job then fails closed as ``sandbox``)."""
    prog = seccomp_program()
    if prog is None:
        raise OSError("seccomp: unknown machine %r" % os.uname().machine)
    arr = (_SockFilter * len(prog))(*[_SockFilter(*ins) for ins in prog])
    fprog = _SockFprog(len(prog), arr)
    if _libc.prctl(22, 2, ctypes.byref(fprog), 0, 0) != 0:   # PR_SET_SECCOMP, FILTER
        raise OSError(ctypes.get_errno(), "seccomp filter refused")


def _harness(job, d, cfd):
    """Runs in the child after limits are set: the plain run, then the oracle calls. Every
    record goes to the channel ``cfd`` as one line ``NONCE JSON``, written as soon as it is
    known (so results up to a timeout are kept). Never returns."""
    _write, _exit, _type, _len, _getattr, _id = os.write, os._exit, type, len, getattr, id
    _isinstance, _callable, _repr = isinstance, callable, repr
    _fstat, _open, _read, _close, _listdir, _dup2 = (os.fstat, os.open, os.read, os.close,
                                                     os.listdir, os.dup2)
    _dup, _mkdir, _chdir = os.dup, os.mkdir, os.chdir
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
    sys.argv = ["solution.py"]            # what a script of this name would see, not the zygote's
    sys.orig_argv = [sys.executable, "solution.py"]
    _run_exitfuncs = atexit._run_exitfuncs
    atexit._clear()  # the zygote's own handlers (if any) are not the code's
    prefix = (job["nonce"] + " ").encode()
    rules = job["rules"]
    result_files = tuple(rules["files"])
    token = rules["token"].encode().upper()
    flags, _WRONLY = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, os.O_WRONLY
    mode, test_name, attrs = job["mode"], job["test_name"], tuple(job["attrs"])

    def reports_pass(fd):
        """The file_marker rule on an open regular file, read in chunks: the token (any case)
        with any amount of whitespace (what ``bytes.strip`` strips) around it and nothing else;
        stops at the first chunk that rules it out."""
        got, n = b"", _len(token)
        while True:
            chunk = _read(fd, 1 << 20)
            if not chunk:
                return got.upper() == token
            if _len(got) < n:
                if not got:
                    chunk = chunk.lstrip()
                take = chunk[:n - _len(got)]
                got += take
                chunk = chunk[_len(take):]
                if got.upper() != token[:_len(got)]:
                    return False
            if chunk.strip():
                return False
    entry, is_method = job["entry"], job["is_method"]

    def observe():
        """What the mode rules read: stdout's size so far and whether a result file reports
        PASS (each name on its own: one that cannot be read stops nothing)."""
        try:
            size = _fstat(1).st_size
        except _BaseException:
            size = 0
        found = False
        try:
            names = _listdir(d)
        except _BaseException:
            names = []
        for fname in names:   # each name on its own: one that cannot be read stops nothing
            try:
                if _type(fname) is not _str or fname.lower() not in result_files:
                    continue
                fd = _open(d + "/" + fname, flags)
            except _BaseException:
                continue
            try:
                if _S_ISREG(_fstat(fd).st_mode) and reports_pass(fd):
                    found = True
            except _BaseException:
                pass
            finally:
                try:
                    _close(fd)
                except _BaseException:
                    pass
            if found:
                break
        return {"stdout": size, "file": found}

    def emit(rec):
        data = prefix + _join(_encode(rec, 0)).encode() + b"\n"
        while data:
            try:
                k = _write(cfd, data)
            except _BaseException:
                _exit(72)
            data = data[k:]

    budget = [0]

    # Subclasses of the builtin value types whose comparison is the builtin's (no __eq__ /
    # __ne__ of their own, or the stdlib's own Counter / OrderedDict ones, captured before the
    # code runs): a test's `==` compares their base value, so that is what is reported, read
    # through the base type's own slots (never a method of the code).
    _issubclass = issubclass
    _mro_of = _typetype.__dict__["__mro__"].__get__
    _dict_of = _typetype.__dict__["__dict__"].__get__
    _bases = (_int, _float, _str, _list, _tuple, _dict, _set, _fset)
    _stdlib_cmp = {}
    for _cls in (collections.Counter, collections.OrderedDict, collections.defaultdict):
        for _name in ("__eq__", "__ne__"):
            if _name in _dict_of(_cls):
                _stdlib_cmp[(_id(_cls), _name)] = _dict_of(_cls)[_name]
    _as_int, _as_float, _as_str = _int.__int__, _float.__float__, _str.__str__
    _iter_list, _iter_tuple, _iter_set, _iter_fset, _items = (
        _list.__iter__, _tuple.__iter__, _set.__iter__, _fset.__iter__, _dict.items)

    def builtin_base(t):
        """The builtin type whose value a subclass ``t`` compares as, or None."""
        for base in _bases:
            if _issubclass(t, base):
                for cls in _mro_of(t):
                    if cls is base:
                        return base
                    d = _dict_of(cls)
                    for name in ("__eq__", "__ne__"):
                        if name in d and d[name] is not _stdlib_cmp.get((_id(cls), name)):
                            return None
                return None
        return None

    def enc(x, depth=0):
        budget[0] -= 1
        if budget[0] < 0 or depth > 40:
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
        base = builtin_base(t)
        if base is _int:
            return enc(_as_int(x), depth)
        if base is _float:
            return enc(_as_float(x), depth)
        if base is _str:
            return enc(_as_str(x), depth)
        if base is _list:
            return [enc(e, depth + 1) for e in _iter_list(x)]
        if base is _tuple:
            return {"t": [enc(e, depth + 1) for e in _iter_tuple(x)]}
        if base is _set:
            return {"s": [enc(e, depth + 1) for e in _iter_set(x)]}
        if base is _fset:
            return {"s": [enc(e, depth + 1) for e in _iter_fset(x)]}
        if base is _dict:
            return {"d": [[enc(k, depth + 1), enc(v, depth + 1)] for k, v in _items(x)]}
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
    elif mode == "sentinel":  # every name is read, whatever an earlier one did
        check = False
        try:
            inst = ns["Solution"]()
        except _BaseException:
            inst = None
        if inst is not None:
            for a in attrs:
                try:
                    if _getattr(inst, a, None) is True:
                        check = True
                        break
                except _BaseException:
                    pass
    emit({"t": "check", "ok": check})
    for f in (sys.stdout, _stdout):
        try:
            f.flush()
        except _BaseException:
            pass
    # what the mode rules read if the job ends during the oracle's calls (exit, timeout)
    seen = observe()
    seen["t"] = "pre"
    emit(seen)
    # 2. the oracle: call the entry point on each test's arguments (the parent compares). As in
    # a test script, the calls come before the interpreter's shutdown; they print nowhere and
    # write relative paths into a scratch folder, so they never count for the mode's grade.
    for f in (sys.stdout, _stdout):
        try:
            f.flush()
        except _BaseException:
            pass
    saved = -1
    try:
        saved = _dup(1)
        nfd = _open("/dev/null", _WRONLY)
        _dup2(nfd, 1)
        _close(nfd)
    except _BaseException:
        pass
    try:
        _mkdir(d + "/.oracle", 0o700)
        _chdir(d + "/.oracle")
    except _BaseException:
        pass
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
    for f in (sys.stdout, _stdout):   # what the calls printed goes to /dev/null
        try:
            f.flush()
        except _BaseException:
            pass
    try:
        _chdir(d)
    except _BaseException:
        pass
    try:
        if saved >= 0:
            _dup2(saved, 1)
            _close(saved)
    except _BaseException:
        pass
    # 3. the rest of the plain run: what Py_FinalizeEx does first (threading's exit hooks, e.g.
    # concurrent.futures stopping its workers, then non-daemon threads joined; atexit handlers;
    # stdout flushed)
    try:
        th = _modules.get("threading")
        if th is not None:
            th._shutdown()
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
    seen = observe()
    seen["t"] = "run"
    emit(seen)
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
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGPIPE, signal.SIGXFSZ,
                    signal.SIGXCPU, signal.SIGALRM, signal.SIGCHLD):
            signal.signal(sig, signal.SIG_DFL)
        install_seccomp()
        lim = job["limits"]
        cpu = int(lim["cpu_rlimit"])
        resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
        resource.setrlimit(resource.RLIMIT_AS, (lim["as"], lim["as"]))
        resource.setrlimit(resource.RLIMIT_FSIZE, (lim["fsize"], lim["fsize"]))
        resource.setrlimit(resource.RLIMIT_NPROC, (lim["nproc"], lim["nproc"]))
        resource.setrlimit(resource.RLIMIT_NOFILE, (256, 256))
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
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


MAX_DEPTH = 128      # JSON nesting of one record (the harness encodes values 40 levels deep)
_TAGS = {"f": str, "x": str, "t": list, "s": list, "L": list, "T": list, "d": list}


def valid_value(v):
    """True when ``v`` (parsed JSON) is a value in the harness's tagged encoding: JSON scalars,
    lists, and one-key objects ``{"f": str}``, ``{"x": str}``, ``{"t"|"s"|"L"|"T": list}``,
    ``{"d": [[key, value], ...]}``, at most :data:`MAX_DEPTH` levels deep. Iterative: a forged
    record of any depth costs a pass over its nodes, never the recursion limit."""
    stack = [(v, 1)]
    while stack:
        x, depth = stack.pop()
        if depth > MAX_DEPTH:
            return False
        t = type(x)
        if x is None or t is bool or t is int or t is float or t is str:
            continue
        if t is list:
            stack.extend((e, depth + 1) for e in x)
            continue
        if t is not dict or len(x) != 1:
            return False
        (tag, payload), = x.items()
        if _TAGS.get(tag) is not type(payload):
            return False
        if tag in ("f", "x"):
            if len(payload) > 200:
                return False
        elif tag == "d":
            for pair in payload:
                if type(pair) is not list or len(pair) != 2:
                    return False
                stack.append((pair[0], depth + 3))
                stack.append((pair[1], depth + 3))
        else:
            stack.extend((e, depth + 2) for e in payload)
    return True


def valid_record(rec):
    """True when ``rec`` has the exact shape of one harness record (see :func:`_harness`):
    ``check``/``pre``/``run``/``err``/``end`` with their fields only, or ``r`` with an int index and
    ``["ok", value]`` | ``["error", str]`` | ``["argerror"]``."""
    if type(rec) is not dict:
        return False
    t = rec.get("t")
    keys = set(rec)
    if t == "r":
        r = rec.get("r")
        if keys != {"t", "i", "r"} or type(rec["i"]) is not int or type(r) is not list or not r:
            return False
        if r[0] == "ok":
            return len(r) == 2 and valid_value(r[1])
        if r[0] == "error":
            return len(r) == 2 and type(r[1]) is str and len(r[1]) <= 64
        return r == ["argerror"]
    if t == "check":
        return keys == {"t", "ok"} and (rec["ok"] is None or type(rec["ok"]) is bool)
    if t in ("run", "pre"):
        return keys == {"t", "stdout", "file"} and type(rec["stdout"]) is int and \
            type(rec["file"]) is bool
    if t == "err":
        return keys <= {"t", "error", "exc"} and type(rec.get("error")) is str and \
            len(rec["error"]) <= 64 and type(rec.get("exc", "")) is str and \
            len(rec.get("exc", "")) <= 400
    if t == "end":
        return keys == {"t"}
    return False


def _read_records(fd, nonce, total_max, line_max):
    """The records of the result channel: at most total_max bytes are read; only lines that
    start with the job's nonce, are at most line_max bytes long, parse as JSON and have the
    exact shape of a harness record (:func:`valid_record`) are kept; the rest are counted as
    dropped. The parent therefore only ever receives flat, bounded records."""
    size = os.fstat(fd).st_size
    data = os.pread(fd, min(size, total_max), 0)
    prefix = (nonce + " ").encode()
    out, dropped, invalid = [], 0, 0
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
                    ok = valid_record(rec)
                except Exception:   # ValueError, RecursionError, MemoryError alike
                    rec, ok = None, False
                if ok:
                    out.append(rec)
                else:
                    invalid += 1
        start = end + 1
    return out, {"bytes": size, "truncated": size > total_max, "dropped": dropped,
                 "invalid": invalid}


def _stdout_marker(fd, records, cap, pattern):
    """The stdout_marker rule over the plain run's stdout (its first `stdout` bytes, from the
    first ``run`` record, else the first ``pre`` record)."""
    run = next((r for r in records if r.get("t") == "run"), None) or \
        next((r for r in records if r.get("t") == "pre"), None)
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
    ru0 = resource.getrusage(resource.RUSAGE_CHILDREN)
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
    # The whole job's CPU time: every process of it ends up reaped by the job or by us (it
    # cannot make the kernel reap unseen: seccomp refuses ignoring SIGCHLD), so what we reaped
    # since the fork holds all of it.
    ru1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    total = (ru1.ru_utime + ru1.ru_stime) - (ru0.ru_utime + ru0.ru_stime)
    if killed is None and total >= job["cpu"]:
        killed = "cpu"
    _scrub()
    records, chan_info = _read_records(chan, job["nonce"], lim["chan"], lim["line"])
    status = {"error": _classify(st, cpu, killed, lim["cpu_rlimit"]), "cpu": max(cpu, total),
              "killed": killed,
              "exit": os.WEXITSTATUS(st) if os.WIFEXITED(st) else None,
              "signal": os.WTERMSIG(st) if os.WIFSIGNALED(st) else None}
    reply = {"left": left, "status": status, "records": records, "chan": chan_info,
             "stdout_marker": _stdout_marker(out, records, lim["fsize"], job["rules"]["marker_re"].encode()),
             "stdout_bytes": os.fstat(out).st_size}
    for fd in (out, chan, pfd):
        os.close(fd)
    rmtree(d)
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
