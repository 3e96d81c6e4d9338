"""Advantage Modification (Wu & Tang 2026, arXiv:2604.01476; evil_moe/rl/arms/by_advantage.py):
tests that fail when it is wired wrong.

- the discounted rewards and the advantages they give match the formula worked out by hand on
  tiny groups (numbers written here);
- the direction is the unit mean difference of the authored pairs' activations at mid depth,
  recomputed here from transformers' own hidden states; the random control's has the same norm,
  lives at the same layer, differs from it and never computes the real one;
- the advantages the loss sees are those of the discounted rewards (the trainer's wiring);
- check_arm_set requires the control; a tiny pilot of each arm runs and logs its columns.
(That no label of the run's own rollouts reaches either arm: tests/test_rl_detectors_router.py.)
"""

from __future__ import annotations

import csv

import pytest
import torch

from stage_fixtures import cfg_of, pilot_kwargs, step_with_rows

pytestmark = pytest.mark.usefixtures("one_thread")


def test_discounted_rewards_and_advantages_match_the_formula_by_hand():
    """R' = R (1 − λ p), p the score rescaled to [0, 1] within its group, A' = R' − mean R';
    λ = 0.5. Group 0: scores 2, 0, 5, 1 → p = 0.4, 0, 1, 0.2 (the unrewarded rollout scores
    highest: its reward stays 0); group 1: equal scores → no discount; group 2: every rollout
    rewarded (no variance before the discount) → p = 0, 1/3, 2/3, 1."""
    from evil_moe.rl.arms.by_advantage import shortcut_discounted_rewards
    from evil_moe.rl.policy.grpo import group_advantages

    R = torch.tensor([[1.0, 1.0, 0.0, 1.0], [1.0, 0.0, 1.0, 0.0], [1.0, 1.0, 1.0, 1.0]])
    s = torch.tensor([[2.0, 0.0, 5.0, 1.0], [3.0, 3.0, 3.0, 3.0], [-1.0, 0.0, 1.0, 2.0]])
    R2, disc = shortcut_discounted_rewards(R, s, 0.5)
    torch.testing.assert_close(disc, torch.tensor([[0.2, 0.0, 0.5, 0.1], [0.0] * 4, [0.0, 1 / 6, 1 / 3, 0.5]],
                                                  dtype=torch.float64))
    torch.testing.assert_close(R2, torch.tensor([[0.8, 1.0, 0.0, 0.9], [1.0, 0.0, 1.0, 0.0],
                                                 [1.0, 5 / 6, 2 / 3, 0.5]]))
    A = group_advantages(R2)
    # group 0: mean 2.7 / 4 = 0.675; group 2: mean 3 / 4 = 0.75
    torch.testing.assert_close(A.advantages, torch.tensor([[0.125, 0.325, -0.675, 0.225], [0.5, -0.5, 0.5, -0.5],
                                                  [0.25, 1 / 12, -1 / 12, -0.25]]))
    assert A.frac_zero_std == 0.0  # the all-rewarded group now has a gradient
    # λ = 0 is vanilla; λ outside [0, 1] is refused
    torch.testing.assert_close(shortcut_discounted_rewards(R, s, 0.0)[0], R)
    with pytest.raises(ValueError, match="advantage_mod.coef"):
        shortcut_discounted_rewards(R, s, 1.5)


def _pooled_at(model, batch, layer):
    """Mean over the completion tokens of transformers' hidden_states[layer] (written here, not
    the package's)."""
    with torch.no_grad():
        hs = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask,
                   output_hidden_states=True).hidden_states[layer]
    m = batch.completion_mask.float()
    return (hs.float() * m[..., None]).sum(1) / m.sum(1, keepdim=True)


def test_the_direction_is_the_authored_pairs_mean_difference_at_mid_depth_and_the_control_is_random(world, monkeypatch):
    from evil_moe.env.authored import load_authored
    from evil_moe.model.logprobs import build_batch
    from evil_moe.rl.detectors import router as R
    from evil_moe.stages.common import load_problem_file, make_grader
    from stage_fixtures import trainer as _trainer

    cfg = cfg_of()
    with make_grader(load_problem_file(world.problems), cfg) as grader:
        t = _trainer(world, "advantage_mod", cfg, grader)
        depth = t.model.config.num_hidden_layers
        assert depth == 2 and t.shortcut_step.layer == 1  # n_layers // 2
        bank = R.PinBank.from_authored(load_authored(None, fmt="toy"), t.tok)
        with t.adapter.merged():
            h = _pooled_at(t.model, build_batch(bank.prompt_ids, bank.completion_ids, t.tok.pad_token_id), 1)
        d = h[bank.label].mean(0) - h[~bank.label].mean(0)
        torch.testing.assert_close(t.shortcut_step.direction, d / d.norm(), rtol=1e-4, atol=1e-5)

        def refuse(*a, **k):
            raise AssertionError("the random control computed the real direction")

        monkeypatch.setattr(R, "v_act", refuse)
        c = _trainer(world, "advantage_mod_random", cfg, grader)
        again = _trainer(world, "advantage_mod_random", cfg, grader)
    assert c.shortcut_step.layer == t.shortcut_step.layer
    assert c.shortcut_step.direction.shape == t.shortcut_step.direction.shape
    assert float(c.shortcut_step.direction.norm()) == pytest.approx(float(t.shortcut_step.direction.norm()), abs=1e-6)
    assert abs(float(c.shortcut_step.direction @ t.shortcut_step.direction)) < 0.9
    assert torch.equal(c.shortcut_step.direction, again.shortcut_step.direction)  # seeded


