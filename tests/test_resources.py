"""Job sizes from the config (evil_moe/cluster/resources.py): the model's shape, the requests against
measured peaks, attempt scaling, GPUs, and the thread count every executor uses."""

from __future__ import annotations

import json

import pytest
import torch

from evil_moe.config import ConfigError, load_config
from evil_moe.cluster.resources import (SMOLLM2, ResourceError, guessed_shape, job_size, model_shape,
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
    # an unknown hub id (Qwen/Qwen3-4B's shape is known): the CPU config sizes no GPU memory, so
    # the job size names the key; on cuda the config check does, before any job is sized
    sets = ["models.params=null", "models.student=someone/unknown-4b"]
    cfg = cfg_of(REPO / "config" / "pilot.yaml", sets=[*sets, "models.device=cpu"])
    with pytest.raises(ResourceError, match="models.params"):
        job_size(cfg, "pilot")
    with pytest.raises(ConfigError, match="models.params"):
        cfg_of(REPO / "config" / "pilot.yaml", sets=sets)


def test_local_model_folder_shape_from_its_config_json(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({
        "hidden_size": 576, "num_hidden_layers": 30, "intermediate_size": 1536,
        "num_attention_heads": 9, "num_key_value_heads": 3, "vocab_size": 49152,
        "tie_word_embeddings": True}))
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


# ---- GPU memory of a pilot (docs/job-sizes.md#gpu-memory) ------------------------------------------
def _saved_bytes(dtype, shape, rows, prompt, completion):
    """Bytes of the tensors autograd saves for the pilot loss's backward (token_logprobs on an
    adapted toy Qwen3 model), counted once per storage, parameters and buffers excluded."""
    from evil_moe.model.adapter import SVDAdapter
    from evil_moe.model.load import build_toy_model
    from evil_moe.model.logprobs import build_batch, token_logprobs

    h, layers, inter, heads, kv, hd, vocab = shape
    model = build_toy_model(_Tok(vocab), hidden=h, layers=layers, intermediate=inter, heads=heads,
                            kv_heads=kv, head_dim=hd, dtype=dtype)
    SVDAdapter.attach(model, ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj",
                              "down_proj", "lm_head"])
    gen = torch.Generator().manual_seed(0)
    batch = build_batch([torch.randint(3, vocab, (prompt,), generator=gen).tolist()] * rows,
                        [torch.randint(3, vocab, (completion,), generator=gen).tolist()] * rows, 0)
    fixed = {t.untyped_storage().data_ptr() for t in [*model.parameters(), *model.buffers()]}
    seen = {}

    def pack(x):
        st = x.untyped_storage()
        if st.data_ptr() not in fixed:
            seen[st.data_ptr()] = st.nbytes()
        return x

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda x: x):
        token_logprobs(model, batch, 1.0)
    return sum(seen.values())


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
@pytest.mark.parametrize("shape", [(96, 2, 320, 3, 1, 32, 700), (160, 3, 384, 8, 2, 24, 1500)])
def test_saved_activations_per_token_match_autograd(dtype, shape):
    """The memory model's per-token bytes against what autograd really keeps, on shapes other than
    those the coefficients were fitted on (q wider than hidden, one KV head): the marginal bytes
    of two more rows."""
    from evil_moe.cluster.resources import LOGIT_BYTES, ModelShape, saved_bytes_per_token

    prompt, completion = 16, 40
    dt = getattr(torch, dtype)
    extra = _saved_bytes(dt, shape, 4, prompt, completion) - _saved_bytes(dt, shape, 2, prompt,
                                                                          completion)
    measured = extra / 2  # per row
    h, layers, inter, heads, kv, hd, vocab = shape
    s = ModelShape(params=1, layers=layers, hidden=h, intermediate=inter, heads=heads,
                   vocab=vocab, q_dim=heads * hd, kv_dim=kv * hd)
    model = ((prompt + completion) * saved_bytes_per_token(s, dtype)
             + completion * LOGIT_BYTES * vocab)
    assert measured <= model <= 1.08 * measured, (measured, model)


