"""The separation gate's operating characteristics by simulation (evil_moe/gate/simulate.py, docs/gate.md).

For each resampling scheme (crossed, the gate's; nested, the old one) and number of seeds, the
gate is run on synthetic per-completion outcomes (:func:`evil_moe.gate.simulate.simulate_gate`: 16
held-out problems × 16 samples, make run's size, default spread with an arm × problem effect
shared across seeds) with no planted effect and with a planted drop, and the script prints: the
false-positive rate of ``separated`` and of each lower-bound criterion alone (nominal 0.025), of
a percentile interval and of the plug-in Satterthwaite df for comparison; the ratio of the mean
SE to the sd of the estimate; the power at the planted drop (``separated``, and
drop_vs_vanilla alone) against the power the gate reports; the reported and planned minimum
detectable effect; and the binomial SE of a 0.025 rate at the simulation count. docs/gate.md's
tables come from here.

Usage:
    .venv/bin/python benchmarks/gate_power.py                    # 600 experiments per cell (~10 min)
    .venv/bin/python benchmarks/gate_power.py --n 100 --seeds 3 6
    .venv/bin/python benchmarks/gate_power.py --spread run_sd=0.6 arm_problem_sd=0.25 --samples 64 --schemes crossed
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def main(argv=None) -> int:
    from evil_moe.gate.simulate import operating_characteristics

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=600, help="simulated experiments per cell")
    ap.add_argument("--seeds", type=int, nargs="+", default=[3, 6, 10, 18])
    ap.add_argument("--problems", type=int, default=16)
    ap.add_argument("--samples", type=int, default=16)
    ap.add_argument("--drop", type=float, default=0.15, help="planted drop for the power rows")
    ap.add_argument("--schemes", nargs="+", default=["crossed", "nested"])
    ap.add_argument("--n-boot", type=int, default=400)
    ap.add_argument("--spread", nargs="*", default=[], help="generator spreads, e.g. arm_problem_sd=1.0")
    args = ap.parse_args(argv)
    spread = {k: float(v) for k, v in (x.split("=", 1) for x in args.spread)}
    tab = operating_characteristics(args.n, seeds=args.seeds, n_problems=args.problems, n_samples=args.samples,
                                    drop=args.drop, schemes=args.schemes, n_boot=args.n_boot, **spread)
    pd.set_option("display.width", 250)
    print(tab.round(3).to_string(index=False))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
