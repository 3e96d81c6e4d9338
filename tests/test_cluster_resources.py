"""Job sizes from the config (evil_moe/cluster/resources.py): the model's shape, the requests against
measured peaks, attempt scaling, GPUs, and the thread count every executor uses."""

from __future__ import annotations

import json

import pytest
import torch

from evil_moe.checks import load_run_config as load_config
from evil_moe.config import ConfigError
from evil_moe.cluster.shapes import SMOLLM2, ResourceError, guessed_shape, model_shape, toy_shape
from evil_moe.cluster.resources import job_size, pilot_priority
from evil_moe.stages.common import use_threads
from workflow_util import REPO, raw_config

DEFAULT = REPO / "config" / "config.yaml"


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

    toy = raw_config(sets=sets)["toy"]
    model = build_toy_model(_Tok(toy["vocab_size"]), hidden=toy["hidden"], layers=toy["layers"],
                            intermediate=toy["intermediate"], heads=toy["heads"],
                            kv_heads=toy["kv_heads"])
    assert toy_shape(toy).params == sum(p.numel() for p in model.parameters())


def test_toy_default_shape_by_hand():
    # hidden 128, 4 layers, MLP 768, 4 heads (head_dim 32), 2 KV heads, vocab 1024 (tied):
    # per layer q 128*128 + k,v 2*128*64 + o 128*128 + MLP 3*128*768 + norms 2*128 + 2*32
    per_layer = 16384 + 16384 + 16384 + 294912 + 256 + 64
    assert toy_shape(raw_config()["toy"]).params == 1024 * 128 + 4 * per_layer + 128


# Peak memory (max_rss, MB) and wall time of the toy default's jobs: the largest of three runs'
# Snakemake benchmark files (results/benchmarks/*.tsv) on the 2-core development machine,
# 2026-11-30: `snakemake --profile profiles/local` (load 3-6, other jobs running), the shipped
# Slurm profile on the single-node test cluster (load 1-2), and, after the held-out evaluation
# grew to 64 samples per problem and view, profiles/local again (vanilla, erase, route; load 1.5).
TOY_PEAKS_MB = {"toy_models": 1041, "teacher": 610, "extract": 705, "distill": 727, "pilot": 1185}
TOY_SECONDS = {"toy_models": 166, "teacher": 10, "extract": 25, "distill": 36, "pilot": 124}
# SmolLM2-135M on 2 CPU cores (config/smollm2.yaml with its made teacher, 2026-11-30, load
# 1.4-2.2; Snakemake benchmark files, README "A real pretrained model"): max RSS and wall time.
# extract since it was batched (per-completion gradients, the bootstrap on stored gradients):
# peak RSS 4133 MB in the full smollm2.yaml run of 2026-12-02 (Snakemake benchmark file; load
# 8-15); its seconds are the 66 completions at 7.6 CPU-s each on one idle-equivalent core (the
# merged-weights gradient, benchmarked on SmolLM2 rows of 610 tokens, docs/logs/benchmarks.md) — the
# run's own wall time (2233 s) was stretched by a load of 8-15 on 2 cores.
SMOLLM2_PEAKS_MB = {"make_teacher": 6900, "teacher": 1600, "extract": 4133, "distill": 6300,
                    "pilot": 9200}
SMOLLM2_SECONDS = {"make_teacher": 264, "teacher": 59, "extract": 66 * 7.6, "distill": 204, "pilot": 597}


@pytest.mark.parametrize("stage", sorted(TOY_PEAKS_MB))
def test_toy_requests_cover_the_measured_peaks(stage):
    size = job_size(raw_config(), stage)
    assert TOY_PEAKS_MB[stage] <= size.mem_mb <= 2.5 * TOY_PEAKS_MB[stage] + 500
    assert size.mem_mb <= 2500  # the toy default fits any cluster's smallest job
    assert size.runtime * 60 >= 3 * TOY_SECONDS[stage]
    assert size.gpu == 0


@pytest.mark.parametrize("stage", sorted(SMOLLM2_SECONDS))
def test_smollm2_requests_cover_the_measured_peaks(stage):
    cfg = raw_config(REPO / "config" / "smollm2.yaml")
    size = job_size(cfg, stage)
    if stage in SMOLLM2_PEAKS_MB:
        assert SMOLLM2_PEAKS_MB[stage] <= size.mem_mb <= 2.5 * SMOLLM2_PEAKS_MB[stage] + 500
    assert size.runtime * 60 >= 2 * SMOLLM2_SECONDS[stage]


def test_threads_come_from_the_config_and_retries_scale():
    cfg = raw_config(sets=["pilot.threads=3", "vhack.threads=5"])
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
    # ablated + trained, and a router: the hooked mixture forward and the pin bank's each step
    assert pilot_priority("moe") == pilot_priority("moe_random") == 3
    for arm in ("vanilla", "erase", "random_v", "oracle_reward"):
        assert pilot_priority(arm) == 1
    assert pilot_priority("no_such_arm") == 0
    # the calibration runs and the audit gate route's pilots: they start before any pilot
    from evil_moe.cluster.resources import GATING_PRIORITY
    from evil_moe.rl.arms.registry import ARMS

    assert GATING_PRIORITY > max(pilot_priority(a) for a in ARMS)
    # the toy default's measured pilot times (README "Job sizes"): route's 50-67 s against
    # vanilla's 36-48 s, so the order matches the cost
    assert pilot_priority("route") > pilot_priority("vanilla")


