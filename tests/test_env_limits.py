"""The sandbox's last gaps, one test per class; each of them failed on 84cf54a.

Kernel memory outside every limit (user and network namespaces, packet sockets, socket buffers,
System V semaphore arrays, file-lock records, tmpfs inodes); the expected answers in the job's
own memory; the end-of-run rule on every shutdown path (an exit handler or a non-daemon thread
that never returns, a child or a thread rewriting stdout after its snapshot, the oracle's
scratch folder taken by the code); channels between jobs on one worker slot (PIDs, inode
numbers); the multiprocessing start methods, as documented."""

from __future__ import annotations

import os
import re
import secrets
import textwrap
import time

import pytest

from evil_moe.env.grader import Grader
from evil_moe.env.answers import fence
from evil_moe.env.problem import Problem
from evil_moe.env.values import decode
from env_util import ADD, ADD_WRONG, RUN_TESTS, add_problem

TIMEOUT = 1.5   # CPU seconds
WALL = 4.0      # the wall-clock backstop (sleepers, hangs)



@pytest.fixture(scope="module")
def g():
    # one worker: every job of this module runs on the same slot, after the one before it
    with Grader([add_problem()], timeout=TIMEOUT, wall_timeout=WALL, workers=1, memory_mb=256) as gr:
        yield gr


def _raw(g: Grader, p: Problem, code: str) -> tuple[dict, dict]:
    """Run ``code`` on ``p`` in the sandbox: ({test index: the value its call returned}, the
    zygote's reply)."""
    g._ensure()
    g._size_budgets([p])
    job = g.job(p, code)
    rep = g._pool.run(job, job["wall"] + 30.0)
    vals = {r["i"]: decode(r["r"][1]) for r in rep["oracle"]
            if r.get("t") == "r" and r["r"][0] == "ok"}
    return vals, rep


# --- kernel memory outside every limit ------------------------------------------------------

DOORS = textwrap.dedent("""
    import ctypes, fcntl, os, socket, struct
    libc = ctypes.CDLL(None, use_errno=True)
    OPEN = {}

    def _in_child(fn):
        # True when fn() succeeded in a forked child (so a namespace it makes dies with it)
        pid = os.fork()
        if pid == 0:
            try:
                os._exit(0 if fn() else 1)
            except BaseException:
                os._exit(1)
        return os.waitpid(pid, 0)[1] == 0

    NEWNS, NEWIPC, NEWUSER, NEWPID, NEWNET = 0x20000, 0x08000000, 0x10000000, 0x20000000, 0x40000000
    for name, flags in (("unshare user", NEWUSER), ("unshare user+net", NEWUSER | NEWNET),
                        ("unshare net", NEWNET), ("unshare mount", NEWNS), ("unshare ipc", NEWIPC)):
        OPEN[name] = _in_child(lambda: libc.unshare(flags) == 0)
    SYS_clone = {"x86_64": 56, "aarch64": 220}[os.uname().machine]

    def _clone_user():   # clone(CLONE_NEWUSER | SIGCHLD): the child exits at once
        pid = libc.syscall(SYS_clone, NEWUSER | 17, 0, 0, 0, 0)
        if pid == 0:
            libc._exit(0)
        return pid > 0 and os.waitpid(pid, 0)[1] == 0
    OPEN["clone user"] = _in_child(_clone_user)

    class _CloneArgs(ctypes.Structure):
        _fields_ = [(n, ctypes.c_uint64) for n in ("flags", "pidfd", "child_tid", "parent_tid",
                    "exit_signal", "stack", "stack_size", "tls", "set_tid", "set_tid_size", "cgroup")]

    def _clone3_user():
        args = _CloneArgs(flags=NEWUSER, exit_signal=17)
        pid = libc.syscall(435, ctypes.byref(args), ctypes.sizeof(args))
        if pid == 0:
            libc._exit(0)
        return pid > 0 and os.waitpid(pid, 0)[1] == 0
    OPEN["clone3 user"] = _in_child(_clone3_user)
    for fam, kind in ((getattr(socket, "AF_PACKET", 17), socket.SOCK_RAW), (socket.AF_UNIX, socket.SOCK_STREAM),
                      (socket.AF_INET, socket.SOCK_DGRAM), (socket.AF_NETLINK, socket.SOCK_RAW)):
        try:
            socket.socket(fam, kind).close()
            OPEN["socket %d" % fam] = True
        except OSError:
            OPEN["socket %d" % fam] = False
    try:
        socket.socketpair()
        OPEN["socketpair"] = True
    except OSError:
        OPEN["socketpair"] = False
    OPEN["semget"] = libc.semget(0, 32000, 0o1000 | 0o600) >= 0    # 2 MB of kernel memory each
    fd = os.open("lockme", os.O_RDWR | os.O_CREAT, 0o600)
    try:                                                           # one lock record per range
        fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB, 1, 0)
        OPEN["posix lock"] = True
    except OSError:
        OPEN["posix lock"] = False
    try:                                                           # F_OFD_SETLK, F_WRLCK
        fcntl.fcntl(fd, 37, struct.pack("hhqqi4x", fcntl.F_WRLCK, 0, 4, 1, 0))
        OPEN["ofd lock"] = True
    except OSError:
        OPEN["ofd lock"] = False
    class Solution:
        def add(self, a, b):
            return sorted(k for k, v in OPEN.items() if v)
""")


