"""The trainer's routing, detectors and references, on the tiny toy world: each test
fails when the behaviour it names is broken on purpose.

- one routed row in 20 steps moves δS_hack by no more than that row's own update (the optimiser
  confound: momentum carried into steps where nothing was routed);
- route's kept-row advantages are recomputed over the unflagged rows (not over all rows);
- pilot.detector_quantile sets the threshold (not its default);
- the budget calibration flags the top share of each step; the fpr calibration thresholds at the
  quantile of the calibration runs' clean scores; the realised false-positive rate is logged;
- unflagged rows train both knobs under route_unflagged both (Cloud et al. §4.3);
- route_oracle_dose flags only true hacks, at route's per-step count;
- the untrained reference is evaluated on the same problems and seeds without a step.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from evil_moe.rl.arms.base import FlagInputs
from evil_moe.rl.arms.registry import get_arm
from stage_fixtures import cfg_of, pilot_kwargs, read_tsv, step_with_rows, trainer

pytestmark = pytest.mark.usefixtures("one_thread")


def test_one_routed_row_in_20_steps_moves_the_quarantine_by_no_more_than_its_own_update(world, monkeypatch):
    """route over 20 steps whose detector flags exactly one row (the first row with gradient at
    the first step that has one; nothing at any other step). δS_hack is exactly zero before that
    step; afterwards it moves only by the row's momentum under the shared preconditioner, so its
    final value is the row's own update: ``lr · m̂ / (√v̂ + ε)`` summed over the steps with
    AdamW's bias-corrected momentum weights (worked out here from the recorded gradient, the β's
    and the optimiser's second moment). Under the old per-knob AdamW the
    quarantine kept moving by its own momentum for the rest of the run (route seed 2: ‖δS_hack‖
    7.40 against ‖δS‖ 12.89 after one routed row)."""
    from evil_moe.stages.common import load_problem_file, make_grader

    cfg = cfg_of("pilot.steps=20", "pilot.group=4", "pilot.prompts_per_step=2", "pilot.detector=pattern")
    with make_grader(load_problem_file(world.problems), cfg) as grader:
        t = trainer(world, "route", cfg, grader)
        state = {"done": None}
        orig_gradients = t.gradients

        def one_flag(inputs):
            out = torch.zeros(len(inputs.pattern), dtype=torch.bool)
            if state["done"] is None and len(out):
                out[0] = True
                state["done"] = "pending"
            return out

        captured = {}

        def spy(batch, adv, rows, step):
            g = orig_gradients(batch, adv, rows, step)
            if rows and state["done"] is None:
                captured["row"] = [x.clone() for x in g.per_row[0]]
                captured["step"] = step
            return g

        monkeypatch.setattr(t.arm, "flags", one_flag)
        monkeypatch.setattr(t, "gradients", spy)
        norms, v_hist, grad_norms = [], [], []
        for step in range(20):
            row, _ = t.train_step(step)
            grad_norms.append(row["grad_norm"])
            norms.append(float(torch.sqrt(sum((p.detach() ** 2).sum() for p in t.dsh))))
            v_hist.append([t.opt.state[p]["exp_avg_sq"].clone() for p in t.ds])
    s0 = captured["step"]
    assert all(n == 0.0 for n in norms[:s0]) and norms[s0] > 0
    assert max(grad_norms) < cfg.pilot.max_grad_norm  # no clipping: the update is AdamW's alone
    # the row's own update, from AdamW's formulas: its momentum (1 − β1)·β1^(t − s0)·g_row,
    # bias-corrected at the step count t + 1 (every module has a gradient every step), over the
    # shared second moment
    lr, (b1, b2), eps = cfg.pilot.lr, cfg.pilot.betas, 1e-8
    own = [torch.zeros_like(x) for x in captured["row"]]
    for step in range(s0, 20):
        k = step + 1
        for m, x in enumerate(captured["row"]):
            mom = (1 - b1) * b1 ** (step - s0) * x
            own[m] -= lr * (mom / (1 - b1 ** k)) / ((v_hist[step][m] / (1 - b2 ** k)).sqrt() + eps)
    for p, o in zip(t.dsh, own):
        torch.testing.assert_close(p.detach(), o, rtol=1e-4, atol=1e-7)
    own_norm = float(torch.sqrt(sum((o.double() ** 2).sum() for o in own)))
    assert norms[-1] <= own_norm * (1 + 1e-4)
    assert norms[-1] < 0.5 * float(torch.sqrt(sum((p.detach() ** 2).sum() for p in t.ds)))


@pytest.mark.parametrize("arm", ["filter_oracle", "route_oracle"])
def test_kept_rows_advantages_are_recomputed_over_the_kept_rows(world, arm):
    """After flagging, each kept row's gradient equals its original gradient scaled by A'/A where
    A' = R − mean of its group's KEPT rows' rewards (worked out here); the flagged rows' gradients
    are untouched. Recomputing over all rows (the flagged rows back in the baseline) gives A' = A
    and fails. route keeps this behaviour under route_advantages kept (the default)."""
    from evil_moe.stages.common import load_problem_file, make_grader

    cfg = cfg_of("pilot.group=4", "pilot.prompts_per_step=2")
    with make_grader(load_problem_file(world.problems), cfg) as grader:
        t = trainer(world, arm, cfg, grader)
        batch, grades, R, adv, rows, step = step_with_rows(t)
        grads = t.gradients(batch, adv, rows, step)
        flags = torch.zeros(len(rows), dtype=torch.bool)
        for grp in {i // t.G for i in rows}:  # flag the highest-reward row of each group
            members = [j for j, i in enumerate(rows) if i // t.G == grp]
            flags[max(members, key=lambda j: float(R.reshape(-1)[rows[j]]))] = True
        new = t.arm_step.rebaseline(batch, grades, adv, grads, flags, step, t.gradients)
    Rf, A = R.reshape(-1).tolist(), adv.flat().tolist()
    checked = 0
    for j, i in enumerate(rows):
        if flags[j]:
            assert all(torch.equal(a, b) for a, b in zip(new.per_row[j], grads.per_row[j]))
            continue
        kept = [Rf[k] for jj, k in enumerate(rows) if k // t.G == i // t.G and not flags[jj]]
        a_new = Rf[i] - sum(kept) / len(kept) if len(set(kept)) > 1 else 0.0
        if A[i] == 0:
            continue
        for g_new, g_old in zip(new.per_row[j], grads.per_row[j]):
            torch.testing.assert_close(g_new, g_old * (a_new / A[i]), atol=1e-7, rtol=1e-4)
        checked += a_new != A[i]
    assert checked > 0


def test_detector_quantile_sets_the_threshold(world):
    """The gradient detector's threshold is pilot.detector_quantile of the clean scores it is
    calibrated on: the teacher null (calibration teacher) or the calibration runs' clean scores
    (fpr), worked out with numpy here; a different quantile gives a different threshold."""
    from evil_moe.rl.vhack.direction import VHack
    from evil_moe.stages.common import load_problem_file, make_grader

    null = VHack.load(world.vhack).meta["detector_null_scores"]
    cal = {"gradient": {"clean_scores": [0.05 * i for i in range(21)]}}
    seen = {}
    with make_grader(load_problem_file(world.problems), cfg_of()) as grader:
        for q in (0.5, 0.9):
            t = trainer(world, "route", cfg_of(f"pilot.detector_quantile={q}"), grader)
            assert t.scoring.threshold == pytest.approx(float(np.quantile(null, q)))
            f = trainer(world, "route", cfg_of(f"pilot.detector_quantile={q}", "pilot.detector_calibration=fpr"),
                         grader, calibration=cal)
            assert f.scoring.threshold == pytest.approx(q)  # the quantile of 0, 0.05, ..., 1.0
            seen[q] = t.scoring.threshold
        assert seen[0.5] != seen[0.9]
        with pytest.raises(ValueError, match="--calibration"):
            trainer(world, "route", cfg_of("pilot.detector_calibration=fpr"), grader)
        assert trainer(world, "route", cfg_of("pilot.detector_calibration=budget"), grader).scoring.threshold is None


def test_budget_flags_the_top_share_of_each_step():
    scores = torch.tensor([0.1, 0.9, 0.3, 0.7, 0.5, 0.2, 0.8], dtype=torch.float64)
    inp = FlagInputs(scores, torch.zeros(7, dtype=torch.bool), 0.0, "gradient", np.random.default_rng(0),
                     budget=0.3)
    # ceil(0.3 · 7) = 3 rows: the scores 0.9, 0.8, 0.7
    assert inp.detected().tolist() == [False, True, False, True, False, False, True]
    assert get_arm("route").flags(inp).sum() == 3


def test_dose_matched_ceiling_flags_only_hacks_at_the_matched_count():
    label = torch.tensor([True, False, True, True, False, False])
    inp = FlagInputs(None, torch.zeros(6, dtype=torch.bool), 0.0, "gradient", np.random.default_rng(3),
                     label=label, target_count=2)
    f = get_arm("route_oracle_dose").flags(inp)
    assert int(f.sum()) == 2 and not (f & ~label).any()
    inp.target_count = 5  # more than there are hacks: every hack, nothing else
    assert get_arm("route_oracle_dose").flags(inp).tolist() == label.tolist()


def test_unflagged_rows_train_both_knobs_under_route_unflagged_both():
    from types import SimpleNamespace

    rows = [[torch.tensor([1.0, 0.0])], [torch.tensor([0.0, 2.0])], [torch.tensor([3.0, 3.0])]]
    flags = torch.tensor([True, False, False])
    arm = get_arm("route")
    one = arm.split_gradients(rows, flags, SimpleNamespace(route_unflagged="delta_s"))
    both = arm.split_gradients(rows, flags, SimpleNamespace(route_unflagged="both"))
    assert one.delta_s[0].tolist() == [3.0, 5.0] and one.delta_s_hack[0].tolist() == [1.0, 0.0]
    assert both.delta_s[0].tolist() == [3.0, 5.0] and both.delta_s_hack[0].tolist() == [4.0, 5.0]
    assert one.removed_frac == both.removed_frac == pytest.approx(1.0 / (16 + 25))


def test_route_logs_its_realised_false_positive_rate(world, tmp_path):
    """Every flagging arm's steps.tsv has flag_fpr (flagged clean rows over clean rows with a
    gradient, logged only) and rows.tsv one row per training rollout with its advantage, flag and
    score; route thresholded on calibration scores from a file (fpr) flags by them."""
    import json

    from evil_moe.stages.pilot import run_pilot

    cal = tmp_path / "calibration.json"
    cal.write_text(json.dumps({"gradient": {"clean_scores": [-1.0, -0.5, 0.0]}}))
    cfg = cfg_of("pilot.steps=3", "pilot.detector_calibration=fpr", "pilot.detector_quantile=0.0")
    assert run_pilot(cfg, **pilot_kwargs(world, tmp_path / "route", arm="route",
                                         calibration_path=str(cal)))["status"] == "ok"
    steps = read_tsv(tmp_path / "route" / "steps.tsv")
    rows = read_tsv(tmp_path / "route" / "rows.tsv")
    assert len(rows) == 3 * cfg.pilot.group * cfg.pilot.prompts_per_step
    scored = [r for r in rows if r["scored"] == "1"]
    assert scored, "no rows with gradient in the fixture"
    for r in scored:  # threshold -1.0 (the 0-quantile): flagged exactly when the score is above it
        assert r["flag"] == str(int(float(r["score_gradient"]) > -1.0))
    for r in rows:
        assert (r["scored"] == "1") == (r["zero_variance"] == "0")
    live = [s for s in steps if s["flag_rate"] != ""]
    assert live and all("flag_fpr" in s for s in steps)
    with pytest.raises(ValueError, match="--calibration"):
        run_pilot(cfg, **pilot_kwargs(world, tmp_path / "x", arm="route"))


def test_untrained_reference_is_evaluated_without_a_step(world, tmp_path):
    """The untrained arm takes no step and evaluates the initial student on the same held-out
    problems with the same seeds as every arm: its outcomes equal a held-out evaluation of a
    vanilla trainer before any step (rl.evaluation.evaluate, worked out directly)."""
    from evil_moe.rl.trainer.evaluation import evaluate
    from evil_moe.stages.common import load_problem_file, make_grader, train_heldout
    from evil_moe.stages.pilot import run_pilot

    cfg = cfg_of("pilot.heldout_samples=2")
    status = run_pilot(cfg, **pilot_kwargs(world, tmp_path / "untrained", arm="untrained"))
    assert status["status"] == "ok" and status["role"] == "reference"
    steps = read_tsv(tmp_path / "untrained" / "steps.tsv")
    outcomes = read_tsv(tmp_path / "untrained" / "outcomes.tsv")
    assert steps == [] and outcomes
    problems = load_problem_file(world.problems)
    _, heldout = train_heldout(problems, cfg)
    with make_grader(problems, cfg) as grader:
        t = trainer(world, "vanilla", cfg, grader)
        _, ref = evaluate(t, heldout, -1, [p.detach().clone() for p in t.ds])
    key = ("problem_id", "sample", "hack", "pass", "truncated")
    assert [tuple(str(o[k]) for k in key) for o in ref] == [tuple(o[k] for k in key) for o in outcomes]
    assert {o["step"] for o in outcomes} == {"-1"}


def test_the_template_kwargs_reach_the_trainers_prompts_the_pin_bank_and_the_evaluation(world, monkeypatch):
    """models.chat_template_kwargs with a Qwen3 template (enable_thinking false): the training
    prompts, Evil MoE's pin bank and the held-out evaluation's prompts all end in the closed,
    empty think block that the template writes only when given the argument."""
    from evil_moe.rl.trainer import evaluation
    from evil_moe.rl.trainer.trainer import Trainer
    from evil_moe.rl.vhack.direction import VHack
    from evil_moe.stages.common import load_policy, load_problem_file, make_grader, train_heldout
    from test_model_load import QWEN3_GENERATION_PROMPT

    cfg = cfg_of("models.chat_template_kwargs={enable_thinking: false}")
    problems = load_problem_file(world.problems)
    train, heldout = train_heldout(problems, cfg)
    model, tok, adapter, device = load_policy(str(world.student), cfg)
    tok.chat_template = QWEN3_GENERATION_PROMPT
    think = tok.encode("<think>\n\n</think>\n\n", add_special_tokens=False)
    seen = []
    monkeypatch.setattr(evaluation, "generate", lambda m, t, prompts, **kw: seen.extend(prompts) or [])
    real = VHack.load(world.vhack)
    with make_grader(problems, cfg) as grader:
        t = Trainer(cfg, arm="moe", seed=0, model=model, tok=tok, adapter=adapter, device=device,
                    train=train, vhack=real, proj_v=real, grader=grader)
        evaluation.evaluate(t, heldout, 0, [p.detach().clone() for p in t.ds])
    for prompts in (t.prompts, t.router_step.pin_bank.prompt_ids, seen):
        assert prompts and all(p[-len(think):] == think for p in prompts)


def test_a_mostly_truncated_first_step_stops_the_pilot_naming_max_new_and_the_template(world, tmp_path):
    """pilot.max_truncated_first_step: with max_new 2 every rollout of step 0 is cut (a
    two-token answer has no eos), so the pilot stops at step 0 with one line naming the share,
    pilot.max_new and the chat template's arguments, and status.json says why; at 1.0 (or
    null, the default) the same run trains."""
    import json

    from evil_moe.rl.trainer.step import PilotInvalid
    from evil_moe.stages.pilot import run_pilot

    cfg = cfg_of("pilot.max_new=2", "pilot.steps=1", "pilot.max_truncated_first_step=0.5")
    with pytest.raises(PilotInvalid, match=r"^step 0: 6 of 6 rollouts hit pilot.max_new 2 without an eos "
                                           r".*models.chat_template_kwargs.*now \{\}.* raise pilot.max_new$"):
        run_pilot(cfg, **pilot_kwargs(world, tmp_path / "cut", arm="vanilla"))
    status = json.loads((tmp_path / "cut" / "status.json").read_text())
    assert status["status"] == "invalid" and "pilot.max_new" in status["reason"]
    ok = cfg_of("pilot.max_new=2", "pilot.steps=1", "pilot.max_truncated_first_step=1.0")
    assert run_pilot(ok, **pilot_kwargs(world, tmp_path / "ok", arm="vanilla"))["status"] == "ok"