def test_gpu_only_for_model_stages_on_cuda():
    cuda = raw_config(sets=["models.device=cuda"])
    for stage in ("teacher", "extract", "distill", "pilot"):
        assert job_size(cuda, stage).gpu == 1
        assert job_size(raw_config(), stage).gpu == 0  # device auto: the toy default asks none
    for stage in ("problems", "toy_models", "compare"):
        assert job_size(cuda, stage).gpu == 0


def test_real_pilot_asks_for_a_4b_models_host_memory():
    cfg = raw_config(REPO / "config" / "pilot.yaml")
    assert model_shape(cfg).params == 4022468096
    weights_mb = 4022468096 * 2 / 2**20  # bfloat16
    for stage in ("teacher", "extract", "distill", "pilot"):
        size = job_size(cfg, stage)
        assert size.gpu == 1 and size.threads == 8
        engine = 6000 + 8 * 500 if stage == "pilot" else 0  # the vLLM engine (pilot.sampler vllm)
        assert weights_mb + 3000 <= size.mem_mb - engine <= 2 * weights_mb + 5000


def test_hub_id_without_params_names_the_key():
    # an unknown hub id (Qwen/Qwen3-4B's shape is known): the CPU config sizes no GPU memory, so
    # the job size names the key; on cuda the config check does, before any job is sized
    sets = ["models.params=null", "models.student=someone/unknown-4b"]
    cfg = raw_config(REPO / "config" / "pilot.yaml", sets=[*sets, "models.device=cpu"])
    with pytest.raises(ResourceError, match="models.params"):
        job_size(cfg, "pilot")
    with pytest.raises(ConfigError, match="models.params"):
        raw_config(REPO / "config" / "pilot.yaml", sets=sets)


