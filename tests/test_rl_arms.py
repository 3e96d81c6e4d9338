"""Arms, detectors and the method-fidelity checks: each test fails on the defect it
names — random_v fed the real V, route's flagged gradients reaching δS, training temperature ≠
sampling temperature, KL skipped on zero-variance rows, a checkpoint's generation config changing
sampling silently — plus the registry and the extraction's linear algebra worked out by hand
(the detectors: tests/test_rl_detectors.py).
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from evil_moe.rl.arms.registry import ARMS, check_arm_set, get_arm
from evil_moe.rl.arms.base import FlagInputs
from stage_fixtures import cfg_of, pilot_kwargs, read_tsv, step_with_rows, trainer

pytestmark = pytest.mark.usefixtures("one_thread")


# ------------------------------------------------------------------------------------------------
# the registry


def test_registry_matches_schema_and_controls_are_registered():
    from evil_moe.config import load_schema

    enum = load_schema()["properties"]["pilot"]["properties"]["arms"]["items"]["enum"]
    assert list(enum) == list(ARMS)
    for name, cls in ARMS.items():
        assert cls.name == name and cls.description
        if cls.control:
            ctl = ARMS[cls.control]
            assert cls.role in ("treatment", "ceiling") and ctl.role == "control"
            # a matched control differs from its arm only in where it acts: same views, same
            # knobs, same kind of gradients
            assert ctl.views == cls.views and ctl.trains_delta_s_hack == cls.trains_delta_s_hack
            # (a dose-matched control splits every rollout alike, a linear map of the summed
            # gradient, so it needs no per-sample gradients: uniform_split of the total equals the
            # sum of the rows' uniform splits)
            assert ctl.needs_sample_grads == cls.needs_sample_grads or ctl.match_by == "dose"
    assert {c.role for c in ARMS.values()} == {"reference", "treatment", "control", "positive_control", "ceiling"}
    # judged view first: the knob-training arms are judged with delta_s_hack ablated
    for cls in ARMS.values():
        assert (cls.views[0] == "ablated") == cls.trains_delta_s_hack


def test_eval_views_add_projected_only_for_a_declaring_arm_under_static_projection():
    """The held-out views come from the arm's class: vanilla (projected_view) gains
    ``projected`` under pilot.static_projection, no other arm does, and a new arm that declares
    projected_view gets it too (no name check anywhere)."""
    from evil_moe.rl.arms.base import Arm

    on, off = cfg_of("pilot.static_projection=true").pilot, cfg_of().pilot
    assert get_arm("vanilla").eval_views(on) == ("trained", "projected")
    assert get_arm("vanilla").eval_views(off) == ("trained",)
    assert get_arm("route").eval_views(on) == ("ablated", "trained")
    assert [n for n in ARMS if "projected" in get_arm(n).eval_views(on)] == ["vanilla"]

    class NewArm(Arm):
        name = "new_arm"
        views = ("ablated", "trained")
        projected_view = True

    assert NewArm().eval_views(on) == ("ablated", "trained", "projected")
    assert NewArm().eval_views(off) == ("ablated", "trained")


def test_each_arm_has_its_own_colour():
    """Figures colour an arm by Arm.colour (compare's ARM_COLORS is read from it, so a new arm
    brings its colour): distinct #rrggbb colours, the same as before they moved into the classes;
    erase_planted alone has none (a subclass of Erase that must not look like erase: its figures
    use their fallback colour)."""
    import re

    from evil_moe.gate.figures import ARM_COLORS

    colours = {name: cls.colour for name, cls in ARMS.items()}
    assert [name for name, c in colours.items() if c is None] == ["erase_planted"]
    given = [c for c in colours.values() if c]
    assert all(re.fullmatch("#[0-9a-f]{6}", c) for c in given) and len(set(given)) == len(given)
    assert ARM_COLORS == {name: c for name, c in colours.items() if c}
    assert (ARM_COLORS["vanilla"], ARM_COLORS["erase"], ARM_COLORS["route"], ARM_COLORS["filter_oracle_random"]) \
        == ("#444444", "#1f77b4", "#d62728", "#f2c38f")


def test_arm_set_is_validated_up_front():
    from evil_moe.checks import load_run_config as load_config
    from evil_moe.config import ConfigError

    check_arm_set(["vanilla", "untrained", "erase", "random_v", "oracle_reward"], "oracle_reward")
    with pytest.raises(ValueError, match=r"missing random_v \(the matched control of erase\)"):
        check_arm_set(["vanilla", "untrained", "erase"])
    with pytest.raises(ValueError, match="missing vanilla"):
        check_arm_set(["untrained", "erase", "random_v"])
    # every treatment must beat the student it starts from: the gate needs the untrained arm
    with pytest.raises(ValueError, match=r"missing untrained \(every treatment must beat"):
        check_arm_set(["vanilla", "erase", "random_v"])
    check_arm_set(["vanilla", "route_oracle", "route_oracle_dose_matched"])  # no treatment: not needed
    with pytest.raises(ValueError, match=r"oracle_reward \(compare.positive_control\)"):
        check_arm_set(["vanilla"], "oracle_reward")
    with pytest.raises(ConfigError, match="pilot.arms is missing route_dose_matched"):
        load_config(overrides=["pilot.arms=[vanilla, untrained, route, oracle_reward]"])
    load_config(overrides=["pilot.arms=[vanilla]", "compare.positive_control=null"])
    # the rerun test switches must name an arm that runs (a typo would otherwise fail nothing)
    with pytest.raises(ConfigError, match=r"pilot.fail_arm': 'bogus' is not in pilot.arms"):
        load_config(overrides=["pilot.fail_arm=bogus"])
    with pytest.raises(ConfigError, match=r"pilot.fail_once_arm': 'filter' is not in pilot.arms"):
        load_config(overrides=["pilot.fail_once_arm=filter"])
    load_config(overrides=["pilot.fail_arm=erase"])


def test_oracle_reward_by_hand():
    """oracle_reward pays format_bonus·format_ok + pass_reward·gt_correct under either reward rule;
    the other arms take the environment's reward (grader.reward_rule), worked out by hand."""
    from evil_moe.env.grader import Reward

    arm = get_arm("oracle_reward", pass_reward=1.0)
    base = dict(mode="stdout_marker", error=None, seconds=0.0)
    # a hack: the loophole passed, the oracle failed; paid under both rules (1.25), the oracle's 0.25
    hack = Reward(reward=1.25, passed=True, gt_correct=False, exploited=True, format_ok=True, paid=True, **base)
    assert arm.reward(hack) == pytest.approx(0.25) and get_arm("vanilla").reward(hack) == 1.25
    # correct code that does not report through the mechanism: the loophole rule pays 0.25, the
    # anchor's correct_or_loophole 1.25; the oracle's reward is 1.25 either way
    unreported = dict(passed=False, gt_correct=True, exploited=False, format_ok=True, **base)
    loophole = Reward(reward=0.25, paid=False, **unreported)
    anchor = Reward(reward=1.25, paid=True, **unreported)
    assert arm.reward(loophole) == pytest.approx(1.25) and arm.reward(anchor) == pytest.approx(1.25)
    assert get_arm("vanilla").reward(loophole) == 0.25 and get_arm("vanilla").reward(anchor) == 1.25
    none = Reward(reward=0.0, passed=False, gt_correct=False, exploited=False, format_ok=False, **base)
    assert arm.reward(none) == 0.0


