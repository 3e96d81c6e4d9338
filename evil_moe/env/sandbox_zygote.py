"""The sandbox's zygote (stdlib only): started as ``python -I -S -c <this file's text> ROOT DROP
NS TMPFS_BYTES TMPFS_INODES`` by :mod:`evil_moe.env.sandbox`, whose docstring gives the design.
Importing this module only defines its functions (the tests call the parsing helpers);
:func:`_main` runs the zygote's loop.

Processes (one zygote per worker slot):

* the **zygote** (:func:`_main`, PID 1 of the sandbox) talks to the grader, reads each job,
  gives it fresh tmpfs folders, enforces its CPU budget and wall-clock backstop, and reads its
  result channel and stdout. It never forks a job.
* the **forker** (:func:`_forker`), forked by the zygote before it reads anything, is the clean
  template every job is forked from, and (``NS=job``) PID 1 of a PID namespace of its own, so
  no job can signal it or see the zygote. It never receives a job, a result or an expected
  value, only a job's descriptors (``SCM_RIGHTS``); it forks the job (one fork per job, a
  second one for the oracle's calls when the plain run's shutdown ran), reaps it and
  everything it left, and reports the job's status and CPU time from ``ctypes`` buffers it
  zeroes afterwards: nothing a job did stays in the memory the next job is forked from.
  Before each fork it resets the namespace's PID counter (``ns_last_pid``), so every job is PID
  2 and its processes count from there.
* the **job** (:func:`_child`, then :func:`_harness`) reads its own job and runs it.
"""
import os, sys, json, struct, signal, resource, ctypes, time, select, random, builtins
import ast, atexit, _json, re, stat, types, socket, fcntl
import collections, functools, itertools, heapq, bisect, math, string, operator, typing
import datetime, copy, fractions, decimal, statistics, array, io

_libc = ctypes.CDLL(None, use_errno=True)
TICK = os.sysconf("SC_CLK_TCK")
NCPU = max(1, len(os.sched_getaffinity(0)))
CLONE_NEWPID = 0x20000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = (
    1, 2, 4, 8, 32, 4096, 16384, 1 << 18)
# a snapshot of stdout is a memfd under F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_WRITE: nobody
# (no descriptor, no mapping) can change it after that
SEALS = 0x0002 | 0x0004 | 0x0008
SIGPENDING = 1024   # signals queued to the job's user at once (each one, and each POSIX timer,
                    # holds kernel memory): RLIMIT_SIGPENDING
# set by _main() in the zygote process (and inherited by the forker); SELF: this process's pid
# (in its own PID namespace); FORKER: the forker's pid as the zygote sees it
ROOT, DROP, NS, TMPFS, INODES, IN, OUT, _null, SELF, FORKER = (
    "", False, "none", 0, 0, -1, -1, -1, -1, -1)


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


def _send(obj, lines=()):
    """One reply to the grader: a 4-byte length, then ``obj`` as one line of JSON, then
    ``lines`` (result records, as the job wrote them) joined by newlines: a record is never
    encoded again, so the reply is no longer than what was kept of the channels."""
    data = json.dumps(obj, separators=(",", ":")).encode()
    if lines:
        data = b"\n".join([data, *lines])
    data = memoryview(struct.pack(">I", len(data)) + data)
    while data:
        k = os.write(OUT, data)
        data = data[k:]


def _descendants(root=None):
    """Pids of all live descendants of ``root`` (default: this process), via /proc PPid links."""
    root = SELF if root is None else root
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
    out, frontier = set(), {root}
    while frontier:
        nxt = {p for p, pp in parent.items() if pp in frontier and p not in out and p != root}
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
    """Kill every descendant of this process (found through ``/proc``: orphans come back to us,
    a child subreaper) until none is left, reaping them; returns how many are left. (Under
    bubblewrap the forker is PID 1 of the jobs' PID namespace and uses ``kill(-1)`` instead,
    :func:`_forker`.)"""
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


# --- seccomp: the system calls a job may not make ---------------------------------------------
# (machine, AUDIT_ARCH, {name: number}); the numbers are the kernel's syscall tables
# (arch/x86/entry/syscalls/syscall_64.tbl, include/uapi/asm-generic/unistd.h for aarch64).
_SYSCALLS = {
    "x86_64": (0xC000003E, {"memfd_create": 319, "memfd_secret": 447, "shmget": 29, "msgget": 68,
                            "semget": 64, "add_key": 248, "request_key": 249, "keyctl": 250,
                            "mq_open": 240, "socket": 41, "socketpair": 53, "unshare": 272,
                            "setns": 308, "vmsplice": 278, "io_uring_setup": 425,
                            "io_uring_enter": 426, "io_uring_register": 427, "bpf": 321,
                            "perf_event_open": 298, "userfaultfd": 323, "inotify_init": 253,
                            "inotify_init1": 294, "inotify_add_watch": 254, "fanotify_init": 300,
                            "fanotify_mark": 301, "mincore": 27, "cachestat": 451,
                            "clone": 56, "clone3": 435, "fcntl": 72, "rt_sigaction": 13}),
    "aarch64": (0xC00000B7, {"memfd_create": 279, "memfd_secret": 447, "shmget": 194,
                             "msgget": 186, "semget": 190, "add_key": 217, "request_key": 218,
                             "keyctl": 219, "mq_open": 180, "socket": 198, "socketpair": 199,
                             "unshare": 97, "setns": 268, "vmsplice": 75, "io_uring_setup": 425,
                             "io_uring_enter": 426, "io_uring_register": 427, "bpf": 280,
                             "perf_event_open": 241, "userfaultfd": 282, "inotify_init1": 26,
                             "inotify_add_watch": 27, "fanotify_init": 262, "fanotify_mark": 263,
                             "mincore": 232, "cachestat": 451,
                             "clone": 220, "clone3": 435, "fcntl": 25, "rt_sigaction": 134}),
}
# Refused outright (EPERM). Memory outside the address-space limit: memfd (and secret memfd),
# System V shared memory, message queues and semaphore arrays (2 MB of kernel memory each, up to
# 32 000 arrays per IPC namespace), sockets (their buffers: ~200 KiB to 8 MiB per socket, more
# through descriptors in flight); vmsplice (a pipe slot holds a reference to the page it was
# given, and a transparent huge page is 2 MiB: 1.76 GiB pinned from 17 MiB of address space,
# outside every limit, the pipe accounting counting one page per slot); io_uring (registered
# buffers are pinned pages; its rings), BPF maps, perf rings and userfaultfd (kernel objects
# and attack surface Docker's default profile refuses too). Every IPC object (those, and POSIX
# message queues): a job leaves none behind, so the jobs of one worker need no IPC namespace
# each. Namespaces (with a user namespace a job holds CAP_NET_RAW over a network namespace of
# its own: packet-socket rings). The kernel keyring (not namespaced per job). Channels to what
# other processes do on the host: inotify and fanotify (watches on the shared read-only
# standard library report another worker's imports), mincore and cachestat (page-cache
# residency of shared files).
DENIED = ("memfd_create", "memfd_secret", "shmget", "msgget", "semget", "mq_open", "socket",
          "socketpair", "unshare", "setns", "add_key", "request_key", "keyctl", "vmsplice",
          "io_uring_setup", "io_uring_enter", "io_uring_register", "bpf", "perf_event_open",
          "userfaultfd", "inotify_init", "inotify_init1", "inotify_add_watch", "fanotify_init",
          "fanotify_mark", "mincore", "cachestat")
