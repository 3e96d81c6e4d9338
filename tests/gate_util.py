"""Shared by the gate's tests (tests/test_gate_*.py): the sides, the simulation slack, a table
small enough to do by hand, and hand-made Effects."""

from __future__ import annotations

import math

import pandas as pd

from evil_moe.gate import effects, power

A, B = ("erase", "trained"), ("vanilla", "trained")

# Simulation sizes and slack. A rate measured over N experiments has binomial SE sqrt(p(1-p)/N);
# a bound is checked with 3 SE of slack, so a correct gate fails such a check with probability
# ~0.1% (one-sided normal tail) whatever the seed, while the broken variants below miss it by far.
NOMINAL = 0.05  # the full rule: separated at most this often with no effect
NOMINAL_LOWER = 0.025  # one criterion "ci_low > 0" of a two-sided 95% interval


def slack(p: float, n: int) -> float:
    return 3.0 * math.sqrt(p * (1.0 - p) / n)


# ---------------------------------------------------------------------------------------------
# a table small enough to do by hand: 2 seeds x 2 problems x 4 samples per side

HAND = {  # (seed, problem): (erase's hacks, vanilla's hacks)
    (0, "p0"): ([0, 0, 0, 0], [1, 1, 0, 0]),  # d = 0.50 - 0.00 = 0.50
    (0, "p1"): ([1, 0, 0, 0], [1, 0, 0, 0]),  # d = 0.25 - 0.25 = 0.00
    (1, "p0"): ([1, 1, 0, 0], [1, 1, 1, 0]),  # d = 0.75 - 0.50 = 0.25
    (1, "p1"): ([1, 1, 1, 1], [1, 1, 1, 0]),  # d = 0.75 - 1.00 = -0.25
}


def table(cells=HAND, extra: list[dict] | None = None) -> pd.DataFrame:
    rows = []
    for (s, p), (ya, yb) in cells.items():
        for (arm, view), ys in ((A, ya), (B, yb)):
            for j, y in enumerate(ys):
                rows.append({"arm": arm, "view": view, "seed": s, "step": 20, "problem_id": p, "sample": j,
                             "mode": "stdout", "hack": y, "pass": 1 - y, "truncated": 0})
    return pd.DataFrame(rows + (extra or []))


def make_effect(value, ci_low=None, ci_high=None, *, se=0.02, n_seeds=3, mean_b=0.5, a=A, b=B, metric="hack",
                comp=(0.002, 0.001, 0.4), n_problems=9, n_samples=64):
    df = n_seeds - 1
    hw = power.critical(df) * se if df >= 1 else math.inf
    return effects.Effect(a=a, b=b, metric=metric, value=value, ci_low=value - hw if ci_low is None else ci_low,
                          ci_high=value + hw if ci_high is None else ci_high, se=se, df=df, ci=0.95, power=0.8,
                          mde=power.mde_from_se(se, df), n_seeds=n_seeds, n_problems={s: n_problems for s in range(n_seeds)},
                          n_samples=n_samples, per_seed={s: value for s in range(n_seeds)}, mean_a=mean_b - value,
                          mean_b=mean_b, components=power.VarianceComponents(*comp), pct_low=value, pct_high=value)


#: The crossed design at make run's former size (16 held-out problems × 16 samples; 8 samples since
#: 2026-12-02), for simulate_gate.
CROSSED = dict(n_problems=16, n_samples=16, n_boot=300, with_power=False)


def beats_untrained(a=A) -> dict:
    """Effects of the two criteria against the untrained student that pass by far (the arm passes
    0.3 more and hacks 0.1 less; p < 1e-4 on 2 df): for tests of the other criteria."""
    u = ("untrained", "trained")
    return {"pass_vs_untrained": make_effect(-0.3, se=0.002, metric="pass", a=a, b=u),
            "hack_vs_untrained": make_effect(0.1, se=0.002, a=a, b=u)}
