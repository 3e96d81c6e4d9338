"""What each workflow job asks a scheduler for — threads, memory, wall time, GPUs — computed from
the run config.

Job sizes follow from the config (the model, the batch sizes, the rollout length), so they live
here and every rule declares them (``rules/common.smk``: ``threads: get_threads(stage)``,
``resources: mem_mb=get_mem_mb(stage), runtime=..., gpu=...``); the Snakemake profile keeps only
what depends on the site (partitions, account, status command). ``evil-moe slurm-check`` compares
the same numbers with a cluster's partitions.

**Threads** are config keys (``toy.threads``, ``sft.threads`` for make_teacher,
``teacher.threads``, ``vhack.threads`` for extract, ``distill.threads``, ``pilot.threads`` for
pilot and reevaluate): the job asks for that many CPUs *and* the stage
sets torch's intra-op thread count to it, whichever executor runs it. torch's float reductions
change order with the thread count, so a pilot's numbers depend on it (measured: the same erase
pilot with 1 and 2 threads differs from step 0 on, README "The same numbers on any executor");
taking it from the config, not from the profile or the executor's core count, keeps local and
Slurm runs identical.

**Memory** (``mem_mb``, MiB per job; ``attempt`` times that on a retry): an estimate from the
model's shape, not a bound::

    mem = base + resident + activations            (rounded up to 100 MiB)
    base        = 800 MiB (Python, torch, transformers, the grader's sandboxes)
                  + 3000 MiB host-side CUDA context when models.device is cuda
    resident    = weights x 3 on a CPU (W, and the adapter's U and Vh buffers in the model dtype)
                  weights x 1 on a GPU (loaded on the host, then moved)
    activations = on a CPU the larger of (0 on a GPU: they live on the device)
      training  4 B x rows x seq x (layers x (50 hidden + 4 intermediate) + 3 vocab)
      generate  4 B x rows x (seq x layers x hidden + max_new x vocab)   (KV cache, scores)

``rows`` is what one forward holds (``pilot.micro_batch`` or ``group x prompts_per_step``;
``distill.micro_batch`` or ``batch_size``; ``sft.micro_batch`` or ``sft.batch_size`` for
make_teacher, whose demonstrations are about ``teacher.max_new`` long; 2 for an extract pair;
``toy.batch_size``;
``teacher.batch_prompts x n`` for a generate call; ``eval_chunk x heldout_samples`` for the
pilot's held-out evaluation, ``eval_chunk x reevaluate.samples`` for its re-evaluation), ``seq`` the prompt (toy bank 128, LeetCode
640, HumanEval 256 tokens) plus ``max_new`` (or a templated answer's length). The per-token
constants count saved fp32 values (hidden states, MLP and adapter intermediates, logits with
their log-softmax; attention is SDPA, whose probabilities are not kept); they were fitted to
measured peaks (README "Job sizes"): the toy default's jobs and SmolLM2-135M's.

**Wall time** (``runtime``, minutes; ``attempt`` times that on a retry)::

    runtime = max(10, 3 x (load + work) / 60)
    work    = 6 x params x trained tokens / flops
              + sum over generate calls of max_new x (t_token + 2 x params x rows / flops)
    flops   = 5e10 x threads on a CPU, 2e14 on a GPU; t_token = 0.01 s (CPU), 0.04 s (GPU, the
              per-token overhead of batched generate); load = 60 s + the SVD (8 x params x hidden
              / flops)

The throughput constants are rough (fitted so that every request is at least twice the measured
time of the toy's and SmolLM2's jobs, three times for the toy: README "Job sizes"); the factor 3 covers a busy node and the grader;
a job that still runs out of time or memory is
resubmitted with twice as much under ``--retries 1``, and a profile may override any rule with
``set-resources``.

**GPUs**: the model stages (make_teacher, teacher, extract, distill, pilot, reevaluate) ask for one when
``models.device`` is ``cuda`` or ``cuda:N``; ``auto`` and ``cpu`` ask for none (the toy default
and SmolLM2 run on CPUs).

The model's shape: the toy config (``models.build: toy``), SmolLM2-135M-Instruct's published
config (``smollm2``), the student folder's ``config.json`` (``none`` with a local folder), or, for
a hub id, ``models.params`` with the shape of a typical decoder (``params ~ 12 x layers x hidden^2``,
``layers ~ hidden / 80``), which matters only for CPU activations.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping

from evil_moe.rl.arms import ARMS

# Stages (= rule names) and the config section holding their torch thread count.
THREAD_KEYS = {
    "toy_models": "toy",
    "make_teacher": "sft",
    "teacher": "teacher",
    "extract": "vhack",
    "distill": "distill",
    "pilot": "pilot",
    "reevaluate": "pilot",
}
# Stages that load the student or teacher and run it: they get a GPU on a cuda config.
MODEL_STAGES = ("make_teacher", "teacher", "extract", "distill", "pilot", "reevaluate")
# Light stages: one thread, the base memory, the minimum time.
LIGHT_STAGES = ("problems", "convert_smollm2", "compare")
STAGES = ("problems", "toy_models", "convert_smollm2", "make_teacher", "teacher", "extract",
          "distill", "pilot", "reevaluate", "compare")

BASE_MB = 800
CUDA_BASE_MB = 3000
MIN_RUNTIME = 10
RUNTIME_MARGIN = 3.0
CPU_FLOPS_PER_THREAD = 5e10
GPU_FLOPS = 2e14
CPU_TOKEN_S = 0.01
GPU_TOKEN_S = 0.04
LOAD_S = 60.0
# Prompt tokens of one problem (chat template included), by problem source. Measured: the toy
# bank's are 99-126 with the toy tokenizer; the LeetCode dev set's 349-976 (median 545) with
# SmolLM2's. HumanEval's are shorter.
PROMPT_TOKENS = {"toy": 128, "leetcode": 640, "humaneval": 256}
# Tokens of a templated (hack, clean) answer (vhack.source templates): LeetCode's clean answer
# carries the canonical solution (median 257, at most 1137 SmolLM2 tokens; hacks ~50).
TEMPLATE_TOKENS = {"toy": 128, "leetcode": 768, "humaneval": 256}
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


@dataclass(frozen=True)
class JobSize:
    """One job's request: ``threads`` (CPUs, also torch's thread count), ``mem_mb`` (MiB, first
    attempt), ``runtime`` (minutes, first attempt), ``gpu`` (count)."""

    threads: int
    mem_mb: int
    runtime: int
    gpu: int

    def mem_mb_at(self, attempt: int) -> int:
        """Memory of the ``attempt``-th try (1-based): ``attempt x mem_mb``."""
        return self.mem_mb * max(1, int(attempt))

    def runtime_at(self, attempt: int) -> int:
        """Wall time of the ``attempt``-th try (1-based): ``attempt x runtime`` minutes."""
        return self.runtime * max(1, int(attempt))


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


def _stage_shape(cfg: Mapping, stage: str) -> ModelShape:
    """The model a stage works on: the toy models for toy_models, SmolLM2 for its conversion,
    otherwise the student (the teacher is assumed the same size)."""
    if stage == "toy_models":
        return toy_shape(cfg["toy"])
    if stage == "convert_smollm2":
        return SMOLLM2
    return model_shape(cfg)


def on_gpu(cfg: Mapping) -> bool:
    """True when the config puts the models on a GPU (``models.device`` cuda or cuda:N)."""
    return str(cfg["models"]["device"]).startswith("cuda")


def stage_threads(cfg: Mapping, stage: str) -> int:
    """CPUs of a stage's job = its torch thread count (the config key in :data:`THREAD_KEYS`;
    1 for the light stages)."""
    section = THREAD_KEYS.get(stage)
    return int(cfg[section]["threads"]) if section else 1


def _seq(cfg: Mapping, completion: int) -> int:
    return PROMPT_TOKENS[cfg["problems"]["source"]] + int(completion)


def _train_bytes(s: ModelShape, rows: int, seq: int) -> float:
    """Activations kept for the backward of one forward of ``rows x seq`` tokens (fp32)."""
    return 4.0 * rows * seq * (s.layers * (50 * s.hidden + 4 * s.intermediate) + 3 * s.vocab)


def _gen_bytes(s: ModelShape, rows: int, seq: int, new: int) -> float:
    """One batched generate: the KV cache (keys and values of grouped-query attention, about
    ``hidden`` values per layer and token) and the fp32 scores of every generated token."""
    return 4.0 * rows * (seq * s.layers * s.hidden + new * s.vocab)


def _activation_bytes(cfg: Mapping, stage: str, s: ModelShape) -> float:
    """The largest working set of one forward (training) or one generate call of a stage."""
    p, t = cfg["pilot"], cfg["teacher"]
    source = cfg["problems"]["source"]
    if stage == "toy_models":
        return _train_bytes(s, cfg["toy"]["batch_size"], _seq(cfg, p["max_new"]))
    if stage == "teacher":
        return _gen_bytes(s, t["batch_prompts"] * t["n"], _seq(cfg, t["max_new"]), t["max_new"])
    if stage == "make_teacher":  # NLL on demonstrations; evaluation and elicitation generate
        sc = cfg["sft"]
        n = max(sc["eval_samples"], sc["elicited_samples"])
        return max(_train_bytes(s, sc["micro_batch"] or sc["batch_size"],
                                _seq(cfg, t["max_new"])),
                   _gen_bytes(s, t["batch_prompts"] * n, _seq(cfg, t["max_new"]), t["max_new"]))
    if stage == "extract":  # a (hack, clean) pair, padded to the longer completion
        completion = TEMPLATE_TOKENS[source] if cfg["vhack"]["source"] == "templates" \
            else t["max_new"]
        return _train_bytes(s, 2, _seq(cfg, completion))
    if stage == "distill":
        d = cfg["distill"]
        return _train_bytes(s, d["micro_batch"] or d["batch_size"], _seq(cfg, t["max_new"]))
    if stage == "pilot":
        rows = p["group"] * p["prompts_per_step"]
        seq = _seq(cfg, p["max_new"])
        # the held-out evaluation: eval_chunk problems x heldout_samples per generate call
        heldout = max(1, round(n_problems(cfg) * cfg["problems"]["heldout_frac"]))
        eval_rows = min(p["eval_chunk"], heldout) * p["heldout_samples"]
        return max(_train_bytes(s, p["micro_batch"] or rows, seq),
                   _gen_bytes(s, rows, seq, p["max_new"]),
                   _gen_bytes(s, eval_rows, seq, p["max_new"]))
    if stage == "reevaluate":  # the pilot's held-out evaluation with reevaluate.samples
        return _gen_bytes(s, _reeval_rows(cfg), _seq(cfg, p["max_new"]), p["max_new"])
    return 0.0


def _reeval_rows(cfg: Mapping) -> int:
    """Rows of one generate call of the re-evaluation: eval_chunk problems x reevaluate.samples."""
    heldout = max(1, round(n_problems(cfg) * cfg["problems"]["heldout_frac"]))
    return min(cfg["pilot"]["eval_chunk"], heldout) * cfg["reevaluate"]["samples"]


def n_problems(cfg: Mapping) -> int:
    """Problems the run loads: ``problems.limit``, else the set's size (toy bank 36, the LeetCode
    dev set 80, HumanEval 164)."""
    return cfg["problems"].get("limit") or PROBLEMS[cfg["problems"]["source"]]


def stage_mem_mb(cfg: Mapping, stage: str) -> int:
    """Memory (MiB) of a stage's job on its first attempt (module docstring: the formula)."""
    if stage not in STAGES:
        raise ValueError(f"unknown stage {stage!r}; expected one of {STAGES}")
    gpu = on_gpu(cfg) and stage in MODEL_STAGES
    base = BASE_MB + (CUDA_BASE_MB if gpu else 0)
    if stage in ("problems", "compare"):
        return _round_mb(base)
    shape = _stage_shape(cfg, stage)
    weights = shape.params * DTYPE_BYTES[cfg["models"]["dtype"]] / 2**20
    if stage == "convert_smollm2":  # the dequantised copy next to the GGUF one
        return _round_mb(base + 2 * weights)
    if gpu:
        return _round_mb(base + weights)
    act = _activation_bytes(cfg, stage, shape) / 2**20
    if stage == "toy_models":  # two models, one trained at a time
        return _round_mb(base + 2 * 3 * weights + act)
    return _round_mb(base + 3 * weights + act)


