"""The device check: a real pilot step of every arm family on a Qwen3-4B-architecture student on
one GPU (random weights, bf16, the HF sampler), in at most ten minutes.

The model is built from the Qwen3-4B config values (hidden 2560, 36 layers, MLP 9728, 32 heads,
8 KV heads, head_dim 128, vocab 151936, tied embeddings) with random weights in bf16 — nothing
is downloaded. Each targeted Linear's weight is *constructed from* random orthonormal factors,
``W = U diag(S) Vh``, and the SVD adapter receives those exact factors (a 4B-parameter SVD would
take minutes and measure nothing of the step). config/pilot.yaml's adapter targets (the tied
``lm_head`` among them), rows (6 x 4), ``max_new`` (1024), loss micro-batch and thread count are
used; the prompts are the toy bank's (128 tokens). Random weights produce garbage: the eos id
is drawn with probability ~1/vocab per token, so (nearly) every row decodes ``max_new`` tokens,
the worst case the memory model plans for, and every reward is equal: the check spreads each
group's rewards by 0.01 per row, so that every row has an advantage and a gradient (a step with
reward variance, as a learning pilot's).

Each arm family takes one step of :meth:`evil_moe.rl.trainer.trainer.Trainer.train_step`, the code a
pilot runs (sample with the decode loop, grade in the sandbox, the Dr.GRPO loss and its
gradients through the merged weights, the arm's flags and routing, AdamW), from δS = 0:

* ``vanilla``; ``route`` with the gradient detector (per-row gradients, v_hack a random k = 2
  direction per module, the top share flagged: ``pilot.detector_calibration: budget``);
* ``filter`` with the probe (pooled hidden states of every row, a random logistic probe);
* ``moe`` (the router's pin bank forward, the hooked mixture forward, the router's step).

Per arm it prints the seconds of each phase (as ``steps.tsv``'s ``seconds_*``), the decode step
against the HBM bandwidth bound (``weight bytes / bandwidth``), the peak GPU memory
(``torch.cuda.max_memory_allocated``) beside the memory model of the same setup
(:func:`evil_moe.cluster.gpu_memory.pilot_gpu_memory` of the arm: its training and sampling
phases), and the behaviour/score log-prob gap (``sampler_gap_p95`` / ``_max``: the decode loop's
log-prob of each sampled token against the training forward's); then one table of all four and
the wall time against the ten-minute budget. ``--vllm`` adds vanilla's step with the colocated
vLLM engine where vLLM imports (never on the device image).

    python benchmarks/gpu_pilot.py --json gpu_pilot.json     # the device check (docs/gpu.md)
    python benchmarks/gpu_pilot.py --tiny                     # tiny config on the CPU (tests)
    python benchmarks/gpu_pilot.py --hbm-bw 4.8e12            # e.g. an H200 (default H100 SXM)

It needs torch, transformers and this package's light dependencies, not vLLM and no network
(docs/gpu.md: what travels to a device image).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

REPO = Path(__file__).resolve().parent.parent
QWEN3_4B = dict(hidden_size=2560, num_hidden_layers=36, intermediate_size=9728,
                num_attention_heads=32, num_key_value_heads=8, head_dim=128, vocab_size=151936,
                tie_word_embeddings=True, max_position_embeddings=40960, rope_theta=1000000.0,
                rms_norm_eps=1e-6, hidden_act="silu", attention_bias=False)
TINY = dict(hidden_size=64, num_hidden_layers=2, intermediate_size=128, num_attention_heads=4,
            num_key_value_heads=2, head_dim=16, vocab_size=512, tie_word_embeddings=True,
            max_position_embeddings=2048, rope_theta=1000000.0, rms_norm_eps=1e-6,
            hidden_act="silu", attention_bias=False)
ARM_FAMILIES = ("vanilla", "route", "filter", "moe")
BUDGET_S = 600
PHASES = ("sample", "grade", "loss", "arm", "optimiser")


class GarbageTokenizer:
    """The tiny test tokenizer for prompts and texts (chat template, encode; its eos ends the
    router's pin-bank completions); any generated id decodes (modulo its vocabulary). The random
    model draws that eos with probability ~1/vocab per token: nearly every row runs to max_new."""

    def __init__(self, tok, vocab_size: int):
        self.tok = tok
        self.pad_token_id = 0
        self.eos_token_id = tok.eos_token_id
        self._n, self._vocab = len(tok), vocab_size

    def __len__(self):
        return self._vocab

    def apply_chat_template(self, *args, **kwargs):
        return self.tok.apply_chat_template(*args, **kwargs)

    def encode(self, text, add_special_tokens=True):
        return self.tok.encode(text, add_special_tokens=add_special_tokens)

    def decode(self, ids, skip_special_tokens=True):
        return self.tok.decode([int(i) % self._n for i in ids], skip_special_tokens=skip_special_tokens)


def sync(device):
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)


def check_config(args, device) -> "object":
    """config/pilot.yaml with the check's setup: the toy bank's problems, the HF sampler, the
    rows, max_new and micro-batch given, budget-calibrated detectors (no calibration runs), no
    stop on truncation (every garbage row runs to max_new), the device."""
    from evil_moe.config import load_config

    sets = ["problems.source=toy", "problems.path=null", "problems.heldout_frac=0",
            "pilot.sampler=hf", "pilot.detector_calibration=budget",
            "pilot.max_truncated_first_step=null", f"pilot.group={args.group}",
            f"pilot.prompts_per_step={args.prompts}", f"pilot.max_new={args.max_new}",
            f"models.device={device.type}", f"models.dtype={'float32' if args.tiny else 'bfloat16'}"]
    if args.micro_rows is not None:
        sets.append(f"pilot.micro_batch={args.micro_rows}")
    if args.tiny:
        sets += ["pilot.threads=1"]
    return load_config([REPO / "config" / "config.yaml", REPO / "config" / "pilot.yaml"], sets)


def build(args, device, targets):
    """(model, adapter, garbage tokenizer, problems, seconds)."""
    import torch
    from transformers import AutoModelForCausalLM, Qwen3Config

    import evil_moe.model.adapter as adapter_mod
    from evil_moe.env.problems import load_problems
    from evil_moe.model.load import build_tiny

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
        adapter = adapter_mod.SVDAdapter.attach(model, targets, base_model_id="random-qwen3")
    finally:
        adapter_mod.thin_svd = orig
    _, small_tok = build_tiny()
    sync(device)
    return model, adapter, GarbageTokenizer(small_tok, cfg.vocab_size), load_problems("toy"), \
        time.perf_counter() - t0


def arm_step(arm: str, cfg, model, adapter, tok, problems, grader, device, engine=None) -> dict:
    """One :meth:`~evil_moe.rl.trainer.trainer.Trainer.train_step` of ``arm`` from δS = δS_hack = 0:
    its ``steps.tsv`` row and the step's peak GPU memory (GiB; NaN on a CPU)."""
    import numpy as np
    import torch

    from evil_moe.config import Config
    from evil_moe.rl.detectors.probe import Probe
    from evil_moe.rl.trainer.trainer import Trainer
    from evil_moe.rl.vhack.direction import random_vhack

    raw = cfg.to_dict()
    raw["pilot"]["detector"] = "probe" if arm == "filter" else "gradient"
    cfg = Config(raw)
    with torch.no_grad():
        for p in adapter.delta_s_params() + adapter.delta_s_hack_params():
            p.zero_()
    vhack = random_vhack(adapter.r, k=2, seed=0).to(device)
    d = model.get_output_embeddings().in_features
    rng = np.random.default_rng(0)
    probe = Probe(mean=np.zeros(d), scale=np.ones(d), coef=rng.normal(size=d) / d ** 0.5,
                  intercept=0.0)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    t = Trainer(cfg, arm=arm, seed=0, model=model, tok=tok, adapter=adapter, device=device,
                train=problems, vhack=vhack, proj_v=vhack, grader=grader,
                fitted=probe if arm == "filter" else None)
    t.engine = engine
    advantages = t.advantages  # garbage earns one reward: spread it so every row has a gradient
    t.advantages = lambda R: advantages(R + 0.01 * torch.arange(R.numel()).reshape(R.shape))
    sync(device)
    t0 = time.perf_counter()
    row, _ = t.train_step(0)
    sync(device)
    row["seconds_wall"] = time.perf_counter() - t0
    row["peak_gib"] = torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" \
        else float("nan")
    return row


def memory_model_gib(cfg, arm: str, tiny: bool = False) -> dict | None:
    """:func:`evil_moe.cluster.gpu_memory.pilot_gpu_memory` of ``arm`` under the check's config
    (Qwen3-4B's shape, its rows, max_new, micro-batch, targets, 128-token toy prompts), in GiB
    like the measured peak: ``train``, ``sample`` and ``peak``; None for the tiny model."""
    from evil_moe.cluster.gpu_memory import pilot_gpu_memory

    if tiny:
        return None
    raw = cfg.to_dict()
    raw["models"]["device"] = "cuda"
    mem = pilot_gpu_memory(raw, arm)
    return {"train": mem.train / 2**30, "sample": mem.sample / 2**30, "peak": mem.peak / 2**30}


def make_engine(model, adapter, cfg, folder: str):
    """The colocated vLLM engine on the random model (saved to ``folder``; no tokenizer: the
    prompts are token ids), as :meth:`evil_moe.rl.policy.vllm_sampler.VLLMSampler.from_config` builds it."""
    from vllm import LLM

    from evil_moe.rl.policy.vllm_sampler import VLLMSampler, colocated_env

    pc = cfg.pilot
    colocated_env(compile_threads=pc.threads)
    model.save_pretrained(folder)
    llm = LLM(model=folder, skip_tokenizer_init=True, dtype=cfg.models.dtype, seed=0,
              gpu_memory_utilization=float(pc.vllm_gpu_memory_utilization),
              max_num_seqs=pc.group * pc.prompts_per_step, max_model_len=1024 + pc.max_new,
              distributed_executor_backend="external_launcher", logprobs_mode="processed_logprobs")
    engine = VLLMSampler(llm, adapter)
    engine.detokenize = False
    return engine


def _line(name: str, row: dict, model_gib: dict | None, decode_ms: float, bound_ms: float) -> str:
    phases = " + ".join(f"{k} {row.get(f'seconds_{k}', 0.0):.2f}" for k in PHASES)
    gap = lambda k: "n/a" if row.get(k) is None else f"{row[k]:.2e}"  # noqa: E731
    model = "n/a (tiny model)" if model_gib is None else (
        f"{model_gib['peak']:.1f} GiB (train {model_gib['train']:.1f}, sample {model_gib['sample']:.1f})")
    return (f"{name}: step {row['seconds_wall']:.1f} s = {phases}; decode {decode_ms:.1f} ms/token "
            f"vs bandwidth bound {bound_ms:.2f} ms; peak {row['peak_gib']:.1f} GiB vs memory model "
            f"{model}; behaviour/score gap p95 {gap('sampler_gap_p95')} max "
            f"{gap('sampler_gap_max')} nats; loss {row['loss']:.3g}, flag rate "
            f"{'-' if row.get('flag_rate') is None else round(row['flag_rate'], 3)}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tiny", action="store_true", help="tiny config on the CPU (smoke test)")
    ap.add_argument("--device", default=None, help="default: cuda (cpu with --tiny)")
    ap.add_argument("--group", type=int, default=6)
    ap.add_argument("--prompts", type=int, default=4, help="prompts per step")
    ap.add_argument("--max-new", type=int, default=None, help="default 1024 (8 with --tiny)")
    ap.add_argument("--micro-rows", type=int, default=None,
                    help="rows per loss micro-batch (default: config/pilot.yaml's pilot.micro_batch)")
    ap.add_argument("--arms", default=",".join(ARM_FAMILIES), help="comma list of arm families")
    ap.add_argument("--vllm", action="store_true", help="also vanilla's step with the vLLM engine")
    ap.add_argument("--hbm-bw", type=float, default=3.35e12, help="HBM bandwidth, B/s (H100 SXM)")
    ap.add_argument("--json", default=None, help="also write the figures to this JSON file")
    args = ap.parse_args(argv)
    if args.max_new is None:
        args.max_new = 8 if args.tiny else 1024

    import tempfile

    import torch

    from evil_moe.rl.policy.vllm_sampler import vllm_import_error
    from evil_moe.stages.common import make_grader, set_threads

    device = torch.device(args.device or ("cpu" if args.tiny else "cuda"))
    if device.type == "cuda" and not torch.cuda.is_available():
        print("gpu_pilot: no CUDA device (use --tiny for the CPU smoke mode)", file=sys.stderr)
        return 2
    t_start = time.perf_counter()
    cfg = check_config(args, device)
    set_threads(cfg.pilot.threads)
    model, adapter, tok, problems, t_build = build(args, device, list(cfg.adapter.target_modules))
    weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    bound_ms = 1000 * weight_bytes / args.hbm_bw
    gpu = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    print(f"gpu_pilot: {gpu}; torch {torch.__version__}; {weight_bytes / 1e9:.2f} GB of weights "
          f"({next(model.parameters()).dtype}), built in {t_build:.1f} s; rows "
          f"{cfg.pilot.group * cfg.pilot.prompts_per_step} = {cfg.pilot.prompts_per_step} prompts x "
          f"{cfg.pilot.group}; max_new {cfg.pilot.max_new}; loss micro-batch "
          f"{cfg.pilot.micro_batch or 'all'} rows; adapter on {', '.join(cfg.adapter.target_modules)}; "
          f"HF sampler; budget {BUDGET_S} s", flush=True)
    runs = [(arm, arm) for arm in args.arms.split(",") if arm]
    results = {}
    with make_grader(problems, cfg) as grader, tempfile.TemporaryDirectory(prefix="gpu_pilot_") as tmp:
        if args.vllm:
            why = vllm_import_error()
            if why is None:
                runs.append(("vanilla+vllm", "vanilla"))
            else:
                print(f"vllm: skipped, vLLM does not import ({why})", flush=True)
        for name, arm in runs:
            engine = make_engine(model, adapter, cfg, tmp) if name.endswith("+vllm") else None
            row = arm_step(arm, cfg, model, adapter, tok, problems, grader, device, engine)
            model_gib = memory_model_gib(cfg, arm, args.tiny)
            decode_ms = 1000 * row.get("seconds_sample", 0.0) / cfg.pilot.max_new
            results[name] = {"row": row, "memory_model_gib": model_gib, "decode_ms": decode_ms,
                             "bound_ms": bound_ms}
            print(_line(name, row, model_gib, decode_ms, bound_ms), flush=True)
            del engine
    cols = ("wall", *PHASES)
    print("\narm           " + "  ".join(f"{c:>9s}" for c in cols)
          + "   peak GiB  model GiB  gap p95   gap max")
    for name, r in results.items():
        row = r["row"]
        secs = [row["seconds_wall"]] + [row.get(f"seconds_{k}", 0.0) for k in PHASES]
        gaps = [row.get("sampler_gap_p95"), row.get("sampler_gap_max")]
        print(f"{name:13s} " + "  ".join(f"{x:9.2f}" for x in secs)
              + f"  {row['peak_gib']:9.1f}  {(r['memory_model_gib'] or {}).get('peak', float('nan')):9.1f}  "
              + "  ".join("     n/a" if g is None else f"{g:8.1e}" for g in gaps))
    wall = time.perf_counter() - t_start
    print(f"gpu_pilot: wall {wall:.1f} s including the build "
          f"({'within' if wall <= BUDGET_S else 'OVER'} the {BUDGET_S} s budget)")
    if args.json:
        Path(args.json).write_text(json.dumps({"build_s": t_build, "wall_s": wall, "device": gpu,
                                               "torch": torch.__version__, "weight_bytes": weight_bytes,
                                               "arms": results}, indent=1, default=float))
    return 0


if __name__ == "__main__":
    sys.exit(main())
