"""A pilot's and the extract job's peak GPU memory, by phase and by arm, from the config, and
the check that refuses a config that would not fit the GPU it asks for (``models.gpu_mem_gb``),
naming the key to change and the arm (docs/job-sizes.md, "GPU memory"). The per-token constants
it uses (:data:`~evil_moe.cluster.shapes.SAVED_PER_LAYER`,
:data:`~evil_moe.cluster.shapes.SAVED_PER_LAYER_MERGED`,
:data:`~evil_moe.cluster.shapes.LOGIT_BYTES`) live with the model's shape in
:mod:`evil_moe.cluster.shapes`.

The training phase depends on the arm's loss forward (:func:`loss_forward`): Evil MoE's arms
(``moe``, ``moe_random``) train through the adapter's hooks under the router's mixture
(:meth:`evil_moe.model.adapter.SVDAdapter.mixture`), every other arm with the knobs merged into
the weights and the wrapped Linears' inputs and outputs recorded
(:meth:`evil_moe.model.adapter.SVDAdapter.merged_gradients`); :func:`train_terms` gives each
part of the phase.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

from evil_moe.cluster.extract_cost import extract_work
from evil_moe.cluster.shapes import (DTYPE_BYTES, LOGIT_BYTES, PROMPT_TOKENS, ResourceError,
                                     adapter_linears, model_shape, n_problems, on_gpu,
                                     saved_bytes_per_token)
from evil_moe.rl.arms.registry import ARMS
from evil_moe.rl.detectors.registry import DETECTORS

# Fraction of the GPU the pilot may plan to use: the rest is the CUDA context, cuBLAS workspaces
# and the caching allocator's fragmentation.
GPU_USABLE = 0.9
# Rows of one prompt per no-grad scoring forward (evil_moe.rl.policy.rollout.FORWARD_ROWS and
# scoring_chunks; held equal by tests/test_cluster_resources.py: no torch import here).
FORWARD_ROWS = 8
GENERATE_SCORES_CAP = 2 * 2**30


@dataclass(frozen=True)
class GpuMemory:
    """A pilot's peak GPU memory (bytes) by phase, and what each phase is made of.

    Attributes:
        resident: weights + the adapter's U and Vh buffers + δS, δS_hack, their gradients and
            AdamW's two moments (fp32): on the GPU for the whole run.
        train: resident + the loss of one micro-batch (``pilot.micro_batch`` rows, or every row of
            the step) in the arm's forward (:func:`train_terms`): saved activations, the fp32
            logits and their gradients, and the forward's own terms.
        sample: resident + the weights' saved copy while the adapter is merged + one training
            generate (``group x prompts_per_step`` rows): the KV cache and the prefill's MLP, or
            the behaviour log-probs' no-grad forward.
        evaluate: the same for one held-out generate (``eval_chunk x heldout_samples`` rows).

    ``arm``: the arm whose training phase this is (:func:`train_terms`).

    With ``pilot.sampler: vllm`` every phase also holds the engine's share
    (``pilot.vllm_gpu_memory_utilization x models.gpu_mem_gb``: its weights and KV cache), and
    sampling costs only the no-grad forward that scores the engine's ids.
    """

    resident: float
    train: float
    sample: float
    evaluate: float
    arm: str = "vanilla"

    @property
    def peak(self) -> float:
        """The largest phase (bytes)."""
        return max(self.train, self.sample, self.evaluate)



def loss_forward(arm: str) -> str:
    """The forward the pilot's loss takes for ``arm``: ``"hooked"`` for an arm with a router
    (:attr:`evil_moe.rl.arms.base.Arm.router`: Evil MoE's mixture needs the hooks' per-row ``s``),
    ``"merged"`` otherwise (:meth:`evil_moe.rl.trainer.trainer.Trainer.gradients`).

    Raises:
        ValueError: an arm the registry does not know (names it).
    """
    if arm not in ARMS:
        raise ValueError(f"unknown arm {arm!r}; expected one of {sorted(ARMS)}")
    return "hooked" if ARMS[arm].router is not None else "merged"


def train_terms(cfg: Mapping, arm: str = "vanilla", *, micro_batch: int | None = None) -> dict:
    """The parts of a pilot's training phase for ``arm`` (bytes), from the student's shape
    (layers, widths, vocabulary), the rows and tokens of a micro-batch and ``models.dtype``. With
    ``mb`` rows of ``seq = prompt + max_new`` tokens (every row forwards its prompt: the merged
    forward's shared prompts are not counted, an upper bound), ``w`` bytes per weight, ``R`` the
    knobs' total rank and the wrapped Linears ``(d_out, d_in)``:

    - ``logits``: ``mb x max_new x vocab x (4 + 4 + w)`` (fp32 z, its gradient, the logits'), both
      forwards;
    - ``activations``: ``mb x seq x`` :func:`~evil_moe.cluster.shapes.saved_bytes_per_token` of the
      arm's forward (hooked: autograd's tensors, each knob's ``Vh x`` among them; merged: the
      capture's inputs and outputs of every wrapped Linear too);
    - hooked only: ``buffer_copies`` ``w x Σ r (d_out + d_in)`` (the knobs' matmuls copy ``U`` and
      ``Vh``, measured on a CPU), ``head_delta`` ``2 x mb x max_new x vocab x w`` with a knob on
      ``lm_head`` (its hook's ``U diag(s) Vh x`` and the sum beside the head's output, at the
      forward's end) and ``mixture`` ``mb x R x (4 + w)`` (each row's ``s_b``, fp32 and its cast;
      the router's pooled activations, ``mb x hidden x 4``, are negligible, and its no-grad
      pooling forward runs before the loss's, never beside it);
    - merged only: ``weight_copies`` ``w x Σ d_out d_in`` (the wrapped weights saved while merged;
      a tied head gets a new merged Parameter of the same size), ``output_grads``
      ``w x mb x (seq x Σ d_out + max_new x vocab)`` (the capture's backward returns the gradient
      of every recorded output at once: the layers' Linears on every token, the head on the
      completion's), ``fp32_grads`` in a model narrower than fp32 (the knobs' gradient is
      formed in fp32 module by module: the largest module's output gradient, ``U``, input and
      ``Vh`` cast, ``4 x (tokens x (d_out + d_in) + r (d_out + d_in))`` with the head's
      ``mb x max_new`` tokens or a layer's ``mb x seq``) and, for an arm with per-sample gradients
      (:attr:`evil_moe.rl.arms.base.Arm.needs_sample_grads`, or a penalising arm whose detector
      reads them), ``per_row``
      ``group x prompts_per_step x R x 4`` (every row's fp32 gradient, kept for the step).

    Raises:
        ResourceError: the student's shape cannot be worked out (names ``models.params``).
        ValueError: an unknown arm.
    """
    forward = loss_forward(arm)
    p, models = cfg["pilot"], cfg["models"]
    s = model_shape(cfg)
    w = DTYPE_BYTES[models["dtype"]]
    dims = adapter_linears(s, list(cfg["adapter"]["target_modules"]))
    rank = sum(min(o, i) for o, i in dims)
    new = int(p["max_new"])
    seq = PROMPT_TOKENS[cfg["problems"]["source"]] + new
    rows = p["group"] * p["prompts_per_step"]
    mb = min(rows, (p["micro_batch"] if micro_batch is None else micro_batch) or rows)
    terms = {"logits": mb * new * s.vocab * (LOGIT_BYTES + 4 + w),
             "activations": mb * seq * saved_bytes_per_token(s, models["dtype"], forward)}
    head = "lm_head" in cfg["adapter"]["target_modules"]
    if forward == "hooked":
        terms["buffer_copies"] = w * sum(min(o, i) * (o + i) for o, i in dims)
        terms["head_delta"] = 2 * mb * new * s.vocab * w if head else 0
        terms["mixture"] = mb * rank * (4 + w)
    else:
        terms["weight_copies"] = w * sum(o * i for o, i in dims)
        terms["output_grads"], terms["fp32_grads"] = capture_grad_bytes(s, dims, w, mb, seq, new, head)
        # a penalising arm keeps every row's gradient in its scoring pass when its detector reads them
        per_row = ARMS[arm].needs_sample_grads or (ARMS[arm].flags_with_detector() and ARMS[arm].penalises
                                                   and "sample_grads" in DETECTORS[p["detector"]].needs)
        terms["per_row"] = rows * rank * 4 if per_row else 0
    return terms


def capture_grad_bytes(s, dims: list[tuple[int, int]], w: int, rows: int, seq: int,
                       completion: int, head: bool) -> tuple[float, float]:
    """The merged forward's backward (:meth:`evil_moe.model.adapter.GradientCapture.grads`):
    ``(output_grads, fp32_grads)`` bytes, the gradient of every recorded output at once
    (``w x rows x (seq x Σ d_out of the layers' wrapped Linears + completion x vocab)``, the head
    on the completion's tokens only) and, in a model narrower than fp32, the largest module's fp32
    casts (its output gradient, input, ``U`` and ``Vh``)."""
    outs = sum(o for o, _ in (dims[:-1] if head else dims))
    grads = w * rows * (seq * outs + (completion * s.vocab if head else 0))
    tokens = [rows * completion if head and k == len(dims) - 1 else rows * seq
              for k in range(len(dims))]
    fp32 = 0 if w >= 4 else max((4 * (t * (o + i) + min(o, i) * (o + i))
                                 for t, (o, i) in zip(tokens, dims)), default=0)
    return grads, fp32


def scoring_forward_bytes(s, w: int, n: int, prompt: int, new: int) -> float:
    """Peak bytes of the no-grad forward that scores a generate call's ids
    (:func:`evil_moe.rl.policy.rollout._forward_scores`, the vLLM sampler's behaviour log-probs): its
    worst chunk (:func:`evil_moe.rl.policy.rollout.scoring_chunks`: ``rows = min(FORWARD_ROWS, n)``
    rows of one prompt, ``n`` samples per prompt) either inside the model, the MLP's gate, up
    and their product on every token (``rows x (prompt + new) x 3 x intermediate x w``), or at
    its head: the logits of ``new + 1`` positions (the model's dtype) and, over ``new`` of
    them, the fp32 ``z = logits / T``, its softmax and ``p x z`` for the entropy
    (``rows x vocab x ((new + 1) x w + new x 12)``), whichever is larger."""
    rows = min(FORWARD_ROWS, n)
    inside = rows * (prompt + new) * 3 * s.intermediate * w
    head = rows * s.vocab * ((new + 1) * w + new * 12)
    return max(inside, head)


def pilot_gpu_memory(cfg: Mapping, arm: str = "vanilla", *, micro_batch: int | None = None,
                     eval_chunk: int | None = None) -> GpuMemory:
    """Peak GPU memory of one pilot job of ``arm``, by phase (bytes), from the config.

    Args:
        cfg: the validated config (sections with defaults filled).
        arm: the pilot's arm (the training phase's forward, :func:`train_terms`).
        micro_batch, eval_chunk: override ``pilot.micro_batch`` / ``pilot.eval_chunk`` (to find
            the largest that fits).

    Returns:
        :class:`GpuMemory`. Rows are ``seq = prompt + max_new`` tokens long (prompt: 640 LeetCode,
        256 HumanEval, 128 toy tokens); every completion is taken at ``max_new`` (the worst case).

    Raises:
        ResourceError: the student's shape cannot be worked out (names ``models.params``).
        ValueError: an unknown arm.
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
    train = resident + sum(train_terms(cfg, arm, micro_batch=micro_batch).values())
    # Sampling with the adapter merged into the weights (evil_moe.model.adapter.merged): the
    # wrapped weights are copied once (a tied lm_head gets a new Parameter of its merged weight)
    merged = w * sum(o * i for o, i in dims)
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
        # that share), our model scores the ids with the no-grad forward, a prompt's rows at a time
        engine = float(p["vllm_gpu_memory_utilization"]) * float(models["gpu_mem_gb"]) * 1e9
        score = scoring_forward_bytes(s, w, p["group"], prompt, new)
        score_eval = scoring_forward_bytes(s, w, p["heldout_samples"], prompt, new)
        return GpuMemory(resident=resident + engine, train=train + engine,
                         sample=base + engine + score, evaluate=base + engine + score_eval, arm=arm)
    return GpuMemory(resident=resident, train=train, sample=base + generate(rows),
                     evaluate=base + generate(eval_rows), arm=arm)


def pilot_gpu_memory_by_arm(cfg: Mapping, **overrides) -> dict[str, GpuMemory]:
    """:func:`pilot_gpu_memory` of every arm of ``pilot.arms`` (``overrides``: its keywords)."""
    return {arm: pilot_gpu_memory(cfg, arm, **overrides) for arm in cfg["pilot"]["arms"]}


def largest_pilot(cfg: Mapping, **overrides) -> GpuMemory:
    """The pilot of ``pilot.arms`` with the largest peak (the first listed on a tie)."""
    return max(pilot_gpu_memory_by_arm(cfg, **overrides).values(), key=lambda m: m.peak)


def extract_gpu_memory(cfg: Mapping, *, micro_batch: int | None = None) -> float:
    """Peak GPU memory (bytes) of the extract job: the pilot's resident part without AdamW
    (weights, the adapter's U and Vh, the knobs), the wrapped weights' copies while the knobs are
    merged, one micro-batch (``vhack.micro_batch``, or ``micro_batch``) of the longest rows in
    the merged forward (:meth:`evil_moe.model.adapter.SVDAdapter.merged_gradients`: saved
    activations and the recorded inputs and outputs per token as the pilot's merged forward, the
    fp32 logits of the longest completion, their gradients, and the capture's backward,
    :func:`capture_grad_bytes`), and every completion's stored gradient (fp32, all modules). The
    checks run on the CPU.

    Raises:
        ResourceError: the student's shape cannot be worked out (names ``models.params``).
    """
    models = cfg["models"]
    s = model_shape(cfg)
    w = DTYPE_BYTES[models["dtype"]]
    dims = adapter_linears(s, list(cfg["adapter"]["target_modules"]))
    rank = sum(min(o, i) for o, i in dims)
    buffers = w * sum(min(o, i) * (o + i) for o, i in dims)
    work = extract_work(cfg, s)
    mb = cfg["vhack"]["micro_batch"] if micro_batch is None else micro_batch
    rows = mb * (work.longest_row * saved_bytes_per_token(s, models["dtype"], "merged")
                 + work.longest_completion * s.vocab * (LOGIT_BYTES + 4 + w))
    merged = w * sum(o * i for o, i in dims)
    head = "lm_head" in cfg["adapter"]["target_modules"]
    grads = sum(capture_grad_bytes(s, dims, w, mb, work.longest_row, work.longest_completion, head))
    return (w * s.params + buffers + merged + 2 * 4 * rank + rows + grads
            + 4.0 * work.completions * rank)


def check_gpu_fit(cfg: Mapping) -> GpuMemory | None:
    """Refuse a pilot or an extract job that would not fit the GPU it asks for
    (``models.gpu_mem_gb``, GB = 1e9 bytes, of which :data:`GPU_USABLE` is planned): one line
    naming the key to change and the arm whose pilot needs the most (:func:`largest_pilot`).

    Returns:
        the largest pilot's :class:`GpuMemory`, or None when the config puts no model on a GPU.

    Raises:
        ResourceError: the peak of a phase exceeds the usable memory; the message names the arm,
            the key that bounds that phase (``pilot.micro_batch`` for training,
            ``pilot.eval_chunk`` for the held-out evaluation, ``pilot.group`` /
            ``pilot.prompts_per_step`` or ``pilot.max_new`` for sampling, ``vhack.micro_batch``
            for extract) with the largest value that fits every arm, or ``models.gpu_mem_gb``.
    """
    if not on_gpu(cfg):
        return None
    mem = largest_pilot(cfg)
    gpu = float(cfg["models"]["gpu_mem_gb"]) * 1e9
    usable = GPU_USABLE * gpu
    if mem.peak <= usable:
        _check_extract_fit(cfg, usable)
        return mem
    p = cfg["pilot"]
    need = f"a pilot of arm {mem.arm} needs ~{mem.peak / 1e9:.0f} GB of GPU memory"
    have = (f"{GPU_USABLE:.0%} of models.gpu_mem_gb {cfg['models']['gpu_mem_gb']} GB is "
            f"{usable / 1e9:.0f} GB")
    if mem.train == mem.peak:
        rows = p["group"] * p["prompts_per_step"]
        fits = [m for m in range(1, rows + 1)
                if largest_pilot(cfg, micro_batch=m).train <= usable]
        fix = (f"set 'pilot.micro_batch' to {max(fits)} or less" if fits else
               "lower 'pilot.max_new' or raise 'models.gpu_mem_gb'")
        what = f"training (micro-batch of {p['micro_batch'] or rows} rows)"
    elif mem.evaluate == mem.peak:
        fits = [c for c in range(1, p["eval_chunk"] + 1)
                if largest_pilot(cfg, eval_chunk=c).evaluate <= usable]
        fix = (f"set 'pilot.eval_chunk' to {max(fits)} or less" if fits else
               "lower 'pilot.heldout_samples' or raise 'models.gpu_mem_gb'")
        what = f"the held-out evaluation ({p['eval_chunk']} problems x {p['heldout_samples']} samples)"
    else:
        fix = "lower 'pilot.prompts_per_step' or 'pilot.max_new', or raise 'models.gpu_mem_gb'"
        what = f"sampling ({p['group']} x {p['prompts_per_step']} rollouts)"
    raise ResourceError(f"{need} in {what}, more than {have}: {fix} "
                        "(docs/job-sizes.md#gpu-memory)")


def _check_extract_fit(cfg: Mapping, usable: float) -> None:
    """:func:`check_gpu_fit`'s check of the extract job (``vhack.micro_batch``)."""
    peak = extract_gpu_memory(cfg)
    if peak <= usable:
        return
    mb = cfg["vhack"]["micro_batch"]
    fits = [m for m in range(1, mb) if extract_gpu_memory(cfg, micro_batch=m) <= usable]
    fix = (f"set 'vhack.micro_batch' to {max(fits)} or less" if fits else
           "lower 'teacher.max_new' (or 'vhack.max_pairs') or raise 'models.gpu_mem_gb'")
    raise ResourceError(
        f"the extract job needs ~{peak / 1e9:.0f} GB of GPU memory (micro-batch of {mb} rows of "
        f"up to {extract_work(cfg).longest_row} tokens), more than {GPU_USABLE:.0%} of "
        f"models.gpu_mem_gb {cfg['models']['gpu_mem_gb']} GB is {usable / 1e9:.0f} GB: {fix} "
        "(docs/job-sizes.md#gpu-memory)")
