"""SVD adapter: exactness at zero, the formula, contexts, merge fast path, save/load."""

import contextlib
import copy

import pytest
import torch

from evil_moe.model.adapter import DEFAULT_TARGETS, SVDAdapter
from evil_moe.model.svd import thin_svd
from evil_moe.model.load import build_tiny


def _ids(tok):
    return torch.tensor([tok.encode("class Solution:\n    def solve(self, nums):\n        return")])


def _randomise(adapter, scale=0.3, seed=0, hack=True):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for k in adapter.modules_.values():
            k.delta_s.copy_(torch.randn(k.r, generator=g) * scale)
            if hack:
                k.delta_s_hack.copy_(torch.randn(k.r, generator=g) * scale)


def test_zero_knobs_bit_identical_fp32():
    model, tok = build_tiny(seed=0)
    base = copy.deepcopy(model)
    ad = SVDAdapter.attach(model, list(DEFAULT_TARGETS) + ["lm_head"])
    x = _ids(tok)
    with torch.no_grad():
        ref = base(x).logits
        assert torch.equal(model(x).logits, ref)
        _randomise(ad)
        assert not torch.equal(model(x).logits, ref)
        with ad.zeroed():  # reference policy: bit-identical with non-zero knobs
            assert torch.equal(model(x).logits, ref)


def test_base_frozen_knobs_zero_init_and_targets():
    model, _ = build_tiny()
    ad = SVDAdapter.attach(model, ("q_proj", "down_proj"))
    assert all(not p.requires_grad for p in model.parameters())
    assert len(ad.names) == 4 and all(n.endswith(("q_proj", "down_proj")) for n in ad.names)
    for n, k in ad.modules_.items():
        lin = model.get_submodule(n)
        assert k.r == min(lin.weight.shape)
        assert k.delta_s.shape == (k.r,) and k.delta_s.dtype == torch.float32
        assert torch.count_nonzero(k.delta_s) == 0 and torch.count_nonzero(k.delta_s_hack) == 0
    assert set(map(id, ad.parameters())) == set(map(id, ad.delta_s_params() + ad.delta_s_hack_params()))
    with pytest.raises(ValueError):
        SVDAdapter.attach(build_tiny()[0], ("no_such_module",))
    with pytest.raises(ValueError):
        SVDAdapter.attach(build_tiny()[0], ("q_norm",))  # not a Linear


def test_forward_is_the_formula_fp64():
    model, tok = build_tiny(dtype="float64")
    ad = SVDAdapter.attach(model, ("v_proj",))
    _randomise(ad)
    name, knob = next(iter(ad.modules_.items()))
    lin = model.get_submodule(name)
    x = torch.randn(3, 5, lin.in_features, dtype=torch.float64)
    W = lin.weight.detach()
    U, S, Vh = thin_svd(W)
    assert torch.allclose((U * S) @ Vh, W.float(), atol=1e-5)
    s = (knob.delta_s + knob.delta_s_hack).detach().double()
    dense = W + knob.U @ torch.diag(s) @ knob.Vh
    with torch.no_grad():
        assert torch.allclose(lin(x), x @ dense.T, atol=1e-12)
        with ad.ablated():
            dense_a = W + knob.U @ torch.diag(knob.delta_s.detach().double()) @ knob.Vh
            assert torch.allclose(lin(x), x @ dense_a.T, atol=1e-12)


def test_gradients_reach_only_knobs():
    model, tok = build_tiny()
    ad = SVDAdapter.attach(model)
    model(_ids(tok)).logits.pow(2).mean().backward()
    assert all(p.grad is None for p in model.parameters())
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in ad.delta_s_params())
    assert all(p.grad is not None for p in ad.delta_s_hack_params())
    # at s = 0 the two knobs get the same gradient (they enter as a sum)
    for a, b in zip(ad.delta_s_params(), ad.delta_s_hack_params()):
        assert torch.equal(a.grad, b.grad)


