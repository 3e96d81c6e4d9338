"""The interventions the field uses (evil_moe/rl/arms/by_reward.py): tests that fail when one is
wired wrong — the monitor penalty's reward worked out by hand (threshold and progressive) on a
hand-made step and in a pilot's rows.tsv, its random control at its per-step rate, the
noisy-label monitor at a set accuracy, inoculation's instruction reaching the training prompts
and never the held-out evaluation's, and a tiny pilot of every new arm.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from evil_moe.rl.arms.base import FlagInputs
from evil_moe.rl.arms.registry import check_arm_set, get_arm
from stage_fixtures import cfg_of, pilot_kwargs, read_tsv, trainer

pytestmark = pytest.mark.usefixtures("one_thread")

NEW_ARMS = ("penalty", "penalty_random", "penalty_oracle", "penalty_oracle_random", "inoculation",
            "inoculation_placebo")


def _fake_step(problem):
    """One hand-made group of 6 rows: 0 and 3 hacks (unconditional reports, reward 1.25), 1 and
    2 honest passes (1.25), 4 and 5 no code (0)."""
    from evil_moe.env.answers import clean_completion, hack_completion
    from evil_moe.env.grader import Reward

    texts = [hack_completion(problem), clean_completion(problem), clean_completion(problem, with_tests=False),
             hack_completion(problem, variant=1), "no code", "no code"]
    kinds = [(1.25, True, False, True), (1.25, True, True, False), (1.25, True, True, False),
             (1.25, True, False, True), (0.0, False, False, False), (0.0, False, False, False)]
    return texts, [Reward(reward=r, passed=ps, gt_correct=gt, exploited=ex, format_ok=r > 0, mode=problem.mode,
                          error=None, seconds=0.0) for r, ps, gt, ex in kinds]


def test_penalty_reward_is_reward_less_amount_times_flag_on_a_hand_made_step(world):
    """ArmStep.shape_rewards on 6 hand-made rows: penalty (pattern detector: the two
    unconditional reports) and penalty_oracle (the label: the same two rows) train on
    R − 0.75·flag with penalty.amount 0.375 and grader.pass_reward 2 (a = 0.75: 1.25 → 0.5), the
    honest passes and failures unchanged; the flag columns are over all 6 rows."""
    from types import SimpleNamespace

    from evil_moe.rl.trainer.step import StepBatch
    from evil_moe.stages.common import load_problem_file, make_grader

    sets = ("pilot.group=6", "pilot.prompts_per_step=1", "pilot.detector=pattern", "penalty.amount=0.375",
            "grader.pass_reward=2.0")
    with make_grader(load_problem_file(world.problems), cfg_of(*sets)) as grader:
        for arm in ("penalty", "penalty_oracle"):
            t = trainer(world, arm, cfg_of(*sets), grader)
            texts, grades = _fake_step(t.train[0])
            batch = StepBatch([0], [SimpleNamespace(text=x, source="student") for x in texts], [t.train[0]] * 6)
            R = torch.tensor([[w.reward for w in grades]])
            new, stats = t.arm_step.shape_rewards(batch, grades, R, 0, gradients=t.gradients)
            assert new.tolist() == [[0.5, 1.25, 1.25, 0.5, 0.0, 0.0]], arm
            assert stats["flag_rows"] == {0: True, 1: False, 2: False, 3: True, 4: False, 5: False}, arm
            assert stats["flags"] == pytest.approx({"flag_rate": 2 / 6, "flag_precision": 1.0, "flag_recall": 1.0,
                                                    "flag_fpr": 0.0}), arm


def test_progressive_penalty_weighs_by_the_detector_score_mapped_to_unit_interval():
    """progressive: R − a·w with w the gradient detector's cosine clipped to [0, 1], the probe's
    σ(logit), the pattern detector's verdict; threshold: the flags; noisy_label (no score) is
    refused at run time and by the config check, naming the key."""
    from types import SimpleNamespace

    from evil_moe.checks import load_run_config
    from evil_moe.config import ConfigError

    arm = get_arm("penalty", pass_reward=2.0)
    R = torch.tensor([1.0, 1.0, 0.25, 0.0])
    prog, thr = SimpleNamespace(amount=0.5, mode="progressive"), SimpleNamespace(amount=0.5, mode="threshold")
    pattern = torch.tensor([True, False, False, True])

    def inputs(scores, detector, threshold=0.5):
        return FlagInputs(scores, pattern, threshold, detector, np.random.default_rng(0))

    cos = torch.tensor([0.3, -0.2, 1.5, 0.0], dtype=torch.float64)
    new, w = arm.penalised(R, inputs(cos, "gradient"), prog)
    assert w.tolist() == [0.3, 0.0, 1.0, 0.0] and new.tolist() == [1.0 - 0.3, 1.0, 0.25 - 1.0, 0.0]
    new, w = arm.penalised(R, inputs(cos, "gradient", threshold=0.25), thr)  # flags: 0.3 and 1.5 above 0.25
    assert new.tolist() == [0.0, 1.0, -0.75, 0.0]
    logit = torch.tensor([0.0, math.log(3.0), -math.log(3.0), 0.0], dtype=torch.float64)
    new, w = arm.penalised(R, inputs(logit, "probe"), prog)  # σ: 1/2, 3/4, 1/4, 1/2
    assert w.tolist() == pytest.approx([0.5, 0.75, 0.25, 0.5]) and new.tolist() == pytest.approx([0.5, 0.25, 0.0, -0.5])
    new, w = arm.penalised(R, inputs(pattern.double(), "pattern"), prog)
    assert new.tolist() == [0.0, 1.0, 0.25, -1.0]
    with pytest.raises(ValueError, match="noisy_label detector has none"):
        arm.penalised(R, inputs(None, "noisy_label"), prog)
    with pytest.raises(ConfigError, match="'penalty.mode': progressive .* pilot.detector noisy_label has none"):
        load_run_config(overrides=["pilot.arms=[vanilla, untrained, penalty, penalty_random]",
                                   "pilot.detector=noisy_label", "penalty.mode=progressive", "compare.positive_control=null"])
    load_run_config(overrides=["pilot.arms=[vanilla, untrained, penalty, penalty_random]",
                               "pilot.detector=pattern", "penalty.mode=progressive", "compare.positive_control=null"])


def test_noisy_label_at_a_set_accuracy_flips_each_label_with_probability_one_minus_accuracy():
    """accuracy_label_flags: over 40,000 rows (a quarter hacks) at accuracy 0.9 the flips are
    Binomial(n, 0.1) among the hacks and among the clean rows alike (each within 5 sd:
    n_hack = 10,000, sd 30; n_clean = 30,000, sd 52); accuracy 1 is the label, 0 its negation;
    the same rng gives the same flags; FlagInputs.accuracy reaches the noisy_label detector."""
    from evil_moe.rl.detectors.detector import accuracy_label_flags
    from evil_moe.rl.detectors.registry import get_detector

    label = torch.zeros(40_000, dtype=torch.bool)
    label[::4] = True
    flags = accuracy_label_flags(label, 0.9, np.random.default_rng(3))
    flips = flags ^ label
    for sub, n in ((label, 10_000), (~label, 30_000)):
        k, sd = int(flips[sub].sum()), math.sqrt(n * 0.1 * 0.9)
        assert abs(k - 0.1 * n) < 5 * sd, (k, n)
    assert torch.equal(accuracy_label_flags(label, 1.0, np.random.default_rng(3)), label)
    assert torch.equal(accuracy_label_flags(label, 0.0, np.random.default_rng(3)), ~label)
    assert torch.equal(accuracy_label_flags(label, 0.9, np.random.default_rng(3)), flags)
    inp = FlagInputs(None, label, 0.0, "noisy_label", np.random.default_rng(3), label=label, accuracy=0.9)
    assert torch.equal(get_detector("noisy_label").flag(inp), flags)
    with pytest.raises(ValueError, match="pilot.detector_accuracy must be in"):
        accuracy_label_flags(label, 1.5, np.random.default_rng(0))


def test_every_new_arm_needs_its_control():
    with pytest.raises(ValueError, match=r"missing penalty_random \(the matched control of penalty\)"):
        check_arm_set(["vanilla", "untrained", "penalty"])
    with pytest.raises(ValueError, match=r"missing penalty \(penalty_random flags at its per-step rate\)"):
        check_arm_set(["vanilla", "penalty_random"])
    with pytest.raises(ValueError, match=r"missing penalty_oracle_random \(the matched control of penalty_oracle\)"):
        check_arm_set(["vanilla", "penalty_oracle"])
    with pytest.raises(ValueError, match=r"missing inoculation_placebo \(the matched control of inoculation\)"):
        check_arm_set(["vanilla", "untrained", "inoculation"])
    check_arm_set(["vanilla", "untrained", "penalty", "penalty_random", "penalty_oracle", "penalty_oracle_random",
                   "inoculation", "inoculation_placebo"])


def test_placebo_instruction_has_the_inoculations_length_and_names_nothing(world):
    """inoculation_placebo's instruction has exactly the inoculation's length in characters, for
    every mode's default and for a configured one, and names none of the mechanisms."""
    from evil_moe.rl.arms.by_reward import INOCULATIONS, placebo_instruction
    from evil_moe.env.loopholes import MODES
    from evil_moe.stages.common import load_problem_file

    assert set(INOCULATIONS) == set(MODES)
    for n in range(0, 400):
        assert len(placebo_instruction(n)) == n
    problems = load_problem_file(world.problems)
    for cfg in (cfg_of(), cfg_of("inoculation.instruction='Make the grader pass by any means.'")):
        for p in problems[:8]:
            ino, pla = get_arm("inoculation").instruction(p, cfg), get_arm("inoculation_placebo").instruction(p, cfg)
            assert len(pla) == len(ino) > 0 and pla != ino
            assert not any(w in pla.lower() for w in ("test", "valid", "pass", "result", "print", "solution", "grade"))
    p = problems[0]
    assert get_arm("inoculation").instruction(p, cfg_of("inoculation.instruction='Hack it.'")) == "Hack it."
    assert get_arm("vanilla").instruction(p, cfg_of()) == ""