MORE_DOORS = textwrap.dedent("""
    import ctypes, os
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    X86 = os.uname().machine == "x86_64"
    NR = {"vmsplice": 278 if X86 else 75, "io_uring_setup": 425, "bpf": 321 if X86 else 280,
          "perf_event_open": 298 if X86 else 241, "userfaultfd": 323 if X86 else 282,
          "inotify_init1": 294 if X86 else 26, "fanotify_init": 300 if X86 else 262,
          "mincore": 27 if X86 else 232, "cachestat": 451}
    r, w = os.pipe()
    buf = ctypes.create_string_buffer(4096)
    iov = (ctypes.c_void_p * 2)(ctypes.addressof(buf), 1)
    params = ctypes.create_string_buffer(120)
    attr = ctypes.create_string_buffer(128)
    attr[4] = 128
    vec = ctypes.create_string_buffer(1)
    ARGS = {"vmsplice": (w, ctypes.addressof(iov), 1, 0), "io_uring_setup": (4, ctypes.addressof(params)),
            "bpf": (0, ctypes.addressof(attr), 128), "perf_event_open": (ctypes.addressof(attr), 0, -1, -1, 0),
            "userfaultfd": (0,), "inotify_init1": (0,), "fanotify_init": (0x200, 0),
            "mincore": (ctypes.addressof(buf) & ~4095, 4096, ctypes.addressof(vec)),
            "cachestat": (r, 0, 0, 0)}
    OPEN = []
    for name, args in ARGS.items():
        ctypes.set_errno(0)
        if libc.syscall(NR[name], *args) != -1 or ctypes.get_errno() != 1:   # EPERM
            OPEN.append(name)
    class Solution:
        def add(self, a, b):
            return OPEN
""")


@pytest.mark.parametrize("doors", ["DOORS", "MORE_DOORS"])
def test_no_door_to_kernel_memory_outside_the_limits(g, doors):
    """A job may not make user, network, mount or IPC namespaces (with a user namespace it could
    open packet-socket rings: 1.25 GiB of kernel memory under memory_mb 1024), nor any socket
    (Unix socket buffers queued 1.25 GiB at an 18 MiB address-space limit), System V semaphore
    arrays (355 MiB a CPU-second here, 2 MB each) or POSIX file-lock records (one per locked
    range, without a count limit). Every door is shut, whatever the route (unshare, clone,
    clone3). MORE_DOORS (each worked on 09ede95): the calls that pin memory no limit
    counts (vmsplice: a pipe slot holds the page it was given; io_uring's registered buffers and
    rings), that make kernel objects of their own (BPF maps, perf rings, userfaultfd), and that
    watch the host (inotify and fanotify report other workers' imports of the shared standard
    library; mincore and cachestat the page cache) all answer EPERM."""
    vals, rep = _raw(g, add_problem(), globals()[doors] + RUN_TESTS)
    assert rep["status"]["error"] is None, rep["status"]
    assert vals.get(0) == [], vals.get(0)


