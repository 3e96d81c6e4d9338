"""pilot.sampler vllm (evil_moe/rl/policy/vllm_sampler.py): the merged δS weights reach the engine after each
change and for each view, the engine's log-probs are stored as the sampler's while the behaviour
log-probs stay ours, and stale engine weights show up in the sampler gap.

Without vLLM (it does not install against this project's torch/transformers: docs/gpu.md) the
engine is a stand-in with vLLM's surface (its own copy of the model, ``load_weights`` by name,
per-request seeds, processed log-probs); the real engine is tested where vLLM imports.
"""

from __future__ import annotations

import copy
import os
from types import SimpleNamespace

import pytest
import torch

from evil_moe.model.adapter import SVDAdapter
from evil_moe.model.load import build_toy_model
from evil_moe.rl.policy.rollout import generate
from evil_moe.rl.policy.vllm_sampler import VLLMSampler, vllm_import_error

VOCAB = 60


class Tok:
    eos_token_id, pad_token_id, bos_token_id = 2, 0, None

    def __len__(self):
        return VOCAB

    def decode(self, ids, skip_special_tokens=True):
        return " ".join(map(str, ids))


class EngineModel(torch.nn.Module):
    """The engine's own copy of the weights (no adapter hooks), loaded by parameter name; like
    vLLM's models (Qwen3ForCausalLM.load_weights), a tied model skips ``lm_head.*``."""

    def __init__(self, model, copy_model=True):
        super().__init__()
        self.inner = copy.deepcopy(model) if copy_model else model
        for m in self.inner.modules():
            m._forward_hooks.clear()
        self.loads = 0

    def named_parameters(self, *args, **kwargs):  # vLLM's names: the checkpoint's
        return self.inner.named_parameters(*args, **kwargs)

    def load_weights(self, weights):
        self.loads += 1
        tied = self.inner.config.tie_word_embeddings
        for name, t in weights:
            if not (tied and name.startswith("lm_head.")):
                self.inner.get_parameter(name).data.copy_(t)


class FakeLLM:
    """vllm.LLM's surface used by VLLMSampler: generate(requests, params) -> outputs with
    token_ids and per-token {id: Logprob}; the weights it samples from are its own copy (or, with
    ``copy_model=False``, the model given: one loaded from a checkpoint folder)."""

    def __init__(self, model, tok, copy_model=True):
        self.model = EngineModel(model, copy_model)
        self.tok = tok
        worker = SimpleNamespace(model_runner=SimpleNamespace(model=self.model))
        self.llm_engine = SimpleNamespace(model_executor=SimpleNamespace(
            driver_worker=SimpleNamespace(worker=worker)))

    def generate(self, reqs, params, use_tqdm=False):
        outs = []
        for ids, sp in zip(reqs, params):
            rolls = generate(self.model.inner, self.tok, [ids], n=sp["n"], max_new=sp["max_tokens"],
                             temperature=sp["temperature"], top_p=sp["top_p"], seed=sp["seed"],
                             behaviour="generate")
            outs.append(SimpleNamespace(outputs=[SimpleNamespace(
                index=k, token_ids=r.completion_ids,
                logprobs=[{t: SimpleNamespace(logprob=float(lp))}
                          for t, lp in zip(r.completion_ids, r.sampler_logp)])
                for k, r in enumerate(rolls)]))
        return outs


class FakeSampler(VLLMSampler):
    def _sampling_params(self, *, n, max_new, temperature, top_p, seed, eos):
        return {"n": n, "max_tokens": max_new, "temperature": temperature, "top_p": top_p,
                "seed": seed}

    def _prompt(self, ids):
        return list(ids)


def _world(targets=("q_proj", "down_proj")):
    model = build_toy_model(Tok(), hidden=32, layers=2, intermediate=64, heads=2, kv_heads=1)
    adapter = SVDAdapter.attach(model, list(targets))
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in adapter.delta_s_params():
            p.copy_(0.5 * torch.randn(p.shape, generator=gen))
    return model, adapter


def _gap(rolls):
    return max(float((r.behaviour_logp - r.sampler_logp).abs().max()) for r in rolls
               if len(r.completion_ids))


PROMPTS = [[5, 6, 7, 8], [9, 10, 11]]


