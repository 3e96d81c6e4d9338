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