def test_qwen3_4b_memory_by_hand():
    """config/pilot.yaml's pieces worked out by hand from Qwen3-4B's config.json (bf16)."""
    from evil_moe.cluster.resources import pilot_gpu_memory

    cfg = cfg_of(REPO / "config" / "pilot.yaml")
    mem = pilot_gpu_memory(cfg)
    # U (d_out x r) + Vh (r x d_in) per Linear, r = min: q 4096x2560 -> 2560*(4096+2560);
    # k, v 1024x2560 -> 1024*3584 each; o like q; gate, up, down 9728x2560 -> 2560*12288 each;
    # lm_head 151936x2560 -> 2560*154496
    per_layer = 2 * 2560 * 6656 + 2 * 1024 * 3584 + 3 * 2560 * 12288
    buffers = 2 * (36 * per_layer + 2560 * 154496)
    rank = 36 * (4 * 2560 + 2 * 1024 + 2560) + 2560
    resident = 2 * 4_022_468_096 + buffers + 32 * rank
    assert mem.resident == pytest.approx(resident)
    # one 2-row micro-batch of 640 + 1024 tokens: 2 x 1664 tokens x 36 layers x
    # (18.5*2560 + 8.25*4096 + 12.125*1024 + 6*9728) B, + 4*2560 B per token, + the logits:
    # 2 x 1024 x 151936 x (4 z + 4 its gradient + 2 the bf16 gradient)
    acts = 2 * 1664 * (36 * (47360 + 33792 + 12416 + 58368) + 10240)
    logits = 2 * 1024 * 151936 * 10
    assert mem.train == pytest.approx(resident + buffers + acts + logits)
    # the held-out evaluation: 8 problems x 16 samples, KV cache 2 x 1024 values x 36 layers per
    # token in bf16, the prefill's 3 x 9728 MLP values per prompt token
    rows = 8 * 16
    kv = 2 * rows * 1664 * 36 * 2 * 1024
    prefill = 2 * rows * 640 * 3 * 9728
    merged = 2 * 36 * (2 * 4096 * 2560 + 2 * 1024 * 2560 + 3 * 9728 * 2560)
    assert mem.evaluate == pytest.approx(resident + merged + 8 * 151936 * 2560 + kv + prefill)


@pytest.mark.parametrize("name", sorted(p.name for p in (REPO / "config").glob("*.yaml")
                                        if p.name != "schema.yaml"))
def test_every_shipped_config_fits_its_gpu(name):
    from evil_moe.cluster.resources import GPU_USABLE, check_gpu_fit

    cfg = cfg_of(REPO / "config" / name)  # the config check passes
    cuda = cfg if str(cfg["models"]["device"]).startswith("cuda") else \
        cfg_of(REPO / "config" / name, sets=["models.device=cuda"])
    mem = check_gpu_fit(cuda)
    assert mem is not None and mem.peak <= GPU_USABLE * cuda["models"]["gpu_mem_gb"] * 1e9
    if name == "pilot.yaml":  # the 4B pilot fits an 80 GB GPU with 15% to spare
        assert cuda["models"]["gpu_mem_gb"] == 80 and mem.peak <= 0.85 * 80e9


