"""Benchmark: the memory of one pilot loss micro-batch per arm, measured against the memory model.

The GPU memory model (:func:`evil_moe.cluster.gpu_memory.train_terms`) costs the training phase
per arm: Evil MoE's arms (``moe``, ``moe_random``) train through the adapter's hooks under the
router's mixture, every other arm with the knobs merged and the wrapped Linears' inputs and
outputs recorded. No GPU has run this project yet, so its CPU analogue is measured here: for each
arm, in a fresh Python process, a random Qwen3-architecture model with the SVD adapter on every
Linear (the tied ``lm_head`` included; knobs non-zero, so every weight is merged) runs one
micro-batch of the pilot's loss as the trainer does (``vanilla``: ``merged_gradients`` and the
loss's gradient; ``route``: the same with per-row gradients; ``moe``: the router's pooled
activations without gradient, ``w``, the loss under ``mixture(w)`` and the gradient of δS, δS_hack
and the router), and the process's peak resident memory during it is read from the kernel
(``/proc/self/clear_refs`` resets ``VmHWM`` after the model is built; the peak minus the resident
memory before the step). Printed per arm: measured MB, the model's ``train - resident`` (the sum of
``train_terms``) and their ratio.

On a CPU the whole step runs in host memory, so the model's terms (activations, logits, the
copies of the U and Vh buffers or of the merged weights) all land in the RSS; the allocator's
caching and freed-but-not-returned pages make the measurement noisy by a few percent.

    .venv/bin/python benchmarks/train_memory.py [--rows 2] [--max-new 256] [--dtype float32] [--json F]
    .venv/bin/python benchmarks/train_memory.py --quick      # smoke mode (tests)
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
ARMS = ("vanilla", "route", "moe")
# hidden, layers, intermediate, heads, kv heads, head_dim, vocabulary (Qwen3-4B's ratios, smaller)
SHAPE = (512, 6, 1536, 8, 2, 64, 16384)
QUICK_SHAPE = (64, 2, 192, 2, 1, 32, 500)
# glibc's malloc serves every block of 128 KiB or more with its own mmap and unmaps it on free
# (a fixed threshold also stops the threshold from growing after frees), so the resident memory
# follows the live tensors instead of the heap's high-water mark: the peak RSS is then close to
# the peak of live tensor bytes, what a caching GPU allocator's max_memory_allocated reports.
CHILD_ENV = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "131072", "MALLOC_TRIM_THRESHOLD_": "131072"}
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj", "lm_head"]


def model_config(shape, rows: int, max_new: int, folder: Path, dtype: str):
    """The config the memory model sizes: a local student folder with the shape's config.json,
    ``dtype``, the toy's 128-token prompts, ``rows`` rows per micro-batch of ``max_new`` tokens."""
    from evil_moe.config import load_config

    h, layers, inter, heads, kv, hd, vocab = shape
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps({
        "hidden_size": h, "num_hidden_layers": layers, "intermediate_size": inter,
        "num_attention_heads": heads, "num_key_value_heads": kv, "head_dim": hd,
        "vocab_size": vocab, "tie_word_embeddings": True}))
    return load_config([REPO / "config" / "config.yaml"], [
        "models.build=none", f"models.student={folder}", "models.params=1", f"models.dtype={dtype}",
        f"adapter.target_modules=[{', '.join(TARGETS)}]", "problems.source=toy",
        f"pilot.group={rows}", "pilot.prompts_per_step=1", f"pilot.max_new={max_new}",
        f"pilot.micro_batch={rows}"]).raw


def _rss_kb(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"no {field} in /proc/self/status")


