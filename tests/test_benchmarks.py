"""Smoke tests of the benchmark scripts' quick modes: they run and print their figures.

Nothing here times anything or compares figures with a target (benchmarks print, tests don't
judge speed).
"""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parent.parent
BENCH = REPO / "benchmarks"


def _run(args: list[str], timeout: int = 1200) -> str:
    env = dict(os.environ, HF_HUB_OFFLINE="1", TQDM_DISABLE="1", PYTHONUNBUFFERED="1")
    p = subprocess.run([sys.executable, *args], cwd=REPO, capture_output=True, text=True,
                       env=env, timeout=timeout)
    out = p.stdout + p.stderr
    assert p.returncode == 0, out[-4000:]
    return p.stdout


@pytest.mark.slow
def test_gpu_pilot_tiny_runs_on_cpu(tmp_path):
    """The device check's tiny CPU mode: one real trainer step of each arm family (vanilla,
    route with the gradient detector, filter with the probe, moe) with every phase timed, the
    behaviour/score gap, the table and the budget line; route and filter flagged rows and
    every arm had a loss (the spread rewards give every row a gradient)."""
    import json

    out = _run([str(BENCH / "gpu_pilot.py"), "--tiny", "--max-new", "8", "--json",
                str(tmp_path / "g.json")])
    for arm in ("vanilla", "route", "filter", "moe"):
        line = next(ln for ln in out.splitlines() if ln.startswith(f"{arm}: step "))
        assert all(f"{k} " in line for k in ("sample", "grade", "loss", "arm", "optimiser"))
        assert "behaviour/score gap p95" in line and "vs memory model" in line
    assert "within the 600 s budget" in out
    arms = json.loads((tmp_path / "g.json").read_text())["arms"]
    assert set(arms) == {"vanilla", "route", "filter", "moe"}
    assert arms["route"]["row"]["flag_rate"] > 0 and arms["filter"]["row"]["flag_rate"] > 0
    assert all(a["row"]["sampler_gap_max"] < 1e-4 for a in arms.values())  # fp32: float noise
    assert arms["moe"]["row"]["router_w_hack"] is not None or arms["moe"]["row"]["router_w_clean"] is not None