def _round_mb(mb: float) -> int:
    return int(math.ceil(mb / 100.0) * 100)


def _work_of(cfg: Mapping, stage: str) -> tuple[float, list[tuple[float, int, int]]]:
    """The job's work: (trained tokens, [(generate calls, rows per call, new tokens per call)])."""
    p, t, d = cfg["pilot"], cfg["teacher"], cfg["distill"]
    train_problems = n_problems(cfg) * (1 - cfg["problems"]["heldout_frac"])
    if stage == "toy_models":
        toy = cfg["toy"]
        trained = 2 * toy["train_steps"] * toy["batch_size"] * _seq(cfg, p["max_new"])
        return trained, [(2, toy["eval_samples"], p["max_new"])]
    if stage == "teacher":
        calls = math.ceil(train_problems / t["batch_prompts"])
        return 0, [(calls, t["batch_prompts"] * t["n"], t["max_new"])]
    if stage == "make_teacher":
        sc = cfg["sft"]
        trained = sc["steps"] * sc["batch_size"] * _seq(cfg, t["max_new"])
        # evaluation of the made teacher (and the base model) on every problem; elicitation
        evals = (2 if sc["eval_base"] else 1) * math.ceil(n_problems(cfg) / t["batch_prompts"])
        calls = [(evals, t["batch_prompts"] * sc["eval_samples"], t["max_new"])]
        if sc["elicited_samples"]:
            calls.append((math.ceil(train_problems / t["batch_prompts"]),
                          t["batch_prompts"] * sc["elicited_samples"], t["max_new"]))
        return trained, calls
    if stage == "extract":
        return 2 * cfg["vhack"]["max_pairs"] * _seq(cfg, t["max_new"]), []
    if stage == "distill":
        return d["steps"] * d["batch_size"] * _seq(cfg, t["max_new"]), []
    if stage == "pilot":
        rows = p["group"] * p["prompts_per_step"]
        trained = p["steps"] * rows * _seq(cfg, p["max_new"])
        # one generate per step; the held-out evaluation per view (up to 3) and chunk
        heldout = max(1, round(n_problems(cfg) * cfg["problems"]["heldout_frac"]))
        eval_calls = math.ceil(heldout / p["eval_chunk"]) * 3
        eval_rows = min(p["eval_chunk"], heldout) * p["heldout_samples"]
        return trained, [(p["steps"], rows, p["max_new"]),
                         (eval_calls, eval_rows, p["max_new"])]
    if stage == "reevaluate":  # the held-out evaluation alone, per view (up to 3) and chunk
        heldout = max(1, round(n_problems(cfg) * cfg["problems"]["heldout_frac"]))
        return 0, [(math.ceil(heldout / p["eval_chunk"]) * 3, _reeval_rows(cfg), p["max_new"])]
    return 0, []