def child(arm: str, shape, rows: int, max_new: int, prompt: int, dtype: str) -> dict:
    """One arm's micro-batch in this (fresh) process; returns the measured peak above the
    resident memory before the step (bytes)."""
    import gc

    import torch

    from evil_moe.model.adapter import SVDAdapter
    from evil_moe.model.load import build_toy_model
    from evil_moe.model.logprobs import build_batch, token_logprobs
    from evil_moe.rl.detectors.router import Router, pooled_hidden, random_direction

    class Tok:
        eos_token_id, pad_token_id, bos_token_id = 2, 0, None

        def __len__(self):
            return shape[6]

    torch.manual_seed(0)
    torch.set_num_threads(1)
    h, layers, inter, heads, kv, hd, vocab = shape
    model = build_toy_model(Tok(), hidden=h, layers=layers, intermediate=inter, heads=heads,
                            kv_heads=kv, head_dim=hd, dtype=getattr(torch, dtype))
    adapter = SVDAdapter.attach(model, TARGETS)
    with torch.no_grad():
        for p in adapter.delta_s_params():
            p.fill_(0.01)
    gen = torch.Generator().manual_seed(1)
    batch = build_batch([torch.randint(3, vocab, (prompt,), generator=gen).tolist()] * rows,
                        [torch.randint(3, vocab, (max_new,), generator=gen).tolist()] * rows, 0)
    adv = torch.linspace(-1, 1, rows)[:, None]
    ds, dsh = adapter.delta_s_params(), adapter.delta_s_hack_params()
    router = Router(random_direction(h, 0), 4.0, 0.0) if arm == "moe" else None
    gc.collect()
    Path("/proc/self/clear_refs").write_text("5")  # VmHWM := VmRSS
    before = _rss_kb("VmRSS")
    if router is not None:  # RouterStep.gradients (evil_moe/rl/trainer/router_step.py)
        for p in dsh:
            p.requires_grad_(True)
        hid = pooled_hidden(model, batch)
        w = router(hid)
        with adapter.mixture(w):
            logp = token_logprobs(model, batch)
        loss = -(logp * adv).sum() / 1000
        torch.autograd.grad(loss, ds + dsh + list(router.parameters()), allow_unused=True)
    else:  # GradientStep (evil_moe/rl/trainer/gradient_step.py): merged forward, gradients from the capture
        with adapter.merged_gradients(rows=rows if arm == "route" else None) as cap:
            logp = token_logprobs(model, batch)
            loss = -(logp * adv).sum() / 1000
            cap.grads(loss)
    peak = _rss_kb("VmHWM")
    return {"arm": arm, "measured": (peak - before) * 1024.0}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=2, help="rows per micro-batch")
    ap.add_argument("--max-new", type=int, default=256, help="completion tokens per row")
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    ap.add_argument("--quick", action="store_true", help="smoke mode: a tiny shape")
    ap.add_argument("--json", help="write the figures here")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    shape = QUICK_SHAPE if args.quick else SHAPE
    max_new = 16 if args.quick else args.max_new
    if args.child:
        print(json.dumps(child(args.child, shape, args.rows, max_new, 128, args.dtype)))
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        return report(args, shape, max_new, model_config(shape, args.rows, max_new,
                                                         Path(tmp) / "student", args.dtype))


def report(args, shape, max_new: int, cfg) -> int:
    """Run each arm's child, print measured against modelled (the student folder must exist)."""
    from evil_moe.cluster.gpu_memory import train_terms

    print(f"train_memory: shape (hidden, layers, intermediate, heads, kv heads, head_dim, vocab) "
          f"{shape}, {args.dtype}, {args.rows} rows of 128 + {max_new} tokens; load "
          f"{os.getloadavg()[0]:.2f}", flush=True)
    out = []
    for arm in ARMS:
        cmd = [sys.executable, __file__, "--child", arm, "--rows", str(args.rows),
               "--max-new", str(args.max_new), "--dtype", args.dtype] + (["--quick"] if args.quick else [])
        res = json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True,
                                        cwd=REPO, env=CHILD_ENV).stdout.strip().splitlines()[-1])
        terms = train_terms(cfg, arm)
        res.update(model=sum(terms.values()), terms=terms)
        res["ratio"] = res["model"] / res["measured"]
        out.append(res)
        print(f"{arm:8s} measured {res['measured'] / 2**20:8.1f} MiB  model "
              f"{res['model'] / 2**20:8.1f} MiB  model/measured {res['ratio']:.3f}  ("
              + ", ".join(f"{k} {v / 2**20:.1f}" for k, v in terms.items()) + ")", flush=True)
    m = {r["arm"]: r for r in out}
    print(f"moe - vanilla: measured {(m['moe']['measured'] - m['vanilla']['measured']) / 2**20:+.1f} "
          f"MiB, model {(m['moe']['model'] - m['vanilla']['model']) / 2**20:+.1f} MiB")
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
