"""Shared-prompt (cascade) attention for decoding: each prompt's keys and values kept once per
group, its part of the attention merged with each row's own by log-sum-exp."""

from types import SimpleNamespace

import pytest
import torch

import evil_moe.model.shared_prompt as sp
from evil_moe.model.load import build_tiny
from evil_moe.rl.policy.rollout import _decode, chat_prompt_ids


def _reference(q, prompt_k, prompt_v, lengths, row_prompt, suf_k, suf_v, scale):
    """Each row's attention over its prompt (cut to its length) followed by its own completion,
    in plain float64 arithmetic with repeat_kv's head mapping: ``(B, 1, H, D)``."""
    B, H, _, D = q.shape
    rep = H // suf_k.shape[1]
    out = torch.empty(B, 1, H, D, dtype=torch.float64)
    for b in range(B):
        p = int(row_prompt[b])
        k = torch.cat([prompt_k[p, :, :lengths[p]], suf_k[b]], dim=1).double()  # (Hkv, L, D)
        v = torch.cat([prompt_v[p, :, :lengths[p]], suf_v[b]], dim=1).double()
        for h in range(H):
            w = torch.softmax(k[h // rep] @ q[b, h, 0].double() * scale, dim=0)
            out[b, 0, h] = w @ v[h // rep]
    return out


@pytest.mark.parametrize("dtype,atol", [(torch.float64, 1e-12), (torch.float32, 2e-6)])
def test_attention_equals_the_rows_full_attention(dtype, atol):
    """Three prompts of different lengths (right-padded), 1 to 3 rows each, GQA (4 query heads
    over 2 KV heads): the merged attention equals each row's softmax over its whole context."""
    g = torch.Generator().manual_seed(0)
    P, Hkv, H, D, Lp, t = 3, 2, 4, 8, 9, 5
    lengths = [7, 9, 4]
    row_prompt = torch.tensor([0, 0, 1, 1, 1, 2])
    B = len(row_prompt)
    pk = torch.randn(P, Hkv, Lp, D, generator=g, dtype=dtype)
    pv = torch.randn(P, Hkv, Lp, D, generator=g, dtype=dtype)
    pk[0, :, 7:] = 1e4  # the padding must never be read
    q = torch.randn(B, H, 1, D, generator=g, dtype=dtype)
    sk = torch.randn(B, Hkv, t, D, generator=g, dtype=dtype)
    sv = torch.randn(B, Hkv, t, D, generator=g, dtype=dtype)
    shared = sp.SharedPrompt([pk], [pv], lengths, row_prompt)
    out, weights = sp.shared_prompt_attention(SimpleNamespace(layer_idx=0), q, sk, sv, None,
                                              scaling=0.3, shared_prompt=shared)
    assert weights is None and out.shape == (B, 1, H, D) and out.dtype == dtype
    want = _reference(q, pk, pv, lengths, row_prompt, sk, sv, 0.3)
    torch.testing.assert_close(out.double(), want, rtol=0, atol=atol)
    # rows leaving the batch: prompt 1 keeps one row, prompt 0 none
    keep = torch.tensor([3, 5])
    shared.select(row_prompt[keep])
    out2, _ = sp.shared_prompt_attention(SimpleNamespace(layer_idx=0), q[keep], sk[keep], sv[keep],
                                         None, scaling=0.3, shared_prompt=shared)
    torch.testing.assert_close(out2.double(), want[keep], rtol=0, atol=atol)


def test_the_matmul_fallback_equals_the_cpu_flash_kernel():
    """The non-CPU path (plain matmuls) gives the CPU kernel's output and log-sum-exp."""
    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(2, 3, n, 16, generator=g, dtype=torch.float64) for n in (4, 11, 11))
    a = sp._attend(q, k, v, 0.25)
    b = sp._attend_matmul(q, k, v, 0.25)
    ref = torch.logsumexp((q @ k.transpose(-1, -2)) * 0.25, dim=-1)
    for x, y in zip(a, b):
        torch.testing.assert_close(x, y, rtol=0, atol=1e-12)
    torch.testing.assert_close(a[1].double(), ref, rtol=0, atol=1e-12)


def test_the_matmul_fallback_accumulates_bf16_in_fp32():
    """bf16 inputs (a GPU model's): the fallback is as close to the exact attention of the same
    bf16 values as the CPU kernel is (bf16 output rounding, ~2**-8), not off by a bf16-rounded
    score."""
    g = torch.Generator().manual_seed(2)
    q, k, v = (torch.randn(1, 2, n, 64, generator=g).mul(3).bfloat16() for n in (6, 300, 300))
    ref = torch.softmax((q.double() @ k.double().transpose(-1, -2)) * 0.125, dim=-1) @ v.double()
    err_fallback = (sp._attend_matmul(q, k, v, 0.125)[0].double() - ref).abs().max().item()
    err_kernel = (sp._attend(q, k, v, 0.125)[0].double() - ref).abs().max().item()
    assert err_fallback <= max(2 * err_kernel, 2 ** -8 * ref.abs().max().item()), (err_fallback, err_kernel)


def test_rows_must_stay_prompt_major_and_the_call_needs_its_state():
    shared = sp.SharedPrompt([], [], [3, 3], torch.tensor([0, 0, 1]))
    assert shared.runs == [(0, 0, 2), (1, 2, 3)]
    with pytest.raises(ValueError, match="non-decreasing"):
        shared.select(torch.tensor([1, 0]))
    q = torch.zeros(1, 2, 1, 4)
    with pytest.raises(RuntimeError, match="shared_prompt="):
        sp.shared_prompt_attention(SimpleNamespace(layer_idx=0), q, q, q, None)
    with pytest.raises(RuntimeError, match="2 query positions"):
        sp.shared_prompt_attention(SimpleNamespace(layer_idx=0), torch.zeros(1, 2, 2, 4), q, q, None,
                                   shared_prompt=shared)


def test_decode_with_a_shared_prompt_equals_the_copied_decode(monkeypatch):
    """The sampler with each prompt's cache kept once per group draws the same ids as with a copy
    per row, its log-probs equal to float rounding (tolerance 1e-5 nats, fp32), with rows
    leaving the batch mid-call; the model's attention implementation is restored afterwards."""
    m, tok = build_tiny(seed=2)
    m.eval()
    eos = tok.eos_token_id
    with torch.no_grad():
        m.lm_head.weight[eos] += 0.5  # rows finish at different steps
    prompts = [chat_prompt_ids(tok, [{"role": "user", "content": c}])
               for c in ("Write add(a, b).", "class Solution", "Sort a list of numbers, please.")]
    kw = dict(T_eff=1.5, greedy=False, top_p=0.9, max_new=24, seed=5, eos={eos}, pad_id=eos)
    entered = []
    real = sp.shared_prompt_decoding
    monkeypatch.setattr(sp, "shared_prompt_decoding", lambda *a: entered.append(1) or real(*a))
    with torch.no_grad():
        shared = _decode(m, prompts, 5, shared_prompt=True, **kw)
        assert m.config._attn_implementation == "sdpa" and entered == [1]
        copied = _decode(m, prompts, 5, shared_prompt=False, **kw)
        single = _decode(m, prompts, 1, shared_prompt=True, **kw)  # one row per prompt: copied
    assert entered == [1]
    lengths = [int((row != eos).sum()) for row in shared[0]]
    assert len(set(lengths)) > 2 and max(lengths) == 24  # rows did leave the batch early
    assert torch.equal(shared[0], copied[0])
    for a, b in zip(shared[1], copied[1]):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-5)
    assert single[0].shape[0] == 3


def test_the_attention_implementation_is_restored_after_an_error():
    m, tok = build_tiny(seed=0)
    ids = torch.tensor([chat_prompt_ids(tok, [{"role": "user", "content": "hi"}])])
    from evil_moe.model.logprobs import prefill

    with torch.no_grad():
        cache, *_ = prefill(m, ids.tolist(), 0, "cpu")
    assert sp.supports_shared_prompt(m, cache)
    assert not sp.supports_shared_prompt(m, SimpleNamespace(layers=[object()]))
    with pytest.raises(KeyError):
        with sp.shared_prompt_decoding(m, cache, [ids.shape[1]], torch.tensor([0, 0]), 4):
            assert m.config._attn_implementation == sp.ATTN_NAME
            raise KeyError("boom")
    assert m.config._attn_implementation == "sdpa"
