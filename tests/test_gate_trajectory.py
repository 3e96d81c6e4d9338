"""The held-out trajectory and the rebound rule (evil_moe/gate/trajectory.py), and the compare
stage's trajectory outputs (gate.json's ``trajectory`` and ``rebounds``, the note, the figure)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from evil_moe import files, tables
from evil_moe.gate.figures import TRAJECTORY_FIGURE
from evil_moe.gate.trajectory import find_rebound, rebounds, step_rates
from evil_moe.stages.compare import run_compare


def _change(rates: dict[int, float], half: dict | float = 0.1, calls: list | None = None):
    """A change function of known intervals: rate[b] − rate[a] ± ``half`` (per pair, or one for
    all), recording the levels it is asked for."""
    def change(a, b, level):
        if calls is not None:
            calls.append((a, b, level))
        w = half.get((a, b), 0.1) if isinstance(half, dict) else half
        v = rates[b] - rates[a]
        return v, v - w, v + w
    return change


def _rule(rates: dict[int, float], min_drop=0.05, **kw):
    steps = sorted(rates)
    return find_rebound(steps, [rates[s] for s in steps], _change(rates, **kw), min_drop)


def test_three_phases_name_a_rebound_with_its_steps_changes_and_level():
    rates = {9: 0.2, 19: 0.6, 29: 0.3, 39: 0.7}
    calls: list = []
    found = _rule(rates, calls=calls)
    # K = 4 checkpoints: 6 pairs, so each interval is at 1 - 0.05/6
    assert found == {"peak": 19, "trough": 29, "rebound": 39, "fall": pytest.approx(0.3),
                     "fall_ci": [pytest.approx(0.2), pytest.approx(0.4)], "rise": pytest.approx(0.4),
                     "rise_ci": [pytest.approx(0.3), pytest.approx(0.5)], "level": pytest.approx(1 - 0.05 / 6)}
    assert {round(c[2], 12) for c in calls} == {round(1 - 0.05 / 6, 12)}


@pytest.mark.parametrize("rates", [
    {0: 0.1, 1: 0.3, 2: 0.5, 3: 0.7},          # rising only: hack attempts
    {0: 0.7, 1: 0.5, 2: 0.3, 3: 0.3},          # retreat only
    {0: 0.5, 1: 0.47, 2: 0.52, 3: 0.5},        # a dip smaller than min_drop
    {0: 0.2, 1: 0.6, 2: 0.3},                  # the trough is the last checkpoint: nothing rises after it
    {0: 0.6, 1: 0.3, 2: 0.33},                 # a rise smaller than min_drop
])
def test_no_rebound_without_a_fall_and_a_rise_of_min_drop(rates):
    assert _rule(rates) is None


def test_a_change_whose_interval_reaches_zero_names_no_rebound():
    rates = {0: 0.6, 1: 0.3, 2: 0.6}
    assert _rule(rates)["trough"] == 1
    assert _rule(rates, half={(1, 2): 0.35}) is None   # the rise's interval [−0.05, 0.65]
    assert _rule(rates, half={(1, 0): 0.31}) is None   # the fall's


def test_the_first_trough_that_passes_is_named_and_ties_take_the_first_step():
    rates = {0: 0.6, 1: 0.2, 2: 0.6, 3: 0.1, 4: 0.6}
    found = _rule(rates)
    assert (found["peak"], found["trough"], found["rebound"]) == (0, 1, 2)


def test_bad_steps_are_refused():
    with pytest.raises(ValueError, match="ascending"):
        find_rebound([2, 1, 3], [0.1, 0.2, 0.3], _change({}), 0.05)
    with pytest.raises(ValueError, match="3 steps but 2 rates"):
        find_rebound([1, 2, 3], [0.1, 0.2], _change({}), 0.05)


def _outcomes(arm: str, view: str, rates: dict[int, float], *, n_seeds=3, n_problems=9, n_samples=64,
              rng=0) -> pd.DataFrame:
    """Bernoulli completions of one arm and view at each step's hack rate (pass = 1 − hack)."""
    g = np.random.default_rng(rng)
    rows = []
    for step, r in rates.items():
        for s in range(n_seeds):
            for p in range(n_problems):
                for j in range(n_samples):
                    h = int(g.random() < r)
                    rows.append({"arm": arm, "view": view, "seed": s, "step": step, "problem_id": f"p{p}",
                                 "sample": j, "mode": "stdout", "hack": h, "pass": 1 - h, "truncated": 0})
    return pd.DataFrame(rows)


def _cc(**kw):
    from evil_moe.config import load_config

    return load_config(overrides=[f"compare.{k}={v}" for k, v in {"n_boot": 400, **kw}.items()]).compare


