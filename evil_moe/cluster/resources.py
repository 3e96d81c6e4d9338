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

    mem = base + resident + activations + engine   (rounded up to 100 MiB)
    base        = 800 MiB (Python, torch, transformers, the grader's sandboxes)
                  + 3000 MiB host-side CUDA context when models.device is cuda
    engine      = with pilot.sampler vllm, the pilot's and re-evaluation's in-process engine:
                  6000 MiB (vLLM's imports, the engine and its scheduler, Dynamo and Inductor
                  compiling the model in the job's process, the untied head's copy) + 500 MiB
                  per Inductor compile worker, one per pilot.threads
                  (TORCHINDUCTOR_COMPILE_THREADS); estimates, never measured
    resident    = weights x 3 on a CPU (W, and the adapter's U and Vh buffers in the model dtype)
                  weights x 1 on a GPU (loaded on the host, then moved)
    activations = on a CPU the larger of (0 on a GPU: they live on the device)
      training  4 B x rows x seq x (layers x (50 hidden + 4 intermediate) + 3 vocab)
      generate  4 B x rows x (seq x layers x hidden + max_new x vocab)   (KV cache, scores)

``rows`` is what one forward holds (``pilot.micro_batch`` or ``group x prompts_per_step``;
``distill.micro_batch`` or ``batch_size``; ``sft.micro_batch`` or ``sft.batch_size`` for
make_teacher, whose demonstrations are about ``teacher.max_new`` long;
``toy.batch_size``;
``teacher.batch_prompts x n`` for a generate call; ``eval_chunk x heldout_samples`` for the
pilot's held-out evaluation, ``eval_chunk x reevaluate.samples`` for its re-evaluation), ``seq`` the prompt (toy bank 128, LeetCode
640, HumanEval 256 tokens) plus ``max_new`` (or a templated answer's length). The per-token
constants count saved fp32 values (hidden states, MLP and adapter intermediates, logits with
their log-softmax, and attention probabilities where padding makes SDPA keep them); they were
fitted to measured peaks (docs/job-sizes.md): the toy default's jobs and SmolLM2-135M's.

**Wall time** (``runtime``, minutes; ``attempt`` times that on a retry)::

    runtime = max(10, 3 x seconds / 60)
    seconds = load + work                            (JobSize.seconds: an idle node)
    work    = 6 x params x trained tokens / flops
              + sum over generate calls of max_new x (t_token + 2 x params x rows / flops)
              + for extract, its checks on the CPU: extractions x modules x
                (1e-4 s + 2e-8 s x pairs x width), and the gradients' QR
    flops   = 5e10 x threads on a CPU, 2e14 on a GPU; t_token = 0.01 s (CPU), 0.04 s (GPU, the
              per-token overhead of batched generate); load = 60 s + the SVD (8 x params x hidden
              / flops)

The throughput constants are rough (fitted so that every request is at least twice the measured
time of the toy's and SmolLM2's jobs, three times for the toy: README "Job sizes"); the factor 3 covers a busy node and the grader;
a job that still runs out of time or memory is
resubmitted with twice as much under ``--retries 1``, and a profile may override any rule with
``set-resources`` (``evil-moe slurm-check`` refuses an override below the model's memory or
below ``seconds``).

**GPUs**: the model stages (make_teacher, teacher, extract, distill, pilot, reevaluate) ask for one when
``models.device`` is ``cuda`` or ``cuda:N``, and under ``auto`` wherever their jobs would find one
(:func:`gpu_for_auto`; the workflow and ``slurm-check`` size the jobs with
:func:`resolve_auto_device`); ``cpu`` asks for none.

The model's shape and its bytes per token: :mod:`evil_moe.cluster.shapes`; the extract job's work:
:mod:`evil_moe.cluster.extract_cost`; a pilot's and extract's GPU memory, and the check that
they fit: :mod:`evil_moe.cluster.gpu_memory`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Sequence


# The stages with a job size of their own, their thread-count keys, which load a model and which
# are light: views of the one table of stages (evil_moe/cluster/stages.py).
from evil_moe.cluster.stages import LIGHT_STAGES, MODEL_STAGES, THREAD_KEYS
from evil_moe.cluster.stages import SIZE_STAGES as STAGES
from evil_moe.rl.arms.registry import ARMS
from evil_moe.cluster.extract_cost import (BACKWARD_PEAK, EXTRACTION_S_COORD, EXTRACTION_S_MODULE,
                                           extract_store_bytes, extract_work)
from evil_moe.cluster.shapes import (DTYPE_BYTES, LOGIT_BYTES, PROMPT_TOKENS, ModelShape,
                                     adapter_linears, n_problems, on_gpu, saved_bytes_per_token,
                                     stage_shape)

BASE_MB = 800
CUDA_BASE_MB = 3000
# The vLLM engine in a pilot's process (pilot.sampler vllm) and each of Inductor's compile
# workers (as many as pilot.threads: evil_moe.rl.policy.vllm_sampler.colocated_env), host MiB; never
# measured (the GPU device check runs without vLLM: docs/gpu.md).
VLLM_HOST_MB = 6000
COMPILE_WORKER_MB = 500
MIN_RUNTIME = 10
RUNTIME_MARGIN = 3.0
CPU_FLOPS_PER_THREAD = 5e10
GPU_FLOPS = 2e14
CPU_TOKEN_S = 0.01
GPU_TOKEN_S = 0.04
LOAD_S = 60.0


@dataclass(frozen=True)
class JobSize:
    """One job's request: ``threads`` (CPUs, also torch's thread count), ``mem_mb`` (MiB, first
    attempt: the model's peak), ``runtime`` (minutes, first attempt: :data:`RUNTIME_MARGIN` x the
    model's time), ``gpu`` (count); ``seconds``, the model's wall time on an idle node."""

    threads: int
    mem_mb: int
    runtime: int
    gpu: int
    seconds: float = 0.0

    def mem_mb_at(self, attempt: int) -> int:
        """Memory of the ``attempt``-th try (1-based): ``attempt x mem_mb``."""
        return self.mem_mb * max(1, int(attempt))

    def runtime_at(self, attempt: int) -> int:
        """Wall time of the ``attempt``-th try (1-based): ``attempt x runtime`` minutes."""
        return self.runtime * max(1, int(attempt))


# One folder per GPU the NVIDIA driver sees (read without importing torch: the Snakefile sizes
# the jobs at every call).
NVIDIA_GPUS = Path("/proc/driver/nvidia/gpus")


def resolve_auto_device(cfg: Mapping, gpu: bool) -> dict:
    """The config the jobs are sized with: ``models.device: auto`` becomes ``cuda`` when ``gpu``
    (:func:`gpu_for_auto`: the jobs would find one), else ``cpu``; any other device is kept. A
    shallow copy; the jobs themselves still get ``auto`` (and pick the GPU they were given)."""
    out = dict(cfg)
    if str(cfg["models"]["device"]) == "auto":
        out["models"] = {**cfg["models"], "device": "cuda" if gpu else "cpu"}
    return out


def gpu_for_auto(where: str, partitions: Sequence[str] = (), *, run=None,
                 environ: Mapping[str, str] | None = None) -> bool:
    """Whether a model job of a run would use a GPU under ``models.device: auto``, i.e. whether it
    must ask for one (docs/job-sizes.md, "GPUs").

    Args:
        where: ``local`` (the jobs run on this machine: an NVIDIA driver lists a GPU in
            ``/proc/driver/nvidia/gpus`` and the installed torch is not a ``+cpu`` build),
            ``cluster`` (the jobs go to Slurm: a partition they are sent to has a GPU, by
            ``sinfo -h -o "%P %G"``; ``partitions`` empty = the default partition), or ``job``
            (inside a Slurm job: the job was given a GPU, ``SLURM_JOB_GPUS`` /
            ``SLURM_GPUS_ON_NODE`` / ``SLURM_GPUS``).
        partitions: the partitions the model rules go to (the profile's ``slurm_partition``).
        run: ``subprocess.run`` stand-in (tests); environ: ``os.environ`` stand-in.

    Returns:
        True when the jobs would find a GPU. ``sinfo`` missing or failing counts as no GPU.

    Raises:
        ValueError: an unknown ``where``.
    """
    import os

    env = os.environ if environ is None else environ
    if where == "job":  # SLURM_JOB_GPUS lists GPU indices ("0" is one); the others count them
        return bool(env.get("SLURM_JOB_GPUS", "").strip()) or any(
            env.get(k, "").strip() not in ("", "0") for k in ("SLURM_GPUS_ON_NODE", "SLURM_GPUS"))
    if where == "local":
        from importlib import metadata

        try:
            cpu_build = metadata.version("torch").endswith("+cpu")
        except metadata.PackageNotFoundError:
            return False
        return NVIDIA_GPUS.is_dir() and any(NVIDIA_GPUS.iterdir()) and not cpu_build
    if where != "cluster":
        raise ValueError(f"where must be local, cluster or job, got {where!r}")
    import subprocess

    try:
        proc = (run or subprocess.run)(["sinfo", "-h", "-o", "%P %G"], capture_output=True,
                                       text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return False
    if proc.returncode != 0:
        return False
    with_gpu, default = set(), None
    for line in proc.stdout.splitlines():
        name, _, gres = line.strip().partition(" ")
        if name.endswith("*"):
            name = name[:-1]
            default = name
        if "gpu" in gres:
            with_gpu.add(name)
    wanted = set(partitions) or ({default} if default else set())
    return bool(wanted & with_gpu)


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
    if stage == "extract":  # one micro-batch of the longest rows, and the stored gradients
        w = extract_work(cfg, s)
        batch = cfg["vhack"]["micro_batch"] * BACKWARD_PEAK * (
            w.longest_row * saved_bytes_per_token(s, cfg["models"]["dtype"], "merged")
            + w.longest_completion * s.vocab * 3 * LOGIT_BYTES)  # z, its log-softmax, gradient
        return batch + extract_store_bytes(cfg, s, w)
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



def stage_mem_mb(cfg: Mapping, stage: str) -> int:
    """Memory (MiB) of a stage's job on its first attempt (module docstring: the formula)."""
    if stage not in STAGES:
        raise ValueError(f"unknown stage {stage!r}; expected one of {STAGES}")
    gpu = on_gpu(cfg) and stage in MODEL_STAGES
    base = BASE_MB + (CUDA_BASE_MB if gpu else 0)
    if stage in ("problems", "compare"):
        return _round_mb(base)
    shape = stage_shape(cfg, stage)
    weights = shape.params * DTYPE_BYTES[cfg["models"]["dtype"]] / 2**20
    if stage == "convert_smollm2":  # the dequantised copy next to the GGUF one
        return _round_mb(base + 2 * weights)
    base += engine_host_mb(cfg, stage)
    if gpu:  # extract also keeps the stored gradients' coordinates on the host
        store = extract_store_bytes(cfg, shape, extract_work(cfg, shape), gradients_on_host=False) \
            if stage == "extract" else 0.0
        return _round_mb(base + weights + store / 2**20)
    act = _activation_bytes(cfg, stage, shape) / 2**20
    if stage == "toy_models":  # two models, one trained at a time
        return _round_mb(base + 2 * 3 * weights + act)
    return _round_mb(base + 3 * weights + act)


def engine_host_mb(cfg: Mapping, stage: str) -> float:
    """Host MiB of the in-process vLLM engine of a pilot or re-evaluation job
    (``pilot.sampler: vllm``): :data:`VLLM_HOST_MB` plus :data:`COMPILE_WORKER_MB` per compile
    worker (``pilot.threads`` of them); 0 for any other stage or sampler."""
    if stage not in ("pilot", "reevaluate") or cfg["pilot"].get("sampler") != "vllm":
        return 0.0
    return VLLM_HOST_MB + COMPILE_WORKER_MB * stage_threads(cfg, stage)


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
    if stage == "extract":  # every completion's forward and backward (the checks: below)
        w = extract_work(cfg)
        return w.completions * w.row_tokens, []
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


def stage_seconds(cfg: Mapping, stage: str) -> float:
    """The model's wall time of a stage's job on an idle node, in seconds: ``load + work``
    (module docstring: the formula; what ``runtime`` asks three times of, and what
    ``evil-moe slurm-check`` holds a profile's override against)."""
    if stage not in STAGES:
        raise ValueError(f"unknown stage {stage!r}; expected one of {STAGES}")
    if stage in LIGHT_STAGES:
        return LOAD_S
    shape = stage_shape(cfg, stage)
    gpu = on_gpu(cfg) and stage in MODEL_STAGES
    flops = GPU_FLOPS if gpu else CPU_FLOPS_PER_THREAD * stage_threads(cfg, stage)
    token_s = GPU_TOKEN_S if gpu else CPU_TOKEN_S
    trained, calls = _work_of(cfg, stage)
    work = 6 * shape.params * trained / flops
    work += sum(n * new * (token_s + 2 * shape.params * rows / flops) for n, rows, new in calls)
    if stage == "extract":
        work += _extract_checks_seconds(cfg, shape)
    load = LOAD_S + 8 * shape.params * shape.hidden / flops
    return load + work


def _extract_checks_seconds(cfg: Mapping, s: ModelShape) -> float:
    """The extract stage's checks on the CPU (fp64): the stored gradients' factorisation (a
    Householder QR per module, ``2 r (2 pairs)^2`` flops) and every extraction of V over all
    modules (:data:`EXTRACTION_S_MODULE`, :data:`EXTRACTION_S_COORD`)."""
    w = extract_work(cfg, s)
    dims = adapter_linears(s, cfg["adapter"]["target_modules"])
    pairs = sum(w.pairs)
    qr = sum(2.0 * min(o, i) * (2 * pairs) ** 2 for o, i in dims)
    flops = CPU_FLOPS_PER_THREAD * stage_threads(cfg, "extract")
    per_extraction = len(dims) * (EXTRACTION_S_MODULE + EXTRACTION_S_COORD * pairs * w.width)
    return qr / flops + w.extractions * per_extraction


def stage_runtime(cfg: Mapping, stage: str) -> int:
    """Wall time (minutes) of a stage's job on its first attempt: :data:`RUNTIME_MARGIN` times
    :func:`stage_seconds`, at least :data:`MIN_RUNTIME`."""
    return int(max(MIN_RUNTIME, math.ceil(RUNTIME_MARGIN * stage_seconds(cfg, stage) / 60)))


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
                   runtime=stage_runtime(cfg, stage), gpu=stage_gpu(cfg, stage),
                   seconds=stage_seconds(cfg, stage))


def pilot_priority(arm: str) -> int:
    """Snakemake ``priority`` of a pilot job: the arm's relative cost, so that the longest pilots
    start first and the short ones fill the cores at the end (longest-processing-time-first
    scheduling; Graham 1969, "Bounds on multiprocessing timing anomalies", SIAM J. Appl. Math.).

    The cost is one unit per held-out view the arm declares (:attr:`evil_moe.rl.arms.base.Arm.views`;
    each view samples ``heldout_samples`` completions per held-out problem; vanilla's extra
    ``projected`` view under ``pilot.static_projection`` is not counted) plus one when it needs
    per-sample gradients (one backward per rollout instead of one per step) plus one when it has a
    router (Evil MoE: a hooked forward of every rollout under its own mixture, and the pin bank's
    forward each step). On the toy default, route, route_random and moe (2 views and per-sample
    gradients or a router: 25–36 s per pilot two at a time) then start before vanilla and
    oracle_reward (1 view: 22–28 s). Priority changes only the order in which ready jobs start,
    never a result; the calibration runs and the audit, which route's pilots wait for, come first
    (:data:`GATING_PRIORITY`); jobs of other rules keep priority 0 (so the short distill job fills
    a core beside the last pilots).

    Args:
        arm: a pilot arm name (:data:`evil_moe.rl.arms.registry.ARMS`).

    Returns:
        an int ≥ 0; 0 for an arm the registry does not know (the config check refuses it first).
    """
    cls = ARMS.get(arm)
    if cls is None:
        return 0
    return len(cls.views) + int(cls.needs_sample_grads) + int(cls.router is not None)


#: Snakemake ``priority`` of the calibration runs and the detector audit: above every pilot's
#: (:func:`pilot_priority`). route's pilots wait for the audit's threshold and route_random's for
#: route's of the same seed, so at priority 0 the calibration runs started only after every other
#: pilot and the route → route_random chains ran last on one core (measured 2026-12-02: the
#: calibration runs began 8 min after extract, and the last 36 s of make run's pilots used one
#: of the two cores).
GATING_PRIORITY = 1 + max(pilot_priority(arm) for arm in ARMS)