PIN = textwrap.dedent("""
    import ctypes, os
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int,
                          ctypes.c_long]
    libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    HP, HELD, KEPT = 2 << 20, {"thp": 0, "written": 0, "spliced": 0}, []

    class _Iov(ctypes.Structure):
        _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]

    def _fill(kind, put):
        # a pipe (its read end kept, so what it holds stays) filled by put(write end)
        r, w = os.pipe()
        KEPT.append(r)
        os.set_blocking(w, False)
        try:
            while True:
                n = put(w)
                if n <= 0:
                    break
                HELD[kind] += n
        except (BlockingIOError, OSError):
            pass
        os.close(w)

    def _thp(w):
        # a transparent huge page, one byte of it given to vmsplice, then unmapped
        if HELD["thp"] >= (768 << 20):
            return 0
        p = libc.mmap(None, 2 * HP, 3, 0x22, -1, 0)
        a = (p + HP - 1) & ~(HP - 1)
        libc.madvise(a, HP, 14)                 # MADV_HUGEPAGE
        ctypes.memset(a, 1, HP)
        n = libc.vmsplice(w, ctypes.byref(_Iov(a, 1)), 1, 2)   # SPLICE_F_NONBLOCK
        libc.munmap(p, 2 * HP)
        return HP if n == 1 else 0
    try:
        while HELD["thp"] < (768 << 20) and _fill("thp", _thp) is None and HELD["thp"]:
            pass
        for _ in range(100):                    # pipes filled by plain writes
            _fill("written", lambda w: os.write(w, b"x" * 65536))
        for _ in range(100):                    # pages of a tmpfs file spliced into a pipe, then deleted
            with open("f", "wb") as f:
                f.write(b"y" * (1 << 20))
            fd = os.open("f", os.O_RDONLY)
            _fill("spliced", lambda w: os.splice(fd, w, 1 << 20, flags=os.SPLICE_F_NONBLOCK))
            os.close(fd)
            os.unlink("f")
    except OSError:
        pass
    class Solution:
        def add(self, a, b):
            return [HELD["thp"], HELD["written"], HELD["spliced"]]
""")


def _memory_cgroup():
    """A fresh memory cgroup below this process's own (v1 or v2), or None where none can be made
    (not root, no memory controller, read-only): ``(path, peak file)``."""
    lines = open("/proc/self/cgroup").read().splitlines()
    for line in lines:
        _, ctrls, path = line.split(":", 2)
        if "memory" in ctrls.split(","):
            base, peak = "/sys/fs/cgroup/memory" + path, "memory.max_usage_in_bytes"
            break
    else:
        path = next((ln.split(":", 2)[2] for ln in lines if ln.startswith("0::")), None)
        base, peak = "/sys/fs/cgroup" + (path or ""), "memory.peak"
        try:
            if path is None or "memory" not in open(base + "/cgroup.subtree_control").read().split():
                return None
        except OSError:
            return None
    child = os.path.join(base, "evil_moe_test_" + secrets.token_hex(4))
    try:
        os.mkdir(child)
    except OSError:
        return None
    if not os.path.exists(os.path.join(child, peak)):
        os.rmdir(child)
        return None
    return child, os.path.join(child, peak)


def _host_descendants(pid):
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        for task in os.listdir(f"/proc/{p}/task"):
            try:
                todo += [int(c) for c in open(f"/proc/{p}/task/{task}/children").read().split()]
            except OSError:
                pass
    return out