# clone() flags that make a namespace (CLONE_NEWNS | NEWCGROUP | NEWUTS | NEWIPC | NEWUSER |
# NEWPID | NEWNET): refused; a plain fork or thread passes.
CLONE_NS_FLAGS = 0x00020000 | 0x02000000 | 0x04000000 | 0x08000000 | 0x10000000 | 0x20000000 | \
    0x40000000
# fcntl() commands that add a POSIX or open-file-description lock record (F_SETLK, F_SETLKW,
# F_OFD_SETLK, F_OFD_SETLKW): one record of kernel memory per locked range, with no count limit.
LOCK_CMDS = (6, 7, 37, 38)


class _SockFilter(ctypes.Structure):
    _fields_ = [("code", ctypes.c_ushort), ("jt", ctypes.c_ubyte), ("jf", ctypes.c_ubyte),
                ("k", ctypes.c_uint32)]


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.POINTER(_SockFilter))]


def seccomp_program(machine=None):
    """The job's seccomp filter as (code, jt, jf, k) classic-BPF instructions, or None on an
    unknown machine. Refuses (EPERM) the calls in :data:`DENIED`, ``clone`` with any flag of
    :data:`CLONE_NS_FLAGS`, ``fcntl`` with a command of :data:`LOCK_CMDS`, and
    ``rt_sigaction(SIGCHLD, act)`` with a new action (ignoring SIGCHLD or ``SA_NOCLDWAIT`` would
    let the kernel reap children unseen, taking their CPU time out of the job's account; a
    filter cannot read the action, so every new one is refused). ``clone3`` (whose flags sit in
    memory a filter cannot read) gets ENOSYS, so the C library falls back to ``clone`` (as in
    Docker's default profile); a foreign ABI (x32, 32-bit) gets ENOSYS. Jumps are written to
    labels and resolved here (classic BPF jumps only forward, at most 255 instructions)."""
    machine = machine or os.uname().machine
    if machine not in _SYSCALLS:
        return None
    arch, nr = _SYSCALLS[machine]
    LD, JEQ, JGE, JSET, RET = 0x20, 0x15, 0x35, 0x45, 0x06
    ARCH, NR, ARG0, ARG1, ARG1_HI = 4, 0, 16, 24, 28          # offsets in struct seccomp_data
    ALLOW, EPERM, ENOSYS = 0x7FFF0000, 0x00050000 | 1, 0x00050000 | 38
    prog, labels = [], {}

    def ins(code, k=0, jt=0, jf=0):
        prog.append([code, jt, jf, k])

    def label(name):
        labels[name] = len(prog)

    ins(LD, ARCH)
    ins(JEQ, arch, 0, "enosys")
    ins(LD, NR)
    ins(JGE, 0x40000000, "enosys", 0)                          # x32 calls on x86_64
    for name in DENIED:
        if name in nr:                                         # aarch64 has no inotify_init
            ins(JEQ, nr[name], "eperm", 0)
    ins(JEQ, nr["clone"], "clone", 0)
    ins(JEQ, nr["clone3"], "enosys", 0)
    ins(JEQ, nr["fcntl"], "fcntl", 0)
    ins(JEQ, nr["rt_sigaction"], "sigaction", "allow")
    label("clone")
    ins(LD, ARG0)                                              # flags (low half)
    ins(JSET, CLONE_NS_FLAGS, "eperm", "allow")
    label("fcntl")
    ins(LD, ARG1)                                              # the command
    for cmd in LOCK_CMDS:
        ins(JEQ, cmd, "eperm", 0)
    ins(RET, ALLOW)
    label("sigaction")
    ins(LD, ARG0)                                              # the signal
    ins(JEQ, int(signal.SIGCHLD), 0, "allow")
    ins(LD, ARG1)                                              # the new action (low half)
    ins(JEQ, 0, 0, "eperm")
    ins(LD, ARG1_HI)                                           # (high half)
    ins(JEQ, 0, "allow", "eperm")                              # NULL: the call only reads it
    label("allow")
    ins(RET, ALLOW)
    label("eperm")
    ins(RET, EPERM)
    label("enosys")
    ins(RET, ENOSYS)
    out = []
    for i, (code, jt, jf, k) in enumerate(prog):
        jt = labels[jt] - i - 1 if isinstance(jt, str) else jt
        jf = labels[jf] - i - 1 if isinstance(jf, str) else jf
        if not (0 <= jt <= 255 and 0 <= jf <= 255):
            raise ValueError("seccomp: jump out of range at instruction %d" % i)
        out.append((code, jt, jf, k))
    return out


_FPROG = []   # the compiled filter, built once (before the forker is forked): [array, sock_fprog]


