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
"""

from __future__ import annotations

import contextlib
import random
import time
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np
import torch

from evil_moe import tables

from evil_moe.rl import grpo
from evil_moe.rl.arms import FlagInputs, FlagRateMatch, get_arm, kept_advantages
from evil_moe.config import Config
from evil_moe.rl.detector import flag_quality, gradient_scores, null_threshold, pattern_flag
from evil_moe.env.grader import extract_code
from evil_moe.rl.grpo import (DrGRPONormaliser, RolloutBatch, behaviour_logp, group_advantages,
                           source_gradients)
from evil_moe.model.logprobs import token_logprobs
from evil_moe.rl.projection import measure_grads, update_stats
from evil_moe.rl.rollout import Rollout, generate
from evil_moe.stages.common import code_parses, prompt_ids_for, rates, rollout_record
from evil_moe.rl.teacher_rows import draw_teacher_rows
from evil_moe.rl.vhack import VHack


class PilotInvalid(RuntimeError):
    """The run broke a validity rule (clip fraction, non-finite loss); ``status.json`` says which."""



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

    Built by :func:`evil_moe.stages.pilot.run_pilot`; tests may drive :meth:`train_step` directly.
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
                flat += draw_teacher_rows(self.teacher_rows, self.train[i].id, self.n_teacher,
                                          self.seed, step, j, self.prompts[i])
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
        (:class:`evil_moe.rl.arms.FlagRateMatch`) and nothing else of the detector's."""
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
        (:func:`evil_moe.rl.arms.kept_advantages`; flagged rows keep the whole group's advantage)
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
        return self.log(step, stud, recs, adv, grads, arm_stats, upd, t0, clock), recs

    # -- 7. log -----------------------------------------------------------------------------------
    def log(self, step, stud, recs, adv, grads: StepGradients, arm_stats: dict, upd: dict, t0,
            clock: _PhaseClock) -> dict:
        """The step's ``steps.tsv`` row (:data:`evil_moe.tables.STEPS`), every column but
        ``seconds_eval`` (the run loop's): rates of the student rows ``stud`` and their records
        ``recs``, advantage, loss and arm statistics, the update's, knob norms, and the wall-clock
        seconds of the step (since ``t0``) and of each phase (``clock``)."""
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
        row.update({f"seconds_{k}": round(v, 3) for k, v in clock.seconds.items()})
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

__all__ = ["Trainer", "StepBatch", "StepGradients", "prompt_schedule", "PilotInvalid"]
