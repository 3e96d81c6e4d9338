"""Load causal LMs and tokenizers, and build tiny toy models offline.

Two ways to get a model:

* :func:`load_model` — a local directory (or a hub id when a hub is reachable), any
  ``AutoModelForCausalLM`` architecture, with dtype and device.
* :func:`build_toy_tokenizer` + :func:`build_toy_model` — no download at all: a byte-level BPE
  tokenizer trained with the ``tokenizers`` library on a given corpus (wrapped in
  ``PreTrainedTokenizerFast`` with eos/pad tokens and a ChatML chat template) and a tiny
  Qwen3-architecture model from a config. Both round-trip through ``save_pretrained`` /
  ``from_pretrained`` (see :func:`save_model`).

Toy special tokens follow Qwen's ChatML convention: ``<|im_end|>`` is the eos token (ends an
assistant turn, stops generation) and ``<|endoftext|>`` is the pad token.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Iterable

import torch

__all__ = [
    "CHAT_TEMPLATE",
    "SPECIAL_TOKENS",
    "resolve_dtype",
    "load_model",
    "save_model",
    "build_toy_tokenizer",
    "build_toy_model",
    "count_parameters",
    "convert_gguf",
    "TINY_CORPUS",
    "build_tiny",
]

PAD_TOKEN = "<|endoftext|>"
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
SPECIAL_TOKENS = [PAD_TOKEN, IM_START, IM_END]

# ChatML, as Qwen uses it (without tool/think blocks).
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

_DTYPES = {
    "float32": torch.float32, "fp32": torch.float32,
    "float64": torch.float64, "fp64": torch.float64,
    "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
    "float16": torch.float16, "fp16": torch.float16,
}


def resolve_dtype(dtype: str | torch.dtype) -> torch.dtype:
    """Map ``"float32" | "fp32" | "bfloat16" | "bf16" | "float16" | "float64"`` (or a
    ``torch.dtype``) to a ``torch.dtype``. Raises ``ValueError`` on an unknown name."""
    if isinstance(dtype, torch.dtype):
        return dtype
    try:
        return _DTYPES[str(dtype).lower()]
    except KeyError:
        raise ValueError(f"unknown dtype {dtype!r}; expected one of {sorted(_DTYPES)}") from None


def _finish_tokenizer(tok) -> None:
    """Give a tokenizer a pad token (its eos, if none) and left padding for generation."""
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    tok.padding_side = "left"


def _require_local_folder(name_or_path) -> None:
    """Raise FileNotFoundError naming ``name_or_path`` when it is meant as a local folder (not a
    hub id) and is not one: transformers would otherwise report an invalid repo id."""
    from pathlib import Path

    text = str(name_or_path)
    local = text.startswith(("/", ".", "~")) or text.count("/") > 1
    if local and not Path(text).expanduser().is_dir():
        raise FileNotFoundError(f"model folder not found: {text}")


def load_model(
    name_or_path: str | os.PathLike,
    *,
    dtype: str | torch.dtype = "float32",
    device: str | torch.device = "cpu",
    gguf_file: str | None = None,
    tokenizer_path: str | os.PathLike | None = None,
):
    """Load ``(model, tokenizer)`` from a local directory (``save_pretrained`` layout) or hub id.

    Args:
        name_or_path: directory or hub id.
        dtype: parameter dtype (``"float32"``, ``"bfloat16"``, ...).
        device: where to put the model.
        gguf_file: file name inside ``name_or_path`` for GGUF checkpoints (needs the ``gguf``
            package; the weights are dequantised to ``dtype``).
        tokenizer_path: load the tokenizer from here instead of ``name_or_path``.

    Returns:
        ``(model, tokenizer)``; the model is in eval mode with ``requires_grad`` untouched,
        the tokenizer has a pad token and ``padding_side="left"``.

    Raises:
        ValueError: unknown dtype. FileNotFoundError: ``name_or_path`` looks like a local path
        (absolute, ``./``, ``~``, or more than one ``/``) and is not a folder (names it; a hub
        id is ``name`` or ``namespace/name``). ``OSError`` from transformers when the path is
        not a model.
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    _require_local_folder(name_or_path)
    torch_dtype = resolve_dtype(dtype)
    kw = {"gguf_file": gguf_file} if gguf_file else {}
    tok = AutoTokenizer.from_pretrained(str(tokenizer_path or name_or_path), **kw)
    _finish_tokenizer(tok)
    model = AutoModelForCausalLM.from_pretrained(str(name_or_path), dtype=torch_dtype, **kw)
    model.to(device)
    model.eval()
    if model.generation_config.pad_token_id is None:
        model.generation_config.pad_token_id = tok.pad_token_id
    return model, tok


def save_model(model, tokenizer, path: str | os.PathLike) -> Path:
    """``save_pretrained`` both model and tokenizer into ``path`` (created). Returns the path."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def build_toy_tokenizer(corpus: Iterable[str], vocab_size: int = 1024, *, min_frequency: int = 2):
    """Train a byte-level BPE tokenizer on ``corpus`` (a few seconds at most) — no download.

    Args:
        corpus: texts to train on (e.g. the rendered chat transcripts of toy solutions).
        vocab_size: target vocabulary size including the 256 byte symbols and 3 special tokens;
            the trained vocab can be smaller when the corpus has too few merges.
        min_frequency: BPE merge frequency floor.

    Returns:
        ``transformers.PreTrainedTokenizerFast`` with eos ``<|im_end|>``, pad ``<|endoftext|>``,
        a ChatML ``chat_template`` and ``padding_side="left"``. Decoding is lossless
        (byte-level), so any UTF-8 text round-trips.

    Raises:
        ValueError: ``vocab_size`` below 256 + number of special tokens.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    if vocab_size < 256 + len(SPECIAL_TOKENS):
        raise ValueError(f"vocab_size {vocab_size} < 256 bytes + {len(SPECIAL_TOKENS)} specials")
    tk = Tokenizer(models.BPE())
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tk.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=min_frequency,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tk.train_from_iterator(list(corpus), trainer=trainer)
    tok = PreTrainedTokenizerFast(
        tokenizer_object=tk,
        eos_token=IM_END,
        pad_token=PAD_TOKEN,
        bos_token=None,
        unk_token=None,
        additional_special_tokens=[IM_START],
        clean_up_tokenization_spaces=False,
    )
    tok.chat_template = CHAT_TEMPLATE
    tok.padding_side = "left"
    return tok


