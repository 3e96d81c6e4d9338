"""Job sizes from the config (evil_moe/resources.py): the model's shape, the requests against
measured peaks, attempt scaling, GPUs, and the thread count every executor uses."""

from __future__ import annotations

import json

import pytest
import torch

from evil_moe.config import load_config
from evil_moe.resources import (SMOLLM2, ResourceError, guessed_shape, job_size, model_shape,
                                pilot_priority, toy_shape)
from evil_moe.stages.common import use_threads
from workflow_util import REPO

DEFAULT = REPO / "config" / "config.yaml"


def cfg_of(*files, sets=()):
    return load_config([DEFAULT, *files], list(sets)).raw


class _Tok:
    """The three things build_toy_model reads of a tokenizer."""

    def __init__(self, n):
        self.n, self.eos_token_id, self.pad_token_id, self.bos_token_id = n, 2, 0, None

    def __len__(self):
        return self.n


@pytest.mark.parametrize("sets", [(), ("toy.hidden=64", "toy.layers=2", "toy.intermediate=128",
                                       "toy.vocab_size=400")])
def test_toy_shape_counts_the_built_models_parameters(sets):
    from evil_moe.model.load import build_toy_model

    toy = cfg_of(sets=sets)["toy"]
    model = build_toy_model(_Tok(toy["vocab_size"]), hidden=toy["hidden"], layers=toy["layers"],
                            intermediate=toy["intermediate"], heads=toy["heads"],
                            kv_heads=toy["kv_heads"])
    assert toy_shape(toy).params == sum(p.numel() for p in model.parameters())


def test_toy_default_shape_by_hand():
    # hidden 128, 4 layers, MLP 768, 4 heads (head_dim 32), 2 KV heads, vocab 1024 (tied):
    # per layer q 128*128 + k,v 2*128*64 + o 128*128 + MLP 3*128*768 + norms 2*128 + 2*32
    per_layer = 16384 + 16384 + 16384 + 294912 + 256 + 64
    assert toy_shape(cfg_of()["toy"]).params == 1024 * 128 + 4 * per_layer + 128


# Peak memory (max_rss, MB) and wall time of the toy default's jobs: the largest of three runs'
# Snakemake benchmark files (results/benchmarks/*.tsv) on the 2-core development machine,
# 2026-11-30: `snakemake --profile profiles/local` (load 3-6, other jobs running), the shipped
# Slurm profile on the single-node test cluster (load 1-2), and, after the held-out evaluation
# grew to 64 samples per problem and view, profiles/local again (vanilla, erase, route; load 1.5).
TOY_PEAKS_MB = {"toy_models": 1041, "teacher": 610, "extract": 705, "distill": 727, "pilot": 1185}
TOY_SECONDS = {"toy_models": 166, "teacher": 10, "extract": 25, "distill": 36, "pilot": 124}
# SmolLM2-135M on 2 CPU cores (config/smollm2.yaml with its made teacher, 2026-11-30, load
# 1.4-2.2; Snakemake benchmark files, README "A real pretrained model"): max RSS and wall time.
SMOLLM2_PEAKS_MB = {"make_teacher": 6900, "teacher": 1600, "extract": 9400, "distill": 6300,
                    "pilot": 9200}
SMOLLM2_SECONDS = {"make_teacher": 264, "teacher": 59, "extract": 141, "distill": 204, "pilot": 597}


@pytest.mark.parametrize("stage", sorted(TOY_PEAKS_MB))
def test_toy_requests_cover_the_measured_peaks(stage):
    size = job_size(cfg_of(), stage)
    assert TOY_PEAKS_MB[stage] <= size.mem_mb <= 2.5 * TOY_PEAKS_MB[stage] + 500
    assert size.mem_mb <= 2500  # the toy default fits any cluster's smallest job
    assert size.runtime * 60 >= 3 * TOY_SECONDS[stage]
    assert size.gpu == 0


@pytest.mark.parametrize("stage", sorted(SMOLLM2_SECONDS))
def test_smollm2_requests_cover_the_measured_peaks(stage):
    cfg = cfg_of(REPO / "config" / "smollm2.yaml")
    size = job_size(cfg, stage)
    if stage in SMOLLM2_PEAKS_MB:
        assert SMOLLM2_PEAKS_MB[stage] <= size.mem_mb <= 2.5 * SMOLLM2_PEAKS_MB[stage] + 500
    assert size.runtime * 60 >= 2 * SMOLLM2_SECONDS[stage]