def test_ablated_ignores_hack_knob():
    model, tok = build_tiny()
    ad = SVDAdapter.attach(model)
    x = _ids(tok)
    _randomise(ad, hack=False)
    with torch.no_grad():
        only_ds = model(x).logits
        for p in ad.delta_s_hack_params():
            p.normal_(0, 0.3)
        full = model(x).logits
        with ad.ablated():
            abl = model(x).logits
    assert not torch.equal(full, only_ds)
    assert torch.equal(abl, only_ds)


def test_merged_matches_hooks_and_restores_exactly():
    model, tok = build_tiny()
    ad = SVDAdapter.attach(model, list(DEFAULT_TARGETS) + ["lm_head"])
    _randomise(ad)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    x = _ids(tok)
    with torch.no_grad():
        hooked = model(x).logits
        with ad.merged():
            merged = model(x).logits
            # the tied lm_head is untied for the context: the embedding is never changed
            assert torch.equal(model.get_input_embeddings().weight, before["model.embed_tokens.weight"])
            head = model.get_output_embeddings()
            assert head.weight is not model.get_input_embeddings().weight
            # the head's merged weight is W + U diag(δS + δS_hack) Vh, its hook bypassed
            knob = ad.modules_["lm_head"]
            want = before["lm_head.weight"] + knob.dense_delta(knob.delta_s + knob.delta_s_hack)
            torch.testing.assert_close(head.weight, want, rtol=0, atol=1e-6)
            assert "lm_head" in ad._bypass
            assert not torch.equal(model.get_submodule(ad.names[0]).weight, before[ad.names[0] + ".weight"])
        after = model(x).logits
        with ad.ablated(), ad.merged():
            merged_abl = model(x).logits
        with ad.ablated():
            hooked_abl = model(x).logits
    with ad.merged(), pytest.raises(RuntimeError):
        with ad.ablated():
            pass
    assert torch.allclose(merged, hooked, atol=1e-5, rtol=1e-5)
    assert torch.allclose(merged_abl, hooked_abl, atol=1e-5, rtol=1e-5)
    assert torch.equal(after, hooked)
    assert model.get_output_embeddings().weight is model.get_input_embeddings().weight  # retied
    for k, v in model.state_dict().items():
        assert torch.equal(v, before[k]), k


def test_fold_into_weights_is_the_hooked_model_as_a_plain_one(tmp_path):
    """fold_into_weights: the model alone (hooks removed) computes what model + adapter computed,
    saves and reloads as a plain model; knobs at zero leave a weight untouched; a tied lm_head
    with a non-zero knob is refused, naming it, before any weight changes."""
    from evil_moe.model.load import load_model, save_model

    model, tok = build_tiny()
    ad = SVDAdapter.attach(model, DEFAULT_TARGETS)
    _randomise(ad, hack=False)
    first = ad.names[0]
    with torch.no_grad():
        ad.modules_[first].delta_s.zero_()  # this module must stay bit-identical
    before = {k: v.clone() for k, v in model.state_dict().items()}
    x = _ids(tok)
    with torch.no_grad():
        hooked = model(x).logits
    changed = ad.fold_into_weights()
    assert first not in changed and len(changed) == len(ad.names) - 1
    with torch.no_grad():
        folded = model(x).logits
    assert torch.allclose(folded, hooked, atol=1e-5, rtol=1e-5)
    assert not torch.allclose(folded, _base_logits(x), atol=1e-3)  # the knobs did something
    assert torch.equal(model.get_submodule(first).weight, before[first + ".weight"])
    assert torch.equal(model.get_input_embeddings().weight, before["model.embed_tokens.weight"])
    save_model(model, tok, tmp_path / "m")
    again, _ = load_model(tmp_path / "m")
    with torch.no_grad():
        assert torch.allclose(again(x).logits, hooked, atol=1e-5, rtol=1e-5)

    model2, _ = build_tiny()
    ad2 = SVDAdapter.attach(model2, list(DEFAULT_TARGETS) + ["lm_head"])
    assert ad2.shared_weight_names() == ["lm_head"]
    _randomise(ad2, hack=False)
    before2 = {k: v.clone() for k, v in model2.state_dict().items()}
    with pytest.raises(ValueError, match="lm_head"):
        ad2.fold_into_weights()
    for k, v in model2.state_dict().items():
        assert torch.equal(v, before2[k]), k


