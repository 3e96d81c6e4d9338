"""Benchmark: one pilot step of a Qwen3-4B-architecture student on one GPU (random weights, bf16).

The model is built from the Qwen3-4B config values (hidden 2560, 36 layers, MLP 9728, 32 heads,
8 KV heads, head_dim 128, vocab 151936, tied embeddings) with random weights in bf16 — nothing
is downloaded. Each targeted Linear's weight is *constructed from* random orthonormal factors,
``W = U diag(S) Vh``, and the SVD adapter receives those exact factors (a 4B-parameter SVD would
take minutes and measure nothing of the step). The step is the pilot's step: ONE batched
decode loop (:func:`evil_moe.rl.policy.rollout.generate`) of ``prompts × group`` rows with the adapter
merged into the weights (behaviour log-probs from the loop's own logits; ``--behaviour forward``
adds the chunked no_grad forward instead),
grading with our :class:`~evil_moe.env.grader.Grader`, the Dr.GRPO loss + backward through the
adapter hooks (in micro-batches of ``--micro-rows`` rows; the constant normaliser makes the summed
gradient independent of the split), the erase projection along a random ``v_hack`` (k = 2), and
the AdamW step. Random weights produce garbage: the eos id is made unreachable, so every row
decodes exactly ``max_new`` tokens (grading garbage is fast: no code block).

Prints, per step, seconds split into generation (decode / behaviour log-probs) / grading /
loss+backward / projection / optimiser, completion tokens/s, and the decode rate as a fraction
of the memory-bandwidth bound (``weight bytes / HBM bandwidth`` per decode step; KV-cache reads
ignored, so the true bound is a little lower than this figure assumes). The first step is a
warm-up (CUDA kernels, allocator, the first merge); the figures of the last step are the result.

The sampler runs side by side (``--samplers hf,vllm``, issue 22): our decode loop over
transformers' forward and KV cache (``pilot.sampler: hf``) and the colocated vLLM engine (``pilot.sampler: vllm``,
:mod:`evil_moe.rl.policy.vllm_sampler`: the random model saved to a temporary folder and loaded by vLLM,
the merged δS weights pushed before each step's sampling, behaviour log-probs from our forward);
vLLM is skipped, saying why, where it does not import. Each sampler's last step is summarised in
one table: seconds per phase, decode tokens/s, the fraction of the HBM bandwidth bound, the
sampler gap (our log-probs against the engine's), and the peak memory against the memory model
of the same setup (:func:`memory_model_gib`: config/pilot.yaml's model with the benchmark's rows,
max_new, micro-batch, targets and prompt length). The loss micro-batch
defaults to config/pilot.yaml's ``pilot.micro_batch``.

This is the one command to run when a GPU is lent (docs/gpu.md):

    python benchmarks/gpu_pilot.py --json gpu_pilot.json   # one GPU, HF then vLLM, ~10 min
    python benchmarks/gpu_pilot.py --samplers hf            # HF only
    python benchmarks/gpu_pilot.py --tiny                   # tiny config on CPU (smoke test)
    python benchmarks/gpu_pilot.py --hbm-bw 3.35e12         # e.g. an H100 SXM (default H200)
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

QWEN3_4B = dict(hidden_size=2560, num_hidden_layers=36, intermediate_size=9728,
                num_attention_heads=32, num_key_value_heads=8, head_dim=128, vocab_size=151936,
                tie_word_embeddings=True, max_position_embeddings=40960, rope_theta=1000000.0,
                rms_norm_eps=1e-6, hidden_act="silu", attention_bias=False)
TINY = dict(hidden_size=64, num_hidden_layers=2, intermediate_size=128, num_attention_heads=4,
            num_key_value_heads=2, head_dim=16, vocab_size=512, tie_word_embeddings=True,
            max_position_embeddings=2048, rope_theta=1000000.0, rms_norm_eps=1e-6,
            hidden_act="silu", attention_bias=False)


class GarbageTokenizer:
    """Prompts from the tiny test tokenizer; any generated id decodes (modulo its vocab); the eos
    id is one past the model's vocabulary, so it is never sampled and every row runs to max_new."""

    def __init__(self, tok, vocab_size: int):
        self.tok = tok
        self.pad_token_id = 0
        self.eos_token_id = vocab_size  # unreachable
        self._n = len(tok)

    def __len__(self):
        return self.eos_token_id

    def decode(self, ids, skip_special_tokens=True):
        return self.tok.decode([int(i) % self._n for i in ids], skip_special_tokens=skip_special_tokens)