def test_threads_come_from_the_config_and_retries_scale():
    cfg = cfg_of(sets=["pilot.threads=3", "vhack.threads=5"])
    assert job_size(cfg, "pilot").threads == 3
    assert job_size(cfg, "extract").threads == 5
    assert job_size(cfg, "compare").threads == 1
    size = job_size(cfg, "pilot")
    assert size.mem_mb_at(2) == 2 * size.mem_mb and size.runtime_at(3) == 3 * size.runtime


def test_pilot_priority_starts_the_longest_arms_first():
    # one unit per evaluated view, one more for per-sample gradients (worked out from the arms'
    # definitions): route evaluates ablated + trained and needs per-sample gradients; vanilla,
    # erase and the positive control evaluate one view from one batched backward per step
    assert pilot_priority("route") == pilot_priority("route_random") == 3
    assert pilot_priority("filter") == 2  # one view, per-sample gradients
    for arm in ("vanilla", "erase", "random_v", "oracle_reward"):
        assert pilot_priority(arm) == 1
    assert pilot_priority("no_such_arm") == 0
    # the toy default's measured pilot times (README "Job sizes"): route's 50-67 s against
    # vanilla's 36-48 s, so the order matches the cost
    assert pilot_priority("route") > pilot_priority("vanilla")


def test_gpu_only_for_model_stages_on_cuda():
    cuda = cfg_of(sets=["models.device=cuda"])
    for stage in ("teacher", "extract", "distill", "pilot"):
        assert job_size(cuda, stage).gpu == 1
        assert job_size(cfg_of(), stage).gpu == 0  # device auto: the toy default asks none
    for stage in ("problems", "toy_models", "compare"):
        assert job_size(cuda, stage).gpu == 0


def test_real_pilot_asks_for_a_4b_models_host_memory():
    cfg = cfg_of(REPO / "config" / "pilot.yaml")
    assert model_shape(cfg).params == 4022468096
    weights_mb = 4022468096 * 2 / 2**20  # bfloat16
    for stage in ("teacher", "extract", "distill", "pilot"):
        size = job_size(cfg, stage)
        assert size.gpu == 1 and size.threads == 8
        assert weights_mb + 3000 <= size.mem_mb <= 2 * weights_mb + 5000


def test_hub_id_without_params_names_the_key():
    cfg = cfg_of(REPO / "config" / "pilot.yaml", sets=["models.params=null"])
    with pytest.raises(ResourceError, match="models.params"):
        job_size(cfg, "pilot")


def test_local_model_folder_shape_from_its_config_json(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({
        "hidden_size": 576, "num_hidden_layers": 30, "intermediate_size": 1536,
        "num_attention_heads": 9, "vocab_size": 49152}))
    cfg = cfg_of(sets=["models.build=none", f"models.student={tmp_path}",
                       f"models.teacher={tmp_path}", "models.params=134515008"])
    assert model_shape(cfg) == SMOLLM2


def test_guessed_shape_of_a_4b_decoder_is_plausible():
    # Qwen3-4B: hidden 2560, 36 layers; Llama-3-8B: hidden 4096, 32 layers
    s = guessed_shape(4.0e9)
    assert 2000 <= s.hidden <= 4000 and 24 <= s.layers <= 48
    assert 0.6 <= 12 * s.layers * s.hidden**2 / 4.0e9 <= 1.2


def test_use_threads_sets_torch_and_the_config():
    before = torch.get_num_threads()
    try:
        cfg = load_config([DEFAULT])
        out = use_threads(cfg, "pilot")
        assert torch.get_num_threads() == cfg.pilot.threads == out.pilot.threads == 1
        out = use_threads(cfg, "pilot", 2)  # --threads 2 == --set pilot.threads=2
        assert torch.get_num_threads() == 2 and out.pilot.threads == 2
        assert out.digest("pilot") != cfg.digest("pilot")  # a checkpoint of 1 thread is not resumed
    finally:
        torch.set_num_threads(before)
