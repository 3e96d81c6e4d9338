"""The gradients of a training step (step 4 of :class:`evil_moe.rl.trainer.trainer.Trainer`): the
Dr.GRPO loss of the rows with a forward and its ``δS`` gradient, per micro-batch (the total) or
per row (arms that flag samples, and the calibration run), the per-source shares of the total
when teacher rows are mixed in, the pooled hidden states a probe reads, and each micro-batch's
loss statistics (clip fraction, importance ratios, KL, sampler gaps). Evil MoE's arms compute
theirs under the router's mixture instead (:mod:`evil_moe.rl.trainer.router_step`).
"""

from __future__ import annotations

import contextlib

import torch

from evil_moe.model.logprobs import capture_head_inputs, pool_completion, token_logprobs
from evil_moe.rl.policy import grpo
from evil_moe.rl.policy.grpo import DrGRPONormaliser, RolloutBatch, behaviour_logp, source_gradients
from evil_moe.rl.trainer.step import PilotInvalid, StepBatch, StepGradients, loss_stats, part_stats
from evil_moe.rl.vhack.direction import VHack
from evil_moe.rl.vhack.projection import measure_grads


class GradientStep:
    """The policy's loss and ``δS`` gradient over a step's rows.

    Args:
        model, tok, adapter, device: the policy (``adapter``: its
            :class:`~evil_moe.model.adapter.SVDAdapter`, whose ``δS`` knobs get the gradient).
        pc: the config's ``pilot`` section (``micro_batch``, ``temperature``, ``clip_eps``,
            ``beta``).
        normaliser: the Dr.GRPO normaliser (``G · max_new · P``).
        mixes_teacher: teacher rows are mixed into the groups (``pilot.mix_ratio > 0``): the total
            gradient is also split by source (``cin_teacher``, ``cin_student``).
    """

    def __init__(self, *, model, tok, adapter, device, pc, normaliser: DrGRPONormaliser,
                 mixes_teacher: bool):
        self.model, self.tok, self.adapter, self.device = model, tok, adapter, device
        self.pc, self.normaliser, self.mixes_teacher = pc, normaliser, mixes_teacher
        self.ds = adapter.delta_s_params()

    def __call__(self, batch: StepBatch, adv, rows: list[int], step: int, *, per_sample: bool,
                 need_hidden: bool, vhack: VHack) -> StepGradients:
        """Loss and ``δS`` gradient of ``rows``, per micro-batch (``pilot.micro_batch``; 0 = all
        rows at once). ``∂L/∂δS`` equals ``∂L/∂δS_hack`` (the forward sees their sum), so one
        gradient serves both knobs.

        The forward runs with the knobs merged into the weights
        (:meth:`evil_moe.model.adapter.SVDAdapter.merged_gradients`: one matmul per Linear, the
        gradient ``Σ_t (Uᵀ ∂L/∂y_t) ⊙ (Vh x_t)`` from the recorded inputs and output gradients).
        Without ``per_sample`` each distinct prompt of a micro-batch is forwarded once (its KV
        cache, computed with gradient, copied to its rows); with it, the sum above is taken per
        row and the prompt forwarded with every row (a row's share of a shared prompt's gradient
        cannot be separated). Both equal the hooked per-row forward's gradients to float
        rounding (tested).

        Args:
            batch, adv, rows, step: the step's rollouts, advantages, rows with a forward (indices
                into ``batch.flat``) and the step (for the error).
            per_sample, need_hidden: keep each row's gradient (``per_row``), the rows' pooled
                final hidden states (``hidden``, the probe's input).
            vhack: the v_hack the per-source shares' ``cin`` is measured against.

        Raises:
            PilotInvalid: a non-finite loss (``status.json`` is the caller's).
        """
        if not rows:
            return StepGradients([], [torch.zeros_like(p) for p in self.ds], [] if per_sample else None, 0.0,
                                 loss_stats([]))
        pc = self.pc
        rb = RolloutBatch.from_rollouts([batch.flat[i] for i in rows], adv.flat()[rows],
                                        self.tok.pad_token_id, device=self.device)
        mb = pc.micro_batch or len(rows)
        total = [torch.zeros_like(p) for p in self.ds]
        per_row, parts, src, hidden, loss_sum = [], [], {}, [], 0.0
        for lo in range(0, len(rows), mb):
            sel = list(range(lo, min(lo + mb, len(rows))))
            part = rb if len(sel) == len(rows) else rb.select(sel)
            ref = None
            if pc.beta > 0:  # the reference (base) policy, before the knobs are merged
                with torch.no_grad(), self.adapter.zeroed():
                    ref = token_logprobs(self.model, part.batch, temperature=pc.temperature,
                                         share_prompts=True)
            # the head's inputs align with the rows only in the unshared forward (pool_completion)
            share = not per_sample and not need_hidden
            with self.adapter.merged_gradients(rows=len(sel) if per_sample else None) as cap:
                with capture_head_inputs(self.model) if need_hidden else contextlib.nullcontext([]) as seen:
                    logp = token_logprobs(self.model, part.batch, temperature=pc.temperature,
                                          share_prompts=share)
                if need_hidden:
                    hidden.append(pool_completion(torch.cat(seen, 0), part.batch.completion_mask).cpu())
                beh = behaviour_logp(part, logp)
                loss, st = grpo.dr_grpo_loss(logp, beh, part.advantages, part.batch.completion_mask,
                                             self.normaliser, clip_eps=pc.clip_eps, ref_logp=ref,
                                             beta=pc.beta)
                if not torch.isfinite(loss):
                    raise PilotInvalid(f"non-finite loss ({float(loss.detach())}) at step {step}")
                if per_sample:  # (b, r) per module: row b's share of the gradient
                    grads, ge = cap.grads(loss)
                    rows_g = [[g[b] for g in ge] for b in range(len(sel))]
                else:
                    if self.mixes_teacher and len(set(part.sources)) > 1:
                        def of_part(part_loss):  # the capture keeps the graph for the next source
                            return cap.grads(part_loss, retain_graph=True)[0]

                        for s_, gs in source_gradients(st.row_loss, part.sources, self.ds,
                                                       grad=of_part).items():
                            self._add_to(src, s_, gs)
                    grads, _ = cap.grads(loss)
            for t, g in zip(total, grads):
                t += g
            if per_sample:
                per_row += rows_g
                if self.mixes_teacher:  # each row's gradient is its source's share
                    for b, gs in enumerate(rows_g):
                        self._add_to(src, part.sources[b], gs)
            parts.append(part_stats(part, [batch.flat[rows[i]] for i in sel], logp, beh, st, ref))
            loss_sum += float(loss.detach())
        cin_src = {s_: measure_grads(vhack, self.adapter.names, gs).cin for s_, gs in src.items()}
        return StepGradients(rows, total, per_row if per_sample else None, loss_sum, loss_stats(parts), cin_src,
                             torch.cat(hidden, 0) if hidden else None)

    def _add_to(self, acc: dict, key, grads) -> None:
        """``acc[key] += grads`` per module (``acc[key]`` starts at zeros shaped like ``δS``)."""
        for a, g in zip(acc.setdefault(key, [torch.zeros_like(p) for p in self.ds]), grads):
            a += g