def test_merged_weights_pushed_on_change_and_per_view_and_logprobs_agree():
    model, adapter = _world()
    engine = FakeSampler(FakeLLM(model, Tok()), adapter)
    kw = dict(n=3, max_new=12, temperature=1.0, top_p=1.0, adapter=adapter, engine=engine)
    rolls = generate(model, Tok(), PROMPTS, seed=1, **kw)
    assert engine.pushes == 1 and len(rolls) == 6
    # behaviour log-probs are our forward's, the sampler's the engine's: equal weights, equal
    # numbers (fp32 toy: KV-cache vs full forward noise only)
    assert _gap(rolls) < 1e-4
    generate(model, Tok(), PROMPTS, seed=2, **kw)
    assert engine.pushes == 1  # nothing changed: no push
    with torch.no_grad():  # an optimiser step changes δS in place
        for p in adapter.delta_s_params():
            p.add_(0.3)
    rolls = generate(model, Tok(), PROMPTS, seed=3, **kw)
    assert engine.pushes == 2 and _gap(rolls) < 1e-4
    with torch.no_grad():
        for p in adapter.delta_s_hack_params():
            p.add_(0.4)
    rolls = generate(model, Tok(), PROMPTS, seed=3, **kw)
    assert engine.pushes == 3 and _gap(rolls) < 1e-4
    with adapter.ablated():  # the deploy view (δS_hack off): another push
        rolls = generate(model, Tok(), PROMPTS, seed=3, **kw)
        assert engine.pushes == 4 and _gap(rolls) < 1e-4
    # the adapter itself is left as it was (the push merges and restores)
    assert adapter.mode == "full" and not adapter._bypass


def test_stale_engine_weights_show_in_the_sampler_gap():
    model, adapter = _world()
    engine = FakeSampler(FakeLLM(model, Tok()), adapter)
    kw = dict(n=3, max_new=12, temperature=1.0, top_p=1.0, adapter=adapter, engine=engine)
    generate(model, Tok(), PROMPTS, seed=1, **kw)
    engine.sync = lambda *a, **k: False  # a push that never happens
    with torch.no_grad():
        for p in adapter.delta_s_params():
            p.mul_(-1.0)
    rolls = generate(model, Tok(), PROMPTS, seed=1, **kw)
    assert _gap(rolls) > 1e-2


def test_same_seed_same_samples_and_eos_cut():
    model, adapter = _world()
    engine = FakeSampler(FakeLLM(model, Tok()), adapter)
    kw = dict(n=2, max_new=30, temperature=1.0, top_p=1.0, adapter=adapter, engine=engine)
    a = generate(model, Tok(), PROMPTS, seed=4, **kw)
    b = generate(model, Tok(), PROMPTS, seed=4, **kw)
    assert [r.completion_ids for r in a] == [r.completion_ids for r in b]
    for r in a:  # cut after the first eos, eos kept; truncated only without one
        ids = r.completion_ids
        assert (2 in ids) != r.truncated
        if 2 in ids:
            assert ids.index(2) == len(ids) - 1


def test_tied_engine_head_is_refused_at_the_first_push_naming_the_key():
    """An engine that kept the tied head (built from the original checkpoint) would drop the
    merged head: the first push refuses it, naming adapter.target_modules and the untied view."""
    model, adapter = _world(("q_proj", "lm_head"))
    engine = FakeSampler(FakeLLM(model, Tok()), adapter)
    with pytest.raises(ValueError, match=r"tied to \['model.embed_tokens.weight'\].*"
                                         r"untied view.*'adapter.target_modules'"):
        generate(model, Tok(), PROMPTS, n=2, max_new=4, temperature=1.0, top_p=1.0, seed=1,
                 adapter=adapter, engine=engine)
    assert engine.pushes == 0