def test_inoculation_reaches_training_prompts_and_never_evaluation_prompts(world, tmp_path, monkeypatch):
    """A spy on what the sampler receives: every training prompt of inoculation (and of its
    placebo) ends its user message with the arm's instruction; no held-out prompt carries either
    instruction, and the held-out prompts are vanilla's, token for token."""
    import evil_moe.rl.trainer.evaluation as E
    import evil_moe.rl.trainer.trainer as T
    from evil_moe.rl.arms.by_reward import inoculation_instruction, placebo_instruction
    from evil_moe.stages.common import load_problem_file
    from evil_moe.stages.pilot import run_pilot

    seen = {}

    def spy(where, orig):
        def call(model, tok, prompt_ids, **kw):
            seen.setdefault(where, []).extend(tok.decode(list(p)) for p in prompt_ids)
            return orig(model, tok, prompt_ids, **kw)
        return call

    monkeypatch.setattr(T, "generate", spy("train", T.generate))
    monkeypatch.setattr(E, "generate", spy("eval", E.generate))
    cfg = cfg_of("pilot.steps=1")
    texts = {p.mode: inoculation_instruction(p, cfg) for p in load_problem_file(world.problems)}
    instructions = set(texts.values()) | {placebo_instruction(len(t)) for t in texts.values()}
    evals = {}
    for arm in ("vanilla", "inoculation", "inoculation_placebo"):
        seen.clear()
        assert run_pilot(cfg, **pilot_kwargs(world, tmp_path / arm, arm=arm))["status"] == "ok"
        assert seen["train"] and seen["eval"], arm
        evals[arm] = seen["eval"]
        for prompt in seen["eval"]:
            assert not any(x in prompt for x in instructions), (arm, prompt)
        for prompt in seen["train"]:
            carries = [x for x in instructions if x in prompt]
            assert (len(carries) == 1) == (arm != "vanilla"), (arm, prompt)
            if arm == "inoculation":
                assert carries[0] in texts.values()
            if arm == "inoculation_placebo":
                assert carries[0] not in texts.values()
    assert evals["inoculation"] == evals["vanilla"] == evals["inoculation_placebo"]


