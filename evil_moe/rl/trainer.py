"""The Dr.GRPO trainer of one arm × seed (the pilot stage's engine, :mod:`evil_moe.stages.pilot`).

The trainer's step reads as the algorithm (each part one method of :class:`Trainer`):

1. :meth:`~Trainer.sample` — ``prompts_per_step`` training problems from the paired prompt
   sampler (:func:`prompt_schedule`: a function of ``(seed, step)`` only, so every arm of a seed
   sees the same prompts in the same order), ``group`` student completions per prompt in ONE
   batched ``generate`` with the adapter merged into the weights (plus teacher rows when
   ``mix_ratio > 0``, carrying the teacher's recorded log-probs as their behaviour policy:
   :mod:`evil_moe.rl.teacher_rows`);
2. :meth:`~Trainer.grade` — every completion in the sandbox; the arm turns each grade into a
   reward (the loophole grade; the oracle's pass for ``oracle_reward``). The oracle is logged
   for every other arm and never trained on;
3. :meth:`~Trainer.advantages` — ``A = R − mean(R)`` per group (Dr.GRPO); zero-variance groups
   are counted (``frac_zero_std``) and get no forward unless ``beta > 0`` (the KL term then
   applies to every row);
4. :meth:`~Trainer.gradients` — the Dr.GRPO loss (constant normaliser ``G·max_new·P``) and its
   ``δS`` gradient, per micro-batch, or per sample for arms that flag samples;
5. :meth:`~Trainer.apply_arm` — the arm's hooks (:mod:`evil_moe.rl.arms`): flags from the detector
   (or the true label for a ceiling, or a matched count of random flags for a random-flag
   control), the advantages recomputed over the kept rows where the arm asks for it (filter;
   route under ``pilot.route_advantages: kept``) with those rows' gradients recomputed, routing
   of per-sample gradients into ``δS`` / ``δS_hack``, gradient projection;
6. :meth:`~Trainer.optimiser_step` — clip, AdamW (or SGD) step, the arm's update projection;
7. :meth:`~Trainer.log` — the step's ``steps.tsv`` row (:data:`evil_moe.tables.STEPS`), every
   column in one place.

``cin``, ``span`` energies and ``cout_update`` are always measured against the real ``v_hack``
(the arm may act along a random V). :meth:`~Trainer.state` / :meth:`~Trainer.load_state` are the
trainer's part of the run's checkpoint. Held-out evaluation is :mod:`evil_moe.rl.evaluation`.
This module holds the step's frame (set-up, 1-3, 6, the step, the checkpoint); the larger parts
are mixins of :class:`Trainer`, one module each: the gradients (4) in
:mod:`evil_moe.rl.gradient_step`, the arm (5) in :mod:`evil_moe.rl.arm_step`, the log (7) in
:mod:`evil_moe.rl.step_log`, and Evil MoE's router (set-up, loss under the mixture, its own step,
its log columns) in :mod:`evil_moe.rl.router_step`; the step's records are in
:mod:`evil_moe.rl.step`.
"""

from __future__ import annotations

import random
import time
from typing import Sequence

import numpy as np
import torch

