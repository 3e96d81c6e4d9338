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

import contextlib
import functools
from dataclasses import dataclass
from typing import Iterator, Sequence

import torch

__all__ = ["Batch", "build_batch", "token_logprobs", "shared_prompt_logprobs", "token_entropy",
           "cache_kwarg", "new_cache", "prefill", "reserve_cache", "reserved_layer", "top_p_logits", "length_buckets",
           "capture_head_inputs", "pool_completion"]


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
                   with_entropy: bool = False, chunk_rows: int = 8, top_p: float = 1.0,
                   share_prompts: bool = False):
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
        top_p: nucleus mass; below 1 the distribution is truncated by :func:`top_p_logits`
            after the temperature (the sampler's distribution, used only for
            recorded sampler log-probs — training always uses ``top_p = 1``). Entropy is then
            not available.
        share_prompts: compute each distinct prompt once (:func:`shared_prompt_logprobs`: rows
            whose prompt ids are equal share one prompt forward and its KV cache); the same
            values up to float rounding, with gradients flowing into the shared forward. Not
            with ``with_entropy`` or ``top_p < 1``, and not under
            :meth:`evil_moe.model.adapter.SVDAdapter.per_sample` (its per-row knobs need one
            forward per row).

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
    if share_prompts:
        if with_entropy or top_p < 1.0:
            raise ValueError("share_prompts gives log-probs only (no entropy, top_p = 1)")
        return shared_prompt_logprobs(model, batch, temperature, chunk_rows=chunk_rows)
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
            shape = z.shape
            z = top_p_logits(z.reshape(-1, shape[-1]), top_p).reshape(shape)
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


@contextlib.contextmanager
def capture_head_inputs(model) -> Iterator[list[torch.Tensor]]:
    """Context that records, detached, every input the model's output head receives.

    A forward pre-hook on ``model.get_output_embeddings()`` (the ``lm_head`` Linear of a causal
    LM): each call appends its input, the final hidden state after the last norm, ``(B, K, d)``
    for the ``K`` last positions the head is applied to (:func:`token_logprobs` asks for the
    positions from the first completion token's predecessor on). Pool it with
    :func:`pool_completion`.

    Yields:
        the list the inputs are appended to (one tensor per head call, in call order).

    Raises:
        ValueError: the model has no output embeddings.
    """
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    if head is None:
        raise ValueError(f"{type(model).__name__} has no output embeddings to read hidden states at")
    seen: list[torch.Tensor] = []
    handle = head.register_forward_pre_hook(lambda mod, args: seen.append(args[0].detach()))
    try:
        yield seen
    finally:
        handle.remove()


def pool_completion(hidden: torch.Tensor, completion_mask: torch.Tensor) -> torch.Tensor:
    """Mean of the final hidden states over each row's completion tokens.

    Args:
        hidden: ``(B, K, d)``, the hidden states of the last ``K`` positions of each row
            (:func:`capture_head_inputs`); position ``t`` is the state after reading token ``t``.
        completion_mask: ``(B, L)`` bool, ``L >= K``; its last ``K`` columns align with ``hidden``.

    Returns:
        ``(B, d)`` fp32 (fp64 for an fp64 model): the mean over the positions of completion
        tokens (a row without completion tokens gives zeros).

    Raises:
        ValueError: ``K > L`` or the batch sizes differ.
    """
    B, K, _ = hidden.shape
    if completion_mask.shape[0] != B or completion_mask.shape[1] < K:
        raise ValueError(f"hidden {tuple(hidden.shape)} does not align with completion_mask "
                         f"{tuple(completion_mask.shape)}")
    m = completion_mask[:, -K:].to(hidden.device)
    dt = torch.float64 if hidden.dtype == torch.float64 else torch.float32
    w = m.to(dt)
    return (hidden.to(dt) * w[..., None]).sum(1) / w.sum(1).clamp(min=1.0)[:, None]



