"""Batched, seeded sampling with recorded behaviour log-probs; ids never re-tokenised."""

import pytest
import torch

from evil_moe.model.adapter import DEFAULT_TARGETS, SVDAdapter
from evil_moe.model.load import build_tiny
from evil_moe.model.logprobs import build_batch, token_logprobs
from evil_moe.rl.policy.rollout import chat_prompt_ids, generate


@pytest.fixture(scope="module")
def toy():
    return build_tiny(seed=2)


def _prompts(tok):
    return [chat_prompt_ids(tok, [{"role": "user", "content": "Write add(a, b)."}]),
            chat_prompt_ids(tok, [{"role": "user", "content": "class Solution"}])]


def test_seeded_one_call_prompt_major(toy):
    model, tok = toy
    prefills = []  # the batch shape of every forward over more than one position
    h = model.register_forward_pre_hook(
        lambda m, a, k: prefills.append(tuple(k["input_ids"].shape)) if k["input_ids"].shape[1] > 1 else None,
        with_kwargs=True)
    P = _prompts(tok)
    try:
        a = generate(model, tok, P, n=3, max_new=12, temperature=1.0, seed=7)
        b = generate(model, tok, P, n=3, max_new=12, temperature=1.0, seed=7)
        c = generate(model, tok, P, n=3, max_new=12, temperature=1.0, seed=8)
    finally:
        h.remove()
    # one batched prefill per call, of the 2 distinct prompts (not of the P × n rows)
    assert prefills == [(2, max(map(len, P)))] * 3
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


def test_splitmix64_stream_and_uniforms():
    """row_uniforms is SplitMix64's stream: seeded with 0, its first two outputs are
    0xE220A8397B1DCDAF and 0x6E789E6AA1B965F4 (the reference splitmix64.c, Vigna); the uniforms
    are those outputs' top 53 bits / 2**53, and over many keys they are uniform on [0, 1)."""
    import numpy as np

    from evil_moe.rl.policy.rollout import row_keys, row_uniforms

    zero = np.zeros(1, dtype=np.uint64)
    assert row_uniforms(zero, 0)[0] == (0xE220A8397B1DCDAF >> 11) / 2**53
    assert row_uniforms(zero, 1)[0] == (0x6E789E6AA1B965F4 >> 11) / 2**53
    keys = row_keys(3, np.repeat(np.arange(100), 100), np.tile(np.arange(100), 100))
    assert len(set(keys.tolist())) == 10_000  # every (prompt, sample) its own key
    u = np.stack([row_uniforms(keys, t) for t in range(4)])  # (4, 10000)
    assert ((u >= 0) & (u < 1)).all()
    se = (1 / 12 / u.size) ** 0.5
    assert abs(u.mean() - 0.5) < 5 * se
    assert abs(np.corrcoef(u[0], u[1])[0, 1]) < 5 / 100  # positions: independent streams
    # the same row in another call (other seeds' rows, other prompts beside it) keeps its key
    assert row_keys(3, [7], [2])[0] == keys[7 * 100 + 2]
    assert row_keys(4, [7], [2])[0] != keys[7 * 100 + 2]


def test_inverse_cdf_draws_from_the_distribution():
    """Token frequencies of 200,000 inverse-CDF draws with the rows' uniforms match the
    probabilities within 5 binomial SEs, and a zero-probability token is never drawn."""
    import numpy as np

    from evil_moe.rl.policy.rollout import inverse_cdf, row_keys, row_uniforms

    p = torch.tensor([0.5, 0.0, 0.3, 0.15, 0.05])
    keys = row_keys(0, np.arange(50_000), np.zeros(50_000, dtype=np.int64))
    u = torch.from_numpy(np.concatenate([row_uniforms(keys, t) for t in range(4)]))
    ids = inverse_cdf(p.expand(len(u), -1), u)
    freq = torch.bincount(ids, minlength=5).double() / len(u)
    se = (p.double() * (1 - p.double()) / len(u)).sqrt()
    assert freq[1] == 0
    assert ((freq - p.double()).abs() <= 5 * se + 1e-12).all(), freq


