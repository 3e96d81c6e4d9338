"""Bootstrap intervals of the v_hack checks and the n-pairs curve (evil_moe/stages/extract.py,
docs/vhack.md): hand-worked values, a planted direction, the curve's nested subsets."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from evil_moe.stages.extract import (bootstrap_units, nested_subsets, pair_checks,
                                     percentile_interval, resample_rows, _replicate_rngs)
from evil_moe.rl.vhack import extract_vhack


def test_percentile_interval_hand_worked():
    # 5 sorted values, level 0.5: the 0.25 and 0.75 quantiles sit on order statistics 1 and 3
    assert percentile_interval([4, 0, 3, 1, 2], 0.5) == (1.0, 3.0, 5)
    # two values, level 0.9: 0.05 and 0.95 of the way from 0 to 10 (linear interpolation)
    lo, hi, n = percentile_interval([10.0, None, 0.0, float("nan")], 0.9)
    assert (lo, hi, n) == (pytest.approx(0.5), pytest.approx(9.5), 2)
    assert percentile_interval([1.0, None], 0.95) == (None, None, 1)
    with pytest.raises(ValueError, match="vhack.ci_level"):
        percentile_interval([1, 2], 1.0)


class _Draws:
    """A stand-in numpy Generator whose integers() returns the given draws in turn."""

    def __init__(self, *draws):
        self.draws = list(draws)

    def integers(self, lo, hi, size):
        d = self.draws.pop(0)
        assert len(d) == size and all(lo <= x < hi for x in d)
        return d


def test_resample_rows_by_cluster_and_stratum():
    units = ["a", "a", "b", "c", "c"]
    strata = ["ext", "ext", "ext", "held", "held"]
    # ext has units a (rows 0, 1) and b (row 2); held has c (rows 3, 4)
    assert resample_rows(units, strata, _Draws([1, 1], [0])) == [2, 2, 3, 4]
    assert resample_rows(units, strata, _Draws([0, 1], [0])) == [0, 1, 2, 3, 4]
    assert resample_rows(units, strata, _Draws([0, 0], [0]), rows=[0, 1, 2, 3]) == [0, 1, 0, 1, 3]


def _boot_se(values, units, strata, B=4000):
    vals = np.asarray(values, float)
    means = [vals[resample_rows(units, strata, rng)].mean() for rng in _replicate_rngs(B, 0)]
    return float(np.std(means))


def test_bootstrap_se_of_a_mean_matches_the_plug_in_formula():
    """The bootstrap SE of a mean is sqrt(plug-in variance / m) over the m units (Efron &
    Tibshirani 1993, §6): by cluster, over the cluster means; by pair, over the rows."""
    values = [0, 2, 1, 3, 3, 3, 5, 7]
    problems = ["p1", "p1", "p2", "p2", "p3", "p3", "p4", "p4"]
    # cluster means 1, 2, 3, 6: mean 3, plug-in variance (4 + 1 + 0 + 9) / 4 = 3.5
    by_problem = _boot_se(values, problems, ["held"] * 8)
    assert by_problem == pytest.approx(math.sqrt(3.5 / 4), rel=0.05)  # 0.935
    # rows: mean 3, plug-in variance (9 + 1 + 4 + 0 + 0 + 0 + 4 + 16) / 8 = 4.25
    by_pair = _boot_se(values, list(range(8)), ["held"] * 8)
    assert by_pair == pytest.approx(math.sqrt(4.25 / 8), rel=0.05)  # 0.729


def test_bootstrap_units_name_the_key():
    class P:
        def __init__(self, pid):
            self.problem_id = pid

    flat = [("hack_clean", 0, P("x")), ("clean_clean", 0, P("x")), ("hack_clean", 1, P("y"))]
    kinds = [k for k, _, _ in flat]
    halves = ["held", "held", "ext"]
    assert bootstrap_units(flat, kinds, halves, "problem") == (
        [("held", "x"), ("held", "x"), ("ext", "y")], halves)
    assert bootstrap_units(flat, kinds, halves, "pair") == (
        [0, 1, 2], [("hack_clean", "held"), ("clean_clean", "held"), ("hack_clean", "ext")])
    with pytest.raises(ValueError, match="vhack.bootstrap_unit"):
        bootstrap_units(flat, kinds, halves, "seed")


def _planted_world(signal: float, n_ext=40, n_held=30, n_cc=30, r=16, seed=0):
    """Pair-difference rows of one module: hack−clean rows = signal·u + noise; clean−clean rows
    = noise. Returns the arguments of pair_checks (no mean removal)."""
    g = torch.Generator().manual_seed(seed)
    u = torch.zeros(r, dtype=torch.float64)
    u[0] = 1.0
    kinds = ["hack_clean"] * (n_ext + n_held) + ["clean_clean"] * n_cc
    halves = ["ext"] * n_ext + ["held"] * (n_held + n_cc)
    n = len(kinds)
    first = torch.randn(n, r, generator=g, dtype=torch.float64)
    second = torch.randn(n, r, generator=g, dtype=torch.float64)
    first[: n_ext + n_held] += signal * u
    d = {"m": first - second}
    extract = lambda D, remove=None, **kw: extract_vhack(D, 1, remove=remove, **kw)  # noqa: E731
    return d, {"m": first}, {"m": second}, kinds, halves, ["run_tests"] * n, extract


@pytest.mark.parametrize("signal, separated", [(6.0, True), (0.0, False)])
def test_excess_interval_sees_a_planted_direction_and_not_noise(signal, separated):
    d, f, s, kinds, halves, modes, extract = _planted_world(signal)
    rows = list(range(len(kinds)))

    def values(rs):
        return pair_checks(d, f, s, kinds, halves, modes, rs, extract, remove_mean="none",
                           cc_fallback=False, only_cin=True)

    point = values(rows)
    assert point["heldout_cin_excess"] == pytest.approx(point["heldout_hack_clean"]
                                                        - point["heldout_clean_clean"])
    units = list(zip(halves, rows))  # every pair its own problem
    reps = [values(resample_rows(units, halves, rng)) for rng in _replicate_rngs(200, 0)]
    lo, hi, n = percentile_interval([x["heldout_cin_excess"] for x in reps], 0.95)
    assert n == 200 and lo < hi
    assert (lo > 0) is separated  # the planted direction: above the null; pure noise: not


def test_pair_checks_full_set_matches_a_direct_computation():
    from evil_moe.rl.vhack import pair_cin, sample_scores

    d, f, s, kinds, halves, modes, extract = _planted_world(3.0, n_ext=10, n_held=6, n_cc=5)
    modes = ["run_tests"] * 5 + ["sentinel"] * 5 + ["run_tests"] * 3 + ["sentinel"] * 3 + ["x"] * 5
    out = pair_checks(d, f, s, kinds, halves, modes, list(range(21)), extract, remove_mean="none",
                      cc_fallback=False, lomo_modes=["run_tests", "sentinel"])
    v = extract_vhack({"m": d["m"][:10]}, 1)
    assert out["extraction_hack_clean"] == pytest.approx(float(pair_cin(v, {"m": d["m"][:10]}).mean()))
    assert out["heldout_hack_clean"] == pytest.approx(float(pair_cin(v, {"m": d["m"][10:16]}).mean()))
    assert out["heldout_clean_clean"] == pytest.approx(float(pair_cin(v, {"m": d["m"][16:]}).mean()))
    h = sample_scores(v, {"m": f["m"][10:16]})
    c = sample_scores(v, {"m": s["m"][10:16]})
    auc = sum((a > b) + 0.5 * (a == b) for a in h.tolist() for b in c.tolist()) / 36
    assert out["detector_auc"] == pytest.approx(auc)
    # leave-one-mode-out: V from the sentinel extraction rows, cin of every run_tests pair
    v_l = extract_vhack({"m": d["m"][5:10]}, 1)
    rt = [0, 1, 2, 3, 4, 10, 11, 12]
    assert out["lomo_run_tests"] == pytest.approx(float(pair_cin(v_l, {"m": d["m"][rt]}).mean()))


def test_nested_subsets_grow_by_adding_pairs():
    subs = nested_subsets(50, [16, 8, 4, 16, 100], seed=3)
    assert [n for n, _ in subs] == [4, 8, 16, 50]  # sorted, deduplicated, capped, all last
    for (n, a), (_, b) in zip(subs, subs[1:]):
        assert len(a) == n and b[:n] == a  # each subset is a prefix of the next
    assert sorted(subs[-1][1]) == list(range(50))
    assert subs == nested_subsets(50, [4, 8, 16], seed=3)
    assert subs[1][1] != nested_subsets(50, [8], seed=4)[0][1]
    with pytest.raises(ValueError):
        nested_subsets(0, [8], 0)
    with pytest.raises(ValueError, match="vhack.curve_pairs"):
        nested_subsets(10, [0], 0)


def test_pairs_scale_to_hundreds_round_robin():
    """Hundreds of (hack, clean) pairs: every problem gives its first pair before any gives a
    second (no problem dominates a capped set), and the cap is exact."""
    from evil_moe.stages.extract import build_pairs, same_kind_pairs

    recs = []
    for i in range(300):
        pid = f"toy/p{i}"
        for j in range(4):  # two hacks, two correct cleans per problem
            recs.append({"problem_id": pid, "mode": "run_tests", "completion_ids": [i, j, 7],
                         "exploited": j < 2, "gt_correct": j >= 2})
    pids = {f"toy/p{i}": [1, 2] for i in range(300)}
    pairs = build_pairs(recs, pids, None, 1024)
    assert len(pairs) == 600
    first = [p.problem_id for p in pairs[:300]]
    assert sorted(first) == sorted(pids) and pairs[300].problem_id == pairs[0].problem_id
    assert all(p.hack_ids[1] < 2 <= p.clean_ids[1] for p in pairs)
    assert len(build_pairs(recs, pids, None, 256)) == 256
    assert len({p.problem_id for p in build_pairs(recs, pids, None, 256)}) == 256
    cc = same_kind_pairs(recs, pids, None, "clean", 1024)
    assert len(cc) == 300 and all(p.hack_ids[1] == 2 and p.clean_ids[1] == 3 for p in cc)