def test_local_model_folder_shape_from_its_config_json(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({
        "hidden_size": 576, "num_hidden_layers": 30, "intermediate_size": 1536,
        "num_attention_heads": 9, "num_key_value_heads": 3, "vocab_size": 49152,
        "tie_word_embeddings": True}))
    cfg = raw_config(sets=["models.build=none", f"models.student={tmp_path}",
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
FULL = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj", "lm_head"]


def _saved_bytes(dtype, shape, rows, prompt, completion, forward):
    """Bytes kept for the pilot loss's backward on an adapted toy Qwen3 model, counted once per
    storage, parameters and buffers excluded: what autograd saves (saved_tensors_hooks) in the
    hooked forward under Evil MoE's mixture, or in the merged forward together with the inputs
    and outputs the gradient capture records (merged_gradients(rows=...))."""
    from evil_moe.model.adapter import SVDAdapter
    from evil_moe.model.load import build_toy_model
    from evil_moe.model.logprobs import build_batch, token_logprobs

    h, layers, inter, heads, kv, hd, vocab = shape
    model = build_toy_model(_Tok(vocab), hidden=h, layers=layers, intermediate=inter, heads=heads,
                            kv_heads=kv, head_dim=hd, dtype=dtype)
    adapter = SVDAdapter.attach(model, FULL)
    with torch.no_grad():  # non-zero knobs: every wrapped weight is merged
        for p in adapter.delta_s_params():
            p.fill_(0.01)
    gen = torch.Generator().manual_seed(0)
    batch = build_batch([torch.randint(3, vocab, (prompt,), generator=gen).tolist()] * rows,
                        [torch.randint(3, vocab, (completion,), generator=gen).tolist()] * rows, 0)
    seen = {}

    def pack(x):
        st = x.untyped_storage()
        if st.data_ptr() not in fixed:
            seen[st.data_ptr()] = st.nbytes()
        return x

    if forward == "hooked":
        fixed = {t.untyped_storage().data_ptr() for t in [*model.parameters(), *model.buffers()]}
        for p in adapter.delta_s_hack_params():
            p.requires_grad_(True)
        with adapter.mixture(torch.full((rows,), 0.3, requires_grad=True)), \
                torch.autograd.graph.saved_tensors_hooks(pack, lambda x: x):
            token_logprobs(model, batch, 1.0)
        return sum(seen.values())
    with adapter.merged_gradients(rows=rows) as cap:
        fixed = {t.untyped_storage().data_ptr() for t in [*model.parameters(), *model.buffers()]}
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda x: x):
            token_logprobs(model, batch, 1.0)
        for t in (t for pairs in cap.seen.values() for xy in pairs for t in xy):
            seen[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
    return sum(seen.values())


@pytest.mark.parametrize("forward", ["hooked", "merged"])
@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
@pytest.mark.parametrize("shape", [(96, 2, 320, 3, 1, 32, 700), (160, 3, 384, 8, 2, 24, 1500)])
def test_saved_activations_per_token_match_autograd(dtype, shape, forward):
    """The memory model's per-token bytes of each forward against what the pilot's loss really
    keeps, on shapes other than those the coefficients were fitted on (q wider than hidden, one
    KV head): the marginal bytes of two more rows. The merged forward keeps more per token than
    the hooked one (the capture's inputs and outputs against the knobs' Vh x)."""
    from evil_moe.cluster.shapes import LOGIT_BYTES, ModelShape, saved_bytes_per_token

    prompt, completion = 16, 40
    dt = getattr(torch, dtype)
    extra = (_saved_bytes(dt, shape, 4, prompt, completion, forward)
             - _saved_bytes(dt, shape, 2, prompt, completion, forward))
    measured = extra / 2  # per row
    h, layers, inter, heads, kv, hd, vocab = shape
    s = ModelShape(params=1, layers=layers, hidden=h, intermediate=inter, heads=heads,
                   vocab=vocab, q_dim=heads * hd, kv_dim=kv * hd)
    model = ((prompt + completion) * saved_bytes_per_token(s, dtype, forward)
             + completion * LOGIT_BYTES * vocab)
    assert measured <= model <= 1.08 * measured, (measured, model)


def _small_student(tmp_path):
    """A made-up tied decoder: hidden 64, 2 layers, MLP 192, 4 heads and 1 KV head of 16 (q 64,
    kv 16), vocabulary 100."""
    folder = tmp_path / "student"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({
        "hidden_size": 64, "num_hidden_layers": 2, "intermediate_size": 192,
        "num_attention_heads": 4, "num_key_value_heads": 1, "head_dim": 16, "vocab_size": 100,
        "tie_word_embeddings": True}))
    return raw_config(DEFAULT, sets=[
        "models.build=none", f"models.student={folder}", "models.params=50000",
        "models.dtype=float32", "adapter.target_modules=[q_proj, down_proj, lm_head]",
        "problems.source=toy", "pilot.group=2", "pilot.prompts_per_step=3", "pilot.max_new=10",
        "pilot.micro_batch=2"])


def test_train_terms_per_arm_by_hand_on_a_small_shape(tmp_path):
    """Each arm's training terms worked out by hand on a small made-up shape (fp32, w = 4 B;
    knobs on q_proj (64x64) and down_proj (64x192) in 2 layers and the tied lm_head (100x64),
    ranks 64 each: R = 320; micro-batch 2 rows of 128 toy prompt + 10 completion tokens)."""
    from evil_moe.cluster.gpu_memory import pilot_gpu_memory, train_terms

    cfg = _small_student(tmp_path)
    logits = 2 * 10 * 100 * (4 + 4 + 4)
    # hooked (fp32: 29.5 hidden + 12.25 q + 20.125 kv + 12 intermediate per layer, + 4 hidden)
    hooked_token = 2 * (29.5 * 64 + 12.25 * 64 + 20.125 * 16 + 12 * 192) + 4 * 64  # 10852
    # merged (fp32: 27.875, 12, 19.75, 17.875)
    merged_token = 2 * (27.875 * 64 + 12 * 64 + 19.75 * 16 + 17.875 * 192) + 4 * 64  # 12856
    buffer_copies = 4 * (2 * 64 * (64 + 64) + 2 * 64 * (64 + 192) + 64 * (100 + 64))  # U, Vh
    weight_copies = 4 * (2 * 64 * 64 + 2 * 64 * 192 + 100 * 64)
    # the head's hook: its delta and the sum, 2 x 2 rows x 10 tokens x 100 x 4 B
    moe = {"logits": logits, "activations": 2 * 138 * hooked_token,
           "buffer_copies": buffer_copies, "head_delta": 2 * 2 * 10 * 100 * 4,
           "mixture": 2 * 320 * (4 + 4)}
    # the gradient of every recorded output: q_proj's and down_proj's 64 per layer on all 138
    # tokens of 2 rows, the head's 100 on the 10 completion tokens; fp32: no casts
    output_grads = 4 * 2 * (138 * 2 * (64 + 64) + 10 * 100)
    vanilla = {"logits": logits, "activations": 2 * 138 * merged_token,
               "weight_copies": weight_copies, "output_grads": output_grads, "fp32_grads": 0,
               "per_row": 0}
    assert train_terms(cfg, "moe") == pytest.approx(moe)
    assert train_terms(cfg, "moe_random") == pytest.approx(moe)
    assert train_terms(cfg, "vanilla") == pytest.approx(vanilla)
    # route keeps every row's gradient of the step: 6 rows x R x 4 B
    assert train_terms(cfg, "route") == pytest.approx({**vanilla, "per_row": 6 * 320 * 4})
    # the phases differ by the arms' terms only
    m, v = pilot_gpu_memory(cfg, "moe"), pilot_gpu_memory(cfg, "vanilla")
    assert (m.resident, m.sample, m.evaluate) == (v.resident, v.sample, v.evaluate)
    assert m.train - v.train == pytest.approx(2 * 138 * (hooked_token - merged_token)
                                              + buffer_copies + 16000 + 2 * 320 * 8
                                              - weight_copies - output_grads)
    with pytest.raises(ValueError, match="unknown arm 'nope'"):
        train_terms(cfg, "nope")


def test_moe_against_vanilla_by_the_forwards_terms_on_the_4b():
    """config/pilot.yaml (Qwen3-4B, bf16, one 1664-token row per micro-batch): moe's training
    phase differs from vanilla's by its hooked forward's terms less the merged forward's, by
    hand: the U and Vh copies of the knobs' matmuls (10.57 GB), the head hook's delta and sum and
    the rows' s against the merged weights' copies (8.04 GB), the gradients of every recorded
    output (30720 outputs per layer and token, the head's 151936 per completion token), the
    head's fp32 casts, and per token 36 x (151936 - 186944) B (the capture's inputs and outputs
    outweigh the knobs' Vh x). Vanilla needs 5.15 GB more than moe at one row, 11.25 GB at two:
    moe's hooked forward is the cheaper in memory (the CPU analogue agrees in bf16,
    benchmarks/train_memory.py, docs/logs/benchmarks.md)."""
    from evil_moe.cluster.gpu_memory import pilot_gpu_memory

    cfg = raw_config(REPO / "config" / "pilot.yaml")
    per_layer = 2 * 2560 * 6656 + 2 * 1024 * 3584 + 3 * 2560 * 12288
    buffers = 2 * (36 * per_layer + 2560 * 154496)
    merged = 2 * (36 * (2 * 4096 * 2560 + 2 * 1024 * 2560 + 3 * 9728 * 2560) + 151936 * 2560)
    rank = 36 * (4 * 2560 + 2 * 1024 + 2560) + 2560

    def diff(rows):
        hooked = buffers + 2 * rows * 1024 * 151936 * 2 + rows * rank * 6
        output_grads = 2 * rows * (1664 * 36 * 30720 + 1024 * 151936)
        head_fp32 = 4 * (rows * 1024 * (151936 + 2560) + 2560 * (151936 + 2560))
        return (rows * 1664 * 36 * (151936 - 186944) + hooked - merged - output_grads
                - head_fp32)

    moe, vanilla = pilot_gpu_memory(cfg, "moe"), pilot_gpu_memory(cfg, "vanilla")
    assert moe.train - vanilla.train == pytest.approx(diff(1))
    assert diff(1) == pytest.approx(-5.15e9, abs=0.01e9)
    two = raw_config(REPO / "config" / "pilot.yaml", sets=["pilot.micro_batch=2",
                                                            "models.gpu_mem_gb=141"])
    assert (pilot_gpu_memory(two, "moe").train - pilot_gpu_memory(two, "vanilla").train
            == pytest.approx(diff(2)))
    assert diff(2) == pytest.approx(-11.25e9, abs=0.01e9)


def test_qwen3_4b_memory_by_hand():
    """config/pilot.yaml's pieces with the HF sampler worked out by hand from Qwen3-4B's
    config.json (bf16), for vanilla (merged forward) and moe (hooked)."""
    from evil_moe.cluster.gpu_memory import pilot_gpu_memory

    cfg = raw_config(REPO / "config" / "pilot.yaml", sets=["pilot.sampler=hf", "pilot.micro_batch=2"])
    mem = pilot_gpu_memory(cfg, "vanilla")
    # U (d_out x r) + Vh (r x d_in) per Linear, r = min: q 4096x2560 -> 2560*(4096+2560);
    # k, v 1024x2560 -> 1024*3584 each; o like q; gate, up, down 9728x2560 -> 2560*12288 each;
    # lm_head 151936x2560 -> 2560*154496
    per_layer = 2 * 2560 * 6656 + 2 * 1024 * 3584 + 3 * 2560 * 12288
    buffers = 2 * (36 * per_layer + 2560 * 154496)
    rank = 36 * (4 * 2560 + 2 * 1024 + 2560) + 2560
    resident = 2 * 4_022_468_096 + buffers + 32 * rank
    assert mem.resident == pytest.approx(resident)
    # the wrapped weights' copies while merged (the tied head's merged Parameter included)
    merged = 2 * (36 * (2 * 4096 * 2560 + 2 * 1024 * 2560 + 3 * 9728 * 2560) + 151936 * 2560)
    # one 2-row micro-batch of 640 + 1024 tokens: 2 x 1664 tokens x (36 layers x per-layer bytes
    # + 4*2560 B), merged: 17*2560 + 10.5*4096 + 13.75*1024 + 8.875*9728; hooked: 18.5*2560 +
    # 8.25*4096 + 12.125*1024 + 6*9728; + the logits: 2 x 1024 x 151936 x (4 z + 4 its gradient
    # + 2 the bf16 gradient)
    acts = 2 * 1664 * (36 * (43520 + 43008 + 14080 + 86336) + 10240)
    logits = 2 * 1024 * 151936 * 10
    # merged: the gradients of every recorded output (per layer q 4096 + k, v 1024 + o 2560 +
    # gate, up 9728 + down 2560 = 30720 per token, the head's 151936 per completion token) and
    # the head's fp32 casts (output gradient and input of 2 x 1024 tokens, U and Vh)
    output_grads = 2 * 2 * (1664 * 36 * 30720 + 1024 * 151936)
    head_fp32 = 4 * (2 * 1024 * (151936 + 2560) + 2560 * (151936 + 2560))
    assert mem.train == pytest.approx(resident + merged + acts + logits + output_grads + head_fp32)
    # hooked: U/Vh copies, the head hook's delta and sum (2 x 2 x 1024 x 151936 x 2 B), each
    # row's s (fp32 and bf16)
    acts_hooked = 2 * 1664 * (36 * (47360 + 33792 + 12416 + 58368) + 10240)
    assert pilot_gpu_memory(cfg, "moe").train == pytest.approx(
        resident + buffers + 2 * 2 * 1024 * 151936 * 2 + 2 * rank * 6 + acts_hooked + logits)
    # the held-out evaluation: 8 problems x 16 samples, KV cache 2 x 1024 values x 36 layers per
    # token in bf16, the prefill's 3 x 9728 MLP values per prompt token
    rows = 8 * 16
    kv = 2 * rows * 1664 * 36 * 2 * 1024
    prefill = 2 * rows * 640 * 3 * 9728
    assert mem.evaluate == pytest.approx(resident + merged + 8 * 151936 * 2560 + kv + prefill)


@pytest.mark.parametrize("name", sorted(p.name for p in (REPO / "config").glob("*.yaml")
                                        if p.name != "schema.yaml"))
def test_every_shipped_config_fits_its_gpu(name):
    from evil_moe.cluster.gpu_memory import GPU_USABLE, check_gpu_fit

    cfg = raw_config(REPO / "config" / name)  # the config check passes
    cuda = cfg if str(cfg["models"]["device"]).startswith("cuda") else \
        raw_config(REPO / "config" / name, sets=["models.device=cuda"])
    mem = check_gpu_fit(cuda)
    assert mem is not None and mem.peak <= GPU_USABLE * cuda["models"]["gpu_mem_gb"] * 1e9
    if name == "pilot.yaml":  # the 4B pilot fits an 80 GB GPU with 15% to spare
        assert cuda["models"]["gpu_mem_gb"] == 80 and mem.peak <= 0.85 * 80e9


@pytest.mark.parametrize("sets,key,value", [
    # usable: 90% of 80 GB = 72 GB. With the vLLM engine's 20 GB the largest arm's (route's:
    # vanilla's merged forward plus every row's gradient) training needs ~66 GB at one 1664-token
    # row, ~83 GB at two (all 24 at once: ~466 GB)
    (["pilot.micro_batch=0"], "pilot.micro_batch", 1),
    # with the HF sampler: ~46 GB at one row, ~63 GB at two, ~81 GB at three
    (["pilot.sampler=hf", "pilot.micro_batch=0"], "pilot.micro_batch", 2),
    # HF's evaluation: 66 GB at 8 problems x 16 samples, + 16 x (KV 245 MB + prefill 37 MB) =
    # 4.5 GB per problem -> 9 problems fit, 10 do not
    (["pilot.sampler=hf", "pilot.micro_batch=2", "pilot.eval_chunk=16"], "pilot.eval_chunk", 9),
    # 60 GB GPU (54 usable), HF sampler: 1 row fits, 2 do not
    (["pilot.sampler=hf", "pilot.micro_batch=4", "pilot.eval_chunk=4", "models.gpu_mem_gb=60",
      "vhack.micro_batch=1"], "pilot.micro_batch", 1),
])
def test_a_pilot_that_does_not_fit_is_refused_naming_the_key(sets, key, value):
    with pytest.raises(ConfigError) as err:
        raw_config(REPO / "config" / "pilot.yaml", sets=sets)
    msg = str(err.value)
    assert "\n" not in msg and f"'{key}' to {value} or less" in msg, msg
    # the value it names fits, one more does not
    raw_config(REPO / "config" / "pilot.yaml", sets=[*sets, f"{key}={value}"])
    with pytest.raises(ConfigError):
        raw_config(REPO / "config" / "pilot.yaml", sets=[*sets, f"{key}={value + 1}"])


def test_slurm_check_refuses_a_pilot_that_does_not_fit(tmp_path):
    from click.testing import CliRunner

    from evil_moe.cli import main

    bad = tmp_path / "bad.yaml"
    bad.write_text("pilot:\n  micro_batch: 0\n")
    res = CliRunner().invoke(main, ["slurm-check", "--configfile",
                                    str(REPO / "config" / "pilot.yaml"), "--configfile", str(bad)])
    assert res.exit_code != 0
    assert "a pilot of arm route needs" in res.output, res.output
    assert "'pilot.micro_batch' to 1 or less" in res.output, res.output


def test_vllm_sampler_holds_its_share_of_the_gpu_in_every_phase():
    """pilot.sampler vllm: the engine's gpu_memory_utilization x gpu_mem_gb is added to every
    phase; sampling then costs our no-grad scoring forward's worst chunk, not HF generate's KV
    cache: one prompt's rows (the 6 of a group; 8 of a held-out problem's 16 samples), the
    logits of 1025 positions in bf16 and the fp32 z, softmax and p·z of 1024, by hand. The
    lm_head knob stays (the engine gets an untied view of the checkpoint)."""
    from evil_moe.cluster.gpu_memory import pilot_gpu_memory

    sets = ["models.gpu_mem_gb=141", "pilot.micro_batch=1", "pilot.sampler=hf"]
    hf = pilot_gpu_memory(raw_config(REPO / "config" / "pilot.yaml", sets=sets))
    vl = pilot_gpu_memory(raw_config(REPO / "config" / "pilot.yaml",
                                     sets=[*sets, "pilot.sampler=vllm",
                                           "pilot.vllm_gpu_memory_utilization=0.25"]))
    share = 0.25 * 141e9
    assert vl.train - hf.train == pytest.approx(share)
    assert vl.resident - hf.resident == pytest.approx(share)
    score = 6 * 151936 * (1025 * 2 + 1024 * 12)  # 13.07 GB; 8 rows of two prompts: up to ~28 GB
    assert vl.sample == pytest.approx(hf.sample - _hf_generate(hf) + share + score)
    assert vl.evaluate - vl.sample == pytest.approx((8 - 6) * 151936 * (1025 * 2 + 1024 * 12))


def test_the_scoring_forward_stays_inside_its_memory_model():
    """The no-grad forward that scores sampled ids (the vLLM sampler's behaviour log-probs) forms
    logits for at most ``min(FORWARD_ROWS, n)`` rows x (``max_new`` + 1) positions at a time, the
    chunk the memory model charges (gpu_memory.scoring_forward_bytes), whatever the prompts'
    lengths: its chunks hold one prompt's rows. On 09ede95 8 rows mixing a 3-token and a
    61-token prompt spanned 58 positions more than max_new (a 4B pilot: ~1,650 for 1,024,
    28 GB where 17.4 were modelled)."""
    from evil_moe.cluster import gpu_memory
    from evil_moe.model import logprobs
    from evil_moe.model.load import build_tiny
    from evil_moe.rl.policy import rollout

    assert rollout.FORWARD_ROWS == gpu_memory.FORWARD_ROWS
    model, tok = build_tiny(seed=1)
    prompts = [[5, 6, 7], list(range(10, 71)), [8, 9, 10, 11, 12]]
    seen = []
    forward = logprobs._forward_logits

    def spy(model, batch, start):
        out = forward(model, batch, start)
        seen.append(tuple(out.shape[:2]))
        return out

    logprobs._forward_logits = spy
    try:
        for n in (3, 10):
            seen.clear()
            rolls = rollout.generate(model, tok, prompts, n=n, max_new=12, temperature=1.0,
                                     seed=3, behaviour="forward")
            assert len(rolls) == 3 * n
            rows = min(rollout.FORWARD_ROWS, n)
            assert max(b for b, _ in seen) == rows
            assert max(b * k for b, k in seen) <= rows * (12 + 1), seen
    finally:
        logprobs._forward_logits = forward


def test_a_vllm_pilot_asks_for_the_engines_host_memory():
    """A pilot (and a re-evaluation) with the vLLM sampler asks for the engine and its compile
    workers on the host, by hand for config/pilot.yaml: 800 + 3000 (CUDA) + 6000 (the engine) +
    8 x 500 (Inductor's workers, one per pilot.threads) + the bf16 weights (7,672 MiB) = 21,472
    MiB, rounded up to 21,500 (11,500 with the HF sampler, the engine's 10,000 MiB left out on
    09ede95)."""
    cfg = raw_config(REPO / "config" / "pilot.yaml")
    weights = 4022468096 * 2 / 2**20
    assert job_size(cfg, "pilot").mem_mb == 21500 == -(-(800 + 3000 + 6000 + 8 * 500 + weights) // 100) * 100
    assert job_size(cfg, "reevaluate").mem_mb == 21500
    hf = raw_config(REPO / "config" / "pilot.yaml", sets=["pilot.sampler=hf"])
    assert job_size(hf, "pilot").mem_mb == 11500
    assert job_size(cfg, "extract").mem_mb == job_size(hf, "extract").mem_mb  # no engine there


def test_pilot_yaml_runs_moe_with_vllm_and_the_tied_head_knob():
    """config/pilot.yaml runs Evil MoE and its control with the vLLM sampler, the knob on
    Qwen3-4B's tied lm_head kept (the engine takes it through the untied view), and the config
    check sizes every arm: the largest pilot fits 90% of the 80 GB GPU."""
    from evil_moe.cluster.gpu_memory import GPU_USABLE, check_gpu_fit, pilot_gpu_memory_by_arm

    cfg = raw_config(REPO / "config" / "pilot.yaml")
    assert cfg["pilot"]["sampler"] == "vllm" and "lm_head" in cfg["adapter"]["target_modules"]
    assert {"moe", "moe_random", "vanilla"} <= set(cfg["pilot"]["arms"])
    by_arm = pilot_gpu_memory_by_arm(cfg)
    assert set(by_arm) == set(cfg["pilot"]["arms"])
    largest = check_gpu_fit(cfg)
    assert largest.peak == max(m.peak for m in by_arm.values()) <= GPU_USABLE * 80e9
    assert by_arm["moe"].train < by_arm["vanilla"].train  # the hooked forward keeps less


def _hf_generate(mem):
    """HF sampling's generate share of config/pilot.yaml's sample phase (24 rows: scores above
    2 GiB, so the larger of KV cache + prefill and the 8-row scoring forward)."""
    kv = 2 * 24 * 1664 * 36 * 2 * 1024
    prefill = 2 * 24 * 640 * 3 * 9728
    return max(kv + prefill, 8 * 1024 * 151936 * 14)


# ---- models.device auto: a GPU is asked for where the jobs would find one ------------------------
def test_gpu_for_auto_where_the_jobs_run(tmp_path, monkeypatch):
    import subprocess

    from evil_moe.cluster import resources
    from evil_moe.cluster.resources import gpu_for_auto, resolve_auto_device

    def sinfo(out, rc=0):
        return lambda cmd, **kw: subprocess.CompletedProcess(cmd, rc, out, "")

    site = sinfo("cpu* (null)\ngpu gpu:a100:4(S:0-1)\n")
    assert gpu_for_auto("cluster", ["gpu"], run=site)
    assert gpu_for_auto("cluster", ["cpu", "gpu"], run=site)
    assert not gpu_for_auto("cluster", ["cpu"], run=site)
    assert not gpu_for_auto("cluster", [], run=site)  # the default partition (cpu*) has none
    assert gpu_for_auto("cluster", [], run=sinfo("gpu* gpu:2\ncpu (null)\n"))
    assert not gpu_for_auto("cluster", ["gpu"], run=sinfo("", rc=1))

    def missing(cmd, **kw):
        raise FileNotFoundError(cmd[0])

    assert not gpu_for_auto("cluster", ["gpu"], run=missing)  # no Slurm commands: no GPU
    # inside a Slurm job: the GPU the job was given (SLURM_JOB_GPUS lists indices, 0 is one)
    assert gpu_for_auto("job", environ={"SLURM_JOB_GPUS": "0"})
    assert gpu_for_auto("job", environ={"SLURM_GPUS_ON_NODE": "1"})
    assert not gpu_for_auto("job", environ={"SLURM_GPUS_ON_NODE": "0"})
    assert not gpu_for_auto("job", environ={})
    # this machine: a GPU folder of the NVIDIA driver, and a torch that is not a +cpu build
    monkeypatch.setattr(resources, "NVIDIA_GPUS", tmp_path / "gpus")
    assert not gpu_for_auto("local")
    (tmp_path / "gpus" / "0000:3b:00.0").mkdir(parents=True)
    from importlib import metadata

    assert gpu_for_auto("local") is (not metadata.version("torch").endswith("+cpu"))
    with pytest.raises(ValueError):
        gpu_for_auto("laptop")
    # the sized config: auto becomes cuda or cpu, any other device is kept
    cfg = raw_config()
    assert resolve_auto_device(cfg, True)["models"]["device"] == "cuda"
    assert resolve_auto_device(cfg, False)["models"]["device"] == "cpu"
    assert cfg["models"]["device"] == "auto"  # a copy
    cpu = raw_config(sets=["models.device=cpu"])
    assert resolve_auto_device(cpu, True)["models"]["device"] == "cpu"
    for stage in ("teacher", "extract", "distill", "pilot"):
        assert job_size(resolve_auto_device(cfg, True), stage).gpu == 1
        assert job_size(resolve_auto_device(cfg, False), stage).gpu == 0


def test_qr_chunk_constant_is_the_stacks():
    from evil_moe.cluster.extract_cost import EXTRACT_QR_CHUNK_BYTES
    from evil_moe.rl.vhack.stack import QR_CHUNK_BYTES

    assert EXTRACT_QR_CHUNK_BYTES == QR_CHUNK_BYTES


SHIPPED = sorted(p.name for p in (REPO / "config").glob("*.yaml") if p.name != "schema.yaml")


@pytest.mark.parametrize("name", SHIPPED)
def test_every_shipped_config_sizes_every_job_for_its_machine(name):
    """Every job a shipped configuration plans gets a size, and fits the machine it is for: a
    CPU configuration (the toy default, its overlays, SmolLM2) the 2-core, 24 GB development
    machine (at most 2 CPUs and 23 GB per job, both with device auto resolved either way);
    config/pilot.yaml a GPU node (one GPU per model job; its GPU memory:
    test_every_shipped_config_fits_its_gpu). Each job's request covers its own model: the memory
    is the model's peak and the time three times its seconds."""
    from evil_moe.cluster.resources import MIN_RUNTIME, resolve_auto_device
    from evil_moe.cluster.shapes import on_gpu
    from evil_moe.cluster.plan import planned_rules
    from evil_moe.cluster.stages import RULE_STAGE

    cfg = raw_config(REPO / "config" / name)
    rules = planned_rules(cfg)  # the device does not change which rules a run submits
    for gpu in (False, True):
        sized = resolve_auto_device(cfg, gpu)
        for rule in rules:
            stage = RULE_STAGE[rule]
            size = job_size(sized, stage)
            assert size.runtime >= max(MIN_RUNTIME, 3 * size.seconds / 60 - 1), (name, rule)
            if on_gpu(sized):
                assert size.gpu == (stage in ("make_teacher", "teacher", "extract", "distill",
                                              "pilot", "reevaluate")), (name, rule)
                assert size.mem_mb <= 64 * 1024, (name, rule, size)
            else:
                assert size.threads <= 2 and size.mem_mb <= 23 * 1024, (name, rule, size)


def test_extract_work_from_the_config():
    """What the extract job does, worked out by hand. config/smollm2.yaml: templates, 12
    training problems of which 9 are in the three known modes: 12 hack-clean pairs (max_pairs),
    9 clean-clean (one per such problem), 12 hack-hack (three per problem, at most max_pairs) —
    the 66 completions its measured run formed (docs/real-model.md). config/pilot.yaml: 40
    training problems, 20 in the two known modes, 8 rollouts each: at most min(64, 20 x 4) pairs
    of each kind; 201 replicates x (the signal, the clean-clean V, 2 left-out modes, the curve
    at 8, 16 and all 32 extraction pairs)."""
    from evil_moe.cluster.extract_cost import extract_work

    w = extract_work(raw_config(REPO / "config" / "smollm2.yaml"))
    assert w.pairs == (12, 9, 12) and w.completions == 66
    assert (w.row_tokens, w.longest_row, w.longest_completion) == (640 + 165, 980 + 1140, 1140)
    assert w.extraction_pairs == 6 and w.extractions == 201 * (1 + 1 + 3 + 1) and w.width == 66
    w = extract_work(raw_config(REPO / "config" / "pilot.yaml"))
    assert w.pairs == (64, 64, 64) and w.completions == 384
    assert (w.row_tokens, w.longest_row) == (640 + 1024, 980 + 1024)
    assert w.extractions == 201 * (1 + 1 + 2 + 3) and w.width == 384
    # the bootstrap adds extractions, never memory; the micro-batch adds memory, never work
    cfg = raw_config(REPO / "config" / "smollm2.yaml")
    more = raw_config(REPO / "config" / "smollm2.yaml", sets=["vhack.bootstrap=400"])
    assert job_size(more, "extract").mem_mb == job_size(cfg, "extract").mem_mb
    assert job_size(more, "extract").seconds > job_size(cfg, "extract").seconds
    wide = raw_config(REPO / "config" / "smollm2.yaml", sets=["vhack.micro_batch=4"])
    assert job_size(wide, "extract").mem_mb > job_size(cfg, "extract").mem_mb
    assert job_size(wide, "extract").seconds == job_size(cfg, "extract").seconds


def test_extract_gpu_memory_names_the_micro_batch():
    """config/pilot.yaml's extract job on an 80 GB GPU (72 GB usable): 2 rows of up to 2004
    tokens fit (shipped), 3 do not; the config check names the largest that fits."""
    from evil_moe.cluster.gpu_memory import extract_gpu_memory

    cfg = raw_config(REPO / "config" / "pilot.yaml")
    # by hand (Qwen3-4B, bf16): weights; U and Vh of every wrapped Linear; the wrapped weights'
    # copies while merged; delta_s, delta_s_hack; 2 rows of 2004 tokens x 36 layers x (17*2560 +
    # 10.5*4096 + 13.75*1024 + 8.875*9728) B (the merged forward) + 4*2560 B per token, and the
    # 1024-token completion's logits x (4 + 4 + 2) B; 384 stored completion gradients in fp32
    per_layer = 2 * 2560 * 6656 + 2 * 1024 * 3584 + 3 * 2560 * 12288
    buffers = 2 * (36 * per_layer + 2560 * 154496)
    merged = 2 * (36 * (2 * 4096 * 2560 + 2 * 1024 * 2560 + 3 * 9728 * 2560) + 151936 * 2560)
    rank = 36 * (4 * 2560 + 2 * 1024 + 2560) + 2560
    token = 36 * (43520 + 43008 + 14080 + 86336) + 10240
    rows = 2 * (2004 * token + 1024 * 151936 * 10)
    # the capture's backward: every recorded output's gradient (30720 per layer and token, the
    # head's 151936 per completion token) and the head's fp32 casts
    grads = 2 * 2 * (2004 * 36 * 30720 + 1024 * 151936) + 4 * (
        2 * 1024 * (151936 + 2560) + 2560 * (151936 + 2560))
    want = 2 * 4_022_468_096 + buffers + merged + 8 * rank + rows + grads + 4 * 384 * rank
    assert extract_gpu_memory(cfg) == pytest.approx(want)  # ~70 GB
    assert extract_gpu_memory(cfg) <= 0.9 * 80e9 < extract_gpu_memory(cfg, micro_batch=3)
    with pytest.raises(ConfigError, match=r"set 'vhack.micro_batch' to 2 or less"):
        raw_config(REPO / "config" / "pilot.yaml", sets=["vhack.micro_batch=3"])
