"""The records one training step passes between its parts (:mod:`evil_moe.rl.trainer.trainer`, whose
step reads as the algorithm, :mod:`evil_moe.rl.trainer.gradient_step` and
:mod:`evil_moe.rl.trainer.router_step`, the two ways of computing the step's gradients): the
step's rollouts (:class:`StepBatch`), its loss and gradients (:class:`StepGradients`), one
micro-batch's loss statistics (:func:`part_stats`, with the sampler gaps :func:`sampler_gaps`)
merged over micro-batches (:func:`loss_stats`), and :class:`PilotInvalid`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

import torch

from evil_moe.rl.policy.grpo import RolloutBatch
from evil_moe.rl.policy.rollout import Rollout


class PilotInvalid(RuntimeError):
    """The run broke a validity rule (clip fraction, non-finite loss); ``status.json`` says which."""


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
    quantiles, ``kl``, sampler gaps); ``cin_source``: cin of per-source gradients (teacher mix);
    ``hidden``: ``(len(rows), d)`` pooled final hidden states of the rows (the probe's input;
    :func:`evil_moe.model.logprobs.pool_completion`) when the run needs them, else None.
    Evil MoE's arms also carry ``split`` (the ``δS`` and ``δS_hack`` gradients the router's
    forward gave: ``total`` is their sum), ``router_w`` ``(len(rows),)`` and ``router_grads``
    (the GRPO loss's gradient of the router's parameters).
    """

    rows: list[int]
    total: list[torch.Tensor]
    per_row: list[list[torch.Tensor]] | None = None
    loss: float = 0.0
    stats: dict = field(default_factory=dict)
    cin_source: dict = field(default_factory=dict)
    hidden: torch.Tensor | None = None
    split: tuple[list[torch.Tensor], list[torch.Tensor]] | None = None
    router_w: torch.Tensor | None = None
    router_grads: list[torch.Tensor] | None = None


def _quantiles(x: torch.Tensor, qs: Sequence[float]) -> list[float | None]:
    if x.numel() == 0:
        return [None] * len(qs)
    return [float(v) for v in torch.quantile(x.double(), torch.tensor(list(qs), dtype=torch.float64))]


def loss_stats(parts: list[dict]) -> dict:
    """Merge micro-batch statistics as if computed over the whole batch (token-weighted).

    Args:
        parts: one dict per micro-batch: ``tokens`` (completion tokens), ``frac_clipped``,
            ``ratios`` (1-D tensor of the completion tokens' importance ratios), ``kl`` (or None),
            ``gaps`` (1-D tensor of ``|log π_train − log π_sampler|``).

    Returns:
        ``tokens``, ``frac_clipped``, ``ratio_p05/p50/p95``, ``kl``, ``sampler_gap_p95`` and
        ``sampler_gap_max`` (None where no value was seen).
    """
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


def sampler_gaps(part: RolloutBatch, rolls: Sequence[Rollout], logp: torch.Tensor) -> torch.Tensor:
    """``|log π_train − log π_sampler|`` on the completion tokens of the rows of ``part`` that
    carry a sampler log-prob (student rows; ``rolls`` are ``part``'s rollouts in order, ``logp``
    its ``(B, T)`` training log-probs). Returns a 1-D fp64 tensor (empty without such rows)."""
    have = [i for i, r in enumerate(rolls) if r.sampler_logp is not None]
    if not have:
        return torch.zeros(0)
    sub = part.batch.select(torch.as_tensor(have))
    samp = sub.align([rolls[i].sampler_logp for i in have], dtype=torch.float64)
    lp = logp.detach()[have].double().cpu()
    return (lp - samp.cpu()).abs()[sub.completion_mask.cpu().bool()]


def part_stats(part: RolloutBatch, rolls: Sequence[Rollout], logp: torch.Tensor, beh: torch.Tensor,
               st, ref) -> dict:
    """One micro-batch's loss statistics for :func:`loss_stats`: its completion tokens, clip
    fraction (``st``: the loss's :class:`~evil_moe.rl.policy.grpo.LossStats`), per-token importance
    ratios ``exp(logp − beh)`` (CPU), KL (None without a reference ``ref``) and sampler gaps."""
    mask = part.batch.completion_mask.bool()
    return {"tokens": st.tokens, "frac_clipped": st.frac_clipped,
            "ratios": torch.exp(logp.detach() - beh)[mask].cpu(),
            "kl": st.kl if ref is not None else None, "gaps": sampler_gaps(part, rolls, logp)}