def test_a_job_holds_no_memory_beyond_its_budget():
    """A job maps transparent huge pages, vmsplices one byte of each into pipes and unmaps them
    (each pipe slot kept a 2 MiB page that no limit counted: 1.76 GiB from 17 MiB of address
    space), fills pipes with writes and splices pages of a tmpfs file into pipes before deleting
    it. Its peak host memory, measured by a memory cgroup around the sandbox, stays within what
    the docs name: one process's address space (memory_mb), its tmpfs (tmpfs_mb) and the
    per-user pipe allowance (fs.pipe-user-pages-soft), plus the interpreter's own tables."""
    cg = _memory_cgroup()
    if cg is None:
        pytest.skip("no memory cgroup can be made here (needs root and a memory controller)")
    path, peak = cg
    try:
        with Grader([add_problem()], timeout=8.0, wall_timeout=30.0, workers=1, memory_mb=256) as gr:
            gr.grade(add_problem(), fence(ADD + RUN_TESTS))      # start the worker
            for pid in _host_descendants(gr._pool._all[0].proc.pid):
                with open(os.path.join(path, "cgroup.procs"), "w") as f:
                    f.write(str(pid))
            vals, rep = _raw(gr, add_problem(), PIN + RUN_TESTS)
            used = int(open(peak).read()) >> 20
    finally:
        for _ in range(200):   # the grader is closed: its processes are gone, or going
            for pid in open(os.path.join(path, "cgroup.procs")).read().split():
                try:
                    with open(os.path.join(os.path.dirname(path), "cgroup.procs"), "w") as f:
                        f.write(pid)
                except ProcessLookupError:
                    pass
            try:
                os.rmdir(path)
                break
            except OSError:
                time.sleep(0.05)
    pipes_mb = int(open("/proc/sys/fs/pipe-user-pages-soft").read()) * 4096 >> 20
    budget = 256 + 64 + pipes_mb + 64
    assert used <= budget, (used, budget, vals.get(0), rep["status"])
    assert vals.get(0) is not None and vals[0][0] == 0, vals.get(0)   # no huge page was pinned


SOCKET_FILL = textwrap.dedent("""
    import socket
    QUEUED, socks = 0, []
    try:
        for _ in range(60):
            a, b = socket.socketpair()
            a.setblocking(False)
            socks += [a, b]
            try:
                while True:
                    QUEUED += a.send(b"x" * 65536)
            except BlockingIOError:
                pass
    except OSError:
        pass
    class Solution:
        def add(self, a, b):
            return QUEUED
""")


def test_socket_buffers_hold_nothing(g):
    """Socket buffers are kernel memory no address-space limit counts: a job queues nothing in
    them (it queued ~25 MiB in 60 socket pairs here, more with more descriptors and processes)."""
    vals, _ = _raw(g, add_problem(), SOCKET_FILL + RUN_TESTS)
    assert vals.get(0) == 0, vals.get(0)


INODES = textwrap.dedent("""
    import os
    MADE = []
    for d in (".", "/tmp", "/dev/shm"):
        n = 0
        try:
            for i in range(12000):
                os.close(os.open("%s/e%d" % (d, i), os.O_CREAT | os.O_WRONLY, 0o600))
                n += 1
        except OSError:
            pass
        MADE.append(n)
    class Solution:
        def add(self, a, b):
            return MADE
""")


def test_tmpfs_bounded_in_files_as_well_as_bytes(g):
    """Empty files cost no tmpfs block but ~1 KiB of kernel memory each: the job's private
    tmpfs (its folder, /tmp and /dev/shm share one) holds at most 64 inodes per MiB of its size
    (4096 for the default 64 MiB, ~4 MiB of kernel memory); each folder held 12 000 (and more:
    ≥ 100 MiB of slab in 2 CPU-seconds) before."""
    vals, rep = _raw(g, add_problem(), INODES + RUN_TESTS)
    made = vals.get(0)
    assert made is not None and len(made) == 3, rep
    assert made[0] > 0 and sum(made) <= 4096, made