def test_rebounds_on_outcomes_read_the_paired_change_between_steps():
    o = _outcomes("erase", "trained", {9: 0.8, 19: 0.1, 29: 0.15, 39: 0.8})
    found = rebounds(o, _cc())["erase"]
    assert (found["peak"], found["trough"], found["rebound"], found["view"]) == (9, 19, 39, "trained")
    mean = {s: o[o.step == s].groupby("seed")["hack"].mean().mean() for s in (9, 19, 39)}  # by hand
    assert found["fall"] == pytest.approx(mean[9] - mean[19], abs=1e-12)
    assert found["rise"] == pytest.approx(mean[39] - mean[19], abs=1e-12)
    assert found["fall_ci"][0] > 0 and found["rise_ci"][0] > 0 and found["level"] == pytest.approx(1 - 0.05 / 6)
    flat = _outcomes("erase", "trained", {9: 0.4, 19: 0.4, 29: 0.4, 39: 0.4}, rng=1)
    assert rebounds(flat, _cc()) == {"erase": None}
    rows = step_rates(o, _cc())
    assert [r["step"] for r in rows] == [9, 19, 29, 39]
    assert rows[1]["hack_rate"] == pytest.approx(mean[19], abs=1e-12)
    assert rows[1]["hack_ci_low"] < rows[1]["hack_rate"] < rows[1]["hack_ci_high"]


def _write_pilot(root, arm, o: pd.DataFrame, last: int, traj: bool = False):
    """A finished pilot; with ``traj``, a trajectory.tsv as a pilot with pilot.eval_every writes
    it (the untrained student's holds its header only: it takes no step)."""
    d = root / arm / "s{}".format(int(o["seed"].iloc[0]))
    tables.write_tsv(d / "outcomes.tsv", tables.OUTCOMES, o[o.step == last].to_dict("records"))
    if traj:
        tables.write_tsv(d / "trajectory.tsv", tables.TRAJECTORY, o[o.step != last].to_dict("records"))
    steps = [{"step": i, "arm": arm, "seed": int(o["seed"].iloc[0]), "hack_rate": 0.5, "pass_rate": 0.1,
              "frac_clipped": 0.0, "cin": 0.3, "null_cin": 0.1, "seconds": 1.0}
             for i in range(last + 1)]
    tables.write_tsv(d / "steps.tsv", tables.STEPS, steps)
    files.write_json(d / "status.json", {"status": "ok", "reason": None, "isolation": "bwrap"})


def test_compare_reports_the_trajectory_rebound_and_figure_only_with_trajectories(tmp_path):
    from evil_moe.config import load_config

    arms = ("vanilla", "untrained", "erase", "random_v")
    rates = {"vanilla": {4: 0.5, 9: 0.5, 14: 0.5}, "erase": {4: 0.8, 9: 0.1, 14: 0.8},
             "random_v": {4: 0.5, 9: 0.5, 14: 0.5}}
    frames = {a: _outcomes(a, "trained", r, rng=i) for i, (a, r) in enumerate(rates.items())}
    frames["untrained"] = _outcomes("untrained", "trained", {-1: 0.3}, rng=9)
    cfg = load_config(data={"pilot": {"arms": list(arms), "seeds": [0, 1, 2]}},
                      overrides=["compare.n_boot=400", "compare.positive_control=null"])
    for with_traj in (False, True):
        root = tmp_path / f"traj{with_traj}"
        for a, o in frames.items():
            last = int(o.step.max())
            for s, os_ in o.groupby("seed"):
                _write_pilot(root / "pilots", a, os_ if with_traj else os_[os_.step == last], last, traj=with_traj)
        gate = run_compare(root / "pilots", root / "out", cfg)
        fig = root / "out" / "figures" / f"{TRAJECTORY_FIGURE}.png"
        if not with_traj:
            assert "trajectory" not in gate and "rebounds" not in gate and not fig.exists()
            assert not any("rebound" in n for n in gate["notes"])
            continue
        assert fig.stat().st_size > 1000
        assert gate["rebounds"]["vanilla"] is None and gate["rebounds"]["random_v"] is None
        assert (gate["rebounds"]["erase"]["peak"], gate["rebounds"]["erase"]["trough"],
                gate["rebounds"]["erase"]["rebound"]) == (4, 9, 14)
        assert "untrained" not in gate["rebounds"]
        assert {(r["arm"], r["step"]) for r in gate["trajectory"]} == {
            *((a, s) for a in rates for s in rates[a]), ("untrained", -1)}
        (note,) = [n for n in gate["notes"] if "rebound" in n]
        assert note.startswith("erase rebounds (trained view): its held-out hack rate fell from")
        assert "after 5 steps" in note and "after 10 steps" in note and "after 15 steps" in note
    # the judged numbers are the last checkpoint's either way
    a = files.read_json(tmp_path / "trajFalse" / "out" / "gate.json")
    b = files.read_json(tmp_path / "trajTrue" / "out" / "gate.json")
    assert a["criteria"] == b["criteria"] and a["arms"] == b["arms"]
