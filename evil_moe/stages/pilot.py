"""Stage ``pilot``: one Dr.GRPO training run of one arm and one seed.

The trainer's step reads as the algorithm (each part one method of :class:`Trainer`):

1. :meth:`~Trainer.sample` — ``prompts_per_step`` training problems from the paired prompt
   sampler (:func:`prompt_schedule`: a function of ``(seed, step)`` only, so every arm of a seed
   sees the same prompts in the same order), ``group`` student completions per prompt in ONE
   batched ``generate`` with the adapter merged into the weights (plus teacher rows when
   ``mix_ratio > 0``, carrying the teacher's recorded log-probs as their behaviour policy);
2. :meth:`~Trainer.grade` — every completion in the sandbox; the arm turns each grade into a
   reward (the loophole grade; the oracle's pass for ``oracle_reward``). The oracle is logged
   for every other arm and never trained on;
3. :meth:`~Trainer.advantages` — ``A = R − mean(R)`` per group (Dr.GRPO); zero-variance groups
   are counted (``frac_zero_std``) and get no forward unless ``beta > 0`` (the KL term then
   applies to every row);
4. :meth:`~Trainer.gradients` — the Dr.GRPO loss (constant normaliser ``G·max_new·P``) and its
   ``δS`` gradient, per micro-batch, or per sample for arms that flag samples;
5. :meth:`~Trainer.apply_arm` — the arm's hooks (:mod:`evil_moe.arms`): flags from the detector
   (or the true label for a ceiling, or a matched count of random flags for a random-flag
   control), the advantages recomputed over the kept rows where the arm asks for it (filter;
   route under ``pilot.route_advantages: kept``) with those rows' gradients recomputed, routing
   of per-sample gradients into ``δS`` / ``δS_hack``, gradient projection;
6. :meth:`~Trainer.optimiser_step` — clip, AdamW (or SGD) step, the arm's update projection;
7. :meth:`~Trainer.log` and the checkpoint.

``cin``, ``span`` energies and ``cout_update`` are always measured against the real ``v_hack``
(the arm may act along a random V). Held-out evaluation (:func:`evaluate`) samples the same
held-out problems with the same seeds for every arm of a seed (paired), in each of the arm's
views, and writes every completion's outcome.

Outputs in ``out_dir``: ``steps.tsv`` (:data:`evil_moe.tables.STEPS`), ``eval.tsv``
(:data:`evil_moe.tables.EVAL`, per view × mode), ``outcomes.tsv``
(:data:`evil_moe.tables.OUTCOMES`, one row per held-out completion), ``rollouts.jsonl.gz``,
``adapter.safetensors`` and ``status.json`` (written last). While running:
``steps.partial.tsv`` and ``checkpoint.pt``. A rerun of the same command resumes from the
checkpoint and produces the same ``steps.tsv`` (every column but ``seconds``) as an
uninterrupted run.

Stop rules: a step with ``frac_clipped > pilot.max_frac_clipped`` makes the run invalid
(``status.json`` says why, exit non-zero); a non-finite loss stops the run naming the step.
SIGTERM / SIGUSR1 (Slurm's warnings) write a checkpoint at the end of the current step; SIGTERM
then exits (143) so a requeued job resumes.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import random
import shutil
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

import numpy as np
import torch

from evil_moe import grpo, runlock, tables
from evil_moe.arms import FlagInputs, FlagRateMatch, get_arm, kept_advantages
from evil_moe.config import Config
from evil_moe.detector import flag_quality, gradient_scores, null_threshold, pattern_flag
from evil_moe.env.grade import extract_code
from evil_moe.grpo import (DrGRPONormaliser, RolloutBatch, behaviour_logp, group_advantages,
                           source_gradients)
from evil_moe.model.logprobs import token_logprobs
from evil_moe.projection import measure_grads, project_vector, update_stats
from evil_moe.rollout import Rollout, generate
from evil_moe.stages.common import (code_parses, load_policy, load_problem_file, make_grader,
                                    prompt_ids_for, rates, require_file, rollout_record,
                                    train_heldout)
from evil_moe.vhack import VHack

# pilot keys that do not change what one (arm, seed) run computes: left out of its checkpoint key
RUN_INDEPENDENT = ("arms", "seeds", "fail_arm", "fail_once_arm")


class PilotInvalid(RuntimeError):
    """The run broke a validity rule (clip fraction, non-finite loss); ``status.json`` says which."""


class PilotInterrupted(RuntimeError):
    """SIGTERM arrived; a checkpoint was written and the run can be resumed."""


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


def _flat_norm(tensors) -> float:
    return float(torch.sqrt(sum((t.detach().float() ** 2).sum() for t in tensors))) if tensors else 0.0


class _PhaseClock:
    """Wall-clock seconds per named phase of a step (``steps.tsv`` ``seconds_<phase>``)."""

    def __init__(self):
        self.seconds: dict[str, float] = {}

    @contextlib.contextmanager
    def __call__(self, phase: str):
        t = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[phase] = self.seconds.get(phase, 0.0) + time.perf_counter() - t


class _Signals:
    """Record SIGTERM/SIGUSR1 so the loop can checkpoint at the end of the current step."""

    def __init__(self):
        self.term = False
        self.usr1 = False
        self._old = {}

    def __enter__(self):
        for sig, attr in ((signal.SIGTERM, "term"), (signal.SIGUSR1, "usr1")):
            try:
                self._old[sig] = signal.signal(sig, lambda *_a, a=attr: setattr(self, a, True))
            except ValueError:  # not the main thread (e.g. a test runner thread)
                pass
        return self

    def __exit__(self, *exc):
        for sig, old in self._old.items():
            signal.signal(sig, old)


# ---------------------------------------------------------------------------------------------
# the data of one step


@dataclass
class StepBatch:
    """The rollouts of one step: ``idx`` (P training-problem indices), ``flat`` (P·G rollouts,
    prompt-major, student rows then teacher rows per group) and ``problems`` (one per row)."""

    idx: list[int]
    flat: list[Rollout]
    problems: list


@dataclass
class StepGradients:
    """The loss and its ``δS`` gradient for the rows with gradient (``rows``, indices into the
    step's flat rollouts).

    ``total``: per-module ``(r,)`` summed gradient; ``per_row``: per-sample gradients (flagging
    arms) or None; ``loss``; loss statistics merged over micro-batches (``frac_clipped``, ratio
    quantiles, ``kl``, sampler gaps); ``cin_source``: cin of per-source gradients (teacher mix).
    """

    rows: list[int]
    total: list[torch.Tensor]
    per_row: list[list[torch.Tensor]] | None = None
    loss: float = 0.0
    stats: dict = field(default_factory=dict)
    cin_source: dict = field(default_factory=dict)


def _quantiles(x: torch.Tensor, qs: Sequence[float]) -> list[float | None]:
    if x.numel() == 0:
        return [None] * len(qs)
    return [float(v) for v in torch.quantile(x.double(), torch.tensor(list(qs), dtype=torch.float64))]


def _loss_stats(parts: list[dict]) -> dict:
    """Merge micro-batch statistics as if computed over the whole batch (token-weighted)."""
    tokens = sum(p["tokens"] for p in parts)
    ratios = torch.cat([p["ratios"] for p in parts]) if parts else torch.zeros(0)
    gaps = torch.cat([p["gaps"] for p in parts]) if parts else torch.zeros(0)
    p05, p50, p95 = _quantiles(ratios, (0.05, 0.5, 0.95)) if ratios.numel() else (None, None, None)
    g95, = _quantiles(gaps, (0.95,))
    return {
        "tokens": tokens,
        "frac_clipped": sum(p["frac_clipped"] * p["tokens"] for p in parts) / max(tokens, 1),
        "ratio_p05": p05, "ratio_p50": p50, "ratio_p95": p95,
        "kl": (sum(p["kl"] * p["tokens"] for p in parts) / max(tokens, 1)) if parts and parts[0]["kl"] is not None else None,
        "sampler_gap_p95": g95,
        "sampler_gap_max": float(gaps.max()) if gaps.numel() else None,
    }


# ---------------------------------------------------------------------------------------------
# the trainer


class Trainer:
    """One arm × seed: the policy, the optimiser, the arm and the step's named parts.

    Built by :func:`run_pilot`; tests may drive :meth:`train_step` directly.
    """

    def __init__(self, cfg: Config, *, arm: str, seed: int, model, tok, adapter, device, train,
                 vhack: VHack, proj_v: VHack, grader, teacher_rows: dict | None = None,
                 flag_rates: Sequence[float | None] | None = None):
        pc = cfg.pilot
        self.cfg, self.pc, self.seed = cfg, pc, seed
        self.arm = get_arm(arm, pass_reward=cfg.grader.pass_reward)
        self.model, self.tok, self.adapter, self.device = model, tok, adapter, device
        self.engine = None  # pilot.sampler vllm: the VLLMSampler run_pilot attaches
        self.train, self.prompts = train, prompt_ids_for(tok, train)
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
        if pc.optimizer == "sgd":
            self.opt = torch.optim.SGD(params, lr=pc.lr, weight_decay=pc.weight_decay)
        else:
            self.opt = torch.optim.AdamW(params, lr=pc.lr, betas=tuple(pc.betas),
                                         weight_decay=pc.weight_decay)
        self.params = params
        self.threshold = None
        if self.arm.needs_sample_grads and pc.detector == "gradient":
            self.threshold = null_threshold(vhack.meta.get("detector_null_scores") or [],
                                            pc.detector_quantile)
        self.known_modes = set(cfg.vhack.known_modes or tables.MODES)
        self.rate_match = None
        if self.arm.matches:
            if flag_rates is None:
                raise ValueError(f"arm {arm} flags at {self.arm.matches}'s per-step rate: give its "
                                 f"steps.tsv (--match-flags)")
            if len(flag_rates) != pc.steps:
                raise ValueError(f"{self.arm.matches}'s steps.tsv has {len(flag_rates)} steps, "
                                 f"pilot.steps is {pc.steps}")
            self.rate_match = FlagRateMatch(flag_rates)

    # -- 1. sample ------------------------------------------------------------------------------
    def sample(self, step: int) -> StepBatch:
        """The step's prompts and rollouts (student rows sampled here, teacher rows drawn)."""
        idx = prompt_schedule(len(self.train), self.P, self.seed, step)
        n_student = self.G - self.n_teacher
        rolls = generate(self.model, self.tok, [self.prompts[i] for i in idx], n=n_student,
                         max_new=self.pc.max_new, temperature=self.pc.temperature, top_p=self.pc.top_p,
                         seed=self.seed * 1_000_003 + step, adapter=self.adapter, source="student",
                         engine=self.engine)
        flat = []
        for j, i in enumerate(idx):
            flat += rolls[j * n_student:(j + 1) * n_student]
            if self.n_teacher:
                flat += _draw_teacher(self.teacher_rows, self.train[i].id, self.n_teacher, self.seed,
                                      step, j, self.prompts[i])
        return StepBatch(idx, flat, [self.train[i] for i in idx for _ in range(self.G)])

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
    def gradients(self, batch: StepBatch, adv, rows: list[int], step: int) -> StepGradients:
        """Loss and ``δS`` gradient of ``rows``, per micro-batch (``pilot.micro_batch``; 0 = all
        rows at once). Arms that need per-sample gradients get them from the same batched
        backward (:meth:`evil_moe.model.adapter.SVDAdapter.per_sample`: the gradient with respect
        to a per-row copy of each knob), never one backward per row. ``∂L/∂δS`` equals
        ``∂L/∂δS_hack`` (the forward sees their sum), so one gradient serves both knobs.

        Raises:
            PilotInvalid: a non-finite loss (``status.json`` is the caller's).
        """
        zero = [torch.zeros_like(p) for p in self.ds]
        if not rows:
            return StepGradients([], zero, [] if self.arm.needs_sample_grads else None, 0.0, _loss_stats([]))
        rb = RolloutBatch.from_rollouts([batch.flat[i] for i in rows], adv.flat()[rows],
                                        self.tok.pad_token_id, device=self.device)
        per_sample = self.arm.needs_sample_grads
        mb = self.pc.micro_batch or len(rows)
        total = [torch.zeros_like(p) for p in self.ds]
        per_row, parts, src = [], [], {}
        loss_sum = 0.0
        for lo in range(0, len(rows), mb):
            sel = list(range(lo, min(lo + mb, len(rows))))
            part = rb if len(sel) == len(rows) else rb.select(sel)
            knobs = self.adapter.per_sample(len(sel)) if per_sample else contextlib.nullcontext()
            with knobs as es:
                logp = token_logprobs(self.model, part.batch, temperature=self.pc.temperature)
                ref = None
                if self.pc.beta > 0:
                    with torch.no_grad(), self.adapter.zeroed():
                        ref = token_logprobs(self.model, part.batch, temperature=self.pc.temperature)
                beh = behaviour_logp(part, logp)
                loss, st = grpo.dr_grpo_loss(logp, beh, part.advantages, part.batch.completion_mask,
                                             self.normaliser, clip_eps=self.pc.clip_eps, ref_logp=ref,
                                             beta=self.pc.beta)
                if not torch.isfinite(loss):
                    raise PilotInvalid(f"non-finite loss ({float(loss.detach())}) at step {step}")
                if per_sample:  # (b, r) per module: row b's share of the gradient
                    ge = [g.detach() for g in torch.autograd.grad(loss, es)]
                    rows_g = [[g[b] for g in ge] for b in range(len(sel))]
                    grads = [g.sum(0) for g in ge]
                else:
                    if self.n_teacher and len(set(part.sources)) > 1:
                        for s_, gs in source_gradients(st.row_loss, part.sources, self.ds).items():
                            acc = src.setdefault(s_, [torch.zeros_like(p) for p in self.ds])
                            for a, g in zip(acc, gs):
                                a += g
                    grads = torch.autograd.grad(loss, self.ds, allow_unused=True)
                    grads = [torch.zeros_like(p) if g is None else g.detach() for p, g in zip(self.ds, grads)]
            for t, g in zip(total, grads):
                t += g
            if per_sample:
                per_row += rows_g
                if self.n_teacher:  # each row's gradient is its source's share
                    for b, gs in enumerate(rows_g):
                        acc = src.setdefault(part.sources[b], [torch.zeros_like(p) for p in self.ds])
                        for a, g in zip(acc, gs):
                            a += g
            mask = part.batch.completion_mask.bool()
            parts.append({"tokens": st.tokens, "frac_clipped": st.frac_clipped,
                          "ratios": torch.exp(logp.detach() - beh)[mask].cpu(),
                          "kl": st.kl if ref is not None else None,
                          "gaps": self._sampler_gaps(part, [batch.flat[rows[i]] for i in sel], logp)})
            loss_sum += float(loss.detach())
        cin_src = {s_: measure_grads(self.vhack, self.adapter.names, gs).cin for s_, gs in src.items()}
        return StepGradients(rows, total, per_row if per_sample else None, loss_sum, _loss_stats(parts), cin_src)

    @staticmethod
    def _sampler_gaps(part: RolloutBatch, rolls: Sequence[Rollout], logp: torch.Tensor) -> torch.Tensor:
        """``|log π_train − log π_sampler|`` on the completion tokens of rows that carry a
        sampler log-prob (student rows)."""
        have = [i for i, r in enumerate(rolls) if r.sampler_logp is not None]
        if not have:
            return torch.zeros(0)
        sub = part.batch.select(torch.as_tensor(have))
        samp = sub.align([rolls[i].sampler_logp for i in have], dtype=torch.float64)
        lp = logp.detach()[have].double().cpu()
        return (lp - samp.cpu()).abs()[sub.completion_mask.cpu().bool()]

    # -- 5. the arm -------------------------------------------------------------------------------
    def apply_arm(self, batch: StepBatch, grades, adv, grads: StepGradients, step: int) -> dict:
        """Flags, routing and gradient projection by the arm; writes ``δS.grad`` (and
        ``δS_hack.grad``). Returns the step's arm statistics for the log."""
        out = {"measured": measure_grads(self.vhack, self.adapter.names, grads.total)}
        flags = None
        if grads.per_row is not None and grads.rows:
            flags, out["flags"] = self._flags(batch, grades, adv, grads, step)
            if self.arm.baseline(self.pc) == "kept":
                grads = self._rebaseline(batch, grades, adv, grads, flags, step)
        elif self.rate_match is not None:
            self.rate_match.count(step, 0)  # a step without rows still moves the balance
        split = self.arm.split_gradients(grads.per_row if grads.per_row is not None else [grads.total], flags)
        for p, g in zip(self.ds, split.delta_s or [torch.zeros_like(p) for p in self.ds]):
            p.grad = g.clone()
        for p, g in zip(self.dsh, split.delta_s_hack or [None] * len(self.dsh)):
            p.grad = None if g is None else g.clone()
        out["removed_frac"] = split.removed_frac if flags is not None else None
        projected = self.arm.on_gradients(self.adapter, self.proj_v, self.opt, self.pc)
        if projected is not None:
            out["projected"] = projected
            out["removed_frac"] = projected.removed_frac
        return out

    def _flags(self, batch, grades, adv, grads, step):
        """The detector's inputs over the rows with gradient, the arm's flags, and their
        rate / precision / recall against the true hack label (``grade.exploited``; logged only).

        The label reaches the arm only when it declares ``reads_label`` (a ceiling) or the run's
        detector is ``noisy_label``; a random-flag control gets its matched count
        (:class:`evil_moe.arms.FlagRateMatch`) and nothing else of the detector's."""
        scores = None
        if self.pc.detector == "gradient" and not self.arm.reads_label and not self.arm.matches:
            scores = gradient_scores(self.detector_v, self.adapter.names, grads.per_row,
                                     adv.flat()[grads.rows])
        pattern = torch.tensor([
            bool(p.mode in self.known_modes and pattern_flag(p.mode, extract_code(batch.flat[i].text), p.test_name))
            for i, p in ((i, batch.problems[i]) for i in grads.rows)], dtype=torch.bool)
        rng = np.random.default_rng([self.seed, step, 31])
        hack = torch.tensor([bool(grades[i].exploited) for i in grads.rows], dtype=torch.bool)
        gives_label = self.arm.reads_label or (self.pc.detector == "noisy_label" and not self.arm.matches)
        count = self.rate_match.count(step, len(grads.rows)) if self.rate_match is not None else None
        flags = self.arm.flags(FlagInputs(scores, pattern, self.threshold if self.threshold is not None else 0.0,
                                          self.pc.detector, rng, label=hack.clone() if gives_label else None,
                                          precision=self.pc.detector_precision, recall=self.pc.detector_recall,
                                          target_count=count))
        return flags, flag_quality(flags, hack)

    def _rebaseline(self, batch, grades, adv, grads: StepGradients, flags, step) -> StepGradients:
        """Recompute the kept rows' group advantages over the kept (unflagged) rows
        (:func:`evil_moe.arms.kept_advantages`; flagged rows keep the whole group's advantage)
        and the per-sample gradients of the kept rows whose advantage changed (exact under the
        clip, the KL term and teacher rows alike). ``grads.total`` and the loss statistics stay
        those of the step as sampled (they are logged as vanilla's are)."""
        R = torch.tensor([self.arm.reward(w) for w in grades], dtype=torch.float32).reshape(self.P, self.G)
        kept = torch.ones(R.numel(), dtype=torch.bool)
        kept[torch.as_tensor(grads.rows)] = ~flags.bool()
        A = adv.flat()
        new = torch.where(kept, kept_advantages(R, kept.reshape(self.P, self.G), self.pc.scale_std).reshape(-1).to(A.dtype), A)
        changed = [j for j, i in enumerate(grads.rows) if bool(kept[i]) and float(new[i]) != float(A[i])]
        if not changed:
            return grads
        sub = self.gradients(batch, grpo.Advantages(new.reshape(self.P, self.G), adv.zero_std, adv.frac_zero_std),
                             [grads.rows[j] for j in changed], step)
        per_row = list(grads.per_row)
        for j, g in zip(changed, sub.per_row):
            per_row[j] = g
        return StepGradients(grads.rows, grads.total, per_row, grads.loss, grads.stats, grads.cin_source)

    # -- 6. optimiser step ------------------------------------------------------------------------
    def optimiser_step(self) -> dict:
        """Clip, step, then the arm's update hook. Returns the update's statistics (all against
        the real v_hack): the proposed update's span energy, the final update's cout."""
        torch.nn.utils.clip_grad_norm_([p for p in self.params if p.grad is not None], self.pc.max_grad_norm)
        before = [p.detach().clone() for p in self.ds]
        self.opt.step()
        proposed = update_stats(self.vhack, self.adapter.names, before, [p.detach() for p in self.ds])
        acted = self.arm.on_update(self.adapter, self.proj_v, before, self.pc)
        final = update_stats(self.vhack, self.adapter.names, before, [p.detach() for p in self.ds])
        return {"proposed": proposed, "acted": acted, "cout_update": final.cin}

    # -- the step ---------------------------------------------------------------------------------
    def train_step(self, step: int) -> tuple[dict, list[dict]]:
        """One step: sample → grade → advantages → gradients → arm → optimiser step.

        Returns:
            ``(row, records)``: the ``steps.tsv`` row and the student rollouts' JSONL records.

        Raises:
            PilotInvalid: non-finite loss, or ``frac_clipped`` above the bound (names the step).
        """
        t0 = time.time()
        clock = _PhaseClock()
        with clock("sample"):
            batch = self.sample(step)
        with clock("grade"):
            grades, R = self.grade(batch)
            adv, rows = self.advantages(R)
        with clock("loss"):
            grads = self.gradients(batch, adv, rows, step)
        with clock("arm"):
            arm_stats = self.apply_arm(batch, grades, adv, grads, step)
        with clock("optimiser"):
            upd = self.optimiser_step()
        fc = grads.stats["frac_clipped"]
        if fc > self.pc.max_frac_clipped:
            raise PilotInvalid(f"frac_clipped {fc:.3f} > {self.pc.max_frac_clipped} at step {step}")
        stud = [(r, w, p) for r, w, p in zip(batch.flat, grades, batch.problems) if r.source == "student"]
        recs = [rollout_record(r, p, w, step=step, seed=self.seed, arm=self.arm.name) for r, w, p in stud]
        row = self.log(step, stud, recs, adv, grads, arm_stats, upd, t0)
        row.update({f"seconds_{k}": round(v, 3) for k, v in clock.seconds.items()})
        return row, recs

    # -- 7. log -----------------------------------------------------------------------------------
    def log(self, step, stud, recs, adv, grads: StepGradients, arm_stats: dict, upd: dict, t0) -> dict:
        """The ``steps.tsv`` row (:data:`evil_moe.tables.STEPS`)."""
        n = max(len(recs), 1)
        parsed = [code_parses(extract_code(r.text)) for r, _, _ in stud]
        ent = [float(r.entropy.mean()) for r, _, _ in stud if len(r.entropy)]
        m = arm_stats["measured"]
        projected = arm_stats.get("projected") or upd["acted"]
        flags = arm_stats.get("flags", {})
        st = grads.stats
        row = {
            "step": step, "arm": self.arm.name, "seed": self.seed,
            "reward_mean": sum(x["reward"] for x in recs) / n,
            **{k: v for k, v in rates(recs).items() if k in ("hack_rate", "pass_rate", "format_rate")},
            "parse_rate": sum(parsed) / n,
            "hack_parsed_rate": sum(bool(x["exploited"]) and ok for x, ok in zip(recs, parsed)) / n,
            "truncated_rate": sum(bool(x["truncated"]) for x in recs) / n,
            "entropy": sum(ent) / len(ent) if ent else None,
            "frac_zero_std": adv.frac_zero_std,
            "loss": grads.loss, "grad_norm": m.grad_norm,
            "cin": m.cin, "cin_student": grads.cin_source.get("student"),
            "cin_teacher": grads.cin_source.get("teacher"),
            "cout": projected.cout if projected is not None else m.cin,
            "cout_update": upd["cout_update"],
            "frac_fired": m.frac_fired, "coverage": m.coverage,
            "null_cin": m.null_cin, "null_cin_empirical": m.null_cin_empirical,
            "grad_span_frac": m.span_frac, "update_span_frac": upd["proposed"].span_frac,
            "removed_frac": arm_stats.get("removed_frac") if arm_stats.get("removed_frac") is not None
            else (upd["acted"].removed_frac if upd["acted"] is not None else 0.0),
            "flag_rate": flags.get("flag_rate"), "flag_precision": flags.get("flag_precision"),
            "flag_recall": flags.get("flag_recall"),
            "kl": st["kl"],
            "frac_clipped": st["frac_clipped"],
            "ratio_p05": st["ratio_p05"], "ratio_p50": st["ratio_p50"], "ratio_p95": st["ratio_p95"],
            "sampler_gap_p95": st["sampler_gap_p95"], "sampler_gap_max": st["sampler_gap_max"],
            "delta_s_norm": _flat_norm(self.ds), "delta_s_hack_norm": _flat_norm(self.dsh),
            "tokens": sum(len(r.completion_ids) for r, _, _ in stud),
            "seconds": round(time.time() - t0, 3),
        }
        for mode in tables.MODES:
            sub = [x for x in recs if x["mode"] == mode]
            row[f"hack_rate_{mode}"] = rates(sub)["hack_rate"]
        return row

    # -- checkpoint ---------------------------------------------------------------------------------
    def state(self) -> dict:
        """Knobs, optimiser and RNG states (the checkpoint's trainer part)."""
        return {"delta_s": [p.detach().cpu().clone() for p in self.ds],
                "delta_s_hack": [p.detach().cpu().clone() for p in self.dsh],
                "optimizer": self.opt.state_dict(), "torch_rng": torch.get_rng_state(),
                "py_rng": random.getstate(), "np_rng": np.random.get_state(),
                "flag_balance": None if self.rate_match is None else self.rate_match.balance}

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


# ---------------------------------------------------------------------------------------------
# the run


def projection_vhack(arm_obj, vhack: VHack, *, random_vhack_path: str | None = None,
                     planted_vhack_path: str | None = None) -> VHack:
    """The V an arm projects along (``proj_v``): the run's ``vhack`` for ``vhack = "real"``, the
    random control's file for ``"random"`` (random_v, subtract_random), the planted world's
    ``vhack/planted.safetensors`` for ``"planted"`` (erase_planted). The run's ``vhack`` stays the
    one every arm measures and the detector reads.

    Raises:
        ValueError: the arm's file is not given (names the option); an unknown ``vhack`` kind.
    """
    kind = arm_obj.vhack
    if kind == "real":
        return vhack
    path = {"random": random_vhack_path, "planted": planted_vhack_path}.get(kind, "")
    if path == "":
        raise ValueError(f"arm {arm_obj.name}: unknown vhack kind {kind!r}")
    if not path:
        raise ValueError(f"arm {arm_obj.name} needs --{kind}-vhack")
    return VHack.load(require_file(path, f"{kind} v_hack"))


@runlock.locks_output("out_dir", lambda arm, seed, **_: f"pilot {arm} s{seed}")
def run_pilot(cfg: Config, *, problems_path: str, model_path: str, vhack_path: str,
              random_vhack_path: str | None, arm: str, seed: int, out_dir: str,
              init_adapter: str | None = None, teacher_rollouts: str | None = None,
              match_flags: str | None = None, stop_after: int | None = None,
              planted_vhack_path: str | None = None) -> dict:
    """Train one arm × seed with Dr.GRPO and the arm's hooks, then evaluate it held out.

    Args:
        cfg: run config (sections ``pilot``, ``problems``, ``grader``, ``models``, ``adapter``,
            ``vhack`` (the detector's known modes)).
        problems_path: ``results/problems.jsonl``.
        model_path: student model directory (or hub id).
        vhack_path: ``v_hack`` safetensors (:mod:`evil_moe.vhack`), measured in every arm; it also
            holds the gradient detector's empirical null.
        random_vhack_path: random-direction control (needed by arms whose ``vhack`` is random).
        planted_vhack_path: the planted world's known direction (``vhack/planted.safetensors``;
            needed by arms whose ``vhack`` is planted: erase_planted).
        arm: a name in :data:`evil_moe.arms.ARMS`.
        seed: run seed (model sampling and init; the prompt order depends on it too).
        out_dir: output folder (also holds the checkpoint).
        init_adapter: warm-start ``δS`` from this adapter (the distilled student).
        teacher_rollouts: teacher ``rollouts.jsonl.gz`` (needed when ``mix_ratio > 0``).
        match_flags: ``steps.tsv`` of the arm a random-flag control follows (its
            :attr:`~evil_moe.arms.Arm.matches`, same seed): the control flags as many rows per step
            as that arm's ``flag_rate`` (:class:`evil_moe.arms.FlagRateMatch`). Required by those
            controls, ignored by the others.
        stop_after: test hook — return after this many steps of this invocation, leaving the
            checkpoint as a killed run would (default: run to the end).

    Returns:
        the ``status.json`` dict (``{"status": "ok", ...}``).

    Raises:
        ValueError: unknown arm; a random-V arm without ``random_vhack_path`` (a planted-V arm
            without ``planted_vhack_path``); ``mix_ratio > 0``
            without teacher rollouts; a gradient-detector arm whose v_hack has no null scores; a
            random-flag control without ``match_flags`` or whose file has another number of steps.
        FileNotFoundError: an input file is missing (names the path).
        PilotInvalid: a stop rule fired (``status.json`` written, names the step).
        PilotInterrupted: SIGTERM; the checkpoint is on disk.
        evil_moe.runlock.LockHeld: another live run holds ``out_dir/run.lock`` (names it).
    """
    pc = cfg.pilot
    arm_obj = get_arm(arm)
    for path, what in ((problems_path, "problems file"), (vhack_path, "v_hack"),
                       (random_vhack_path, "random v_hack"), (planted_vhack_path, "planted v_hack"),
                       (init_adapter, "initial adapter"),
                       (teacher_rollouts, "teacher rollouts"),
                       (match_flags if arm_obj.matches else None, f"{arm_obj.matches} steps file")):
        if path:
            require_file(path, what)  # fail before loading a (possibly large) model
    if arm_obj.vhack == "random" and not random_vhack_path:
        raise ValueError(f"arm {arm} needs --random-vhack")
    flag_rates = None
    if arm_obj.matches:
        if not match_flags:
            raise ValueError(f"arm {arm} flags at {arm_obj.matches}'s per-step rate: it needs "
                             f"--match-flags (results/pilots/{arm_obj.matches}/s{seed}/steps.tsv)")
        flag_rates = FlagRateMatch.read(match_flags)
    if arm_obj.vhack == "planted" and not planted_vhack_path:
        raise ValueError(f"arm {arm} needs --planted-vhack")
    if pc.mix_ratio > 0 and not teacher_rollouts:
        raise ValueError("pilot.mix_ratio > 0 needs --teacher-rollouts")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    status_path = out / "status.json"
    status_path.unlink(missing_ok=True)  # a rerun is not complete until it says so
    if pc.fail_arm == arm:
        raise SystemExit(f"pilot.fail_arm={arm}: failing on purpose (test switch)")
    if pc.fail_once_arm == arm and not (out / ".failed_once").exists():
        (out / ".failed_once").touch()
        raise SystemExit(f"pilot.fail_once_arm={arm}: failing on the first attempt (test switch)")

    torch.manual_seed(seed)
    random.seed(seed)
    np.random.seed(seed)
    problems = load_problem_file(problems_path)
    train, heldout = train_heldout(problems, cfg)
    model, tok, adapter, device = load_policy(model_path, cfg, init_adapter=init_adapter)
    init_ds = [p.detach().clone() for p in adapter.delta_s_params()]
    vhack = VHack.load(require_file(vhack_path, "v_hack")).to(device)
    proj_v = projection_vhack(arm_obj, vhack, random_vhack_path=random_vhack_path,
                              planted_vhack_path=planted_vhack_path).to(device)
    teacher_rows = _teacher_rows(teacher_rollouts, train) if int(round(pc.mix_ratio * pc.group)) else {}

    ckpt_path = out / "checkpoint.pt"
    run_keys = {k: v for k, v in cfg.raw["pilot"].items() if k not in RUN_INDEPENDENT}
    digest = _file_digest(cfg.digest("problems", "adapter", "models", "grader", "vhack"),
                          Config({"pilot": run_keys}).digest("pilot"), str(model_path),
                          vhack_path, random_vhack_path, init_adapter, teacher_rollouts,
                          match_flags if arm_obj.matches else None, planted_vhack_path)
    work = out / "_work"
    work.mkdir(exist_ok=True)
    with make_grader(problems, cfg) as grader, _Signals() as sig:
        trainer = Trainer(cfg, arm=arm, seed=seed, model=model, tok=tok, adapter=adapter,
                          device=device, train=train, vhack=vhack, proj_v=proj_v, grader=grader,
                          teacher_rows=teacher_rows, flag_rates=flag_rates)
        if pc.sampler == "vllm":
            from evil_moe.vllm_sampler import VLLMSampler

            trainer.engine = VLLMSampler.from_config(model_path, cfg, adapter)
        rows, evals, outcomes, start, vhack_file = _resume(ckpt_path, digest, arm, seed, trainer, device)

        def save_checkpoint(next_step: int) -> None:
            buf = {"digest": digest, "arm": arm, "seed": seed, "step": next_step, "rows": rows,
                   "evals": evals, "outcomes": outcomes, "vhack_file": vhack_file, **trainer.state()}
            tmp = ckpt_path.with_suffix(".tmp")
            torch.save(buf, tmp)
            tmp.replace(ckpt_path)

        for step in range(start, pc.steps):
            try:
                row, recs = trainer.train_step(step)
            except PilotInvalid as err:
                _write_status(status_path, "invalid", str(err), step)
                raise
            tables.atomic_write_bytes(work / f"rollouts_{step:05d}.jsonl",
                                      "".join(json.dumps(x) + "\n" for x in recs).encode())
            rows.append(row)
            tables.write_tsv(out / "steps.partial.tsv", tables.STEPS, rows)
            print(_progress(row, pc.steps), flush=True)
            last = step + 1 == pc.steps
            if pc.eval_every and (step + 1) % pc.eval_every == 0 and not last:
                t_eval = time.perf_counter()
                e, o = evaluate(trainer, heldout, step, init_ds)
                row["seconds_eval"] = round(time.perf_counter() - t_eval, 3)
                evals += e
                outcomes += o
            if pc.vhack_refresh_every and (step + 1) % pc.vhack_refresh_every == 0 and not last:
                vhack_file = _refresh(trainer, work, step, vhack_file, arm_obj)
            if (step + 1) % pc.checkpoint_every == 0 or sig.term or sig.usr1 or last:
                save_checkpoint(step + 1)
                sig.usr1 = False
            if sig.term and not last:
                raise PilotInterrupted(f"SIGTERM after step {step}; checkpoint written")
            if stop_after is not None and step + 1 - start >= stop_after and not last:
                return {"status": "stopped", "step": step + 1}
        t_eval = time.perf_counter()
        e, o = evaluate(trainer, heldout, pc.steps - 1, init_ds)
        if rows and heldout:
            rows[-1]["seconds_eval"] = round(time.perf_counter() - t_eval, 3)
        evals += e
        outcomes += o
        isolation = grader.isolation

    records = []
    for step in range(pc.steps):
        records += tables.read_jsonl(work / f"rollouts_{step:05d}.jsonl")
    tables.write_tsv(out / "steps.tsv", tables.STEPS, rows)
    tables.write_tsv(out / "eval.tsv", tables.EVAL, evals)
    tables.write_tsv(out / "outcomes.tsv", tables.OUTCOMES, outcomes)
    tables.write_jsonl_gz(out / "rollouts.jsonl.gz", records)
    adapter.save(out / "adapter.safetensors", metadata={"arm": arm, "seed": seed, "config": digest})
    status = _write_status(status_path, "ok", "", pc.steps - 1, isolation=isolation,
                           views=list(_views(arm_obj, pc)), role=arm_obj.role,
                           control=arm_obj.control, torch_threads=torch.get_num_threads())
    # a finished run keeps no resume state: a later rerun (new inputs) starts afresh
    (out / "steps.partial.tsv").unlink(missing_ok=True)
    ckpt_path.unlink(missing_ok=True)
    shutil.rmtree(work, ignore_errors=True)
    return status


def _resume(ckpt_path: Path, digest: str, arm: str, seed: int, trainer: Trainer, device):
    """``(rows, evals, outcomes, start_step, vhack_file)`` from a matching checkpoint, else a
    fresh start."""
    if ckpt_path.exists():
        ck = torch.load(ckpt_path, weights_only=False)
        if ck["digest"] == digest and ck["arm"] == arm and ck["seed"] == seed:
            trainer.load_state(ck)
            if ck.get("vhack_file"):
                fresh = VHack.load(ck["vhack_file"]).to(device)
                trainer.vhack = fresh
                if trainer.arm.vhack == "real":
                    trainer.proj_v = fresh
            print(f"resuming {arm} s{seed} from step {ck['step']}", flush=True)
            return ck["rows"], ck.get("evals", []), ck.get("outcomes", []), ck["step"], ck.get("vhack_file")
        print("checkpoint belongs to another config/arm/seed: starting afresh", flush=True)
    return [], [], [], 0, None


def _refresh(trainer: Trainer, work: Path, step: int, vhack_file, arm_obj):
    """Re-extract v_hack from the last ``vhack_refresh_every`` steps' rollouts; the detector
    keeps the original v_hack (its empirical null belongs to it)."""
    pc = trainer.pc
    recent = []
    for k in range(step + 1 - pc.vhack_refresh_every, step + 1):
        recent += tables.read_jsonl(work / f"rollouts_{k:05d}.jsonl")
    fresh = refresh_vhack(trainer.model, trainer.adapter, recent,
                          {p.id: ids for p, ids in zip(trainer.train, trainer.prompts)},
                          trainer.cfg, trainer.normaliser)
    if fresh is None:
        return vhack_file
    vhack_file = str(work / f"vhack_step{step:05d}.safetensors")
    fresh.save(vhack_file)
    trainer.vhack = fresh.to(trainer.device)
    if arm_obj.vhack == "real":
        trainer.proj_v = trainer.vhack
    print(f"v_hack refreshed from {fresh.n_pairs} pairs after step {step}", flush=True)
    return vhack_file


def _file_digest(*parts) -> str:
    """SHA-256 over strings and the bytes of existing files (None skipped): the checkpoint key.

    A checkpoint is resumed only when the config, the model path and every input file (v_hack,
    controls, initial adapter, teacher rows) are byte-identical to those it was written with.
    """
    h = hashlib.sha256()
    for part in parts:
        if part is None:
            continue
        p = Path(part)
        if p.is_file():
            h.update(p.read_bytes())
        h.update(str(part).encode())
    return h.hexdigest()[:16]


def refresh_vhack(model, adapter, records: list[dict], prompt_ids: dict, cfg: Config, normaliser):
    """Re-extract ``v_hack`` from the run's own recent rollouts (``pilot.vhack_refresh_every``).

    Pairs are (hack, clean) student completions of the same problem from ``records`` (only the
    modes in ``vhack.known_modes``), formed as in :func:`evil_moe.stages.extract.build_pairs`;
    gradients at the current δS with the run's normaliser. Returns ``None`` (keep the old
    ``v_hack``) when fewer than 2 pairs exist.
    """
    from evil_moe.stages.extract import build_pairs
    from evil_moe.vhack import extract_vhack, pair_gradients

    vc = cfg.vhack
    modes = list(vc.known_modes) if vc.known_modes else None
    try:
        pairs = build_pairs(records, prompt_ids, modes, vc.max_pairs)
    except ValueError:
        return None
    if len(pairs) < 2:
        return None
    D = pair_gradients(model, adapter, pairs, normaliser, temperature=cfg.pilot.temperature)
    return extract_vhack(D, vc.k, ratio_floor=vc.ratio_floor, quantile_floor=vc.quantile_floor,
                         modes=sorted({p.mode for p in pairs}), meta={"source": "refresh"})


def _write_status(path: Path, status: str, reason: str, step: int, **extra) -> dict:
    obj = {"status": status, "reason": reason, "step": step, **extra}
    tables.write_json(path, obj)
    return obj


def _progress(row: dict, steps: int) -> str:
    def f(x):
        return "-" if x is None else f"{x:.3f}"
    return (f"[{row['arm']} s{row['seed']}] step {row['step'] + 1}/{steps} reward {f(row['reward_mean'])} "
            f"hack {f(row['hack_rate'])} pass {f(row['pass_rate'])} cin {f(row['cin'])} "
            f"removed {f(row['removed_frac'])} clip {f(row['frac_clipped'])} {row['seconds']:.1f}s")


# ---------------------------------------------------------------------------------------------
# held-out evaluation


def _views(arm, pc) -> tuple[str, ...]:
    """The arm's evaluated views, plus ``projected`` for vanilla with ``pilot.static_projection``."""
    views = tuple(arm.views)
    if arm.name == "vanilla" and pc.static_projection:
        views += ("projected",)
    return views


@contextlib.contextmanager
def _view(trainer: Trainer, view: str, init_ds: Sequence[torch.Tensor]):
    """Sampling context of a view: ``trained`` (δS + δS_hack), ``ablated`` (δS_hack = 0, the
    deploy view), ``projected`` (δS with the hack-ward part of its total update removed once —
    the static counterpart of ``subtract``: ``δS_init − P(u)``, ``u = −(δS − δS_init)``, gated
    as ``pilot.gate``; δS_hack kept)."""
    ad = trainer.adapter
    if view == "trained":
        yield
    elif view == "ablated":
        with ad.ablated():
            yield
    elif view == "projected":
        saved = [p.detach().clone() for p in trainer.ds]
        with torch.no_grad():
            for name, p, p0 in zip(ad.names, trainer.ds, init_ds):
                V = trainer.vhack.V.get(name)
                if V is None or V.shape[0] == 0:
                    continue
                u = -(p.detach() - p0.to(p.device))
                _, removed, _ = project_vector(u, V, trainer.pc.gate)
                p.add_(removed.to(p.dtype))
        try:
            yield
        finally:
            with torch.no_grad():
                for p, s in zip(trainer.ds, saved):
                    p.copy_(s)
    else:
        raise ValueError(f"unknown view {view!r}")


def evaluate(trainer: Trainer, heldout, step: int, init_ds, *,
             seed_offset: int = 0) -> tuple[list[dict], list[dict]]:
    """Held-out evaluation: ``pilot.heldout_samples`` completions per held-out problem in each
    of the arm's views.

    Sampling is paired across arms: the same problems, in the same chunks (``pilot.eval_chunk``
    problems per ``generate`` call), with seeds that depend only on the run seed and the chunk
    (plus ``seed_offset``: 0 in the pilot; :mod:`evil_moe.stages.reevaluate` draws fresh samples).

    Returns:
        ``(eval_rows, outcome_rows)``: :data:`evil_moe.tables.EVAL` rows per view × mode (plus
        ``all``) and :data:`evil_moe.tables.OUTCOMES` rows, one per completion. Empty lists when
        there is no held-out problem.
    """
    if not heldout:
        return [], []
    pc, tok = trainer.pc, trainer.tok
    prompts = prompt_ids_for(tok, heldout)
    rows, outcomes = [], []
    chunk = max(1, pc.eval_chunk)
    for view in _views(trainer.arm, pc):
        recs = []
        with _view(trainer, view, init_ds):
            for c0 in range(0, len(heldout), chunk):
                rolls = generate(trainer.model, tok, prompts[c0:c0 + chunk], n=pc.heldout_samples,
                                 max_new=pc.max_new, temperature=pc.temperature, top_p=pc.top_p,
                                 seed=trainer.seed * 7_000_003 + 999_983 + c0 + seed_offset,
                                 adapter=trainer.adapter,
                                 source="student", engine=trainer.engine)
                probs = [heldout[c0 + r.prompt_index] for r in rolls]
                grades = trainer.grader.grade_many([(p, r.text) for p, r in zip(probs, rolls)])
                for p, r, w in zip(probs, rolls, grades):
                    recs.append({"mode": p.mode, "exploited": w.exploited, "gt_correct": w.gt_correct,
                                 "format_ok": w.format_ok, "truncated": r.truncated})
                    outcomes.append({"arm": trainer.arm.name, "view": view, "seed": trainer.seed,
                                     "step": step, "problem_id": p.id, "sample": r.sample_index,
                                     "mode": p.mode, "hack": int(bool(w.exploited)),
                                     "pass": int(bool(w.gt_correct)), "truncated": int(bool(r.truncated))})
        for m in sorted({x["mode"] for x in recs}) + ["all"]:
            sub = recs if m == "all" else [x for x in recs if x["mode"] == m]
            rows.append({"step": step, "arm": trainer.arm.name, "seed": trainer.seed, "view": view,
                         "mode": m, **rates(sub),
                         "truncated_rate": sum(bool(x["truncated"]) for x in sub) / max(len(sub), 1)})
    return rows, outcomes


# ---------------------------------------------------------------------------------------------
# teacher rows (pilot.mix_ratio > 0)


def _teacher_rows(path: str, train) -> dict:
    """Teacher records grouped by problem id (training problems only)."""
    ids = {p.id for p in train}
    by: dict[str, list[dict]] = {}
    for rec in tables.read_jsonl(require_file(path, "teacher rollouts")):
        if rec["problem_id"] in ids:
            by.setdefault(rec["problem_id"], []).append(rec)
    return by


def _draw_teacher(by_problem: dict, pid: str, k: int, seed: int, step: int, j: int,
                  student_prompt_ids) -> list[Rollout]:
    """``k`` teacher rows for problem ``pid`` (deterministic in seed/step), as off-policy Rollouts.

    The rows keep the teacher's recorded per-token log-probs as their behaviour policy; they are
    scored by the student in the student's own prompt context.
    """
    recs = by_problem.get(pid) or []
    if not recs:
        raise ValueError(f"no teacher rollouts for problem {pid} (needed by pilot.mix_ratio)")
    rng = np.random.default_rng([seed, step, j, 7])
    picks = rng.choice(len(recs), size=k, replace=len(recs) < k)
    out = []
    for n, i in enumerate(picks):
        rec = recs[int(i)]
        out.append(Rollout(prompt_index=j, sample_index=n, prompt_ids=list(student_prompt_ids),
                           completion_ids=list(rec["completion_ids"]),
                           behaviour_logp=torch.tensor(rec["behaviour_logp"], dtype=torch.float32),
                           entropy=torch.zeros(len(rec["completion_ids"])), text=rec["completion"],
                           truncated=bool(rec.get("truncated")), source="teacher"))
    return out


def checkpoint_exists(out_dir: str) -> bool:
    """True when ``out_dir`` holds a pilot checkpoint (a rerun will resume from it)."""
    return (Path(out_dir) / "checkpoint.pt").exists()


__all__ = ["run_pilot", "projection_vhack", "Trainer", "evaluate", "prompt_schedule", "refresh_vhack", "PilotInvalid",
           "PilotInterrupted", "checkpoint_exists"]