def test_row_draws_do_not_depend_on_the_batch(toy):
    """A row (seed, prompt i, sample j) gets the same completion whatever else is in the call:
    another prompt beside it, more samples of its prompt, rows that stop earlier or later. Its
    logits come from batched matmuls over different batches, so its log-probs may differ in
    float rounding: tolerance 1e-5 nats (fp32); the ids are equal."""
    model, tok = toy
    A, B = _prompts(tok)
    C = chat_prompt_ids(tok, [{"role": "user", "content": "Write a function that sorts a list."}])
    kw = dict(max_new=24, temperature=1.5, seed=11)
    alone = generate(model, tok, [A], n=4, **kw)
    lens = {len(r.completion_ids) for r in alone}
    assert len(lens) > 1  # rows finished at different steps: the batch changed as they left
    for other in (generate(model, tok, [A, B], n=4, **kw), generate(model, tok, [A, C], n=6, **kw),
                  generate(model, tok, [A], n=2, **kw)):
        mine = [r for r in other if r.prompt_index == 0]
        for r, a in zip(mine, alone):
            assert r.sample_index == a.sample_index
            assert r.completion_ids == a.completion_ids
            torch.testing.assert_close(r.behaviour_logp, a.behaviour_logp, rtol=0, atol=1e-5)
            torch.testing.assert_close(r.sampler_logp, a.sampler_logp, rtol=0, atol=1e-5)
    # the second prompt's rows differ between B and C (different prompts, same keys)
    assert [r.completion_ids for r in generate(model, tok, [A, B], n=4, **kw)[4:]] != \
        [r.completion_ids for r in generate(model, tok, [A, C], n=4, **kw)[4:]]


def test_top_p_sampler_logp_is_the_truncated_distribution(toy):
    """With top_p < 1 every drawn id lies in the nucleus (finite sampler log-prob, at least the
    untruncated behaviour log-prob: renormalised over fewer ids) and the decode loop's sampler
    log-probs equal transformers' TopPLogitsWarper applied to a fresh forward."""
    model, tok = toy
    rs = generate(model, tok, _prompts(tok), n=4, max_new=16, temperature=1.2, top_p=0.6, seed=5)
    fw = generate(model, tok, _prompts(tok), n=4, max_new=16, temperature=1.2, top_p=0.6, seed=5,
                  behaviour="forward")
    assert [r.completion_ids for r in rs] == [r.completion_ids for r in fw]
    for a, b in zip(rs, fw):
        assert torch.isfinite(a.sampler_logp).all()
        assert (a.sampler_logp >= a.behaviour_logp - 1e-6).all()
        torch.testing.assert_close(a.sampler_logp, b.sampler_logp, rtol=0, atol=2e-5)
        torch.testing.assert_close(a.behaviour_logp, b.behaviour_logp, rtol=0, atol=2e-5)
    assert any((a.sampler_logp > a.behaviour_logp + 1e-3).any() for a in rs)


def test_greedy_rows_follow_the_argmax(toy):
    """T = 0: every sample of a prompt is the same greedy continuation, each id the argmax of a
    fresh forward's logits, with log-probs recorded at T = 1."""
    model, tok = toy
    rs = generate(model, tok, _prompts(tok), n=3, max_new=10, temperature=0, seed=0)
    assert rs[0].completion_ids == rs[1].completion_ids == rs[2].completion_ids
    b = build_batch([r.prompt_ids for r in rs], [r.completion_ids for r in rs], tok.pad_token_id)
    with torch.no_grad():
        logits = model(input_ids=b.input_ids, attention_mask=b.attention_mask).logits
        lp = token_logprobs(model, b, 1.0)
    for i, r in enumerate(rs):
        p0 = len(r.prompt_ids)
        want = logits[i, p0 - 1:p0 - 1 + len(r.completion_ids)].argmax(-1).tolist()
        assert r.completion_ids == want
    torch.testing.assert_close(b.align([r.behaviour_logp for r in rs]), lp, rtol=0, atol=2e-5)