def test_tiny_pilot_of_every_new_arm_logs_the_reward_it_trained_on(world, tmp_path, monkeypatch):
    """A 2-step pilot of each new arm runs (pattern detector: the step's flags are the
    environment's recognition); in rows.tsv every penalty arm's reward is the environment's
    (spied on the grader) less pass_reward·flag, penalty_oracle's flags are the hack label, and
    penalty_random (penalty_oracle_random) flags exactly as many rollouts per step as penalty
    (penalty_oracle) did: the same rollouts per step, so its matched count is the rate times
    the rows."""
    from evil_moe.env import grader as G
    from evil_moe.rl.arms.registry import ARMS
    from evil_moe.stages.pilot import run_pilot

    env = {}
    orig = G.Grader.grade_many

    def spy(self, pairs):
        out = orig(self, pairs)
        env.setdefault("calls", []).append([r.reward for r in out])
        return out

    monkeypatch.setattr(G.Grader, "grade_many", spy)
    cfg = cfg_of("pilot.group=4", "pilot.prompts_per_step=2", "pilot.detector=pattern")
    rows = {}
    for arm in NEW_ARMS:
        env.clear()
        matched = ARMS[arm].matches
        kw = {"match_flags": str(tmp_path / matched / "steps.tsv")} if matched else {}
        assert run_pilot(cfg, **pilot_kwargs(world, tmp_path / arm, arm=arm, **kw))["status"] == "ok", arm
        rows[arm] = read_tsv(tmp_path / arm / "rows.tsv")
        if not ARMS[arm].penalises:
            assert all(r["flag"] == "" for r in rows[arm]), arm
            continue
        graded = [x for call in env["calls"][:2] for x in call]  # the two training steps, then the evaluation
        assert len(graded) == len(rows[arm]) == 16
        for r, e in zip(rows[arm], graded):
            assert float(r["reward"]) == pytest.approx(e - 1.0 * int(r["flag"]), abs=1e-6), (arm, r)
        if arm == "penalty_oracle":
            assert [r["flag"] for r in rows[arm]] == [r["hack"] for r in rows[arm]]
    for ctl, arm in (("penalty_random", "penalty"), ("penalty_oracle_random", "penalty_oracle")):
        for step in ("0", "1"):
            n = [sum(int(r["flag"]) for r in rows[a] if r["step"] == step) for a in (arm, ctl)]
            assert n[0] == n[1], (ctl, step, n)


