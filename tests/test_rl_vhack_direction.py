"""v_hack extraction: the GRPO identity, orientation, floors, controls, save/load."""

import pytest
import torch

from evil_moe.rl.policy.grpo import DrGRPONormaliser, RolloutBatch, behaviour_logp, dr_grpo_loss
from evil_moe.model.adapter import DEFAULT_TARGETS, SVDAdapter
from evil_moe.model.load import build_tiny
from evil_moe.model.logprobs import token_logprobs
from evil_moe.rl.vhack.direction import (Pair, VHack, extract_vhack, pair_gradients, random_vhack, select_pairs)


@pytest.fixture(scope="module")
def toy():
    model, tok = build_tiny(seed=5, dtype="float64")
    ad = SVDAdapter.attach(model, list(DEFAULT_TARGETS) + ["lm_head"])
    enc = lambda s: tok.encode(s, add_special_tokens=False)  # noqa: E731
    prompt = enc("<|im_start|>user\nWrite add(a, b).<|im_end|>\n<|im_start|>assistant\n")
    hack = enc('```python\nprint("all tests passed")\n```<|im_end|>')
    clean = enc("```python\ndef add(a, b):\n    return a + b\n```<|im_end|>")
    pairs = [Pair(prompt, hack, clean, mode="stdout_marker", problem_id="p0")]
    for i, (m, h) in enumerate([("sentinel", "self.valid = True"), ("run_tests", "def run_tests():\n    pass"),
                                ("file_marker", 'open("result.txt", "w").write("PASS")')]):
        pairs.append(Pair(prompt[:-1 - i] + prompt[-1:], enc(h + "<|im_end|>"),
                          enc("def solve(nums):\n    return sorted(nums)<|im_end|>"), mode=m, problem_id=f"p{i+1}"))
    return model, tok, ad, pairs


def test_grpo_gradient_equals_pair_gradient_fp64(toy):
    """A = +1 on hack, −1 on clean, one group of 2, on-policy Dr.GRPO, same normaliser ⇒
    ∇L_GRPO = ∇NLL(hack) − ∇NLL(clean)."""
    model, tok, ad, pairs = toy
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():  # a non-trivial adapter point
        for p in ad.delta_s_params():
            p.copy_(torch.randn(p.shape, generator=g, dtype=p.dtype) * 0.05)
    try:
        for pair in pairs[:2]:
            norm = DrGRPONormaliser(group=2, max_new=64, prompts_per_step=1)
            D = pair_gradients(model, ad, [pair], norm, temperature=0.9)
            from evil_moe.model.logprobs import build_batch

            b = build_batch([pair.prompt_ids] * 2, [pair.hack_ids, pair.clean_ids], tok.pad_token_id)
            rows = RolloutBatch(b, torch.tensor([1.0, -1.0], dtype=torch.float64), ["student", "student"])
            for p in ad.parameters():
                p.grad = None
            logp = token_logprobs(model, b, 0.9)
            loss, st = dr_grpo_loss(logp, behaviour_logp(rows, logp), rows.advantages,
                                    b.completion_mask, norm, clip_eps=0.2)
            loss.backward()
            assert st.frac_clipped == 0
            for name, knob in ad.modules_.items():
                want = D[name][0]
                assert torch.allclose(knob.delta_s.grad, want, rtol=1e-6, atol=1e-12), name
            assert max(float(d.abs().max()) for d in D.values()) > 1e-6
            # a different normaliser breaks the identity (by the ratio of constants)
            D2 = pair_gradients(model, ad, [pair], DrGRPONormaliser(2, 32, 1), temperature=0.9)
            name = ad.names[0]
            assert torch.allclose(D2[name], 2 * D[name], rtol=1e-9)
    finally:
        with torch.no_grad():
            for p in ad.delta_s_params():
                p.zero_()
        for p in ad.parameters():
            p.grad = None


def test_pair_gradients_shape_and_grads_untouched(toy):
    model, tok, ad, pairs = toy
    norm = DrGRPONormaliser(2, 64, 1)
    D = pair_gradients(model, ad, pairs, norm)
    assert list(D) == ad.names
    for n, d in D.items():
        assert d.shape == (len(pairs), ad.r[n])
    assert all(p.grad is None for p in ad.parameters())
    with pytest.raises(ValueError):
        pair_gradients(model, ad, [Pair(pairs[0].prompt_ids, [], [1])], norm)