@pytest.mark.parametrize("sets,key,value", [
    # usable: 90% of 80 GB = 72 GB. Training: 29.2 GB (weights, adapter buffers twice) + ~10.65
    # GB per 1664-token row -> 4 rows 71.9 GB fit, 5 do not (all 24 at once: ~285 GB)
    (["pilot.micro_batch=0"], "pilot.micro_batch", 4),
    # evaluation: 65.2 GB at 8 problems x 16 samples, + 16 x (KV 245 MB + prefill 37 MB) = 4.5 GB
    # per problem -> 9 problems 69.7 GB fit, 10 (74.3 GB) do not
    (["pilot.eval_chunk=16"], "pilot.eval_chunk", 9),
    # 60 GB GPU (54 usable): 2 rows 50.5 GB fit, 3 rows 61.2 GB do not
    (["pilot.micro_batch=4", "pilot.eval_chunk=4", "models.gpu_mem_gb=60"], "pilot.micro_batch", 2),
])
def test_a_pilot_that_does_not_fit_is_refused_naming_the_key(sets, key, value):
    with pytest.raises(ConfigError) as err:
        cfg_of(REPO / "config" / "pilot.yaml", sets=sets)
    msg = str(err.value)
    assert "\n" not in msg and f"'{key}' to {value} or less" in msg, msg
    # the value it names fits, one more does not
    cfg_of(REPO / "config" / "pilot.yaml", sets=[*sets, f"{key}={value}"])
    with pytest.raises(ConfigError):
        cfg_of(REPO / "config" / "pilot.yaml", sets=[*sets, f"{key}={value + 1}"])


def test_slurm_check_refuses_a_pilot_that_does_not_fit(tmp_path):
    from click.testing import CliRunner

    from evil_moe.cli import main

    bad = tmp_path / "bad.yaml"
    bad.write_text("pilot:\n  micro_batch: 0\n")
    res = CliRunner().invoke(main, ["slurm-check", "--configfile",
                                    str(REPO / "config" / "pilot.yaml"), "--configfile", str(bad)])
    assert res.exit_code != 0
    assert "'pilot.micro_batch' to 4 or less" in res.output, res.output


def test_vllm_sampler_holds_its_share_of_the_gpu_in_every_phase():
    """pilot.sampler vllm: the engine's gpu_memory_utilization x gpu_mem_gb is added to every
    phase; sampling then costs our no-grad scoring forward (8 rows x 1024 tokens x 151936 x
    (2 + 12) B), not HF generate's KV cache."""
    from evil_moe.cluster.resources import pilot_gpu_memory

    # no knob on Qwen3-4B's tied lm_head: vLLM cannot take it (the config check refuses it)
    sets = ["models.gpu_mem_gb=141", "pilot.micro_batch=1", NO_HEAD]
    hf = pilot_gpu_memory(cfg_of(REPO / "config" / "pilot.yaml", sets=sets))
    vl = pilot_gpu_memory(cfg_of(REPO / "config" / "pilot.yaml",
                                 sets=[*sets, "pilot.sampler=vllm",
                                       "pilot.vllm_gpu_memory_utilization=0.25"]))
    share = 0.25 * 141e9
    assert vl.train - hf.train == pytest.approx(share)
    assert vl.resident - hf.resident == pytest.approx(share)
    score = 8 * 1024 * 151936 * 14
    assert vl.sample == pytest.approx(hf.sample - _hf_generate(hf) + share + score)


NO_HEAD = "adapter.target_modules=[q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj]"


def test_vllm_with_a_knob_on_a_tied_lm_head_is_refused_before_any_job():
    """config/pilot.yaml targets lm_head and Qwen3-4B's head is tied: with pilot.sampler vllm the
    config check refuses it naming adapter.target_modules (not the pilots at run time, after
    the teacher, extract and distill jobs); without lm_head it passes."""
    from evil_moe.config import ConfigError

    sets = ["models.gpu_mem_gb=141", "pilot.sampler=vllm"]
    with pytest.raises(ConfigError, match=r"remove lm_head from 'adapter.target_modules'"):
        cfg_of(REPO / "config" / "pilot.yaml", sets=sets)
    assert cfg_of(REPO / "config" / "pilot.yaml", sets=[*sets, NO_HEAD])


def _hf_generate(mem):
    """HF sampling's generate share of config/pilot.yaml's sample phase (24 rows: scores above
    2 GiB, so the larger of KV cache + prefill and the 8-row scoring forward)."""
    kv = 2 * 24 * 1664 * 36 * 2 * 1024
    prefill = 2 * 24 * 640 * 3 * 9728
    return max(kv + prefill, 8 * 1024 * 151936 * 14)