def sync(device):
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)


def build(args, device):
    """(model, adapter, garbage tokenizer, prompt ids, problems, seconds)."""
    import torch
    from transformers import AutoModelForCausalLM, Qwen3Config

    import evil_moe.model.adapter as adapter_mod
    from evil_moe.env.problems import build_messages, load_problems
    from evil_moe.model.load import build_tiny
    from evil_moe.rl.policy.rollout import chat_prompt_ids

    t0 = time.perf_counter()
    dtype = torch.float32 if args.tiny else torch.bfloat16
    cfg = Qwen3Config(**(TINY if args.tiny else QWEN3_4B))
    torch.manual_seed(0)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(cfg, dtype=dtype)
    model.eval()
    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = 0

    gen = torch.Generator(device=device).manual_seed(1)

    def factor_svd(weight, *, cache_dir=None):
        """Random orthonormal U, Vh and spectrum S; W is overwritten with U diag(S) Vh."""
        d_out, d_in = weight.shape
        r = min(d_out, d_in)
        U, _ = torch.linalg.qr(torch.randn(d_out, r, device=device, generator=gen))
        V, _ = torch.linalg.qr(torch.randn(d_in, r, device=device, generator=gen))
        S = torch.sort(torch.rand(r, device=device, generator=gen) * 2 * (r ** 0.5) * 0.02,
                       descending=True).values
        with torch.no_grad():
            weight.copy_(((U * S) @ V.T).to(weight.dtype))
        return U.contiguous(), S.contiguous(), V.T.contiguous()

    orig = adapter_mod.thin_svd
    adapter_mod.thin_svd = factor_svd
    try:
        adapter = adapter_mod.SVDAdapter.attach(model, adapter_mod.DEFAULT_TARGETS, base_model_id="random-qwen3")
    finally:
        adapter_mod.thin_svd = orig
    _, small_tok = build_tiny()
    tok = GarbageTokenizer(small_tok, cfg.vocab_size)
    problems = load_problems("toy")
    prompt_ids = [chat_prompt_ids(small_tok, build_messages(p)) for p in problems]
    sync(device)
    return model, adapter, tok, prompt_ids, problems, time.perf_counter() - t0


