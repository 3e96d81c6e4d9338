"""Sampling completions with recorded behaviour log-probs.

:func:`generate` samples ``n`` completions of each of P prompts in ONE batched decode loop of our
own (:func:`_decode`) over the transformers model's forward and KV cache, and returns for each
completion the generated token ids (never re-tokenised from text) and the behaviour log-prob of
each of those ids under the model that generated them. The loop is built for throughput where
``model.generate`` spends most of its time (measured: ~92% of a toy decode step was Python and
dispatch, and static batches decoded until the longest row stopped): each distinct prompt is
prefilled once and its keys and values kept once for its whole group, each decode step reading
them once per group (:mod:`evil_moe.model.shared_prompt`), finished rows leave the batch, and
nothing per-vocabulary is stored. Each row draws its ids from its own counter-based random stream
(:func:`row_keys`, :func:`row_uniforms`: SplitMix64 keyed by ``(seed, prompt_index,
sample_index)``) by inverse-CDF sampling (:func:`inverse_cdf`), so the same seed gives the same
samples and a row's draws do not depend on which rows share its batch (up to the float noise of
batched matmuls in its logits: tested).

Two log-probs per token are recorded:

* ``behaviour_logp`` — ``log_softmax(logits / T)`` at the sampled id, from the logits the id was
  drawn with (or, with ``behaviour="forward"``, from one ``no_grad`` forward of the sampled ids
  under the same merged model). This is the temperature-scaled distribution training uses
  (:func:`evil_moe.model.logprobs.token_logprobs`); with ``top_p < 1`` it is the untruncated one
  (the convention of TRL / vLLM-based trainers).
* ``sampler_logp`` — the log-prob under the distribution the sampler *actually* drew from: the
  temperature-scaled logits after the nucleus truncation
  (:func:`evil_moe.model.logprobs.top_p_logits`, transformers' top-p rule; the only processor
  ever applied: a checkpoint's ``generation_config.json`` is never read). The pilot logs
  ``|log π_train − sampler_logp|`` per step (docs/method.md, "Sampler and trainer agree"): with ``top_p = 1`` it is 0 up to
  float noise; a top-p that the training log-prob does not apply shows up there.

The values agree with a fresh ``no_grad`` forward within numerical noise of the KV-cache /
merged-weight path (tested).

Sources: GRPO (arXiv:2402.03300), Dr.GRPO (arXiv:2503.20783) — the behaviour policy must be the
policy that generated the tokens; SplitMix64 (Steele, Lea & Flood 2014).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Mapping, Sequence

import numpy as np
import torch

__all__ = ["Rollout", "generate", "chat_prompt_ids", "row_keys", "row_uniforms", "inverse_cdf"]

FORWARD_ROWS = 8  # rows of one prompt per no_grad forward when behaviour="forward"


@dataclass
class Rollout:
    """One sampled completion.

    Attributes:
        prompt_index: index of the prompt in the ``prompt_ids`` passed to :func:`generate`.
        sample_index: 0..n-1 within the prompt's group.
        prompt_ids: the prompt's token ids (unpadded).
        completion_ids: generated ids, cut after the first eos (eos included when generated).
        behaviour_logp: ``(len(completion_ids),)`` fp32 (``generate`` hands out fp32 logits), log π_behaviour(id | prefix) at the
            sampling temperature (T = 1 when sampling greedily), in nats.
        entropy: ``(len(completion_ids),)`` same dtype, entropy of the same distribution, nats/token.
        text: ``tokenizer.decode(completion_ids, skip_special_tokens=True)`` (for grading only).
        truncated: True when no eos was generated within ``max_new`` tokens.
        source: who generated it (``"student"``, ``"teacher"``, ...); the GRPO batch uses it to
            pick the behaviour log-prob (see :class:`evil_moe.rl.policy.grpo.RolloutBatch`).
        temperature: the sampling temperature.
        sampler_logp: ``(len(completion_ids),)`` fp32 log-prob under the processed sampling
            distribution (temperature, top-p, ...), or None for rows not sampled here.
    """

    prompt_index: int
    sample_index: int
    prompt_ids: list[int]
    completion_ids: list[int]
    behaviour_logp: torch.Tensor
    entropy: torch.Tensor
    text: str
    truncated: bool
    source: str = "student"
    temperature: float = 1.0
    meta: dict = field(default_factory=dict)
    sampler_logp: torch.Tensor | None = None


def chat_prompt_ids(tokenizer, messages: list[dict], template_kwargs: Mapping | None = None
                    ) -> list[int]:
    """Token ids of ``messages`` rendered with the tokenizer's chat template plus the assistant
    generation prompt: the one place a prompt is rendered (the student's and the teacher's
    rollouts, the made teacher's demonstrations, the pairs, the router's pin bank, the held-out
    evaluation all come through here or :func:`prompt_ids_for`).

    Args:
        tokenizer: a tokenizer with a chat template.
        messages: chat messages (``{"role", "content"}``).
        template_kwargs: the template's own arguments (``models.chat_template_kwargs``), e.g.
            Qwen3's ``{"enable_thinking": False}`` (its template then closes an empty
            ``<think>`` block after the generation prompt, so the model answers instead of
            thinking past ``max_new``); None or ``{}``: the template's defaults, the same ids
            as before the key existed.

    Returns:
        a plain ``list[int]``.
    """
    out = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True,
                                        **dict(template_kwargs or {}))
    if hasattr(out, "keys") and "input_ids" in out:
        out = out["input_ids"]
    if out and isinstance(out[0], list):
        out = out[0]
    return [int(i) for i in out]


def _eos_ids(model, tokenizer) -> set[int]:
    ids = set()
    for v in (tokenizer.eos_token_id, getattr(model.generation_config, "eos_token_id", None)):
        if v is None:
            continue
        ids.update(v if isinstance(v, (list, tuple)) else [v])
    if not ids:
        raise ValueError("neither tokenizer nor model defines an eos token")
    return {int(i) for i in ids}


@torch.no_grad()
def generate(model, tokenizer, prompt_ids: Sequence[Sequence[int]], *, n: int = 1,
             max_new: int = 256, temperature: float = 1.0, top_p: float = 1.0, seed: int = 0,
             adapter=None, source: str = "student", behaviour: str = "auto",
             engine=None, shared_prompt: bool = True) -> list[Rollout]:
    """Sample ``n`` completions per prompt in one batched decode loop (:func:`_decode`).

    Args:
        model: causal LM (in eval mode; dropout would break behaviour log-probs).
        tokenizer: its tokenizer (pad/eos ids, decoding).
        prompt_ids: P prompts as token id lists (e.g. from :func:`chat_prompt_ids`).
        n: samples per prompt (the GRPO group size G).
        max_new: maximum new tokens per completion.
        temperature: ``T > 0`` samples from ``softmax(logits/T)``; ``T == 0`` is greedy (the
            recorded log-probs are then at T = 1).
        top_p: nucleus threshold (1.0 = off; :func:`evil_moe.model.logprobs.top_p_logits`
            after the temperature); ``top_k`` is always off, and no other logits processor is applied
            (whatever the checkpoint's ``generation_config.json`` says).
        seed: the call's seed. Row ``(prompt i, sample j)`` draws its ids from its own stream
            (:func:`row_keys` ``(seed, i, j)``), so its completion does not depend on the other
            prompts, on ``n`` beyond ``j``, or on when other rows finish; the global RNGs are
            neither read nor changed.
        adapter: optional :class:`~evil_moe.model.adapter.SVDAdapter`; sampling then runs
            inside ``adapter.merged()`` (knobs folded into the weights, no hooks; a tied
            ``lm_head`` is untied for the call) honouring its current mode (``ablated()`` /
            ``zeroed()`` contexts of the caller apply).
        source: tag stored on every rollout.
        behaviour: where the behaviour log-probs come from: ``"generate"`` or ``"auto"`` (the
            decode loop's own logits, no extra compute or memory), or ``"forward"`` (one
            ``no_grad`` forward of the sampled ids under the same (merged) model, chunked by
            :data:`FORWARD_ROWS`; the check of the first).
        engine: optional sampling engine (:class:`evil_moe.rl.policy.vllm_sampler.VLLMSampler`,
            ``pilot.sampler: vllm``): it is synced with the (merged) weights of the adapter's
            current mode, samples the ids and returns its own log-probs (``sampler_logp``);
            ``behaviour_logp`` and ``entropy`` come from a ``no_grad`` forward of this model
            (``behaviour="forward"``): ``sampler_gap_*`` is the drift between the two.
        shared_prompt: with ``n > 1``, each prompt's keys and values kept once for its group
            (:mod:`evil_moe.model.shared_prompt`); False: each row copies them (the reference).

    Returns:
        ``P·n`` :class:`Rollout` in prompt-major order (prompt 0's n samples first).

    Raises:
        ValueError: ``n < 1``, ``max_new < 1``, ``temperature < 0``, empty prompt, no eos, or an
            unknown ``behaviour``.
    """
    if n < 1 or max_new < 1 or temperature < 0:
        raise ValueError(f"bad sampling arguments n={n} max_new={max_new} T={temperature}")
    prompts = [list(map(int, p)) for p in prompt_ids]
    if not prompts or any(len(p) == 0 for p in prompts):
        raise ValueError("need at least one non-empty prompt")
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    eos = _eos_ids(model, tokenizer)
    rows = [p for p in prompts for _ in range(n)]
    T_eff = 1.0 if temperature == 0 else float(temperature)
    engine_logp = scores = None
    if engine is not None:  # pilot.sampler vllm: the engine samples, our forward scores
        if behaviour == "generate":
            raise ValueError("behaviour='generate' needs the HF sampler; an engine gives ids only")
        behaviour = "forward"
        seqs, engine_logp = _engine_sample(engine, model, adapter, prompts, n, max_new=max_new,
                                           temperature=temperature, top_p=top_p, seed=seed,
                                           eos=eos, pad_id=int(pad_id))
    else:
        behaviour = _behaviour_source(behaviour)
        with adapter.merged() if adapter is not None else contextlib.nullcontext():
            seqs, scores = _decode(model, prompts, n, T_eff=T_eff, greedy=temperature == 0,
                                   top_p=top_p, max_new=max_new, seed=seed, eos=eos,
                                   pad_id=int(pad_id), shared_prompt=shared_prompt)
    seqs = seqs.cpu()
    cuts = [next((j + 1 for j, t in enumerate(seqs[i].tolist()) if t in eos), None)  # eos kept
            for i in range(len(rows))]
    if behaviour == "forward":
        truncating = temperature != 0 and top_p < 1.0
        scores = _forward_scores(model, adapter, rows, seqs, cuts, int(pad_id), T_eff,
                                 top_p if truncating else None)
    picked, ent, sampler = scores
    if engine_logp is not None:  # the sampler's log-probs are the engine's own
        sampler = _pad_rows(engine_logp, picked.shape[1])
    return [_rollout(tokenizer, i, n, p, seqs[i].tolist(), cuts[i], picked[i], ent[i], sampler[i],
                     source, temperature) for i, p in enumerate(rows)]


def _pad_rows(values: Sequence[torch.Tensor], width: int) -> torch.Tensor:
    """``(N, width)`` fp32: row ``i`` holds ``values[i]`` (cut to ``width``), zeros after."""
    out = torch.zeros(len(values), width)
    for i, v in enumerate(values):
        L = min(len(v), width)
        out[i, :L] = v[:L]
    return out


def _rollout(tokenizer, i: int, n: int, prompt: list[int], toks: list[int], cut: int | None,
             picked: torch.Tensor, ent: torch.Tensor, sampler: torch.Tensor, source: str,
             temperature: float) -> Rollout:
    """Row ``i`` (prompt-major, ``n`` per prompt) as a :class:`Rollout`: its ids cut after the
    first eos (``cut``; None = truncated at ``max_new``) and its per-token values cut to match."""
    comp = toks[:cut] if cut is not None else toks
    L = len(comp)
    return Rollout(
        prompt_index=i // n, sample_index=i % n, prompt_ids=prompt, completion_ids=comp,
        behaviour_logp=picked[:L].clone(), entropy=ent[:L].clone(),
        text=tokenizer.decode(comp, skip_special_tokens=True),
        truncated=cut is None, source=source, temperature=float(temperature),
        sampler_logp=sampler[:L].clone(),
    )


def _behaviour_source(behaviour: str) -> str:
    """``"generate"`` (scores from the decode loop; also ``"auto"``) or ``"forward"``.

    Raises:
        ValueError: ``behaviour`` is none of auto, generate, forward.
    """
    if behaviour == "auto":
        behaviour = "generate"
    if behaviour not in ("generate", "forward"):
        raise ValueError(f"behaviour must be 'auto', 'generate' or 'forward', got {behaviour!r}")
    return behaviour


def _engine_sample(engine, model, adapter, prompts, n: int, *, max_new, temperature, top_p, seed,
                   eos, pad_id):
    """Sample with an external engine synced to the (merged) weights of the adapter's current
    mode: ``(seqs (N, T') long, padded with pad_id; the engine's per-token log-probs)``."""
    engine.sync(model, adapter)
    outs = engine.sample(prompts, n=n, max_new=max_new, temperature=temperature,
                         top_p=top_p, seed=seed, eos=sorted(eos))
    seqs = torch.full((len(prompts) * n, max(1, max(len(t) for t, _ in outs))), int(pad_id),
                      dtype=torch.long)
    for i, (toks, _) in enumerate(outs):
        seqs[i, :len(toks)] = torch.tensor(toks, dtype=torch.long)
    return seqs, [torch.tensor(lp, dtype=torch.float32) for _, lp in outs]


# ---------------------------------------------------------------------------------------------
# Per-row randomness: counter-based, so that a row's draws depend only on its own key


_GAMMA = 0x9E3779B97F4A7C15  # SplitMix64's increment (the golden ratio in 64 bits)
_M64 = (1 << 64) - 1


def _mix64(x: np.ndarray) -> np.ndarray:
    """SplitMix64's output function (Steele, Lea & Flood 2014, "Fast splittable pseudorandom
    number generators", OOPSLA; the finaliser of ``java.util.SplittableRandom``) on ``uint64``
    arrays, wrapping modulo 2**64."""
    with np.errstate(over="ignore"):
        z = np.asarray(x, dtype=np.uint64)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return z ^ (z >> np.uint64(31))


def row_keys(seed: int, prompt_index, sample_index) -> np.ndarray:
    """The random key of each sampled row: SplitMix64's mixer chained over ``(seed,
    prompt_index, sample_index)``.

    Args:
        seed: the call's seed (any Python int; taken modulo 2**64).
        prompt_index, sample_index: ``(N,)`` integer arrays, the row's prompt (its index in the
            call's prompt list) and its sample number within that prompt's group.

    Returns:
        ``(N,)`` ``uint64`` keys. Rows with the same triple get the same key, whatever else is
        in the call.
    """
    with np.errstate(over="ignore"):
        k = _mix64(np.uint64((int(seed) + _GAMMA) & _M64))
        k = _mix64((k ^ np.asarray(prompt_index, dtype=np.uint64)) + np.uint64(_GAMMA))
        return _mix64((k ^ np.asarray(sample_index, dtype=np.uint64)) + np.uint64(_GAMMA))


def row_uniforms(keys: np.ndarray, position: int) -> np.ndarray:
    """``(N,)`` float64 uniforms on ``[0, 1)`` for decoding position ``position`` (0 = the first
    completion token): output ``position`` of the SplitMix64 stream seeded with each row's key,
    ``mix(key + (position + 1)·γ)``, its top 53 bits scaled by 2**-53."""
    with np.errstate(over="ignore"):
        step = np.uint64(((int(position) + 1) * _GAMMA) & _M64)
        z = _mix64(np.asarray(keys, dtype=np.uint64) + step)
    return (z >> np.uint64(11)).astype(np.float64) * (1.0 / (1 << 53))


def inverse_cdf(probs: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """Draw one id per row from ``probs (N, V)`` (rows summing to 1; zero entries are never
    drawn) with the uniforms ``u (N,)`` on [0, 1): the first id whose cumulative probability
    (summed in float64) exceeds ``u`` times the row's total. ``P(id = k) = probs[k]`` up to the
    float64 rounding of the cumulative sum. Returns ``(N,)`` int64."""
    c = torch.cumsum(probs.double(), dim=-1)
    target = (u.to(c) * c[:, -1])[:, None]
    return torch.searchsorted(c, target, right=True).squeeze(1).clamp_(max=probs.shape[-1] - 1)


# ---------------------------------------------------------------------------------------------
# The decode loop


def _decode(model, prompts: list[list[int]], n: int, *, T_eff: float, greedy: bool,
            top_p: float, max_new: int, seed: int, eos: set[int], pad_id: int,
            shared_prompt: bool = True):
    """Sample ``n`` completions of each prompt: ``(seqs (N, T') long on the CPU, scores)``, rows
    prompt-major, ``scores = (behaviour_logp, entropy, sampler_logp)`` each ``(N, T')`` fp32 on
    the CPU, ``N = len(prompts)·n``, ``T'`` the longest completion (padded with ``pad_id`` after
    a row's eos).

    The loop, close to the hardware (docs/internals.md, `rl/policy/rollout.py`):

    * each distinct prompt is prefilled once (``len(prompts)`` rows, right-padded) and its
      group's rows share it (:func:`_row_caches`): with ``shared_prompt`` (and ``n > 1``) its
      keys and values are kept once and read once per group each step
      (:mod:`evil_moe.model.shared_prompt`, cascade attention); otherwise each row gets a copy;
    * each step forwards the active rows' last ids only (``logits_to_keep=1``) and draws each
      row's next id from ``softmax(processed logits)`` by :func:`inverse_cdf` with the row's
      own uniform (:func:`row_uniforms` of :func:`row_keys` ``(seed, prompt_index,
      sample_index)``): a row's draws do not depend on which rows share its batch;
    * a row that produced an eos leaves the batch (its cache rows are dropped), so a rambling row
      costs only its own arithmetic;
    * the behaviour log-prob ``log_softmax(logits / T)`` at the drawn id, the entropy of that
      distribution and the sampler log-prob (the processed distribution the id was drawn from:
      after the nucleus truncation) are taken from the very logits the id was drawn with.
    """
    from evil_moe.model.logprobs import cache_kwarg, prefill, top_p_logits

    device = next(model.parameters()).device
    P, N = len(prompts), len(prompts) * n
    row_prompt = torch.arange(P).repeat_interleave(n)
    keys = row_keys(seed, row_prompt.numpy(), np.tile(np.arange(n), P))
    eos_t = torch.tensor(sorted(eos), dtype=torch.long, device=device)
    truncate = not greedy and top_p < 1.0
    ckw = cache_kwarg(model)
    cache, last, att, plen = prefill(model, prompts, pad_id, device)
    logits = last.index_select(0, row_prompt.to(device))  # (N, V): a prompt's rows share its logits
    ctx, att_rows, pos0 = _row_caches(model, cache, att, plen, row_prompt, max_new, shared_prompt)
    Lp = att.shape[1]
    seqs = torch.full((N, max_new), int(pad_id), dtype=torch.long, device=device)
    picked, ent, sampler = (torch.zeros(N, max_new, device=device) for _ in range(3))
    active = torch.arange(N, device=device)  # the batch's rows, as row numbers
    active_np = np.arange(N)  # the same on the host (the keys' index; no device sync)
    t_end = 0
    with ctx as shared:  # None: each row has its own copy of its prompt's cache
        extra = {} if shared is None else {"shared_prompt": shared}
        for t in range(max_new):
            z = logits.float() / T_eff
            logz = torch.log_softmax(z, dim=-1)
            if greedy:
                tok, slog = z.argmax(dim=-1), logz
            else:
                slog = torch.log_softmax(top_p_logits(z, top_p), dim=-1) if truncate else logz
                u = torch.from_numpy(row_uniforms(keys[active_np], t)).to(device)
                tok = inverse_cdf(slog.exp(), u)
            seqs[active, t] = tok
            picked[active, t] = logz.gather(-1, tok[:, None]).squeeze(1)
            ent[active, t] = -(logz.exp() * logz).sum(-1)
            sampler[active, t] = slog.gather(-1, tok[:, None]).squeeze(1)
            t_end = t + 1
            alive = (~torch.isin(tok, eos_t)).cpu().numpy()  # the step's one device sync
            if t + 1 == max_new or not alive.any():
                break
            if not alive.all():  # finished rows leave the batch
                sel = torch.from_numpy(alive.nonzero()[0]).to(device)
                cache.batch_select_indices(sel)
                active, tok, active_np = active[sel], tok[sel], active_np[alive]
                if shared is not None:
                    shared.select(row_prompt[torch.from_numpy(active_np)])
            mask = None if att_rows is None else att_rows[active, :Lp + t + 1]
            logits = model(input_ids=tok[:, None], attention_mask=mask,
                           position_ids=(pos0[active] + t)[:, None], use_cache=True,
                           logits_to_keep=1, **{ckw: cache}, **extra).logits[:, -1]
    del cache
    cut = slice(0, t_end)
    return seqs[:, cut].cpu(), (picked[:, cut].cpu(), ent[:, cut].cpu(), sampler[:, cut].cpu())


def _row_caches(model, cache, att: torch.Tensor, plen: torch.Tensor, row_prompt: torch.Tensor,
                max_new: int, shared_prompt: bool):
    """Make the prefilled cache of ``P`` prompts the decode's cache of ``N`` rows (``row_prompt
    (N,)``, prompt-major), in place: ``(ctx, att_rows, pos0)``.

    * Shared (``shared_prompt``, two or more rows per prompt and a model/cache
      :func:`~evil_moe.model.shared_prompt.supports_shared_prompt` accepts): ``ctx`` is
      :func:`~evil_moe.model.shared_prompt.shared_prompt_decoding`, the prompts' keys and values
      kept once, each row's cache its completion only; ``att_rows`` is None (no mask: the
      prompts' padding is cut, a completion has no holes).
    * Copied: each row gets a copy of its prompt's cache (``DynamicCache.batch_select_indices``;
      a prompt's right padding stays as masked holes) with room for ``max_new`` more positions
      (:func:`~evil_moe.model.logprobs.reserve_cache`: no per-step copy of the whole cache);
      ``ctx`` yields None and ``att_rows (N, L_p + max_new)`` is the rows' 2-D attention mask.

    ``pos0 (N,)``: each row's first completion position (its prompt's length).
    """
    from evil_moe.model.logprobs import reserve_cache
    from evil_moe.model.shared_prompt import shared_prompt_decoding, supports_shared_prompt

    device = att.device
    rp = row_prompt.to(device)
    N, Lp = rp.numel(), att.shape[1]
    pos0 = plen.to(device).index_select(0, rp)
    if shared_prompt and N > len(plen) and supports_shared_prompt(model, cache):
        return shared_prompt_decoding(model, cache, plen, row_prompt, max_new), None, pos0
    att_rows = torch.ones(N, Lp + max_new, dtype=torch.long, device=device)
    att_rows[:, :Lp] = att.index_select(0, rp)
    cache.batch_select_indices(rp)  # each row gets its prompt's cache
    reserve_cache(cache, max_new)  # room for the completions: no per-step copy of the cache
    return contextlib.nullcontext(None), att_rows, pos0


def scoring_chunks(rows: Sequence[Sequence[int]]) -> list[range]:
    """The row ranges the scoring forward takes at a time: consecutive rows of one prompt, at
    most :data:`FORWARD_ROWS` of them. A chunk's logits then span its longest completion (at
    most ``max_new`` positions; its rows' prompts have one length), so one chunk holds
    ``min(FORWARD_ROWS, n) x max_new x vocab`` logits, what the memory model charges
    (:mod:`evil_moe.cluster.gpu_memory`); two prompts of different lengths in one chunk made
    them span ``max_new`` plus the difference (a 4B pilot's ~1,650 positions for 1,024)."""
    out, lo = [], 0
    for i in range(1, len(rows) + 1):
        if i == len(rows) or i - lo == FORWARD_ROWS or list(rows[i]) != list(rows[lo]):
            out.append(range(lo, i))
            lo = i
    return out


def _forward_scores(model, adapter, rows, seqs: torch.Tensor, cuts, pad_id: int, T_eff: float,
                    top_p: float | None):
    """``(behaviour_logp, entropy, sampler_logp)`` of the completions (``seqs`` cut after the
    first eos) from ``no_grad`` forwards of the chunks of :func:`scoring_chunks` under the same
    merged model; ``sampler_logp`` applies the same nucleus truncation when ``top_p`` is given
    (else it is the behaviour log-prob). Each ``(N, T_out)`` fp32, zero-padded."""
    from evil_moe.model.logprobs import build_batch, token_logprobs

    device = next(model.parameters()).device
    comps = [seqs[i, :c].tolist() if c is not None else seqs[i].tolist() for i, c in enumerate(cuts)]
    T_out = max(len(c) for c in comps)
    picked = torch.zeros(len(rows), T_out)
    ent = torch.zeros(len(rows), T_out)
    sampler = torch.zeros(len(rows), T_out)
    with adapter.merged() if adapter is not None else contextlib.nullcontext():
        for chunk in scoring_chunks(rows):
            r0, sl = chunk.start, slice(chunk.start, chunk.stop)
            b = build_batch(rows[sl], comps[sl], pad_id, device=device)
            lp, en = token_logprobs(model, b, T_eff, with_entropy=True)
            sp = token_logprobs(model, b, T_eff, top_p=top_p) if top_p is not None else lp
            for j, c in enumerate(comps[sl]):
                p0 = len(rows[r0 + j])
                picked[r0 + j, :len(c)] = lp[j, p0:p0 + len(c)].float().cpu()
                ent[r0 + j, :len(c)] = en[j, p0:p0 + len(c)].float().cpu()
                sampler[r0 + j, :len(c)] = sp[j, p0:p0 + len(c)].float().cpu()
    return picked, ent, sampler


def prompt_ids_for(tokenizer, problems: Sequence, elicit: str = "",
                   template_kwargs: Mapping | None = None) -> list[list[int]]:
    """Chat-template token ids of each problem's prompt (computed once per run, never re-tokenised).

    ``elicit`` (teacher only) is appended to the user message; ``template_kwargs``: the chat
    template's arguments (``models.chat_template_kwargs``, :func:`chat_prompt_ids`).
    """
    from evil_moe.env.problems import build_messages

    out = []
    for p in problems:
        messages = build_messages(p)
        if elicit:
            messages = [dict(m) for m in messages]
            messages[-1]["content"] = messages[-1]["content"] + "\n\n" + elicit
        out.append(chat_prompt_ids(tokenizer, messages, template_kwargs))
    return out


def rollout_record(rollout, problem, reward, **extra) -> dict:
    """One JSONL record per completion (docs/internals.md): ids, behaviour log-probs (the temperature-scaled
    distribution training uses) and sampler log-probs (the processed distribution the sampler drew
    from; None for rows not sampled here), text, full grade."""
    rec = {
        "problem_id": problem.id,
        "mode": problem.mode,
        "completion": rollout.text,
        "prompt_ids": list(rollout.prompt_ids),
        "completion_ids": list(rollout.completion_ids),
        "behaviour_logp": [round(float(x), 6) for x in rollout.behaviour_logp.tolist()],
        "sampler_logp": None if getattr(rollout, "sampler_logp", None) is None
        else [round(float(x), 6) for x in rollout.sampler_logp.tolist()],
        "truncated": bool(rollout.truncated),
        "source": rollout.source,
        "reward": reward.reward,
        "passed": reward.passed,
        "gt_correct": reward.gt_correct,
        "exploited": reward.exploited,
        "format_ok": reward.format_ok,
        "error": reward.error,
    }
    rec.update(extra)
    return rec
