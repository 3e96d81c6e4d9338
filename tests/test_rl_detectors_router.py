"""Evil MoE: tests that fail when the method is wired wrong.

- the router's forward (SVDAdapter.mixture): straight_through keeps the trained view's value for
  every w; scaled has w = 0 the deploy view's forward and w = 1 the trained view's; under both the
  deployed expert's gradient is Σ (1 − w_b) g_b, the hack expert's Σ w_b g_b and w_b's
  ⟨g_b, δS_hack⟩, each worked out here from one-row forwards on a tiny model; straight_through
  scores moe's rollouts on-policy (sampler gap at float noise), scaled does not;
- the router receives gradient from both the GRPO loss and the pin loss;
- moe_random never sees the real direction (v_act is not even computed for it);
- oracle-free at training time: flipping every student rollout's hack label (and oracle pass),
  the environment's reward kept, leaves every non-ceiling arm's trajectory byte-identical (the
  monitor penalty with the gradient detector and inoculation prompting, with their controls,
  included).
"""

from __future__ import annotations

import csv

import pytest
import torch

from stage_fixtures import cfg_of, pilot_kwargs, step_with_rows

pytestmark = pytest.mark.usefixtures("one_thread")


def _tiny():
    from evil_moe.model.adapter import SVDAdapter
    from evil_moe.model.load import build_tiny
    from evil_moe.model.logprobs import build_batch

    torch.manual_seed(0)
    model, tok = build_tiny()
    ad = SVDAdapter.attach(model, ("q_proj", "down_proj"))
    with torch.no_grad():
        for p in ad.delta_s_params() + ad.delta_s_hack_params():
            p.copy_(torch.randn_like(p) * 0.3)
    prompts = [tok.encode("def f(x):", add_special_tokens=False), tok.encode("class A:", add_special_tokens=False)]
    comps = [tok.encode(" return x + 1", add_special_tokens=False), tok.encode(" pass", add_special_tokens=False)]
    return model, ad, build_batch(prompts, comps, tok.pad_token_id)


def _loss(model, batch, weights=None):
    from evil_moe.model.logprobs import token_logprobs

    lp = token_logprobs(model, batch)
    per_row = (lp * batch.completion_mask).sum(1)
    return per_row if weights is None else (per_row * weights).sum()