def top_p_logits(z: torch.Tensor, top_p: float, *, first_k: int = 64) -> torch.Tensor:
    """Nucleus truncation: ``z (N, V)`` with every id outside its row's nucleus set to ``-inf``.

    The nucleus is the smallest set of most probable ids whose probability mass (``softmax(z)``)
    reaches ``top_p`` (Holtzman et al. 2020, "The Curious Case of Neural Text Degeneration",
    arXiv:1904.09751): an id is kept when the ids ranked above it hold less than ``top_p``, so
    the most probable id is always kept. This is transformers' ``TopPLogitsWarper`` rule (it
    removes an id when the ids below it hold at most ``1 − top_p``) computed from the top of the
    distribution: ``torch.topk`` of ``first_k`` ids, widened (x8) only for rows whose nucleus is
    larger, instead of a full sort of the vocabulary at every step (42 ms of a 230 ms SmolLM2
    decode step at 8 rows). The probabilities are summed in fp64, so an id is
    misplaced only when the mass above it is within fp64 rounding of ``top_p``; on continuous
    logits the kept sets equal transformers' (tested).

    Raises:
        ValueError: ``top_p`` not in (0, 1].
    """
    if not 0.0 < top_p <= 1.0:
        raise ValueError(f"top_p must be in (0, 1], got {top_p}")
    if top_p >= 1.0:
        return z
    probs = torch.softmax(z.double(), dim=-1)  # fp64: the boundary decided as exactly as it can be
    V = z.shape[-1]
    k = min(first_k, V)
    while True:
        vals, idx = torch.topk(probs, k, dim=-1)  # (N, k) descending
        above = torch.cumsum(vals, dim=-1) - vals  # mass of the ids ranked above each
        if k == V or bool((above[:, -1] + vals[:, -1] >= top_p).all()):
            break
        k = min(8 * k, V)
    keep = torch.zeros_like(probs, dtype=torch.bool).scatter_(-1, idx, above < top_p)
    return z.masked_fill(~keep, float("-inf"))


def cache_kwarg(model) -> str:
    """The name of the KV-cache argument of ``model``'s forward: ``cache`` (transformers >= 5.2x,
    where ``past_key_values`` is deprecated) or ``past_key_values`` (older releases, e.g. the
    one vLLM pins)."""
    import inspect

    params = inspect.signature(type(model).forward).parameters
    return "cache" if "cache" in params else "past_key_values"


def new_cache(model):
    """An empty transformers ``DynamicCache`` for ``model`` (built from its config where the
    release takes one, so sliding-window layers get their own layer type)."""
    from transformers import DynamicCache

    try:
        return DynamicCache(config=model.config)
    except TypeError:  # releases before the per-layer caches
        return DynamicCache()


def prefill(model, prompts: Sequence[Sequence[int]], pad_id: int, device):
    """Forward each prompt once (under the caller's grad mode), right-padded into one batch.

    A shorter prompt's padding stays in its KV cache as masked holes: a later forward continues
    row ``i`` at ``position_ids = len(prompts[i]) + j`` with ``attention_mask`` zero on the holes.

    Returns:
        ``(cache, last, att, plen)``: the ``DynamicCache`` of the ``P`` prompts; ``last (P, V)``,
        the logits at each prompt's last position (they predict its first new token); ``att (P,
        Lp)`` long on ``device``, 1 on prompt tokens; ``plen (P,)`` long on the CPU.
    """
    plen = torch.tensor([len(p) for p in prompts], dtype=torch.long)
    P, Lp = len(prompts), int(plen.max())
    ids = torch.full((P, Lp), int(pad_id), dtype=torch.long)
    att = torch.zeros(P, Lp, dtype=torch.long)
    for i, p in enumerate(prompts):
        ids[i, :len(p)] = torch.as_tensor(list(p), dtype=torch.long)
        att[i, :len(p)] = 1
    cache, att = new_cache(model), att.to(device)
    keep = Lp - int(plen.min()) + 1  # logits of every prompt's last real position
    out = model(input_ids=ids.to(device), attention_mask=att, use_cache=True, logits_to_keep=keep,
                **{cache_kwarg(model): cache})
    last = out.logits[torch.arange(P, device=device), (plen - 1 - (Lp - keep)).to(device)]
    return cache, last, att, plen


