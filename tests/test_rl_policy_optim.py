"""The routing arms' optimiser (evil_moe/rl/policy/optim.py): a preconditioner shared by δS and
δS_hack, one first moment per knob. Each test works its expectation out independently: torch's own
AdamW, and AdamW's formulas written out here in numpy."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

from evil_moe.rl.policy.optim import SplitAdamW

LR, BETAS, EPS = 0.04, (0.9, 0.99), 1e-8


def _knobs(n=2, r=5):
    ds = [torch.nn.Parameter(torch.zeros(r, dtype=torch.float64)) for _ in range(n)]
    dsh = [torch.nn.Parameter(torch.zeros(r, dtype=torch.float64)) for _ in range(n)]
    return ds, dsh


def _grads(steps=20, rows=24, n=2, r=5, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(steps, rows, n, r, generator=g, dtype=torch.float64) * 0.01


def _run(grads, routed, wd=0.0):
    """SplitAdamW over the steps: rows in ``routed`` (set of (step, row)) go to δS_hack. Returns
    the trajectories of δS and δS_hack, (steps + 1, n, r) each."""
    ds, dsh = _knobs(grads.shape[2], grads.shape[3])
    opt = SplitAdamW(ds, dsh, lr=LR, betas=BETAS, eps=EPS, weight_decay=wd)
    traj_s, traj_h = [torch.stack([p.detach().clone() for p in ds])], [torch.stack([p.detach().clone() for p in dsh])]
    for t in range(grads.shape[0]):
        mask = torch.tensor([(t, b) in routed for b in range(grads.shape[1])])
        for m in range(grads.shape[2]):
            ds[m].grad = grads[t, ~mask, m].sum(0)
            dsh[m].grad = grads[t, mask, m].sum(0) if mask.any() else None
        opt.step()
        traj_s.append(torch.stack([p.detach().clone() for p in ds]))
        traj_h.append(torch.stack([p.detach().clone() for p in dsh]))
    return torch.stack(traj_s), torch.stack(traj_h)


def test_with_nothing_routed_it_is_adamw_on_delta_s():
    """Nothing routed in 20 steps (with weight decay too): δS_hack stays exactly zero and δS follows
    torch's AdamW fed the same gradients."""
    grads = _grads()
    for wd in (0.0, 0.1):
        s, h = _run(grads, set(), wd)
        assert torch.count_nonzero(h) == 0
        ref = [torch.nn.Parameter(torch.zeros(5, dtype=torch.float64)) for _ in range(2)]
        opt = torch.optim.AdamW(ref, lr=LR, betas=BETAS, eps=EPS, weight_decay=wd)
        for t in range(20):
            for m in range(2):
                ref[m].grad = grads[t, :, m].sum(0)
            opt.step()
            torch.testing.assert_close(s[t + 1], torch.stack([p.detach() for p in ref]), rtol=1e-9, atol=1e-12)


def test_parts_that_cancel_keep_each_step_bounded():
    """A Dr.GRPO gradient's parts cancel across a group (its advantages sum to zero), so the two
    knobs' gradients can be large and opposite with a tiny sum. Each knob's step stays within
    AdamW's own per-coordinate bound (about lr; 3·lr allowed here); a second moment of the summed
    gradient would divide by the tiny sum (the first step would be lr·|g_δS|/|g_δS + g_δS_hack| =
    1000·lr)."""
    ds, dsh = _knobs(1, 4)
    opt = SplitAdamW(ds, dsh, lr=LR, betas=BETAS, eps=EPS)
    g = torch.tensor([1.0, -0.5, 2.0, 0.3], dtype=torch.float64)
    for _ in range(20):
        before = [ds[0].detach().clone(), dsh[0].detach().clone()]
        ds[0].grad, dsh[0].grad = g.clone(), -g * (1 - 1e-3)
        opt.step()
        for p, b in zip((ds[0], dsh[0]), before):
            assert float((p.detach() - b).abs().max()) <= 3 * LR