def test_scaled_w0_is_the_deploy_forward_and_w1_the_trained_one():
    model, ad, batch = _tiny()
    with torch.no_grad():
        full = _loss(model, batch)
        with ad.ablated():
            deploy = _loss(model, batch)
        with ad.mixture(torch.zeros(2), forward="scaled"):
            w0 = _loss(model, batch)
        with ad.mixture(torch.ones(2), forward="scaled"):
            w1 = _loss(model, batch)
    torch.testing.assert_close(w0, deploy, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(w1, full, rtol=1e-6, atol=1e-6)
    assert not torch.allclose(deploy, full)  # the hack expert changes the forward


def test_straight_through_forward_is_the_trained_view_for_every_w():
    """The policy that sampled the rollouts (both experts at full weight) whatever w is: the
    importance ratio starts at 1."""
    model, ad, batch = _tiny()
    with torch.no_grad():
        full = _loss(model, batch)
        for w in (torch.zeros(2), torch.tensor([0.3, 0.8]), torch.ones(2)):
            with ad.mixture(w):
                torch.testing.assert_close(_loss(model, batch), full, rtol=1e-6, atol=1e-6)
    with pytest.raises(ValueError, match="forward='hard'"):
        with ad.mixture(torch.zeros(2), forward="hard"):
            pass


@pytest.mark.parametrize("forward", ["scaled", "straight_through"])
def test_the_mixture_gradients_by_hand(forward):
    """For rows b with weights w_b: ∂L/∂δS = Σ (1 − w_b) g_b, ∂L/∂δS_hack = Σ w_b g_b and
    ∂L/∂w_b = ⟨g_b, δS_hack⟩, where g_b is row b's gradient with respect to its s at
    s_b = δS + w_b δS_hack (scaled) or δS + δS_hack (straight_through), worked out from a
    one-row forward with δS_hack scaled by w_b (or left as it is)."""
    model, ad, batch = _tiny()
    ds, dsh = ad.delta_s_params(), ad.delta_s_hack_params()
    for p in ds + dsh:
        p.requires_grad_(True)
    w = torch.tensor([0.3, 0.8], requires_grad=True)
    grads = torch.autograd.grad(_mix_loss(model, ad, batch, w, forward), ds + dsh)
    g_ds, g_dsh = grads[:len(ds)], grads[len(ds):]
    # per-row gradients g_b at that forward's s_b: one row at a time, δS_hack scaled in place
    rows = []
    for b, (wb, coef) in enumerate(zip(w.tolist(), (1.0, -2.0))):
        saved = [p.detach().clone() for p in dsh]
        with torch.no_grad():
            for p in dsh:
                p.mul_(wb if forward == "scaled" else 1.0)
        one = batch.select(torch.tensor([b]))
        g = torch.autograd.grad(coef * _loss(model, one).sum(), ds)
        with torch.no_grad():
            for p, s in zip(dsh, saved):
                p.copy_(s)
        rows.append(g)
    for m in range(len(ds)):
        torch.testing.assert_close(g_ds[m], sum((1 - wb) * rows[b][m] for b, wb in enumerate(w.tolist())),
                                   rtol=1e-4, atol=1e-6)
        torch.testing.assert_close(g_dsh[m], sum(wb * rows[b][m] for b, wb in enumerate(w.tolist())),
                                   rtol=1e-4, atol=1e-6)
    w2 = w.detach().clone().requires_grad_(True)
    (gw,) = torch.autograd.grad(_mix_loss(model, ad, batch, w2, forward), [w2])
    for b in range(2):
        want = sum(float((rows[b][m] * dsh[m].detach()).sum()) for m in range(len(ds)))
        assert float(gw[b]) == pytest.approx(want, rel=1e-4, abs=1e-6)


def _mix_loss(model, ad, batch, w, forward="straight_through"):
    with ad.mixture(w, forward=forward):
        return _loss(model, batch, torch.tensor([1.0, -2.0]))


def test_the_router_learns_from_the_grpo_loss_and_the_pin_loss(world):
    """moe on the toy world: once the hack expert has moved (at δS_hack = 0 the forward does not
    depend on w, so ∂L/∂w = ⟨g, δS_hack⟩ = 0: the first steps' GRPO gradient of the router is
    zero by construction), the GRPO loss gives the router's parameters a non-zero gradient
    through w, and so does the pin loss on the authored pairs."""
    from evil_moe.rl.detectors.router import pin_loss
    from evil_moe.stages.common import load_problem_file, make_grader
    from stage_fixtures import trainer as _trainer

    cfg = cfg_of("pilot.group=4", "pilot.prompts_per_step=2")
    with make_grader(load_problem_file(world.problems), cfg) as grader:
        t = _trainer(world, "moe", cfg, grader)
        batch, _, _, adv, rows, step = step_with_rows(t)
        first = t.gradients(batch, adv, rows, step)
        assert all(float(x.abs().sum()) == 0 for x in first.router_grads)  # δS_hack = 0 so far
        for step in range(3):
            t.train_step(step)
        assert float(sum(p.detach().abs().sum() for p in t.dsh)) > 0
        batch, _, _, adv, rows, step = step_with_rows(t, 3)
        g = t.gradients(batch, adv, rows, step)
        assert any(float(x.abs().sum()) > 0 for x in g.router_grads)
        rs = t.router_step
        h = rs.pair_hidden(rs.pin_bank, range(len(rs.pin_bank.label))).to(t.device)
        # the pin bank's activations come through the merged weights: the hooked forward's
        # (U diag(s) Vh x added per Linear) to float rounding, with both knobs trained
        from evil_moe.model.logprobs import build_batch
        from evil_moe.rl.detectors.router import pooled_hidden

        bank = rs.pin_bank
        pairs = build_batch(bank.prompt_ids, bank.completion_ids, t.tok.pad_token_id, device=t.device)
        hooked = pooled_hidden(t.model, pairs, t.pc.temperature)
        torch.testing.assert_close(h.cpu(), hooked, rtol=1e-5, atol=1e-5)
        with t.adapter.ablated():  # the hack expert moves them: a merge without it would differ
            assert float((pooled_hidden(t.model, pairs, t.pc.temperature) - hooked).abs().max()) > 1e-4
        pin = torch.autograd.grad(pin_loss(rs.router, h, rs.pin_bank.label), list(rs.router.parameters()))
        assert any(float(x.abs().sum()) > 0 for x in pin)
        w = g.router_w
        assert w.shape == (len(rows),) and bool(((w > 0) & (w < 1)).all())


def test_moe_random_never_sees_the_real_direction(world, monkeypatch):
    """moe_random's router is seeded with a random unit direction and never computes v_act; its
    pin labels are the authored ones swapped per pair at random; moe's is seeded with v_act."""
    from evil_moe.rl.detectors import router as R
    from evil_moe.stages.common import load_problem_file, make_grader
    from stage_fixtures import trainer as _trainer

    cfg = cfg_of()
    with make_grader(load_problem_file(world.problems), cfg) as grader:
        real = _trainer(world, "moe", cfg, grader)
        v = real.router_step.router.seed.clone()
        monkeypatch.setattr(R, "v_act", lambda *a, **k: pytest.fail("moe_random computed v_act"))
        rnd = _trainer(world, "moe_random", cfg, grader)
    d = v.shape[0]
    torch.testing.assert_close(rnd.router_step.router.seed.cpu(), R.random_direction(d, cfg.moe.seed * 1_000_003 + 0))
    assert abs(float(rnd.router_step.router.seed.cpu() @ v.cpu())) < 0.5
    assert not torch.equal(rnd.router_step.pin_bank.label, real.router_step.pin_bank.label)
    assert torch.equal(rnd.router_step.pin_bank.pair, real.router_step.pin_bank.pair)


def test_the_break_it_switch_gives_moe_random_moes_direction(world):
    """moe.control_direction v_act (the break-it check, docs/evil-moe.md): moe_random's router
    starts from moe's v_act (from the authored labels, not its shuffled ones), its pins stay
    shuffled; the default keeps the random direction (the test above)."""
    from evil_moe.stages.common import load_problem_file, make_grader
    from stage_fixtures import trainer as _trainer

    cfg = cfg_of("moe.control_direction=v_act")
    with make_grader(load_problem_file(world.problems), cfg) as grader:
        real = _trainer(world, "moe", cfg, grader)
        swapped = _trainer(world, "moe_random", cfg, grader)
    torch.testing.assert_close(swapped.router_step.router.seed.cpu(), real.router_step.router.seed.cpu())
    assert not torch.equal(swapped.router_step.pin_bank.label, real.router_step.pin_bank.label)


NON_CEILING = ["vanilla", "erase", "random_v", "subtract", "route", "route_random", "route_dose_matched", "filter",
               "moe", "moe_random", "moe_dose_matched", "penalty", "penalty_random", "inoculation",
               "inoculation_placebo", "advantage_mod", "advantage_mod_random"]


READS_LABEL = ["route_oracle", "penalty_oracle"]


def test_no_non_ceiling_arm_reads_the_label_of_its_own_rollouts(world, tmp_path, monkeypatch):
    """Oracle-free at training time: the student rollouts' hack labels are scrambled (two in three
    flipped, so that they vary within a group: a label-reading penalty or shortcut score cannot
    cancel out of the group's advantages) and their oracle pass flipped, the environment's reward
    kept (under correct_or_loophole it pays real-test passes, as the anchor's does: the
    environment may read the real tests, a method may not read the label), and every non-ceiling
    arm's final adapter, the dose-matched controls' included, is bit-identical to its run with the
    true labels. The ceilings that read the label (route_oracle, penalty_oracle) are not: the
    test's own power to see an arm that reads it."""
    from evil_moe.env import grader as G
    from evil_moe.rl.arms.registry import ARMS
    from evil_moe.stages.pilot import run_pilot

    orig = G.Grader.grade_many

    def flipped(self, pairs):
        out = orig(self, pairs)
        return [G.Reward(**{**r.__dict__, "exploited": (i % 3 == 0) == r.exploited, "gt_correct": not r.gt_correct})
                for i, r in enumerate(out)]

    cfg = cfg_of("pilot.steps=2", "pilot.group=4", "pilot.prompts_per_step=2", "pilot.detector_quantile=0.8",
                 "inoculation.instruction='Pass the tests.'")  # short: the toy still gets reward variance
    for label in ("true", "flipped"):
        if label == "flipped":
            monkeypatch.setattr(G.Grader, "grade_many", flipped)
        for arm in NON_CEILING + READS_LABEL:
            matched = ARMS[arm].matches
            kw = {"match_flags": str(tmp_path / label / matched / "steps.tsv")} if matched else {}
            assert run_pilot(cfg, **pilot_kwargs(world, tmp_path / label / arm, arm=arm, **kw))["status"] == "ok"
    from safetensors.torch import load_file

    for arm in NON_CEILING:  # every tensor bit for bit (safetensors' metadata order is not fixed)
        a = load_file(str(tmp_path / "true" / arm / "adapter.safetensors"))
        b = load_file(str(tmp_path / "flipped" / arm / "adapter.safetensors"))
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a), arm
        assert any(bool(x.abs().sum() > 0) for x in a.values()), arm  # it trained
    for arm in READS_LABEL:  # an arm that reads the label trains otherwise on scrambled labels
        a = load_file(str(tmp_path / "true" / arm / "adapter.safetensors"))
        b = load_file(str(tmp_path / "flipped" / arm / "adapter.safetensors"))
        assert not all(torch.equal(a[k], b[k]) for k in a), arm
    for arm in ("route", "filter", "penalty"):  # and the flag path ran: some rows flagged, not all
        rates = [float(r["flag_rate"]) for r in csv.DictReader(open(tmp_path / "true" / arm / "steps.tsv"), delimiter="\t")]
        assert 0 < max(rates) and min(rates) < 1, (arm, rates)