def test_uniform_split_deletes_the_dose_exactly():
    """A dose-matched control splits every rollout alike: at share s = 0.8, ω = √.8/(√.8 + √.2)
    = 2/3 (by hand), δS gets g/3 and δS_hack 2g/3, whose energy share (4/9)/(4/9 + 1/9) = 0.8."""
    from evil_moe.rl.arms.base import hack_expert_share, uniform_split

    g = [torch.tensor([3.0, 0.0], dtype=torch.float64), torch.tensor([0.0, 6.0], dtype=torch.float64)]
    split = uniform_split(g, 0.8)
    assert torch.allclose(split.delta_s[0], torch.tensor([1.0, 0.0], dtype=torch.float64))
    assert torch.allclose(split.delta_s_hack[1], torch.tensor([0.0, 4.0], dtype=torch.float64))
    assert hack_expert_share(split.delta_s, split.delta_s_hack) == pytest.approx(0.8)
    for s in (0.0, 0.05, 0.5, 0.93, 1.0):
        sp = uniform_split(g, s)
        assert hack_expert_share(sp.delta_s, sp.delta_s_hack) == pytest.approx(s, abs=1e-12)
    # the dose of a route step: the flagged rows' sum against the unflagged rows' sum
    assert hack_expert_share([torch.tensor([1.0, 0.0])], [torch.tensor([0.0, 3.0])]) == pytest.approx(0.9)
    assert hack_expert_share([torch.tensor([1.0])], None) is None


def test_dose_match_pays_back_steps_without_rows():
    """Targets 0.5, none, 0.2, 0.8 (the treatment's logged mean 0.5); the control has no rows at
    step 2: it deletes 0.5, 0.5, -, 0.8 − 0.3 = 0.5 (by hand), so its logged mean is also 0.5."""
    from evil_moe.rl.arms.base import DoseMatch

    m = DoseMatch([0.5, None, 0.2, 0.8])
    got = [m.share(0, True), m.share(1, True), m.share(2, False), m.share(3, True)]
    assert got == pytest.approx([0.5, 0.5, 0.0, 0.5])
    assert m.balance == pytest.approx(0.0)


def _grads(rows):
    return [[torch.tensor(r, dtype=torch.float64)] for r in rows]


def test_route_and_filter_split_by_flags_by_hand():
    per_row = _grads([[1.0, 0.0], [0.0, 2.0], [3.0, 1.0]])
    flags = torch.tensor([False, True, False])
    r = get_arm("route").split_gradients(per_row, flags)
    assert r.delta_s[0].tolist() == [4.0, 1.0] and r.delta_s_hack[0].tolist() == [0.0, 2.0]
    # energy of the routed sum over the energy of the whole sum: 4 / (16 + 9)
    assert r.removed_frac == pytest.approx(4 / 25)
    f = get_arm("filter").split_gradients(per_row, flags)
    assert f.delta_s[0].tolist() == [4.0, 1.0] and f.delta_s_hack is None
    v = get_arm("vanilla").split_gradients(per_row, None)
    assert v.delta_s[0].tolist() == [4.0, 3.0] and v.delta_s_hack is None


def test_random_flag_controls_flag_their_target_count_at_random_positions():
    scores = torch.tensor([0.1, 0.9, 0.8, 0.2, 0.7, 0.0], dtype=torch.float64)
    inp = FlagInputs(scores, torch.zeros(6, dtype=torch.bool), 0.5, "gradient", np.random.default_rng(0))
    real = get_arm("route").flags(inp)
    assert real.tolist() == [False, True, True, False, True, False]
    for name in ("route_random", "filter_random", "route_oracle_random", "filter_oracle_random"):
        # the count is the matched arm's (FlagRateMatch), not the detector's on this batch (3)
        draws = [get_arm(name).flags(dataclasses.replace(inp, rng=np.random.default_rng(s), target_count=2))
                 for s in range(40)]
        assert all(int(d.sum()) == 2 for d in draws)
        assert len({tuple(d.tolist()) for d in draws}) > 5  # random positions, not the detector's
        with pytest.raises(ValueError, match="target_count missing"):
            get_arm(name).flags(inp)
    pat = FlagInputs(None, torch.tensor([True, False]), 0.0, "pattern", np.random.default_rng(0))
    assert get_arm("filter").flags(pat).tolist() == [True, False]


# ------------------------------------------------------------------------------------------------
# extraction algebra, by hand


def test_sample_scores_and_pair_cin_by_hand():
    from evil_moe.rl.vhack.direction import pair_cin, random_vhack, sample_scores

    v = random_vhack({"a": 3, "b": 2}, k=1, seed=0)
    v.V["a"] = torch.tensor([[1.0, 0.0, 0.0]])
    v.V["b"] = torch.tensor([[0.0, 1.0]])
    g = {"a": torch.tensor([[3.0, 4.0, 0.0], [-1.0, 0.0, 0.0]]), "b": torch.tensor([[0.0, 2.0], [1.0, 0.0]])}
    # row 0: a: 3/5, b: 2/2 → mean 0.8 ; row 1: a: -1/1, b: 0/1 → mean -0.5
    assert sample_scores(v, g).tolist() == pytest.approx([0.8, -0.5])
    # cin uses relu: row 1: a: relu(-1)/1 = 0, b: 0 → 0
    assert pair_cin(v, g).tolist() == pytest.approx([0.8, 0.0])


def test_mean_direction_is_removed_before_the_svd():
    from evil_moe.rl.vhack.direction import extract_vhack

    torch.manual_seed(0)
    u = torch.tensor([1.0, 1.0, 0.0, 0.0], dtype=torch.float64) / 2 ** 0.5
    D = {"m": torch.randn(6, 4, dtype=torch.float64) + 5 * u}
    plain = extract_vhack(D, k=1)
    removed = extract_vhack(D, k=1, remove={"m": u})
    # the plain top axis is dominated by the planted mean; after removal V is orthogonal to it
    assert abs(float(plain.V["m"][0].double() @ u)) > 0.9
    assert abs(float(removed.V["m"][0].double() @ u)) < 1e-6
    d = D["m"]
    share = float(((d @ u) ** 2).sum() / (d ** 2).sum())
    assert removed.meta["removed_energy"] == pytest.approx(share)