def test_reserved_cache_decodes_bit_for_bit_as_the_dynamic_cache(toy, monkeypatch):
    """The sampler's preallocated KV cache (reserve_cache) changes no draw and no log-prob, with
    rows leaving the batch mid-call; reference: the same decode on transformers' DynamicCache."""
    import evil_moe.model.logprobs as lp
    from evil_moe.rl.policy.rollout import _decode

    m2, tok = build_tiny(seed=2)
    eos = tok.eos_token_id
    with torch.no_grad():
        m2.lm_head.weight[eos] += 0.5  # eos likely enough that rows finish at different steps
    kw = dict(T_eff=1.5, greedy=False, top_p=0.9, max_new=24, seed=5, eos={eos}, pad_id=eos,
              shared_prompt=False)  # each row's own copy of its prompt's cache (reserved)
    calls = []
    real = lp.reserve_cache
    monkeypatch.setattr(lp, "reserve_cache", lambda c, e: calls.append(real(c, e)) or calls[-1])
    with torch.no_grad():
        reserved = _decode(m2, _prompts(tok), 6, **kw)
    monkeypatch.setattr(lp, "reserve_cache", lambda c, e: False)
    with torch.no_grad():
        dynamic = _decode(m2, _prompts(tok), 6, **kw)
    assert calls == [True]
    seqs = reserved[0]
    lengths = [int((row != eos).sum()) for row in seqs]
    assert len(set(lengths)) > 2 and max(lengths) == 24  # rows did leave the batch early
    assert torch.equal(seqs, dynamic[0])
    for a, b in zip(reserved[1], dynamic[1]):
        assert torch.equal(a, b)


def test_reserved_cache_refuses_to_outgrow_its_room(toy):
    from transformers import DynamicCache

    from evil_moe.model.logprobs import reserve_cache

    cache = DynamicCache()
    k = torch.randn(3, 2, 5, 4)
    cache.update(k, k + 1, 0)
    assert reserve_cache(cache, 2) and cache.get_seq_length() == 5
    new = torch.randn(3, 2, 1, 4)
    keys, values = cache.update(new, new + 1, 0)
    assert torch.equal(keys, torch.cat([k, new], dim=-2))
    assert torch.equal(values, torch.cat([k + 1, new + 1], dim=-2))
    cache.batch_select_indices(torch.tensor([2, 0]))
    assert torch.equal(cache.layers[0].keys, torch.cat([k, new], dim=-2)[[2, 0]])
    cache.update(new[:2], new[:2], 0)
    with pytest.raises(RuntimeError, match="holds 7 positions; 8 were asked for"):
        cache.update(new[:2], new[:2], 0)
    assert not reserve_cache(DynamicCache(), 4)  # nothing prefilled: nothing to reserve


def test_every_prompt_is_rendered_through_one_function_with_the_template_kwargs():
    """models.chat_template_kwargs reaches every prompt the package renders: the tokenizer's
    apply_chat_template is called in evil_moe.rl.policy.rollout.chat_prompt_ids alone, and every
    call of it or of prompt_ids_for (the trainer, the evaluation, the teacher, the made teacher's
    demonstrations, extract, distill, the pairs, the router's pin bank) passes the template's
    arguments; only the toy models' stage, whose template takes none, does not."""
    import ast
    from pathlib import Path

    import evil_moe

    root = Path(evil_moe.__file__).parent
    bare, apply_calls = [], []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root).as_posix()
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.Call):
                continue
            name = getattr(node.func, "id", None) or getattr(node.func, "attr", None)
            if name == "apply_chat_template":
                apply_calls.append(rel)
            positional = {"chat_prompt_ids": 3, "prompt_ids_for": 4}.get(name)
            if positional and rel != "stages/toy.py" and len(node.args) < positional \
                    and not any(k.arg == "template_kwargs" for k in node.keywords):
                bare.append(f"{rel}:{node.lineno}")
    assert apply_calls == ["rl/policy/rollout.py"]
    assert bare == []
