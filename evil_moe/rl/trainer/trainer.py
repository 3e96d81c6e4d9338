"""The Dr.GRPO trainer of one arm × seed (the pilot stage's engine, :mod:`evil_moe.stages.pilot`).

:meth:`Trainer.train_step` reads as the algorithm, one method per step:

1. :meth:`~Trainer.sample` — ``prompts_per_step`` training problems from the paired prompt
   sampler (:func:`prompt_schedule`: a function of ``(seed, step)`` only, so every arm of a seed
   sees the same prompts in the same order; the arm's instruction, inoculation's, is appended
   to the training prompts only), ``group`` student completions per prompt in ONE
   batched ``generate`` with the adapter merged into the weights (plus teacher rows when
   ``mix_ratio > 0``, carrying the teacher's recorded log-probs as their behaviour policy:
   :mod:`evil_moe.rl.policy.teacher_rows`);
2. :meth:`~Trainer.grade` — every completion in the sandbox; the arm turns each grade into a
   reward (the loophole grade; the oracle's pass for ``oracle_reward``). The oracle is logged
   for every other arm and never trained on. A penalising arm (the monitor penalty) then flags
   every rollout and takes its penalty off the flagged ones' reward
   (:meth:`~evil_moe.rl.trainer.arm_step.ArmStep.shape_rewards`): the advantages, the gradient
   and the logged ``reward`` are those of the penalised reward;
3. :meth:`~Trainer.advantages` — ``A = R − mean(R)`` per group (Dr.GRPO); zero-variance groups
   are counted (``frac_zero_std``) and get no forward unless ``beta > 0`` (the KL term then
   applies to every row). Advantage Modification's arms take them over the rewards discounted by
   the rollouts' shortcut scores (:class:`~evil_moe.rl.trainer.advantage_step.ShortcutStep`);
4. :meth:`~Trainer.gradients` — the Dr.GRPO loss (constant normaliser ``G·max_new·P``) and its
   ``δS`` gradient, per micro-batch, or per sample for arms that flag samples
   (:class:`~evil_moe.rl.trainer.gradient_step.GradientStep`), or under Evil MoE's router
   (:class:`~evil_moe.rl.trainer.router_step.RouterStep`);
5. :meth:`~Trainer.apply_arm` — the arm's hooks (:class:`~evil_moe.rl.trainer.arm_step.ArmStep`):
   flags from the detector (or the true label for a ceiling, or a matched count of random flags
   for a random-flag control), the advantages recomputed over the kept rows where the arm asks
   for it (filter; route under ``pilot.route_advantages: kept``) with those rows' gradients
   recomputed, routing of per-sample gradients into ``δS`` / ``δS_hack``, gradient projection;
6. :meth:`~Trainer.optimiser_step` — clip, AdamW (or SGD) step, the router's step, the arm's
   update projection;
7. :meth:`~Trainer.log` — the step's ``steps.tsv`` row (:func:`evil_moe.rl.trainer.step_log.step_row`,
   :data:`evil_moe.tables.STEPS`, every column in one place).

The parts are components with explicit inputs, built once in :meth:`Trainer.__init__`: the
gradients (:class:`~evil_moe.rl.trainer.gradient_step.GradientStep`), the arm's part
(:class:`~evil_moe.rl.trainer.arm_step.ArmStep`, with what the rows are scored with:
:class:`~evil_moe.rl.trainer.arm_step.Scoring`) and Evil MoE's router
(:class:`~evil_moe.rl.trainer.router_step.RouterStep`); each step's values pass between them as
the records of :mod:`evil_moe.rl.trainer.step`. ``cin``, ``span`` energies and ``cout_update``
are always measured against the real ``v_hack`` (the arm may act along a random V).
:meth:`~Trainer.state` / :meth:`~Trainer.load_state` are the trainer's part of the run's
checkpoint. Held-out evaluation is :mod:`evil_moe.rl.trainer.evaluation`.
"""

from __future__ import annotations

import random
import time
from typing import Sequence

import numpy as np
import torch

