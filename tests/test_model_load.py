"""Toy model/tokenizer building and save/load round trips (offline)."""

import torch

from evil_moe.model.load import (build_tiny, build_toy_model, build_toy_tokenizer, count_parameters,
                                 load_model, resolve_dtype, save_model, TINY_CORPUS)
from evil_moe.rl.policy.rollout import chat_prompt_ids


def test_toy_tokenizer_specials_and_chat_template():
    tok = build_toy_tokenizer(TINY_CORPUS, 300)
    assert len(tok) <= 300
    assert tok.eos_token == "<|im_end|>" and tok.pad_token == "<|endoftext|>"
    assert tok.eos_token_id != tok.pad_token_id
    ids = chat_prompt_ids(tok, [{"role": "user", "content": "def f(): pass"}])
    text = tok.decode(ids)
    assert text == "<|im_start|>user\ndef f(): pass<|im_end|>\n<|im_start|>assistant\n"
    # byte-level: arbitrary unicode round-trips
    s = "naïve ∑ café\tx"
    assert tok.decode(tok.encode(s, add_special_tokens=False)) == s


def test_toy_model_save_load_roundtrip(tmp_path):
    model, tok = build_tiny(seed=3)
    assert count_parameters(model) < 100_000
    assert model.config.tie_word_embeddings
    save_model(model, tok, tmp_path / "m")
    m2, t2 = load_model(tmp_path / "m")
    x = torch.tensor([tok.encode("def add(a, b):")])
    with torch.no_grad():
        assert torch.equal(model(x).logits, m2(x).logits)
    assert t2.eos_token_id == tok.eos_token_id and t2.padding_side == "left"
    assert t2.chat_template == tok.chat_template


def test_toy_model_seeded_and_sized():
    tok = build_toy_tokenizer(TINY_CORPUS, 300)
    a = build_toy_model(tok, hidden=32, layers=2, intermediate=64, heads=2, kv_heads=1, seed=1)
    b = build_toy_model(tok, hidden=32, layers=2, intermediate=64, heads=2, kv_heads=1, seed=1)
    c = build_toy_model(tok, hidden=32, layers=2, intermediate=64, heads=2, kv_heads=1, seed=2)
    sa, sb, sc = a.state_dict(), b.state_dict(), c.state_dict()
    assert all(torch.equal(sa[k], sb[k]) for k in sa)
    assert not all(torch.equal(sa[k], sc[k]) for k in sa)
    assert a.config.vocab_size == len(tok) and a.config.num_hidden_layers == 2
    assert resolve_dtype("bf16") == torch.bfloat16


def test_a_missing_local_model_folder_is_named(tmp_path):
    """A path that is meant as a folder (absolute, ./, or several /) and is missing is reported as
    such, not as transformers' "Repo id must be in the form ..." (the walkthrough's finding)."""
    import pytest

    from evil_moe.model.load import load_model

    for missing in (str(tmp_path / "nomodel"), "./results/models/none", "results/models/none"):
        with pytest.raises(FileNotFoundError, match="model folder not found: " + missing.replace(".", r"\.")):
            load_model(missing, device="cpu")


# Qwen3's chat template ends with this (Qwen/Qwen3-4B tokenizer_config.json): without
# enable_thinking=False the model opens its own <think> block after the generation prompt.
QWEN3_GENERATION_PROMPT = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}"
    "{%- if enable_thinking is defined and enable_thinking is false %}"
    "{{- '<think>\\n\\n</think>\\n\\n' }}{%- endif %}{%- endif %}")


def test_chat_template_kwargs_reach_the_template_and_empty_ones_change_nothing():
    """models.chat_template_kwargs: empty (the embedded default) or given to the toy template,
    which takes none, the prompt's ids are the ChatML rendering written out here, byte for byte;
    Qwen3's template with enable_thinking false closes an empty think block after the generation
    prompt (config/pilot.yaml's setting), and leaves it open to the model without."""
    tok = build_toy_tokenizer(TINY_CORPUS, 300)
    msgs = [{"role": "user", "content": "def f(): pass"}]
    want = tok.encode("<|im_start|>user\ndef f(): pass<|im_end|>\n<|im_start|>assistant\n",
                      add_special_tokens=False)
    for kwargs in (None, {}, {"enable_thinking": False}):
        assert chat_prompt_ids(tok, msgs, kwargs) == want
    tok.chat_template = QWEN3_GENERATION_PROMPT
    assert chat_prompt_ids(tok, msgs) == want
    off = chat_prompt_ids(tok, msgs, {"enable_thinking": False})
    assert off == want + tok.encode("<think>\n\n</think>\n\n", add_special_tokens=False)