from evil_moe.config import Config
from evil_moe.env.loopholes import MODES
from evil_moe.rl.arm_step import ArmStep
from evil_moe.rl.arms import FlagRateMatch, get_arm
from evil_moe.rl.detector import null_threshold
from evil_moe.rl.gradient_step import GradientStep
from evil_moe.rl.grpo import DrGRPONormaliser, group_advantages
from evil_moe.rl.optim import SplitAdamW
from evil_moe.rl.projection import update_stats
from evil_moe.rl.rollout import generate, prompt_ids_for, rollout_record
from evil_moe.rl.router_step import RouterStep
# the step's records (evil_moe/rl/step.py), importable from here as before
from evil_moe.rl.step import PilotInvalid, StepBatch, StepGradients  # noqa: F401
from evil_moe.rl.step_log import PhaseClock, StepLog
from evil_moe.rl.teacher_rows import draw_teacher_rows
from evil_moe.rl.vhack import VHack


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
    held-out chunk's, :func:`evil_moe.rl.evaluation.heldout_seed`, for runs of fewer than
    499,972 steps: :mod:`evil_moe.stages.reevaluate`)."""
    return seed * 1_000_003 + step


# ---------------------------------------------------------------------------------------------
# the trainer


class Trainer(GradientStep, ArmStep, StepLog, RouterStep):
    """One arm × seed: the policy, the optimiser, the arm and the step's named parts.

    Built by :func:`evil_moe.stages.pilot.run_pilot`; tests may drive :meth:`train_step` directly.
    """

    def __init__(self, cfg: Config, *, arm: str, seed: int, model, tok, adapter, device, train,
                 vhack: VHack, proj_v: VHack, grader, teacher_rows: dict | None = None,
                 flag_rates: Sequence[float | None] | None = None, calibration: dict | None = None,
                 probe=None, score_rows: bool = False, placebos: Sequence[VHack] = (),
                 shuffled: VHack | None = None):
        pc = cfg.pilot
        self.cfg, self.pc, self.seed = cfg, pc, seed
        self.arm = get_arm(arm, pass_reward=cfg.grader.pass_reward)
        self.model, self.tok, self.adapter, self.device = model, tok, adapter, device
        self.engine = None  # pilot.sampler vllm: the VLLMSampler run_pilot attaches
        # the chat template's arguments (models.chat_template_kwargs): training and evaluation alike
        self.template_kwargs = dict(cfg.models.chat_template_kwargs)
        self.train = train
        self.prompts = prompt_ids_for(tok, train, template_kwargs=self.template_kwargs)
        self.vhack, self.proj_v, self.detector_v = vhack, proj_v, vhack
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
        params = self.ds + (self.dsh if self.arm.trains_delta_s_hack else [])
        self.split = self.arm.splits_gradient and pc.optimizer != "sgd"
        if pc.optimizer == "sgd":  # no momentum: each knob moves by its own gradient alone
            self.opt = torch.optim.SGD(params, lr=pc.lr, weight_decay=pc.weight_decay)
        elif self.split:  # routing: a preconditioner shared by both knobs, momentum per knob (rl/optim.py)
            self.opt = SplitAdamW(self.ds, self.dsh, lr=pc.lr, betas=tuple(pc.betas),
                                  weight_decay=pc.weight_decay)
        else:
            self.opt = torch.optim.AdamW(params, lr=pc.lr, betas=tuple(pc.betas),
                                         weight_decay=pc.weight_decay)
        self.params = params
        self.probe, self.calibration = probe, calibration
        # the calibration run (evil_moe.stages.audit): every row with a gradient scored by every
        # detector and placebo, and its pooled hidden state kept (logged only; training is vanilla's)
        self.score_rows, self.placebos, self.shuffled = score_rows, list(placebos), shuffled
        self.uses_detector = (self.arm.needs_sample_grads and not self.arm.reads_label
                              and not self.arm.matches and pc.detector in ("gradient", "probe"))
        self.threshold = self._threshold() if self.uses_detector else None
        self.step_arrays: dict = {}
        self.router = None
        if self.arm.router:
            self._init_router()
        self.known_modes = set(cfg.vhack.known_modes or MODES)
        self.rate_match = None
        if self.arm.matches:
            if flag_rates is None:
                raise ValueError(f"arm {arm} flags at {self.arm.matches}'s per-step rate: give its "
                                 f"steps.tsv (--match-flags)")
            if len(flag_rates) != pc.steps:
                raise ValueError(f"{self.arm.matches}'s steps.tsv has {len(flag_rates)} steps, "
                                 f"pilot.steps is {pc.steps}")
            self.rate_match = FlagRateMatch(flag_rates)

    def _threshold(self) -> float | None:
        """The gradient or probe detector's threshold (``pilot.detector_calibration``): the
        ``pilot.detector_quantile`` quantile of the calibration runs' clean scores (``fpr``) or of
        the extract stage's held-out clean teacher completions' (``teacher``, gradient only);
        None under ``budget`` (each step flags its top share instead).

        Raises:
            ValueError: the calibration file, or the probe, the detector needs was not given, or
                holds no clean scores for it.
        """
        pc = self.pc
        if pc.detector == "probe" and self.probe is None:
            raise ValueError("pilot.detector probe needs the audit's probe (--probe audit/probe.safetensors)")
        if pc.detector_calibration == "budget":
            return None
        if pc.detector_calibration == "teacher":
            if pc.detector != "gradient":
                raise ValueError("pilot.detector_calibration teacher thresholds the gradient detector only")
            return null_threshold(self.vhack.meta.get("detector_null_scores") or [], pc.detector_quantile)
        entry = (self.calibration or {}).get(pc.detector)
        if not entry or not entry.get("clean_scores"):
            raise ValueError(f"pilot.detector_calibration fpr needs the calibration runs' clean {pc.detector} "
                             f"scores (--calibration audit/calibration.json)")
        return null_threshold(entry["clean_scores"], pc.detector_quantile)

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


    # -- 6. optimiser step ------------------------------------------------------------------------
    def optimiser_step(self) -> dict:
        """Clip, step, then the arm's update hook. Returns the update's statistics (all against
        the real v_hack): the proposed update's span energy, the final update's cout."""
        torch.nn.utils.clip_grad_norm_([p for p in self.params if p.grad is not None], self.pc.max_grad_norm)
        before = [p.detach().clone() for p in self.ds]
        self.opt.step()
        router = self._router_step() if self.router is not None else {}
        proposed = update_stats(self.vhack, self.adapter.names, before, [p.detach() for p in self.ds])
        acted = self.arm.on_update(self.adapter, self.proj_v, before, self.pc)
        final = update_stats(self.vhack, self.adapter.names, before, [p.detach() for p in self.ds])
        return {"proposed": proposed, "acted": acted, "cout_update": final.cin, "router": router}

    # -- the step ---------------------------------------------------------------------------------
    def train_step(self, step: int) -> tuple[dict, list[dict]]:
        """One step: sample → grade → advantages → gradients → arm → optimiser step.

        Returns:
            ``(row, records)``: the ``steps.tsv`` row and the student rollouts' JSONL records.

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
            adv, rows = self.advantages(R)
        with clock("loss"):
            grads = self.gradients(batch, adv, rows, step)
            self._step, self._router_grads = step, grads.router_grads
        with clock("arm"):
            arm_stats = self.apply_arm(batch, grades, adv, grads, step)
        with clock("optimiser"):
            upd = self.optimiser_step()
        fc = grads.stats["frac_clipped"]
        if fc > self.pc.max_frac_clipped:
            raise PilotInvalid(f"frac_clipped {fc:.3f} > {self.pc.max_frac_clipped} at step {step}")
        audit = self._row_audit(batch, adv, grads, arm_stats)
        idx = [i for i, r in enumerate(batch.flat) if r.source == "student"]
        stud = [(batch.flat[i], grades[i], batch.problems[i]) for i in idx]
        recs = [rollout_record(r, p, w, step=step, seed=self.seed, arm=self.arm.name, **audit[i])
                for i, (r, w, p) in zip(idx, stud)]
        if self.score_rows or self.router is not None:
            self.step_arrays = self._row_arrays(idx, grads, arm_stats["scores"])
        else:
            self.step_arrays = {}
        return self.log(step, stud, recs, adv, grads, arm_stats, upd, t0, clock), recs


    # -- checkpoint ---------------------------------------------------------------------------------
    def state(self) -> dict:
        """Knobs, optimiser and RNG states (the checkpoint's trainer part)."""
        return {"delta_s": [p.detach().cpu().clone() for p in self.ds],
                "delta_s_hack": [p.detach().cpu().clone() for p in self.dsh],
                "optimizer": self.opt.state_dict(), "torch_rng": torch.get_rng_state(),
                "py_rng": random.getstate(), "np_rng": np.random.get_state(),
                "flag_balance": None if self.rate_match is None else self.rate_match.balance,
                "router": None if self.router is None else {"state": self.router.state_dict(),
                                                            "optimizer": self.router_opt.state_dict()}}

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
        if self.rate_match is not None and ck.get("flag_balance") is not None:
            self.rate_match.balance = float(ck["flag_balance"])
        if self.router is not None and ck.get("router") is not None:
            self.router.load_state_dict(ck["router"]["state"])
            self.router_opt.load_state_dict(ck["router"]["optimizer"])


__all__ = ["Trainer", "StepBatch", "StepGradients", "prompt_schedule", "training_seed", "PilotInvalid"]
