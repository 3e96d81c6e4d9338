"""Projection: span, one-sided erase, routing, measure, gates, null baseline, update projection."""

import math

import pytest
import torch

from evil_moe.model.adapter import SVDAdapter
from evil_moe.model.load import build_tiny
from evil_moe.model.logprobs import build_batch, token_logprobs
from evil_moe.rl.vhack.projection import (gate_coefficients, measure_grads, null_cin, project,
                                          project_vector, update_cosine, update_stats)
from evil_moe.rl.vhack.direction import random_vhack


@pytest.fixture()
def setup():
    model, tok = build_tiny(seed=6, dtype="float64")
    ad = SVDAdapter.attach(model)
    vh = random_vhack(ad.r, k=3, seed=0)
    b = build_batch([tok.encode("def add(a, b):")] * 2, [tok.encode("\n    return a + b"),
                                                           tok.encode("\n    pass")], tok.pad_token_id)
    lp = token_logprobs(model, b)
    (-(lp * torch.tensor([[1.0], [-0.5]], dtype=torch.float64)).sum()).backward()
    return model, ad, vh


def _grads(ad, which="delta_s"):
    return {n: getattr(k, which).grad.clone() for n, k in ad.modules_.items()}


def test_erase_one_sided_removes_hackward_only(setup):
    _, ad, vh = setup
    g0 = _grads(ad)
    st = project(ad, vh, "erase")
    fired = 0
    for n, knob in ad.modules_.items():
        V = vh.V[n].double()
        g1 = knob.delta_s.grad
        removed = g0[n] - g1
        # removed ∈ span(V)
        assert torch.allclose(V.T @ (V @ removed), removed, atol=1e-12)
        c0, c1 = V @ g0[n], V @ g1
        tol = 1e-6 * float(g0[n].norm())  # V is stored in fp32: orthonormal to ~1e-7
        assert (torch.relu(c1) <= tol).all()  # no hack-ward component left
        assert torch.allclose(torch.minimum(c0, torch.zeros_like(c0)), c1, atol=tol)  # anti-hack kept
        assert torch.allclose(removed, torch.relu(c0) @ V, atol=1e-15)
        fired += bool((c0 > 0).any())
    assert st.cout < 1e-6 and st.cin > 0
    assert st.frac_fired == pytest.approx(fired / len(ad.names))
    assert all(p.grad is not None for p in ad.delta_s_hack_params())  # untouched by erase


def test_subtract_puts_exactly_removed_into_hack_grad(setup):
    _, ad, vh = setup
    g0 = _grads(ad)
    project(ad, vh, "subtract")
    for n, knob in ad.modules_.items():
        V = vh.V[n].double()
        removed = torch.relu(V @ g0[n]) @ V
        assert torch.equal(knob.delta_s_hack.grad, removed)
        assert torch.equal(knob.delta_s.grad, g0[n] - removed)
        # sum of the two knobs' gradients is the original gradient
        assert torch.allclose(knob.delta_s_hack.grad + knob.delta_s.grad, g0[n], atol=1e-15)


def test_measure_leaves_gradients_untouched(setup):
    _, ad, vh = setup
    g0, h0 = _grads(ad), _grads(ad, "delta_s_hack")
    st = project(ad, vh, "measure")
    assert all(torch.equal(g0[n], k.delta_s.grad) for n, k in ad.modules_.items())
    assert all(torch.equal(h0[n], k.delta_s_hack.grad) for n, k in ad.modules_.items())
    assert st.cout == pytest.approx(st.cin)
    # cin by hand: mean over modules of ‖relu(V g)‖/‖g‖, and the global ratio
    ratios = [float(torch.relu(vh.V[n].double() @ g).norm() / g.norm()) for n, g in g0.items()]
    assert st.cin == pytest.approx(sum(ratios) / len(ratios))
    num = math.sqrt(sum(float(torch.relu(vh.V[n].double() @ g).norm()) ** 2 for n, g in g0.items()))
    den = math.sqrt(sum(float(g.norm()) ** 2 for g in g0.values()))
    assert st.cin_global == pytest.approx(num / den)
    ms = measure_grads(vh, list(g0), list(g0.values()))
    assert ms.cin == pytest.approx(st.cin)


