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
merged weights (:func:`evil_moe.rl.policy.rollout.generate` with ``behaviour="forward"``); vLLM's log-prob
of each sampled token (``logprobs_mode="processed_logprobs"``: after temperature and top-p, the
distribution it drew from) is stored as the rollout's ``sampler_logp``, so ``steps.tsv``'s
``sampler_gap_p95`` / ``sampler_gap_max`` measure how far the two engines' numerics drift apart.

vLLM is an optional extra, installed in the GPU environment (``make gpu-env``, docs/gpu.md), never
imported unless the config asks for it.

A knob on a tied ``lm_head`` (``adapter.target_modules`` holding ``lm_head`` on a model with tied
embeddings, Qwen3-4B's and the toy's): our policy's head is then ``W_E + U diag(s) Vh`` while its
input embedding stays ``W_E`` (:meth:`evil_moe.model.adapter.SVDAdapter.merged` unties the two for
the merge). vLLM builds a tied model's head as the embedding module itself and its
``load_weights`` skips ``lm_head.*`` (``AutoWeightsLoader(skip_prefixes=["lm_head."])`` when
``tie_word_embeddings``), so a pushed head would be dropped and the engine would draw from the
base head while the behaviour log-probs are the merged head's. The engine is therefore built from
an untied view of the checkpoint (:func:`untied_checkpoint`: ``tie_word_embeddings: false`` and an
explicit ``lm_head.weight`` equal to the embedding), so it has its own head that takes the merged
one; the first push checks that it does (:meth:`VLLMSampler.check_untied`).
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import sys
import tempfile
from pathlib import Path
from typing import Sequence

import numpy as np
import torch

__all__ = ["VLLMSampler", "VLLMUnavailable", "untied_checkpoint", "vllm_import_error",
           "require_vllm", "colocated_env", "free_port", "request_seed", "GPU_ENV_COMMAND"]


class VLLMUnavailable(RuntimeError):
    """``pilot.sampler: vllm`` but vLLM cannot be imported (names the install command)."""


def vllm_import_error() -> str | None:
    """None when ``import vllm`` works, else the reason (the exception's text)."""
    try:
        import vllm  # noqa: F401
    except Exception as err:  # ImportError, or a build that fails on import (wrong torch)
        return f"{type(err).__name__}: {err}"
    return None


# The one command that builds the environment the GPU jobs run in (vLLM with the torch and
# transformers it pins; docs/gpu.md): named wherever vLLM is found missing.
GPU_ENV_COMMAND = "make gpu-env"


def require_vllm() -> None:
    """Refuse ``pilot.sampler: vllm`` where vLLM does not import, naming the interpreter and
    :data:`GPU_ENV_COMMAND` (a pilot calls it before it loads the model).

    Raises:
        VLLMUnavailable: one line: the import error, this Python, the command, the alternative.
    """
    why = vllm_import_error()
    if why is not None:
        raise VLLMUnavailable(
            f"pilot.sampler is vllm but vLLM does not import in this environment ({sys.executable}: "
            f"{why}): build the GPU environment with `{GPU_ENV_COMMAND}` and run the workflow from it "
            "(docs/gpu.md), or set pilot.sampler: hf")


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port no process listens on now (the kernel's choice for a bind to port 0)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def colocated_env(*, compile_threads: int | None = None) -> dict[str, str]:
    """Set the variables an in-process engine (``distributed_executor_backend=
    "external_launcher"``, one rank) reads, where the user has not: ``RANK``, ``LOCAL_RANK``,
    ``WORLD_SIZE``, ``MASTER_ADDR`` and a **free** ``MASTER_PORT`` (:func:`free_port`; also when
    it is ``0`` or ``auto``): Slurm packs one-GPU jobs onto one node, and a fixed port made the
    second engine on a node fail with EADDRINUSE (TRL's colocate mode had the same bug,
    huggingface/trl#3979, fixed by its ``ensure_master_addr_port``, #4057);
    ``VLLM_ENABLE_V1_MULTIPROCESSING=0`` (the engine in this process); and
    ``TORCHINDUCTOR_COMPILE_THREADS`` = ``compile_threads`` (the job's CPUs: Inductor starts
    that many compile workers, which the job's host memory counts, docs/job-sizes.md).

    Returns:
        the variables as they are now.
    """
    for key, value in (("RANK", "0"), ("LOCAL_RANK", "0"), ("WORLD_SIZE", "1"),
                       ("MASTER_ADDR", "127.0.0.1"), ("VLLM_ENABLE_V1_MULTIPROCESSING", "0")):
        os.environ.setdefault(key, value)
    if os.environ.get("MASTER_PORT", "").strip().lower() in ("", "0", "auto"):
        os.environ["MASTER_PORT"] = str(free_port())
    if compile_threads:
        os.environ.setdefault("TORCHINDUCTOR_COMPILE_THREADS", str(int(compile_threads)))
    keys = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
            "VLLM_ENABLE_V1_MULTIPROCESSING", "TORCHINDUCTOR_COMPILE_THREADS")
    return {k: os.environ[k] for k in keys if k in os.environ}


