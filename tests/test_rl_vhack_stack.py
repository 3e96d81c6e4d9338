"""The batched v_hack statistics in the gradients' own span (evil_moe/rl/vhack/stack.py) against
the per-module dict functions of evil_moe/rl/vhack/direction.py on the same rows."""

from __future__ import annotations

import pytest
import torch

from evil_moe.rl.vhack import stack as vs
from evil_moe.rl.vhack.direction import extract_vhack, mean_direction, pair_cin, sample_scores


def _grads(n=25, ranks=(3, 7, 40, 300), seed=0):
    """First/second completion gradients of n pairs: a shared direction u per module in the
    first completions (so V has a signal to find), a common offset in both (so the removed mean
    matters), noise; one module all zeros (it must never count as live)."""
    g = torch.Generator().manual_seed(seed)
    first, second = {}, {}
    for i, r in enumerate(ranks):
        u = torch.randn(r, generator=g, dtype=torch.float64)
        off = 2.0 * torch.randn(r, generator=g, dtype=torch.float64)
        first[f"m{i}"] = off + torch.randn(n, r, generator=g, dtype=torch.float64) \
            + (1.0 + torch.rand(n, 1, generator=g, dtype=torch.float64)) * u
        second[f"m{i}"] = off + torch.randn(n, r, generator=g, dtype=torch.float64)
    first["zero"] = torch.zeros(n, 5, dtype=torch.float64)
    second["zero"] = torch.zeros(n, 5, dtype=torch.float64)
    return first, second


def _sel(d, rows):
    return {k: v[torch.as_tensor(rows)] for k, v in d.items()}


def test_coordinates_keep_every_inner_product():
    first, second = _grads()
    st = vs.GradientStack.from_gradients(first, second)
    assert st.first.shape == (5, 25, 50) and st.r.tolist() == [3, 7, 40, 300, 5]
    for i, name in enumerate(st.names):
        Z = torch.cat([first[name], second[name]])
        Y = torch.cat([st.first[i], st.second[i]])
        assert torch.allclose(Y @ Y.T, Z @ Z.T, rtol=1e-10, atol=1e-9), name
    with pytest.raises(ValueError, match="m0"):
        vs.GradientStack.from_gradients(first, {**second, "m0": second["m0"][:3]})


@pytest.mark.parametrize("how", ["none", "clean", "all"])
@pytest.mark.parametrize("floors", [(None, None), (0.3, None), (None, 0.4)])
def test_stacked_checks_equal_the_dict_functions(how, floors):
    """A bootstrap-like row set (repeats) for the extraction; cin and scores of other rows."""
    first, second = _grads()
    st = vs.GradientStack.from_gradients(first, second)
    ratio, quant = floors
    rows = [0, 1, 1, 2, 3, 5, 5, 5, 7, 8, 9, 11, 12]
    other = [14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 15]
    D = {k: first[k] - second[k] for k in first}
    mean_d = None if how == "none" else mean_direction(
        [_sel(second, rows)] if how == "clean" else [_sel(first, rows), _sel(second, rows)])
    want = extract_vhack(_sel(D, rows), 2, ratio_floor=ratio, quantile_floor=quant, remove=mean_d)
    mean_s = vs.mean_direction(st, rows, how)
    assert (mean_s is None) == (how == "none")
    got = vs.extract(st, rows, 2, ratio_floor=ratio, quantile_floor=quant, remove=mean_s)
    assert got.keep.sum(1).tolist() == [want.k_per_module[n] for n in st.names]
    for i, name in enumerate(st.names):
        kept = got.S[i][got.keep[i]]
        assert torch.allclose(kept, want.singular_values[name].double(), rtol=1e-6), name
    if how == "none":
        assert got.removed_energy is None
    else:
        assert got.removed_energy == pytest.approx(want.meta["removed_energy"], rel=1e-9)
    # V lives in other coordinates; what the checks read of it (projections) must agree. V of
    # the dict functions is fp32, so agreement is to fp32 rounding.
    idx = torch.as_tensor(other)
    assert torch.allclose(vs.cin(got, st.diff[:, idx]), pair_cin(want, _sel(D, other)), atol=1e-6)
    for mine, theirs in ((st.first, first), (st.second, second)):
        assert torch.allclose(vs.scores(got, mine[:, idx]), sample_scores(want, _sel(theirs, other)),
                              atol=1e-6)
    assert float(vs.cin(got, st.diff[:, idx]).mean()) > 0.05  # not trivially zero


def test_orientation_follows_the_rows():
    """Swapping first and second flips every pair difference, so every kept row flips and the
    hack-ward cin of the original differences drops."""
    first, second = _grads()
    st = vs.GradientStack.from_gradients(first, second)
    flipped = vs.GradientStack.from_gradients(second, first)
    rows = list(range(20))
    a, b = vs.extract(st, rows, 1), vs.extract(flipped, rows, 1)
    d = st.diff[:, torch.arange(20, 25)]
    assert float(vs.cin(a, d).mean()) > float(vs.cin(b, -d).mean()) - 1e-9  # same geometry
    assert float(vs.scores(a, st.first[:, torch.arange(20)]).mean()) > \
        float(vs.scores(a, st.second[:, torch.arange(20)]).mean())
    with pytest.raises(ValueError):
        vs.extract(st, [], 1)
    with pytest.raises(ValueError, match="remove_mean"):
        vs.mean_direction(st, rows, "true")


def test_a_rank_deficient_replicate_keeps_only_real_directions():
    """A bootstrap replicate that draws one pair three times has a rank-1 D: its second
    singular value is rounding noise and its singular vector arbitrary (and different in the
    two coordinate systems), so both paths drop it (σ below σ₁ · max(n, r) · ε) and agree."""
    first, second = _grads()
    st = vs.GradientStack.from_gradients(first, second)
    D = {k: first[k] - second[k] for k in first}
    rows = [3, 3, 3]
    want = extract_vhack(_sel(D, rows), 2)
    got = vs.extract(st, rows, 2)
    assert [want.k_per_module[n] for n in st.names] == [1, 1, 1, 1, 0]  # the zero module: none
    assert got.keep.sum(1).tolist() == [1, 1, 1, 1, 0]
    other = [10, 11, 12]
    assert torch.allclose(vs.cin(got, st.diff[:, torch.as_tensor(other)]),
                          pair_cin(want, _sel(D, other)), atol=1e-6)