def test_gates_and_preserve_magnitude():
    V = torch.eye(4, dtype=torch.float64)[:2]
    g = torch.tensor([0.5, -0.25, 1.0, 0.0], dtype=torch.float64)
    c = V @ g
    assert gate_coefficients(c, "no_gate").tolist() == [0.5, -0.25]
    assert gate_coefficients(c, "reverse").tolist() == [1.0, -0.5]
    assert gate_coefficients(c, "overshoot", 1.5).tolist() == [0.75, 0.0]
    assert project_vector(g, V, "one_sided")[0].tolist() == [0.0, -0.25, 1.0, 0.0]
    assert project_vector(g, V, "no_gate")[0].tolist() == [0.0, 0.0, 1.0, 0.0]
    assert project_vector(g, V, "reverse")[0].tolist() == [-0.5, 0.25, 1.0, 0.0]
    assert project_vector(g, V, "overshoot")[0].tolist() == [-0.25, -0.25, 1.0, 0.0]
    gp, removed, _ = project_vector(g, V, "one_sided", preserve_magnitude=True)
    assert float(gp.norm()) == pytest.approx(float(g.norm()))
    assert removed.tolist() == [0.5, 0.0, 0.0, 0.0]
    with pytest.raises(ValueError):
        gate_coefficients(c, "sideways")


def test_null_baseline_matches_random_directions():
    r, k = 64, 4
    assert null_cin(k, r) == pytest.approx(math.sqrt(k / (2 * r)))
    vh = random_vhack({"m": r}, k=k, seed=0)
    gen = torch.Generator().manual_seed(1)
    gs = [torch.randn(r, generator=gen) for _ in range(800)]
    cins = torch.tensor([measure_grads(vh, ["m"], [g]).cin for g in gs])
    # null_cin is the RMS of cin under the null (E[cin²] = k/(2r)); the mean is a bit lower
    assert float(cins.pow(2).mean().sqrt()) == pytest.approx(null_cin(k, r), rel=0.05)
    assert float(cins.mean()) < null_cin(k, r)
    st = measure_grads(vh, ["m"], [vh.V["m"][0] * 3.0])  # a pure hack-ward gradient
    assert st.cin == pytest.approx(1.0) and st.coverage == 1.0 and st.frac_fired == 1.0
    st = measure_grads(vh, ["m"], [-vh.V["m"][0]])  # purely anti-hack: relu kills it
    assert st.cin < 1e-6  # only fp32 rounding of V survives the relu


def test_update_cosine_and_project_update(setup):
    _, ad, vh = setup
    opt = torch.optim.Adam(ad.delta_s_params(), lr=1e-2)
    before = [p.detach().clone() for p in ad.delta_s_params()]
    project(ad, vh, "erase")  # the gradient is clean ...
    opt.step()
    after = [p.detach().clone() for p in ad.delta_s_params()]
    cu = update_cosine(vh, ad.names, before, after)
    # ... but Adam's first step is sign(g)·lr: the update is generally not clean (the Adam leak)
    assert cu > 0.05
    st = update_stats(vh, ad.names, before, after)
    assert st.cin == pytest.approx(cu)
    pst = project(ad, vh, "erase", update_from=before)
    assert pst.cin == pytest.approx(cu) and pst.cout < 1e-6
    assert update_cosine(vh, ad.names, before, [p.detach() for p in ad.delta_s_params()]) < 1e-6
    # subtract on the update: the removed part moves δS_hack, the sum of knobs is the Adam step
    with torch.no_grad():
        for p, a in zip(ad.delta_s_params(), after):
            p.copy_(a)
        for p in ad.delta_s_hack_params():
            p.zero_()
    project(ad, vh, "subtract", update_from=before)
    for p, h, a in zip(ad.delta_s_params(), ad.delta_s_hack_params(), after):
        assert torch.allclose(p + h, a, atol=1e-15)
    with pytest.raises(ValueError):
        project(ad, vh, "erase", update_from=before[:-1])
    with pytest.raises(ValueError):
        project(ad, vh, "scramble")