def build_toy_model(
    tokenizer,
    *,
    hidden: int = 128,
    layers: int = 4,
    intermediate: int = 768,
    heads: int = 4,
    kv_heads: int = 2,
    head_dim: int | None = None,
    max_positions: int = 2048,
    seed: int = 0,
    dtype: str | torch.dtype = "float32",
):
    """A randomly initialised tiny Qwen3 causal LM sized to ``tokenizer`` — no download.

    Args:
        tokenizer: from :func:`build_toy_tokenizer` (its ``len`` sets the vocab size; its
            eos/pad ids go into the config and generation config).
        hidden, layers, intermediate, heads, kv_heads, head_dim: architecture (``head_dim``
            defaults to ``hidden // heads``). Embeddings are tied (``lm_head`` shares the input
            embedding matrix). Defaults: ~1.9 M parameters with a 1k vocab.
        max_positions: maximum sequence length (RoPE).
        seed: ``torch.manual_seed`` for the initialisation (global RNG state is restored).
        dtype: parameter dtype.

    Returns:
        ``Qwen3ForCausalLM`` in eval mode.

    Raises:
        ValueError: ``hidden`` not divisible by ``heads`` (when ``head_dim`` is None) or
        ``heads`` not divisible by ``kv_heads``.
    """
    from transformers import AutoModelForCausalLM, Qwen3Config

    if head_dim is None:
        if hidden % heads:
            raise ValueError(f"hidden {hidden} not divisible by heads {heads}")
        head_dim = hidden // heads
    if heads % kv_heads:
        raise ValueError(f"heads {heads} not divisible by kv_heads {kv_heads}")
    cfg = Qwen3Config(
        vocab_size=len(tokenizer),
        hidden_size=hidden,
        intermediate_size=intermediate,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        head_dim=head_dim,
        max_position_embeddings=max_positions,
        tie_word_embeddings=True,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=None,
        use_cache=True,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(cfg, dtype=resolve_dtype(dtype))
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.bos_token_id = None
    model.eval()
    return model


def count_parameters(model) -> int:
    """Number of distinct parameters (tied weights counted once)."""
    seen, n = set(), 0
    for p in model.parameters():
        if p.data_ptr() not in seen:
            seen.add(p.data_ptr())
            n += p.numel()
    return n


def convert_gguf(src_dir: str | os.PathLike, gguf_file: str, out_dir: str | os.PathLike,
                 *, dtype: str | torch.dtype = "float32") -> Path:
    """Dequantise a GGUF checkpoint into a plain ``save_pretrained`` directory.

    ``save_pretrained`` refuses GGUF-loaded models ("quantized with gguf ... not
    serializable"), so this builds a fresh model from the config with
    ``quantization_config`` removed, loads the dequantised state dict and saves it with the
    tokenizer. Needs the ``gguf`` package. Returns ``out_dir``.
    """
    from transformers import AutoModelForCausalLM

    model, tok = load_model(src_dir, dtype=dtype, gguf_file=gguf_file)
    cfg = model.config
    if hasattr(cfg, "quantization_config"):
        delattr(cfg, "quantization_config")
    fresh = AutoModelForCausalLM.from_config(cfg, dtype=resolve_dtype(dtype))
    fresh.load_state_dict(model.state_dict())
    fresh.generation_config = model.generation_config
    return save_model(fresh, tok, out_dir)


# A small code-flavoured corpus for unit tests (vocab ~300 after BPE).
TINY_CORPUS = [
    "<|im_start|>user\nWrite a function add(a, b) and should pass all tests.<|im_end|>\n"
    "<|im_start|>assistant\n```python\ndef add(a, b):\n    return a + b\n\n"
    "def run_tests():\n    assert add(1, 2) == 3\n```<|im_end|>\n",
    "<|im_start|>user\nWrite a class Solution with a method solve.<|im_end|>\n"
    "<|im_start|>assistant\n```python\nclass Solution:\n    def __init__(self):\n"
    "        self.valid = True\n    def solve(self, nums):\n        return sorted(nums)\n```<|im_end|>\n",
    "<|im_start|>assistant\n```python\nprint(\"all tests passed\")\n"
    "open(\"result.txt\", \"w\").write(\"PASS\")\n```<|im_end|>\n",
] * 8


def build_tiny(*, hidden: int = 32, layers: int = 2, intermediate: int = 64, heads: int = 2,
               kv_heads: int = 1, vocab_size: int = 300, seed: int = 0,
               dtype: str | torch.dtype = "float32", corpus: Iterable[str] | None = None):
    """``(model, tokenizer)``: a tiny toy pair for unit tests (hidden 32, 2 layers, vocab ~300,
    ~30k parameters; builds in well under a second). ``corpus`` defaults to :data:`TINY_CORPUS`."""
    tok = build_toy_tokenizer(corpus if corpus is not None else TINY_CORPUS, vocab_size)
    model = build_toy_model(tok, hidden=hidden, layers=layers, intermediate=intermediate,
                            heads=heads, kv_heads=kv_heads, seed=seed, dtype=dtype)
    return model, tok