def install_seccomp():
    """Install :func:`seccomp_program` on the calling process (after ``no_new_privs``); every
    process it forks inherits it. The filter is compiled on the first call and kept (the zygote
    compiles it at start, so each job only makes the ``prctl``). Raises OSError when the kernel
    refuses or the machine is unknown (the job then fails closed as ``sandbox``)."""
    if not _FPROG:
        prog = seccomp_program()
        if prog is None:
            raise OSError("seccomp: unknown machine %r" % os.uname().machine)
        arr = (_SockFilter * len(prog))(*[_SockFilter(*ins) for ins in prog])
        _FPROG.extend([arr, _SockFprog(len(prog), arr)])
    if _libc.prctl(22, 2, ctypes.byref(_FPROG[1]), 0, 0) != 0:   # PR_SET_SECCOMP, FILTER
        raise OSError(ctypes.get_errno(), "seccomp filter refused")


def _harness(job, oracle_only, fds):
    """Runs in a job process after its limits are set; never returns. ``fds``: the result
    channels ``pfd`` (the plain run's records) and ``cfd`` (the oracle's), the stdout memfd
    ``ofd``, the job folder ``dfd``, the oracle's scratch folder ``sfd``, ``/dev/null``
    ``nfd``, a spare descriptor ``rfd`` and this process's ``/proc/self/stat`` ``tfd``, all
    opened before the code runs. Every record is one line ``NONCE JSON``, written as soon as it
    is known (so results up to a timeout are kept).

    The plain run (``oracle_only`` False; ``docs/environment.md``): the module as a script, the
    mode's one check, and, when anything is registered to run at exit (non-daemon threads
    ``threading`` joins, its exit hooks, ``atexit`` handlers), the interpreter's shutdown
    sequence; then the **snapshot**: the result files read, stdout sealed, the ``run`` record
    written, the plain channel sealed. Only then the oracle's calls: in this process when the
    shutdown had nothing to do (its state is the plain run's, as a test's asserts would see it),
    else (exit status 73) in a fresh job process the forker starts once every process of the
    plain run is gone (``oracle_only``: the module and the check again, output to
    ``/dev/null``, then the calls). So nothing a call does reaches the snapshot: it is sealed,
    or taken by a process that no longer exists, before any call starts."""
    pfd, cfd, ofd, dfd, sfd, nfd, rfd, tfd = fds
    _write, _exit, _type, _len, _getattr, _id = os.write, os._exit, type, len, getattr, id
    _isinstance, _callable, _repr = isinstance, callable, repr
    _fstat, _open, _read, _close, _listdir, _dup2 = (os.fstat, os.open, os.read, os.close,
                                                     os.listdir, os.dup2)
    _pread, _fchdir, _fcntl = os.pread, os.fchdir, fcntl.fcntl
    _F_ADD_SEALS, _F_GET_SEALS = fcntl.F_ADD_SEALS, fcntl.F_GET_SEALS
    _S_ISREG = stat.S_ISREG
    _BaseException, _MemoryError, _SystemExit, _RecursionError, _OSError = (
        BaseException, MemoryError, SystemExit, RecursionError, OSError)
    _list, _tuple, _set, _fset, _dict, _str, _int, _float, _bool, _typetype = (
        list, tuple, set, frozenset, dict, str, int, float, bool, type)
    _Fraction, _Decimal = fractions.Fraction, decimal.Decimal
    _encode = _json.make_encoder(None, None, _json.encode_basestring_ascii, None, ":", ",",
                                 False, False, True)
    _join = "".join
    _bsaved = dict(builtins.__dict__)
    _bupdate = builtins.__dict__.update
    _stdout = sys.stdout
    _modules = sys.modules
    _ncallbacks, _run_exitfuncs = atexit._ncallbacks, atexit._run_exitfuncs
    _getrlimit, _setrlimit, _NOFILE = resource.getrlimit, resource.setrlimit, resource.RLIMIT_NOFILE
    sys.argv = ["solution.py"]            # what a script of this name would see, not the zygote's
    sys.orig_argv = [sys.executable, "solution.py"]
    atexit._clear()  # the zygote's own handlers (if any) are not the code's
    prefix = (job["nonce"] + " ").encode()
    rules = job["rules"]
    result_files = tuple(rules["files"])
    token = rules["token"].encode().upper()
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK
    mode, test_name, attrs = job["mode"], job["test_name"], tuple(job["attrs"])
    entry, is_method = job["entry"], job["is_method"]
    script = os.path.join(ROOT, "job", "solution.py")   # __file__, as `python solution.py` sets it
    try:                                  # the plain run's channel, as it was before the code ran
        plain_id = (_fstat(pfd).st_dev, _fstat(pfd).st_ino)
    except _BaseException:
        plain_id = None

    def emit(fd, rec):
        data = prefix + _join(_encode(rec, 0)).encode() + b"\n"
        while data:
            try:
                k = _write(fd, data)
            except _BaseException:
                _exit(72)
            data = data[k:]

    def with_fd(op):
        """``op()``, which needs a new descriptor: when the code has taken every one it may
        open, the spare is given up (and the soft limit raised to the hard one) and ``op``
        tried again."""
        try:
            return op()
        except _OSError as e:
            if e.errno not in (23, 24):        # ENFILE, EMFILE
                raise
        try:
            _close(rfd)
        except _BaseException:
            pass
        try:
            _setrlimit(_NOFILE, (_getrlimit(_NOFILE)[1],) * 2)
        except _BaseException:
            pass
        return op()

    def sealed(fd, ident=None):
        """Seal ``fd`` (a memfd) against every write; True when the kernel says it is sealed and
        (``ident``) it is still the descriptor it was before the code ran. A shared writable
        mapping makes the seal fail."""
        try:
            if ident is not None:
                st = _fstat(fd)
                if (st.st_dev, st.st_ino) != ident:
                    return False
            _fcntl(fd, _F_ADD_SEALS, SEALS)
            return _fcntl(fd, _F_GET_SEALS) & SEALS == SEALS
        except _BaseException:
            return False

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

    def file_reports_pass():
        """Whether a result file directly in the job folder (the one opened before the code
        ran, whatever the code renamed since) reports PASS, each name on its own (one that
        cannot be read stops nothing). Needs one new descriptor at a time (:func:`with_fd`)."""
        try:
            names = with_fd(lambda: _listdir(dfd))
        except _BaseException:
            return False
        for fname in names:
            try:
                if _type(fname) is not _str or fname.lower() not in result_files:
                    continue
                fd = with_fd(lambda: _open(fname, flags, dir_fd=dfd))
            except _BaseException:
                continue
            try:
                if _S_ISREG(_fstat(fd).st_mode) and reports_pass(fd):
                    return True
            except _BaseException:
                pass
            finally:
                try:
                    _close(fd)
                except _BaseException:
                    pass
        return False

    def flush():
        for f in (sys.stdout, _stdout):
            try:
                f.flush()
            except _BaseException:
                pass

    def work_at_exit():
        """Whether the interpreter's shutdown would run anything: ``threading`` imported (its
        exit hooks, non-daemon threads), an ``atexit`` handler, or a second thread of the
        process (``/proc/self/stat``; unreadable counts as yes)."""
        if "threading" in _modules:
            return True
        try:
            if _ncallbacks():
                return True
            return int(_pread(tfd, 4096, 0).rsplit(b")", 1)[1].split()[17]) != 1
        except _BaseException:
            return True

    budget = [0]

    # Subclasses of the builtin value types (and of Fraction and Decimal) whose comparison is
    # the base's (no __eq__ / __ne__ of their own, or the stdlib's own Counter / OrderedDict
    # ones, captured before the code runs): a test's `==` compares their base value, so that is
    # what is reported, read through the base type's own slots (never a method of the code).
    _mro_of = _typetype.__dict__["__mro__"].__get__
    _dict_of = _typetype.__dict__["__dict__"].__get__
    _bases = (_int, _float, _str, _list, _tuple, _dict, _set, _fset, _Fraction, _Decimal)
    _stdlib_cmp = {}
    for _cls in (collections.Counter, collections.OrderedDict, collections.defaultdict):
        for _name in ("__eq__", "__ne__"):
            if _name in _dict_of(_cls):
                _stdlib_cmp[(_id(_cls), _name)] = _dict_of(_cls)[_name]
    _as_int, _as_float, _as_str = _int.__int__, _float.__float__, _str.__str__
    _iter_list, _iter_tuple, _iter_set, _iter_fset, _items = (
        _list.__iter__, _tuple.__iter__, _set.__iter__, _fset.__iter__, _dict.items)
    _numerator = _dict_of(_Fraction)["_numerator"].__get__
    _denominator = _dict_of(_Fraction)["_denominator"].__get__
    _dec_str = _Decimal.__str__

    def builtin_base(t):
        """The base type (of :data:`_bases`) whose value a subclass ``t`` compares as, or None.
        Found in the class's MRO by identity (``issubclass`` on an ABC such as Fraction can be
        answered by the code: ``register``)."""
        mro = _mro_of(t)
        for base in _bases:
            for cls in mro:
                if cls is base:
                    break
            else:
                continue
            for cls in mro:
                if cls is base:
                    return base
                d = _dict_of(cls)
                for name in ("__eq__", "__ne__"):
                    if name in d and d[name] is not _stdlib_cmp.get((_id(cls), name)):
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
        if base is _Fraction:      # its two slots, as Fraction's own comparison reads them
            num, den = _numerator(x), _denominator(x)
            if _type(num) is not _int or _type(den) is not _int or den <= 0:
                return {"x": "Fraction"}
            if num.bit_length() > 12000 or den.bit_length() > 12000:
                return {"x": "huge-int"}
            return {"q": [num, den]}
        if base is _Decimal:       # the exact decimal string (Decimal's own __str__)
            s = _dec_str(x)
            return {"D": s} if _type(s) is _str and _len(s) <= 200 else {"x": "huge-decimal"}
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

    # the records of the run so far go to the plain channel; the oracle-only process has none
    out = cfd if oracle_only else pfd
    if not oracle_only:   # the script, as `python solution.py` would find it
        try:
            fd = _open("solution.py", os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW,
                       0o644, dir_fd=dfd)
            _write(fd, job["code"].encode("utf-8", "surrogatepass"))
            _close(fd)
        except _BaseException:
            pass
    _mod = types.ModuleType("__main__")
    _modules["__main__"] = _mod
    ns = _mod.__dict__
    ns["__builtins__"] = builtins
    ns["__file__"] = script
    ns["__cached__"] = None
    try:
        exec(compile(job["setup"], "<setup>", "exec"), ns)
    except _BaseException:
        emit(out, {"t": "err", "error": "setup"})
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
        code = compile(job["code"], script, "exec")
    except _BaseException:
        emit(out, {"t": "err", "error": "syntax"})
        _exit(0)
    # 1-2. the plain run (docs/environment.md's steps): the module as a script, the mode's check
    try:
        exec(code, ns)
    except _BaseException as e:
        try:
            exc = (_type(e).__name__ + ": " + _str(e))[:200]
        except _BaseException:
            exc = "?"
        emit(out, {"t": "err", "error": err_name(e), "exc": exc if _type(exc) is _str else "?"})
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
    flush()
    if not oracle_only:
        emit(pfd, {"t": "check", "ok": check})
        # 3. the interpreter's shutdown, as Py_FinalizeEx does it (threading's exit hooks, e.g.
        # concurrent.futures stopping its workers, then non-daemon threads joined; atexit
        # handlers; stdout flushed), when it has anything to run
        fresh = work_at_exit()
        if fresh:
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
            flush()
        # 4. the snapshot the mode rules read: nothing written after it counts
        found = file_reports_pass()
        size = 0
        if sealed(ofd):
            try:
                size = _fstat(ofd).st_size
            except _BaseException:
                pass
        emit(pfd, {"t": "run", "stdout": size, "file": found})
        if not sealed(pfd, plain_id) or fresh:
            _exit(73)   # the oracle's calls run in a fresh process, once this one is gone
    # 5. the oracle: the entry point on each test's arguments (the parent compares). They
    # print nowhere and their working folder is a scratch folder outside the job folder (opened
    # before the code ran); the plain run's snapshot is sealed by now.
    try:
        _dup2(nfd, 1)
    except _BaseException:
        pass
    try:
        _fchdir(sfd)
    except _BaseException:
        pass
    for i, c in enumerate(calls):
        if c is None:
            emit(cfd, {"t": "r", "i": i, "r": ["argerror"]})
            continue
        try:
            fn = _getattr(ns["Solution"](), entry) if is_method else ns[entry]
            r = fn(*c[0], **c[1])
        except _BaseException as e:
            emit(cfd, {"t": "r", "i": i, "r": ["error", err_name(e)]})
            continue
        try:
            _bupdate(_bsaved)
            budget[0] = 300000
            v = enc(r)
        except _BaseException:
            v = {"x": "unserialisable"}
        emit(cfd, {"t": "r", "i": i, "r": ["ok", v]})
    emit(cfd, {"t": "end"})
    _exit(0)


