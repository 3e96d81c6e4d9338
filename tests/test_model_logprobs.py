"""Token log-probs and entropies aligned to tokens; right padding changes nothing."""

import pytest
import torch

from evil_moe.model.load import build_tiny
from evil_moe.model.logprobs import build_batch, token_entropy, token_logprobs


@pytest.fixture(scope="module")
def toy():
    return build_tiny(seed=1, dtype="float64")


def _rows(tok):
    p1 = tok.encode("<|im_start|>user\nadd<|im_end|>\n<|im_start|>assistant\n")
    p2 = tok.encode("<|im_start|>user\nWrite a class<|im_end|>\n<|im_start|>assistant\n")
    c1 = tok.encode("def add(a, b):\n    return a + b<|im_end|>")
    c2 = tok.encode("pass")
    return [p1, p2], [c1, c2]


def test_build_batch_layout(toy):
    _, tok = toy
    P, C = _rows(tok)
    b = build_batch(P, C, tok.pad_token_id)
    L = max(len(p) + len(c) for p, c in zip(P, C))
    assert b.input_ids.shape == (2, L)
    for i in range(2):
        n = len(P[i]) + len(C[i])
        assert b.input_ids[i, :n].tolist() == P[i] + C[i]
        assert b.attention_mask[i].tolist() == [1] * n + [0] * (L - n)
        assert b.completion_mask[i].tolist() == [False] * len(P[i]) + [True] * len(C[i]) + [False] * (L - n)
    with pytest.raises(ValueError):
        build_batch(P, C[:1], 0)
    with pytest.raises(ValueError):
        build_batch([[]], [[1]], 0)


def test_token_logprobs_by_hand(toy):
    model, tok = toy
    P, C = _rows(tok)
    b = build_batch(P, C, tok.pad_token_id)
    T = 0.7
    with torch.no_grad():
        lp, ent = token_logprobs(model, b, T, with_entropy=True)
        for i in range(2):
            seq = torch.tensor([P[i] + C[i]])
            z = model(seq).logits[0].double() / T
            logz = torch.log_softmax(z, -1)
            for t in range(b.input_ids.shape[1]):
                if b.completion_mask[i, t]:
                    want = logz[t - 1, seq[0, t]]
                    assert torch.allclose(lp[i, t], want, atol=1e-10), (i, t)
                    h = -(logz[t - 1].exp() * logz[t - 1]).sum()
                    assert torch.allclose(ent[i, t], h, atol=1e-10)
                else:
                    assert lp[i, t] == 0 and ent[i, t] == 0
    assert torch.equal(token_entropy(model, b, T), ent)
    assert (lp[b.completion_mask] < 0).all()
    with pytest.raises(ValueError):
        token_logprobs(model, b, 0.0)


def test_padding_and_batch_composition_invariance(toy):
    model, tok = toy
    P, C = _rows(tok)
    with torch.no_grad():
        both = token_logprobs(model, build_batch(P, C, tok.pad_token_id))
        alone = token_logprobs(model, build_batch(P[1:], C[1:], tok.pad_token_id))
    n = alone.shape[1]
    assert torch.allclose(both[1, :n], alone[0], atol=1e-10)
    assert (both[1, n:] == 0).all()


def test_logprobs_differentiable(toy):
    model, tok = toy
    from evil_moe.model.adapter import SVDAdapter

    m2, _ = build_tiny(seed=1, dtype="float64")
    ad = SVDAdapter.attach(m2)
    P, C = _rows(tok)
    lp = token_logprobs(m2, build_batch(P, C, tok.pad_token_id))
    lp.sum().backward()
    assert all(p.grad is not None for p in ad.delta_s_params())


def _fp64_rmsnorm(monkeypatch):
    """Qwen3's RMSNorm computes in fp32 even in an fp64 model, so two batch layouts of the same
    rows differ at fp32's rounding (~1e-7 relative); in fp64 they agree to fp64's."""
    import transformers.models.qwen3.modeling_qwen3 as qwen3

    def forward(self, h):
        return self.weight * (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.variance_epsilon))

    monkeypatch.setattr(qwen3.Qwen3RMSNorm, "forward", forward)