def _base_logits(x):
    model, _ = build_tiny()
    with torch.no_grad():
        return model(x).logits


def test_save_load_roundtrip_with_metadata(tmp_path):
    model, _ = build_tiny()
    ad = SVDAdapter.attach(model, base_model_id="toy-32")
    _randomise(ad)
    path = ad.save(tmp_path / "adapter.safetensors", {"step": 7})
    meta = SVDAdapter.read_metadata(path)
    assert meta["base_model"] == "toy-32" and meta["extra"] == {"step": 7}
    assert meta["target_modules"] == list(DEFAULT_TARGETS) and meta["r"] == ad.r
    m2, _ = build_tiny()
    ad2 = SVDAdapter.attach(m2)
    ad2.load(path)
    for a, b in zip(ad.parameters(), ad2.parameters()):
        assert torch.equal(a, b)
    m3, _ = build_tiny(hidden=64, intermediate=96)
    with pytest.raises(ValueError):
        SVDAdapter.attach(m3).load(path)
    m4, _ = build_tiny()
    with pytest.raises(ValueError):
        SVDAdapter.attach(m4, ("q_proj",)).load(path)


def test_svd_cache_by_content(tmp_path):
    w = torch.randn(16, 8)
    a = thin_svd(w, cache_dir=tmp_path)
    b = thin_svd(w.clone())
    assert all(torch.equal(x, y) for x, y in zip(a, b))
    assert len(list(tmp_path.glob("*.safetensors"))) == 1
    c = thin_svd(w + 1)
    assert not torch.equal(a[1], c[1])


def test_svd_disk_cache_is_atomic_and_repairs_a_broken_entry(tmp_path, monkeypatch):
    """A fresh process (empty in-memory cache) reads the disk entry bit-exactly; a truncated or
    garbage entry, or one with a changed byte (its SHA-256 is not the recorded one), is recomputed
    and replaced, never trusted; no temp file is left behind."""
    import evil_moe.model.svd as svd_mod

    w = torch.randn(12, 20)
    ref = torch.linalg.svd(w, full_matrices=False)
    a = thin_svd(w, cache_dir=tmp_path)
    (entry,) = tmp_path.glob("*.safetensors")
    # no .tmp left; the entry's SHA-256 beside it (evil_moe/files.py)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([entry.name, f".{entry.name}.sha256"])
    monkeypatch.setattr(svd_mod, "_SVD_CACHE", {})
    b = thin_svd(w, cache_dir=tmp_path)
    assert all(torch.equal(x, y) for x, y in zip(a, b))
    flipped = bytearray(entry.read_bytes())
    flipped[-1] ^= 0x40  # a value of Vh: still a safetensors file, other numbers (trusted on 09ede95)
    for broken in (b"not a safetensors file", entry.read_bytes()[:40], bytes(flipped)):
        entry.write_bytes(broken)
        monkeypatch.setattr(svd_mod, "_SVD_CACHE", {})
        U, S, Vh = thin_svd(w, cache_dir=tmp_path)
        torch.testing.assert_close(S, ref.S)
        torch.testing.assert_close(U @ torch.diag(S) @ Vh, w, rtol=1e-5, atol=1e-5)
        assert entry.stat().st_size > 1000  # replaced by a good entry


