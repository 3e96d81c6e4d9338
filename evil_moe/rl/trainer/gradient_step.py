"""The gradients of a training step (step 4 of :class:`evil_moe.rl.trainer.trainer.Trainer`), a mixin of
the trainer: the Dr.GRPO loss of the rows with a forward and its ``δS`` gradient, per micro-batch
(the total) or per row (arms that flag samples, and the calibration run), the per-source shares
of the total when teacher rows are mixed in, the pooled hidden states a probe reads, and each
micro-batch's loss statistics (clip fraction, importance ratios, KL, sampler gaps).
"""

from __future__ import annotations

import contextlib
from typing import Sequence

import torch

from evil_moe.model.logprobs import capture_head_inputs, pool_completion, token_logprobs
from evil_moe.rl.policy import grpo
from evil_moe.rl.policy.grpo import RolloutBatch, behaviour_logp, source_gradients
from evil_moe.rl.vhack.projection import measure_grads
from evil_moe.rl.policy.rollout import Rollout
from evil_moe.rl.trainer.step import PilotInvalid, StepBatch, StepGradients, loss_stats


class GradientStep:
    """The step's loss and gradients, as methods of the trainer (they read its ``pc``, ``arm``,
    ``model``, ``tok``, ``adapter``, ``device``, ``ds``, ``vhack``, ``normaliser``, ``n_teacher``,
    ``score_rows``, ``uses_detector`` and ``router``; the router's forward is
    :meth:`evil_moe.rl.trainer.router_step.RouterStep._router_gradients`)."""

    # -- 4. gradients -----------------------------------------------------------------------------
    def gradients(self, batch: StepBatch, adv, rows: list[int], step: int) -> StepGradients:
        """Loss and ``δS`` gradient of ``rows``, per micro-batch (``pilot.micro_batch``; 0 = all
        rows at once). ``∂L/∂δS`` equals ``∂L/∂δS_hack`` (the forward sees their sum), so one
        gradient serves both knobs.

        The forward runs with the knobs merged into the weights
        (:meth:`evil_moe.model.adapter.SVDAdapter.merged_gradients`: one matmul per Linear, the
        gradient ``Σ_t (Uᵀ ∂L/∂y_t) ⊙ (Vh x_t)`` formed from the recorded inputs and output
        gradients). Arms that need only the total gradient forward each distinct prompt of a
        micro-batch once (``token_logprobs(share_prompts=True)``: the prompt's KV cache,
        computed with gradient, is copied to its rows); arms that need per-sample gradients get
        them from the same batched backward, the sum above taken per row, and forward the prompt
        with every row (a row's share of a shared prompt's gradient cannot be separated). Both
        equal the hooked per-row forward's gradients to float rounding (tested).

        Raises:
            PilotInvalid: a non-finite loss (``status.json`` is the caller's).
        """
        if self.router is not None:
            return self._router_gradients(batch, adv, rows, step)
        per_sample = self.arm.needs_sample_grads or self.score_rows
        if not rows:
            return StepGradients([], [torch.zeros_like(p) for p in self.ds], [] if per_sample else None, 0.0,
                                 loss_stats([]))
        rb = RolloutBatch.from_rollouts([batch.flat[i] for i in rows], adv.flat()[rows],
                                        self.tok.pad_token_id, device=self.device)
        need_hidden = self.score_rows or (self.uses_detector and self.pc.detector == "probe")
        mb = self.pc.micro_batch or len(rows)
        total = [torch.zeros_like(p) for p in self.ds]
        per_row, parts, src, hidden, loss_sum = [], [], {}, [], 0.0
        for lo in range(0, len(rows), mb):
            sel = list(range(lo, min(lo + mb, len(rows))))
            part = rb if len(sel) == len(rows) else rb.select(sel)
            ref = None
            if self.pc.beta > 0:  # the reference (base) policy, before the knobs are merged
                with torch.no_grad(), self.adapter.zeroed():
                    ref = token_logprobs(self.model, part.batch, temperature=self.pc.temperature,
                                         share_prompts=True)
            # the head's inputs align with the rows only in the unshared forward (pool_completion)
            share = not per_sample and not need_hidden
            with self.adapter.merged_gradients(rows=len(sel) if per_sample else None) as cap:
                with capture_head_inputs(self.model) if need_hidden else contextlib.nullcontext([]) as seen:
                    logp = token_logprobs(self.model, part.batch, temperature=self.pc.temperature,
                                          share_prompts=share)
                if need_hidden:
                    hidden.append(pool_completion(torch.cat(seen, 0), part.batch.completion_mask).cpu())
                beh = behaviour_logp(part, logp)
                loss, st = grpo.dr_grpo_loss(logp, beh, part.advantages, part.batch.completion_mask,
                                             self.normaliser, clip_eps=self.pc.clip_eps, ref_logp=ref,
                                             beta=self.pc.beta)
                if not torch.isfinite(loss):
                    raise PilotInvalid(f"non-finite loss ({float(loss.detach())}) at step {step}")
                if per_sample:  # (b, r) per module: row b's share of the gradient
                    grads, ge = cap.grads(loss)
                    rows_g = [[g[b] for g in ge] for b in range(len(sel))]
                else:
                    if self.n_teacher and len(set(part.sources)) > 1:
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
                if self.n_teacher:  # each row's gradient is its source's share
                    for b, gs in enumerate(rows_g):
                        self._add_to(src, part.sources[b], gs)
            parts.append(self._part_stats(part, [batch.flat[rows[i]] for i in sel], logp, beh, st, ref))
            loss_sum += float(loss.detach())
        cin_src = {s_: measure_grads(self.vhack, self.adapter.names, gs).cin for s_, gs in src.items()}
        return StepGradients(rows, total, per_row if per_sample else None, loss_sum, loss_stats(parts), cin_src,
                             torch.cat(hidden, 0) if hidden else None)

    def _part_stats(self, part: RolloutBatch, rolls: Sequence[Rollout], logp: torch.Tensor,
                    beh: torch.Tensor, st, ref) -> dict:
        """One micro-batch's loss statistics for :func:`~evil_moe.rl.trainer.step.loss_stats`: its
        completion tokens, clip fraction, per-token importance ratios ``exp(logp − beh)`` (CPU),
        KL (None without a reference) and sampler gaps."""
        mask = part.batch.completion_mask.bool()
        return {"tokens": st.tokens, "frac_clipped": st.frac_clipped,
                "ratios": torch.exp(logp.detach() - beh)[mask].cpu(),
                "kl": st.kl if ref is not None else None, "gaps": self._sampler_gaps(part, rolls, logp)}

    def _add_to(self, acc: dict, key, grads) -> None:
        """``acc[key] += grads`` per module (``acc[key]`` starts at zeros shaped like ``δS``)."""
        for a, g in zip(acc.setdefault(key, [torch.zeros_like(p) for p in self.ds]), grads):
            a += g

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