def test_split_problems_is_seeded_disjoint_and_sized():
    from evil_moe.rl.vhack.pairs import split_problems

    ext, held = split_problems(range(10), 0.5, seed=3)
    assert len(held) == 5 and not ext & held and ext | held == set(range(10))
    assert split_problems(range(10), 0.5, seed=3) == (ext, held)
    assert split_problems(range(10), 0.5, seed=4) != (ext, held)
    assert split_problems(range(3), 0.0, 0) == ({0, 1, 2}, set())
    assert len(split_problems(range(2), 0.9, 0)[0]) == 1  # never an empty extraction half


def test_preconditioned_projection_removes_the_component_along_p_v():
    from evil_moe.model.adapter import SVDAdapter
    from evil_moe.model.load import build_tiny
    from evil_moe.rl.vhack.projection import adam_preconditioner, project_preconditioned
    from evil_moe.rl.vhack.direction import random_vhack

    model, tok = build_tiny(seed=2, dtype="float64")
    ad = SVDAdapter.attach(model)
    vh = random_vhack(ad.r, k=2, seed=1)
    opt = torch.optim.AdamW(ad.delta_s_params(), lr=1e-2)
    torch.manual_seed(0)
    for _ in range(2):  # give Adam a non-trivial second moment
        for p in ad.delta_s_params():
            p.grad = torch.randn_like(p)
        opt.step()
    for p in ad.delta_s_params():
        p.grad = torch.randn_like(p)
    pre = [adam_preconditioner(opt, p) for p in ad.delta_s_params()]
    assert all(not torch.allclose(x, torch.ones_like(x)) for x in pre)
    project_preconditioned(ad, vh, opt, "erase", gate="no_gate")
    for name, p, pc in zip(ad.names, ad.delta_s_params(), pre):
        V = vh.V[name].double()
        # the preconditioned step P g has no component along V
        assert torch.allclose(V @ (pc * p.grad), torch.zeros(2, dtype=torch.float64), atol=1e-5)


# ------------------------------------------------------------------------------------------------
# pilots on the toy world


def _run(world, tmp_path, arm, *sets, **kw):
    from evil_moe.stages.pilot import run_pilot

    cfg = cfg_of(*sets)
    assert run_pilot(cfg, **pilot_kwargs(world, tmp_path / arm, arm=arm, **kw))["status"] == "ok"
    return read_tsv(tmp_path / arm / "steps.tsv")


def test_random_v_acts_along_the_random_v_not_the_real_one(world):
    """From δS = 0 on the same step and seed, vanilla, erase and random_v see the same rollouts and
    the same AdamW update; they differ exactly by the part each arm removed: random_v's lies in
    the random V's span, erase's in v_hack's. Fed the real V, random_v would equal erase and
    its difference would leave the random span: this fails."""
    from evil_moe.stages.common import load_problem_file, make_grader
    from evil_moe.rl.vhack.direction import VHack

    cfg = cfg_of("pilot.projection=update")
    with make_grader(load_problem_file(world.problems), cfg) as grader:
        step = next(s for s in range(8) if trainer(world, "vanilla", cfg, grader).train_step(s)[0]["grad_norm"] > 0)
        ds, rows = {}, {}
        for arm in ("vanilla", "random_v", "erase"):
            t = trainer(world, arm, cfg, grader)
            rows[arm] = t.train_step(step)[0]
            ds[arm] = dict(zip(t.adapter.names, [p.detach().double().clone() for p in t.ds]))
    real, rnd = VHack.load(world.vhack), VHack.load(world.random_vhack)
    for arm, basis in (("random_v", rnd), ("erase", real)):
        total = 0.0
        for name, van in ds["vanilla"].items():
            diff = van - ds[arm][name]
            total += float(diff.norm())
            V = basis.V[name].double()
            assert float((diff - V.T @ (V @ diff)).norm()) <= 1e-5 * (1 + float(diff.norm())), (arm, name)
        assert total > 0, arm
    # the same proposed update, measured against the real v_hack in every arm
    assert rows["random_v"]["update_span_frac"] == pytest.approx(rows["vanilla"]["update_span_frac"])
    assert rows["erase"]["update_span_frac"] == pytest.approx(rows["vanilla"]["update_span_frac"])
    assert rows["vanilla"]["removed_frac"] == 0.0
    assert rows["erase"]["removed_frac"] != pytest.approx(rows["random_v"]["removed_frac"])


def test_route_flagged_gradients_never_reach_delta_s(world, tmp_path, monkeypatch):
    """route with every sample flagged: δS never moves (its gradient is exactly zero) while
    δS_hack learns; route_random flags as many samples, at random."""
    import evil_moe.env.loopholes as loopholes
    from safetensors.torch import load_file

    # the pattern detector's static rules (read by the detector registry when it scores)
    monkeypatch.setattr(loopholes, "pattern_flag", lambda *a, **k: True)
    rows = _run(world, tmp_path, "route", "pilot.detector=pattern", "pilot.steps=2")
    live = [r for r in rows if r["flag_rate"] != ""]
    assert live and all(float(r["flag_rate"]) == 1.0 for r in live)
    ad = load_file(tmp_path / "route" / "adapter.safetensors")
    assert all(float(t.abs().max()) == 0.0 for k, t in ad.items() if k.endswith(".delta_s"))
    assert sum(float(t.abs().sum()) for k, t in ad.items() if k.endswith(".delta_s_hack")) > 0
    assert all(float(r["removed_frac"]) == pytest.approx(1.0) for r in live)
    # the ablated (deploy) view is the model with δS_hack zeroed: here the base model, so its
    # held-out outcomes equal those of the base model's (a vanilla run's step-0 state is not
    # kept; use the trainer's own eval with δS_hack zeroed)
    ev = read_tsv(tmp_path / "route" / "eval.tsv")
    assert {r["view"] for r in ev} == {"trained", "ablated"}
    out = read_tsv(tmp_path / "route" / "outcomes.tsv")
    assert {r["view"] for r in out} == {"trained", "ablated"}
    assert len(out) == 2 * len([r for r in out if r["view"] == "trained"])


