"""Dr.GRPO loss: hand-computed values, behaviour-policy ratios, micro-batching, per-source grads."""

import inspect

import pytest
import torch

from evil_moe.rl.policy import grpo
from evil_moe.rl.policy.grpo import (DrGRPONormaliser, RolloutBatch, behaviour_logp, dr_grpo_loss,
                                     group_advantages, nll_loss, on_policy_behaviour, source_gradients)
from evil_moe.model.adapter import SVDAdapter
from evil_moe.model.load import build_tiny
from evil_moe.model.logprobs import build_batch, token_logprobs
from evil_moe.rl.policy.rollout import chat_prompt_ids, generate


# ---------------------------------------------------------------- hand-computed 2×3 example
def test_normaliser_constant():
    n = DrGRPONormaliser(group=6, max_new=200, prompts_per_step=4)
    assert n.constant == 4800
    assert float(n(torch.tensor(48.0, dtype=torch.float64))) == 0.01
    with pytest.raises(ValueError):
        DrGRPONormaliser(0, 1, 1)


def test_advantages_2x3_by_hand():
    adv = group_advantages([[1.0, 0.0, 0.5], [1.0, 1.0, 1.0]])
    assert adv.advantages.tolist() == [[0.5, -0.5, 0.0], [0.0, 0.0, 0.0]]
    assert adv.zero_std.tolist() == [False, True] and adv.frac_zero_std == 0.5
    assert adv.row_mask().tolist() == [True] * 3 + [False] * 3
    scaled = group_advantages([[1.0, 0.0, 0.5], [1.0, 1.0, 1.0]], scale_std=True, eps=0.0)
    assert scaled.advantages.tolist() == [[1.0, -1.0, 0.0], [0.0, 0.0, 0.0]]  # std = 0.5
    # zero-variance group with non-representable mean is exactly 0, not rounding noise
    assert group_advantages([[0.1, 0.1, 0.1]]).advantages.abs().sum() == 0
    with pytest.raises(ValueError):
        group_advantages([1.0, 2.0])


def test_loss_and_clip_fraction_2x3_by_hand():
    rho = torch.tensor([[1.0, 1.5, 0.5], [0.5, 1.1, 1.0]], dtype=torch.float64)
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]], dtype=torch.bool)
    logp = rho.log().requires_grad_(True)
    beh = torch.zeros_like(rho)
    A = torch.tensor([1.0, -1.0], dtype=torch.float64)
    norm = DrGRPONormaliser(group=2, max_new=3, prompts_per_step=1)
    loss, st = dr_grpo_loss(logp, beh, A, mask, norm, clip_eps=0.2)
    # row 0 (A=+1): -min(1,1) - min(1.5,1.2) - min(.5,.8) = -2.7 ; row 1 (A=-1): .8 + 1.1 = 1.9
    assert loss.item() == pytest.approx(-0.8 / 6, abs=1e-12)
    assert st.tokens == 5 and st.frac_clipped == pytest.approx(2 / 5)
    assert st.row_loss.detach().tolist() == pytest.approx([-2.7 / 6, 1.9 / 6])
    loss.backward()
    # d loss / d logp = -A·ρ/6 where the clip is inactive, 0 where active or masked
    want = torch.tensor([[-1.0, 0.0, -0.5], [0.0, 1.1, 0.0]], dtype=torch.float64) / 6
    assert torch.allclose(logp.grad, want, atol=1e-12)
    # ratio_mean can sit near 1 while tails saturate: quantiles are reported
    assert st.ratio_p05 < 0.8 and st.ratio_p95 > 1.2


def test_k3_kl_by_hand():
    logp = torch.tensor([[-1.0, -2.0]], dtype=torch.float64, requires_grad=True)
    ref = torch.tensor([[-1.5, -1.0]], dtype=torch.float64)
    mask = torch.ones(1, 2, dtype=torch.bool)
    norm = DrGRPONormaliser(1, 2, 1)
    r = ref - logp.detach()
    k3 = (r.exp() - r - 1)
    loss0, st0 = dr_grpo_loss(logp, logp.detach(), torch.zeros(1, dtype=torch.float64), mask, norm,
                              ref_logp=ref, beta=0.0)
    loss, st = dr_grpo_loss(logp, logp.detach(), torch.zeros(1, dtype=torch.float64), mask, norm,
                            ref_logp=ref, beta=0.1)
    assert loss0.item() == 0.0 and st0.kl == pytest.approx(k3.mean().item())
    assert loss.item() == pytest.approx(0.1 * k3.sum().item() / 2)
    with pytest.raises(ValueError):
        dr_grpo_loss(logp, logp.detach(), torch.zeros(1), mask, norm, beta=0.1)


def test_nll_uses_the_same_normaliser():
    logp = torch.tensor([[0.0, -1.0, -2.0]])
    mask = torch.tensor([[False, True, True]])
    norm = DrGRPONormaliser(2, 5, 3)
    assert nll_loss(logp, mask, norm).item() == pytest.approx(3.0 / 30)


