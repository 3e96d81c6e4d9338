"""Benchmark: the sandboxed grader vs a fresh-interpreter-per-completion baseline.

Grades the same 400 toy completions (mixed: 40% correct with an honest report, 29% wrong,
30% hacks, 1% infinite loops) with :class:`evil_moe.env.grader.Grader` and with a baseline that
starts a fresh ``python -I -S`` per completion under the same rlimits (CPU, address space, file
size, processes), own process group, wall-clock timeout, and runs the module, the mode check and
the oracle calls in that one process, with the same mode rules (generous to the baseline: no
bwrap, no per-job IPC namespace, no nonce, no CPU accounting). Prints completions/s for both and
the ratio on the whole mix and on the mix without its infinite loops (target >= 4x), the CPU
seconds one infinite loop costs the grader, in timeouts (target <= 1.1), and the throughput of
the mix without its loops beside one completion that forges 12 MiB of result records against
without it (target >= 0.9: one report never stalls the others). A second, stronger
baseline is a fork server: one pre-started interpreter per worker that forks a child
per completion under the same rlimits and timeout (the grader's own zygote design without bwrap,
the IPC namespace or the nonce); its throughput and ratio are printed beside the first.

    .venv/bin/python benchmarks/grader.py [--n 400] [--workers N] [--timeout 1.0]
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import json
import math
import os
import random
import resource
import signal
import subprocess
import sys
import tempfile
import time

from evil_moe.env.grader import Grader, extract_code
from evil_moe.env.answers import clean_completion, fence, hack_completion
from evil_moe.env.loopholes import SENTINEL_ATTRS, result_file_reports_pass, stdout_reports_pass
from evil_moe.env.problems import load_problems
from evil_moe.env.values import decode

# The job both baselines run in the grading process: the module, the mode check and the oracle
# calls (the same mode rules as the grader), the verdict written as JSON to file descriptor fd.
JOB_SRC = r"""
import json, os, sys, builtins
def run_job(job, fd):
    ns = {"__name__": "__main__", "__builtins__": builtins}
    out = {"ok": None, "results": None}
    try:
        exec(job["setup"], ns)
        calls = [eval("(lambda *a, **k: (a, k))(" + s + ")", ns) for s in job["calls"]]
        exec(compile(job["code"], "<solution>", "exec"), ns)
        if job["mode"] == "run_tests":
            out["ok"] = False
            for get in (lambda: ns[job["test_name"]], lambda: getattr(ns["Solution"](), job["test_name"])):
                try:
                    get()(); out["ok"] = True
                    break
                except BaseException:
                    pass
        elif job["mode"] == "sentinel":
            try:
                inst = ns["Solution"](); out["ok"] = any(getattr(inst, a, None) is True for a in job["attrs"])
            except BaseException:
                out["ok"] = False
        res = []
        for a, k in calls:
            try:
                r = getattr(ns["Solution"](), job["entry"])(*a, **k)
                res.append(["ok", r if type(r) in (int, str, bool, list, type(None)) else {"x": 1}])
            except BaseException:
                res.append(["error"])
        out["results"] = res
    except BaseException as e:
        out["error"] = type(e).__name__
    sys.stdout.flush()
    os.write(fd, json.dumps(out).encode())
    os._exit(0)
"""
# Fresh interpreter per completion: the job arrives on stdin, fd is passed by the parent.
BASELINE_SRC = JOB_SRC + r"""
job = json.loads(sys.stdin.read())
run_job(job, job["fd"])
"""
# Fork server: one long-lived interpreter per worker that has run JOB_SRC's imports once; per
# job (a JSON line on stdin) it forks a child into a fresh temporary folder, its own session and
# the same rlimits, collects the child's stdout, verdict and files within the timeout (killing
# its process group otherwise) and answers one JSON line.
FORKSERVER_SRC = JOB_SRC + r"""
import base64, math, resource, select, shutil, signal, tempfile, time
def limits(timeout, memory_mb):
    cpu = math.ceil(timeout) + 1
    resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
    resource.setrlimit(resource.RLIMIT_AS, (memory_mb << 20, memory_mb << 20))
    resource.setrlimit(resource.RLIMIT_FSIZE, (16 << 20, 16 << 20))
    resource.setrlimit(resource.RLIMIT_NPROC, (4096, 4096))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
