"""Decoding with each prompt's keys and values kept once for its whole group (cascade attention).

A GRPO step samples ``n`` completions of each prompt. After the prompts' prefill, the usual decode
copies each prompt's KV cache to its ``n`` rows, and every step each row reads its own copy of
the prompt's keys and values: on SmolLM2-135M (a ~550-token prompt, 30 layers, 3 KV heads of
64) that is ~27 MB per row per step, read ``n`` times over. Here the prompts' keys and values stay
as the prefill left them, ``(P, H_kv, L_p, D)`` per layer, and each row's cache holds only its
own completion. Each decode step's attention splits into two exact parts and merges them:

* the **prompt part**: the queries of all active rows of prompt ``p`` (``g`` rows × the query
  heads of each KV head) attend to that prompt's keys in ONE attention call, so the prompt's
  keys and values are read once per group instead of once per row;
* the **completion part**: each row's query attends to its own completion's keys;
* the two are merged with their log-sum-exps: with ``o_a, λ_a`` the softmax-weighted values and
  the log-sum-exp of the scores over each part, ``o = o_s + σ(λ_p − λ_s)·(o_p − o_s)``, which is
  exactly ``softmax`` over the union (the log-sum-exp merge of FlashAttention / FlashDecoding).

The result equals the ordinary attention up to float rounding (a different summation order), so
the sampled ids can differ from the unshared decode only where two ids' cumulative
probabilities straddle a row's uniform within float noise; behaviour log-probs are still read
from the very logits each id was drawn with (tested against a fresh forward).

Sources: Hydragen (Juravsky et al. 2024, arXiv:2402.05099) and cascade inference (FlashInfer,
Ye et al. 2025, arXiv:2501.01005) for the shared-prefix decomposition; FlashAttention's online
softmax (Dao et al. 2022, arXiv:2205.14135) for the log-sum-exp merge.
"""

from __future__ import annotations

import contextlib

import torch

__all__ = ["ATTN_NAME", "SharedPrompt", "shared_prompt_attention", "supports_shared_prompt",
           "shared_prompt_decoding"]

ATTN_NAME = "evil_moe_shared_prompt"  # the name registered with transformers' AttentionInterface


def _attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float):
    """``(out (B, H, Q, D), lse (B, H, Q) fp32)``: softmax attention of ``q (B, H, Q, D)`` over all
    of ``k, v (B, H, L, D)`` (no mask) and the log-sum-exp of its scaled scores. On the CPU, the
    flash kernel that ``scaled_dot_product_attention`` itself dispatches to there (it returns the
    log-sum-exp); elsewhere :func:`_attend_matmul`."""
    if q.device.type == "cpu":
        return torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, 0.0, False,
                                                                         scale=scale)
    return _attend_matmul(q, k, v, scale)


def _attend_matmul(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float):
    """:func:`_attend` in plain matmuls (any device), accumulated in fp32 (fp64 for fp64 inputs)
    as the fused kernels do: scores, their log-sum-exp, and the values weighted by
    ``exp(score − lse)``, cast back to ``v``'s dtype (a bf16 score would be off by ~0.4%)."""
    acc = torch.promote_types(q.dtype, torch.float32)
    s = torch.matmul(q.to(acc), k.to(acc).transpose(-1, -2)) * scale
    lse = torch.logsumexp(s, dim=-1)
    return torch.matmul(torch.exp(s - lse[..., None]), v.to(acc)).to(v.dtype), lse


class SharedPrompt:
    """What :func:`shared_prompt_attention` reads during one decode.

    Attributes:
        keys, values: per layer, the prefilled prompts' ``(P, H_kv, L_p, D)`` (right-padded; a
            prompt's padding is never read: each prompt is sliced to its own length).
        lengths: ``(P,)`` the prompts' lengths in tokens.
        runs: ``[(prompt, first row, end row)]``, each prompt's run of rows still in the batch
            (rows are prompt-major and leave the batch in order), set by :meth:`select`.
    """

    def __init__(self, keys: list, values: list, lengths, row_prompt: torch.Tensor):
        self.keys, self.values = keys, values
        self.lengths = [int(x) for x in lengths]
        self.select(row_prompt)

    def select(self, row_prompt: torch.Tensor) -> None:
        """Set the active rows' prompts: ``row_prompt (N_active,)`` long, non-decreasing.

        Raises:
            ValueError: ``row_prompt`` decreases somewhere (the rows of a prompt must be one run).
        """
        rp = row_prompt.cpu()
        if rp.numel() > 1 and bool((rp[1:] < rp[:-1]).any()):
            raise ValueError("row_prompt must be non-decreasing (prompt-major rows)")
        prompts, counts = torch.unique_consecutive(rp, return_counts=True)
        starts = torch.cumsum(counts, 0) - counts
        self.runs = [(int(p), int(s), int(s + c)) for p, s, c in zip(prompts, starts, counts)]