# ---------------------------------------------------------------- with a model
@pytest.fixture(scope="module")
def setup():
    student, tok = build_tiny(seed=4, dtype="float64")
    ad = SVDAdapter.attach(student)
    teacher, _ = build_tiny(seed=11, dtype="float64")
    with torch.no_grad():  # a peakier, clearly different policy
        teacher.model.norm.weight.mul_(4.0)
    P = [chat_prompt_ids(tok, [{"role": "user", "content": c}]) for c in ("add", "class Solution")]
    stu = generate(student, tok, P, n=4, max_new=10, seed=0, adapter=ad, source="student")
    tea = generate(teacher, tok, P, n=4, max_new=10, seed=1, source="teacher")
    return student, ad, teacher, tok, stu, tea


def _logp(model, rows):
    return token_logprobs(model, rows.batch, 1.0)


def test_on_policy_ratio_is_one_and_no_clip(setup):
    student, ad, _, tok, stu, _ = setup
    rows = RolloutBatch.from_rollouts(stu, torch.linspace(-1, 1, 8), tok.pad_token_id)
    logp = _logp(student, rows)
    loss, st = dr_grpo_loss(logp, behaviour_logp(rows, logp), rows.advantages, rows.batch.completion_mask,
                            DrGRPONormaliser(4, 10, 2))
    assert st.frac_clipped == 0 and st.ratio_p05 == st.ratio_p50 == st.ratio_p95 == 1.0
    assert st.ratio_max_abs_log == 0.0


def test_teacher_rows_from_same_model_ratio_one(setup):
    student, ad, _, tok, _, _ = setup
    P = [chat_prompt_ids(tok, [{"role": "user", "content": "sort"}])]
    same = generate(student, tok, P, n=4, max_new=10, seed=5, adapter=ad, source="teacher")
    rows = RolloutBatch.from_rollouts(same, torch.ones(4), tok.pad_token_id)
    assert rows.off_policy_rows().all()
    logp = _logp(student, rows)
    _, st = dr_grpo_loss(logp, behaviour_logp(rows, logp), rows.advantages, rows.batch.completion_mask,
                         DrGRPONormaliser(4, 10, 1))
    assert st.ratio_max_abs_log < 1e-6 and st.frac_clipped == 0


def test_teacher_rows_wrong_behaviour_is_silent_and_refused(setup):
    student, ad, teacher, tok, _, tea = setup
    A = torch.tensor([1.0, -1.0] * 4, dtype=torch.float64)
    rows = RolloutBatch.from_rollouts(tea, A, tok.pad_token_id)
    logp = _logp(student, rows)
    norm = DrGRPONormaliser(4, 10, 2)
    mask = rows.batch.completion_mask
    # WRONG (what the raw function cannot tell apart): student's own log-prob as behaviour → ρ ≡ 1
    _, wrong = dr_grpo_loss(logp, logp.detach(), rows.advantages, mask, norm)
    assert wrong.ratio_max_abs_log == 0.0 and wrong.frac_clipped == 0.0
    # RIGHT: the recorded teacher log-probs → ρ ≠ 1 and the clip is active
    _, right = dr_grpo_loss(logp, behaviour_logp(rows, logp), rows.advantages, mask, norm)
    assert right.ratio_max_abs_log > 0.5 and right.frac_clipped > 0.1
    assert right.ratio_p05 < 0.8 or right.ratio_p95 > 1.2
    # and the recorded values are the teacher's own log-probs
    with torch.no_grad():
        assert torch.allclose(rows.recorded_logp.double(), _logp(teacher, rows), atol=1e-5)
    # the API refuses teacher rows without recorded log-probs, and logp as its own behaviour
    with pytest.raises(ValueError, match="recorded behaviour"):
        RolloutBatch(rows.batch, rows.advantages, ["teacher"] * 8, None)
    with pytest.raises(ValueError, match="requires grad"):
        dr_grpo_loss(logp, logp, rows.advantages, mask, norm)
    nan = torch.full_like(rows.recorded_logp, float("nan"))
    with pytest.raises(ValueError, match="NaN"):
        RolloutBatch(rows.batch, rows.advantages, ["teacher"] * 8, nan)


def _grads(ad):
    return torch.cat([p.grad.clone() for p in ad.delta_s_params()])


def _zero(ad):
    for p in ad.parameters():
        p.grad = None