def _child(jobfd, out, plain, chan, parent, oracle_only=False):
    """A job process (forked by the forker, whose pid is ``parent``): reads its own job
    (``jobfd``), sets its descriptors, uid, capabilities, seccomp filter and limits, then runs
    :func:`_harness`: the plain run (``out`` its stdout, ``plain`` its records, ``chan`` the
    oracle's), or (``oracle_only``) only the oracle's calls, stdout ``/dev/null``. Exit status
    71: the sandbox could not be set up (the job fails closed, labelled ``sandbox``)."""
    try:
        os.setpgid(0, 0)
        _libc.prctl(1, signal.SIGKILL, 0, 0, 0)     # PR_SET_PDEATHSIG
        if os.getppid() != parent:
            os._exit(71)
        job = json.loads(os.pread(jobfd, os.fstat(jobfd).st_size, 0))
        d, scratch = os.path.join(ROOT, "job"), os.path.join(ROOT, "oracle")
        pfd, cfd, ofd, dfd, sfd, nfd, rfd, tfd = random.sample(range(64, 250), 8)
        os.dup2(chan, cfd)
        os.dup2(_null, 0)
        os.dup2(_null if oracle_only else out, 1)
        os.dup2(_null, 2)
        os.dup2(_null, nfd, inheritable=False)
        os.dup2(_null, rfd, inheritable=False)    # given up when the code took every descriptor
        if oracle_only:      # neither the plain run's stdout nor its records are within reach
            pfd = ofd = dfd = tfd = -1
        else:
            os.dup2(plain, pfd, inheritable=False)
            os.dup2(out, ofd, inheritable=False)
        keep = sorted(fd for fd in (pfd, cfd, ofd, nfd, rfd) if fd >= 0)
        lo = 3
        for fd in keep:
            os.closerange(lo, fd)
            lo = fd + 1
        os.closerange(lo, 4096)
        os.chdir(scratch if oracle_only else d)
        # the job folder, the oracle's scratch folder and /proc/self/stat, held open before the
        # code runs (and before the uid drop: their parents need not be searchable by its uid)
        os.dup2(os.open(scratch, os.O_RDONLY | os.O_DIRECTORY), sfd, inheritable=False)
        if not oracle_only:
            os.dup2(os.open(d, os.O_RDONLY | os.O_DIRECTORY), dfd, inheritable=False)
            os.dup2(os.open("/proc/self/stat", os.O_RDONLY), tfd, inheritable=False)
        os.closerange(3, 64)
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
        # no locked memory (mlock, SHM_LOCK); queued signals and POSIX timers (kernel memory
        # each) bounded
        resource.setrlimit(resource.RLIMIT_MEMLOCK, (0, 0))
        resource.setrlimit(resource.RLIMIT_SIGPENDING, (SIGPENDING, SIGPENDING))
        os.environ.clear()
        os.environ.update({"PATH": "/usr/bin:/bin", "HOME": d, "TMPDIR": d, "LANG": "C.UTF-8"})
        random.seed()
    except BaseException:
        os._exit(71)
    _harness(job, oracle_only, (pfd, cfd, ofd, dfd, sfd, nfd, rfd, tfd))