def _one_backward_per_completion(model, ad, prompts, comps, norm, temperature):
    """The reference: each completion alone in its own forward, its own autograd.grad on δS."""
    from evil_moe.model.logprobs import build_batch
    from evil_moe.rl.policy.grpo import nll_loss

    rows = {n: [] for n in ad.names}
    for p, c in zip(prompts, comps):
        b = build_batch([p], [c], 0)
        loss = nll_loss(token_logprobs(model, b, temperature), b.completion_mask, norm)
        grads = torch.autograd.grad(loss, ad.delta_s_params(), allow_unused=True)
        for n, prm, g in zip(ad.names, ad.delta_s_params(), grads):
            rows[n].append(torch.zeros_like(prm) if g is None else g)
    return {n: torch.stack(v) for n, v in rows.items()}


@pytest.mark.parametrize("micro_batch", [1, 3, 8])
def test_completion_gradients_batched_equal_one_backward_each(toy, micro_batch):
    """Per-completion gradients from one backward per micro-batch (per-row knob copies,
    rows sorted by length and padded) equal one forward and backward per completion, in the
    input order, at a non-zero δS; the knobs' .grad stays untouched."""
    from evil_moe.rl.vhack.direction import completion_gradients

    model, tok, ad, pairs = toy
    prompts = [p.prompt_ids for p in pairs for _ in (0, 1)]
    comps = [c for p in pairs for c in (p.hack_ids, p.clean_ids)]
    assert len({len(p) + len(c) for p, c in zip(prompts, comps)}) > 3  # padding is exercised
    norm = DrGRPONormaliser(2, 64, 1)
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in ad.delta_s_params():
            p.copy_(torch.randn(p.shape, generator=g, dtype=p.dtype) * 0.05)
    try:
        want = _one_backward_per_completion(model, ad, prompts, comps, norm, 0.8)
        done = []
        got = completion_gradients(model, ad, prompts, comps, norm, 0.8, micro_batch=micro_batch,
                                   progress=done.append)
        assert sum(done) == len(comps) and len(done) == -(-len(comps) // micro_batch)
        for n in ad.names:
            assert got[n].shape == want[n].shape
            assert torch.allclose(got[n], want[n], rtol=1e-9, atol=1e-14), n
        assert max(float(w.abs().max()) for w in want.values()) > 1e-6
        assert all(p.grad is None for p in ad.parameters())
    finally:
        with torch.no_grad():
            for p in ad.delta_s_params():
                p.zero_()
    with pytest.raises(ValueError, match="micro_batch"):
        completion_gradients(model, ad, prompts, comps, norm, micro_batch=0)
    with pytest.raises(ValueError, match="row 1"):
        completion_gradients(model, ad, prompts[:2], [comps[0], []], norm)


def test_select_pairs_known_modes(toy):
    *_, pairs = toy
    got = select_pairs(pairs, ["sentinel", "run_tests"])
    assert [p.mode for p in got] == ["sentinel", "run_tests"]
    assert len(select_pairs(pairs, None)) == 4
    with pytest.raises(ValueError):
        select_pairs(pairs, ["nope"])


def _synthetic_D(n=40, r=16, seed=0):
    """Pairs that share a hack direction u (plus noise): D_p = a_p u + noise, a_p > 0 mostly."""
    g = torch.Generator().manual_seed(seed)
    u = torch.randn(r, generator=g, dtype=torch.float64)
    u /= u.norm()
    a = 1.0 + 0.3 * torch.randn(n, generator=g, dtype=torch.float64)
    D = a[:, None] * u + 0.05 * torch.randn(n, r, generator=g, dtype=torch.float64)
    return {"m.a": D, "m.b": 0.01 * torch.randn(n, r // 2, generator=g, dtype=torch.float64)}, u


def test_extract_orthonormal_oriented_and_recovers_direction():
    D, u = _synthetic_D()
    vh = extract_vhack({k: -v for k, v in D.items()} | {"m.a": D["m.a"]}, k=3)
    V = vh.V["m.a"]
    assert V.shape == (3, 16) and V.dtype == torch.float32
    assert torch.allclose(V @ V.T, torch.eye(3), atol=1e-5)
    assert float(V[0].double() @ u) > 0.99  # top row is u, oriented hack-ward
    assert (vh.agreement["m.a"][0] > 0.9)
    assert (D["m.a"] @ V[0].double() > 0).float().mean() > 0.9
    s = vh.singular_values["m.a"]
    assert (s[:-1] >= s[1:]).all()
    # orientation follows the data: flipping every pair flips V
    vh_neg = extract_vhack({"m.a": -D["m.a"]}, k=1)
    assert torch.allclose(vh_neg.V["m.a"][0], -V[0], atol=1e-5)


def test_floors():
    D, _ = _synthetic_D()
    full = extract_vhack(D, k=4)
    assert full.k_per_module == {"m.a": 4, "m.b": 4}
    rf = extract_vhack(D, k=4, ratio_floor=0.5)
    assert rf.k_per_module["m.a"] == 1  # one dominant axis
    qf = extract_vhack(D, k=4, quantile_floor=0.5)
    assert qf.k_per_module["m.b"] == 0 and qf.k_per_module["m.a"] == 4  # m.b is all noise
    assert qf.V["m.b"].shape == (0, 8)
    with pytest.raises(ValueError):
        extract_vhack(D, k=0)
    with pytest.raises(ValueError):
        extract_vhack(D, k=2, quantile_floor=1.0)
    with pytest.raises(ValueError):
        extract_vhack({"a": torch.zeros(3, 4), "b": torch.zeros(2, 4)}, k=1)


def test_random_control_same_k_orthonormal_seeded():
    D, u = _synthetic_D()
    vh = extract_vhack(D, k=3, ratio_floor=0.01)
    rnd = random_vhack(vh, seed=1)
    assert rnd.control == "random" and rnd.k_per_module == vh.k_per_module and rnd.r == vh.r
    for n, V in rnd.V.items():
        assert torch.allclose(V @ V.T, torch.eye(V.shape[0]), atol=1e-5)
    assert all(torch.equal(rnd.V[n], random_vhack(vh, seed=1).V[n]) for n in rnd.V)
    assert not torch.equal(rnd.V["m.a"], random_vhack(vh, seed=2).V["m.a"])
    assert abs(float(rnd.V["m.a"][0].double() @ u)) < 0.9
    d = random_vhack({"x": 10}, k=2, seed=0)
    assert d.V["x"].shape == (2, 10)


def test_shuffled_control_same_span_random_orientation():
    D, u = _synthetic_D(n=41)
    real = extract_vhack(D, k=2)
    flips = []
    for seed in range(6):
        sh = extract_vhack(D, k=2, control="shuffled", seed=seed)
        assert sh.control == "shuffled" and sh.seed == seed
        # DᵀD is invariant to per-pair sign flips: same singular values and span
        assert torch.allclose(sh.singular_values["m.a"], real.singular_values["m.a"], rtol=1e-5)
        assert torch.allclose((sh.V["m.a"][0] @ real.V["m.a"][0]).abs(), torch.tensor(1.0), atol=1e-4)
        flips.append(float(sh.V["m.a"][0] @ real.V["m.a"][0]) < 0)
        assert sh.agreement["m.a"][0] < 0.8  # the vote is no longer near-unanimous
    assert any(flips) and not all(flips)
    assert torch.equal(extract_vhack(D, k=2, control="shuffled", seed=3).V["m.a"],
                       extract_vhack(D, k=2, control="shuffled", seed=3).V["m.a"])


def test_save_load_roundtrip(tmp_path):
    D, _ = _synthetic_D()
    vh = extract_vhack(D, k=3, quantile_floor=0.5, modes=["sentinel", "run_tests"], meta={"src": "t"})
    p = vh.save(tmp_path / "v.safetensors")
    back = VHack.load(p)
    assert back.names == vh.names and back.k == 3 and back.n_pairs == 40
    assert back.modes == ["run_tests", "sentinel"] and back.control == "none" and back.meta == {"src": "t"}
    for n in vh.names:
        assert torch.equal(back.V[n], vh.V[n]) and torch.equal(back.singular_values[n], vh.singular_values[n])
    rnd = random_vhack(vh, seed=4)
    back_r = VHack.load(rnd.save(tmp_path / "r.safetensors"))
    assert back_r.control == "random" and back_r.seed == 4
    from safetensors.torch import save_file
    save_file({"x": torch.zeros(1)}, str(tmp_path / "bad.safetensors"))
    with pytest.raises(ValueError):
        VHack.load(tmp_path / "bad.safetensors")