def test_gpu_pilot_memory_model_is_the_pilots_for_each_arm_family():
    """The device check compares each arm's peak with the memory model of config/pilot.yaml's
    4B student at the check's rows, max_new, targets (lm_head among them) and 128-token toy
    prompts, the HF sampler: moe's hooked forward and the merged forward of the others."""
    import argparse

    import torch

    spec = importlib.util.spec_from_file_location("gpu_pilot", BENCH / "gpu_pilot.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    args = argparse.Namespace(group=6, prompts=4, max_new=1024, micro_rows=None, tiny=False)
    cfg = mod.check_config(args, torch.device("cuda"))
    assert (cfg.pilot.sampler, cfg.problems.source, cfg.pilot.micro_batch, cfg.models.dtype) == \
        ("hf", "toy", 1, "bfloat16") and "lm_head" in cfg.adapter.target_modules
    from evil_moe.cluster.gpu_memory import pilot_gpu_memory

    for arm in mod.ARM_FAMILIES:
        gib = mod.memory_model_gib(cfg, arm)
        assert gib["peak"] == pilot_gpu_memory(cfg.raw, arm).peak / 2**30 < 78  # one H100
    assert mod.memory_model_gib(cfg, "moe", tiny=True) is None


def test_gpu_pilot_4b_config_and_behaviour_paths():
    """The 4B shape gpu_pilot builds; auto scores in the decode loop (nothing per vocabulary is
    stored, so a 151936 vocabulary needs no second forward), and the chunked forward kept for
    --behaviour forward holds FORWARD_ROWS x 1024 x 151936 fp32 logits (< 8 GiB)."""
    from evil_moe.rl.policy import rollout
    spec = importlib.util.spec_from_file_location("gpu_pilot", BENCH / "gpu_pilot.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    v = mod.QWEN3_4B["vocab_size"]
    assert rollout._behaviour_source("auto") == "generate"
    assert rollout.FORWARD_ROWS * 1024 * v * 4 < 8 * 2**30
    cfg = mod.QWEN3_4B
    assert (cfg["hidden_size"], cfg["num_hidden_layers"], cfg["intermediate_size"],
            cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"],
            cfg["tie_word_embeddings"]) == (2560, 36, 9728, 32, 8, 128, True)


@pytest.mark.slow
def test_workflow_dag_quick():
    out = _run([str(BENCH / "workflow_dag.py"), "--quick"])
    assert "workflow_dag:" in out and "jobs" in out
    jobs = int(out.split(" -> ")[1].split(" jobs")[0])
    assert jobs >= 300
    # the peer: problems, model, extract, 51 seeds x the default's arms pilots, compare, all
    peer = re.search(r"peer \(bare Snakemake, same job shape\): (\d+) jobs.*ours / peer: ([0-9.]+)x wall", out)
    assert peer, out
    arms = yaml.safe_load((REPO / "config" / "config.yaml").read_text())["pilot"]["arms"]
    assert int(peer.group(1)) == 3 + 51 * len(arms) + 2
    assert float(peer.group(2)) > 0


@pytest.mark.slow
def test_pilot_vs_trl_quick(tmp_path):
    pytest.importorskip("trl", reason="benchmarks/requirements.txt not installed")
    out = _run([str(BENCH / "pilot_vs_trl.py"), "--quick", "--cache", str(tmp_path / "cache"),
                "--json", str(tmp_path / "f.json")])
    assert "ours:vanilla / trl" in out and "ours:erase / trl" in out
    assert "ours:vanilla+every_row / trl" in out and "TRL δS checks" in out
    assert (tmp_path / "f.json").exists()


def _load_bench(name):
    spec = importlib.util.spec_from_file_location(name, BENCH / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_trl_side_trains_every_knob_it_is_given():
    """pilot_vs_trl's TRL side (no trl needed): after give_trl_the_adapter the model's output is
    unchanged, a loss that reads lm_head.weight directly (a fused head) sees the lm_head knob as
    the module's hook does, every δS is a model parameter (HF Trainer clips and zeroes those) and
    gets a gradient, δS_hack none."""
    import torch

    from evil_moe.model.adapter import SVDAdapter
    from evil_moe.model.load import build_toy_model

    bench = _load_bench("pilot_vs_trl")

    class Tok:
        eos_token_id, pad_token_id, bos_token_id = 2, 0, None

        def __len__(self):
            return 50

    model = build_toy_model(Tok(), hidden=32, layers=1, intermediate=64, heads=2, kv_heads=1)
    adapter = SVDAdapter.attach(model, ["q_proj", "down_proj", "lm_head"])
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in adapter.delta_s_params():
            p.copy_(0.3 * torch.randn(p.shape, generator=gen))
    ids = torch.randint(3, 50, (2, 7), generator=gen)
    hooked = model(input_ids=ids).logits.detach()
    hidden = model.model(input_ids=ids).last_hidden_state.detach()

    knobs = {n: k.delta_s for n, k in bench.give_trl_the_adapter(model, adapter).items()}
    assert set(knobs) == {"model.layers.0.self_attn.q_proj", "model.layers.0.mlp.down_proj",
                          "lm_head"}
    torch.testing.assert_close(model(input_ids=ids).logits, hooked)
    # a fused head multiplies the hidden states by lm_head.weight itself
    torch.testing.assert_close(hidden @ model.lm_head.weight.T, hooked)
    # the embedding (tied to lm_head's original weight) is unchanged
    assert model.model.embed_tokens.weight is model.lm_head.parametrizations.weight.original
    trainable = {id(p) for p in model.parameters() if p.requires_grad}
    assert trainable == {id(p) for p in knobs.values()}
    out = model.model(input_ids=ids).last_hidden_state @ model.lm_head.weight.T
    out.logsumexp(-1).sum().backward()
    stats = bench.check_gradients(knobs, max_norm=1e9)
    assert stats["lm_head_grad"] > 0
    assert all(p.grad is None for p in adapter.delta_s_hack_params())
    model.zero_grad()
    assert all(p.grad is None or not p.grad.any() for p in knobs.values())
    with pytest.raises(RuntimeError, match="no gradient"):
        bench.check_gradients(knobs, max_norm=1.0)


def _toy_pair():
    """Two copies of one toy model with the same knobs and δS: one given to TRL's side
    (give_trl_the_adapter), one with our adapter's hooks as our pilot trains it."""
    import copy

    import torch

    from evil_moe.model.adapter import SVDAdapter
    from evil_moe.model.load import build_toy_model

    class Tok:
        eos_token_id, pad_token_id, bos_token_id = 2, 0, None

        def __len__(self):
            return 50

    model = build_toy_model(Tok(), hidden=32, layers=1, intermediate=64, heads=2, kv_heads=1)
    ref = copy.deepcopy(model)
    targets = ["q_proj", "down_proj", "lm_head"]
    adapter, ref_adapter = SVDAdapter.attach(model, targets), SVDAdapter.attach(ref, targets)
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in adapter.delta_s_params():
            p.copy_(0.3 * torch.randn(p.shape, generator=gen))
    return Tok(), model, adapter, ref, ref_adapter


def test_our_gradients_equal_trls_loss_on_its_batch():
    """OurGradients (the reference the TRL side is checked against) on a TRL-style batch
    (left-padded prompts, right-padded completions with a mask up to EOS, advantages) equals the
    clipped gradient of TRL's Dr.GRPO loss written out here as trl 1.16 computes it: the fused
    head's log-probs ``log_softmax(hidden @ lm_head.weight.T / T)`` of the completion tokens,
    ``-min(ρA, clip(ρ)A)`` with ρ = exp(logp - logp.detach()) = 1, summed over the mask and
    divided by B * max_completion_length, then clip_grad_norm_ over the model's parameters."""
    import types

    import torch

    bench = _load_bench("pilot_vs_trl")
    tok, model, adapter, ref, ref_adapter = _toy_pair()
    knobs = bench.give_trl_the_adapter(model, adapter)
    B, Tp, Tc, T, max_new, max_norm = 4, 5, 6, 0.7, 8, 0.05
    gen = torch.Generator().manual_seed(2)
    prompt_ids = torch.randint(3, 50, (B, Tp), generator=gen)
    prompt_mask = torch.ones(B, Tp, dtype=torch.long)
    prompt_mask[0, :2] = 0  # left padding
    prompt_mask[3, :1] = 0
    prompt_ids[prompt_mask == 0] = 0
    completion_ids = torch.randint(3, 50, (B, Tc), generator=gen)
    completion_mask = torch.ones(B, Tc, dtype=torch.long)
    completion_mask[1, 3:] = 0  # ended (EOS at 2), then padding
    completion_mask[2, 5:] = 0
    completion_ids[completion_mask == 0] = 0
    adv = torch.tensor([0.5, -0.25, 0.0, -0.25])
    ids = torch.cat([prompt_ids, completion_ids], 1)
    att = torch.cat([prompt_mask, completion_mask], 1)
    hidden = model.model(input_ids=ids, attention_mask=att).last_hidden_state  # as TRL calls it
    logits = hidden[:, :-1] @ model.lm_head.weight.T / T
    logp = logits.log_softmax(-1).gather(-1, ids[:, 1:, None])[..., 0][:, -Tc:]
    ratio = torch.exp(logp - logp.detach())
    per_tok = -torch.minimum(ratio * adv[:, None], ratio.clamp(0.8, 1.2) * adv[:, None])
    loss = (per_tok * completion_mask).sum() / (B * max_new)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    want = {n: k.delta_s.grad.clone() for n, k in knobs.items()}
    assert all(float(g.norm()) > 0 for g in want.values())

    pc = types.SimpleNamespace(group=2, prompts_per_step=2, max_new=max_new, temperature=T,
                               clip_eps=0.2, max_grad_norm=max_norm)
    got = bench.OurGradients(ref, tok, ref_adapter, pc)(
        knobs, {"prompt_ids": prompt_ids, "prompt_mask": prompt_mask, "completion_ids": completion_ids,
                "completion_mask": completion_mask, "advantages": adv})
    assert set(got) == set(want)
    for n in want:
        torch.testing.assert_close(got[n], want[n], rtol=1e-4, atol=1e-7)
    # OurGradients copied TRL's δS into our adapter before the forward
    for n, k in knobs.items():
        assert torch.equal(ref_adapter.modules_[n].delta_s, k.delta_s)


def test_grader_bench_small_agrees_with_the_baseline():
    """benchmarks/grader.py --n 60: our sandboxed verdicts equal the fresh-interpreter baseline's
    on every completion (the mix holds correct, wrong, hacked and looping ones), and it prints
    both throughputs and the ratio without the loops."""
    out = _run([str(BENCH / "grader.py"), "--n", "60"])
    # both baselines, the fresh interpreter and the fork server, agree on every verdict
    assert out.count("verdicts agree on 60/60") == 2, out
    assert "completions/s" in out and "without the" in out and "ratio vs fork server" in out


def test_gate_power_quick_mode_prints_its_table():
    out = _run([str(BENCH / "gate_power.py"), "--n", "12", "--seeds", "3", "--samples", "16"])
    for col in ("fpr_separated", "power_separated", "reported_power", "planned_mde", "binomial_se"):
        assert col in out


@pytest.mark.slow
def test_pilot_roofline_quick(tmp_path):
    """One tiny toy pilot in a fresh process: the phase table, the token counts and both bounds'
    ratios are printed and written."""
    import json

    out = _run([str(BENCH / "pilot_roofline.py"), "--quick", "--cache", str(tmp_path / "cache"),
                "--json", str(tmp_path / "r.json")])
    for phase in ("startup", "sample", "grade", "loss", "eval", "other", "total"):
        assert re.search(rf"^  {re.escape(phase)} +[0-9.]+ +[0-9.]+$", out, re.M), phase
    assert re.search(r"bound \(per row\): \d+ GFLOP = [0-9.]+ s; ratio [0-9.]+x wall", out)
    assert re.search(r"pilot_roofline: [0-9.]+ s = [0-9.]+x the per-row bound", out)
    figs = json.loads((tmp_path / "r.json").read_text())
    # at least the training rows (2 steps x 4 prompts x 6) were sampled, each prompt of a call
    # counted once per group; each prompt of a step's loss counted once per group
    assert figs["sampled_tokens"]["rows"] >= 2 * 4 * 6
    assert 0 < figs["loss_tokens"]["per_group"] <= figs["loss_tokens"]["per_row"]
    assert figs["sampled_tokens"]["per_group"] < figs["sampled_tokens"]["per_row"]


def test_pilot_roofline_bound_by_hand(capsys):
    """The bound and ratio arithmetic: 2N per sampled token, 6N per loss token, at the measured
    rate; figures worked out by hand."""
    bench = _load_bench("pilot_roofline")
    m = bench.Meter()
    m.wall.update(sample=3.0, loss=1.0, other=2.0)
    m.cpu.update(sample=2.0, loss=1.0, other=1.0)
    m.sampled.update(per_row=1000, per_group=400, completion=300, rows=10)
    m.loss.update(per_row=500, per_group=200, rows=4)
    figs = bench.report(m, n_params=1_000_000, gflops=10.0, load="test")
    # per row: 2e6 * 1000 + 6e6 * 500 = 5e9 FLOP = 0.5 s at 10 GFLOP/s; wall 6 s, CPU 4 s
    assert figs["per_row"]["gflop"] == pytest.approx(5.0)
    assert figs["per_row"]["bound_s"] == pytest.approx(0.5)
    assert figs["per_row"]["ratio"] == pytest.approx(12.0)
    assert figs["per_row"]["ratio_cpu"] == pytest.approx(8.0)
    # per group: 2e6 * 400 + 6e6 * 200 = 2e9 FLOP = 0.2 s
    assert figs["per_group"]["ratio"] == pytest.approx(30.0)
    assert "12.00x the per-row bound" in capsys.readouterr().out


def test_sampler_vs_generate_quick(tmp_path):
    """Our sampler and plain model.generate on the tiny test model, the same batch: both token
    counts and the ratio are printed."""
    out = _run([str(BENCH / "sampler_vs_generate.py"), "--quick", "--cache", str(tmp_path)])
    assert re.search(r"^ours : \d+ tokens, .* tokens/s", out, re.M)
    assert re.search(r"^plain: \d+ tokens, .* tokens/s", out, re.M)
    assert re.search(r"ours / plain = [0-9.]+x tokens/s wall", out)


@pytest.mark.slow
def test_train_memory_quick(tmp_path):
    """Each arm's loss micro-batch in a fresh process on a tiny shape: the measured peak above
    the resident memory and the memory model's terms are printed and written; the model's terms
    are the arm's forward's (moe: hooked, vanilla and route: merged)."""
    import json

    out = _run([str(BENCH / "train_memory.py"), "--quick", "--json", str(tmp_path / "m.json")])
    for arm in ("vanilla", "route", "moe"):
        assert re.search(rf"^{arm} +measured +[0-9.]+ MiB +model +[0-9.]+ MiB", out, re.M), arm
    figs = {r["arm"]: r for r in json.loads((tmp_path / "m.json").read_text())}
    assert figs["vanilla"]["measured"] > 0 and figs["moe"]["measured"] > 0
    assert "buffer_copies" in figs["moe"]["terms"] and "output_grads" in figs["vanilla"]["terms"]
    assert figs["route"]["terms"]["per_row"] > 0 == figs["vanilla"]["terms"]["per_row"]