from evil_moe.config import Config
from evil_moe.env.loopholes import MODES
from evil_moe.rl.arms.base import DoseMatch, FlagRateMatch
from evil_moe.rl.arms.registry import get_arm
from evil_moe.rl.policy.grpo import DrGRPONormaliser, group_advantages
from evil_moe.rl.policy.optim import SplitAdamW
from evil_moe.rl.policy.rollout import generate, prompt_ids_for, rollout_record
from evil_moe.rl.policy.teacher_rows import draw_teacher_rows
from evil_moe.rl.trainer.advantage_step import ShortcutStep
from evil_moe.rl.trainer.arm_step import ArmStep, Scoring
from evil_moe.rl.trainer.gradient_step import GradientStep
from evil_moe.rl.trainer.router_step import RouterStep
from evil_moe.rl.trainer.step import PilotInvalid, StepBatch, StepGradients
from evil_moe.rl.trainer.step_log import PhaseClock, row_arrays, row_audit, step_row
from evil_moe.rl.vhack.direction import VHack
from evil_moe.rl.vhack.projection import update_stats


def prompt_schedule(n_problems: int, prompts_per_step: int, seed: int, step: int) -> list[int]:
    """Indices of the training problems used at ``step`` (the paired prompt sampler).

    Epoch-wise permutations drawn from ``numpy.random.default_rng([seed, epoch])``: a pure function
    of ``(seed, step)``, independent of arm and of model sampling, so every arm of a seed sees
    the same prompts in the same order and a resumed run needs no sampler state.

    Raises:
        ValueError: no problems.
    """
    if n_problems < 1:
        raise ValueError("no training problems")
    out = []
    pos = step * prompts_per_step
    while len(out) < prompts_per_step:
        epoch, offset = divmod(pos, n_problems)
        perm = np.random.default_rng([seed, epoch]).permutation(n_problems)
        out.append(int(perm[offset]))
        pos += 1
    return out


def training_seed(seed: int, step: int) -> int:
    """The sampling seed of a training step: ``1_000_003·seed + step`` (distinct from every
    held-out chunk's, :func:`evil_moe.rl.trainer.evaluation.heldout_seed`, for runs of fewer than
    499,972 steps: :mod:`evil_moe.stages.reevaluate`)."""
    return seed * 1_000_003 + step


# ---------------------------------------------------------------------------------------------
# the trainer


