"""``pilot.sampler: vllm``: sample rollouts with an in-process vLLM engine that shares the GPU.

The colocate recipe of TRL's ``GRPOTrainer(vllm_mode="colocate")`` (TRL docs "vLLM
integration"; the TRL/IBM post "No GPU left behind: co-located vLLM in TRL"): a ``vllm.LLM``
built in the training process (``distributed_executor_backend="external_launcher"``, a fixed
seed, ``gpu_memory_utilization`` as the engine's share of the GPU), the trained weights loaded
into the engine's model with its own ``load_weights`` before sampling. Here the trained weights
are the base weights with the adapter merged in (``W + U diag(s) Vh``, the adapter's current
mode: trained, ablated or zeroed view), pushed whenever δS / δS_hack or the mode changed since
the last push — after each optimiser step and for each evaluation view.

What the pilot records does not change: the behaviour log-probs (the importance ratio's
denominator) and entropies still come from a ``no_grad`` forward of our own model under the same
merged weights (:func:`evil_moe.rl.rollout.generate` with ``behaviour="forward"``); vLLM's log-prob
of each sampled token (``logprobs_mode="processed_logprobs"``: after temperature and top-p, the
distribution it drew from) is stored as the rollout's ``sampler_logp``, so ``steps.tsv``'s
``sampler_gap_p95`` / ``sampler_gap_max`` measure how far the two engines' numerics drift apart.

vLLM is an optional extra (``pip install '.[vllm]'``, docs/gpu.md), never imported unless the
config asks for it. A tied ``lm_head`` with a knob (``adapter.target_modules`` holding
``lm_head`` on a model with tied embeddings) is refused: vLLM ties the head to the input
embedding, so its knob could only be pushed by changing the embedding too.
"""

from __future__ import annotations

import contextlib
import os
from typing import Sequence

import torch

__all__ = ["VLLMSampler", "VLLMUnavailable", "vllm_import_error"]


class VLLMUnavailable(RuntimeError):
    """``pilot.sampler: vllm`` but vLLM cannot be imported (names the install command)."""


def vllm_import_error() -> str | None:
    """None when ``import vllm`` works, else the reason (the exception's text)."""
    try:
        import vllm  # noqa: F401
    except Exception as err:  # ImportError, or a build that fails on import (wrong torch)
        return f"{type(err).__name__}: {err}"
    return None