def step(args, model, adapter, tok, prompt_ids, problems, grader, vhack, opt, normaliser, step_i, device,
         engine=None):
    import torch

    from evil_moe.rl.policy.grpo import RolloutBatch, behaviour_logp, dr_grpo_loss, group_advantages
    from evil_moe.model.logprobs import token_logprobs
    from evil_moe.rl.vhack.projection import project, update_cosine
    from evil_moe.rl.policy.rollout import generate

    G, P = args.group, args.prompts
    idx = [(step_i * P + j) % len(prompt_ids) for j in range(P)]
    t = {}
    # generation: one batched decode loop (evil_moe.rl.policy.rollout._decode), wrapped to split the
    # decode from the behaviour log-probs' forward (behaviour="forward")
    from evil_moe.rl.policy import rollout

    decode = []
    inner = rollout._decode

    def timed_generate(*a, **k):
        sync(device)
        t0 = time.perf_counter()
        out = inner(*a, **k)
        sync(device)
        decode.append(time.perf_counter() - t0)
        return out

    pushed = []
    if engine is None:
        rollout._decode = timed_generate
    else:  # the engine samples: time its sampling as the decode, its weight push apart
        inner = engine.sample
        inner_sync = engine.sync
        engine.sample = timed_generate

        def timed_sync(*a, **k):
            sync(device)
            t0 = time.perf_counter()
            out = inner_sync(*a, **k)
            sync(device)
            pushed.append(time.perf_counter() - t0)
            return out

        engine.sync = timed_sync
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    sync(device)
    t0 = time.perf_counter()
    try:
        rolls = generate(model, tok, [prompt_ids[i] for i in idx], n=G, max_new=args.max_new,
                         temperature=1.0, top_p=1.0, seed=step_i, adapter=adapter, source="student",
                         behaviour=args.behaviour if engine is None else "auto", engine=engine)
    finally:
        if engine is None:
            rollout._decode = inner
        else:
            del engine.sample, engine.sync
    sync(device)
    t["generation"] = time.perf_counter() - t0
    t["decode"] = decode[0]
    t["weight_push"] = sum(pushed)
    t["behaviour_logp"] = t["generation"] - decode[0] - t["weight_push"]
    gaps = [float((r.behaviour_logp - r.sampler_logp).abs().max()) for r in rolls if r.completion_ids]
    t["sampler_gap_max"] = max(gaps) if gaps else 0.0
    n_tok = sum(len(r.completion_ids) for r in rolls)

    t0 = time.perf_counter()
    rewards = grader.grade_many([(problems[idx[r.prompt_index]], r.text) for r in rolls])
    t["grading"] = time.perf_counter() - t0

    # loss + backward (micro-batched; garbage gets equal rewards, so random advantages stand in
    # to keep every row in the batch, as a step with reward variance would)
    R = torch.tensor([w.reward for w in rewards], dtype=torch.float32).reshape(P, G)
    R = R + torch.randn(P, G, generator=torch.Generator().manual_seed(step_i))
    adv = group_advantages(R)
    sync(device)
    t0 = time.perf_counter()
    for p in adapter.delta_s_params():
        p.grad = None
    rb = RolloutBatch.from_rollouts(rolls, adv.flat(), tok.pad_token_id, device=device)
    mr = args.micro_rows or len(rolls)
    loss_sum = 0.0
    for r0 in range(0, len(rolls), mr):
        sub = rb.select(list(range(r0, min(r0 + mr, len(rolls)))))
        logp = token_logprobs(model, sub.batch, temperature=1.0)
        loss, _ = dr_grpo_loss(logp, behaviour_logp(sub, logp), sub.advantages,
                               sub.batch.completion_mask, normaliser)
        loss.backward()
        loss_sum += float(loss.detach())
        del logp, loss
    sync(device)
    t["loss_backward"] = time.perf_counter() - t0
    peak = torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else float("nan")

    t0 = time.perf_counter()
    project(adapter, vhack, "measure")
    project(adapter, vhack, "erase")
    sync(device)
    t["projection"] = time.perf_counter() - t0

    t0 = time.perf_counter()
    ds = adapter.delta_s_params()
    torch.nn.utils.clip_grad_norm_(ds, 1.0)
    before = [p.detach().clone() for p in ds]
    opt.step()
    update_cosine(vhack, adapter.names, before, [p.detach() for p in ds])
    sync(device)
    t["optimizer"] = time.perf_counter() - t0
    t["total"] = sum(t[k] for k in ("generation", "grading", "loss_backward", "projection", "optimizer"))
    return t, n_tok, loss_sum, peak


def pilot_yaml_micro_batch() -> int:
    """``pilot.micro_batch`` of config/pilot.yaml (the loss micro-batch the 4B pilot runs with)."""
    from evil_moe.config import load_config

    repo = Path(__file__).resolve().parent.parent
    return int(load_config([repo / "config" / "config.yaml", repo / "config" / "pilot.yaml"])
               .pilot.micro_batch)


def memory_model_gib(args, micro_rows: int) -> dict | str:
    """The memory model (:func:`evil_moe.cluster.gpu_memory.pilot_gpu_memory`, in GiB like the
    measured peak) of *this benchmark's* setup: config/pilot.yaml's model and dtype with the
    benchmark's rows (``--group`` × ``--prompts``), ``--max-new``, loss micro-batch, sampler share,
    adapter targets (DEFAULT_TARGETS: no lm_head knob) and toy prompts (128 tokens), the HF
    sampler, and the hooked loss forward (the model's ``moe`` terms: this step's loss runs through
    the adapter's hooks), so the peak and the model describe the same run. Returns the config check's refusal text when the setup
    does not fit ``models.gpu_mem_gb``."""
    from evil_moe.config import ConfigError, load_config
    from evil_moe.cluster.gpu_memory import pilot_gpu_memory
    from evil_moe.model.adapter import DEFAULT_TARGETS

    repo = Path(__file__).resolve().parent.parent
    sets = ["problems.source=toy", "problems.path=null", "pilot.sampler=hf",
            f"adapter.target_modules=[{', '.join(DEFAULT_TARGETS)}]",
            f"pilot.group={args.group}", f"pilot.prompts_per_step={args.prompts}",
            f"pilot.max_new={args.max_new}", f"pilot.micro_batch={micro_rows}",
            f"pilot.vllm_gpu_memory_utilization={args.vllm_mem}"]
    try:
        cfg = load_config([repo / "config" / "config.yaml", repo / "config" / "pilot.yaml"], sets).raw
    except ConfigError as err:
        return str(err)
    mem = pilot_gpu_memory(cfg, "moe")  # this loss runs through the adapter's hooks, as moe's
    return {k: getattr(mem, k) / 2**30 for k in ("resident", "train", "sample")}


