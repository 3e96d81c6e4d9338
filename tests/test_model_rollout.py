"""Batched, seeded sampling with recorded behaviour log-probs; ids never re-tokenised."""

import pytest
import torch

from evil_moe.model.adapter import DEFAULT_TARGETS, SVDAdapter
from evil_moe.model.load import build_tiny
from evil_moe.model.logprobs import build_batch, token_logprobs
from evil_moe.rl.rollout import chat_prompt_ids, generate


@pytest.fixture(scope="module")
def toy():
    return build_tiny(seed=2)


def _prompts(tok):
    return [chat_prompt_ids(tok, [{"role": "user", "content": "Write add(a, b)."}]),
            chat_prompt_ids(tok, [{"role": "user", "content": "class Solution"}])]


def test_seeded_one_call_prompt_major(toy, monkeypatch):
    model, tok = toy
    calls = []
    orig = model.generate
    monkeypatch.setattr(model, "generate", lambda *a, **k: calls.append(1) or orig(*a, **k))
    P = _prompts(tok)
    a = generate(model, tok, P, n=3, max_new=12, temperature=1.0, seed=7)
    b = generate(model, tok, P, n=3, max_new=12, temperature=1.0, seed=7)
    c = generate(model, tok, P, n=3, max_new=12, temperature=1.0, seed=8)
    assert len(calls) == 3  # one generate call per batch of P × n
    assert len(a) == 6 and [r.prompt_index for r in a] == [0, 0, 0, 1, 1, 1]
    assert [r.sample_index for r in a] == [0, 1, 2] * 2
    assert all(r.prompt_ids == P[r.prompt_index] for r in a)
    assert [r.completion_ids for r in a] == [r.completion_ids for r in b]
    assert [r.completion_ids for r in a] != [r.completion_ids for r in c]


def test_eos_cut_and_truncation(toy):
    model, tok = toy
    eos = tok.eos_token_id
    # bias the model towards eos so that some samples stop early
    m2, _ = build_tiny(seed=2)
    with torch.no_grad():
        m2.lm_head.weight[eos] *= 0  # tied: also zeroes the eos embedding, harmless here
        m2.model.norm.weight.fill_(1.0)
    rs = generate(m2, tok, _prompts(tok), n=8, max_new=6, temperature=3.0, seed=0)
    for r in rs:
        assert len(r.completion_ids) <= 6
        assert len(r.behaviour_logp) == len(r.completion_ids) == len(r.entropy)
        if eos in r.completion_ids:
            assert r.completion_ids.index(eos) == len(r.completion_ids) - 1 and not r.truncated
        else:
            assert r.truncated and len(r.completion_ids) == 6
        assert r.text == tok.decode(r.completion_ids, skip_special_tokens=True)


def test_behaviour_logp_matches_a_forward(toy):
    model, tok = toy
    rs = generate(model, tok, _prompts(tok), n=4, max_new=16, temperature=0.8, seed=1)
    b = build_batch([r.prompt_ids for r in rs], [r.completion_ids for r in rs], tok.pad_token_id)
    with torch.no_grad():
        lp = token_logprobs(model, b, 0.8)
    rec = b.align([r.behaviour_logp for r in rs])
    assert torch.allclose(lp, rec, atol=2e-5)
    assert (rec[b.completion_mask] < 0).all()
    # the forward path (for big vocabularies) gives the same samples and log-probs
    fw = generate(model, tok, _prompts(tok), n=4, max_new=16, temperature=0.8, seed=1, behaviour="forward")
    assert [r.completion_ids for r in fw] == [r.completion_ids for r in rs]
    for a, c in zip(fw, rs):
        assert torch.allclose(a.behaviour_logp, c.behaviour_logp, atol=2e-5)
        assert torch.allclose(a.entropy, c.entropy, atol=2e-5)
    with pytest.raises(ValueError):
        generate(model, tok, _prompts(tok), n=1, max_new=4, behaviour="psychic")


def test_adapter_merged_sampling_matches_hooked(toy):
    _, tok = toy
    model, _ = build_tiny(seed=2)
    ad = SVDAdapter.attach(model, list(DEFAULT_TARGETS) + ["lm_head"])
    with torch.no_grad():
        for p in ad.delta_s_params():
            p.normal_(0, 0.3, generator=torch.Generator().manual_seed(0))
    fast = generate(model, tok, _prompts(tok), n=3, max_new=12, seed=4, adapter=ad)
    slow = generate(model, tok, _prompts(tok), n=3, max_new=12, seed=4)  # hooks, no merge
    assert [r.completion_ids for r in fast] == [r.completion_ids for r in slow]
    for f, s in zip(fast, slow):
        assert torch.allclose(f.behaviour_logp, s.behaviour_logp, atol=1e-5)
    with ad.zeroed():
        base = generate(model, tok, _prompts(tok), n=3, max_new=12, seed=4, adapter=ad)
    assert [r.completion_ids for r in base] != [r.completion_ids for r in fast]


def test_completion_ids_are_generated_ids_not_retokenised(toy):
    """Joint tokenisation of prompt+completion text differs from the generated ids, so the
    training batch must use the ids (the sampler can emit non-canonical token splits)."""
    model, tok = toy
    rs = generate(model, tok, _prompts(tok), n=8, max_new=24, temperature=1.5, seed=3)
    differs = 0
    for r in rs:
        joint = tok.encode(tok.decode(r.prompt_ids + r.completion_ids), add_special_tokens=False)
        differs += joint != r.prompt_ids + r.completion_ids
        b = build_batch([r.prompt_ids], [r.completion_ids], tok.pad_token_id)
        n = len(r.prompt_ids) + len(r.completion_ids)
        assert b.input_ids[0, :n].tolist() == r.prompt_ids + r.completion_ids
    assert differs > 0
    # a deterministic instance: two single-character tokens that BPE would merge
    merged = [t for t, i in tok.get_vocab().items() if len(t) == 2 and t.isalpha()]
    piece = merged[0]
    split = [tok.convert_tokens_to_ids(piece[0]), tok.convert_tokens_to_ids(piece[1])]
    assert tok.encode(tok.decode(split), add_special_tokens=False) != split