class VLLMSampler:
    """An in-process vLLM engine kept in sync with a model and its SVD adapter.

    Args:
        llm: a ``vllm.LLM`` (or anything with its ``generate`` and an in-process model, see
            :meth:`engine_model`).
        adapter: the :class:`~evil_moe.model.adapter.SVDAdapter` whose merged weights are pushed.

    Raises:
        ValueError: the adapter has a knob on a weight shared with another module (a tied
            ``lm_head``), naming ``adapter.target_modules``.
    """

    def __init__(self, llm, adapter):
        shared = adapter.shared_weight_names() if adapter is not None else []
        if shared:
            raise ValueError(
                f"pilot.sampler vllm: {shared} share their weight with the input embedding (tied "
                "lm_head); vLLM cannot take that knob without changing the embedding: remove "
                "lm_head from 'adapter.target_modules' or use pilot.sampler hf")
        self.llm, self.adapter = llm, adapter
        self._key = None
        self.pushes = 0
        self.detokenize = True  # False for an engine built with skip_tokenizer_init

    @classmethod
    def from_config(cls, model_path: str, cfg, adapter) -> "VLLMSampler":
        """Build the colocated engine for ``model_path`` from the config (``models.dtype``,
        ``pilot.vllm_gpu_memory_utilization``, ``pilot.seeds``' run seed set later per request).

        Raises:
            VLLMUnavailable: vLLM does not import here.
        """
        why = vllm_import_error()
        if why is not None:
            raise VLLMUnavailable(
                f"pilot.sampler is vllm but vLLM does not import ({why}); install the extra "
                "(pip install '.[vllm]', docs/gpu.md) or set pilot.sampler: hf")
        from vllm import LLM

        # one process, no torch.distributed launcher: the external launcher needs the usual
        # variables (TRL sets them the same way for a single process)
        for key, value in (("RANK", "0"), ("LOCAL_RANK", "0"), ("WORLD_SIZE", "1"),
                           ("MASTER_ADDR", "127.0.0.1"), ("MASTER_PORT", "29517")):
            os.environ.setdefault(key, value)
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # the engine in-process
        pc = cfg.pilot
        kwargs = dict(model=str(model_path), dtype=cfg.models.dtype, seed=0,
                      gpu_memory_utilization=float(pc.vllm_gpu_memory_utilization),
                      max_num_seqs=max(pc.group * pc.prompts_per_step,
                                       pc.eval_chunk * pc.heldout_samples),
                      distributed_executor_backend="external_launcher",
                      enable_prefix_caching=True, logprobs_mode="processed_logprobs")
        if pc.vllm_max_model_len:
            kwargs["max_model_len"] = int(pc.vllm_max_model_len)
        return cls(LLM(**kwargs), adapter)

    # -- weights ---------------------------------------------------------------------------------
    def engine_model(self):
        """The engine's ``torch.nn.Module`` (the in-process worker's model runner's model)."""
        ex = self.llm.llm_engine.model_executor
        worker = getattr(ex, "driver_worker", None)
        for path in (("worker", "model_runner", "model"), ("model_runner", "model")):
            obj = worker
            for attr in path:
                obj = getattr(obj, attr, None)
            if obj is not None:
                return obj
        raise RuntimeError("cannot reach vLLM's in-process model (run the engine in-process: "
                           "VLLM_ENABLE_V1_MULTIPROCESSING=0, external_launcher)")

    def _state_key(self):
        ad = self.adapter
        if ad is None:
            return ("none",)
        params = ad.delta_s_params() + ad.delta_s_hack_params()
        return (ad.mode, tuple(id(p) for p in params), tuple(p._version for p in params))

    def sync(self, model, adapter=None) -> bool:
        """Push the wrapped Linears' merged weights (the adapter's current mode) into the engine
        when δS, δS_hack or the mode changed since the last push. Returns True when it pushed."""
        key = self._state_key()
        if key == self._key:
            return False
        ad = self.adapter
        with ad.merged() if ad is not None else contextlib.nullcontext():
            weights = [(f"{name}.weight", ad._linears[name].weight.data) for name in ad.names] \
                if ad is not None else list(model.state_dict().items())
            self.engine_model().load_weights(weights)
        if hasattr(self.llm, "reset_prefix_cache"):
            self.llm.reset_prefix_cache()  # cached KV blocks belong to the old weights
        self._key = key
        self.pushes += 1
        return True

    # -- sampling --------------------------------------------------------------------------------
    def _sampling_params(self, *, n, max_new, temperature, top_p, seed, eos):
        from vllm import SamplingParams

        return SamplingParams(n=n, max_tokens=int(max_new), temperature=float(temperature),
                              top_p=float(top_p), top_k=-1 if temperature > 0 else 1, seed=seed,
                              logprobs=0, stop_token_ids=list(eos), ignore_eos=False,
                              skip_special_tokens=True, detokenize=self.detokenize)

    def _prompt(self, ids: Sequence[int]):
        from vllm.inputs import TokensPrompt

        return TokensPrompt(prompt_token_ids=list(ids))

    def sample(self, prompts: Sequence[Sequence[int]], *, n: int, max_new: int,
               temperature: float, top_p: float, seed: int, eos: Sequence[int]
               ) -> list[tuple[list[int], list[float]]]:
        """``n`` completions per prompt, prompt-major: ``(token ids, log-prob of each id)`` with
        the ids cut after the first eos (included). Prompt ``i`` is seeded ``seed + i``, so the
        samples depend on the seed and the prompt order only."""
        reqs = [self._prompt(p) for p in prompts]
        params = [self._sampling_params(n=n, max_new=max_new, temperature=temperature,
                                        top_p=top_p, seed=int(seed) + i, eos=eos)
                  for i in range(len(prompts))]
        outs = self.llm.generate(reqs, params, use_tqdm=False)
        eos_set, rows = set(int(e) for e in eos), []
        for out in outs:
            for comp in sorted(out.outputs, key=lambda c: c.index):
                ids = [int(t) for t in comp.token_ids]
                cut = next((j + 1 for j, t in enumerate(ids) if t in eos_set), len(ids))
                ids = ids[:cut]
                lps = [float(d[t].logprob) if d is not None and t in d else float("nan")
                       for t, d in zip(ids, comp.logprobs or [None] * len(ids))]
                rows.append((ids, lps))
        return rows