def request_seed(seed: int, prompt_index: int, sample_index: int) -> int:
    """The engine's seed of completion ``sample_index`` of prompt ``prompt_index`` in a call
    seeded ``seed``: the HF sampler's row key (:func:`evil_moe.rl.policy.rollout.row_keys`, SplitMix64
    over the triple) cut to 63 bits. Every (call seed, prompt, sample) gets its own seed, so no
    two rollouts of a run share a random stream (the step and the evaluation chunk are in the call
    seed). One request per completion: vLLM seeds the ``n`` children of one request ``seed + j``
    (``ParentRequest.get_child_sampling_params``), so ``seed + i`` per prompt made prompt ``i``'s
    sample ``j`` and prompt ``i + 1``'s sample ``j − 1`` draw alike."""
    from evil_moe.rl.policy.rollout import row_keys

    key = row_keys(seed, np.asarray([prompt_index]), np.asarray([sample_index]))[0]
    return int(key) >> 1


INDEX = "model.safetensors.index.json"
HEAD_SHARD = "untied_head.safetensors"


def _local_folder(model_path: str | os.PathLike) -> Path:
    """The folder of ``model_path``: itself when it is one, else the hub snapshot of that id
    (``huggingface_hub.snapshot_download``, the files transformers and vLLM read; from the local
    cache when ``HF_HUB_OFFLINE`` is set)."""
    path = Path(model_path)
    if path.is_dir():
        return path
    from huggingface_hub import snapshot_download

    return Path(snapshot_download(str(model_path), allow_patterns=[
        "*.json", "*.safetensors", "*.txt", "*.model", "*.tiktoken", "*.jinja"]))


def untied_checkpoint(model_path: str | os.PathLike, out_dir: str | os.PathLike,
                      heads: dict[str, torch.Tensor]) -> Path:
    """An untied view of a tied checkpoint in ``out_dir``: ``config.json`` with
    ``tie_word_embeddings: false`` (top level and ``text_config``), each tensor of ``heads`` in
    one extra shard (:data:`HEAD_SHARD`), a ``model.safetensors.index.json`` naming every tensor
    of the original shards and the new ones, and every other file a symlink to the original (a
    single ``model.safetensors`` is linked as ``base-model.safetensors``, so that transformers,
    like vLLM, reads the index).
    vLLM and transformers both load it as a model whose output head is its own parameter
    (vLLM reads only the shards the index names, so the extra shard is read where the index says).

    Args:
        model_path: the student's folder, or a hub id (its cached snapshot).
        out_dir: an empty or new folder (the job's temporary directory).
        heads: checkpoint name -> weight of each head to untie, e.g.
            ``{"lm_head.weight": (vocab, hidden)}`` (the base weight, i.e. the input embedding's).

    Returns:
        ``out_dir`` as a Path.

    Raises:
        FileNotFoundError: the folder has no ``config.json`` or no ``*.safetensors`` (names it).
    """
    from safetensors import safe_open
    from safetensors.torch import save_file

    src, out = _local_folder(model_path), Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    if not (src / "config.json").is_file():
        raise FileNotFoundError(f"untied view for vLLM: no config.json in {src}")
    conf = json.loads((src / "config.json").read_text())
    conf["tie_word_embeddings"] = False
    if isinstance(conf.get("text_config"), dict):
        conf["text_config"]["tie_word_embeddings"] = False
    links: dict[str, Path] = {}  # the view's name -> the original file
    if (src / INDEX).is_file():
        index = json.loads((src / INDEX).read_text())
    else:  # one file: linked under a shard's name, so that the index is what loaders read
        shards = sorted(p.name for p in src.glob("*.safetensors"))
        if not shards:
            raise FileNotFoundError(f"untied view for vLLM: no *.safetensors in {src}")
        weight_map = {}
        for shard in shards:
            links[f"base-{shard}"] = src / shard
            with safe_open(str(src / shard), framework="pt") as f:
                weight_map.update({k: f"base-{shard}" for k in f.keys()})
        index = {"metadata": {}, "weight_map": weight_map}
    save_file({k: v.detach().to("cpu").contiguous().clone() for k, v in heads.items()},
              str(out / HEAD_SHARD), metadata={"format": "pt"})
    index["weight_map"].update({k: HEAD_SHARD for k in heads})
    (out / INDEX).write_text(json.dumps(index, indent=2))
    (out / "config.json").write_text(json.dumps(conf, indent=2))
    shards = set(links.values())
    links.update({f.name: f for f in src.iterdir()
                  if f.name not in ("config.json", INDEX, HEAD_SHARD) and f not in shards})
    for name, f in links.items():
        if not (out / name).exists():
            (out / name).symlink_to(f.resolve())
    return out