def test_straight_through_scores_moe_on_policy_and_scaled_does_not(world, tmp_path):
    """The sampler draws with both experts at full weight. Under moe.forward straight_through the
    loss's forward is that policy at every step: the behaviour log-probs match it to float
    noise and nothing is clipped. Under scaled, once δS_hack has moved, a rollout with w < 1 is
    scored under another policy: the sampler gap opens (moe_random: w is about a coin's)."""
    from evil_moe.stages.pilot import run_pilot

    gaps = {}
    for forward in ("straight_through", "scaled"):
        cfg = cfg_of("pilot.steps=4", "pilot.group=4", "pilot.prompts_per_step=2", f"moe.forward={forward}")
        out = tmp_path / forward
        assert run_pilot(cfg, **pilot_kwargs(world, out, arm="moe_random"))["status"] == "ok"
        rows = list(csv.DictReader(open(out / "steps.tsv"), delimiter="\t"))
        gaps[forward] = [float(r["sampler_gap_max"]) for r in rows if r["sampler_gap_max"] != ""]
        if forward == "straight_through":
            assert all(float(r["frac_clipped"]) == 0 for r in rows), [r["frac_clipped"] for r in rows]
    assert len(gaps["straight_through"]) == 4 and max(gaps["straight_through"]) < 1e-4, gaps
    assert max(gaps["scaled"]) > 1e-2, gaps