@pytest.mark.parametrize("shard", [None, "20KB"])
def test_untied_view_takes_the_merged_tied_head_and_the_draws_are_the_policys(tmp_path, shard):
    """A knob on the toy's tied lm_head (the 4B student's case): the engine built from the untied
    view of the saved student holds, after a push, exactly the merged policy's weights (the head
    W_E + U diag(s) Vh, the input embedding W_E unchanged, every wrapped Linear), and the tokens it
    draws carry our behaviour log-probs to float noise; a missed head push shows in the gap.
    Checkpoints in one file (an index is written) and sharded (the index is extended)."""
    from transformers import AutoModelForCausalLM

    from evil_moe.rl.policy.vllm_sampler import HEAD_SHARD, INDEX, untied_checkpoint

    model, adapter = _world(("q_proj", "down_proj", "lm_head"))
    with torch.no_grad():
        adapter.modules_["lm_head"].delta_s.copy_(
            torch.randn(adapter.r["lm_head"], generator=torch.Generator().manual_seed(1)))
    assert adapter.shared_weight_names() == ["lm_head"] and model.config.tie_word_embeddings
    base_embed = model.get_input_embeddings().weight.detach().clone()
    kw = {} if shard is None else {"max_shard_size": shard}
    model.save_pretrained(tmp_path / "student", **kw)
    assert (tmp_path / "student" / INDEX).is_file() == (shard is not None)
    view = untied_checkpoint(tmp_path / "student", tmp_path / "view",
                             {"lm_head.weight": adapter._linears["lm_head"].weight.data})
    assert (view / HEAD_SHARD).is_file() and (view / INDEX).is_file()
    inner = AutoModelForCausalLM.from_pretrained(view, dtype=torch.float32)
    assert not inner.config.tie_word_embeddings
    assert inner.lm_head.weight.data_ptr() != inner.get_input_embeddings().weight.data_ptr()
    assert torch.equal(inner.lm_head.weight, base_embed)  # untied, equal to the embedding
    engine = FakeSampler(FakeLLM(inner, Tok(), copy_model=False), adapter)
    assert engine.sync(model)
    with adapter.merged():  # the merged policy: its head a new Parameter, the embedding kept
        want = {n: p.detach().clone() for n, p in model.named_parameters(remove_duplicate=False)}
    got = dict(inner.named_parameters(remove_duplicate=False))
    assert set(got) == set(want)
    for name, p in got.items():
        assert torch.equal(p, want[name]), name
    assert not torch.equal(want["lm_head.weight"], base_embed)  # the head knob is not zero
    assert torch.equal(got["model.embed_tokens.weight"], base_embed)
    kw = dict(n=3, max_new=12, temperature=1.0, top_p=1.0, adapter=adapter, engine=engine)
    rolls = generate(model, Tok(), PROMPTS, seed=5, **kw)
    assert engine.pushes == 1 and _gap(rolls) < 1e-4
    with torch.no_grad():  # the engine's head reverted to the embedding: a head push missed
        inner.lm_head.weight.copy_(base_embed)
    engine.sync = lambda *a, **k: False
    assert _gap(generate(model, Tok(), PROMPTS, seed=5, **kw)) > 1e-2


def test_untied_view_names_a_folder_without_weights(tmp_path):
    from evil_moe.rl.policy.vllm_sampler import untied_checkpoint

    (tmp_path / "student").mkdir()
    (tmp_path / "student" / "config.json").write_text("{}")
    with pytest.raises(FileNotFoundError, match="no \\*.safetensors in .*student"):
        untied_checkpoint(tmp_path / "student", tmp_path / "view", {})


def test_config_without_vllm_names_the_extra(tmp_path):
    from evil_moe.config import load_config
    from evil_moe.rl.policy.vllm_sampler import VLLMUnavailable
    from workflow_util import REPO

    if vllm_import_error() is None:
        pytest.skip("vLLM imports here")
    cfg = load_config([REPO / "config" / "config.yaml"], ["pilot.sampler=vllm"])
    with pytest.raises(VLLMUnavailable, match=r"does not import in this environment .*`make gpu-env`"):
        VLLMSampler.from_config(str(tmp_path), cfg, None)


@pytest.mark.skipif(vllm_import_error() is not None,
                    reason=f"vLLM does not import here ({vllm_import_error()}); docs/gpu.md")
def test_real_vllm_engine_agrees_with_our_forward(tmp_path):
    """On a GPU machine with the extra installed: the toy model saved, loaded by vLLM from its
    untied view (the toy's lm_head is tied and carries a knob), δS pushed; the sampler gap stays
    at float noise."""
    from evil_moe.config import load_config
    from workflow_util import REPO

    model, adapter = _world(("q_proj", "down_proj", "lm_head"))
    with torch.no_grad():
        adapter.modules_["lm_head"].delta_s.fill_(0.5)
    model.save_pretrained(tmp_path)
    cfg = load_config([REPO / "config" / "config.yaml"],
                      ["pilot.sampler=vllm", "pilot.vllm_gpu_memory_utilization=0.2"])
    engine = VLLMSampler.from_config(str(tmp_path), cfg, adapter)
    rolls = generate(model, Tok(), PROMPTS, n=3, max_new=12, temperature=1.0, top_p=1.0, seed=1,
                     adapter=adapter, engine=engine)
    assert engine.pushes == 1 and engine.view is not None and _gap(rolls) < 1e-3


class RecordingLLM:
    """vllm.LLM's ``generate`` that records each request's seed and ``n`` and returns one
    token per completion; the seeds a request's completions draw with follow vLLM's rule for
    ``n > 1`` (``ParentRequest.get_child_sampling_params``: child ``j`` of a request seeded
    ``s`` is seeded ``s + j``)."""

    def __init__(self):
        self.seeds: list[int] = []

    def generate(self, reqs, params, use_tqdm=False):
        outs = []
        for sp in params:
            n, seed = sp["n"], sp["seed"]
            self.seeds += [seed + j for j in range(n)] if n > 1 else [seed]
            outs.append(SimpleNamespace(outputs=[SimpleNamespace(index=j, token_ids=[3, 2], logprobs=None)
                                                 for j in range(n)]))
        return outs


