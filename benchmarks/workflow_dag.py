"""Benchmark: how long Snakemake takes to build the DAG of a big sweep (a dry run), beside a peer.

Writes a ``--configfile`` overlay on ``config/config.yaml`` with ``--seeds`` pilot seeds × the
arms of the default (every arm of config/config.yaml: each treatment with its matched control,
the references and the positive control; default 56 × 12 = 672 pilot jobs, plus problems, toy
models, teacher, extract, distill,
compare, ...) and an empty temporary ``results`` folder, then times ``snakemake -n`` (the whole
command: interpreter start, Snakefile parse, config validation, DAG, job listing). Sizing the
pilot arms × seeds avoids faking a "separated" gate.json: the sweep rules only add jobs after the
compare checkpoint has run. Prints wall and CPU seconds (CPU: the figure a loaded machine does
not inflate) and the job count of each repetition, and the medians.
Target: <= 5 s for >= 300 jobs; for the GPU cluster: a 3,000-job sweep (``--seeds 500``) in < 10 s.

The peer (``peer_snakefile``): a bare Snakefile with the same job shape — one pilot job per
arm × seed with the pilot rule's inputs, six outputs, log, benchmark, priority, threads,
resources, params, message and shell command, a few upstream jobs and one comparison over every
outcomes.tsv — and none of this workflow's code. It is what Snakemake itself costs for this DAG;
ours / peer is the share the workflow adds. Ours and the peer alternate, so load drift hits both.

Where ``snakemake -n`` of the 3,008-job sweep spends its CPU (cProfile, 2026-12-01): about 1.9 s
importing Snakemake and 1.2 s more before the first job (a one-seed run takes 3.1 CPU s), then
~3.9 ms per job, all but a few per cent of it inside Snakemake: building the DAG ~45% (jobs,
input expansion, matching files to rules), listing the jobs ~30% (``Job.log_info``: the message
and the shell command, formatted four times per job, params and resources re-evaluated because
Snakemake resets them after the DAG), directory-output and conda-env checks ~12%, and
``inspect.signature`` of every input/params/resources/priority function on every call ~10%.
The workflow's own functions were ~0.5%. What the workflow controls now costs less: the config
schema is parsed once per process (it was parsed three times, ~0.1 s each) and the per-job
functions hand Snakemake their parameters once (``per_job`` in evil_moe/workflow.py); measured with
the dry run's job commands and listing unchanged: 63,394 -> 27,418 ``inspect.signature`` calls
and one schema parse instead of three, ~0.75 CPU s less by construction.
What the job shape costs (bare Snakefiles, 3,000 jobs, min of 3 CPU s, 2026-12-01): one input
and one output 5.8 s; five more outputs +2.8 s; four more inputs +2.0 s; params and a log +1.1 s; the
message +0.9 s in ours (a fifth formatting of the job). Dropping the message and three outputs
from our pilot rule would reach ~10.6 s: the 10-s target is below what Snakemake 9.27 costs for
this job shape on this machine, and was not bought by cutting what the rule records.

    .venv/bin/python benchmarks/workflow_dag.py [--seeds 56] [--repeat 3] [--no-peer]
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


def dry_run(args: list[str]) -> tuple[float, float, int, str]:
    """``snakemake -n --cores 1 ARGS`` in the repository; returns (wall seconds, CPU seconds,
    jobs, output). Raises RuntimeError naming the exit status when the dry run fails."""
    cmd = [snakemake_exe(), "-n", "--cores", "1", *args]
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


PEER_SNAKEFILE = """\
# The peer: Snakemake alone with this workflow's job shape (benchmarks/workflow_dag.py).
ARMS = {arms!r}
SEEDS = list(range({seeds}))
MATCHES = {matches!r}
FILES = ["steps.tsv", "eval.tsv", "outcomes.tsv", "rollouts.jsonl.gz", "adapter.safetensors",
         "status.json"]


def pilot_input(wildcards):
    inputs = {{"problems": "r/problems.jsonl", "model": "r/models/student/config.json",
              "vhack": "r/vhack/main_hack.safetensors",
              "random_vhack": "r/vhack/main_random.safetensors"}}
    if wildcards.arm in MATCHES:
        inputs["match_flags"] = f"r/pilots/{{MATCHES[wildcards.arm]}}/s{{wildcards.seed}}/steps.tsv"
    return inputs


def pilot_options(wildcards):
    m = MATCHES.get(wildcards.arm)
    return f"--match-flags r/pilots/{{m}}/s{{wildcards.seed}}/steps.tsv" if m else ""


def mem_mb(wildcards, attempt):
    return 4000 * attempt


def runtime(wildcards, attempt):
    return 30 * attempt


def priority(wildcards):
    return len(wildcards.arm)


def config_json(wildcards):
    return '{{"pilot": {{"steps": 300}}}}'


rule all:
    input:
        "r/compare/gate.json",


rule problems:
    output:
        "r/problems.jsonl",
    shell:
        "touch {{output}}"