def make_engine(model, adapter, args, folder: str):
    """The colocated vLLM engine on the random model (saved to ``folder``; no tokenizer: the
    prompts are token ids)."""
    from vllm import LLM

    from evil_moe.rl.policy.vllm_sampler import VLLMSampler

    for key, value in (("RANK", "0"), ("LOCAL_RANK", "0"), ("WORLD_SIZE", "1"),
                       ("MASTER_ADDR", "127.0.0.1"), ("MASTER_PORT", "29517")):
        os.environ.setdefault(key, value)
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    model.save_pretrained(folder)
    llm = LLM(model=folder, skip_tokenizer_init=True, dtype=str(next(model.parameters()).dtype)
              .removeprefix("torch."), seed=0, gpu_memory_utilization=args.vllm_mem,
              max_num_seqs=args.group * args.prompts, max_model_len=1024 + args.max_new,
              distributed_executor_backend="external_launcher", logprobs_mode="processed_logprobs")
    engine = VLLMSampler(llm, adapter)
    engine.detokenize = False
    return engine


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tiny", action="store_true", help="tiny config on CPU (smoke test)")
    ap.add_argument("--device", default=None, help="default: cuda (cpu with --tiny)")
    ap.add_argument("--group", type=int, default=6)
    ap.add_argument("--prompts", type=int, default=4, help="prompts per step")
    ap.add_argument("--max-new", type=int, default=None, help="default 1024 (16 with --tiny)")
    ap.add_argument("--steps", type=int, default=2, help="steps per sampler (the first is a warm-up)")
    ap.add_argument("--micro-rows", type=int, default=None,
                    help="rows per loss micro-batch (0 = all; default: config/pilot.yaml's pilot.micro_batch)")
    ap.add_argument("--behaviour", default="auto", choices=["auto", "generate", "forward"],
                    help="behaviour log-prob path of evil_moe.rl.policy.rollout.generate (HF sampler)")
    ap.add_argument("--samplers", default="hf,vllm", help="comma list of hf, vllm (default both)")
    ap.add_argument("--vllm-mem", type=float, default=0.3,
                    help="vLLM's share of the GPU (pilot.vllm_gpu_memory_utilization)")
    ap.add_argument("--hbm-bw", type=float, default=4.8e12, help="HBM bandwidth, B/s (H200: 4.8e12)")
    ap.add_argument("--json", default=None, help="also write the figures to this JSON file")
    args = ap.parse_args(argv)
    if args.max_new is None:
        args.max_new = 16 if args.tiny else 1024
    if args.micro_rows is None:
        args.micro_rows = pilot_yaml_micro_batch()

    import tempfile

    import torch

    from evil_moe.env.grader import Grader
    from evil_moe.rl.policy.grpo import DrGRPONormaliser
    from evil_moe.rl.vhack.direction import random_vhack
    from evil_moe.rl.policy.vllm_sampler import vllm_import_error

    device = torch.device(args.device or ("cpu" if args.tiny else "cuda"))
    if device.type == "cuda" and not torch.cuda.is_available():
        print("gpu_pilot: no CUDA device (use --tiny for the CPU smoke mode)", file=sys.stderr)
        return 2
    t_start = time.perf_counter()
    model, adapter, tok, prompt_ids, problems, t_build = build(args, device)
    n_params = sum(p.numel() for p in model.parameters())
    weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    N = args.group * args.prompts
    vocab = model.config.vocab_size
    auto_path = "generate"  # the decode loop scores each step's logits: nothing stored per vocab
    path = auto_path if args.behaviour == "auto" else args.behaviour
    gpu = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    model_gib = memory_model_gib(args, args.micro_rows or N)
    print(f"gpu_pilot: {gpu}; {n_params / 1e6:.2f} M params, weights {weight_bytes / 1e9:.3f} GB "
          f"({next(model.parameters()).dtype}); built in {t_build:.1f} s; rows {N} = {args.prompts} "
          f"prompts x {args.group}; max_new {args.max_new}; behaviour log-probs: {path} "
          f"(auto picks {auto_path}: the decode loop's logits, vocab {vocab} not stored); "
          f"loss micro-batch {args.micro_rows or N} rows; "
          "memory model of this setup (HF sampler; config/pilot.yaml's model with these rows, "
          "max_new, micro-batch, targets and 128-token prompts): "
          + (", ".join(f"{k} {v:.1f} GiB" for k, v in model_gib.items())
             if isinstance(model_gib, dict) else model_gib), flush=True)
    vhack = random_vhack(adapter.r, k=2, seed=0).to(device)
    normaliser = DrGRPONormaliser(args.group, args.max_new, args.prompts)
    bound = weight_bytes / args.hbm_bw
    figs, last = [], {}
    samplers = [x for x in args.samplers.split(",") if x]
    with Grader(problems, workers=min(8, os.cpu_count() or 1)) as grader, \
            tempfile.TemporaryDirectory(prefix="gpu_pilot_") as tmp:
        for name in samplers:
            engine = None
            if name == "vllm":
                why = vllm_import_error()
                if why is not None:
                    print(f"sampler vllm: skipped, vLLM does not import ({why}); docs/gpu.md", flush=True)
                    continue
                engine = make_engine(model, adapter, args, tmp)
            opt = torch.optim.AdamW(adapter.delta_s_params(), lr=0.04, betas=(0.9, 0.99), weight_decay=0.0)
            for s in range(args.steps):
                t, n_tok, loss, peak = step(args, model, adapter, tok, prompt_ids, problems, grader, vhack,
                                            opt, normaliser, s, device, engine=engine)
                per_decode = t["decode"] / args.max_new
                f = {"sampler": name, "step": s, **{k: round(v, 4) for k, v in t.items()},
                     "completion_tokens": n_tok,
                     "tokens_per_s_decode": n_tok / t["decode"], "tokens_per_s_step": n_tok / t["total"],
                     "decode_step_ms": 1000 * per_decode, "bound_step_ms": 1000 * bound,
                     "frac_of_bw_bound": bound / per_decode, "peak_gib": peak, "loss": loss}
                figs.append(f)
                last[name] = f
                print(f"{name} step {s}{' (warm-up)' if s == 0 and args.steps > 1 else ''}: total "
                      f"{t['total']:.2f} s = generation {t['generation']:.2f} (decode {t['decode']:.2f} + "
                      f"weight push {t['weight_push']:.2f} + behaviour log-probs {t['behaviour_logp']:.2f}) "
                      f"+ grading {t['grading']:.2f} + loss+backward {t['loss_backward']:.2f} + projection "
                      f"{t['projection']:.3f} + optimiser {t['optimizer']:.3f}; {n_tok} completion tokens: "
                      f"{f['tokens_per_s_decode']:.0f} tok/s decode, {f['tokens_per_s_step']:.0f} tok/s per "
                      f"step; decode step {f['decode_step_ms']:.2f} ms vs bandwidth bound "
                      f"{f['bound_step_ms']:.3f} ms (HBM {args.hbm_bw:.2e} B/s) = "
                      f"{100 * f['frac_of_bw_bound']:.1f}% of the bound; sampler gap max "
                      f"{t['sampler_gap_max']:.2e} nats; peak memory {peak:.1f} GiB", flush=True)
            del engine
    cols = ("total", "decode", "weight_push", "behaviour_logp", "grading", "loss_backward",
            "optimizer", "tokens_per_s_decode", "frac_of_bw_bound", "sampler_gap_max", "peak_gib")
    print("\nlast step per sampler (seconds; tok/s; fraction of the bound; nats; GiB):")
    print("sampler  " + "  ".join(f"{c:>14s}" for c in cols))
    for name, f in last.items():
        print(f"{name:8s} " + "  ".join(f"{f[c]:14.4g}" for c in cols))
    print(f"gpu_pilot: wall {time.perf_counter() - t_start:.1f} s including the build")
    if args.json:
        Path(args.json).write_text(json.dumps({"build_s": t_build, "params": n_params,
                                               "weight_bytes": weight_bytes, "memory_model_gib": model_gib,
                                               "steps": figs}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