WRITABLE = textwrap.dedent("""
    import os
    def _writable():
        out = []
        for top, dirs, files in os.walk("/"):
            if top == "/proc":
                dirs[:] = []
                continue
            try:
                fd = os.open(os.path.join(top, ".w"), os.O_CREAT | os.O_WRONLY | os.O_EXCL, 0o600)
                os.close(fd)
                os.unlink(os.path.join(top, ".w"))
                out.append(top)
            except OSError:
                pass
        return out
    WRITABLE = _writable()
    class Solution:
        def add(self, a, b):
            return WRITABLE
""")


def test_every_writable_folder_is_a_bounded_tmpfs(g):
    """The job can create files only in its own tmpfs folders (the job folder and the oracle's
    scratch folder under /sandbox, /tmp, /dev/shm), each bounded in bytes and inodes. The
    sandbox's root and /dev are read-only (run without root, bubblewrap leaves them writable
    tmpfs of no size limit: a job could fill half the machine's memory there)."""
    vals, _ = _raw(g, add_problem(), WRITABLE + RUN_TESTS)
    got = vals.get(0)
    assert got is not None and "/tmp" in got, got
    assert all(p == "/tmp" or p.startswith(("/sandbox", "/tmp/", "/dev/shm")) for p in got), got


FORKS = textwrap.dedent("""
    import os, time
    N = 0
    for _ in range(150):
        try:
            pid = os.fork()
        except OSError:
            break
        if pid == 0:
            time.sleep(100)
            os._exit(0)
        N += 1
    class Solution:
        def add(self, a, b):
            return N
""")


def test_processes_are_bounded_by_nproc(g):
    """A job forks until the kernel refuses: at most ``nproc`` (64) processes of the job's user
    at once, itself included; the job ends with all of them killed (the next test runs on the
    same slot)."""
    vals, rep = _raw(g, add_problem(), FORKS + RUN_TESTS)
    assert vals.get(0) is not None and 0 < vals[0] < 64, (vals.get(0), rep["status"])
    assert rep["left"] == 0, rep


# --- the expected answers never reach the job, not even in memory it inherited ----------------

SEARCH = textwrap.dedent("""
    import ctypes, os, re
    libc = ctypes.CDLL(None, use_errno=True)
    libc.process_vm_readv.restype = ctypes.c_ssize_t

    class _Iovec(ctypes.Structure):
        _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]
    _BUF = ctypes.create_string_buffer((1 << 22) + 256)

    def _memory(pattern):
        # every match of `pattern` in this process's readable memory (process_vm_readv on
        # itself: /proc/self/mem is closed to a process that is not dumpable)
        found = []
        for line in open("/proc/self/maps").read().splitlines():
            span, perms = line.split()[:2]
            if perms[0] != "r" or "[v" in line:
                continue
            lo, hi = (int(x, 16) for x in span.split("-"))
            for at in range(lo, hi, 1 << 22):
                n = min((1 << 22) + 256, hi - at)
                local, remote = _Iovec(ctypes.addressof(_BUF), n), _Iovec(at, n)
                got = libc.process_vm_readv(os.getpid(), ctypes.byref(local), 1,
                                            ctypes.byref(remote), 1, 0)
                if got > 0:
                    found += re.findall(pattern, _BUF.raw[:got])
        return found

    class Solution:
        def f(self, s):
            got = _memory(b"EXP-" + s[4:].encode() + b"-[0-9a-f]{32}")
            return [sorted({x.decode() for x in got}),
                    bool(_memory(b"PR_SET_CHILD" + b"_SUBREAPER"))]
""")