def test_one_routed_row_in_20_steps_moves_the_quarantine_by_that_rows_own_update():
    """The case that showed it (route seed 2 routed one row in 20 steps and its δS_hack ended at 7.40
    against δS's 12.89 under per-knob AdamW): here δS_hack is exactly zero before the row, and its
    final value is that row's own update — its gradient's momentum-weighted steps under the
    shared preconditioner, written out here from AdamW's formulas with the second moment of both
    knobs' gradients. It is a small fraction of δS (one row of 480); per-knob AdamW (the old
    design) moves it by about as much as δS."""
    grads = _grads()
    t0, b0 = 6, 3
    s, h = _run(grads, {(t0, b0)})
    assert torch.count_nonzero(h[: t0 + 1]) == 0  # nothing moves before the routed row
    # that row's own update, by hand: m_h decays from (1 − β1) g at step t0; v is the summed one's
    b1, b2 = BETAS
    g_row = grads[t0, b0].numpy()
    v = np.zeros_like(g_row)
    m = np.zeros_like(g_row)
    own = np.zeros_like(g_row)
    for t in range(20):
        g_s = (grads[t].sum(0) - (grads[t0, b0] if t == t0 else 0)).numpy()
        g_h = g_row if t == t0 else 0.0
        v = b2 * v + (1 - b2) * (g_s ** 2 + np.square(g_h))
        m = b1 * m + (1 - b1) * (g_row if t == t0 else 0.0)
        k = t + 1
        own -= LR * (m / (1 - b1 ** k)) / (np.sqrt(v / (1 - b2 ** k)) + EPS)
    np.testing.assert_allclose(h[-1].numpy(), own, rtol=1e-9, atol=1e-12)
    ratio = float(h[-1].norm() / s[-1].norm())
    assert ratio < 0.2, ratio
    # per-knob AdamW with a zero gradient on the other 19 steps (the old design) for comparison
    q = [torch.nn.Parameter(torch.zeros(5, dtype=torch.float64)) for _ in range(2)]
    old = torch.optim.AdamW(q, lr=LR, betas=BETAS, eps=EPS)
    for t in range(20):
        for mm in range(2):
            q[mm].grad = grads[t0, b0, mm].clone() if t == t0 else torch.zeros(5, dtype=torch.float64)
        if t >= t0:
            old.step()
    old_norm = float(torch.stack([p.detach() for p in q]).norm())
    assert old_norm > 3 * float(h[-1].norm())


def test_state_dict_round_trip_and_skip_without_gradients():
    grads = _grads(steps=6)
    ds, dsh = _knobs()
    opt = SplitAdamW(ds, dsh, lr=LR, betas=BETAS)
    for t in range(3):
        for m in range(2):
            ds[m].grad, dsh[m].grad = grads[t, :12, m].sum(0), grads[t, 12:, m].sum(0)
        opt.step()
    ds2, dsh2 = _knobs()
    with torch.no_grad():
        for a, b in zip(ds + dsh, ds2 + dsh2):
            b.copy_(a)
    opt2 = SplitAdamW(ds2, dsh2, lr=LR, betas=BETAS)
    opt2.load_state_dict(copy.deepcopy(opt.state_dict()))  # as a checkpoint file gives it
    for t in range(3, 6):
        for pair in ((ds, dsh), (ds2, dsh2)):
            for m in range(2):
                pair[0][m].grad, pair[1][m].grad = grads[t, :12, m].sum(0), grads[t, 12:, m].sum(0)
        opt.step()
        opt2.step()
    for a, b in zip(ds + dsh, ds2 + dsh2):
        assert torch.equal(a, b)
    before = [p.detach().clone() for p in ds + dsh]
    for p in ds + dsh:
        p.grad = None
    opt.step()  # no gradient anywhere: no state change, no move
    assert all(torch.equal(a, b) for a, b in zip(before, ds + dsh))
    with pytest.raises(ValueError, match="delta_s_hack"):
        SplitAdamW(ds, dsh[:1], lr=LR)