@functools.lru_cache(maxsize=None)
def _reserved_layer_class():
    """transformers' ``DynamicLayer`` with room reserved: see :func:`reserve_cache`."""
    from transformers.cache_utils import DynamicLayer

    class ReservedLayer(DynamicLayer):
        """A full-attention cache layer whose keys and values live in preallocated ``(B, H,
        capacity, D)`` buffers: ``update`` writes the new positions into the next free slots and
        returns views of the filled part, instead of ``torch.cat``-ing the whole cache every step.
        ``keys``/``values`` are always those views, so the inherited length, mask sizes and
        ``crop`` read them as they are."""

        def __init__(self, keys: torch.Tensor, values: torch.Tensor, capacity: int):
            super().__init__()
            B, H, L, _ = keys.shape
            self.device, self.is_initialized = keys.device, True
            self.buf_k = keys.new_empty(B, H, capacity, keys.shape[-1])
            self.buf_v = values.new_empty(B, H, capacity, values.shape[-1])
            self.buf_k[:, :, :L], self.buf_v[:, :, :L] = keys, values
            self.keys, self.values = self.buf_k[:, :, :L], self.buf_v[:, :, :L]

        def update(self, key_states, value_states, *args, **kwargs):
            L, n = self.keys.shape[-2], key_states.shape[-2]
            if L + n > self.buf_k.shape[-2]:
                raise RuntimeError(f"the reserved KV cache holds {self.buf_k.shape[-2]} positions; "
                                   f"{L + n} were asked for")
            self.buf_k[:, :, L:L + n], self.buf_v[:, :, L:L + n] = key_states, value_states
            self.keys, self.values = self.buf_k[:, :, :L + n], self.buf_v[:, :, :L + n]
            return self.keys, self.values

        def batch_select_indices(self, indices: torch.Tensor) -> None:
            L = self.keys.shape[-2]
            self.buf_k, self.buf_v = self.buf_k[indices], self.buf_v[indices]
            self.keys, self.values = self.buf_k[:, :, :L], self.buf_v[:, :, :L]

    return ReservedLayer


def reserved_layer(keys: torch.Tensor, values: torch.Tensor, capacity: int):
    """A full-attention cache layer (transformers' ``DynamicLayer``) holding ``keys, values (B,
    H_kv, L, D)`` in preallocated buffers of ``capacity ≥ L`` positions: each ``update`` writes
    into the next free slots and returns views of the filled part (see :func:`reserve_cache`);
    ``L`` may be 0 (an empty cache with room reserved).

    Raises:
        RuntimeError: later, from ``update``, if more than ``capacity`` positions are written.
    """
    return _reserved_layer_class()(keys, values, int(capacity))


def reserve_cache(cache, extra: int) -> bool:
    """Give every full-attention layer of a transformers ``DynamicCache`` room for ``extra`` more
    positions, in place, so that decoding writes each step's keys and values into preallocated
    buffers instead of concatenating the whole cache per step (``DynamicLayer.update`` copies
    ``(B, H, L, D)`` per layer per step; on SmolLM2-135M, 2 prompts of ~520 tokens × 4 rows,
    96 new tokens, one core, the decode runs 1.16–1.18× faster without it). Attention reads the
    same values (views of the filled part), so every logit is unchanged (tested bit for bit
    against ``DynamicCache``).

    Layers of another type (sliding-window, quantised, linear-attention) are left as they are,
    as is a cache without per-layer objects (transformers releases before 4.56).

    Args:
        cache: a ``DynamicCache`` after its prefill (``B`` rows of ``L`` positions per layer).
        extra: positions to reserve beyond ``L`` (the decode's ``max_new``).

    Returns:
        True where at least one layer was reserved.

    Raises:
        RuntimeError: later, from ``update``, if more than ``extra`` positions are written.
    """
    from transformers.cache_utils import DynamicLayer

    layers = getattr(cache, "layers", None)
    done = False
    for i, layer in enumerate(layers or ()):
        if type(layer) is DynamicLayer and layer.is_initialized and layer.keys.numel():
            layers[i] = reserved_layer(layer.keys, layer.values, layer.keys.shape[-2] + int(extra))
            done = True
    return done


