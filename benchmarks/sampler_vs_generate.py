"""Benchmark: our sampler (:func:`evil_moe.rl.policy.rollout.generate`) against plain ``model.generate``.

The same model, the same adapter state (random non-zero ``δS`` on every targeted Linear, the tied
``lm_head`` included: ``config/config.yaml``'s targets), the same prompts and batch: ``--prompts``
chat prompts of the problem set × ``--group`` samples each, ``--max-new`` tokens, temperature
and top-p of ``config/smollm2.yaml``'s pilot, the pilot's thread count. Both sample with the
adapter merged into the weights:

* ``ours`` — :func:`~evil_moe.rl.policy.rollout.generate` as the pilot calls it: each distinct prompt
  prefilled once and its keys and values read once per group at each decode step
  (shared-prompt attention; ``--no-shared-prompt``: each row reads its own copy), finished
  rows leave the batch, per-row seeded draws, and the behaviour log-probs, entropies and
  sampler log-probs recorded for every token;
* ``plain`` — ``model.generate`` on the left-padded ``prompts × group`` rows (``do_sample``,
  the same temperature, top-p, ``top_k=0``, eos; nothing recorded): what a sampler that treats
  rows independently costs, without any log-prob bookkeeping.

Prints completion tokens, wall and CPU seconds of each over ``--calls`` calls (alternated, so
load drifts hit both), tokens/s, and ``ours / plain`` (throughput ratio: above 1 = ours faster).

    .venv/bin/python benchmarks/sampler_vs_generate.py                 # SmolLM2-135M (converted once)
    .venv/bin/python benchmarks/sampler_vs_generate.py --model DIR     # any local causal LM
    .venv/bin/python benchmarks/sampler_vs_generate.py --quick         # tiny test model, smoke mode
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TQDM_DISABLE", "1")


def load(args):
    """``(model, tokenizer, adapter, prompts, cfg)``: the model (SmolLM2 converted into
    ``--cache`` once, ``--model``, or the tiny test model with ``--quick``), the adapter with
    random δS, and the chat prompts of the problem set."""
    import torch

    from evil_moe.config import load_config
    from evil_moe.stages.common import load_policy, load_problem_file
    from evil_moe.rl.policy.rollout import prompt_ids_for

    sets = ["models.device=cpu"]
    cfg = load_config([REPO / "config" / "config.yaml", REPO / "config" / "smollm2.yaml"], sets)
    if args.quick:
        from evil_moe.model.load import build_tiny, save_model

        path = Path(args.cache) / "tiny"
        if not (path / "config.json").exists():
            model, tok = build_tiny(seed=0)
            save_model(model, tok, path)
        model_dir = str(path)
    elif args.model:
        model_dir = args.model
    else:
        model_dir = str(Path(args.cache) / "smollm2")
        if not (Path(model_dir) / "config.json").exists():
            from evil_moe.stages.models import convert_smollm2

            print(f"converting SmolLM2 into {model_dir} ...", flush=True)
            convert_smollm2(model_dir)
    model, tok, adapter, _ = load_policy(model_dir, cfg)
    model.eval()
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in adapter.delta_s_params():
            p.copy_(0.01 * torch.randn(p.shape, generator=gen, dtype=p.dtype))
    from evil_moe.stages.problems import write_problem_set

    bank = Path(args.cache) / f"problems_{cfg.digest('problems')}.jsonl"
    if not bank.exists():  # config/smollm2.yaml's problem set (LeetCode medium/hard)
        write_problem_set(cfg, str(bank))
    prompts = prompt_ids_for(tok, load_problem_file(str(bank)))
    return model, tok, adapter, prompts, cfg


def plain_generate(model, tok, adapter, prompts, *, n, max_new, temperature, top_p, seed):
    """``model.generate`` of the left-padded ``prompts × n`` rows (adapter merged): the
    completion token count (up to and including each row's first eos)."""
    import torch

    from evil_moe.rl.policy.rollout import _eos_ids

    eos = sorted(_eos_ids(model, tok))
    pad = tok.pad_token_id if tok.pad_token_id is not None else eos[0]
    rows = [p for p in prompts for _ in range(n)]
    L = max(map(len, rows))
    ids = torch.full((len(rows), L), pad, dtype=torch.long)
    att = torch.zeros(len(rows), L, dtype=torch.long)
    for i, p in enumerate(rows):
        ids[i, L - len(p):] = torch.tensor(p)
        att[i, L - len(p):] = 1
    torch.manual_seed(seed)
    with adapter.merged(), torch.no_grad():
        out = model.generate(input_ids=ids, attention_mask=att, do_sample=True, temperature=temperature,
                             top_p=top_p, top_k=0, max_new_tokens=max_new, eos_token_id=eos,
                             pad_token_id=pad)
    count = 0
    for row in out[:, L:].tolist():
        cut = next((j + 1 for j, t in enumerate(row) if t in eos), len(row))
        count += cut
    return count


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=None, help="a local model folder (default: SmolLM2)")
    ap.add_argument("--cache", default=str(Path(tempfile.gettempdir()) / "evil_moe_bench"))
    ap.add_argument("--prompts", type=int, default=None, help="default: pilot.prompts_per_step")
    ap.add_argument("--group", type=int, default=None, help="default: pilot.group")
    ap.add_argument("--max-new", type=int, default=None, help="default: pilot.max_new")
    ap.add_argument("--calls", type=int, default=2, help="calls of each sampler (alternated)")
    ap.add_argument("--quick", action="store_true", help="tiny test model, smoke mode")
    ap.add_argument("--no-shared-prompt", action="store_true",
                    help="ours with each row copying its prompt's cache (the reference for the "
                         "shared-prompt attention's gain)")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    args.cache = str(Path(args.cache).resolve())
    os.chdir(REPO)  # the configs' relative paths (problems.path) are the repository's
    import torch

    from evil_moe.rl.policy.rollout import generate

    model, tok, adapter, prompts, cfg = load(args)
    pc = cfg.pilot
    torch.set_num_threads(pc.threads)
    P, G = args.prompts or pc.prompts_per_step, args.group or pc.group
    max_new = args.max_new or (16 if args.quick else pc.max_new)
    kw = dict(n=G, max_new=max_new, temperature=pc.temperature, top_p=pc.top_p)
    print(f"sampler_vs_generate: {model.config._name_or_path or type(model).__name__}, "
          f"{sum(p.numel() for p in model.parameters()) / 1e6:.1f} M params, {P} prompts x {G} "
          f"samples, prompts {[len(prompts[i]) for i in range(P)]} tokens, max_new {max_new}, "
          f"T {pc.temperature}, top_p {pc.top_p}, {pc.threads} thread(s)", flush=True)
    figs = {"ours": [0, 0.0, 0.0], "plain": [0, 0.0, 0.0]}  # tokens, wall, cpu
    for c in range(args.calls):
        batch = [prompts[(c * P + j) % len(prompts)] for j in range(P)]
        for name in (("ours", "plain") if c % 2 == 0 else ("plain", "ours")):
            t, cpu = time.perf_counter(), time.process_time()
            if name == "ours":
                rolls = generate(model, tok, batch, seed=c, adapter=adapter,
                                 shared_prompt=not args.no_shared_prompt, **kw)
                n_tok = sum(len(r.completion_ids) for r in rolls)
            else:
                n_tok = plain_generate(model, tok, adapter, batch, seed=c, **kw)
            wall, cpu = time.perf_counter() - t, time.process_time() - cpu
            f = figs[name]
            f[0] += n_tok
            f[1] += wall
            f[2] += cpu
            print(f"  call {c} {name:5s}: {n_tok} tokens in {wall:.1f} s ({cpu:.1f} CPU-s)", flush=True)
    rate = {k: v[0] / v[1] for k, v in figs.items()}
    rate_cpu = {k: v[0] / v[2] for k, v in figs.items()}
    load_avg = f"load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs"
    for k, v in figs.items():
        print(f"{k:5s}: {v[0]} tokens, {v[1]:.1f} s wall, {v[2]:.1f} CPU-s: {rate[k]:.2f} tokens/s "
              f"({rate_cpu[k]:.2f} per CPU-s)")
    print(f"sampler_vs_generate: ours / plain = {rate['ours'] / rate['plain']:.2f}x tokens/s wall, "
          f"{rate_cpu['ours'] / rate_cpu['plain']:.2f}x per CPU-s; {load_avg}")
    if args.json:
        Path(args.json).write_text(json.dumps({"figures": figs, "ratio": rate["ours"] / rate["plain"],
                                               "ratio_cpu": rate_cpu["ours"] / rate_cpu["plain"],
                                               "load": load_avg}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