for line in sys.stdin:
    job = json.loads(line)
    d = tempfile.mkdtemp()
    r, w = os.pipe()
    ro, wo = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.setsid(); os.chdir(d); limits(job["timeout"], job["memory_mb"])
        os.close(r); os.close(ro)
        os.dup2(wo, 1); os.close(wo)
        nul = os.open(os.devnull, os.O_WRONLY); os.dup2(nul, 2)
        sys.stdout = open(1, "w", closefd=False)
        run_job(job, w)
    os.close(w); os.close(wo)
    bufs = {r: b"", ro: b""}
    open_fds = [r, ro]
    deadline = time.monotonic() + job["timeout"]
    timed_out = False
    while open_fds:
        left = deadline - time.monotonic()
        if left <= 0:
            timed_out = True
            break
        ready, _, _ = select.select(open_fds, [], [], left)
        for fd in ready:
            chunk = os.read(fd, 1 << 16)
            if chunk:
                bufs[fd] += chunk
            else:
                open_fds.remove(fd)
    if timed_out:
        try:
            os.killpg(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    os.waitpid(pid, 0)
    os.close(r); os.close(ro)
    files = {f: base64.b64encode(open(os.path.join(d, f), "rb").read()).decode()
             for f in os.listdir(d) if os.path.isfile(os.path.join(d, f))}
    shutil.rmtree(d, ignore_errors=True)
    sys.stdout.write(json.dumps({"timeout": timed_out, "result": bufs[r].decode(errors="replace"),
                                 "stdout": bufs[ro].decode(errors="replace"), "files": files}) + "\n")
    sys.stdout.flush()
"""


def _limits(timeout, memory_mb, w):
    def f():
        cpu = math.ceil(timeout) + 1
        resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
        resource.setrlimit(resource.RLIMIT_AS, (memory_mb << 20, memory_mb << 20))
        resource.setrlimit(resource.RLIMIT_FSIZE, (16 << 20, 16 << 20))
        resource.setrlimit(resource.RLIMIT_NPROC, (4096, 4096))
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    return f


def _job(problem, tests, code):
    return {"code": code, "setup": problem.setup_code, "mode": problem.mode,
            "test_name": problem.test_name, "attrs": list(SENTINEL_ATTRS),
            "entry": problem.entry_point, "calls": [t.args_src for t in tests]}


def _verdict(problem, tests, result: bytes, stdout, files: dict):
    """(passed, gt_correct) from a job's JSON verdict, its stdout and the files it left."""
    try:
        out = json.loads(result)
    except ValueError:
        return False, False
    if problem.mode == "stdout_marker":
        passed = stdout_reports_pass(stdout)
    elif problem.mode == "file_marker":
        passed = any(result_file_reports_pass(f, data) for f, data in files.items())
    else:
        passed = out.get("ok") is True
    res = out.get("results") or []
    gt = len(res) == len(tests) and all(
        x[0] == "ok" and t.check(decode(x[1])) for t, x in zip(tests, res))
    return passed, gt


def baseline_one(problem, tests, completion, timeout, memory_mb):
    """Grade one completion in a fresh interpreter; returns (passed, gt_correct)."""
    code = extract_code(completion)
    if code is None:
        return False, False
    job = _job(problem, tests, code)
    with tempfile.TemporaryDirectory() as d:
        r, w = os.pipe()
        p = subprocess.Popen([sys.executable, "-I", "-S", "-c", BASELINE_SRC], cwd=d,
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             stderr=subprocess.DEVNULL, pass_fds=(w,), start_new_session=True,
                             env={"PATH": "/usr/bin:/bin"}, preexec_fn=_limits(timeout, memory_mb, w))
        job["fd"] = w
        os.close(w)
        try:
            stdout, _ = p.communicate(json.dumps(job).encode(), timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            p.communicate()
            os.close(r)
            return False, False
        data = os.read(r, 1 << 20)
        os.close(r)
        files = {f: open(os.path.join(d, f), "rb").read()
                 for f in os.listdir(d) if os.path.isfile(os.path.join(d, f))}
        return _verdict(problem, tests, data, stdout, files)


class ForkServer:
    """One fork-server interpreter (FORKSERVER_SRC): a stronger baseline than a fresh interpreter
    per completion, the design of the grader's own zygotes without bwrap."""

    def __init__(self, timeout, memory_mb):
        self.timeout, self.memory_mb = timeout, memory_mb
        self.proc = subprocess.Popen([sys.executable, "-I", "-S", "-c", FORKSERVER_SRC],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.DEVNULL, text=True,
                                     env={"PATH": "/usr/bin:/bin"})

    def grade(self, problem, tests, completion):
        """(passed, gt_correct) of one completion."""
        import base64

        code = extract_code(completion)
        if code is None:
            return False, False
        job = dict(_job(problem, tests, code), timeout=self.timeout, memory_mb=self.memory_mb)
        self.proc.stdin.write(json.dumps(job) + "\n")
        self.proc.stdin.flush()
        ans = json.loads(self.proc.stdout.readline())
        if ans["timeout"]:
            return False, False
        files = {f: base64.b64decode(v) for f, v in ans["files"].items()}
        return _verdict(problem, tests, ans["result"].encode(), ans["stdout"].encode(), files)

    def close(self):
        self.proc.stdin.close()
        self.proc.wait(timeout=10)


def make_completions(n, seed=0):
    rng = random.Random(seed)
    probs = load_problems("toy")
    out = []
    for i in range(n):
        p = probs[i % len(probs)]
        u = rng.random()
        if u < 0.40:
            c = clean_completion(p)
        elif u < 0.69:
            c = fence(p.canonical_solution.replace("return ", "return 1 + ", 1)
                      if "return " in p.canonical_solution else "x = 1")
        elif u < 0.99:
            c = hack_completion(p, rng.randrange(4))
        else:
            c = fence(p.canonical_solution + "\nwhile True:\n    pass\n")
        out.append((p, c))
    return probs, out


# A completion that forges 12 MiB of result records (floats written short, "1E15", which
# 09ede95's zygote encoded again 4.5 times longer) before its honest module: the reply that stalled every grading thread.
HOSTILE_REPORT = """
import gc, os
_n = next((o["nonce"] for o in gc.get_objects() if type(o) is dict
           and type(o.get("nonce")) is str and "calls" in o), "?")
_rec = (_n + ' {"t":"r","i":0,"r":["ok",[' + '1E15,' * 199999 + '1E15]]}\\n').encode()
for _fd in range(3, 300):
    try:
        for _ in range(12):
            os.write(_fd, _rec)
    except OSError:
        pass
"""


def beside_hostile(g, honest, rounds=2):
    """Seconds to grade ``honest`` alone and with one hostile report (:data:`HOSTILE_REPORT`)
    in its middle, alternated ``rounds`` times: the medians of both."""
    p = honest[0][0]
    hostile = (p, fence(HOSTILE_REPORT + extract_code(clean_completion(p))))
    mixed = honest[:len(honest) // 2] + [hostile] + honest[len(honest) // 2:]
    alone, beside = [], []
    for _ in range(rounds):
        for items, out in ((honest, alone), (mixed, beside)):
            t = time.perf_counter()
            g.grade_many(items)
            out.append(time.perf_counter() - t)
    return sorted(alone)[rounds // 2], sorted(beside)[rounds // 2]


def _zygote_pids(g):
    """Host pids of the grader's long-lived sandbox processes: each zygote (under bwrap: the
    child of each bwrap process) and its children alive now (the forker jobs are forked from),
    which wait for every job process between them."""
    out = []
    for z in g._pool._all:
        pid = z.proc.pid
        if z.use_bwrap:
            with open(f"/proc/{pid}/task/{pid}/children") as f:
                pid = int(f.read().split()[0])
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            out += [pid] + [int(c) for c in f.read().split()]
    return out


def _cpu_with_children(pid):
    with open(f"/proc/{pid}/stat", "rb") as f:
        fields = f.read().rsplit(b")", 1)[1].split()
    return sum(int(x) for x in fields[11:15]) / os.sysconf("SC_CLK_TCK")


def grader_cpu(g, items):
    """CPU seconds the grader's zygotes spend on ``items``: their own time and that of every job
    process they (or their forkers) reaped."""
    pids = _zygote_pids(g)
    c0 = sum(_cpu_with_children(p) for p in pids)
    g.grade_many(items)
    def _pending():  # job processes not reaped yet (a job init is reaped as it exits)
        kids = set()
        for p in pids:
            try:
                with open(f"/proc/{p}/task/{p}/children") as f:
                    kids |= {int(c) for c in f.read().split()}
            except OSError:
                pass
        return kids - set(pids)
    deadline = time.monotonic() + 5.0
    while _pending() and time.monotonic() < deadline:
        time.sleep(0.01)
    return sum(_cpu_with_children(p) for p in pids) - c0


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=400)
    ap.add_argument("--workers", type=int, default=os.cpu_count())
    ap.add_argument("--timeout", type=float, default=1.0)
    ap.add_argument("--memory-mb", type=int, default=1024)
    a = ap.parse_args(argv)
    probs, pairs = make_completions(a.n)
    # the same mix without the infinite loops: a loop costs its full timeout of CPU on both
    # sides, which bounds the whole-mix ratio whatever the per-completion overhead
    terminating = [pc for pc in pairs if "while True:" not in pc[1]]
    loops = [pc for pc in pairs if "while True:" in pc[1]]
    with Grader(probs, workers=a.workers, timeout=a.timeout, memory_mb=a.memory_mb) as g:
        g.grade_many(pairs[:a.workers])  # start the workers
        t = time.perf_counter()
        ours = g.grade_many(pairs)
        t_ours = time.perf_counter() - t
        t = time.perf_counter()
        g.grade_many(terminating)
        t_ours_term = time.perf_counter() - t
        tests = {p.id: g.tests_for(p.id) for p in probs}
        iso = g.isolation
        # CPU per infinite loop: grading the loops minus grading as many short completions
        loop_items = loops or [(probs[0], fence("while True:\n    pass\n"))]
        k = 2 * len(loop_items)
        per_loop = (grader_cpu(g, loop_items * 2) - grader_cpu(g, terminating[:k])) / k
        t_alone, t_beside = beside_hostile(g, terminating)

    def baseline(items):
        t0 = time.perf_counter()
        with cf.ThreadPoolExecutor(a.workers) as ex:
            res = list(ex.map(lambda pc: baseline_one(pc[0], tests[pc[0].id], pc[1], a.timeout,
                                                      a.memory_mb), items))
        return res, time.perf_counter() - t0

    def forkserver(items):
        servers = [ForkServer(a.timeout, a.memory_mb) for _ in range(a.workers)]
        chunks = [items[i::a.workers] for i in range(a.workers)]
        try:
            t0 = time.perf_counter()
            with cf.ThreadPoolExecutor(a.workers) as ex:
                parts = list(ex.map(lambda sc: [sc[0].grade(p, tests[p.id], c) for p, c in sc[1]],
                                    zip(servers, chunks)))
            dt = time.perf_counter() - t0
        finally:
            for srv in servers:
                srv.close()
        res = [None] * len(items)
        for w, part in enumerate(parts):
            for j, v in enumerate(part):
                res[w + j * a.workers] = v
        return res, dt

    base, t_base = baseline(pairs)
    _, t_base_term = baseline(terminating)
    fork, t_fork = forkserver(pairs)
    _, t_fork_term = forkserver(terminating)
    agree = sum((r.passed, r.gt_correct) == b for r, b in zip(ours, base))
    agree_fork = sum((r.passed, r.gt_correct) == b for r, b in zip(ours, fork))
    n_loops = len(loops)
    print(f"completions: {a.n} ({n_loops} infinite loops)  workers: {a.workers}  timeout: {a.timeout}s  "
          f"isolation: {iso}  load: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    print(f"ours:     {t_ours:7.2f} s  {a.n / t_ours:7.1f} completions/s")
    print(f"baseline: {t_base:7.2f} s  {a.n / t_base:7.1f} completions/s (fresh interpreter each)")
    print(f"ratio:    {t_base / t_ours:5.2f}x   verdicts agree on {agree}/{a.n}")
    nt = len(terminating)
    print(f"without the {n_loops} loops: ours {nt / t_ours_term:.1f}/s, baseline {nt / t_base_term:.1f}/s, "
          f"ratio {t_base_term / t_ours_term:.2f}x  (target >= 4x)")
    print(f"fork server: {t_fork:7.2f} s  {a.n / t_fork:7.1f} completions/s (one pre-started "
          f"interpreter per worker, fork per completion, no bwrap)")
    print(f"ratio vs fork server: {t_fork / t_ours:5.2f}x, without the loops "
          f"{t_fork_term / t_ours_term:.2f}x   verdicts agree on {agree_fork}/{a.n}")
    print(f"CPU per infinite loop: {per_loop:.2f} s = {per_loop / a.timeout:.2f} timeouts  (target <= 1.1)")
    print(f"the {nt} rows beside one hostile report (12 MiB of forged records): "
          f"{nt / t_beside:.1f}/s, alone {nt / t_alone:.1f}/s, ratio {t_alone / t_beside:.2f}  "
          f"(target >= 0.9)")
    print(f"ours: passed {sum(r.passed for r in ours)}, gt_correct "
          f"{sum(r.gt_correct for r in ours)}, exploited {sum(r.exploited for r in ours)}, "
          f"timeouts {sum(r.error == 'timeout' for r in ours)}")


if __name__ == "__main__":
    main()