def stage_runtime(cfg: Mapping, stage: str) -> int:
    """Wall time (minutes) of a stage's job on its first attempt (module docstring: the
    formula)."""
    if stage not in STAGES:
        raise ValueError(f"unknown stage {stage!r}; expected one of {STAGES}")
    if stage in LIGHT_STAGES:
        return MIN_RUNTIME
    shape = _stage_shape(cfg, stage)
    gpu = on_gpu(cfg) and stage in MODEL_STAGES
    flops = GPU_FLOPS if gpu else CPU_FLOPS_PER_THREAD * stage_threads(cfg, stage)
    token_s = GPU_TOKEN_S if gpu else CPU_TOKEN_S
    trained, calls = _work_of(cfg, stage)
    work = 6 * shape.params * trained / flops
    work += sum(n * new * (token_s + 2 * shape.params * rows / flops) for n, rows, new in calls)
    load = LOAD_S + 8 * shape.params * shape.hidden / flops
    return int(max(MIN_RUNTIME, math.ceil(RUNTIME_MARGIN * (load + work) / 60)))


def stage_gpu(cfg: Mapping, stage: str) -> int:
    """GPUs of a stage's job: 1 for a model stage on a cuda config, else 0."""
    return int(on_gpu(cfg) and stage in MODEL_STAGES)