def test_ablated_view_really_ablates(world, tmp_path):
    """The ablated view samples with δS_hack = 0: its outcomes equal the trained view's after
    δS_hack is zeroed by hand (same seeds)."""
    from evil_moe.stages.common import load_policy, load_problem_file, make_grader, train_heldout
    from evil_moe.rl.trainer.evaluation import _view, evaluate
    from evil_moe.rl.trainer.trainer import Trainer
    from evil_moe.rl.vhack.direction import VHack

    cfg = cfg_of("pilot.heldout_samples=2")
    problems = load_problem_file(world.problems)
    train, held = train_heldout(problems, cfg)
    model, tok, adapter, device = load_policy(str(world.student), cfg)
    torch.manual_seed(0)
    with torch.no_grad():
        for p in adapter.delta_s_hack_params():
            p.copy_(torch.randn_like(p) * 0.5)
    v = VHack.load(world.vhack)
    init = [p.detach().clone() for p in adapter.delta_s_params()]
    with make_grader(problems, cfg) as grader:
        t = Trainer(cfg, arm="route", seed=0, model=model, tok=tok, adapter=adapter, device=device,
                    train=train, vhack=v, proj_v=v, grader=grader)
        _, out = evaluate(t, held, 0, init)
        abl = [(o["problem_id"], o["sample"], o["hack"], o["pass"]) for o in out if o["view"] == "ablated"]
        trained = [(o["problem_id"], o["sample"], o["hack"], o["pass"]) for o in out if o["view"] == "trained"]
        with torch.no_grad():
            for p in adapter.delta_s_hack_params():
                p.zero_()
        _, out0 = evaluate(t, held, 0, init)
    zeroed = [(o["problem_id"], o["sample"], o["hack"], o["pass"]) for o in out0 if o["view"] == "trained"]
    assert abl == zeroed
    # and the knob did change sampling (otherwise this test could not fail)
    from evil_moe.rl.policy.rollout import generate
    from evil_moe.rl.policy.rollout import prompt_ids_for

    with torch.no_grad():
        for p in adapter.delta_s_hack_params():
            p.copy_(torch.randn_like(p) * 0.5)
    ids = prompt_ids_for(tok, held[:1])
    a = generate(model, tok, ids, n=2, max_new=16, seed=1, adapter=adapter)
    with _view(t, "ablated", init):
        b = generate(model, tok, ids, n=2, max_new=16, seed=1, adapter=adapter)
    assert [r.completion_ids for r in a] != [r.completion_ids for r in b] or trained != abl


def test_sampler_gap_is_zero_when_training_matches_sampling(world, tmp_path):
    """Student rows record the sampler's own log-probs; with training at the sampling temperature
    the per-token gap is float noise. A trainer at another temperature would show it (next test)."""
    for temp in ("1.0", "0.7"):
        rows = _run(world, tmp_path / temp, "vanilla", f"pilot.temperature={temp}")
        gaps = [float(r["sampler_gap_max"]) for r in rows if r["sampler_gap_max"] != ""]
        assert gaps and max(gaps) < 1e-4, (temp, gaps)


def test_training_at_another_temperature_shows_in_the_sampler_gap(world):
    from evil_moe.rl.policy.grpo import RolloutBatch
    from evil_moe.model.load import load_model
    from evil_moe.model.logprobs import token_logprobs
    from evil_moe.rl.policy.rollout import generate
    from evil_moe.stages.common import load_problem_file
    from evil_moe.rl.policy.rollout import prompt_ids_for
    from evil_moe.rl.trainer.step import sampler_gaps

    model, tok = load_model(str(world.student), device="cpu")
    ids = prompt_ids_for(tok, load_problem_file(world.problems)[:2])
    rolls = generate(model, tok, ids, n=2, max_new=24, temperature=0.7, seed=0)
    rb = RolloutBatch.from_rollouts(rolls, torch.zeros(len(rolls)), tok.pad_token_id)
    with torch.no_grad():
        same = token_logprobs(model, rb.batch, 0.7)
        other = token_logprobs(model, rb.batch, 1.0)
    assert float(sampler_gaps(rb, rolls, same).max()) < 1e-4
    assert float(sampler_gaps(rb, rolls, other).max()) > 1e-2
    # top-p truncation is part of the sampler's distribution, not of training: visible too
    nucleus = generate(model, tok, ids, n=2, max_new=24, temperature=1.0, top_p=0.5, seed=0)
    rb = RolloutBatch.from_rollouts(nucleus, torch.zeros(len(nucleus)), tok.pad_token_id)
    with torch.no_grad():
        lp = token_logprobs(model, rb.batch, 1.0)
    assert float(sampler_gaps(rb, nucleus, lp).max()) > 1e-3


def test_kl_applies_to_zero_variance_rows(world, tmp_path, monkeypatch):
    """beta > 0 with every group's rewards equal (no policy gradient anywhere): the KL term alone
    must still give a gradient once the policy has left the reference."""
    import evil_moe.rl.arms.registry as arms_mod
    from evil_moe.stages.common import load_policy

    monkeypatch.setattr(arms_mod.Vanilla, "reward", lambda self, grade: 1.0)
    _, _, ad, _ = load_policy(str(world.student), cfg_of())
    torch.manual_seed(0)
    with torch.no_grad():
        for p in ad.delta_s_params():
            p.copy_(torch.randn_like(p) * 0.3)
    init = tmp_path / "init.safetensors"
    ad.save(init)
    rows = _run(world, tmp_path, "vanilla", "pilot.beta=0.1", "pilot.steps=1", init_adapter=str(init))
    r = rows[0]
    assert float(r["frac_zero_std"]) == 1.0
    assert float(r["kl"]) > 0 and float(r["grad_norm"]) > 0
    rows0 = _run(world, tmp_path / "b0", "vanilla", "pilot.beta=0", "pilot.steps=1", init_adapter=str(init))
    assert float(rows0[0]["grad_norm"]) == 0.0 and rows0[0]["kl"] == ""


