"""The held-out trajectory: each arm's held-out hack and pass rates at every evaluated step of its
runs (``pilot.eval_every``: the pilots' ``trajectory.tsv`` and their final ``outcomes.tsv``),
with the gate's interval, and the rebound rule (docs/gate.md, "Rebound").

Wu & Tang (arXiv:2604.01476) describe three phases of RL under a reward that can be hacked:
hack attempts, a retreat to honest solving, and a rebound into hacking when honest reward stays
scarce; a single end-of-run snapshot cannot see the third. :func:`find_rebound` is the rule that
names one, a pure function of an arm's per-step rates and of the paired changes between its
steps; :func:`rebounds` applies it to every arm's judged view. Never a criterion: the gate
judges the last evaluation as before; a rebound is reported beside the verdict.

Every evaluation of a run samples the same held-out problems with the same seeds
(:func:`evil_moe.rl.trainer.evaluation.heldout_seed`), so two steps of one arm are paired as two
arms of one seed are: a change between steps is :func:`evil_moe.gate.effects.paired_effect` of
the one step against the other (seeds × problems, crossed bootstrap, t interval).
"""

from __future__ import annotations

from typing import Callable, Sequence

import pandas as pd

from evil_moe.gate.defaults import CI
from evil_moe.gate.effects import paired_effect, side_rate
from evil_moe.gate.power import finite
from evil_moe.pilots import Pilot
from evil_moe.rl.arms.registry import ARMS

# a change between two checkpoints: (value, ci_low, ci_high) of rate[to] - rate[from], at a level
Change = Callable[[int, int, float], tuple[float, float, float]]


def trajectory_outcomes(pilots: Sequence[Pilot]) -> pd.DataFrame:
    """Every evaluated step's per-completion outcomes of the pilots that evaluated along the run
    (a ``trajectory.tsv``), their final evaluation included (``outcomes.tsv``'s last step); the
    untrained student's evaluation too (step −1: where every run starts), when it is among the
    pilots. Empty when no pilot has a trajectory."""
    def trains(p) -> bool:
        return p.run.arm not in ARMS or ARMS[p.run.arm].trains

    frames = [pd.concat([p.trajectory, p.outcomes], ignore_index=True) for p in pilots
              if trains(p) and p.trajectory is not None and p.outcomes is not None]
    if not frames:
        return pd.DataFrame()
    # the untrained student once: its trajectory.tsv is empty (it takes no step)
    frames += [p.outcomes for p in pilots if p.outcomes is not None and not trains(p)]
    return pd.concat(frames, ignore_index=True)


def _at(outcomes: pd.DataFrame, arm: str, view: str, step: int) -> pd.DataFrame:
    """The side ``(str(step), view)``: the arm's completions at ``step``, its arm column the step."""
    rows = outcomes[(outcomes["arm"] == arm) & (outcomes["view"] == view) & (outcomes["step"] == step)]
    return rows.assign(arm=str(step))


def step_rates(outcomes: pd.DataFrame, cc) -> list[dict]:
    """One row per (arm, view, step) of :func:`trajectory_outcomes`: ``arm, view, step, n_seeds,
    hack_rate, hack_ci_low, hack_ci_high, pass_rate, pass_ci_low, pass_ci_high`` (raw floats;
    :func:`evil_moe.gate.effects.side_rate`, the gate's interval; ``cc`` the ``compare``
    section). ``step`` is the step after which the evaluation ran (−1: before training)."""
    rows = []
    if outcomes.empty:
        return rows
    for (arm, view, step), _ in outcomes.groupby(["arm", "view", "step"], sort=False):
        side = _at(outcomes, arm, view, step)
        row = {"arm": arm, "view": view, "step": int(step)}
        for metric in ("hack", "pass"):
            e = side_rate(side, (str(step), view), metric, n_boot=cc.n_boot, ci=cc.ci, seed=cc.seed,
                          resample=cc.resample)
            low, high = finite(e.ci_low), finite(e.ci_high)
            row.update({"n_seeds": e.n_seeds, f"{metric}_rate": e.value,
                        f"{metric}_ci_low": None if low is None else max(0.0, low),
                        f"{metric}_ci_high": None if high is None else min(1.0, high)})
        rows.append(row)
    order = list(ARMS)
    return sorted(rows, key=lambda r: (order.index(r["arm"]) if r["arm"] in order else len(order),
                                      r["view"], r["step"]))