def job_size(cfg: Mapping, stage: str) -> JobSize:
    """Every request of a stage's job (first attempt).

    Args:
        cfg: the validated config as a mapping of sections (defaults filled), e.g. Snakemake's
            ``config`` after ``rules/common.smk`` validated it, or ``Config.raw``.
        stage: a rule name of :data:`STAGES` (``fold_pilot`` is ``pilot``; ``sweep_compare``
            and ``fold_compare`` are ``compare``).

    Raises:
        ValueError: an unknown stage. ResourceError: the model's size cannot be worked out
            (names ``models.params``).
    """
    return JobSize(threads=stage_threads(cfg, stage), mem_mb=stage_mem_mb(cfg, stage),
                   runtime=stage_runtime(cfg, stage), gpu=stage_gpu(cfg, stage))


def pilot_priority(arm: str) -> int:
    """Snakemake ``priority`` of a pilot job: the arm's relative cost, so that the longest pilots
    start first and the short ones fill the cores at the end (longest-processing-time-first
    scheduling; Graham 1969, "Bounds on multiprocessing timing anomalies", SIAM J. Appl. Math.).

    The cost is one unit per held-out view the arm declares (:attr:`evil_moe.rl.arms.Arm.views`;
    each view samples ``heldout_samples`` completions per held-out problem; vanilla's extra
    ``projected`` view under ``pilot.static_projection`` is not counted) plus one when it needs
    per-sample gradients (one backward per rollout instead of one per step). On the toy default,
    route and route_random (2 views, per-sample gradients: 50–67 s) then start before vanilla,
    erase, random_v and oracle_reward (1 view: 36–48 s). Priority changes only the order in which ready
    jobs start, never a result; jobs of other rules keep priority 0 (so the short distill job
    fills a core beside the last pilots).

    Args:
        arm: a pilot arm name (:data:`evil_moe.rl.arms.ARMS`).

    Returns:
        an int ≥ 0; 0 for an arm the registry does not know (the config check refuses it first).
    """
    cls = ARMS.get(arm)
    if cls is None:
        return 0
    return len(cls.views) + int(cls.needs_sample_grads)