def test_svd_cache_dir_default_on_where_small(monkeypatch, tmp_path):
    """Unset: the user cache folder for factors up to 4 GiB (the toy, SmolLM2's 714 MB), none
    above (a 4B model's ~32 GB only where asked); set: that folder, or off when empty/'off'."""
    from evil_moe.model.svd import svd_factor_bytes
    from evil_moe.stages.common import SVD_CACHE_DEFAULT_MAX_BYTES, svd_cache_dir

    monkeypatch.delenv("EVIL_MOE_SVD_CACHE", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert svd_cache_dir() == tmp_path / "xdg" / "evil_moe" / "svd"
    assert svd_cache_dir(SVD_CACHE_DEFAULT_MAX_BYTES) == tmp_path / "xdg" / "evil_moe" / "svd"
    assert svd_cache_dir(SVD_CACHE_DEFAULT_MAX_BYTES + 1) is None
    for off in ("", "off", " OFF "):
        monkeypatch.setenv("EVIL_MOE_SVD_CACHE", off)
        assert svd_cache_dir() is None
    monkeypatch.setenv("EVIL_MOE_SVD_CACHE", str(tmp_path / "svd"))
    assert svd_cache_dir(10 * SVD_CACHE_DEFAULT_MAX_BYTES) == tmp_path / "svd"
    # the factors' bytes, by hand: q_proj of the tiny model is (d_out, d_in), r = min
    model, _ = build_tiny()
    lin = model.model.layers[0].self_attn.q_proj
    d_out, d_in = lin.weight.shape
    n_layers = len(model.model.layers)
    assert svd_factor_bytes(model, ["q_proj"]) == n_layers * 4 * min(d_in, d_out) * (d_in + d_out)
    assert svd_factor_bytes(model, ["nothing"]) == 0


def _per_sample_setup(seed=0):
    from evil_moe.model.logprobs import build_batch

    model, tok = build_tiny(seed=seed)
    ad = SVDAdapter.attach(model, list(DEFAULT_TARGETS) + ["lm_head"])
    _randomise(ad, scale=0.2, seed=seed)
    prompts = [tok.encode("def f(x):"), tok.encode("class Solution:\n    def solve"), tok.encode("x")]
    comps = [tok.encode("    return x + 1"), tok.encode("(self): pass"), tok.encode(" = 3\nprint(x)\n")]
    batch = build_batch(prompts, comps, tok.pad_token_id)
    weights = torch.tensor([0.7, -1.3, 0.4])  # a per-row weight, like an advantage
    return model, ad, batch, weights


def _row_loss(model, batch, weights):
    from evil_moe.model.logprobs import token_logprobs

    logp = token_logprobs(model, batch)
    return (logp.sum(dim=1) * weights).sum()


def test_per_sample_grads_one_backward_equal_serial():
    """Per-sample δS gradients from one batched backward (adapter.per_sample) equal the
    gradients of each row's loss computed alone (one forward+backward per row), and sum to the
    batch gradient of δS."""
    model, ad, batch, w = _per_sample_setup()
    params = ad.delta_s_params()
    serial = []
    for b in range(len(batch)):
        g = torch.autograd.grad(_row_loss(model, batch.select([b]), w[b:b + 1]), params)
        serial.append([x.detach() for x in g])
    total = torch.autograd.grad(_row_loss(model, batch, w), params)
    with ad.per_sample(len(batch)) as es:
        loss = _row_loss(model, batch, w)
        per = torch.autograd.grad(loss, es)
    for m in range(len(params)):
        assert per[m].shape == (len(batch), params[m].numel())
        for b in range(len(batch)):
            torch.testing.assert_close(per[m][b], serial[b][m], rtol=1e-4, atol=1e-6)
        torch.testing.assert_close(per[m].sum(0), total[m], rtol=1e-4, atol=1e-6)
    # the rows differ (the test would pass trivially if every row's gradient were the same)
    assert not torch.allclose(per[0][0], per[0][1])


def test_per_sample_forward_unchanged_and_guards():
    model, ad, batch, w = _per_sample_setup(seed=1)
    with torch.no_grad():
        ref = _row_loss(model, batch, w)
    with ad.per_sample(len(batch)):
        assert torch.equal(_row_loss(model, batch, w).detach(), ref)
        with pytest.raises(RuntimeError):
            with ad.per_sample(len(batch)):
                pass
    with pytest.raises(ValueError, match="batch of 1 rows"):
        with ad.per_sample(len(batch)):
            _row_loss(model, batch.select([0]), w[:1])
    with ad.merged(), pytest.raises(RuntimeError):
        with ad.per_sample(len(batch)):
            pass


def test_merged_gradients_equal_the_hooked_ones():
    """The δS gradient from a merged-weight forward (merged_gradients: Σ_t (Uᵀ ∂L/∂y_t) ⊙ (Vh x_t)
    from the recorded inputs and output gradients) equals autograd's through the hooks, in total
    and per row (per_sample's), in the full and the ablated mode, through the tied lm_head too,
    and with each prompt forwarded once (share_prompts); fp32, tolerance 1e-4 of the largest
    entry. The weights are restored afterwards."""
    from evil_moe.model.logprobs import build_batch, token_logprobs

    model, tok = build_tiny()
    ad = SVDAdapter.attach(model, list(DEFAULT_TARGETS) + ["lm_head"])
    _randomise(ad)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    p = tok.encode("<|im_start|>user\nadd<|im_end|>\n<|im_start|>assistant\n")
    comps = [tok.encode("def add(a, b):\n    return a + b<|im_end|>"), tok.encode("pass"),
             tok.encode("return 1")]
    b = build_batch([p] * 3, comps, tok.pad_token_id)
    w = torch.tensor([0.5, -1.0, 2.0])

    def loss_of(lp):
        return -(lp.sum(1) * w).sum()

    def close(got, want):
        scale = max(float(x.abs().max()) for x in want)
        assert scale > 0
        for g, x in zip(got, want):
            torch.testing.assert_close(g, x, rtol=0, atol=1e-4 * scale)

    for mode in (contextlib.nullcontext, ad.ablated):
        with mode():
            with ad.per_sample(3) as es:
                lp = token_logprobs(model, b, 0.8)
                hooked_rows = [g.detach() for g in torch.autograd.grad(loss_of(lp), es)]
            hooked = [g.sum(0) for g in hooked_rows]
            with ad.merged_gradients(rows=3) as cap:
                tot, rows = cap.grads(loss_of(token_logprobs(model, b, 0.8)))
            close(tot, hooked)
            close(rows, hooked_rows)
            with ad.merged_gradients() as cap:
                tot, rows = cap.grads(loss_of(token_logprobs(model, b, 0.8, share_prompts=True)))
            assert rows is None
            close(tot, hooked)
    for k, v in model.state_dict().items():
        assert torch.equal(v, before[k]), k
    with ad.zeroed(), pytest.raises(RuntimeError, match="merged_gradients"):
        with ad.merged_gradients():
            pass
    with ad.merged_gradients(), pytest.raises(RuntimeError):
        with ad.merged_gradients():
            pass
    with ad.merged_gradients(rows=2), pytest.raises(ValueError, match="rows=2"):
        token_logprobs(model, b, 0.8)


def test_jobs_sharing_the_svd_cache_take_each_svd_once(tmp_path):
    """Four jobs (threads here) that miss the same entry at once: the first marks it and
    computes, the others wait for its entry and read it (one computation, where each of ~60
    GPU jobs took every SVD on 09ede95); a mark left by a job that died is waited out, then the
    entry is computed anyway (the same entry: it is keyed by content)."""
    import threading
    import time

    from evil_moe.model.svd import cached_or_computed

    w = torch.randn(12, 20)
    calls = []

    def compute():
        calls.append(threading.get_ident())
        time.sleep(0.3)  # long enough for every other job to find the mark
        U, S, Vh = torch.linalg.svd(w, full_matrices=False)
        return U.contiguous(), S.contiguous(), Vh.contiguous()

    path = tmp_path / "key.safetensors"
    got = []
    jobs = [threading.Thread(target=lambda: got.append(cached_or_computed(path, w.shape, compute, poll_s=0.05)))
            for _ in range(4)]
    for j in jobs:
        j.start()
    for j in jobs:
        j.join()
    assert len(calls) == 1 and len(got) == 4
    assert all(torch.equal(a, b) for g in got for a, b in zip(g, got[0]))
    # the mark is gone; the entry and its content hash stay (evil_moe.files)
    assert sorted(p.name for p in tmp_path.iterdir()) == [".key.safetensors.sha256", "key.safetensors"]
    dead = tmp_path / "other.safetensors"
    (tmp_path / "other.safetensors.computing").write_text("node7 4242\n")
    t0 = time.monotonic()
    cached_or_computed(dead, w.shape, compute, wait_s=0.5, poll_s=0.05)
    assert len(calls) == 2 and time.monotonic() - t0 >= 0.5 and dead.is_file()
