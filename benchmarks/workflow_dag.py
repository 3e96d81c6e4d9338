"""Benchmark: how long Snakemake takes to build the DAG of a big sweep (a dry run).

Writes a ``--configfile`` overlay on ``config/config.yaml`` with ``--seeds`` pilot seeds × the six
arms of the default (each treatment with its matched control, and the positive control; default
56 × 6 = 336 pilot jobs, plus problems, toy models, teacher, extract, distill,
compare, ...) and an empty temporary ``results`` folder, then times ``snakemake -n`` (the whole
command: interpreter start, Snakefile parse, config validation, DAG, job listing). Sizing the
pilot arms × seeds avoids faking a "separated" gate.json: the sweep rules only add jobs after the
compare checkpoint has run. Prints wall and CPU seconds (CPU: the figure a loaded machine does
not inflate) and the job count of each repetition, and the medians.
Target: <= 5 s for >= 300 jobs; issue 22: a 3,000-job sweep (``--seeds 500``) in < 10 s.

Where ``snakemake -n`` of the 3,008-job sweep spends its CPU (cProfile, 2026-12-01): about 1.9 s
importing Snakemake and 1.2 s more before the first job (a one-seed run takes 3.1 CPU s), then
~3.9 ms per job, all but a few per cent of it inside Snakemake: building the DAG ~45% (jobs,
input expansion, matching files to rules), listing the jobs ~30% (``Job.log_info``: the message
and the shell command, formatted four times per job, params and resources re-evaluated because
Snakemake resets them after the DAG), directory-output and conda-env checks ~12%, and
``inspect.signature`` of every input/params/resources/priority function on every call ~10%.
The workflow's own functions were ~0.5%. What the workflow controls now costs less: the config
schema is parsed once per process (it was parsed three times, ~0.1 s each) and the per-job
functions hand Snakemake their parameters once (``_per_job`` in rules/common.smk); measured with
the dry run's job commands and listing unchanged: 63,394 -> 27,418 ``inspect.signature`` calls
and one schema parse instead of three, ~0.75 CPU s less by construction (the CPU time of a
loaded 2-core machine varies more than that: 13.5-18.1 s after, 14.8-18.6 s before, load 9-11).
A copy of the pilot rule with every per-job function replaced by a constant (not done: it
would change what the rule does) cost 13.4 CPU s against 14.7: Snakemake's own per-job cost is
~3.4 ms, so a 3,000-job dry run stays above 10 s on this machine (~13.4 s idle).

    .venv/bin/python benchmarks/workflow_dag.py [--seeds 56] [--repeat 3]
    .venv/bin/python benchmarks/workflow_dag.py --quick     # 51 seeds (>= 300 jobs), 1 repetition
"""

from __future__ import annotations

import argparse
import os
import re
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def snakemake_exe() -> str:
    exe = Path(sys.executable).parent / "snakemake"
    return str(exe) if exe.exists() else "snakemake"


def dry_run(overlay: Path) -> tuple[float, float, int, str]:
    """``snakemake -n`` with the overlay; returns (wall seconds, CPU seconds, jobs, output)."""
    cmd = [snakemake_exe(), "-n", "--cores", "1", "--configfile", str(REPO / "config" / "config.yaml"),
           str(overlay)]
    env = dict(os.environ, HF_HUB_OFFLINE="1")
    r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    p = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, env=env)
    dt = time.perf_counter() - t0
    r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime)
    out = p.stdout + p.stderr
    if p.returncode != 0:
        raise RuntimeError(f"snakemake -n failed ({p.returncode}):\n{out[-3000:]}")
    m = re.search(r"^total\s+(\d+)", out, re.M)
    if not m:
        raise RuntimeError(f"no job total in the dry run output:\n{out[-3000:]}")
    return dt, cpu, int(m.group(1)), out


def default_arms() -> list[str]:
    """``pilot.arms`` of config/config.yaml (each treatment with its matched control, and the
    positive control: the config refuses an arm set without them)."""
    import yaml

    return yaml.safe_load((REPO / "config" / "config.yaml").read_text())["pilot"]["arms"]


def main(argv=None) -> int:
    arms = default_arms()
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", type=int, default=56, help=f"pilot seeds (x {len(arms)} arms)")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--quick", action="store_true", help="51 seeds, one repetition")
    a = ap.parse_args(argv)
    seeds, repeat = (51, 1) if a.quick else (a.seeds, a.repeat)
    load = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="workflow_dag_") as tmp:
        overlay = Path(tmp) / "sweep.yaml"
        overlay.write_text(
            f"results: {Path(tmp) / 'results'}\n"
            "pilot:\n"
            f"  seeds: [{', '.join(str(s) for s in range(seeds))}]\n"
        )
        times, cpus, jobs = [], [], 0
        for r in range(repeat):
            dt, cpu, jobs, _ = dry_run(overlay)
            times.append(dt)
            cpus.append(cpu)
            print(f"  dry run {r}: {dt:.2f} s wall, {cpu:.2f} s CPU, {jobs} jobs", flush=True)
    m, mc = statistics.median(times), statistics.median(cpus)
    print(f"workflow_dag: {seeds} seeds x {len(arms)} arms -> {jobs} jobs; snakemake -n median {m:.2f} s "
          f"wall ({mc:.2f} s CPU) over {repeat} run(s) (target <= 5 s for >= 300 jobs, "
          f"< 10 s for 3,000); "
          f"{1000 * m / max(jobs, 1):.1f} ms/job; "
          f"load(1,5,15 min)={load[0]:.1f},{load[1]:.1f},{load[2]:.1f} cores={os.cpu_count()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