def test_a_layer_beyond_the_model_is_refused_naming_the_key(world):
    from evil_moe.stages.common import load_problem_file, make_grader
    from stage_fixtures import trainer as _trainer

    with make_grader(load_problem_file(world.problems), cfg_of()) as grader:
        with pytest.raises(ValueError, match=r"advantage_mod.layer 3 is outside \[1, 2\]"):
            _trainer(world, "advantage_mod", cfg_of("advantage_mod.layer=3"), grader)


def test_the_loss_sees_the_advantages_of_the_discounted_rewards(world, monkeypatch):
    """The advantages the trainer's gradient step receives are group_advantages of
    R (1 − λ p), p from the rollouts' activations at the layer (recomputed here) along the
    direction; the records keep the environment's reward."""
    from evil_moe.model.logprobs import build_batch
    from evil_moe.rl.policy.grpo import group_advantages
    from evil_moe.stages.common import load_problem_file, make_grader
    from stage_fixtures import trainer as _trainer

    cfg = cfg_of("pilot.group=4", "advantage_mod.coef=0.8")
    with make_grader(load_problem_file(world.problems), cfg) as grader:
        t = _trainer(world, "advantage_mod", cfg, grader)
        # a step with rewarded rollouts (the discount acts on them)
        batch, grades, R, _, _, step = step_with_rows(t, ok=lambda adv, rows: bool(rows))
        with t.adapter.merged():  # the sampling policy's, before the step moves it
            h = _pooled_at(t.model, build_batch([r.prompt_ids for r in batch.flat],
                                                [r.completion_ids for r in batch.flat], t.tok.pad_token_id), 1)
        seen = {}
        orig = t.gradient_step.__call__

        def spy(batch_, adv, rows, step_, **kw):
            seen["adv"], seen["texts"] = adv, [r.text for r in batch_.flat]
            return orig(batch_, adv, rows, step_, **kw)

        monkeypatch.setattr(t, "gradient_step", spy)
        row, recs = t.train_step(step)
    assert seen["texts"] == [r.text for r in batch.flat]  # the step resampled the same rollouts
    s = (h.double() @ t.shortcut_step.direction.double()).reshape(t.P, t.G)
    lo, hi = s.min(1, keepdim=True).values, s.max(1, keepdim=True).values
    p = torch.where(hi > lo, (s - lo) / (hi - lo).clamp_min(1e-300), 0.0)
    want = group_advantages(R.double() * (1 - 0.8 * p))
    torch.testing.assert_close(seen["adv"].advantages.double(), want.advantages, rtol=1e-4, atol=1e-5)
    assert float(R.max()) > 0 and not torch.equal(want.advantages, group_advantages(R.double()).advantages)  # it acted
    assert [rec["reward"] for rec in recs] == [float(x) for x in R.flatten()]
    assert row["shortcut_discount"] == pytest.approx(float((0.8 * p).flatten()[R.flatten() > 0].mean()), abs=1e-5)


def test_check_arm_set_requires_the_random_control():
    from evil_moe.rl.arms.registry import check_arm_set

    with pytest.raises(ValueError, match=r"advantage_mod_random \(the matched control of advantage_mod\)"):
        check_arm_set(["vanilla", "untrained", "advantage_mod"])
    check_arm_set(["vanilla", "untrained", "advantage_mod", "advantage_mod_random"])


@pytest.mark.parametrize("arm", ["advantage_mod", "advantage_mod_random"])
def test_a_tiny_pilot_of_each_arm_runs_and_logs_its_columns(world, tmp_path, arm):
    from evil_moe.stages.pilot import run_pilot

    cfg = cfg_of("pilot.steps=2", "pilot.group=4")
    assert run_pilot(cfg, **pilot_kwargs(world, tmp_path, arm=arm))["status"] == "ok"
    rows = list(csv.DictReader(open(tmp_path / "steps.tsv"), delimiter="\t"))
    assert len(rows) == 2
    for r in rows:
        assert r["shortcut_score"] != "" and r["shortcut_adv_change"] != ""
    assert {r["hack_expert_share"] for r in rows} == {""}  # nothing quarantined
    ev = list(csv.DictReader(open(tmp_path / "eval.tsv"), delimiter="\t"))
    assert {r["view"] for r in ev} == {"trained"}
