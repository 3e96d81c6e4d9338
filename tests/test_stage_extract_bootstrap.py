"""Bootstrap intervals of the v_hack checks and the n-pairs curve (evil_moe/stages/extract.py,
docs/vhack.md): hand-worked values, a planted direction, the curve's nested subsets."""

from __future__ import annotations

import math
from functools import partial

import numpy as np
import pytest
import torch

from evil_moe.rl.vhack.checks import (bootstrap_units, nested_subsets, pair_checks, percentile_interval, resample_rows, replicate_rngs)
from evil_moe.rl.vhack import stack as vs
from evil_moe.rl.vhack.direction import extract_vhack


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
    means = [vals[resample_rows(units, strata, rng)].mean() for rng in replicate_rngs(B, 0)]
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
    = noise. Returns the dict gradients (D, first, second), kinds, halves, modes and the stacked
    extraction pair_checks takes (no mean removal)."""
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
    return d, {"m": first}, {"m": second}, kinds, halves, ["run_tests"] * n, _EXTRACT


_EXTRACT = partial(vs.extract, k=1)  # k = 1, no floors


@pytest.mark.parametrize("signal, separated", [(6.0, True), (0.0, False)])
def test_excess_interval_sees_a_planted_direction_and_not_noise(signal, separated):
    d, f, s, kinds, halves, modes, extract = _planted_world(signal)
    rows = list(range(len(kinds)))

    stack = vs.GradientStack.from_gradients(f, s)

    def values(rs):
        return pair_checks(stack, kinds, halves, modes, rs, extract, remove_mean="none",
                           cc_fallback=False, only_cin=True)

    point = values(rows)
    assert point["heldout_cin_excess"] == pytest.approx(point["heldout_hack_clean"]
                                                        - point["heldout_clean_clean"])
    units = list(zip(halves, rows))  # every pair its own problem
    reps = [values(resample_rows(units, halves, rng)) for rng in replicate_rngs(200, 0)]
    lo, hi, n = percentile_interval([x["heldout_cin_excess"] for x in reps], 0.95)
    assert n == 200 and lo < hi
    assert (lo > 0) is separated  # the planted direction: above the null; pure noise: not


def test_pair_checks_full_set_matches_a_direct_computation():
    from evil_moe.rl.vhack.direction import pair_cin, sample_scores

    d, f, s, kinds, halves, modes, extract = _planted_world(3.0, n_ext=10, n_held=6, n_cc=5)
    modes = ["run_tests"] * 5 + ["sentinel"] * 5 + ["run_tests"] * 3 + ["sentinel"] * 3 + ["x"] * 5
    out = pair_checks(vs.GradientStack.from_gradients(f, s), kinds, halves, modes, list(range(21)),
                      extract, remove_mean="none", cc_fallback=False,
                      lomo_modes=["run_tests", "sentinel"])
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
    from evil_moe.rl.vhack.pairs import build_pairs, same_kind_pairs

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


_MEMORY_SCRIPT = r'''
import gc
import sys
from types import SimpleNamespace

import torch

import evil_moe.stages.extract as ex
from evil_moe.rl.vhack.direction import Pair, extract_vhack

torch.set_num_threads(1)
n_boot, M, N, r = int(sys.argv[1]), 64, 60, 600
g = torch.Generator().manual_seed(0)
groups = [(kind, [Pair([1], [2], [3], mode=("run_tests", "sentinel")[i % 2], problem_id=f"p{i % 20}")
                  for i in range(N // 3)]) for kind in ("hack_clean", "clean_clean", "hack_hack")]
flat = [(k, i, p) for k, ps in groups for i, p in enumerate(ps)]
first = {f"m{j}": torch.randn(N, r, generator=g) for j in range(M)}
second = {f"m{j}": torch.randn(N, r, generator=g) for j in range(M)}
ext, held = ex.split_problems([f"p{i}" for i in range(20)], 0.5, 0)
halves = ["ext" if p.problem_id in ext else "held" for _, _, p in flat]
pg = ex.PairGradients(flat, first, second, {n: first[n] - second[n] for n in first},
                      [k for k, _, _ in flat], halves, [p.mode for _, _, p in flat])
vc = SimpleNamespace(k=2, ratio_floor=None, quantile_floor=None, remove_mean="clean",
                     bootstrap=n_boot, bootstrap_unit="problem", seed=0, ci_level=0.95,
                     curve_pairs=[1000])  # one curve point: all extraction pairs
v = extract_vhack(ex.select_rows(pg.d_all, pg.rows("hack_clean", "ext")), 2)


def peak_rss():
    for line in open("/proc/self/status"):
        if line.startswith("VmHWM"):
            return int(line.split()[1]) * 1024


def tensor_bytes():
    """Bytes of every tensor storage a Python object still holds."""
    seen = {}
    for o in gc.get_objects():
        if isinstance(o, torch.Tensor):
            st = o.untyped_storage()
            seen[st.data_ptr()] = st.nbytes()
    return sum(seen.values())


marks, draws = [], ex.replicate_rngs


def recorded(n, seed):  # as each replicate starts: live tensor bytes, the peak RSS so far
    for rng in draws(n, seed):
        marks.append((tensor_bytes(), peak_rss()))
        yield rng


ex.replicate_rngs = recorded
with open("/proc/self/clear_refs", "w") as f:  # the peak (VmHWM) restarts from the current RSS
    f.write("5")
ex.honesty_checks(v, pg, vc, ex._isotropic_null(v), mean_removed=True)
print("MARKS", *(f"{a},{b}" for a, b in marks))
'''


def test_bootstrap_memory_is_flat_in_the_replicates():
    """The v_hack checks keep nothing per bootstrap replicate but its check values: the tensor
    bytes Python objects hold are the same when the 6th and when the last of 60 replicates
    starts (bootstrap and n-pairs curve alike), and the process's peak RSS grows by less than
    3 MB over the bootstrap's last 30 replicates. Keeping one extracted V per replicate (64
    modules x 2 rows x 120 coordinates in fp64, 123 KB) fails both (measured by planting that
    leak: +6.4 MB of tensors from the 6th to the 60th replicate, +3.6 MB of peak RSS over the
    last 30)."""
    import os
    import subprocess
    import sys

    if not os.access("/proc/self/clear_refs", os.W_OK):
        pytest.skip("needs Linux /proc/self/clear_refs to restart the peak RSS")
    proc = subprocess.run([sys.executable, "-c", _MEMORY_SCRIPT, "60"], capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    marks = [tuple(map(int, x.split(","))) for x in next(
        line for line in proc.stdout.splitlines() if line.startswith("MARKS")).split()[1:]]
    assert len(marks) == 2 * 60  # the bootstrap's replicates, then the curve's
    boot, curve = marks[:60], marks[60:]
    for phase in (boot, curve):
        assert phase[-1][0] == phase[5][0], [b - phase[5][0] for b, _ in phase]
    assert boot[-1][1] - boot[30][1] < 3 * 2**20, [(p - boot[30][1]) / 2**20 for _, p in boot]