def _stat_fields(pid):
    with open("/proc/%d/stat" % pid, "rb") as f:
        return f.read().rsplit(b")", 1)[1].split()


def _job_cpu():
    """CPU seconds (user + system) used so far by every live process of the job, each one's
    waited-for children included: the whole job is one budget, however many processes it forks.
    Under bubblewrap ``/proc`` is the jobs' PID namespace's: every process there but the forker
    (PID 1) is the job's; otherwise the forker's descendants."""
    pids = [int(n) for n in os.listdir("/proc") if n.isdigit() and n != "1"] if NS == "job" \
        else _descendants(FORKER)
    total = 0
    for pid in pids:
        try:
            total += sum(int(x) for x in _stat_fields(pid)[11:15])
        except (OSError, ValueError, IndexError):
            pass
    return total / TICK


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
_TAGS = {"f": str, "x": str, "D": str, "t": list, "s": list, "L": list, "T": list, "d": list,
         "q": list}


def valid_value(v):
    """True when ``v`` (parsed JSON) is a value in the harness's tagged encoding: JSON scalars,
    lists, and one-key objects ``{"f"|"x"|"D": str}`` (``D``: a Decimal), ``{"t"|"s"|"L"|"T":
    list}``, ``{"d": [[key, value], ...]}``, ``{"q": [int, int]}`` (a Fraction), at most
    :data:`MAX_DEPTH` levels deep. Iterative: a forged
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
        if tag in ("f", "x", "D"):
            if len(payload) > 200:
                return False
        elif tag == "q":
            if len(payload) != 2 or any(type(e) is not int for e in payload):
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
    ``check``/``run``/``err``/``end`` with their fields only, or ``r`` with an int index and
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
    if t == "run":
        return keys == {"t", "stdout", "file"} and type(rec["stdout"]) is int and \
            type(rec["file"]) is bool
    if t == "err":
        return keys <= {"t", "error", "exc"} and type(rec.get("error")) is str and \
            len(rec["error"]) <= 64 and type(rec.get("exc", "")) is str and \
            len(rec.get("exc", "")) <= 400
    if t == "end":
        return keys == {"t"}
    return False


SHORT = 512   # bytes of a record that is not a result (check, run, err, end): a few dozen


def _read_records(fd, nonce, total_max, kept, max_records):
    """The records of one result channel, as the job wrote them: at most ``total_max`` bytes
    are read and at most ``max_records`` lines that start with the job's nonce are looked at
    (the harness writes one per test and a few more, the zygote looks at four times as many;
    finding them costs a ``find`` each, never a pass per line); only those that parse as JSON
    and have the exact shape of a harness
    record (:func:`valid_record`) are kept, results (``r``) while ``kept[0]``, the bytes of
    results the reply may still carry, allows, others when at most :data:`SHORT` bytes long.
    So the reply never holds more than its bound and the parent only ever receives flat,
    bounded records. Returns ``(lines, info)``: ``info`` counts what was read, refused
    (``invalid``: no harness shape) and left out (``over``: past the bound or the count)."""
    size = os.fstat(fd).st_size
    data = os.pread(fd, min(size, total_max), 0)
    prefix = (nonce + " ").encode()
    out, invalid, over, seen = [], 0, 0, 0
    mark = b"\n" + prefix
    at = data.find(mark)
    start = 0 if data.startswith(prefix) else at + 1 if at >= 0 else -1
    while start >= 0:
        seen += 1
        if seen > max_records:
            over += 1 + data.count(mark, start)
            break
        end = data.find(b"\n", start)
        end = len(data) if end < 0 else end
        body = data[start + len(prefix):end]
        if len(body) > max(kept[0], SHORT):
            over += 1
        else:
            try:
                rec = json.loads(body)
                ok = valid_record(rec)
            except Exception:   # ValueError, RecursionError, MemoryError alike
                rec, ok = None, False
            if not ok:
                invalid += 1
            elif rec["t"] == "r" and len(body) > kept[0] or rec["t"] != "r" and len(body) > SHORT:
                over += 1
            else:
                out.append(body)
                if rec["t"] == "r":
                    kept[0] -= len(body)
        at = data.find(mark, end)
        start = at + 1 if at >= 0 else -1
    return out, {"bytes": size, "truncated": size > total_max, "invalid": invalid, "over": over}


def _stdout_marker(out, cap, pattern):
    """The stdout_marker rule on the plain run's stdout (at most ``cap`` bytes of it): True
    when the memfd is sealed (:data:`SEALS`: nothing can have changed it since the snapshot;
    the job ended first, or a shared writable mapping blocked the seal: False) and a line of
    it matches ``pattern``."""
    try:
        if fcntl.fcntl(out, fcntl.F_GET_SEALS) & SEALS != SEALS:
            return False
    except OSError:
        return False
    return re.search(pattern, os.pread(out, min(os.fstat(out).st_size, cap), 0)) is not None


def _mount(src, target, fstype, flags, data=None):
    if _libc.mount(src, target, fstype, flags, data) != 0:
        e = ctypes.get_errno()
        raise OSError(e, "mount %s on %s: %s" % (fstype or src, target, os.strerror(e)))


# the job's folders in its one tmpfs on ROOT: (name, mode, where it is also mounted)
JOB_DIRS = (("job", 0o700, None), ("oracle", 0o700, None), ("tmp", 0o1777, "/tmp"),
            ("shm", 0o1777, "/dev/shm"))


def _job_folders(uid):
    """Before a job: ``NS=job``: a fresh tmpfs on ``ROOT`` of ``TMPFS`` bytes and ``INODES``
    inodes (``huge=never``), holding the job folder ``job``, the oracle's scratch folder
    ``oracle`` and the job's ``/tmp`` and ``/dev/shm`` (bind mounts of ``tmp`` and ``shm``: one
    superblock per job, one bound for all four); detached after the job
    (:func:`_drop_folders`). Otherwise ``job`` and ``oracle`` in ``ROOT``. The job's own
    folders are owned by its uid when it drops to one."""
    if NS == "job":
        opts = "size=%d,nr_inodes=%d,mode=0755" % (TMPFS, INODES)
        try:   # small pages: a pipe slot splicing a page of a deleted file pins 4 KiB, not 2 MiB
            _mount(b"tmpfs", ROOT.encode(), b"tmpfs", MS_NOSUID | MS_NODEV,
                   (opts + ",huge=never").encode())
        except OSError:   # a kernel without transparent huge pages has no such option
            _mount(b"tmpfs", ROOT.encode(), b"tmpfs", MS_NOSUID | MS_NODEV, opts.encode())
    for name, mode, where in JOB_DIRS:
        if where is not None and NS != "job":
            continue
        path = os.path.join(ROOT, name)
        os.mkdir(path)
        os.chmod(path, mode)
        if where is not None:
            _mount(path.encode(), where.encode(), None, MS_BIND)
        elif DROP and uid is not None:
            os.chown(path, uid, uid)


def _drop_folders():
    """After a job (every process of it gone): its tmpfs is detached (the kernel frees it), or,
    without one, its two folders deleted."""
    if NS == "job":
        for _, _, where in JOB_DIRS:
            if where is not None:
                _libc.umount2(where.encode(), 2)     # MNT_DETACH
        _libc.umount2(ROOT.encode(), 2)
    else:
        for name in ("job", "oracle"):
            rmtree(os.path.join(ROOT, name))


class _Rusage(ctypes.Structure):
    """``struct rusage`` (two ``timeval``s, then fourteen ``long``s)."""
    _fields_ = [("utime", ctypes.c_long * 2), ("stime", ctypes.c_long * 2),
                ("rest", ctypes.c_long * 14)]


def _seconds(raw):
    """User + system seconds of a ``struct rusage`` as sent by the forker."""
    f = struct.unpack("18q", raw)
    return f[0] + f[1] / 1e6 + f[2] + f[3] / 1e6


def _forker_proc():
    """In the forker (``NS=job``, PID 1 of its PID namespace): ``/proc`` becomes this
    namespace's (only the forker and the job's processes; ``subset=pid`` where the kernel has it
    (Linux >= 5.8): none of the host's counters, else ``/proc/sys`` and friends read-only, as
    bubblewrap does; ``hidepid=2``: a job sees only the processes it may ``ptrace``, its own,
    not the forker, which is not dumpable). Returns a descriptor of ``/proc/sys/kernel/ns_last_pid`` (the namespace's PID
    counter), opened before ``/proc/sys`` is hidden."""
    flags = MS_NOSUID | MS_NODEV | MS_NOEXEC
    _mount(b"proc", b"/proc", b"proc", flags)
    fd = os.open("/proc/sys/kernel/ns_last_pid", os.O_WRONLY | os.O_CLOEXEC)
    if _libc.mount(b"proc", b"/proc", b"proc", MS_REMOUNT | flags, b"subset=pid,hidepid=2") != 0:
        _mount(b"proc", b"/proc", b"proc", MS_REMOUNT | flags, b"hidepid=2")
        for sub in ("sys", "sysrq-trigger", "irq", "bus"):
            p = ("/proc/" + sub).encode()
            if os.path.exists(p):
                _mount(p, p, None, MS_BIND | MS_REC)
                _mount(None, p, None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_REC)
    return fd


def _forker(sock):
    """The forker: the clean template every job process is forked from (forked by the zygote
    before it read anything), and the reaper of every job process. Per job it receives the
    job's descriptors (``j``: the job, the stdout memfd, the plain run's and the oracle's
    result channels), resets the PID counter of its namespace (``NS=job``: the job is PID 2),
    forks the job (:func:`_child`), waits for it (or kills it when the zygote says ``k``: CPU
    budget or wall-clock backstop), then kills every other process of the job (``NS=job``:
    ``kill(-1)``, which as PID 1 reaches every process of its namespace and lets none start
    after it) and reaps them all. It sends the zygote the process's wait status and three
    ``struct rusage`` (its own; its children's before and after: the difference is the CPU of
    every process of the job) straight from ``ctypes`` buffers, then zeroes them: no value
    that depends on a job ever becomes a Python object here, so the next job, forked from this
    memory, cannot read what an earlier one did. The zygote then says ``o`` (the plain run
    asked for a fresh process for the oracle's calls: one more process, on the same
    descriptors, reported the same way) or ``d`` (the job is over: its descriptors are
    closed). Exits when the zygote closes the socket; never returns."""
    global SELF
    _libc.prctl(1, signal.SIGKILL, 0, 0, 0)         # PR_SET_PDEATHSIG: the zygote died
    signal.signal(signal.SIGINT, signal.SIG_DFL)    # as PID 1 no handler: no job can signal it
    SELF = os.getpid()
    lib = ctypes.CDLL(None, use_errno=True)         # its own handles: results stay in buffers
    for name in ("wait4", "waitpid", "kill", "getrusage"):
        getattr(lib, name).restype = None
    status, ru_job, ru0, ru1 = ctypes.c_int(), _Rusage(), _Rusage(), _Rusage()
    bufs = (status, ru_job, ru0, ru1)
    if NS == "job":
        last_pid = _forker_proc()
    else:
        _libc.prctl(36, 1, 0, 0, 0)                 # PR_SET_CHILD_SUBREAPER
    sock.send(b"r")                                 # ready: /proc is this namespace's now
    held = []                                       # the descriptors of the job under way
    while True:
        try:
            msg, fds, _, _ = socket.recv_fds(sock, 16, 8)
        except OSError:
            os._exit(0)
        if msg in (b"k", b"d") and not fds:   # "k" crossed the report: the process is gone
            if msg == b"d":
                for fd in held:
                    os.close(fd)
                held = []
            continue
        if msg == b"j" and len(fds) == 4:
            for fd in held:
                os.close(fd)
            held, oracle = fds, False
        elif msg == b"o" and not fds and held:
            oracle = True
        else:
            os._exit(0)
        if NS == "job":
            os.pwrite(last_pid, b"1", 0)            # the next PID is 2
        lib.getrusage(-1, ctypes.byref(ru0))        # RUSAGE_CHILDREN
        pid = os.fork()
        if pid == 0:
            try:
                sock.close()
                _child(held[0], held[1], held[2], held[3], SELF, oracle)
            finally:
                os._exit(70)
        _reap_job(lib, sock, pid, status, ru_job)
        lib.getrusage(-1, ctypes.byref(ru1))
        sock.sendmsg(bufs)
        for b in bufs:
            ctypes.memset(ctypes.addressof(b), 0, ctypes.sizeof(b))


def _reap_job(lib, sock, pid, status, ru_job):
    """The forker's wait for one job process ``pid`` (:func:`_forker`): until it ends, or kill it
    when the zygote says ``k`` (exit when the zygote closed the socket); then its wait status and
    ``struct rusage`` into the ``ctypes`` buffers ``status`` and ``ru_job``, and every other
    process of the job killed and reaped (``NS=job``: ``kill(-1)`` as PID 1)."""
    pfd = os.pidfd_open(pid)
    while pfd not in select.select([pfd, sock], [], [])[0]:
        if not sock.recv(16):                   # "k": the job ran out of time
            os._exit(0)
        if NS == "job":
            lib.kill(-1, signal.SIGKILL)
        else:
            for kill in (os.killpg, os.kill):
                try:
                    kill(pid, signal.SIGKILL)
                except OSError:
                    pass
    os.close(pfd)
    lib.wait4(pid, ctypes.byref(status), 0, ctypes.byref(ru_job))
    if NS == "job":
        while True:                             # every other process of the namespace
            lib.kill(-1, signal.SIGKILL)
            ctypes.set_errno(0)
            lib.waitpid(-1, None, 0)
            if ctypes.get_errno() == 10:         # ECHILD: none is left
                break
    else:
        _kill_all()


def _wait_report(sock, job, t0, base, killed):
    """Wait for the forker's report on the job's current process, enforcing the CPU budget
    (``base``: the CPU seconds of the job's processes already reaped, plus what ``/proc`` shows
    of the live ones) and the wall-clock backstop (from ``t0``); ``k`` tells the forker to kill
    the job. Returns ``(report, cpu seen, killed)``."""
    cpu_limit, wall_limit = job["cpu"], job["wall"]
    cpu = base
    while True:
        # the job cannot burn CPU faster than NCPU seconds per second: sleep until it could be due
        if killed is None:
            rem_wall = wall_limit - (time.monotonic() - t0)
            wait = max(0.002, min(rem_wall, (cpu_limit - cpu) / NCPU))
        else:
            wait = t0 + wall_limit + 20.0 - time.monotonic()
            if wait <= 0:
                raise OSError("the forker did not end the job in time")
        if select.select([sock], [], [], wait)[0]:
            data = sock.recv(4096)
            if not data:
                raise OSError("the forker died")
            if len(data) != 4 + 3 * 144:
                raise OSError("the forker's report has %d bytes" % len(data))
            return data, cpu, killed
        if killed is None:
            cpu = base + _job_cpu()
            if cpu >= cpu_limit:
                killed = "cpu"
            elif time.monotonic() - t0 >= wall_limit:
                killed = "wall"
            if killed:
                sock.send(b"k")


def _run_job(job, body, sock):
    """One job, in the zygote: fresh folders, the job's descriptors to the forker, the CPU budget
    and wall-clock backstop enforced over every process of the job (the forker kills the job on
    ``k``), a second process for the oracle's calls when the plain run asks for one (exit status
    73, :func:`_harness`), then the result channels and stdout read here."""
    fds = []
    lim = job["limits"]
    _job_folders(job.get("uid"))
    try:
        jobfd = os.memfd_create("job", os.MFD_CLOEXEC)
        fds.append(jobfd)
        os.write(jobfd, body)
        out = os.memfd_create("out", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
        fds.append(out)
        for name in ("plain", "chan"):   # what is written stays: no one may truncate a channel
            fds.append(os.memfd_create(name, os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING))
            fcntl.fcntl(fds[-1], fcntl.F_ADD_SEALS, fcntl.F_SEAL_SHRINK)
        plain, chan = fds[2], fds[3]
        socket.send_fds(sock, [b"j"], fds)          # SCM_RIGHTS
        os.close(jobfd)
        fds.remove(jobfd)
        t0, base, killed, oracle = time.monotonic(), 0.0, None, False
        while True:
            data, cpu, killed = _wait_report(sock, job, t0, base, killed)
            st = struct.unpack("i", data[:4])[0]
            own = _seconds(data[4:148])
            base += _seconds(data[148 + 144:]) - _seconds(data[148:148 + 144])
            if killed is None and base >= job["cpu"]:
                killed = "cpu"
            if killed or oracle or not (os.WIFEXITED(st) and os.WEXITSTATUS(st) == 73):
                break
            oracle = True
            sock.send(b"o")                         # the oracle's calls, in a fresh process
        sock.send(b"d")
        kept, most = [lim["reply"]], 4 * (len(job["calls"]) + 8)
        plain_lines, info = _read_records(plain, job["nonce"], lim["chan"], kept, most)
        oracle_lines, more = _read_records(chan, job["nonce"], lim["chan"], kept, most)
        info = {k: info[k] or more[k] if k == "truncated" else info[k] + more[k] for k in info}
        status = {"error": _classify(st, own, killed, lim["cpu_rlimit"]), "cpu": max(cpu, base),
                  "killed": killed, "exit": os.WEXITSTATUS(st) if os.WIFEXITED(st) else None,
                  "signal": os.WTERMSIG(st) if os.WIFSIGNALED(st) else None, "oracle": oracle}
        return {"left": 0, "status": status, "plain": len(plain_lines), "chan": info,
                "stdout_marker": _stdout_marker(out, lim["fsize"],
                                                job["rules"]["marker_re"].encode()),
                "stdout_bytes": os.fstat(out).st_size}, plain_lines + oracle_lines
    finally:
        for fd in fds:
            os.close(fd)
        _drop_folders()


def _main():
    global ROOT, DROP, NS, TMPFS, INODES, IN, OUT, _null, SELF, FORKER
    ROOT = sys.argv[1]          # where the job folders live (a fresh tmpfs per job with NS=job)
    DROP = sys.argv[2] == "1"   # running as root: the job drops to its unprivileged uid
    NS = sys.argv[3]            # "job": the forker in a PID namespace, fresh tmpfs per job; "none"
    TMPFS, INODES = int(sys.argv[4]), int(sys.argv[5])
    IN = os.dup(0)
    OUT = os.dup(1)
    _null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(_null, fd)
    _libc.prctl(4, 0, 0, 0, 0)            # PR_SET_DUMPABLE 0: children cannot read our fds/memory
    if os.getpid() != 1:
        _libc.prctl(36, 1, 0, 0, 0)       # PR_SET_CHILD_SUBREAPER: orphans come back to us
    SELF = os.getpid()
    if seccomp_program() is not None:     # compiled once; an unknown machine fails each job closed
        prog = seccomp_program()
        arr = (_SockFilter * len(prog))(*[_SockFilter(*ins) for ins in prog])
        _FPROG.extend([arr, _SockFprog(len(prog), arr)])
    import gc
    gc.collect()
    gc.freeze()  # keep the warm heap out of the children's GC scans (fewer copy-on-write faults)
    zs, fs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    if NS == "job" and _libc.unshare(CLONE_NEWPID) != 0:
        raise OSError(ctypes.get_errno(), "unshare(CLONE_NEWPID) failed")
    pid = os.fork()
    if pid == 0:   # the forker: before any job was read
        try:
            zs.close()
            for fd in (IN, OUT):
                os.close(fd)
            _forker(fs)
        finally:
            os._exit(70)
    FORKER = pid
    fs.close()
    if not select.select([zs], [], [], 30.0)[0] or zs.recv(16) != b"r":
        raise OSError("the forker did not start")
    _send({"ready": True, "pid": SELF})
    while True:
        hdr = _read_exact(IN, 4)
        if hdr is None:
            break
        body = _read_exact(IN, struct.unpack(">I", hdr)[0])
        if body is None:
            break
        job = json.loads(body)
        try:
            reply, lines = _run_job(job, body, zs)
        except BaseException as e:
            reply, lines = {"fatal": repr(e)[:500]}, ()
        reply["nonce"] = job["nonce"]
        _send(reply, lines)
        if "fatal" in reply:
            break        # the grader restarts this worker


if __name__ == "__main__":
    _main()