def shared_prompt_attention(module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                            attention_mask=None, scaling: float | None = None, dropout: float = 0.0,
                            shared_prompt: SharedPrompt | None = None, **kwargs):
    """A transformers attention function (``AttentionInterface``) for decode steps over a
    :class:`SharedPrompt`: the prompt part per group, the completion part per row, merged by
    log-sum-exp (module docstring).

    Args:
        module: the attention module (its ``layer_idx`` picks the layer's prompt keys).
        query: ``(B, H, 1, D)``, one new token per row.
        key, value: ``(B, H_kv, t, D)``, each row's completion so far (this step's included), as
            the completion cache's ``update`` returned them.
        attention_mask: ignored (no row has holes in its completion; the prompts' holes are cut).
        scaling: the score scale (default ``D ** -0.5``).
        dropout: must be 0 (sampling).
        shared_prompt: the decode's :class:`SharedPrompt` (passed through the model's kwargs).

    Returns:
        ``(out (B, 1, H, D), None)`` as transformers' ``sdpa_attention_forward``.

    Raises:
        RuntimeError: without ``shared_prompt``, with more than one query position, or with dropout.
    """
    if shared_prompt is None:
        raise RuntimeError("shared_prompt_attention needs shared_prompt= (use shared_prompt_decoding)")
    B, H, Q, D = query.shape
    if Q != 1 or dropout:
        raise RuntimeError(f"shared_prompt_attention decodes one token per row without dropout; got "
                           f"{Q} query positions, dropout {dropout}")
    Hkv = key.shape[1]
    rep = H // Hkv
    scale = float(scaling) if scaling is not None else D ** -0.5
    q = query.reshape(B, Hkv, rep, D)  # query head h uses KV head h // rep (transformers' repeat_kv)
    o_s, lse_s = _attend(q, key, value, scale)  # (B, Hkv, rep, D), (B, Hkv, rep)
    pk, pv = shared_prompt.keys[module.layer_idx], shared_prompt.values[module.layer_idx]
    outs, lses = [], []
    for p, a, b in shared_prompt.runs:
        g, L = b - a, shared_prompt.lengths[p]
        qp = q[a:b].transpose(0, 1).reshape(1, Hkv, g * rep, D)
        o, lse = _attend(qp, pk[p:p + 1, :, :L], pv[p:p + 1, :, :L], scale)
        outs.append(o.reshape(Hkv, g, rep, D).transpose(0, 1))
        lses.append(lse.reshape(Hkv, g, rep).transpose(0, 1))
    o_p = outs[0] if len(outs) == 1 else torch.cat(outs)
    lse_p = lses[0] if len(lses) == 1 else torch.cat(lses)
    w = torch.sigmoid(lse_p - lse_s).unsqueeze(-1).to(o_s.dtype)  # the prompt part's share
    out = torch.lerp(o_s, o_p, w)
    return out.reshape(B, 1, H, D), None


def supports_shared_prompt(model, cache) -> bool:
    """Whether :func:`shared_prompt_decoding` can run ``model`` over its prefilled ``cache``:
    a transformers model that sets its attention implementation through ``AttentionInterface``
    (``model.set_attn_implementation``) and whose every cache layer is a plain full-attention
    ``DynamicLayer`` (no sliding window, no quantised or linear-attention layers)."""
    from transformers.cache_utils import DynamicLayer

    layers = getattr(cache, "layers", None)
    if not layers or not hasattr(model, "set_attn_implementation"):
        return False
    can = getattr(model, "_can_set_attn_implementation", None)
    if can is not None and not can():
        return False
    return all(type(layer) is DynamicLayer and layer.is_initialized for layer in layers)


@contextlib.contextmanager
def shared_prompt_decoding(model, cache, lengths, row_prompt: torch.Tensor, capacity: int):
    """Turn a prefilled cache of ``P`` prompts into a shared-prompt decode of ``N`` rows, in place.

    Every layer's prefilled ``(P, H_kv, L_p, D)`` keys and values move into a
    :class:`SharedPrompt`; the layer becomes an empty completion cache of ``N`` rows with room for
    ``capacity`` positions (:func:`~evil_moe.model.logprobs.reserved_layer`). Inside the
    block, the model's attention is :func:`shared_prompt_attention`; the caller passes
    ``shared_prompt=`` the yielded object to each decode forward and calls its ``select`` whenever
    it calls ``cache.batch_select_indices``. On exit the model's attention implementation is
    restored (also after an error).

    Args:
        model: a transformers causal LM (:func:`supports_shared_prompt` true).
        cache: its ``DynamicCache`` after the prompts' prefill.
        lengths: ``(P,)`` the prompts' lengths (the prefill right-padded them).
        row_prompt: ``(N,)`` long, non-decreasing: the prompt of each decoded row.
        capacity: the completion positions to reserve (``max_new``).

    Yields:
        The :class:`SharedPrompt`.
    """
    from transformers import AttentionInterface

    from evil_moe.model.logprobs import reserved_layer

    if ATTN_NAME not in AttentionInterface._global_mapping:
        AttentionInterface.register(ATTN_NAME, shared_prompt_attention)
    keys, values = [], []
    N = int(row_prompt.numel())
    for i, layer in enumerate(cache.layers):
        k, v = layer.keys, layer.values
        keys.append(k)
        values.append(v)
        cache.layers[i] = reserved_layer(k.new_empty(N, k.shape[1], 0, k.shape[-1]),
                                         v.new_empty(N, v.shape[1], 0, v.shape[-1]), capacity)
    shared = SharedPrompt(keys, values, lengths, row_prompt)
    before = model.config._attn_implementation
    model.set_attn_implementation(ATTN_NAME)
    try:
        yield shared
    finally:
        model.set_attn_implementation(before)