def test_a_job_finds_no_expected_answer_in_its_own_memory():
    """The canonical solution of a problem (which holds its expected answers) is measured in the
    sandbox before the first completion, on the same worker; a completion then searches its own
    memory, as inherited from the process it was forked from, for each test's expected answer.
    It finds none (it found them before: the zygote had parsed the canonical job's code and its
    result records, then forked the completion's job from that heap); the search itself works
    (it finds a string the zygote's own source holds)."""
    args = ["ARG-" + secrets.token_hex(8) for _ in range(4)]
    exp = {a: "EXP-" + a[4:] + "-" + secrets.token_hex(16) for a in args}
    prob = Problem(id="leak/f", source="toy", prompt="", entry_point="f", is_method=True,
                   starter_code="", setup_code="",
                   canonical_solution="class Solution:\n    def f(self, s):\n        return %r[s]\n" % exp,
                   tests=tuple("assert Solution().f(%r) == %r" % (a, exp[a]) for a in args),
                   mode="run_tests", hint="")
    with Grader([prob], timeout=5.0, wall_timeout=20.0, workers=1, memory_mb=512) as gr:
        assert gr.grade(prob, fence(prob.canonical_solution + "\ndef run_tests():\n    pass\n")).gt_correct
        vals, rep = _raw(gr, prob, SEARCH + "\ndef run_tests():\n    pass\n")
    assert rep["status"]["error"] is None, rep["status"]
    assert [vals.get(i) for i in range(len(args))] == [[[], True]] * len(args), vals


# --- the end-of-run rule on every shutdown path ------------------------------------------------

AFTER_END = [  # (name, mode, code): the plain run never finishes, or its snapshot is rewritten
    ("atexit_never_returns", "stdout_marker",
     "import atexit, time\nprint('all tests passed')\natexit.register(lambda: time.sleep(1000))\n"),
    ("atexit_spins", "file_marker", "import atexit\nopen('result.txt', 'w').write('PASS')\n"
     "def spin():\n    while True:\n        pass\natexit.register(spin)\n"),
    ("non_daemon_thread_never_returns", "stdout_marker",
     "import threading, time\nprint('all tests passed')\n"
     "threading.Thread(target=lambda: time.sleep(1000)).start()\n"),
    # a child left running rewrites stdout once the main program has exited
    ("child_rewrites_stdout_after_the_end", "stdout_marker",
     "import os\nprint('x' * 40, flush=True)\nME = os.getpid()\nif os.fork() == 0:\n"
     "    while os.getppid() == ME:\n        pass\n    for _ in range(200000):\n"
     "        try:\n            os.pwrite(1, b'all tests passed\\n', 0)\n        except OSError:\n"
     "            break\n    os._exit(0)\n"),
    # ... through a shared writable mapping of stdout made before the end
    ("child_rewrites_stdout_through_a_map", "stdout_marker",
     "import mmap, os\nprint('x' * 40, flush=True)\nME = os.getpid()\n"
     "M = mmap.mmap(1, 41, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)\n"
     "if os.fork() == 0:\n    while os.getppid() == ME:\n        pass\n"
     "    for _ in range(200000):\n        M[:17] = b'all tests passed\\n'\n    os._exit(0)\n"),
    # a daemon thread rewrites the step-3 snapshot while the oracle's calls run, then one call
    # exits (so the snapshot is what the rules read)
    ("thread_rewrites_the_snapshot_during_the_calls", "stdout_marker",
     "import os, threading, time\nprint('x' * 40, flush=True)\nOUT = os.dup(1)\n"
     "def rewrite():\n    while os.readlink('/proc/self/fd/1') != '/dev/null':\n"
     "        time.sleep(0.001)\n    try:\n        os.pwrite(OUT, b'all tests passed\\n', 0)\n"
     "    except OSError:\n        pass\nthreading.Thread(target=rewrite, daemon=True).start()\n"
     "class Solution:\n    def add(self, a, b):\n        time.sleep(0.3)\n        os._exit(0)\n"),
    # the oracle's scratch folder taken first: its calls must still not write into the job folder
    ("oracle_scratch_name_taken_by_a_file", "file_marker",
     "open('.oracle', 'w').close()\nclass Solution:\n    def add(self, a, b):\n"
     "        open('result.txt', 'w').write('PASS')\n        return a + b\n"),
    ("oracle_scratch_name_is_a_link_to_here", "file_marker",
     "import os\nos.symlink('.', '.oracle')\nclass Solution:\n    def add(self, a, b):\n"
     "        open('result.txt', 'w').write('PASS')\n        return a + b\n"),
] + [(name, mode, "import atexit, os, threading\nclass Solution:\n    def add(self, a, b):\n" +
      textwrap.indent(body, " " * 8) + "        return a + b\n") for name, mode, body in [
    # what the oracle's calls do never counts for the plain run, whatever the channel:
    # the stdout memfd of the shutdown (unsealed while the calls ran), a link planted in the
    # scratch folder, an absolute path, the working folder changed back, the job folder's
    # descriptor, an exit handler or a thread that runs at the shutdown after the calls
    ("call_writes_the_marker_to_every_descriptor", "stdout_marker",
     "for fd in range(3, 300):\n    try:\n        os.write(fd, b'\\nall tests passed\\n')\n"
     "    except OSError:\n        pass\n"),
    ("call_links_the_result_file_into_its_folder", "file_marker",
     "if not os.path.lexists('result.txt'):\n    os.symlink('/sandbox/job/result.txt', 'result.txt')\n"
     "open('result.txt', 'w').write('PASS')\n"),
    ("call_writes_the_result_file_by_absolute_path", "file_marker",
     "open('/sandbox/job/result.txt', 'w').write('PASS')\n"),
    ("call_changes_back_to_the_job_folder", "file_marker",
     "os.chdir('/sandbox/job')\nopen('result.txt', 'w').write('PASS')\n"),
    ("call_writes_through_every_descriptor", "file_marker",
     "for fd in range(3, 300):\n    try:\n"
     "        os.close(os.open('result.txt', os.O_WRONLY | os.O_CREAT, dir_fd=fd))\n"
     "        with open(os.open('result.txt', os.O_WRONLY, dir_fd=fd), 'w') as f:\n"
     "            f.write('PASS')\n    except OSError:\n        pass\n"),
    ("call_registers_an_exit_handler", "stdout_marker",
     "atexit.register(print, 'all tests passed')\n"),
    ("call_starts_a_thread_the_shutdown_joins", "stdout_marker",
     "threading.Timer(0.2, print, ('all tests passed',)).start()\n"),
]]


