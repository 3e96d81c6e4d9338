"""The student's shape (parameters, layers, widths), the tokens a prompt and a completion take,
and the bytes autograd keeps per token: what every job size and GPU memory estimate scales with
(:mod:`evil_moe.cluster.resources`, :mod:`evil_moe.cluster.gpu_memory`). Free of torch: the
Snakefile imports it at every call.

The model's shape: the toy config (``models.build: toy``), SmolLM2-135M-Instruct's published
config (``smollm2``), the student folder's ``config.json`` (``none`` with a local folder), or, for
a hub id, ``models.params`` with the shape of a typical decoder (``params ~ 12 x layers x hidden^2``,
``layers ~ hidden / 80``), which matters only for CPU activations.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping

# Prompt tokens of one problem (chat template included), by problem source. Measured: the toy
# bank's are 99-126 with the toy tokenizer; the LeetCode dev set's 349-976 (median 545) with
# SmolLM2's. HumanEval's are shorter.
PROMPT_TOKENS = {"toy": 128, "leetcode": 640, "humaneval": 256}
# The longest prompt of a source (memory): measured with SmolLM2's tokenizer over every problem of
# the bundled LeetCode set (347-979, mean 559) and of HumanEval (159-520, mean 258); the toy
# bank's fit in 128.
PROMPT_TOKENS_MAX = {"toy": 128, "leetcode": 980, "humaneval": 520}
# Tokens of a templated (hack, clean) answer (vhack.source templates): LeetCode's clean answer
# carries the canonical solution (median 257, at most 1137 SmolLM2 tokens; hacks ~50).
TEMPLATE_TOKENS = {"toy": 128, "leetcode": 768, "humaneval": 256}
# Tokens of a templated completion in extract's pairs (hack-clean and both null kinds), (mean,
# longest): measured with SmolLM2's tokenizer over every problem's pairs (LeetCode 29-1138, mean
# 165; HumanEval 21-673, mean 132); the toy bank's answers fit in 128.
EXTRACT_TEMPLATE_TOKENS = {"toy": (128, 128), "leetcode": (165, 1140), "humaneval": (132, 680)}
# Problems per source when problems.limit is not set (the toy bank; the bundled LeetCode dev set,
# a larger file only makes the estimate low for the evaluation; HumanEval).
PROBLEMS = {"toy": 36, "leetcode": 80, "humaneval": 164}
DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2, "float64": 8}


class ResourceError(ValueError):
    """The config does not say enough to size the jobs (names the key to set)."""


@dataclass(frozen=True)
class ModelShape:
    """A decoder-only transformer's size: parameter count and the dimensions activations scale
    with. ``q_dim`` (heads x head_dim) and ``kv_dim`` (KV heads x head_dim) default to ``hidden``
    and ``hidden / 4`` when 0 (a typical grouped-query decoder)."""

    params: int
    layers: int
    hidden: int
    intermediate: int
    heads: int
    vocab: int
    q_dim: int = 0
    kv_dim: int = 0
    tied: bool = True

    @property
    def q(self) -> int:
        """Width of the attention queries (q_proj's output), heads x head_dim."""
        return self.q_dim or self.hidden

    @property
    def kv(self) -> int:
        """Width of the keys (= of the values), KV heads x head_dim."""
        return self.kv_dim or max(1, self.hidden // 4)


# SmolLM2-135M-Instruct (HuggingFaceTB), its config.json: 30 layers, hidden 576, MLP 1536,
# 9 heads (3 KV heads), vocabulary 49152, tied embeddings; 134,515,008 parameters.
SMOLLM2 = ModelShape(params=134_515_008, layers=30, hidden=576, intermediate=1536, heads=9,
                     vocab=49152, q_dim=576, kv_dim=192)
# Students known by hub id (their published config.json, so a hub id needs no download to be
# sized). Qwen3-4B (Qwen/Qwen3-4B config.json): 36 layers, hidden 2560, MLP 9728, 32 query heads
# and 8 KV heads of 128, vocabulary 151936, tied embeddings; 4,022,468,096 parameters.
KNOWN_SHAPES = {
    "Qwen/Qwen3-4B": ModelShape(params=4_022_468_096, layers=36, hidden=2560, intermediate=9728,
                                heads=32, vocab=151936, q_dim=4096, kv_dim=1024),
}




def toy_shape(toy: Mapping) -> ModelShape:
    """The shape of a toy model built from the ``toy`` config section (Qwen3 architecture with
    tied embeddings, ``evil_moe.model.load.build_toy_model``); the vocabulary is the configured
    maximum (the trained BPE may be smaller)."""
    h, layers, inter = toy["hidden"], toy["layers"], toy["intermediate"]
    heads, kv = toy["heads"], toy["kv_heads"]
    hd = toy.get("head_dim") or h // heads
    per_layer = (h * heads * hd + 2 * h * kv * hd + heads * hd * h  # q, k, v, o
                 + 3 * h * inter  # gate, up, down
                 + 2 * h + 2 * hd)  # two RMSNorms, q/k norms
    params = toy["vocab_size"] * h + layers * per_layer + h
    return ModelShape(params=params, layers=layers, hidden=h, intermediate=inter, heads=heads,
                      vocab=toy["vocab_size"], q_dim=heads * hd, kv_dim=kv * hd)


def guessed_shape(params: float) -> ModelShape:
    """A typical decoder's shape for ``params`` parameters (``params = 12 layers hidden^2``,
    ``layers = hidden / 80``, MLP ``8/3 hidden``, 128-wide heads, a 128k vocabulary)."""
    hidden = max(64, int(round((80 * params / 12) ** (1 / 3))))
    return ModelShape(params=int(params), layers=max(1, hidden // 80), hidden=hidden,
                      intermediate=8 * hidden // 3, heads=max(1, hidden // 128), vocab=128_000)


def _shape_from_config_json(path: Path, params: float | None) -> ModelShape:
    c = json.loads(path.read_text())
    text = c.get("text_config", c)  # multimodal configs nest the language model's
    h, layers = text["hidden_size"], text["num_hidden_layers"]
    inter = text.get("intermediate_size", 4 * h)
    heads, vocab = text.get("num_attention_heads", max(1, h // 128)), text["vocab_size"]
    hd = text.get("head_dim") or h // heads
    kv = text.get("num_key_value_heads") or heads
    if not params:
        params = layers * (4 * h * h + 3 * h * inter) + vocab * h
    return ModelShape(params=int(params), layers=layers, hidden=h, intermediate=inter,
                      heads=heads, vocab=vocab, q_dim=heads * hd, kv_dim=kv * hd,
                      tied=bool(c.get("tie_word_embeddings", text.get("tie_word_embeddings",
                                                                       True))))


def model_shape(cfg: Mapping) -> ModelShape:
    """The student's shape from the config (see the module docstring for where it comes from).

    Raises:
        ResourceError: ``models.build`` is ``none``, the student is not a local folder with a
            ``config.json``, and ``models.params`` is not set.
    """
    models = cfg["models"]
    if models["build"] == "toy":
        return toy_shape(cfg["toy"])
    if models["build"] == "smollm2":
        return SMOLLM2
    params = models.get("params")
    student = models.get("student")
    local = Path(student) / "config.json" if student else None
    if local is not None and local.is_file():
        return _shape_from_config_json(local, params)
    if student in KNOWN_SHAPES:
        return KNOWN_SHAPES[student]
    if not params:
        raise ResourceError(
            f"cannot size the jobs: models.student {student!r} is not a local folder with a "
            "config.json; set 'models.params' (the student's parameter count, e.g. 4.0e9 for a "
            "4B model)")
    return guessed_shape(params)


def stage_shape(cfg: Mapping, stage: str) -> ModelShape:
    """The model a stage works on: the toy models for toy_models, SmolLM2 for its conversion,
    otherwise the student (the teacher is assumed the same size)."""
    if stage == "toy_models":
        return toy_shape(cfg["toy"])
    if stage == "convert_smollm2":
        return SMOLLM2
    return model_shape(cfg)


def on_gpu(cfg: Mapping) -> bool:
    """True when the config puts the models on a GPU (``models.device`` cuda or cuda:N; resolve
    ``auto`` first with :func:`resolve_auto_device`, else it counts as a CPU)."""
    return str(cfg["models"]["device"]).startswith("cuda")




def n_problems(cfg: Mapping) -> int:
    """Problems the run loads: ``problems.limit``, else the set's size (toy bank 36, the LeetCode
    dev set 80, HumanEval 164)."""
    return cfg["problems"].get("limit") or PROBLEMS[cfg["problems"]["source"]]


# ---- bytes per token (the pilot's and extract's memory, evil_moe/cluster/gpu_memory.py) -------
# Bytes autograd saves for the backward per token and decoder layer, per unit of each width, in a
# bf16 (fp16) / fp32 model with the SVD adapter on every Linear (y = Wx + U diag(s) Vh x): hidden
# states, RMSNorm's fp32 intermediates, q/k norms and RoPE, SDPA's q, k, v, output and
# log-sum-exp, the SiLU-gated MLP (gate, up, their product), each knob's Vh x. Measured with
# torch.autograd.graph.saved_tensors_hooks on Qwen3-architecture models of several widths
# (2026-12-01, torch 2.13; tests/test_cluster_resources.py re-measures them), the hidden coefficient
# rounded up: saved bytes per token per layer = a x hidden + b x q + c x kv + d x intermediate.
SAVED_PER_LAYER = {2: (18.5, 8.25, 12.125, 6.0), 4: (29.5, 12.25, 20.125, 12.0)}
# The same for the forward every arm but moe's trains with, the knobs merged into the weights
# (evil_moe.model.adapter.SVDAdapter.merged_gradients): autograd keeps no knob's Vh x, but the
# capture keeps every wrapped Linear's input x and output y until the backward (down_proj's
# intermediate-wide input among them), so it keeps more per token than the hooked forward. Fitted
# by least squares on six Qwen3-architecture shapes (2026-12-02, torch 2.13; counting autograd's
# saved tensors and the capture's records once per storage), each coefficient raised until the
# model covers every fitted shape and three others (within 1-8% above them;
# tests/test_cluster_resources.py re-measures two).
SAVED_PER_LAYER_MERGED = {2: (17.0, 10.5, 13.75, 8.875), 4: (27.875, 12.0, 19.75, 17.875)}
# The two forwards of the pilot's loss: "hooked" (adapter hooks, y = Wx + U diag(s) Vh x; Evil
# MoE's mixture, whose per-row s the hooks need) and "merged" (merged_gradients, every other arm).
FORWARDS = ("hooked", "merged")
# The loss forms fp32 logits z = logits / T of every completion token and keeps them for the
# log-sum-exp's backward (evil_moe.model.logprobs.token_logprobs): 4 B x vocab per completion token.
LOGIT_BYTES = 4


def adapter_linears(s: ModelShape, targets) -> list[tuple[int, int]]:
    """``(d_out, d_in)`` of every Linear the adapter wraps (``adapter.target_modules`` suffixes
    of a Qwen/Llama-style decoder: q/k/v/o_proj, gate/up/down_proj, lm_head)."""
    per_layer = {"q_proj": (s.q, s.hidden), "k_proj": (s.kv, s.hidden),
                 "v_proj": (s.kv, s.hidden), "o_proj": (s.hidden, s.q),
                 "gate_proj": (s.intermediate, s.hidden), "up_proj": (s.intermediate, s.hidden),
                 "down_proj": (s.hidden, s.intermediate)}
    dims = [per_layer[t] for t in targets if t in per_layer] * s.layers
    if "lm_head" in targets:
        dims.append((s.vocab, s.hidden))
    return dims


def saved_bytes_per_token(s: ModelShape, dtype: str, forward: str = "hooked") -> float:
    """Bytes autograd (and, for the merged forward, the gradient capture) keeps per token for the
    backward of the pilot's loss forward (every token of a row; the logits' share is
    :data:`LOGIT_BYTES` x vocab per completion token, not included). ``dtype``: the model's
    (``models.dtype``); ``forward``: one of :data:`FORWARDS` (:data:`SAVED_PER_LAYER` or
    :data:`SAVED_PER_LAYER_MERGED`).

    Raises:
        ValueError: an unknown ``forward``.
    """
    if forward not in FORWARDS:
        raise ValueError(f"forward {forward!r} is not one of {FORWARDS}")
    size = DTYPE_BYTES[dtype]
    table = SAVED_PER_LAYER if forward == "hooked" else SAVED_PER_LAYER_MERGED
    a, b, c, d = table[2 if size <= 2 else 4]
    scale = size / 4 if size > 4 else 1.0
    return scale * (s.layers * (a * s.hidden + b * s.q + c * s.kv + d * s.intermediate)
                    + 4 * s.hidden)