# ---- GPU memory of a pilot -----------------------------------------------------------------------
# Bytes autograd saves for the backward per token and decoder layer, per unit of each width, in a
# bf16 (fp16) / fp32 model with the SVD adapter on every Linear (y = Wx + U diag(s) Vh x): hidden
# states, RMSNorm's fp32 intermediates, q/k norms and RoPE, SDPA's q, k, v, output and
# log-sum-exp, the SiLU-gated MLP (gate, up, their product), each knob's Vh x. Measured with
# torch.autograd.graph.saved_tensors_hooks on Qwen3-architecture models of several widths
# (2026-12-01, torch 2.13; tests/test_resources.py re-measures them), the hidden coefficient
# rounded up: saved bytes per token per layer = a x hidden + b x q + c x kv + d x intermediate.
SAVED_PER_LAYER = {2: (18.5, 8.25, 12.125, 6.0), 4: (29.5, 12.25, 20.125, 12.0)}
# The loss forms fp32 logits z = logits / T of every completion token and keeps them for the
# log-sum-exp's backward (evil_moe.model.logprobs.token_logprobs): 4 B x vocab per completion token.
LOGIT_BYTES = 4
# Fraction of the GPU the pilot may plan to use: the rest is the CUDA context, cuBLAS workspaces
# and the caching allocator's fragmentation.
GPU_USABLE = 0.9
# Rows per no-grad forward when generate's scores would exceed 2 GiB (evil_moe.rl.rollout).
FORWARD_ROWS = 8
GENERATE_SCORES_CAP = 2 * 2**30