def test_shared_prompt_logprobs_and_gradients_equal_the_per_row_forward(monkeypatch):
    """Each distinct prompt forwarded once (share_prompts) gives token_logprobs' values and the
    same δS gradient (fp64 toy, fp64 norms: to 1e-12 relative), on groups of different prompt
    lengths with completions of length 0, 1 and several, in any row order (rows of a group need
    not be adjacent), through knobs on attention, MLP and the tied lm_head."""
    from evil_moe.model.adapter import DEFAULT_TARGETS, SVDAdapter

    _fp64_rmsnorm(monkeypatch)
    model, tok = build_tiny(seed=1, dtype="float64")
    ad = SVDAdapter.attach(model, list(DEFAULT_TARGETS) + ["lm_head"])
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in ad.delta_s_params():
            p.copy_(0.2 * torch.randn(p.shape, generator=gen, dtype=p.dtype))
    P, C = _rows(tok)
    extra = tok.encode("return 1<|im_end|>")
    prompts = [P[0], P[1], P[0], P[1], P[0], P[1]]
    comps = [C[0], C[1], extra, [], extra[:1], C[0]]
    b = build_batch(prompts, comps, tok.pad_token_id)
    A = torch.tensor([0.5, -1.0, 0.25, 2.0, -0.75, 1.5], dtype=torch.float64)

    def grads(share):
        lp = token_logprobs(model, b, 0.7, share_prompts=share)
        loss = -(lp.sum(1) * A).sum()
        return lp.detach(), torch.autograd.grad(loss, ad.delta_s_params())

    import evil_moe.model.logprobs as lp_mod

    want_lp, want_g = grads(False)
    buckets = lp_mod.length_buckets
    for overhead in (128, 0):  # one bucket of completions; one per distinct length
        monkeypatch.setattr(lp_mod, "length_buckets", lambda lens, o=overhead: buckets(lens, o))
        lens = [len(c) for c in comps]
        assert len(lp_mod.length_buckets(lens)) == (1 if overhead else len(set(lens)))
        got_lp, got_g = grads(True)
        torch.testing.assert_close(got_lp, want_lp, rtol=0, atol=1e-12)
        assert (got_lp[~b.completion_mask] == 0).all()
        for g, w in zip(got_g, want_g):
            torch.testing.assert_close(g, w, rtol=0, atol=1e-12 * float(w.abs().max()))
    assert sum(float(w.abs().sum()) for w in want_g) > 0
    with pytest.raises(ValueError, match="share_prompts"):
        token_logprobs(model, b, 0.7, share_prompts=True, with_entropy=True)


def test_shared_prompt_forwards_each_prompt_once():
    """Two prompts × three rows: the prompt forward has 2 rows, the completion forward 6."""
    model, tok = build_tiny(seed=1, dtype="float64")
    P, C = _rows(tok)
    b = build_batch([P[0]] * 3 + [P[1]] * 3, [C[0], C[1], C[0], C[1], C[0], C[1]], tok.pad_token_id)
    shapes = []
    h = model.register_forward_pre_hook(lambda m, a, k: shapes.append(tuple(k["input_ids"].shape)),
                                        with_kwargs=True)
    try:
        with torch.no_grad():
            token_logprobs(model, b, 1.0, share_prompts=True)
    finally:
        h.remove()
    Lc = max(len(C[0]), len(C[1]))
    assert shapes == [(2, max(len(P[0]), len(P[1]))), (6, Lc - 1)]


def test_top_p_logits_is_transformers_top_p():
    """top_p_logits keeps the ids transformers' TopPLogitsWarper keeps (on continuous random
    logits: no ties at the nucleus boundary), whether the nucleus fits the first top-k or needs
    the widening (flat rows), and always the most probable id."""
    from transformers.generation.logits_process import TopPLogitsWarper

    from evil_moe.model.logprobs import top_p_logits

    g = torch.Generator().manual_seed(0)
    peaked = torch.randn(16, 5000, generator=g) * 4
    flat = torch.randn(16, 5000, generator=g) * 0.05  # nucleus of thousands of ids
    for z in (peaked, flat):
        for p in (0.05, 0.5, 0.9, 0.95, 0.999):
            ours = torch.isfinite(top_p_logits(z, p))
            theirs = torch.isfinite(TopPLogitsWarper(p)(None, z.clone()))
            assert torch.equal(ours, theirs), p
            assert ours[torch.arange(len(z)), z.argmax(-1)].all()
    assert int(torch.isfinite(top_p_logits(flat, 0.95)).sum(-1).min()) > 64  # widened past first_k
    assert torch.equal(top_p_logits(peaked, 1.0), peaked)
    with pytest.raises(ValueError):
        top_p_logits(peaked, 0.0)


def test_length_buckets_minimise_padding_plus_overhead():
    """By hand: lengths 1, 2, 30, 31 with a per-forward cost of 10 tokens: {1, 2} and {30, 31}
    cost 2·2 + 10 + 2·31 + 10 = 86 against 4·31 + 10 = 134 for one bucket and more for any
    other cut; with a cost of 1000 one bucket wins; every row appears once, shortest first."""
    from evil_moe.model.logprobs import length_buckets

    assert length_buckets([30, 1, 31, 2], overhead=10) == [[1, 3], [0, 2]]
    assert length_buckets([30, 1, 31, 2], overhead=1000) == [[1, 3, 0, 2]]
    assert length_buckets([], overhead=10) == []
    got = length_buckets([5, 3, 9, 9, 1, 7], overhead=0)
    assert sorted(i for b in got for i in b) == list(range(6))