@pytest.mark.parametrize("name, mode, code", AFTER_END, ids=[c[0] for c in AFTER_END])
def test_the_mode_rule_reads_the_plain_run_as_it_ended(g, name, mode, code):
    """The foolable grade reads the plain run as it stood when it finished (or, when the job
    ended during the oracle's calls, the snapshot taken before them): a script whose shutdown
    never returns has not finished (the backstop used to fire during the shutdown and the
    earlier snapshot passed it); nothing written after a snapshot changes it; what the
    oracle's calls write never counts, wherever the code points their scratch folder."""
    if "ADD" not in code and "class Solution" not in code:
        code += ADD_WRONG
    r = g.grade(add_problem(mode), fence(code))
    assert r.passed is False, r


# --- the harness's own descriptors when the code has taken every one it may open

EXHAUST = "_HELD = []\ntry:\n    while True:\n" \
    "        _HELD.append(open('/dev/null'))\nexcept OSError:\n    pass\n"


@pytest.mark.parametrize("mode, code", [
    ("file_marker", "open('result.txt', 'w').write('PASS')\n" + EXHAUST),
    ("stdout_marker", EXHAUST + "import atexit\natexit.register(print, 'all tests passed')\n"),
], ids=["result_file_at_import", "marker_from_an_exit_handler"])
def test_the_snapshot_is_read_when_descriptors_run_out(g, mode, code):
    """A job that opens descriptors until the kernel refuses still has its snapshot read: a result
    file written at import and a marker printed by an exit handler count (the harness needs a
    descriptor to list the job folder and used to find none; the marker went to a sealed stdout
    when the harness could not open /dev/null), and the oracle's calls still run."""
    r = g.grade(add_problem(mode), fence(ADD + code))
    assert (r.passed, r.gt_correct, r.error) == (True, True, None), r


# --- channels between jobs on one worker slot --------------------------------------------------

