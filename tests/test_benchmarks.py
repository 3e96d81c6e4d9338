"""Smoke tests of the benchmark scripts' quick modes: they run and print their figures.

Nothing here times anything or compares figures with a target (benchmarks print, tests don't
judge speed).
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

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
    out = _run([str(BENCH / "gpu_pilot.py"), "--tiny", "--steps", "1", "--max-new", "8",
                "--json", str(tmp_path / "g.json")])
    assert "generation" in out and "loss+backward" in out and "projection" in out
    assert "of the bound" in out and "tok/s" in out
    assert (tmp_path / "g.json").exists()


@pytest.mark.slow
def test_gpu_pilot_tiny_forward_behaviour_path(tmp_path):
    """The chunked no_grad forward for behaviour log-probs (what a 151936 vocabulary gets)."""
    out = _run([str(BENCH / "gpu_pilot.py"), "--tiny", "--steps", "1", "--max-new", "8",
                "--behaviour", "forward"])
    assert "behaviour log-probs: forward" in out


def test_gpu_pilot_4b_picks_the_chunked_forward_path():
    """At 24 rows x 1024 tokens x 151936 the generate logit store is ~15 GiB: auto must pick the
    chunked forward (checked without building the model)."""
    from evil_moe import rollout

    spec = importlib.util.spec_from_file_location("gpu_pilot", BENCH / "gpu_pilot.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    v = mod.QWEN3_4B["vocab_size"]
    assert 24 * 1024 * v * 4 > 2 * 2**30
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


@pytest.mark.slow
def test_pilot_vs_trl_quick(tmp_path):
    pytest.importorskip("trl", reason="benchmarks/requirements.txt not installed")
    out = _run([str(BENCH / "pilot_vs_trl.py"), "--quick", "--cache", str(tmp_path / "cache"),
                "--json", str(tmp_path / "f.json")])
    assert "ours:vanilla / trl" in out and "ours:erase / trl" in out
    assert (tmp_path / "f.json").exists()


def test_grader_bench_small_agrees_with_the_baseline():
    """benchmarks/grader.py --n 60: our sandboxed verdicts equal the fresh-interpreter baseline's
    on every completion (the mix holds correct, wrong, hacked and looping ones), and it prints
    both throughputs and the ratio without the loops."""
    out = _run([str(BENCH / "grader.py"), "--n", "60"])
    assert "verdicts agree on 60/60" in out, out
    assert "completions/s" in out and "without the" in out


def test_gate_power_quick_mode_prints_its_table():
    out = _run([str(BENCH / "gate_power.py"), "--n", "12", "--seeds", "3", "--samples", "16"])
    for col in ("fpr_separated", "power_separated", "reported_power", "planned_mde", "binomial_se"):
        assert col in out
