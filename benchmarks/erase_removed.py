"""How much of each step erase removes, against its random control, per projection mode.

docs/method.md, "erase under AdamW": under AdamW, projecting the gradient does not project the
update (the Adam leak), and vanilla's update has about the isotropic null's cosine with v_hack, so erase may remove a
null-sized sliver — no more than random_v. This script runs erase and random_v on a finished
toy run's student and v_hack under each ``pilot.projection`` (gradient, update,
preconditioned) with AdamW, and under SGD (where projecting the gradient is exact), and prints
per mode the mean share of energy each arm removed per step (``steps.tsv removed_frac``), the
ratio erase / random_v, and the update's share in span(v_hack) (``update_span_frac``) next to
the random-direction expectation k/r.

Usage (after ``make run``, which leaves results/):

    .venv/bin/python benchmarks/erase_removed.py --results results --steps 10 --seeds 0 1
    .venv/bin/python benchmarks/erase_removed.py --sgd-lr 5 --sgd-lr 50      # find SGD's lr

The pick of ``pilot.projection``'s default is made by this table (the removed share against the
control), never by the gate's verdict.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))


def run(results: Path, arm: str, seed: int, sets: list[str], out: Path, configs=()) -> pd.DataFrame:
    """One pilot of ``arm`` on the finished run in ``results`` (made with ``config/config.yaml``
    plus ``configs``); its steps.tsv."""
    from evil_moe.config import load_config
    from evil_moe.stages.pilot import run_pilot

    cfg = load_config([REPO / "config" / "config.yaml", *configs], sets)
    run_pilot(cfg, problems_path=str(results / "problems.jsonl"), model_path=str(results / "models" / "student"),
              vhack_path=str(results / "vhack" / "main_hack.safetensors"),
              random_vhack_path=str(results / "vhack" / "main_random.safetensors"), arm=arm, seed=seed,
              out_dir=str(out))
    return pd.read_csv(out / "steps.tsv", sep="\t")


def null_span(results: Path) -> float:
    """Mean over modules of k/r, the expected energy share of a random direction in span(V)."""
    from evil_moe.rl.vhack.direction import VHack

    v = VHack.load(results / "vhack" / "main_hack.safetensors")
    shares = [V.shape[0] / v.r[n] for n, V in v.V.items() if V.shape[0]]
    return float(np.mean(shares))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--results", type=Path, default=REPO / "results")
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    ap.add_argument("--sgd-lr", type=float, action="append", default=None,
                    help="SGD learning rates to try (default: 20)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--configfile", type=Path, action="append", default=[],
                    help="config files the run in --results was made with, on top of config/config.yaml")
    args = ap.parse_args(argv)
    import torch

    torch.set_num_threads(args.threads)
    modes = [("adamw", "gradient", None), ("adamw", "update", None), ("adamw", "preconditioned", None)]
    modes += [("sgd", "gradient", lr) for lr in (args.sgd_lr or [20.0])]
    base = [f"pilot.steps={args.steps}", "pilot.heldout_samples=1", f"pilot.checkpoint_every={args.steps}"]
    print(f"# toy run {args.results}; {args.steps} steps; seeds {args.seeds}; random-direction span share "
          f"k/r = {null_span(args.results):.4f}")
    print("optimizer  projection      lr      erase_removed  random_v_removed  ratio  update_span(vanilla-like)  "
          "final_hack erase/random_v  s/pilot")
    with tempfile.TemporaryDirectory() as tmp:
        for opt, proj, lr in modes:
            sets = base + [f"pilot.optimizer={opt}", f"pilot.projection={proj}"] + ([f"pilot.lr={lr}"] if lr else [])
            res = {}
            t0 = time.time()
            for arm in ("erase", "random_v"):
                frames = [run(args.results, arm, s, sets, Path(tmp) / f"{opt}_{proj}_{lr}_{arm}_{s}",
                              args.configfile) for s in args.seeds]
                res[arm] = pd.concat(frames)
            secs = (time.time() - t0) / (2 * len(args.seeds))
            e, r = res["erase"]["removed_frac"].mean(), res["random_v"]["removed_frac"].mean()
            span = res["erase"]["update_span_frac"].mean()
            fh = {a: res[a].groupby("seed")["hack_rate"].apply(lambda x: x.tail(3).mean()).mean() for a in res}
            print(f"{opt:<10} {proj:<15} {lr or '':<7} {e:13.4f}  {r:16.4f}  {e / r if r else float('nan'):5.2f}  "
                  f"{span:25.4f}  {fh['erase']:.2f}/{fh['random_v']:.2f}  {secs:7.1f}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