rule model:
    input:
        "r/problems.jsonl",
    output:
        "r/models/student/config.json",
    shell:
        "touch {{output}}"


rule extract:
    input:
        "r/problems.jsonl",
        "r/models/student/config.json",
    output:
        hack="r/vhack/main_hack.safetensors",
        random="r/vhack/main_random.safetensors",
    shell:
        "touch {{output}}"


rule pilot:
    input:
        unpack(pilot_input),
    output:
        **{{f.split(".")[0]: f"r/pilots/{{{{arm}}}}/s{{{{seed}}}}/{{f}}" for f in FILES}},
    log:
        "r/logs/pilot/{{arm}}_s{{seed}}.log",
    benchmark:
        "r/benchmarks/pilot/{{arm}}_s{{seed}}.tsv"
    priority: priority
    threads: 1
    resources:
        mem_mb=mem_mb,
        runtime=runtime,
        gpu=0,
    params:
        cfg=config_json,
        model="r/models/student",
        options=pilot_options,
        out_dir="r/pilots/{{arm}}/s{{seed}}",
    message:
        "pilot {{wildcards.arm}} seed {{wildcards.seed}}; log: {{log}}"
    shell:
        "evil-moe pilot --config-json {{params.cfg:q}} --problems {{input.problems:q}}"
        " --model {{params.model:q}} --vhack {{input.vhack:q}} --random-vhack {{input.random_vhack:q}}"
        " --arm {{wildcards.arm}} --seed {{wildcards.seed}} {{params.options}}"
        " --out-dir {{params.out_dir:q}} > {{log:q}} 2>&1"


rule compare:
    input:
        pilots=expand("r/pilots/{{arm}}/s{{seed}}/outcomes.tsv", arm=ARMS, seed=SEEDS),
    output:
        "r/compare/gate.json",
    shell:
        "touch {{output}}"
"""


def peer_snakefile(arms: list[str], seeds: int) -> str:
    """A bare Snakefile with this workflow's job shape: a pilot job per arm x seed with the pilot
    rule's inputs (problems, student, v_hack pair; a random-flag control also its matched arm's
    steps.tsv), its six outputs, log, benchmark, priority, threads, resources (two functions of
    the attempt, a constant), params (two functions, two strings) and message, the same shell
    command; upstream problem, model and v_hack jobs and one comparison gathering every
    outcomes.tsv. None of the workflow's own code: what Snakemake 9 costs for the same DAG."""
    from evil_moe.rl.arms.registry import ARMS

    matches = {a: ARMS[a].matches for a in arms if ARMS[a].matches}
    return PEER_SNAKEFILE.format(arms=list(arms), seeds=seeds, matches=matches)


def main(argv=None) -> int:
    arms = default_arms()
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", type=int, default=56, help=f"pilot seeds (x {len(arms)} arms)")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--quick", action="store_true", help="51 seeds, one repetition")
    ap.add_argument("--no-peer", action="store_true", help="skip the bare-Snakemake peer")
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
        peer_dir = Path(tmp) / "peer"
        peer_dir.mkdir()
        (peer_dir / "Snakefile").write_text(peer_snakefile(arms, seeds))
        runs = {"ours": ["--configfile", str(REPO / "config" / "config.yaml"), str(overlay)]}
        if not a.no_peer:
            runs["peer"] = ["-s", str(peer_dir / "Snakefile"), "-d", str(peer_dir)]
        figures = {name: ([], [], 0) for name in runs}
        for r in range(repeat):  # ours and the peer alternate: load drift hits both
            for name, args in runs.items():
                dt, cpu, jobs, _ = dry_run(args)
                times, cpus, _ = figures[name]
                times.append(dt)
                cpus.append(cpu)
                figures[name] = (times, cpus, jobs)
                print(f"  {name} dry run {r}: {dt:.2f} s wall, {cpu:.2f} s CPU, {jobs} jobs", flush=True)
    times, cpus, jobs = figures["ours"]
    m, mc = statistics.median(times), statistics.median(cpus)
    print(f"workflow_dag: {seeds} seeds x {len(arms)} arms -> {jobs} jobs; snakemake -n median {m:.2f} s "
          f"wall ({mc:.2f} s CPU) over {repeat} run(s) (target <= 5 s for >= 300 jobs, "
          f"< 10 s for 3,000); "
          f"{1000 * m / max(jobs, 1):.1f} ms/job; "
          f"load(1,5,15 min)={load[0]:.1f},{load[1]:.1f},{load[2]:.1f} cores={os.cpu_count()}")
    if "peer" in figures:
        ptimes, pcpus, pjobs = figures["peer"]
        pm, pmc = statistics.median(ptimes), statistics.median(pcpus)
        print(f"workflow_dag peer (bare Snakemake, same job shape): {pjobs} jobs; median {pm:.2f} s wall "
              f"({pmc:.2f} s CPU); ours / peer: {m / pm:.2f}x wall, {mc / pmc:.2f}x CPU")
    return 0


if __name__ == "__main__":
    sys.exit(main())