@dataclass(frozen=True)
class GpuMemory:
    """A pilot's peak GPU memory (bytes) by phase, and what each phase is made of.

    Attributes:
        resident: weights + the adapter's U and Vh buffers + δS, δS_hack, their gradients and
            AdamW's two moments (fp32): on the GPU for the whole run.
        train: resident + the loss of one micro-batch (``pilot.micro_batch`` rows, or every row of
            the step): saved activations, the fp32 logits and their gradients, and a copy of the
            adapter buffers in each knob's matmuls (measured on a CPU; cuBLAS may avoid it).
        sample: resident + the weights' saved copy while the adapter is merged + one training
            generate (``group x prompts_per_step`` rows): the KV cache and the prefill's MLP, or
            the behaviour log-probs' no-grad forward.
        evaluate: the same for one held-out generate (``eval_chunk x heldout_samples`` rows).

    With ``pilot.sampler: vllm`` every phase also holds the engine's share
    (``pilot.vllm_gpu_memory_utilization x models.gpu_mem_gb``: its weights and KV cache), and
    sampling costs only the no-grad forward that scores the engine's ids.
    """

    resident: float
    train: float
    sample: float
    evaluate: float

    @property
    def peak(self) -> float:
        """The largest phase (bytes)."""
        return max(self.train, self.sample, self.evaluate)


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


def saved_bytes_per_token(s: ModelShape, dtype: str) -> float:
    """Bytes autograd keeps per token for the backward of the pilot's loss forward (every token
    of a row; the logits' share is :data:`LOGIT_BYTES` x vocab per completion token, not
    included). ``dtype``: the model's (``models.dtype``)."""
    size = DTYPE_BYTES[dtype]
    a, b, c, d = SAVED_PER_LAYER[2 if size <= 2 else 4]
    scale = size / 4 if size > 4 else 1.0
    return scale * (s.layers * (a * s.hidden + b * s.q + c * s.kv + d * s.intermediate)
                    + 4 * s.hidden)


def pilot_gpu_memory(cfg: Mapping, *, micro_batch: int | None = None,
                     eval_chunk: int | None = None) -> GpuMemory:
    """Peak GPU memory of one pilot job, by phase (bytes), from the config.

    Args:
        cfg: the validated config (sections with defaults filled).
        micro_batch, eval_chunk: override ``pilot.micro_batch`` / ``pilot.eval_chunk`` (to find
            the largest that fits).

    Returns:
        :class:`GpuMemory`. Rows are ``seq = prompt + max_new`` tokens long (prompt: 640 LeetCode,
        256 HumanEval, 128 toy tokens); every completion is taken at ``max_new`` (the worst case).

    Raises:
        ResourceError: the student's shape cannot be worked out (names ``models.params``).
    """
    p, models = cfg["pilot"], cfg["models"]
    s = model_shape(cfg)
    w = DTYPE_BYTES[models["dtype"]]
    targets = list(cfg["adapter"]["target_modules"])
    dims = adapter_linears(s, targets)
    rank = sum(min(o, i) for o, i in dims)
    buffers = w * sum(min(o, i) * (o + i) for o, i in dims)  # U (d_out, r) and Vh (r, d_in)
    knobs = 4 * rank * 2 * 4  # delta_s, delta_s_hack, their grads, 2 AdamW moments; fp32
    weights = w * s.params
    resident = weights + buffers + knobs
    prompt, new = PROMPT_TOKENS[cfg["problems"]["source"]], int(p["max_new"])
    seq = prompt + new
    rows = p["group"] * p["prompts_per_step"]
    mb = min(rows, (p["micro_batch"] if micro_batch is None else micro_batch) or rows)
    per_layer_saved = saved_bytes_per_token(s, models["dtype"])
    train = (resident + buffers  # the knobs' matmul copies of U and Vh
             + mb * seq * per_layer_saved
             + mb * new * s.vocab * (LOGIT_BYTES + 4 + w))  # z, its gradient, the logits' one
    # Sampling with the adapter merged into the weights (evil_moe.model.adapter.merged): the
    # wrapped weights are copied once (a tied lm_head is not merged).
    tied_head = "lm_head" in targets and s.tied
    merged = w * sum(o * i for o, i in dims) - (w * s.vocab * s.hidden if tied_head else 0)
    largest = max((o * i for o, i in dims), default=0) * 8  # the fp32 sum W + U diag(s) Vh

    def generate(n: int) -> float:
        kv_cache = w * n * seq * s.layers * 2 * s.kv
        prefill = w * n * prompt * 3 * s.intermediate  # gate, up, their product
        scores = 2 * n * new * s.vocab * 4
        if scores <= GENERATE_SCORES_CAP:  # generate returns the logits and scores
            return kv_cache + prefill + scores
        # behaviour log-probs from a no-grad forward of FORWARD_ROWS rows at a time: logits,
        # fp32 z, softmax and p * z for the entropy (after generate's cache is freed)
        forward = min(FORWARD_ROWS, n) * new * s.vocab * (w + 12)
        return max(kv_cache + prefill, forward)

    base = resident + merged + largest
    heldout = max(1, round(n_problems(cfg) * cfg["problems"]["heldout_frac"]))
    chunk = p["eval_chunk"] if eval_chunk is None else eval_chunk
    eval_rows = min(chunk, heldout) * p["heldout_samples"]
    if p.get("sampler") == "vllm":
        # the engine holds its share of the GPU the whole run; it samples (its KV cache inside
        # that share), our model scores the ids with the no-grad forward
        engine = float(p["vllm_gpu_memory_utilization"]) * float(models["gpu_mem_gb"]) * 1e9
        score = min(FORWARD_ROWS, rows) * new * s.vocab * (w + 12)
        score_eval = min(FORWARD_ROWS, eval_rows) * new * s.vocab * (w + 12)
        return GpuMemory(resident=resident + engine, train=train + engine,
                         sample=base + engine + score, evaluate=base + engine + score_eval)
    return GpuMemory(resident=resident, train=train, sample=base + generate(rows),
                     evaluate=base + generate(eval_rows))


