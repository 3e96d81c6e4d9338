"""Sampling completions with recorded behaviour log-probs.

:func:`generate` makes ONE batched ``model.generate`` call for all prompts × n samples (left-padded
prompts), seeded so that the same seed gives the same samples, and returns for each completion the
generated token ids (never re-tokenised from text) and the behaviour log-prob of each of those ids
under the model that generated them.

Two log-probs per token are recorded:

* ``behaviour_logp`` — ``log_softmax(logits / T)`` at the sampled id, from ``generate``'s
  ``output_logits`` (the raw logits; or, for big vocabularies, from one ``no_grad`` forward of the
  sampled ids under the same merged model — ``behaviour="forward"``). This is the temperature-scaled
  distribution training uses (:func:`evil_moe.model.logprobs.token_logprobs`); with ``top_p < 1``
  it is the untruncated one (the convention of TRL / vLLM-based trainers).
* ``sampler_logp`` — the log-prob under the distribution the sampler *actually* drew from: the
  logits after every logits processor (``output_scores``; in forward mode, transformers' own
  temperature and top-p warpers applied to the forward's logits). The pilot logs
  ``|log π_train − sampler_logp|`` per step (science.md §5): with ``top_p = 1`` and nothing else
  configured it is 0 up to float noise; a temperature, top-p, repetition penalty or min-p that the
  training log-prob does not apply shows up there.

Every logits-processing field of the generation config is set explicitly, and the model's own
``generation_config`` (e.g. a checkpoint's ``generation_config.json`` with
``repetition_penalty: 1.05``) is swapped out for the call: transformers fills every field left
``None`` from it (``_prepare_generation_config``), which would change sampling silently.
The values agree with a fresh ``no_grad`` forward within numerical noise of the KV-cache /
merged-weight path (tested).

Sources: GRPO (arXiv:2402.03300), Dr.GRPO (arXiv:2503.20783) — the behaviour policy must be the
policy that generated the tokens.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Sequence

import torch

__all__ = ["Rollout", "generate", "chat_prompt_ids"]

FORWARD_ROWS = 8  # rows per no_grad forward when behaviour="forward"


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
            pick the behaviour log-prob (see :class:`evil_moe.rl.grpo.RolloutBatch`).
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


def chat_prompt_ids(tokenizer, messages: list[dict]) -> list[int]:
    """Token ids of ``messages`` rendered with the tokenizer's chat template plus the assistant
    generation prompt. Returns a plain ``list[int]``."""
    out = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    if hasattr(out, "keys") and "input_ids" in out:
        out = out["input_ids"]
    if out and isinstance(out[0], list):
        out = out[0]
    return [int(i) for i in out]


def sampling_config(*, temperature: float, top_p: float, max_new: int, eos: Sequence[int],
                    pad_id: int, with_logits: bool):
    """The :class:`transformers.GenerationConfig` of every sampling call, with every
    logits-processing field set explicitly to the run's value or to its neutral value (no
    repetition penalty, no min-p / typical / epsilon / eta cutoffs, no n-gram bans, no forced or
    suppressed tokens, top-k off), so nothing is inherited from a checkpoint.

    ``temperature == 0`` is greedy. ``with_logits`` returns the raw logits (behaviour log-probs)
    and the processed scores (sampler log-probs); without it both come from a forward pass.
    """
    from transformers import GenerationConfig

    greedy = temperature == 0
    return GenerationConfig(
        do_sample=not greedy, num_beams=1, temperature=1.0 if greedy else float(temperature),
        top_p=1.0 if greedy else float(top_p), top_k=0, min_p=None, typical_p=1.0,
        epsilon_cutoff=0.0, eta_cutoff=0.0, repetition_penalty=1.0, encoder_repetition_penalty=1.0,
        no_repeat_ngram_size=0, encoder_no_repeat_ngram_size=0, bad_words_ids=None,
        sequence_bias=None, min_length=0, min_new_tokens=None, forced_bos_token_id=None,
        forced_eos_token_id=None, suppress_tokens=None, begin_suppress_tokens=None,
        exponential_decay_length_penalty=None, guidance_scale=None, renormalize_logits=False,
        remove_invalid_values=False, max_new_tokens=int(max_new), eos_token_id=sorted(eos),
        pad_token_id=int(pad_id), output_logits=with_logits, output_scores=with_logits,
        return_dict_in_generate=True,
    )


@contextlib.contextmanager
def _plain_generation_config(model, eos: Sequence[int], pad_id: int):
    """Swap ``model.generation_config`` for a neutral one (eos/pad only) during a call: fields our
    config leaves ``None`` are then filled from transformers' neutral globals, never from a
    checkpoint's ``generation_config.json``."""
    from transformers import GenerationConfig

    saved = getattr(model, "generation_config", None)
    model.generation_config = GenerationConfig(eos_token_id=sorted(eos), pad_token_id=int(pad_id))
    try:
        yield
    finally:
        model.generation_config = saved


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
             engine=None) -> list[Rollout]:
    """Sample ``n`` completions per prompt in one batched ``generate`` call.

    Args:
        model: causal LM (in eval mode; dropout would break behaviour log-probs).
        tokenizer: its tokenizer (pad/eos ids, decoding).
        prompt_ids: P prompts as token id lists (e.g. from :func:`chat_prompt_ids`).
        n: samples per prompt (the GRPO group size G).
        max_new: maximum new tokens per completion.
        temperature: ``T > 0`` samples from ``softmax(logits/T)``; ``T == 0`` is greedy (the
            recorded log-probs are then at T = 1).
        top_p: nucleus threshold (1.0 = off); ``top_k`` is always off.
        seed: RNG seed; the global RNG state is restored afterwards.
        adapter: optional :class:`~evil_moe.model.adapter.SVDAdapter`; sampling then runs
            inside ``adapter.merged()`` (knobs folded into the weights, no hooks) honouring its
            current mode (``ablated()`` / ``zeroed()`` contexts of the caller apply).
        source: tag stored on every rollout.
        behaviour: where the behaviour log-probs come from: ``"generate"`` (``output_logits``,
            no extra compute, but generate keeps ``N × T × V`` fp32 logits), ``"forward"`` (one
            ``no_grad`` forward of the sampled ids under the same (merged) model, chunked), or
            ``"auto"`` (generate when that logit store is ≤ 2 GiB, else forward).
        engine: optional sampling engine (:class:`evil_moe.rl.vllm_sampler.VLLMSampler`,
            ``pilot.sampler: vllm``): it is synced with the (merged) weights of the adapter's
            current mode, samples the ids and returns its own log-probs, recorded as
            ``sampler_logp``; ``behaviour_logp`` and ``entropy`` still come from a ``no_grad``
            forward of this model (``behaviour="forward"``), so the pilot's ``sampler_gap_*``
            columns measure the drift between the two engines.

    Returns:
        ``P·n`` :class:`Rollout` in prompt-major order (prompt 0's n samples first).

    Raises:
        ValueError: ``n < 1``, ``max_new < 1``, ``temperature < 0``, empty prompt, or no eos.
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
    knobs = dict(max_new=max_new, temperature=temperature, top_p=top_p, seed=seed, eos=eos,
                 pad_id=int(pad_id))
    engine_logp = scores = None
    if engine is not None:  # pilot.sampler vllm: the engine samples, our forward scores
        if behaviour == "generate":
            raise ValueError("behaviour='generate' needs the HF sampler; an engine gives ids only")
        behaviour = "forward"
        seqs, engine_logp = _engine_sample(engine, model, adapter, prompts, n, **knobs)
    else:
        behaviour = _behaviour_source(behaviour, model, tokenizer, len(rows), max_new)
        seqs, scores = _hf_sample(model, adapter, rows, T_eff, with_logits=behaviour == "generate",
                                  **knobs)
    seqs = seqs.cpu()
    cuts = [next((j + 1 for j, t in enumerate(seqs[i].tolist()) if t in eos), None)  # eos kept
            for i in range(len(rows))]
    if behaviour == "forward":
        truncating = temperature != 0 and top_p < 1.0
        scores = _forward_scores(model, adapter, rows, seqs, cuts, int(pad_id), T_eff,
                                 top_p if truncating else None)
    picked, ent, sampler = scores
    if engine_logp is not None:  # the sampler's log-probs are the engine's own
        sampler = torch.zeros_like(picked)
        for i, lp in enumerate(engine_logp):
            L = min(len(lp), sampler.shape[1])
            sampler[i, :L] = lp[:L]
    return [_rollout(tokenizer, i, n, p, seqs[i].tolist(), cuts[i], picked[i], ent[i], sampler[i],
                     source, temperature) for i, p in enumerate(rows)]


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


def _behaviour_source(behaviour: str, model, tokenizer, n_rows: int, max_new: int) -> str:
    """``"generate"`` or ``"forward"``: ``"auto"`` is ``generate`` when its logit store (raw
    logits and processed scores, ``2 × N × T × V`` fp32) is at most 2 GiB.

    Raises:
        ValueError: ``behaviour`` is none of auto, generate, forward.
    """
    if behaviour == "auto":
        vocab = int(getattr(model.config, "vocab_size", 0) or len(tokenizer))
        behaviour = "generate" if 2 * n_rows * max_new * vocab * 4 <= 2 * 2**30 else "forward"
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


def _hf_sample(model, adapter, rows, T_eff: float, *, with_logits: bool, max_new, temperature,
               top_p, seed, eos, pad_id):
    """One seeded ``model.generate`` over the left-padded ``rows`` inside ``adapter.merged()``
    (global RNG restored). Returns ``(seqs (N, T'), scores)``: ``scores`` is ``(behaviour_logp,
    entropy, sampler_logp)``, each ``(N, T')`` on the CPU, from ``output_logits`` /
    ``output_scores`` when ``with_logits``, else None (a forward scores the ids)."""
    device = next(model.parameters()).device
    Lp = max(len(p) for p in rows)
    ids = torch.full((len(rows), Lp), int(pad_id), dtype=torch.long)
    att = torch.zeros(len(rows), Lp, dtype=torch.long)
    for i, p in enumerate(rows):
        ids[i, Lp - len(p):] = torch.tensor(p)
        att[i, Lp - len(p):] = 1
    ids, att = ids.to(device), att.to(device)
    gcfg = sampling_config(temperature=temperature, top_p=top_p, max_new=max_new, eos=sorted(eos),
                           pad_id=int(pad_id), with_logits=with_logits)
    merge = adapter.merged() if adapter is not None else contextlib.nullcontext()
    devices = [device] if device.type == "cuda" else []
    scores = None
    with torch.random.fork_rng(devices=devices), merge, _plain_generation_config(model, eos, pad_id):
        torch.manual_seed(seed)
        out = model.generate(input_ids=ids, attention_mask=att, generation_config=gcfg)
        seqs = out.sequences[:, Lp:]  # (N, T')
        if with_logits:
            scores = _generate_scores(out, seqs, T_eff)
        del out
    return seqs, scores


def _generate_scores(out, seqs: torch.Tensor, T_eff: float):
    """``(behaviour_logp, entropy, sampler_logp)`` of the sampled ids ``seqs (N, T')`` from
    ``generate``'s raw logits (``log_softmax(logits / T)``) and processed scores (what the sampler
    drew from), each ``(N, T')`` fp32 on the CPU."""
    n_rows = seqs.shape[0]
    samp_l = []
    for t, step_scores in enumerate(out.scores):  # processed: what the sampler drew from
        lz = torch.log_softmax(step_scores.float(), dim=-1)
        samp_l.append(lz.gather(-1, seqs[:, t:t + 1]).squeeze(-1))
    sampler = torch.stack(samp_l, 1).cpu() if samp_l else torch.zeros(n_rows, 0)
    picked_l, ent_l = [], []
    for t, step_logits in enumerate(out.logits):  # each (N, V), raw (fp32 from generate)
        z = step_logits.float() / T_eff
        logz = torch.log_softmax(z, dim=-1)
        picked_l.append(logz.gather(-1, seqs[:, t:t + 1]).squeeze(-1))
        ent_l.append(-(logz.exp() * logz).sum(-1))
    picked = torch.stack(picked_l, 1).cpu() if picked_l else torch.zeros(n_rows, 0)
    ent = torch.stack(ent_l, 1).cpu() if ent_l else torch.zeros(n_rows, 0)
    return picked, ent, sampler


def _forward_scores(model, adapter, rows, seqs: torch.Tensor, cuts, pad_id: int, T_eff: float,
                    top_p: float | None):
    """``(behaviour_logp, entropy, sampler_logp)`` of the completions (``seqs`` cut after the
    first eos) from ``no_grad`` forwards of :data:`FORWARD_ROWS` rows under the same merged
    model; ``sampler_logp`` applies transformers' top-p warper when ``top_p`` is given (else it
    is the behaviour log-prob). Each ``(N, T_out)`` fp32, zero-padded."""
    from evil_moe.model.logprobs import build_batch, token_logprobs

    device = next(model.parameters()).device
    comps = [seqs[i, :c].tolist() if c is not None else seqs[i].tolist() for i, c in enumerate(cuts)]
    T_out = max(len(c) for c in comps)
    picked = torch.zeros(len(rows), T_out)
    ent = torch.zeros(len(rows), T_out)
    sampler = torch.zeros(len(rows), T_out)
    with adapter.merged() if adapter is not None else contextlib.nullcontext():
        for r0 in range(0, len(rows), FORWARD_ROWS):
            sl = slice(r0, r0 + FORWARD_ROWS)
            b = build_batch(rows[sl], comps[sl], pad_id, device=device)
            lp, en = token_logprobs(model, b, T_eff, with_entropy=True)
            sp = token_logprobs(model, b, T_eff, top_p=top_p) if top_p is not None else lp
            for j, c in enumerate(comps[sl]):
                p0 = len(rows[r0 + j])
                picked[r0 + j, :len(c)] = lp[j, p0:p0 + len(c)].float().cpu()
                ent[r0 + j, :len(c)] = en[j, p0:p0 + len(c)].float().cpu()
                sampler[r0 + j, :len(c)] = sp[j, p0:p0 + len(c)].float().cpu()
    return picked, ent, sampler