def test_microbatch_invariance(setup):
    student, ad, _, tok, stu, tea = setup
    with torch.no_grad():  # move off the sampling point so ρ ≠ 1 for the student rows too
        for p in ad.delta_s_params():
            p.normal_(0, 0.05, generator=torch.Generator().manual_seed(2))
    try:
        A = torch.linspace(-1, 1, 16, dtype=torch.float64)
        rows = RolloutBatch.from_rollouts(stu + tea, A, tok.pad_token_id)
        norm = DrGRPONormaliser(4, 10, 4)
        _zero(ad)
        logp = _logp(student, rows)
        loss, st = dr_grpo_loss(logp, behaviour_logp(rows, logp), rows.advantages,
                                rows.batch.completion_mask, norm)
        loss.backward()
        full = _grads(ad)
        assert st.frac_clipped > 0
        _zero(ad)
        total = 0.0
        for chunk in torch.arange(16).chunk(4):
            sub = rows.select(chunk)
            lp = _logp(student, sub)
            l, _ = dr_grpo_loss(lp, behaviour_logp(sub, lp), sub.advantages, sub.batch.completion_mask, norm)
            l.backward()
            total += l.item()
        assert total == pytest.approx(loss.item(), abs=1e-12)
        assert torch.allclose(_grads(ad), full, atol=1e-13, rtol=1e-10)
        assert full.abs().max() > 0
    finally:
        with torch.no_grad():
            for p in ad.delta_s_params():
                p.zero_()
        _zero(ad)


def test_zero_variance_groups_give_zero_gradient(setup):
    student, ad, _, tok, stu, _ = setup
    adv = group_advantages([[1.0, 1.0, 1.0, 1.0], [1.25, 0.0, 1.0, 0.25]])
    assert adv.frac_zero_std == 0.5
    rows = RolloutBatch.from_rollouts(stu, adv.flat(), tok.pad_token_id)
    norm = DrGRPONormaliser(4, 10, 2)

    def grad_of(r):
        _zero(ad)
        lp = _logp(student, r)
        l, _ = dr_grpo_loss(lp, behaviour_logp(r, lp), r.advantages, r.batch.completion_mask, norm)
        l.backward()
        return _grads(ad)

    g_all = grad_of(rows)
    g_zero_group = grad_of(rows.select(list(range(4))))
    g_var_group = grad_of(rows.select(list(range(4, 8))))
    assert g_zero_group.abs().max() == 0
    assert g_var_group.abs().max() > 0
    assert torch.allclose(g_all, g_var_group, atol=1e-15)
    _zero(ad)


def test_per_source_gradients_sum_to_total(setup):
    student, ad, _, tok, stu, tea = setup
    rows = RolloutBatch.from_rollouts(stu[:4] + tea[:4], torch.tensor([1.0, -1, 0.5, -0.5] * 2), tok.pad_token_id)
    _zero(ad)
    lp = _logp(student, rows)
    loss, st = dr_grpo_loss(lp, behaviour_logp(rows, lp), rows.advantages, rows.batch.completion_mask,
                            DrGRPONormaliser(4, 10, 2))
    parts = source_gradients(st.row_loss, rows.sources, ad.delta_s_params())
    loss.backward()  # graph was retained
    full = [p.grad for p in ad.delta_s_params()]
    assert set(parts) == {"student", "teacher"}
    for s, t, f in zip(parts["student"], parts["teacher"], full):
        assert torch.allclose(s + t, f, atol=1e-15)
    assert max(float(g.abs().max()) for g in parts["teacher"]) > 0
    assert max(float(g.abs().max()) for g in parts["student"]) > 0
    _zero(ad)


def test_oracle_labels_change_no_gradient(setup):
    """gt_correct is logged, never trained on: permuting it leaves every gradient unchanged."""
    student, ad, _, tok, stu, _ = setup
    records = [{"reward": r, "gt_correct": g} for r, g in
               zip([1.25, 0.0, 1.0, 0.25, 0.0, 1.25, 1.25, 0.25], [1, 0, 1, 0, 0, 1, 0, 0])]

    def grad_for(recs):
        _zero(ad)
        adv = group_advantages(torch.tensor([r["reward"] for r in recs]).reshape(2, 4))
        rows = RolloutBatch.from_rollouts(stu, adv.flat(), tok.pad_token_id)
        lp = _logp(student, rows)
        l, _ = dr_grpo_loss(lp, behaviour_logp(rows, lp), rows.advantages, rows.batch.completion_mask,
                            DrGRPONormaliser(4, 10, 2))
        l.backward()
        return _grads(ad)

    g1 = grad_for(records)
    perm = [0, 1, 0, 1, 1, 0, 1, 0]
    g2 = grad_for([{"reward": r["reward"], "gt_correct": g} for r, g in zip(records, perm)])
    assert torch.equal(g1, g2) and g1.abs().max() > 0
    for fn in (group_advantages, dr_grpo_loss, nll_loss, behaviour_logp, RolloutBatch):
        assert "gt_correct" not in inspect.signature(fn).parameters
    _zero(ad)


def test_on_policy_helper_detaches():
    x = torch.zeros(2, 3, requires_grad=True)
    assert not on_policy_behaviour(x * 2).requires_grad
    assert set(grpo.__all__) >= {"dr_grpo_loss", "nll_loss", "group_advantages", "DrGRPONormaliser"}