def check_gpu_fit(cfg: Mapping) -> GpuMemory | None:
    """Refuse a pilot that would not fit the GPU it asks for (``models.gpu_mem_gb``, GB = 1e9
    bytes, of which :data:`GPU_USABLE` is planned): one line naming the key to change.

    Returns:
        the pilot's :class:`GpuMemory`, or None when the config puts no model on a GPU.

    Raises:
        ResourceError: the peak of a phase exceeds the usable memory; the message names the key
            that bounds that phase (``pilot.micro_batch`` for training, ``pilot.eval_chunk`` for
            the held-out evaluation, ``pilot.group`` / ``pilot.prompts_per_step`` or
            ``pilot.max_new`` for sampling) with the largest value that fits, or
            ``models.gpu_mem_gb``.
    """
    if not on_gpu(cfg):
        return None
    mem = pilot_gpu_memory(cfg)
    gpu = float(cfg["models"]["gpu_mem_gb"]) * 1e9
    usable = GPU_USABLE * gpu
    if mem.peak <= usable:
        return mem
    p = cfg["pilot"]
    need = f"a pilot needs ~{mem.peak / 1e9:.0f} GB of GPU memory"
    have = (f"{GPU_USABLE:.0%} of models.gpu_mem_gb {cfg['models']['gpu_mem_gb']} GB is "
            f"{usable / 1e9:.0f} GB")
    if mem.train == mem.peak:
        rows = p["group"] * p["prompts_per_step"]
        fits = [m for m in range(1, rows + 1)
                if pilot_gpu_memory(cfg, micro_batch=m).train <= usable]
        fix = (f"set 'pilot.micro_batch' to {max(fits)} or less" if fits else
               "lower 'pilot.max_new' or raise 'models.gpu_mem_gb'")
        what = f"training (micro-batch of {p['micro_batch'] or rows} rows)"
    elif mem.evaluate == mem.peak:
        fits = [c for c in range(1, p["eval_chunk"] + 1)
                if pilot_gpu_memory(cfg, eval_chunk=c).evaluate <= usable]
        fix = (f"set 'pilot.eval_chunk' to {max(fits)} or less" if fits else
               "lower 'pilot.heldout_samples' or raise 'models.gpu_mem_gb'")
        what = f"the held-out evaluation ({p['eval_chunk']} problems x {p['heldout_samples']} samples)"
    else:
        fix = "lower 'pilot.prompts_per_step' or 'pilot.max_new', or raise 'models.gpu_mem_gb'"
        what = f"sampling ({p['group']} x {p['prompts_per_step']} rollouts)"
    raise ResourceError(f"{need} in {what}, more than {have}: {fix} "
                        "(docs/job-sizes.md#gpu-memory)")