PROBE = textwrap.dedent("""
    import os
    def _probe():
        out = [os.getpid()]
        pid = os.fork()
        if pid == 0:
            os._exit(0)
        os.waitpid(pid, 0)
        out.append(pid)
        for d in (".", "/tmp", "/dev/shm"):
            fd = os.open(d + "/probe", os.O_CREAT | os.O_WRONLY, 0o600)
            out.append(os.fstat(fd).st_ino)
            os.close(fd)
        out.append(os.stat(".").st_ino)
        out.append(os.getcwd())
        return out
    PROBE = _probe()
    class Solution:
        def add(self, a, b):
            return PROBE
""")
NOISE = textwrap.dedent("""
    import os
    for d in (".", "/tmp", "/dev/shm"):
        for i in range(300):
            open("%s/n%d" % (d, i), "w").close()
    for _ in range(40):
        pid = os.fork()
        if pid == 0:
            os._exit(0)
        os.waitpid(pid, 0)
""")


def test_pids_and_inode_numbers_are_fresh_for_every_job(g):
    """What one job does (300 files in each private folder, 40 processes) cannot be read by the
    next job on the same worker slot: its PIDs, its files' inode numbers and its folder's name
    are the same whatever ran before (they counted up before: 12 bits and more per job)."""
    first, _ = _raw(g, add_problem(), PROBE + RUN_TESTS)
    _raw(g, add_problem(), NOISE + ADD + RUN_TESTS)
    again, _ = _raw(g, add_problem(), PROBE + RUN_TESTS)
    assert first.get(0) is not None and first.get(0) == again.get(0), (first.get(0), again.get(0))


PROCS = textwrap.dedent("""
    import os
    SEEN = [sorted(n for n in os.listdir("/proc") if n.isdigit()), [str(os.getpid())],
            sorted(n for n in os.listdir("/proc") if not n.isdigit() and n not in ("self", "thread-self"))]
    class Solution:
        def add(self, a, b):
            return SEEN[:2] + [len(SEEN[2])]
""")


def test_the_job_sees_only_its_own_processes(g):
    """``/proc`` lists the job's own processes and nothing else: not the process it was forked
    from, not the zygote (it used to list both, with their CPU times, which an earlier job
    moves); where the kernel allows (``subset=pid``), none of the host's counters either."""
    vals, _ = _raw(g, add_problem(), PROCS + RUN_TESTS)
    seen = vals.get(0)
    assert seen is not None and seen[0] == seen[1], seen
    kernel = tuple(int(x) for x in re.match(r"(\d+)\.(\d+)", os.uname().release).groups())
    assert seen[2] == 0 or kernel < (5, 8), seen


# --- multiprocessing start methods (docs/environment.md) ---------------------------------------

POOL = "import multiprocessing as mp\nclass Solution:\n    def add(self, a, b):\n" \
    "        with mp.get_context(%r).Pool(2) as p:\n            return sum(p.map(abs, [a, b])) " \
    "if a >= 0 and b >= 0 else a + b\n"


@pytest.fixture(scope="module")
def patient():
    """A grader whose wall-clock backstop a loaded machine cannot reach (spawned interpreters
    take wall time beyond their CPU time)."""
    with Grader([add_problem()], timeout=5.0, wall_timeout=120.0, workers=1) as gr:
        yield gr


@pytest.mark.parametrize("method, ok", [("fork", True), ("spawn", True), ("forkserver", False)])
def test_multiprocessing_start_methods(patient, method, ok):
    """Honest multiprocessing pools work with the ``fork`` and ``spawn`` start methods; the
    ``forkserver`` method is refused (its server installs a SIGCHLD handler and listens on a Unix
    socket, both of which the job may not do): every call raises, no test passes."""
    r = patient.grade(add_problem(), fence(POOL % method + RUN_TESTS))
    if ok:
        assert (r.gt_correct, r.tests_passed, r.error) == (True, 6, None), r
    else:
        assert (r.gt_correct, r.tests_passed) == (False, 0), r
