"""The separation gate's operating characteristics by simulation (evil_moe/stats.py).

For each size (seeds × samples per problem, 9 held-out problems), the gate is run on synthetic
per-completion outcomes (:func:`evil_moe.stats.simulate_outcomes`, default spread) with no planted
effect and with a planted drop, and the script prints: the false-positive rate of ``separated``
(nominal ≤ 0.05), of the lower bound alone (nominal 0.025) and of a plain percentile interval
for comparison; the power at the planted drop against the power the gate reports; the reported
and planned minimum detectable effect; and the binomial SE of a 0.05 rate at the simulation
count. The README's table comes from here.

Usage:
    .venv/bin/python benchmarks/gate_power.py                 # 400 experiments per cell (~minutes)
    .venv/bin/python benchmarks/gate_power.py --n 100 --seeds 3 5 --samples 64
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def main(argv=None) -> int:
    from evil_moe.stats import operating_characteristics

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=400, help="simulated experiments per cell")
    ap.add_argument("--seeds", type=int, nargs="+", default=[2, 3, 5])
    ap.add_argument("--samples", type=int, nargs="+", default=[16, 64, 256])
    ap.add_argument("--drop", type=float, default=0.15, help="planted drop for the power rows")
    args = ap.parse_args(argv)
    tab = pd.concat([
        operating_characteristics(args.n, seeds=args.seeds, samples=args.samples, drop=args.drop),
        operating_characteristics(args.n, seeds=[s for s in args.seeds if s >= 3] or args.seeds,
                                  samples=args.samples[1:2] or args.samples, drop=args.drop,
                                  resample=("seed",)),
    ])
    print(tab.round(3).to_string(index=False))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