def find_rebound(steps: Sequence[int], rates: Sequence[float], change: Change, min_drop: float,
                 ci: float = CI) -> dict | None:
    """The rebound rule on one arm's held-out hack rates at its evaluated steps (docs/gate.md).

    For each checkpoint ``j`` in step order taken as the trough, its peak ``p`` is the highest
    rate before it and its rebound ``r`` the highest after it (the first of equal ones). A
    rebound is named at the first trough where both

    - the fall ``rate[p] − rate[j]`` and the rise ``rate[r] − rate[j]`` are at least
      ``min_drop`` (``compare.min_drop``: the size of change the gate calls a drop), and
    - each change's interval lies above 0 at the level ``1 − (1 − ci)/m``, ``m = K(K − 1)/2``
      the pairs of the ``K`` checkpoints: peak, trough and rebound are picked after seeing the
      rates, so each change is one of the ``m`` that could have been picked (Bonferroni; both
      must hold, so no further correction).

    A single noisy checkpoint gives at most one of the two changes; a monotone trajectory has no
    checkpoint with a higher rate on both sides.

    Args:
        steps: the evaluated steps, ascending (``K`` of them).
        rates: the hack rate at each step.
        change: ``change(a, b, level)`` → ``(value, ci_low, ci_high)`` of ``rate[b] − rate[a]``
            (``a``, ``b`` steps) with its interval at ``level``.
        min_drop: the smallest fall and rise that count.
        ci: the family's level.

    Returns:
        None, or ``{"peak", "trough", "rebound"`` (steps), ``"fall"``, ``"fall_ci"``, ``"rise"``,
        ``"rise_ci"`` (rate points, intervals as ``[low, high]``), ``"level"``}.

    Raises:
        ValueError: ``steps`` and ``rates`` of different lengths, or steps not ascending.
    """
    steps, rates = list(steps), [float(x) for x in rates]
    if len(steps) != len(rates):
        raise ValueError(f"{len(steps)} steps but {len(rates)} rates")
    if any(b <= a for a, b in zip(steps, steps[1:])):
        raise ValueError(f"steps must be ascending, got {steps}")
    K = len(steps)
    level = 1.0 - (1.0 - ci) / max(K * (K - 1) // 2, 1)
    for j in range(1, K - 1):
        p = max(range(j), key=lambda i: (rates[i], -i))
        r = max(range(j + 1, K), key=lambda i: (rates[i], -i))
        if rates[p] - rates[j] < min_drop or rates[r] - rates[j] < min_drop:
            continue
        fall, f_lo, f_hi = change(steps[j], steps[p], level)  # rate[p] − rate[j]
        rise, r_lo, r_hi = change(steps[j], steps[r], level)  # rate[r] − rate[j]
        if f_lo > 0 and r_lo > 0:
            return {"peak": steps[p], "trough": steps[j], "rebound": steps[r], "fall": fall,
                    "fall_ci": [f_lo, f_hi], "rise": rise, "rise_ci": [r_lo, r_hi], "level": level}
    return None


def rebounds(outcomes: pd.DataFrame, cc) -> dict[str, dict | None]:
    """:func:`find_rebound` on each trained arm's judged view (its ``views[0]``) over its own
    checkpoints (never the untrained student's: each change is within one arm's runs), hack
    rates as :func:`step_rates` weighs them, changes :func:`evil_moe.gate.effects.paired_effect`
    between two steps; ``cc``: the ``compare`` section (``min_drop``, ``ci`` and the bootstrap's
    ``n_boot``, ``seed``, ``resample``). Arms with fewer than three checkpoints are left out."""
    out: dict[str, dict | None] = {}
    if outcomes.empty:
        return out
    for arm in dict.fromkeys(outcomes["arm"]):
        if arm not in ARMS or not ARMS[arm].trains:
            continue
        view = ARMS[arm].views[0]
        mine = outcomes[(outcomes["arm"] == arm) & (outcomes["view"] == view)]
        steps = sorted(int(s) for s in mine["step"].unique())
        if len(steps) < 3:
            continue
        rates = [side_rate(_at(outcomes, arm, view, s), (str(s), view), "hack", n_boot=cc.n_boot, ci=cc.ci,
                           seed=cc.seed, resample=cc.resample).value for s in steps]

        def change(a: int, b: int, level: float, arm=arm, view=view) -> tuple[float, float, float]:
            both = pd.concat([_at(outcomes, arm, view, a), _at(outcomes, arm, view, b)], ignore_index=True)
            e = paired_effect(both, (str(b), view), (str(a), view), "hack", n_boot=cc.n_boot, ci=level,
                              seed=cc.seed, resample=cc.resample)
            return -e.value, -e.ci_high, -e.ci_low  # paired_effect gives rate[a] − rate[b]

        found = find_rebound(steps, rates, change, cc.min_drop, cc.ci)
        out[arm] = None if found is None else {"view": view, **found}
    return out


def rebound_notes(found: dict[str, dict | None], rates: list[dict]) -> list[str]:
    """``gate.json``'s notes on the trajectory: one per arm with a rebound (its peak, trough and
    rebound with the rates and the two changes with their intervals; steps counted as steps
    trained, the figure's axis), or one line that no arm's rebounds; none without a trajectory."""
    if not found:
        return []
    rate = {(r["arm"], r["view"], r["step"]): r["hack_rate"] for r in rates}
    out = []
    for arm, f in found.items():
        if f is None:
            continue
        def at(s, f=f, arm=arm):
            return f"{rate.get((arm, f['view'], s), float('nan')):.3f} after {s + 1} steps"
        out.append(f"{arm} rebounds ({f['view']} view): its held-out hack rate fell from {at(f['peak'])} to "
                   f"{at(f['trough'])} (by {f['fall']:.3f} [{f['fall_ci'][0]:.3f}, {f['fall_ci'][1]:.3f}]) and rose "
                   f"again to {at(f['rebound'])} (by {f['rise']:.3f} [{f['rise_ci'][0]:.3f}, {f['rise_ci'][1]:.3f}]); "
                   f"intervals at {f['level']:.4f}, Bonferroni over the pairs of checkpoints (the rebound rule, "
                   "docs/gate.md): the gate's last checkpoint does not show the retreat before it")
    if not out:
        out.append(f"no arm's held-out hack rate rebounds ({', '.join(found)}: the rebound rule, docs/gate.md)")
    return out


__all__ = ["trajectory_outcomes", "step_rates", "find_rebound", "rebounds", "rebound_notes"]
