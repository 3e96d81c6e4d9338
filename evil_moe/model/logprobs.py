"""Token log-probabilities of completions, aligned to tokens.

Conventions (see ``docs/internals.md``):

* ``logp[b, t] = log π(x_t | x_<t)`` under ``softmax(logits / T)``, and ``0`` wherever token
  ``t`` is not a completion token (position 0 never is).
* ``completion_mask[b, t]`` is True where token ``t`` belongs to the completion.
* Token ids are the ids that came out of ``generate``; nothing here re-tokenises text.
* The temperature is part of the policy: training uses ``logits / T`` exactly as the sampler,
  so on-policy importance ratios are exactly 1.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch

__all__ = ["Batch", "build_batch", "token_logprobs", "token_entropy"]


@dataclass
class Batch:
    """A right-padded batch of prompt+completion sequences.

    Attributes:
        input_ids: ``(B, L)`` int64, prompt ids then completion ids then ``pad_id``.
        attention_mask: ``(B, L)`` int64, 1 on real tokens.
        completion_mask: ``(B, L)`` bool, True on completion tokens.
        prompt_lens: ``(B,)`` int64 prompt lengths.
        completion_lens: ``(B,)`` int64 completion lengths.
    """

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    completion_mask: torch.Tensor
    prompt_lens: torch.Tensor
    completion_lens: torch.Tensor

    def to(self, device) -> "Batch":
        """The same batch on ``device``."""
        return Batch(*(t.to(device) for t in (self.input_ids, self.attention_mask,
                                               self.completion_mask, self.prompt_lens,
                                               self.completion_lens)))

    def __len__(self) -> int:
        return int(self.input_ids.shape[0])

    def select(self, rows) -> "Batch":
        """Sub-batch of the given rows (index tensor, list or slice); padding is kept."""
        return Batch(self.input_ids[rows], self.attention_mask[rows], self.completion_mask[rows],
                     self.prompt_lens[rows], self.completion_lens[rows])

    def align(self, per_token: Sequence[Sequence[float]] | Sequence[torch.Tensor],
              dtype=torch.float32) -> torch.Tensor:
        """Scatter per-completion-token values (e.g. recorded behaviour log-probs, one sequence
        per row, length = completion length) into a ``(B, L)`` tensor aligned to tokens
        (0 elsewhere). Raises ``ValueError`` on a length mismatch."""
        B, L = self.input_ids.shape
        out = torch.zeros(B, L, dtype=dtype)
        for b, vals in enumerate(per_token):
            vals = torch.as_tensor(vals, dtype=dtype).flatten()
            n, p = int(self.completion_lens[b]), int(self.prompt_lens[b])
            if vals.numel() != n:
                raise ValueError(f"row {b}: {vals.numel()} values for {n} completion tokens")
            out[b, p:p + n] = vals
        return out.to(self.input_ids.device)


def build_batch(prompt_ids: Sequence[Sequence[int]], completion_ids: Sequence[Sequence[int]],
                pad_id: int, *, device=None) -> Batch:
    """Concatenate prompts and completions per row and right-pad to a ``Batch``.

    Args:
        prompt_ids: B prompt id lists (each non-empty).
        completion_ids: B completion id lists (as generated; may be empty).
        pad_id: padding id (masked out; its value never matters).
        device: optional device for the tensors.

    Returns:
        :class:`Batch` with ``L = max(len(prompt) + len(completion))``.

    Raises:
        ValueError: different numbers of prompts and completions, or an empty prompt.
    """
    if len(prompt_ids) != len(completion_ids):
        raise ValueError(f"{len(prompt_ids)} prompts vs {len(completion_ids)} completions")
    rows = [list(map(int, p)) + list(map(int, c)) for p, c in zip(prompt_ids, completion_ids)]
    if any(len(p) == 0 for p in prompt_ids):
        raise ValueError("empty prompt: position 0 must be a prompt token")
    B, L = len(rows), max((len(r) for r in rows), default=0)
    ids = torch.full((B, L), int(pad_id), dtype=torch.long)
    att = torch.zeros(B, L, dtype=torch.long)
    comp = torch.zeros(B, L, dtype=torch.bool)
    for b, (p, row) in enumerate(zip(prompt_ids, rows)):
        ids[b, :len(row)] = torch.tensor(row, dtype=torch.long)
        att[b, :len(row)] = 1
        comp[b, len(p):len(row)] = True
    plen = torch.tensor([len(p) for p in prompt_ids], dtype=torch.long)
    clen = torch.tensor([len(c) for c in completion_ids], dtype=torch.long)
    batch = Batch(ids, att, comp, plen, clen)
    return batch.to(device) if device is not None else batch


def _forward_logits(model, batch: Batch, start: int) -> torch.Tensor:
    """Logits ``(B, L - start, V)`` for positions ``start..L-1`` (``logits_to_keep`` when the
    model supports it, so long prompts cost no vocab-sized memory)."""
    L = batch.input_ids.shape[1]
    keep = L - start
    try:
        out = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask,
                    logits_to_keep=keep, use_cache=False)
        logits = out.logits
    except TypeError:
        logits = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask,
                       use_cache=False).logits
    if logits.shape[1] != keep:
        logits = logits[:, -keep:]
    return logits


def token_logprobs(model, batch: Batch, temperature: float = 1.0, *,
                   with_entropy: bool = False, chunk_rows: int = 8, top_p: float = 1.0):
    """Per-token log-probs of the batch's completion tokens under ``softmax(logits / T)``.

    ``logp[b, t] = z[b, t-1, x_t] − logsumexp(z[b, t-1, :])`` with ``z = logits / T`` computed
    in fp32; 0 where ``completion_mask`` is False. Differentiable (call under ``no_grad`` for
    behaviour/reference log-probs). Memory: logits are only formed from the first completion
    position on, and the fp32 log-sum-exp runs over ``chunk_rows`` rows at a time.

    Args:
        model: causal LM (adapter hooks, if any, are applied as usual).
        batch: from :func:`build_batch`, on the model's device.
        temperature: sampling temperature ``T > 0`` (part of the policy).
        with_entropy: also return the per-token entropy of the same distribution.
        chunk_rows: rows per fp32 log-sum-exp chunk.
        top_p: nucleus mass; below 1 the distribution is truncated by transformers'
            ``TopPLogitsWarper`` after the temperature (the sampler's distribution, used only for
            recorded sampler log-probs — training always uses ``top_p = 1``). Entropy is then
            not available.

    Returns:
        ``logp (B, L)`` fp32 (or the model dtype if fp64); with ``with_entropy`` a tuple
        ``(logp, entropy)`` where ``entropy (B, L)`` is in nats/token, 0 off completions,
        detached.

    Raises:
        ValueError: ``temperature <= 0``.
    """
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    if top_p < 1.0 and with_entropy:
        raise ValueError("entropy of the top-p truncated distribution is not provided")
    B, L = batch.input_ids.shape
    mask = batch.completion_mask
    has = mask.any(dim=0).nonzero()
    out_dtype = torch.float64 if next(model.parameters()).dtype == torch.float64 else torch.float32
    logp = torch.zeros(B, L, dtype=out_dtype, device=batch.input_ids.device)
    ent = torch.zeros(B, L, dtype=out_dtype, device=batch.input_ids.device) if with_entropy else None
    if has.numel() == 0:
        return (logp, ent) if with_entropy else logp
    first = int(has.min())  # first completion token position (>= 1)
    start = first - 1  # logits at position t-1 predict token t
    logits = _forward_logits(model, batch, start)[:, : L - 1 - start]  # (B, L-1-start, V)
    targets = batch.input_ids[:, first:]  # (B, L-first)
    pieces, ent_pieces = [], []
    for r0 in range(0, B, chunk_rows):
        z = logits[r0:r0 + chunk_rows].to(out_dtype) / temperature
        if top_p < 1.0:
            from transformers.generation.logits_process import TopPLogitsWarper

            shape = z.shape
            z = TopPLogitsWarper(float(top_p))(None, z.reshape(-1, shape[-1])).reshape(shape)
        lse = torch.logsumexp(z, dim=-1)
        picked = z.gather(-1, targets[r0:r0 + chunk_rows, :, None]).squeeze(-1)
        pieces.append(picked - lse)
        if with_entropy:
            with torch.no_grad():
                p = torch.softmax(z, dim=-1)
                ent_pieces.append(lse - (p * z).sum(-1))
    lp = torch.cat(pieces, 0)
    logp = torch.cat([logp[:, :first], torch.where(mask[:, first:], lp, 0.0)], dim=1)
    if with_entropy:
        e = torch.where(mask[:, first:], torch.cat(ent_pieces, 0), 0.0)
        ent = torch.cat([ent[:, :first], e], dim=1).detach()
        return logp, ent
    return logp


@torch.no_grad()
def token_entropy(model, batch: Batch, temperature: float = 1.0) -> torch.Tensor:
    """Entropy (nats/token) of ``softmax(logits / T)`` at each completion token, ``(B, L)``,
    0 off completions. Raises ``ValueError`` on ``temperature <= 0``."""
    return token_logprobs(model, batch, temperature, with_entropy=True)[1]