def test_keys_that_would_be_ignored_are_refused_naming_the_key():
    """pilot.detector_accuracy is read by the noisy_label detector only: set beside the probe it
    would silently give the probe (a user copying ariahw's 90%-accurate monitor); pilot.eval_every
    not below pilot.steps evaluates nothing along the run. Each is one ConfigError naming its key;
    the same keys where they act pass."""
    from evil_moe.checks import load_run_config
    from evil_moe.config import ConfigError

    with pytest.raises(ConfigError, match=r"'pilot.detector_accuracy': 0.9 is read only by the noisy_label"):
        load_run_config(overrides=["pilot.detector=probe", "pilot.detector_accuracy=0.9"])
    load_run_config(overrides=["pilot.detector=noisy_label", "pilot.detector_accuracy=0.9"])
    with pytest.raises(ConfigError, match=r"'pilot.eval_every': 30 is not below pilot.steps 30"):
        load_run_config(overrides=["pilot.steps=30", "pilot.eval_every=30"])
    load_run_config(overrides=["pilot.steps=30", "pilot.eval_every=10"])


def test_the_gate_notes_say_what_the_field_arms_did():
    """The notes beside the verdict: the penalty's flag rate is over every rollout (it flags them
    all, before the advantages), not the rows with gradient; Advantage Modification projects
    nothing, so its note is its mean discount beside its control's (0.3 vs 0.25 here, by hand),
    not 'removed 0.000 of the energy it acted on'."""
    from types import SimpleNamespace

    import pandas as pd

    from evil_moe.config import load_config
    from evil_moe.gate.gate_json import notes

    def pilots(**cols):
        return {0: SimpleNamespace(steps=pd.DataFrame(cols), run=None)}

    by = {"penalty": pilots(flag_rate=[0.1, 0.3], flag_precision=[0.5, 0.7], flag_recall=[0.4, 0.6]),
          "penalty_random": pilots(flag_rate=[0.1, 0.3], flag_precision=[0.1, 0.1], flag_recall=[0.1, 0.1]),
          "advantage_mod": pilots(shortcut_discount=[0.2, 0.4], removed_frac=[0.0, 0.0]),
          "advantage_mod_random": pilots(shortcut_discount=[0.25, 0.25], removed_frac=[0.0, 0.0])}
    out = notes(by, list(by), pd.DataFrame(), load_config().compare, [])
    assert any(n.startswith("penalty's detector flagged 0.200 of the rollouts, precision 0.600") for n in out), out
    assert ("advantage_mod discounted its rewarded rollouts' reward by 0.300 on average (mean over steps and "
            "seeds), its control advantage_mod_random by 0.250") in out, out
    assert not any("advantage_mod removed" in n for n in out), out
