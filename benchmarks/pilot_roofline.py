"""Benchmark: one toy pilot against this machine's arithmetic bound.

Runs ONE pilot of the embedded default (``config/config.yaml``: its toy student, built once with the
project's own code and cached; arm ``vanilla``, seed 0, the default's steps, group, prompts and
held-out evaluation) in this process with the pilot's thread count (``pilot.threads``), counts its
tokens, measures this machine's fp32 matmul rate at the same thread count in the same run (before
and after the pilot, so a machine that gets busier shows as a spread), and prints:

* seconds per phase (wall, and the CPU seconds of the pilot's process) of the pilot run as a
  job runs it, in a fresh Python process: ``startup`` (the interpreter, imports, the config),
  ``sample`` (training rollouts), ``grade`` (training grading), ``loss`` (the loss and its
  gradient), ``arm+opt`` (flags, projection, optimiser step), ``eval`` (the held-out
  evaluation: sampling and grading), ``other`` (the rest: model load with the imports it
  triggers, SVD, grader start, checkpoints, writing, exit);
* the FLOP bound: ``2N`` per sampled token and ``6N`` per loss token (``N`` = the student's
  parameters, tied weights once; attention's sequence-length term and the adapter's matmuls are
  not counted), counted two ways: **per row** (every sampled row's prompt and completion through
  the model, every loss row's prompt and completion: the work of a sampler and a loss that
  treat rows independently, e.g. ``model.generate`` and TRL; the convention of the first measurement, 6.3x),
  and **per group** (each distinct prompt of a call or a step once, plus the completions: the
  least work the algorithm needs);
* ``bound = FLOPs / matmul rate`` and ``ratio = seconds / bound`` for both counts, with the wall
  and with the CPU seconds (the CPU ratio is robust to other processes on the machine; the wall
  ratio is what a user waits).

Grading runs in sandboxed child processes (their CPU is not the pilot's). The world (problems,
toy student, a random v_hack: vanilla only measures along it, so its directions do not change the
cost) is cached under ``--cache`` by the config's digest.

    .venv/bin/python benchmarks/pilot_roofline.py [--cache DIR] [--arm vanilla] [--seed 0] [--json F]
    .venv/bin/python benchmarks/pilot_roofline.py --quick     # smoke mode: tiny toy, 2 steps
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

T0 = time.perf_counter()  # a pilot child's clock starts here (its imports follow)
HERE = Path(__file__).resolve().parent
REPO = HERE.parent
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TQDM_DISABLE", "1")

QUICK_SETS = ["toy.hidden=64", "toy.layers=2", "toy.intermediate=128", "toy.vocab_size=400",
              "toy.train_steps=30", "toy.n_examples=60", "toy.eval_samples=2", "problems.limit=12",
              "pilot.steps=2", "pilot.heldout_samples=2", "pilot.max_new=48"]
PHASES = ("startup", "sample", "grade", "loss", "arm+opt", "eval", "other")


def bench_config(extra: list[str]):
    from evil_moe.config import load_config

    return load_config([REPO / "config" / "config.yaml"], ["models.device=cpu"] + extra)


def matmul_gflops(threads: int, n: int = 512, seconds: float = 1.0) -> float:
    """fp32 GFLOP/s of ``(n, n) @ (n, n)`` matmuls at ``threads`` torch threads (median of
    five timed bursts of about ``seconds / 5`` each)."""
    import statistics

    import torch

    saved = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        a, b = torch.randn(n, n), torch.randn(n, n)
        for _ in range(3):
            a @ b
        t, reps = time.perf_counter(), 0
        while time.perf_counter() - t < 0.05:
            a @ b
            reps += 1
        reps = max(1, int(reps * seconds / 5 / 0.05))
        rates = []
        for _ in range(5):
            t = time.perf_counter()
            for _ in range(reps):
                a @ b
            rates.append(2 * n ** 3 * reps / (time.perf_counter() - t) / 1e9)
        return statistics.median(rates)
    finally:
        torch.set_num_threads(saved)


def build_world(cache: Path, cfg) -> dict:
    """problems.jsonl, the toy student (trained with the project's own code), a random v_hack;
    cached under ``cache`` by the config's digest."""
    from evil_moe.rl.vhack.direction import random_vhack
    from evil_moe.stages.common import load_policy, set_threads
    from evil_moe.stages.problems import write_problem_set
    from evil_moe.stages.toy import train_toy_models

    root = cache / f"roofline_{cfg.digest('toy', 'problems', 'adapter')}"
    root.mkdir(parents=True, exist_ok=True)
    problems, student = root / "problems.jsonl", root / "models" / "student"
    if not problems.exists():
        write_problem_set(cfg, str(problems))
    if not (student / "config.json").exists():
        t = time.time()
        print(f"building the toy student into {student} ...", flush=True)
        set_threads(cfg.toy.threads)
        train_toy_models(cfg, problems_path=str(problems), out_dir=str(root / "models"),
                         which=("student",))
        print(f"  built in {time.time() - t:.0f} s", flush=True)
    vh = root / "vhack_random.safetensors"
    if not vh.exists():
        _, _, adapter, _ = load_policy(str(student), cfg)
        random_vhack(adapter.r, k=cfg.vhack.k, seed=0).save(vh)
    return {"problems": str(problems), "model": str(student), "vhack": str(vh)}


class Meter:
    """Wall and CPU seconds per phase, and the tokens of every sampled row and loss row."""

    def __init__(self):
        self.wall = {p: 0.0 for p in PHASES}
        self.cpu = {p: 0.0 for p in PHASES}
        # per row: prompt + completion of every row; per group: distinct prompts once + completions
        self.sampled = {"per_row": 0, "per_group": 0, "completion": 0, "rows": 0}
        self.loss = {"per_row": 0, "per_group": 0, "rows": 0}

    def timed(self, phase, fn):
        def wrapper(*a, **k):
            t, c = time.perf_counter(), time.process_time()
            try:
                return fn(*a, **k)
            finally:
                self.wall[phase] += time.perf_counter() - t
                self.cpu[phase] += time.process_time() - c
        return wrapper

    def count_sampled(self, fn):
        def wrapper(model, tok, prompt_ids, *a, **k):
            rolls = fn(model, tok, prompt_ids, *a, **k)
            comp = sum(len(r.completion_ids) for r in rolls)
            self.sampled["completion"] += comp
            self.sampled["rows"] += len(rolls)
            self.sampled["per_row"] += sum(len(r.prompt_ids) for r in rolls) + comp
            self.sampled["per_group"] += sum(len(p) for p in {tuple(p) for p in prompt_ids}) + comp
            return rolls
        return wrapper

    def count_loss(self, batch, rows):
        picked = [batch.flat[i] for i in rows]
        comp = sum(len(r.completion_ids) for r in picked)
        self.loss["rows"] += len(picked)
        self.loss["per_row"] += sum(len(r.prompt_ids) for r in picked) + comp
        self.loss["per_group"] += sum(len(p) for p in {tuple(r.prompt_ids) for r in picked}) + comp


def run(cfg, world: dict, arm: str, seed: int, out_dir: Path) -> tuple[Meter, float, int]:
    """One ``run_pilot`` in this process with the phases and tokens metered; returns the meter,
    the pilot's wall seconds and the student's parameter count."""
    import torch

    from evil_moe.model.load import count_parameters
    from evil_moe.rl.trainer import evaluation, trainer
    from evil_moe.stages import pilot

    m = Meter()
    T = trainer.Trainer
    saved = {name: getattr(T, name) for name in ("sample", "grade", "gradients", "apply_arm",
                                                 "optimiser_step", "train_step")}
    saved_eval, saved_gen = pilot.evaluate, evaluation.generate
    saved_tgen = trainer.generate
    n_params = []

    def train_step(self, step):
        if not n_params:
            n_params.append(count_parameters(self.model))
        inner_grad, counted = self.gradients, []

        def gradients(batch, adv, rows, st):  # the step's rows (a rebaseline's recompute is extra)
            if not counted:
                m.count_loss(batch, rows)
                counted.append(1)
            return inner_grad(batch, adv, rows, st)

        self.gradients = gradients
        try:
            return saved["train_step"](self, step)
        finally:
            del self.gradients

    T.sample = m.timed("sample", saved["sample"])
    T.grade = m.timed("grade", saved["grade"])
    T.gradients = m.timed("loss", saved["gradients"])
    T.apply_arm = m.timed("arm+opt", saved["apply_arm"])
    T.optimiser_step = m.timed("arm+opt", saved["optimiser_step"])
    T.train_step = train_step
    pilot.evaluate = m.timed("eval", saved_eval)
    trainer.generate = m.count_sampled(saved_tgen)
    evaluation.generate = m.count_sampled(saved_gen)
    t, c = time.perf_counter(), time.process_time()
    try:
        torch.set_num_threads(cfg.pilot.threads)
        pilot.run_pilot(cfg, problems_path=world["problems"], model_path=world["model"],
                        vhack_path=world["vhack"], random_vhack_path=world["vhack"], arm=arm,
                        seed=seed, out_dir=str(out_dir))
    finally:
        for name, fn in saved.items():
            setattr(T, name, fn)
        pilot.evaluate, evaluation.generate, trainer.generate = saved_eval, saved_gen, saved_tgen
    wall, cpu = time.perf_counter() - t, time.process_time() - c
    m.wall["other"] = wall - sum(v for k, v in m.wall.items() if k not in ("startup", "other"))
    m.cpu["other"] = cpu - sum(v for k, v in m.cpu.items() if k not in ("startup", "other"))
    return m, wall, n_params[0]


def report(m: Meter, n_params: int, gflops: float, load: str) -> dict:
    """Print the phase table, the token counts, the bound and the ratios; return the figures."""
    wall, cpu = sum(m.wall.values()), sum(m.cpu.values())
    print(f"\nphase seconds (wall / CPU of the pilot's process; {load}):")
    for p in PHASES:
        print(f"  {p:8s} {m.wall[p]:8.2f} {m.cpu[p]:8.2f}")
    print(f"  {'total':8s} {wall:8.2f} {cpu:8.2f}")
    s, lo = m.sampled, m.loss
    print(f"\ntokens: sampled rows {s['rows']} ({s['completion']} completion tokens; with prompts "
          f"per row {s['per_row']}, per group {s['per_group']}); loss rows {lo['rows']} (per row "
          f"{lo['per_row']}, per group {lo['per_group']}); N = {n_params / 1e6:.3f} M parameters")
    out = {"seconds": dict(m.wall), "cpu_seconds": dict(m.cpu), "total_s": wall, "total_cpu_s": cpu,
           "sampled_tokens": dict(s), "loss_tokens": dict(lo), "params": n_params,
           "matmul_gflops": gflops}
    print(f"matmul rate: {gflops:.1f} GFLOP/s (fp32, this machine, the pilot's threads)")
    for count in ("per_row", "per_group"):
        flops = 2 * n_params * s[count] + 6 * n_params * lo[count]
        bound = flops / (gflops * 1e9)
        out[count] = {"gflop": flops / 1e9, "bound_s": bound, "ratio": wall / bound,
                      "ratio_cpu": cpu / bound}
        print(f"bound ({count.replace('_', ' ')}): {flops / 1e9:.0f} GFLOP = {bound:.2f} s; "
              f"ratio {wall / bound:.2f}x wall, {cpu / bound:.2f}x CPU")
    print(f"pilot_roofline: {wall:.1f} s = {out['per_row']['ratio']:.2f}x the per-row bound "
          f"({out['per_group']['ratio']:.2f}x the per-group bound); {load}")
    return out


def child(args) -> int:
    """The pilot in this (fresh) process: write the meter's figures to ``args.child``."""
    import torch  # noqa: F401  (what the pilot job imports before its first step)

    import evil_moe.cli  # noqa: F401
    from evil_moe.rl.trainer import evaluation, trainer  # noqa: F401
    from evil_moe.stages import pilot  # noqa: F401

    cfg = bench_config((QUICK_SETS if args.quick else []) + args.sets)
    world = json.loads(args.world)
    startup = (time.perf_counter() - T0, time.process_time())
    with tempfile.TemporaryDirectory() as tmp:
        m, _, n_params = run(cfg, world, args.arm, args.seed, Path(tmp) / "pilot")
    m.wall["startup"], m.cpu["startup"] = startup
    m.cpu["other"] = time.process_time() - sum(v for k, v in m.cpu.items() if k != "other")
    Path(args.child).write_text(json.dumps({
        "wall": m.wall, "cpu": m.cpu, "sampled": m.sampled, "loss": m.loss, "params": n_params}))
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cache", default=str(Path(tempfile.gettempdir()) / "evil_moe_bench"),
                    help="where the toy world is built once and kept")
    ap.add_argument("--arm", default="vanilla")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--set", dest="sets", action="append", default=[], help="config KEY=VALUE")
    ap.add_argument("--quick", action="store_true", help="smoke mode: tiny toy, 2 steps")
    ap.add_argument("--json", default=None, help="write the figures here")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--world", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        return child(args)
    cfg = bench_config((QUICK_SETS if args.quick else []) + args.sets)
    world = build_world(Path(args.cache), cfg)
    before = matmul_gflops(cfg.pilot.threads)
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "child.json"
        cmd = [sys.executable, __file__, "--child", str(out), "--world", json.dumps(world),
               "--arm", args.arm, "--seed", str(args.seed)] + (["--quick"] if args.quick else [])
        for kv in args.sets:
            cmd += ["--set", kv]
        t = time.perf_counter()
        subprocess.run(cmd, cwd=REPO, check=True)
        wall = time.perf_counter() - t
        got = json.loads(out.read_text())
    after = matmul_gflops(cfg.pilot.threads)
    m = Meter()
    m.wall, m.cpu, m.sampled, m.loss = got["wall"], got["cpu"], got["sampled"], got["loss"]
    # other: everything of the job's wall time not in a named phase (model load, SVD, grader
    # start, checkpoints, writing, the interpreter's exit)
    m.wall["other"] = wall - sum(v for k, v in m.wall.items() if k != "other")
    load = f"load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs"
    print(f"\npilot_roofline: arm {args.arm} seed {args.seed}, {cfg.pilot.steps} steps x "
          f"{cfg.pilot.prompts_per_step} prompts x {cfg.pilot.group}, held-out "
          f"{cfg.pilot.heldout_samples} samples, {cfg.pilot.threads} thread(s); matmul "
          f"{before:.1f} GFLOP/s before, {after:.1f} after")
    figs = report(m, got["params"], (before + after) / 2, load)
    figs.update(matmul_before=before, matmul_after=after, load=load, arm=args.arm, seed=args.seed)
    if args.json:
        Path(args.json).write_text(json.dumps(figs, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