class Trainer:
    """One arm × seed: the policy, the optimiser, the arm and the step's named parts.

    Built by :func:`evil_moe.stages.pilot.run_pilot`; tests may drive :meth:`train_step` directly.

    Args:
        cfg: the run config.
        arm, seed: a name of :data:`evil_moe.rl.arms.registry.ARMS`; the run seed.
        model, tok, adapter, device: the policy.
        train: the training problems.
        vhack: the v_hack every arm is measured against (the gradient detector reads it too).
        proj_v: the V the arm acts along.
        grader: the sandboxed grader.
        teacher_rows: the teacher's rows by problem (``pilot.mix_ratio > 0``).
        flag_rates: the matched arm's per-step flag rates (a random-flag control).
        calibration, fitted: the detector audit's ``calibration.json`` and the run's detector's
            fitted input (the probe: :attr:`evil_moe.rl.detectors.registry.Detector.fitted`).
        score_rows, placebos, shuffled: a calibration run (every row scored by every detector and
            placebo; training is vanilla's).

    Raises:
        ValueError: a detector input or the matched arm's flag rates missing or of another length.
    """

    def __init__(self, cfg: Config, *, arm: str, seed: int, model, tok, adapter, device, train,
                 vhack: VHack, proj_v: VHack, grader, teacher_rows: dict | None = None,
                 flag_rates: Sequence[float | None] | None = None, calibration: dict | None = None,
                 fitted=None, score_rows: bool = False, placebos: Sequence[VHack] = (),
                 shuffled: VHack | None = None):
        pc = cfg.pilot
        self.cfg, self.pc, self.seed = cfg, pc, seed
        self.arm = get_arm(arm, pass_reward=cfg.grader.pass_reward)
        self.model, self.tok, self.adapter, self.device = model, tok, adapter, device
        self.engine = None  # pilot.sampler vllm: the VLLMSampler run_pilot attaches
        # the chat template's arguments (models.chat_template_kwargs): training and evaluation alike
        self.template_kwargs = dict(cfg.models.chat_template_kwargs)
        self.train = train
        # the training prompts, with the arm's instruction where it has one (inoculation); the
        # held-out evaluation forms its own, plain (evil_moe.rl.trainer.evaluation)
        self.prompts = [prompt_ids_for(tok, [p], elicit=self.arm.instruction(p, cfg),
                                       template_kwargs=self.template_kwargs)[0] for p in train]
        self.vhack, self.proj_v = vhack, proj_v
        self.grader = grader
        self.G, self.P = pc.group, pc.prompts_per_step
        self.n_teacher = int(round(pc.mix_ratio * self.G))
        self.teacher_rows = teacher_rows or {}
        self.normaliser = DrGRPONormaliser(self.G, pc.max_new, self.P)
        self.ds, self.dsh = adapter.delta_s_params(), adapter.delta_s_hack_params()
        for p in self.ds:
            p.requires_grad_(True)
        for p in self.dsh:
            p.requires_grad_(False)  # its gradient is only ever written by the arm
        self.params = self.ds + (self.dsh if self.arm.trains_delta_s_hack else [])
        self.opt = self._optimiser()
        self.router_step = (RouterStep(cfg, kind=self.arm.router, seed=seed, model=model, tok=tok,
                                       adapter=adapter, device=device, normaliser=self.normaliser)
                            if self.arm.router else None)
        self.shortcut_step = (ShortcutStep(cfg, arm=self.arm, seed=seed, model=model, tok=tok, adapter=adapter,
                                           device=device) if self.arm.shortcut else None)
        self.scoring = Scoring.of(pc, arm=self.arm, vhack=vhack, known_modes=cfg.vhack.known_modes or MODES,
                                  calibration=calibration, fitted=fitted, score_rows=score_rows,
                                  placebos=placebos, shuffled=shuffled,
                                  placebo_dirs=self.router_step.placebo_dirs if self.router_step is not None else None)
        self.gradient_step = GradientStep(model=model, tok=tok, adapter=adapter, device=device, pc=pc,
                                          normaliser=self.normaliser, mixes_teacher=bool(self.n_teacher))
        self.arm_step = ArmStep(self.arm, pc, seed=seed, adapter=adapter, optimizer=self.opt, P=self.P,
                                G=self.G, scoring=self.scoring, rate_match=self._rate_match(flag_rates),
                                penalty=cfg.penalty)
        self.step_arrays: dict = {}

    def _optimiser(self) -> torch.optim.Optimizer:
        """SGD (``pilot.optimizer: sgd``: no momentum, each knob moves by its own gradient alone),
        :class:`~evil_moe.rl.policy.optim.SplitAdamW` for a routing arm (a preconditioner shared
        by both knobs, momentum per knob), else AdamW over :attr:`params`."""
        pc = self.pc
        if pc.optimizer == "sgd":
            return torch.optim.SGD(self.params, lr=pc.lr, weight_decay=pc.weight_decay)
        if self.arm.splits_gradient:
            return SplitAdamW(self.ds, self.dsh, lr=pc.lr, betas=tuple(pc.betas), weight_decay=pc.weight_decay)
        return torch.optim.AdamW(self.params, lr=pc.lr, betas=tuple(pc.betas), weight_decay=pc.weight_decay)

    def _rate_match(self, flag_rates) -> FlagRateMatch | None:
        """A random-flag control's matched count from its matched arm's per-step rates; None for
        the other arms.

        Raises:
            ValueError: the rates are missing or not one per step.
        """
        if not self.arm.matches:
            return None
        if flag_rates is None:
            raise ValueError(f"arm {self.arm.name} flags at {self.arm.matches}'s per-step rate: give its "
                             f"steps.tsv (--match-flags)")
        if len(flag_rates) != self.pc.steps:
            raise ValueError(f"{self.arm.matches}'s steps.tsv has {len(flag_rates)} steps, "
                             f"pilot.steps is {self.pc.steps}")
        return (DoseMatch if self.arm.match_by == "dose" else FlagRateMatch)(flag_rates)

    # -- 1. sample ------------------------------------------------------------------------------
    def sample(self, step: int) -> StepBatch:
        """The step's prompts and rollouts (student rows sampled here, teacher rows drawn)."""
        idx = prompt_schedule(len(self.train), self.P, self.seed, step)
        n_student = self.G - self.n_teacher
        rolls = generate(self.model, self.tok, [self.prompts[i] for i in idx], n=n_student,
                         max_new=self.pc.max_new, temperature=self.pc.temperature, top_p=self.pc.top_p,
                         seed=training_seed(self.seed, step), adapter=self.adapter, source="student",
                         engine=self.engine)
        flat = []
        for j, i in enumerate(idx):
            flat += rolls[j * n_student:(j + 1) * n_student]
            if self.n_teacher:
                flat += draw_teacher_rows(self.teacher_rows, self.train[i].id, self.n_teacher,
                                          self.seed, step, j, self.prompts[i])
        return StepBatch(idx, flat, [self.train[i] for i in idx for _ in range(self.G)])

    def _check_truncation(self, batch: StepBatch) -> None:
        """Stop a run whose first step is mostly truncated (``pilot.max_truncated_first_step``):
        rollouts cut at ``max_new`` carry no code, so no reward and no gradient.

        Raises:
            PilotInvalid: one line naming the share, ``pilot.max_new`` and the chat template.
        """
        limit = self.pc.max_truncated_first_step
        student = [r for r in batch.flat if r.source == "student"]
        cut = sum(bool(r.truncated) for r in student)
        if limit is None or not student or cut <= limit * len(student):
            return
        thinks = sum("<think>" in r.text for r in student if r.truncated)
        raise PilotInvalid(
            f"step 0: {cut} of {len(student)} rollouts hit pilot.max_new {self.pc.max_new} without "
            f"an eos (more than pilot.max_truncated_first_step {limit:g})"
            + (f", {thinks} of them thinking (<think>)" if thinks else "")
            + ": a model that runs past max_new, e.g. thinking under its chat template, gets no "
            "reward; turn thinking off in the template (models.chat_template_kwargs, Qwen3: "
            f"{{enable_thinking: false}}; now {self.template_kwargs or {}}) or raise pilot.max_new")

    # -- 2. grade ---------------------------------------------------------------------------------
    def grade(self, batch: StepBatch) -> tuple[list, torch.Tensor]:
        """Grades of every row and the arm's rewards ``(P, G)``."""
        grades = self.grader.grade_many([(p, r.text) for p, r in zip(batch.problems, batch.flat)])
        R = torch.tensor([self.arm.reward(w) for w in grades], dtype=torch.float32).reshape(self.P, self.G)
        return grades, R

    # -- 3. advantages ----------------------------------------------------------------------------
    def advantages(self, R: torch.Tensor):
        """Dr.GRPO advantages and the rows that get a forward (variance, or every row with KL)."""
        adv = group_advantages(R, scale_std=self.pc.scale_std)
        keep = adv.row_mask() if self.pc.beta == 0 else torch.ones(R.numel(), dtype=torch.bool)
        return adv, [i for i in range(R.numel()) if keep[i]]

    # -- 4. gradients -----------------------------------------------------------------------------
    def gradients(self, batch: StepBatch, adv, rows: list[int], step: int, *,
                  scoring: bool = False) -> StepGradients:
        """Loss and gradients of ``rows``: under the router's mixture for Evil MoE's arms
        (:meth:`~evil_moe.rl.trainer.router_step.RouterStep.gradients`), else the policy's
        (:class:`~evil_moe.rl.trainer.gradient_step.GradientStep`), per sample for an arm that
        flags samples and where a detector it is scored with needs them, with the pooled hidden
        states where one needs those (:meth:`~evil_moe.rl.trainer.arm_step.Scoring.needs`). A
        penalising arm's detector scores the rows in its own pass before the advantages
        (``scoring``, :meth:`~evil_moe.rl.trainer.arm_step.ArmStep.shape_rewards`): its step's
        pass then keeps neither.

        Raises:
            PilotInvalid: a non-finite loss.
        """
        if self.router_step is not None:
            return self.router_step.gradients(batch, adv, rows, step)
        scores_here = scoring or not self.arm.penalises
        return self.gradient_step(batch, adv, rows, step,
                                  per_sample=self.arm.needs_sample_grads or (scores_here and self.scoring.needs("sample_grads")),
                                  need_hidden=scores_here and self.scoring.needs("hidden"), vhack=self.vhack)

    # -- 5. the arm -------------------------------------------------------------------------------
    def apply_arm(self, batch: StepBatch, grades, adv, grads: StepGradients, step: int) -> dict:
        """The arm's part of the step (:meth:`~evil_moe.rl.trainer.arm_step.ArmStep.apply`): writes
        ``δS.grad`` (and ``δS_hack.grad``); returns the arm's statistics for the log."""
        return self.arm_step.apply(batch, grades, adv, grads, step, vhack=self.vhack, proj_v=self.proj_v,
                                   gradients=self.gradients)

    # -- 6. optimiser step ------------------------------------------------------------------------
    def optimiser_step(self, grads: StepGradients, step: int) -> dict:
        """Clip, step, the router's step (its GRPO gradient ``grads.router_grads``), then the
        arm's update hook. Returns the update's statistics (all against the real v_hack): the
        proposed update's span energy, the final update's cout, the router's state."""
        torch.nn.utils.clip_grad_norm_([p for p in self.params if p.grad is not None], self.pc.max_grad_norm)
        before = [p.detach().clone() for p in self.ds]
        self.opt.step()
        router = self.router_step.step(grads.router_grads, step) if self.router_step is not None else {}
        proposed = update_stats(self.vhack, self.adapter.names, before, [p.detach() for p in self.ds])
        acted = self.arm.on_update(self.adapter, self.proj_v, before, self.pc)
        final = update_stats(self.vhack, self.adapter.names, before, [p.detach() for p in self.ds])
        return {"proposed": proposed, "acted": acted, "cout_update": final.cin, "router": router}

    # -- 7. log -----------------------------------------------------------------------------------
    def log(self, step: int, stud, recs: list[dict], adv, grads: StepGradients, arm_stats: dict, upd: dict,
            t0: float, clock: PhaseClock, shortcut: dict | None = None) -> dict:
        """The step's ``steps.tsv`` row (:func:`evil_moe.rl.trainer.step_log.step_row`; ``shortcut``:
        Advantage Modification's columns, :meth:`~evil_moe.rl.trainer.advantage_step.ShortcutStep.log_columns`)."""
        router = (RouterStep.log_columns(recs, arm_stats.get("hack_expert_share"), upd["router"])
                  if self.router_step is not None else {})
        return step_row(step, arm=self.arm.name, seed=self.seed, stud=stud, recs=recs, adv=adv, grads=grads,
                        arm_stats=arm_stats, upd=upd, knobs=(self.ds, self.dsh), router={**router, **(shortcut or {})}, t0=t0,
                        clock=clock)

    # -- the step ---------------------------------------------------------------------------------
    def train_step(self, step: int) -> tuple[dict, list[dict]]:
        """One step: sample → grade → advantages → gradients → arm → optimiser step → log.

        Returns:
            ``(row, records)``: the ``steps.tsv`` row and the student rollouts' JSONL records
            (with what the detector audit reads: :func:`evil_moe.rl.trainer.step_log.row_audit`);
            :attr:`step_arrays` holds a calibration run's (or a router arm's) per-row arrays.

        Raises:
            PilotInvalid: non-finite loss, or ``frac_clipped`` above the bound (names the step).
        """
        t0 = time.time()
        clock = PhaseClock()
        with clock("sample"):
            batch = self.sample(step)
        if step == 0:
            self._check_truncation(batch)
        with clock("grade"):
            grades, R = self.grade(batch)
        shaped = {}
        if self.arm.penalises:  # a reward intervention: flags, then R − penalty, before the advantages
            with clock("arm"):
                R, shaped = self.arm_step.shape_rewards(batch, grades, R, step, gradients=self.gradients)
        shortcut = None
        if self.shortcut_step is not None:  # Advantage Modification: the rewards the advantages see
            with clock("arm"):
                R_adv, shortcut = self.shortcut_step.rewards(batch, R)
        with clock("grade"):
            adv, rows = self.advantages(R if shortcut is None else R_adv)
        with clock("loss"):
            grads = self.gradients(batch, adv, rows, step)
        with clock("arm"):
            arm_stats = {**self.apply_arm(batch, grades, adv, grads, step), **shaped}
        with clock("optimiser"):
            upd = self.optimiser_step(grads, step)
        fc = grads.stats["frac_clipped"]
        if fc > self.pc.max_frac_clipped:
            raise PilotInvalid(f"frac_clipped {fc:.3f} > {self.pc.max_frac_clipped} at step {step}")
        audit = row_audit(batch, adv, grads, arm_stats, self.G)
        idx = [i for i, r in enumerate(batch.flat) if r.source == "student"]
        stud = [(batch.flat[i], grades[i], batch.problems[i]) for i in idx]
        recs = [rollout_record(r, p, w, step=step, seed=self.seed, arm=self.arm.name, **audit[i])
                for i, (r, w, p) in zip(idx, stud)]
        arm_reward = R.flatten().tolist()
        for i, rec in zip(idx, recs):  # the reward training used (the arm's), not the grader's
            rec["reward"] = arm_reward[i]
        cols = {}
        if shortcut is not None:
            for i, rec in zip(idx, recs):
                rec["shortcut_score"] = float(shortcut["score"][i])
                rec["shortcut_discount"] = float(shortcut["discount"][i])
            cols = ShortcutStep.log_columns(shortcut, R, self.advantages(R)[0], adv, recs, idx)
        self.step_arrays = self._row_arrays(idx, grads, arm_stats["scores"])
        return self.log(step, stud, recs, adv, grads, arm_stats, upd, t0, clock, shortcut=cols), recs

    def _row_arrays(self, idx: list[int], grads: StepGradients, scores: dict) -> dict:
        """A calibration run's or a router arm's per-row arrays (:func:`~evil_moe.rl.trainer.step_log.row_arrays`),
        else nothing."""
        sc = self.scoring
        if not sc.score_rows and self.router_step is None:
            return {}
        return row_arrays(idx, grads, scores, width=self.model.get_output_embeddings().in_features,
                          n_placebo=len(sc.placebos) if sc.score_rows else len(sc.placebo_dirs))

    # -- checkpoint ---------------------------------------------------------------------------------
    def state(self) -> dict:
        """Knobs, optimiser and RNG states (the checkpoint's trainer part)."""
        return {"delta_s": [p.detach().cpu().clone() for p in self.ds],
                "delta_s_hack": [p.detach().cpu().clone() for p in self.dsh],
                "optimizer": self.opt.state_dict(), "torch_rng": torch.get_rng_state(),
                "py_rng": random.getstate(), "np_rng": np.random.get_state(),
                "flag_balance": self.arm_step.state(),
                "router": None if self.router_step is None else self.router_step.state(),
                "shortcut": None if self.shortcut_step is None else self.shortcut_step.state()}

    def load_state(self, ck: dict) -> None:
        """Restore :meth:`state`."""
        with torch.no_grad():
            for p, v in zip(self.ds, ck["delta_s"]):
                p.copy_(v)
            for p, v in zip(self.dsh, ck["delta_s_hack"]):
                p.copy_(v)
        self.opt.load_state_dict(ck["optimizer"])
        torch.set_rng_state(ck["torch_rng"])
        random.setstate(ck["py_rng"])
        np.random.set_state(ck["np_rng"])
        self.arm_step.load_state(ck.get("flag_balance"))
        if self.router_step is not None and ck.get("router") is not None:
            self.router_step.load_state(ck["router"])
        if self.shortcut_step is not None and ck.get("shortcut") is not None:
            self.shortcut_step.load_state(ck["shortcut"])


__all__ = ["Trainer", "prompt_schedule", "training_seed"]