def shared_prompt_logprobs(model, batch: Batch, temperature: float = 1.0, *,
                           chunk_rows: int = 8) -> torch.Tensor:
    """:func:`token_logprobs` with each distinct prompt forwarded once.

    Rows with equal prompt ids (a GRPO group) share ONE prompt forward (:func:`prefill`): the
    logits of each prompt's last position predict every one of its rows' first completion token,
    and its KV cache is copied to its rows (``batch_select_indices``, differentiable) for the
    forward of the rows' completion tokens (but the last) at positions ``prompt_len + j``, the
    prompt's padding left in the cache as masked holes. The completions are forwarded in buckets
    of similar length (:func:`length_buckets`), so a long completion does not pad every row to
    its length. Gradients reach the knobs through both forwards, so the total gradient equals
    :func:`token_logprobs`' to float rounding (tested); a row's own share of the prompt part's
    gradient is not separable (rows share the prompt's activations), hence per-row gradient
    knobs (``SVDAdapter.per_sample``) need the unshared path. On a GRPO step of the toy (P
    prompts of ~112 tokens, G = 6 completions of ~34) this forwards ~1,300 tokens per step
    instead of ~3,500.

    Args:
        model: causal LM whose forward takes ``position_ids``, a 2-D ``attention_mask`` with
            holes and a transformers ``DynamicCache`` (every decoder-only model in transformers
            whose cache layers keep their state in ``keys`` / ``values``).
        batch: from :func:`build_batch`, on the model's device.
        temperature: ``T > 0``.
        chunk_rows: rows per fp32 log-sum-exp chunk.

    Returns:
        ``logp (B, L)`` laid out as :func:`token_logprobs`' (0 off completion tokens).

    Raises:
        ValueError: ``temperature <= 0``.
    """
    import copy

    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    B, L = batch.input_ids.shape
    dev = batch.input_ids.device
    out_dtype = torch.float64 if next(model.parameters()).dtype == torch.float64 else torch.float32
    plen, clen = batch.prompt_lens.tolist(), batch.completion_lens.tolist()
    ids_cpu = batch.input_ids.cpu()
    first: dict[tuple, int] = {}
    row_group = [first.setdefault(tuple(ids_cpu[b, :plen[b]].tolist()), len(first)) for b in range(B)]
    cache, z0, patt, _ = prefill(model, list(first), 0, dev)  # z0 (P, V)
    rows_l, cols_l, vals_l = [], [], []
    for rows in length_buckets(clen):
        if max(clen[b] for b in rows) == 0:
            continue
        Lc = max(clen[b] for b in rows)
        comp = torch.zeros(len(rows), Lc, dtype=torch.long)
        for i, b in enumerate(rows):
            comp[i, :clen[b]] = ids_cpu[b, plen[b]:plen[b] + clen[b]]
        cmask = (torch.arange(Lc)[None] < torch.tensor([clen[b] for b in rows])[:, None]).to(dev)
        comp, rg = comp.to(dev), torch.tensor([row_group[b] for b in rows], device=dev)
        logits = [z0.index_select(0, rg)[:, None]]  # (b, 1, V): predicts completion token 0
        if Lc > 1:
            part = copy.copy(cache)  # the prompt cache copied to the bucket's rows, with grad
            part.layers = [copy.copy(layer) for layer in cache.layers]
            part.batch_select_indices(rg)
            att = torch.cat([patt.index_select(0, rg), cmask[:, :-1].long()], dim=1)
            pos = torch.tensor([plen[b] for b in rows], device=dev)[:, None] + torch.arange(Lc - 1, device=dev)
            logits.append(model(input_ids=comp[:, :-1], attention_mask=att, position_ids=pos,
                                use_cache=True, **{cache_kwarg(model): part}).logits)
        for r0 in range(0, len(rows), chunk_rows):
            z = torch.cat([x[r0:r0 + chunk_rows] for x in logits], 1).to(out_dtype) / temperature
            picked = z.gather(-1, comp[r0:r0 + chunk_rows, :, None]).squeeze(-1)
            m = cmask[r0:r0 + chunk_rows]
            vals_l.append((picked - torch.logsumexp(z, dim=-1))[m])
            r_idx = torch.tensor(rows[r0:r0 + chunk_rows], device=dev)[:, None].expand_as(m)
            rows_l.append(r_idx[m])
            cols_l.append((torch.tensor([plen[b] for b in rows[r0:r0 + chunk_rows]], device=dev)[:, None]
                           + torch.arange(Lc, device=dev))[m])
    full = torch.zeros(B, L, dtype=out_dtype, device=dev)
    if not vals_l:
        return full
    return full.index_put((torch.cat(rows_l), torch.cat(cols_l)), torch.cat(vals_l))


def length_buckets(lengths: Sequence[int], overhead: int = 128) -> list[list[int]]:
    """Rows grouped by length for padded forwards: indices sorted by length, cut where it lowers
    ``Σ_buckets (rows · longest + overhead)`` (padded tokens plus a per-forward cost in tokens),
    by dynamic programming over the sorted order (exact for that cost, O(B²)).

    Returns:
        lists of row indices, shortest bucket first; every row in exactly one.
    """
    order = sorted(range(len(lengths)), key=lambda i: lengths[i])
    n = len(order)
    best, cut = [0.0] + [float("inf")] * n, [0] * (n + 1)
    for j in range(1, n + 1):  # best[j]: the first j sorted rows
        for i in range(j):
            c = best[i] + (j - i) * lengths[order[j - 1]] + overhead
            if c < best[j]:
                best[j], cut[j] = c, i
    out, j = [], n
    while j > 0:
        out.append(order[cut[j]:j])
        j = cut[j]
    return out[::-1]