def test_no_two_completions_of_a_pilot_share_an_engine_seed():
    """Every completion a config/pilot.yaml pilot samples with the engine (each training step's
    prompts x group, each held-out chunk's problems x samples) draws with its own seed: none of
    a pilot's 20 x 4 x 6 + 40 x 16 = 1,120 completions' seeds collide (the bundled 80 problems,
    half held out, in chunks of 8), for each of its seeds. On 09ede95 prompt i was seeded
    seed + i and its n samples seed + i + j (vLLM's child seeds): prompt 0's sample 1 and
    prompt 1's sample 0 drew alike, and step s's prompt 1 alike step s + 1's prompt 0."""
    from evil_moe.checks import load_run_config
    from evil_moe.cluster.shapes import n_problems
    from evil_moe.rl.trainer.evaluation import heldout_seed
    from evil_moe.rl.trainer.trainer import training_seed
    from workflow_util import REPO

    cfg = load_run_config([REPO / "config" / "config.yaml", REPO / "config" / "pilot.yaml"])
    pc = cfg.pilot
    kw = dict(max_new=4, temperature=1.0, top_p=1.0, eos=[2])
    heldout = max(1, round(n_problems(cfg.raw) * cfg.problems.heldout_frac))
    for seed in pc.seeds:
        llm = RecordingLLM()
        engine = FakeSampler(llm, None)
        for step in range(pc.steps):
            engine.sample([[5, 6]] * pc.prompts_per_step, n=pc.group, seed=training_seed(seed, step), **kw)
        for c0 in range(0, heldout, pc.eval_chunk):
            chunk = min(pc.eval_chunk, heldout - c0)
            engine.sample([[5, 6]] * chunk, n=pc.heldout_samples, seed=heldout_seed(seed, c0), **kw)
        assert len(llm.seeds) == 20 * 4 * 6 + 40 * 16
        assert len(set(llm.seeds)) == len(llm.seeds), seed
        assert all(0 <= s < 2**63 for s in llm.seeds)


def test_engine_is_built_without_a_tokenizer_on_a_free_port(tmp_path, monkeypatch):
    """The colocated engine is built with ``skip_tokenizer_init`` (the prompts are ids, the
    completions are decoded with our tokenizer: a student folder without tokenizer files, the
    real-engine test's, loads) and with a ``MASTER_PORT`` nobody listens on, not a fixed one
    (two pilots on one node: EADDRINUSE, huggingface/trl#3979); a port the user set is kept,
    ``0`` and ``auto`` are replaced. Inductor's compile workers are the pilot's threads. A stand-in
    ``vllm`` module records what ``LLM`` was given."""
    import socket
    import sys
    import types

    from evil_moe.config import load_config
    from workflow_util import REPO

    built = {}
    fake = types.ModuleType("vllm")
    fake.LLM = lambda **kw: built.update(kw) or SimpleNamespace()
    monkeypatch.setitem(sys.modules, "vllm", fake)
    for key in ("MASTER_PORT", "TORCHINDUCTOR_COMPILE_THREADS", "RANK", "LOCAL_RANK", "WORLD_SIZE",
                "MASTER_ADDR", "VLLM_ENABLE_V1_MULTIPROCESSING"):
        monkeypatch.delenv(key, raising=False)
    cfg = load_config([REPO / "config" / "config.yaml"], ["pilot.sampler=vllm", "pilot.threads=3"])
    engine = VLLMSampler.from_config(str(tmp_path), cfg, None)
    assert built["skip_tokenizer_init"] is True and engine.detokenize is False
    port = int(os.environ["MASTER_PORT"])
    assert port != 29517
    with socket.socket() as s:  # nobody listens there: it binds
        s.bind(("127.0.0.1", port))
    assert os.environ["TORCHINDUCTOR_COMPILE_THREADS"] == "3"
    monkeypatch.setenv("MASTER_PORT", "auto")
    VLLMSampler.from_config(str(tmp_path), cfg, None)
    assert os.environ["MASTER_PORT"].isdigit()
    monkeypatch.setenv("MASTER_PORT", "41234")
    VLLMSampler.from_config(str(tmp_path), cfg, None)
    assert os.environ["MASTER_PORT"] == "41234"