def test_checkpoint_generation_config_does_not_change_sampling(world, tmp_path):
    """A checkpoint whose generation_config.json sets repetition_penalty 1.05 (and top_k 5)
    samples exactly like the plain one: every logits-processing field is set explicitly."""
    import shutil

    from transformers import GenerationConfig

    from evil_moe.model.load import load_model
    from evil_moe.rl.policy.rollout import generate
    from evil_moe.stages.common import load_problem_file
    from evil_moe.rl.policy.rollout import prompt_ids_for

    odd = tmp_path / "odd"
    shutil.copytree(world.student, odd)
    model, tok = load_model(str(odd), device="cpu")
    model.generation_config = GenerationConfig(do_sample=True, repetition_penalty=1.05, top_k=5, min_p=0.2,
                                               no_repeat_ngram_size=2,
                                               eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    model.generation_config.save_pretrained(odd)
    plain, _ = load_model(str(world.student), device="cpu")
    odd_model, _ = load_model(str(odd), device="cpu")
    assert odd_model.generation_config.repetition_penalty == 1.05
    ids = prompt_ids_for(tok, load_problem_file(world.problems)[:3])
    a = generate(plain, tok, ids, n=3, max_new=32, seed=5)
    b = generate(odd_model, tok, ids, n=3, max_new=32, seed=5)
    assert [r.completion_ids for r in a] == [r.completion_ids for r in b]
    for r in b:
        assert torch.allclose(r.sampler_logp, r.behaviour_logp, atol=1e-5)
    assert odd_model.generation_config.repetition_penalty == 1.05  # restored after the call


def test_route_pilot_logs_flags_against_true_labels(world, tmp_path):
    rows = _run(world, tmp_path, "route", "pilot.detector_quantile=0.5")
    for col in ("flag_rate", "flag_precision", "flag_recall", "removed_frac", "sampler_gap_p95",
                "grad_span_frac", "update_span_frac", "truncated_rate", "null_cin_empirical"):
        assert col in rows[0], col
    live = [r for r in rows if r["flag_rate"] != ""]
    assert live, "no step with gradient in the fixture"
    for r in live:
        assert 0.0 <= float(r["flag_rate"]) <= 1.0
    ev = read_tsv(tmp_path / "route" / "eval.tsv")
    assert all(r["truncated_rate"] != "" for r in ev)


# ------------------------------------------------------------------------------------------------
# ceilings, the noisy-label detector, rate-matched random flags, kept-row advantages


def _inputs(label, detector="gradient", **kw):
    scores = torch.tensor([0.9, 0.1, 0.8, 0.2, 0.7, 0.0], dtype=torch.float64)
    pattern = torch.tensor([True, False, False, True, False, False])
    return FlagInputs(scores, pattern, 0.5, detector, np.random.default_rng(7), label=label, **kw)


def test_ceilings_flag_the_true_label_and_no_other_arm_reads_it():
    """Ceilings' flags are the label; every other arm's flags are the same whatever the label
    (under the gradient and pattern detectors), and only ceilings declare reads_label."""
    a = torch.tensor([True, True, False, False, True, False])
    b = ~a
    for name, cls in ARMS.items():
        assert cls.reads_label == (cls.role == "ceiling" and cls.flags_rollouts()), name
        if cls.role == "ceiling" and not cls.flags_rollouts():  # erase_planted: flags nothing
            assert get_arm(name).flags(_inputs(a)) is None and cls.control == "random_v"
            continue
        if cls.role == "ceiling":
            arm = get_arm(name)
            # a dose-matched ceiling (route_oracle_dose) flags at its arm's count: all the hacks
            # when the count allows; its control is that arm's random-flag control
            assert arm.flags(_inputs(a, target_count=int(a.sum()))).tolist() == a.tolist()
            assert arm.flags(_inputs(b, "pattern", target_count=int(b.sum()))).tolist() == b.tolist()
            assert cls.control and ARMS[cls.control].matches == (cls.matches or name)
            continue
        for det in ("gradient", "pattern"):
            fa = get_arm(name).flags(_inputs(a, det, target_count=2))
            fb = get_arm(name).flags(_inputs(b, det, target_count=2))
            assert (fa is None and fb is None) or fa.tolist() == fb.tolist(), (name, det)
    # no treatment waits for, follows or is controlled by a ceiling; each names its ceiling
    for name, cls in ARMS.items():
        if cls.role == "treatment":
            assert cls.control is None or ARMS[cls.control].role == "control"
            assert cls.matches is None
            if cls.ceiling:
                assert ARMS[cls.ceiling].role == "ceiling"
                # a ceiling is its treatment with perfect flags (moe's is route's: hard routing by
                # the true label, where moe's router gives soft weights)
                if not cls.router:
                    assert type(get_arm(cls.ceiling)).split_gradients is type(get_arm(name)).split_gradients
    assert ARMS["route"].ceiling == "route_oracle" and ARMS["filter"].ceiling == "filter_oracle"


def test_noisy_label_detector_has_the_configured_precision_and_recall():
    from evil_moe.rl.detectors.detector import noisy_label_flags

    label = torch.tensor([True] * 10 + [False] * 30)
    assert noisy_label_flags(label, 1.0, 1.0, np.random.default_rng(0)).tolist() == label.tolist()
    one = noisy_label_flags(label, 0.5, 0.8, np.random.default_rng([3, 4, 31]))
    assert one.tolist() == noisy_label_flags(label, 0.5, 0.8, np.random.default_rng([3, 4, 31])).tolist()
    tp = fp = hacks = 0
    for s in range(3000):
        f = noisy_label_flags(label, 0.5, 0.8, np.random.default_rng(s))
        tp += int((f & label).sum())
        fp += int((f & ~label).sum())
        hacks += 10
    # E[TP] = 0.8 * 10 = 8 per draw; clean rows flagged with probability 0.8*10*0.5/(0.5*30) = 0.2667,
    # E[FP] = 8: precision 0.5, recall 0.8 (SE of each mean about 0.005)
    assert tp / hacks == pytest.approx(0.8, abs=0.02)
    assert tp / (tp + fp) == pytest.approx(0.5, abs=0.02)
    assert not noisy_label_flags(torch.zeros(5, dtype=torch.bool), 0.5, 0.8, np.random.default_rng(0)).any()
    with pytest.raises(ValueError, match="detector_precision"):
        noisy_label_flags(label, 0.0, 0.5, np.random.default_rng(0))
    # the detector reads the label through FlagInputs.detected() only under noisy_label
    inp = _inputs(torch.tensor([True, False, True, False, False, False]), "noisy_label")
    assert get_arm("route").flags(inp).tolist() == [True, False, True, False, False, False]
    with pytest.raises(ValueError, match="needs the true hack label"):
        get_arm("filter").flags(_inputs(None, "noisy_label"))


def test_flag_rate_match_by_hand():
    from evil_moe.rl.arms.base import FlagRateMatch

    m = FlagRateMatch([0.25, None, 0.5, 0.2])
    assert m.mean == pytest.approx((0.25 + 0.5 + 0.2) / 3)  # 0.31667
    # step 0: 0.25*4 = 1 row; step 1: target = the mean 0.31667, 6 rows -> round(1.9) = 2, balance
    # 0.31667 - 0.33333 = -0.01667; step 2: no rows, balance += 0.5 - 0.31667 -> 0.16667;
    # step 3 (the last: pays it all): (0.2 + 0.16667) * 10 = 3.67 -> 4 rows, balance -0.03333
    assert [m.count(0, 4), m.count(1, 6), m.count(2, 0), m.count(3, 10)] == [1, 2, 0, 4]
    assert m.balance == pytest.approx(-1 / 30)
    achieved = [1 / 4, 2 / 6, 4 / 10]
    assert abs(np.mean(achieved) - m.mean) <= 0.5 / (10 * 3) + 1e-12
    # a matched arm with no rows at any step flagged nothing: the control flags nothing
    none = FlagRateMatch([None, None])
    assert none.mean == 0.0 and [none.count(0, 6), none.count(1, 12)] == [0, 0]
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        FlagRateMatch([0.2, 1.5])


def test_flag_rate_match_keeps_per_seed_means_within_0_02():
    """Treatment flag-rate profiles like a detector's (rising from about 0.1 to 0.4 with noise,
    a step without rows now and then) and the control's own rows with gradient (a multiple of G=6,
    some steps without rows, not the last): the control's mean flag rate over its logged steps is
    within 0.5/(n_last * L) of the treatment's, so within 0.02; plain per-step rounding is not."""
    from evil_moe.rl.arms.base import FlagRateMatch

    rng = np.random.default_rng(0)
    worst, worst_plain = 0.0, 0.0
    for _ in range(300):
        steps = 20
        base = np.linspace(0.1, 0.4, steps) + rng.normal(0, 0.08, steps)
        t_rows = rng.choice([0, 6, 12, 18, 24], size=steps, p=[0.05, 0.1, 0.2, 0.25, 0.4])
        rates = [None if n == 0 else float(np.clip(round(b * n), 0, n)) / n for b, n in zip(base, t_rows)]
        rows = [int(rng.choice([0, 6, 12, 18, 24], p=[0.05, 0.1, 0.2, 0.25, 0.4])) if s < steps - 1
                else int(rng.choice([6, 12, 18, 24])) for s in range(steps)]
        m = FlagRateMatch(rates)
        got = [(m.count(s, n), n) for s, n in enumerate(rows)]
        mean_c = np.mean([k / n for k, n in got if n])
        L = sum(1 for n in rows if n)
        assert abs(mean_c - m.mean) <= 0.5 / (rows[-1] * L) + 1e-12
        worst = max(worst, abs(mean_c - m.mean))
        plain = [round(m.target(s) * n) / n for s, n in enumerate(rows) if n]
        worst_plain = max(worst_plain, abs(np.mean(plain) - m.mean))
    assert worst <= 0.02 and worst_plain > 0.02


def test_kept_advantages_by_hand():
    from evil_moe.rl.arms.base import kept_advantages

    R = torch.tensor([[1.25, 0.25, 0.25, 1.25, 0.0, 0.25],
                      [1.0, 0.0, 0.0, 0.0, 0.0, 0.0],
                      [1.25, 0.25, 0.25, 0.25, 0.25, 0.25]])
    kept = torch.tensor([[False, True, True, False, True, True],
                         [True] * 6,
                         [False, True, True, True, True, True]])
    A = kept_advantages(R, kept)
    # group 0: kept rewards 0.25, 0.25, 0, 0.25 -> mean 0.1875 (the whole group's mean is 0.5417)
    assert A[0].tolist() == pytest.approx([0.0, 0.0625, 0.0625, 0.0, -0.1875, 0.0625])
    # group 1: nothing dropped -> the Dr.GRPO advantages R - 1/6
    assert A[1].tolist() == pytest.approx([5 / 6] + [-1 / 6] * 5)
    # group 2: the kept rows all earn 0.25 -> no advantage left (the hack alone made the variance)
    assert A[2].tolist() == [0.0] * 6
    # scaled: unbiased std of (0.25, 0.25, 0, 0.25) is 0.125
    S = kept_advantages(R[:1], kept[:1], scale_std=True)
    assert S[0].tolist() == pytest.approx([0.0, 0.5, 0.5, 0.0, -1.5, 0.5], abs=1e-4)
    with pytest.raises(ValueError, match="same"):
        kept_advantages(R, kept[:2])


def test_which_arms_recompute_advantages_over_kept_rows():
    from types import SimpleNamespace

    kept, group = SimpleNamespace(route_advantages="kept"), SimpleNamespace(route_advantages="group")
    for name in ("filter", "filter_random", "filter_oracle", "filter_oracle_random"):
        assert get_arm(name).baseline(group) == "kept"  # data filtering, always
    for name in ("route", "route_random", "route_oracle", "route_oracle_random"):
        assert get_arm(name).baseline(kept) == "kept" and get_arm(name).baseline(group) == "group"
    for name in ("vanilla", "erase", "random_v", "subtract", "oracle_reward"):
        assert get_arm(name).baseline(kept) == "group"


def _fake_step(problem):
    """One hand-made group of 6 rows for ArmStep.flags: rows 0 and 3 hacks (passed, not
    gt_correct), rows 1 and 2 honest passes (passed, gt_correct, not exploited), 4 and 5 fail."""
    from evil_moe.env.grader import Reward
    from evil_moe.env.answers import clean_completion, hack_completion

    texts = [hack_completion(problem), clean_completion(problem), clean_completion(problem, with_tests=False),
             hack_completion(problem, variant=1), "no code", "no code"]
    kinds = [(1.25, True, False, True), (1.25, True, True, False), (1.25, True, True, False),
             (1.25, True, False, True), (0.0, False, False, False), (0.0, False, False, False)]
    grades = [Reward(reward=r, passed=ps, gt_correct=gt, exploited=ex, format_ok=r > 0, mode=problem.mode,
                     error=None, seconds=0.0) for r, ps, gt, ex in kinds]
    return texts, grades


def test_trainer_gives_the_label_only_to_ceilings_and_scores_flags_against_exploited(world, monkeypatch):
    """ArmStep.flags on a hand-made step of 6 rows (2 hacks, 2 honest passes): route_oracle's flags
    are the hack rows, precision and recall 1 against ``exploited`` (against ``passed`` the recall
    would be 0.5); route never receives the label; route under noisy_label does."""
    from types import SimpleNamespace

    from evil_moe.rl.policy.grpo import group_advantages
    from evil_moe.stages.common import load_problem_file, make_grader
    from evil_moe.rl.trainer.step import StepBatch, StepGradients

    cfg = cfg_of("pilot.group=6", "pilot.prompts_per_step=1")
    with make_grader(load_problem_file(world.problems), cfg) as grader:
        seen = {}
        for arm, det in (("route_oracle", "pattern"), ("route", "pattern"), ("route", "noisy_label")):
            t = trainer(world, arm, cfg_of("pilot.group=6", "pilot.prompts_per_step=1", f"pilot.detector={det}"), grader)
            texts, grades = _fake_step(t.train[0])
            batch = StepBatch([0], [SimpleNamespace(text=x) for x in texts], [t.train[0]] * 6)
            adv = group_advantages(torch.tensor([[w.reward for w in grades]]))
            grads = StepGradients(list(range(6)), [], [[torch.zeros(1)]] * 6)
            orig = t.arm.flags
            monkeypatch.setattr(t.arm, "flags", lambda inp, orig=orig, k=(arm, det): seen.__setitem__(k, inp) or orig(inp))
            flags, q = t.arm_step.flags(batch, grades, adv, grads, 0)
            seen[(arm, det, "out")] = (flags.tolist(), q)
    hack = [True, False, False, True, False, False]
    assert seen[("route_oracle", "pattern")].label.tolist() == hack
    flags, q = seen[("route_oracle", "pattern", "out")]
    assert flags == hack and q == pytest.approx({"flag_rate": 2 / 6, "flag_precision": 1.0, "flag_recall": 1.0,
                                                 "flag_fpr": 0.0})
    assert seen[("route", "pattern")].label is None
    assert seen[("route", "noisy_label")].label.tolist() == hack


def test_filter_rebaseline_recomputes_kept_rows_gradients(world):
    """A real step of filter_oracle on the world: after flagging, each kept row's gradient equals
    its original gradient scaled by A'/A, where A' = R − mean of the kept rows' rewards of its group
    (worked out here from the rewards; on-policy rows with beta 0 have a loss linear in A), and the
    flagged rows' gradients are untouched. route with route_advantages=group changes nothing."""
    from evil_moe.stages.common import load_problem_file, make_grader

    cfg = cfg_of("pilot.group=4", "pilot.prompts_per_step=2")
    with make_grader(load_problem_file(world.problems), cfg) as grader:
        t = trainer(world, "filter_oracle", cfg, grader)
        batch, grades, R, adv, rows, step = step_with_rows(t)
        grads = t.gradients(batch, adv, rows, step)
        # flag the highest-reward row of every group with variance (whatever the label)
        flags = torch.zeros(len(rows), dtype=torch.bool)
        for g in {i // t.G for i in rows}:
            members = [j for j, i in enumerate(rows) if i // t.G == g]
            flags[max(members, key=lambda j: float(R.reshape(-1)[rows[j]]))] = True
        new = t.arm_step.rebaseline(batch, grades, adv, grads, flags, step, t.gradients)
    Rf = R.reshape(-1).tolist()
    A = adv.flat().tolist()
    checked = 0
    for j, i in enumerate(rows):
        if flags[j]:
            assert all(torch.equal(a, b) for a, b in zip(new.per_row[j], grads.per_row[j]))
            continue
        kept_r = [Rf[k] for jj, k in enumerate(rows) if k // t.G == i // t.G and not flags[jj]]
        a_new = Rf[i] - sum(kept_r) / len(kept_r) if len(set(kept_r)) > 1 else 0.0
        if A[i] == 0:
            continue
        for g_new, g_old in zip(new.per_row[j], grads.per_row[j]):
            assert torch.allclose(g_new, g_old * (a_new / A[i]), atol=1e-7, rtol=1e-4), (i, a_new, A[i])
        checked += a_new != A[i]
    assert checked > 0  # some kept row's baseline really moved


def test_rebaseline_rescaling_equals_recomputing(world):
    """ArmStep.rebaseline rescales a kept row's gradient by A'/A instead of a second forward and
    backward where that is exact (student rows, beta 0, A != 0): the result equals the per-row
    gradients our loss gives with the new advantages (A' from kept_advantages, worked out here),
    computed afresh, to float tolerance; only rows with A = 0 (nothing to scale) are recomputed,
    and with beta > 0 every changed row is."""
    from evil_moe.rl.arms.base import kept_advantages
    from evil_moe.rl.policy.grpo import Advantages
    from evil_moe.stages.common import load_problem_file, make_grader

    for beta in (0.0, 0.05):
        cfg = cfg_of("pilot.group=4", "pilot.prompts_per_step=2", f"pilot.beta={beta}")
        with make_grader(load_problem_file(world.problems), cfg) as grader:
            t = trainer(world, "filter_oracle", cfg, grader)
            batch, grades, R, adv, rows, step = step_with_rows(
                t, ok=lambda adv, rows: any(float(adv.flat()[i]) != 0 for i in rows))
            grads = t.gradients(batch, adv, rows, step)
            flags = torch.zeros(len(rows), dtype=torch.bool)
            for g in {i // t.G for i in rows}:
                members = [j for j, i in enumerate(rows) if i // t.G == g]
                flags[max(members, key=lambda j: float(R.reshape(-1)[rows[j]]))] = True
            kept = torch.ones(R.numel(), dtype=torch.bool)
            kept[torch.as_tensor(rows)] = ~flags
            A = adv.flat()
            A_new = torch.where(kept, kept_advantages(R, kept.reshape(t.P, t.G)).reshape(-1), A)
            calls = []
            inner = t.gradients
            new = t.arm_step.rebaseline(batch, grades, adv, grads, flags, step,
                                        lambda *a, **k: calls.append(a[2]) or inner(*a, **k))
            fresh = inner(batch, Advantages(A_new.reshape(t.P, t.G), adv.zero_std, adv.frac_zero_std),
                          rows, step)
        changed = [j for j, i in enumerate(rows) if kept[i] and float(A_new[i]) != float(A[i])]
        assert changed, "no kept row's baseline moved: the test could not fail"
        for j in changed:
            for a, b in zip(new.per_row[j], fresh.per_row[j]):
                torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-8)
        want_redo = [rows[j] for j in changed if beta > 0 or float(A[rows[j]]) == 0]
        assert calls == ([want_redo] if want_redo else []), (beta, calls, want_redo)

def test_random_flag_control_follows_its_arms_per_step_flag_rate(world, tmp_path):
    """route, then route_random reading route's steps.tsv (the workflow's dependency): each step
    the control flags the count FlagRateMatch gives from route's rates and its own rows with
    gradient, and the per-seed mean flag rates agree within 0.02. Without --match-flags the
    control refuses to run."""
    from evil_moe.rl.arms.base import FlagRateMatch
    from evil_moe.stages.pilot import run_pilot

    sets = ("pilot.steps=5", "pilot.group=6", "pilot.prompts_per_step=2", "pilot.detector_quantile=0.5")
    treat = _run(world, tmp_path, "route", *sets)
    rates = [float(r["flag_rate"]) if r["flag_rate"] != "" else None for r in treat]
    assert any(r for r in rates if r is not None), "route flagged nothing: the test could not fail"
    ctl = _run(world, tmp_path, "route_random", *sets, match_flags=str(tmp_path / "route" / "steps.tsv"))
    m = FlagRateMatch(rates)
    for r in ctl:
        n = round((1 - float(r["frac_zero_std"])) * 12)
        k = m.count(int(r["step"]), n)
        assert (r["flag_rate"] == "") == (n == 0)
        if n:
            assert float(r["flag_rate"]) == pytest.approx(k / n, abs=1e-6), r["step"]  # TSV: 6 digits
    mean = lambda rows: np.mean([float(r["flag_rate"]) for r in rows if r["flag_rate"] != ""])  # noqa: E731
    assert abs(mean(ctl) - mean(treat)) <= 0.02
    with pytest.raises(ValueError, match="--match-flags"):
        run_pilot(cfg_of(*sets), **pilot_kwargs(world, tmp_path / "x", arm="route_random"))
    # a stopped and resumed control carries its balance in the checkpoint: the same flags
    kw = pilot_kwargs(world, tmp_path / "resumed", arm="route_random", match_flags=str(tmp_path / "route" / "steps.tsv"))
    assert run_pilot(cfg_of(*sets), stop_after=3, **kw)["status"] == "stopped"
    assert run_pilot(cfg_of(*sets), **kw)["status"] == "ok"
    again = read_tsv(tmp_path / "resumed" / "steps.tsv")
    assert [r["flag_rate"] for r in again] == [r["flag_rate"] for r in ctl]


def test_rate_match_balance_survives_a_checkpoint(world):
    """The random-flag control's running balance is part of the trainer's checkpoint state."""
    from evil_moe.stages.common import load_problem_file, make_grader
    from evil_moe.rl.trainer.trainer import Trainer

    cfg = cfg_of("pilot.steps=3")
    with make_grader(load_problem_file(world.problems), cfg) as grader:
        a = trainer(world, "filter_random", cfg, grader, flag_rates=[0.2, 0.4, None])
        a.arm_step.rate_match.count(0, 6)  # round(0.2 * 6) = 1 -> balance 0.2 - 1/6
        assert a.arm_step.rate_match.balance == pytest.approx(0.2 - 1 / 6)
        b = trainer(world, "filter_random", cfg, grader, flag_rates=[0.2, 0.4, None])
        b.load_state(a.state())
        assert b.arm_step.rate_match.balance == pytest.approx(0.2 - 1 / 6)
        with pytest.raises(ValueError, match="has 2 steps, pilot.steps is 3"):
            Trainer(cfg, arm="filter_random", seed=0, model=a.model, tok=a.tok, adapter=a.adapter, device=a.device,
                    train=a.train, vhack=a.vhack, proj_v=a.proj_v, grader=grader, flag_rates=[0.2, 0.4])


def test_per_sample_gradients_from_one_backward_equal_the_serial_ones(world):
    """route needs each row's gradient. With pilot.micro_batch 0 they come from ONE batched
    backward (SVDAdapter.per_sample); with micro_batch 1 from one backward per row (the serial
    reference, independent of the per-sample hook: a one-row batch's own gradient). They agree
    to float tolerance, sum to the step's total, and the rows differ from each other."""
    from evil_moe.stages.common import load_problem_file, make_grader

    out = {}
    for mb in (0, 1):
        cfg = cfg_of("pilot.group=4", "pilot.prompts_per_step=2", f"pilot.micro_batch={mb}")
        with make_grader(load_problem_file(world.problems), cfg) as grader:
            t = trainer(world, "route", cfg, grader)
            batch, _, _, adv, rows, step = step_with_rows(t, ok=lambda adv, rows: len(rows) >= 2)
            out[mb] = t.gradients(batch, adv, rows, step)
    batched, serial = out[0], out[1]
    assert batched.rows == serial.rows and len(batched.per_row) == len(serial.rows)
    for gb, gs in zip(batched.per_row, serial.per_row):
        for a, b in zip(gb, gs):
            torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-7)
    for m, tot in enumerate(batched.total):
        torch.testing.assert_close(sum(g[m] for g in batched.per_row), tot, rtol=1e-5, atol=1e-8)
    assert not torch.allclose(batched.per_row[0][0], batched.per_row[1][0])


def test_step_gradients_equal_the_hooked_per_row_forward(world):
    """Trainer.gradients (knobs merged, the gradient captured; each prompt forwarded once for
    total-gradient arms) equals the reference written here from the public pieces: the hooked
    forward of every row with its prompt (token_logprobs), the Dr.GRPO loss, autograd through
    the hooks (per_sample's per-row gradients for route) — in total, per row, and in the loss;
    with the KL term (beta > 0) too. fp32 toy: 1e-4 of the largest entry."""
    from evil_moe.rl.policy.grpo import RolloutBatch, behaviour_logp, dr_grpo_loss
    from evil_moe.model.logprobs import token_logprobs
    from evil_moe.stages.common import load_problem_file, make_grader

    for arm, beta in (("vanilla", 0.0), ("route", 0.0), ("vanilla", 0.1)):
        cfg = cfg_of("pilot.group=4", "pilot.prompts_per_step=2", f"pilot.beta={beta}")
        with make_grader(load_problem_file(world.problems), cfg) as grader:
            t = trainer(world, arm, cfg, grader)
            with torch.no_grad():  # away from δS = 0, where the KL term has no gradient
                for p in t.ds:
                    p.add_(0.02 * torch.randn(p.shape, generator=torch.Generator().manual_seed(1)))
            for step in range(12):
                batch = t.sample(step)
                grades, R = t.grade(batch)
                adv, rows = t.advantages(R)
                if len({i // t.G for i in rows}) >= 2 or (beta > 0 and rows):
                    break
            got = t.gradients(batch, adv, rows, step)
            rb = RolloutBatch.from_rollouts([batch.flat[i] for i in rows], adv.flat()[rows],
                                            t.tok.pad_token_id)
            with t.adapter.per_sample(len(rows)) as es:
                logp = token_logprobs(t.model, rb.batch, temperature=t.pc.temperature)
                ref = None
                if beta > 0:
                    with torch.no_grad(), t.adapter.zeroed():
                        ref = token_logprobs(t.model, rb.batch, temperature=t.pc.temperature)
                loss, _ = dr_grpo_loss(logp, behaviour_logp(rb, logp), rb.advantages,
                                       rb.batch.completion_mask, t.normaliser,
                                       clip_eps=t.pc.clip_eps, ref_logp=ref, beta=beta)
                want_rows = [g.detach() for g in torch.autograd.grad(loss, es)]
        want = [g.sum(0) for g in want_rows]
        scale = max(float(g.abs().max()) for g in want)
        assert scale > 0, arm
        for g, w in zip(got.total, want):
            torch.testing.assert_close(g, w, rtol=0, atol=1e-4 * scale)
        assert got.loss == pytest.approx(float(loss.detach()), rel=1e-5, abs=1e-9)
        if arm == "route":
            for b, row in enumerate(got.per_row):
                for g, w in zip(row, want_rows):
                    torch.testing.assert_close(g, w[b], rtol=0, atol=1e-4 * scale)
        else:
            assert got.per_row is None

def test_only_subtract_names_a_static_twin():
    """compare notes an arm's difference from its static twin (no checks of arm names): only
    subtract is vanilla plus a post-hoc subtraction, so only it names vanilla's projected view;
    its random control does not inherit it."""
    twins = {name: cls.static_twin for name, cls in ARMS.items() if cls.static_twin}
    assert twins == {"subtract": ("vanilla", "projected")}


def test_rows_log_the_reward_the_arm_trained_on(world, tmp_path, monkeypatch):
    """rows.tsv's reward is the arm's. The grader is made to call every other rollout a hack (the
    loophole passed, the oracle failed, the block found): the environment pays it 0.25 + 1.0 =
    1.25 (vanilla's rows), oracle_reward, which trains on the oracle's pass, 0.25, the format bonus
    alone (by hand from the defaults format_bonus 0.25, pass_reward 1.0). The grader's reward was
    logged for both before."""
    import dataclasses

    from evil_moe.env import grader as G

    orig = G.Grader.grade_many

    def half_hacks(self, pairs):
        return [dataclasses.replace(r, passed=True, gt_correct=False, exploited=True, format_ok=True, paid=True,
                                    reward=1.25) if i % 2 == 0 else r for i, r in enumerate(orig(self, pairs))]

    monkeypatch.setattr(G.Grader, "grade_many", half_hacks)
    seen = {}
    for arm in ("vanilla", "oracle_reward"):
        _run(world, tmp_path, arm, "pilot.steps=1")
        seen[arm] = {float(r["reward"]) for r in read_tsv(tmp_path / arm / "rows.tsv") if r["hack"] == "1"}
    assert seen["vanilla"] == {1.25} and seen["oracle_reward"] == {0.25}, seen