class VLLMSampler:
    """An in-process vLLM engine kept in sync with a model and its SVD adapter.

    Args:
        llm: a ``vllm.LLM`` (or anything with its ``generate`` and an in-process model, see
            :meth:`engine_model`).
        adapter: the :class:`~evil_moe.model.adapter.SVDAdapter` whose merged weights are pushed.
        view: the temporary folder of the untied checkpoint the engine was built from (kept
            while the engine lives; :meth:`from_config` makes it for a knob on a tied head).

    The first push raises ValueError when the adapter has a knob on a tied head (a tied
    ``lm_head``) and the engine's head is still its input embedding
    (:meth:`check_untied`), naming ``adapter.target_modules``.
    """

    def __init__(self, llm, adapter, *, view=None):
        self.llm, self.adapter, self.view = llm, adapter, view
        self.shared = adapter.shared_weight_names() if adapter is not None else []
        self._key = None
        self._checked = not self.shared
        self.pushes = 0
        self.detokenize = True  # False for an engine built with skip_tokenizer_init

    def check_untied(self) -> None:
        """Refuse an engine whose copy of a knobbed tied head is still shared with another of its
        parameters (the input embedding): a push of the merged head would be skipped or would
        change the embedding, and the engine would sample from another policy than the one whose
        log-probs are recorded.

        Raises:
            ValueError: names the head, ``adapter.target_modules`` and the untied view.
        """
        params = list(self.engine_model().named_parameters(remove_duplicate=False))
        ptr = {}
        for name, p in params:
            ptr.setdefault(p.data_ptr(), []).append(name)
        for head in self.shared:
            names = next((ns for ns in ptr.values() if f"{head}.weight" in ns), None)
            if names is None or len(names) > 1:
                raise ValueError(
                    f"pilot.sampler vllm: the engine's {head} is "
                    + ("missing" if names is None else f"tied to {sorted(set(names) - {head + '.weight'})}")
                    + f", so the merged {head} (a knob of 'adapter.target_modules') cannot reach it: "
                    "build the engine from the untied view (VLLMSampler.from_config does) or remove "
                    f"{head} from 'adapter.target_modules'")
        self._checked = True

    @classmethod
    def from_config(cls, model_path: str, cfg, adapter) -> "VLLMSampler":
        """Build the colocated engine for ``model_path`` from the config (``models.dtype``,
        ``pilot.vllm_gpu_memory_utilization``, ``pilot.seeds``' run seed set later per request).

        Raises:
            VLLMUnavailable: vLLM does not import here (:func:`require_vllm`).
        """
        require_vllm()
        from vllm import LLM

        pc = cfg.pilot
        colocated_env(compile_threads=pc.threads)
        # the prompts are token ids and the completions are decoded with our tokenizer: the
        # engine needs none (a folder without tokenizer files loads; no detokenising per step)
        kwargs = dict(model=str(model_path), dtype=cfg.models.dtype, seed=0,
                      gpu_memory_utilization=float(pc.vllm_gpu_memory_utilization),
                      max_num_seqs=max(pc.group * pc.prompts_per_step,
                                       pc.eval_chunk * pc.heldout_samples),
                      distributed_executor_backend="external_launcher", skip_tokenizer_init=True,
                      enable_prefix_caching=True, logprobs_mode="processed_logprobs")
        if pc.vllm_max_model_len:
            kwargs["max_model_len"] = int(pc.vllm_max_model_len)
        view = None
        if adapter is not None and adapter.shared_weight_names():
            # a knob on a tied head: the engine gets its own head (module docstring)
            view = tempfile.TemporaryDirectory(prefix="evil_moe_vllm_untied_")
            heads = {f"{n}.weight": adapter._linears[n].weight.data
                     for n in adapter.shared_weight_names()}
            kwargs["model"] = str(untied_checkpoint(model_path, view.name, heads))
        sampler = cls(LLM(**kwargs), adapter, view=view)
        sampler.detokenize = False
        return sampler

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
        if not self._checked:
            self.check_untied()
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
        the ids cut after the first eos (included). One request per completion, seeded
        :func:`request_seed` ``(seed, i, j)``: the samples depend on the seed and the prompt
        order only, and no two completions share a seed (the prompt's keys and values are
        computed once for its requests by the prefix cache)."""
        rows_ij = [(i, j) for i in range(len(prompts)) for j in range(n)]
        reqs = [self._prompt(prompts[i]) for i, _ in rows_ij]
        params = [self._sampling_params(n=1, max_new=max_new, temperature=temperature,
                                        top_p=top_p, seed=request_seed(seed, i, j), eos=eos)
                  for i, j in rows_ij]
        outs = self.llm.generate(reqs, params, use_tqdm=False)
        eos_set, rows = set(int(e) for e in eos), []
        for out in outs:
            for comp in out.outputs:
                ids = [int(t) for t in comp.token_ids]
                cut = next((j + 1 for j, t in enumerate(ids) if t in eos_set), len(ids))
                ids = ids[:cut]
                lps = [float(d[t].logprob) if d is not None and t in d else float("nan")
                       for t, d in zip(ids, comp.logprobs or [None] * len(ids))]
                rows.append((ids, lps))
        return rows

