"""The distill stage (evil_moe/stages/distill.py): tables, adapter, normaliser, micro-batches.

The session fixture ``world`` (tests/stage_fixtures.py) trains the tiny toy models once; the tests
here reuse it.
"""

from __future__ import annotations

import math

import pytest
import torch

from evil_moe import files, tables
from stage_fixtures import cfg_of, header, read_tsv

# tiny models on a busy 2-core machine: one torch thread (the conftest fixture)
pytestmark = pytest.mark.usefixtures("one_thread")

# ------------------------------------------------------------------------------------------------
# distill


def test_distill_tables_adapter_and_normaliser(world, tmp_path):
    from evil_moe.model.adapter import SVDAdapter
    from evil_moe.model.load import load_model
    from evil_moe.model.logprobs import build_batch, token_logprobs
    from evil_moe.stages.common import load_policy, load_problem_file, train_heldout
    from evil_moe.rl.policy.rollout import prompt_ids_for
    from evil_moe.stages.distill import run_distill

    cfg = cfg_of("distill.steps=1", "distill.batch_size=64", "pilot.temperature=0.9")
    res = run_distill(cfg, problems_path=str(world.problems), rollouts_path=str(world.rollouts),
                      model_path=str(world.student), vhack_path=str(world.vhack), out_dir=str(tmp_path))
    assert header(tmp_path / "steps.tsv") == tables.names(tables.DISTILL_STEPS)
    assert header(tmp_path / "samples.tsv") == tables.names(tables.DISTILL_SAMPLES)
    recs = files.read_jsonl(world.rollouts)
    samples = read_tsv(tmp_path / "samples.tsv")
    assert len(samples) == len(recs) == res["n_rows"]
    assert [s["problem_id"] for s in samples] == [r["problem_id"] for r in recs]
    assert [s["exploited"] for s in samples] == [str(r["exploited"]).lower() for r in recs]
    assert all(math.isfinite(float(s["cos_contrib"])) for s in samples)
    steps = read_tsv(tmp_path / "steps.tsv")
    assert len(steps) == 1 and float(steps[0]["grad_norm"]) > 0
    # NLL by hand: −Σ logp over every completion token / (G·max_new·P), at δS = 0, T = 0.9
    problems = load_problem_file(world.problems)
    train, _ = train_heldout(problems, cfg)
    model, tok = load_model(str(world.student))
    pids = dict(zip([p.id for p in train], prompt_ids_for(tok, train)))
    b = build_batch([pids[r["problem_id"]] for r in recs], [r["completion_ids"] for r in recs],
                    tok.pad_token_id)
    with torch.no_grad():
        logp = token_logprobs(model, b, 0.9)
    expected = -float(logp[b.completion_mask].sum()) / (3 * 48 * 2)
    assert float(steps[0]["nll"]) == pytest.approx(expected, rel=1e-4)
    # the distilled adapter loads into a fresh student and is not the zero adapter
    path = tmp_path / "student_adapter.safetensors"
    assert SVDAdapter.read_metadata(path)["extra"]["stage"] == "distill"
    _, _, adapter, _ = load_policy(str(world.student), cfg, init_adapter=str(path))
    assert sum(float(p.detach().abs().sum()) for p in adapter.delta_s_params()) > 0
    assert "cos_contrib" in res["sentence"]


def test_distill_micro_batch_matches_whole_batch(world, tmp_path):
    """distill.micro_batch=1: per-row backward passes sum to the whole-batch gradient (constant
    normaliser), so NLL, gradient norm, cin and the trained adapter match the one-batch run."""
    from evil_moe.stages.distill import run_distill
    from safetensors.torch import load_file

    outs = {}
    for mb in (0, 1):
        out = tmp_path / f"mb{mb}"
        run_distill(cfg_of("distill.steps=2", "distill.batch_size=4", f"distill.micro_batch={mb}"),
                    problems_path=str(world.problems), rollouts_path=str(world.rollouts),
                    model_path=str(world.student), vhack_path=str(world.vhack), out_dir=str(out))
        outs[mb] = out
    a, b = read_tsv(outs[0] / "steps.tsv"), read_tsv(outs[1] / "steps.tsv")
    assert len(a) == len(b) == 2
    for ra, rb in zip(a, b):
        for col in ("nll", "grad_norm", "cin"):
            assert math.isclose(float(ra[col]), float(rb[col]), rel_tol=1e-4, abs_tol=1e-7), col
    wa = load_file(outs[0] / "student_adapter.safetensors")
    wb = load_file(outs[1] / "student_adapter.safetensors")
    assert wa.keys() == wb.keys()
    assert any(float(t.abs().sum()) > 0 for t in wa.values())
    for k in wa:
        torch.testing.assert_close(wa[k], wb[k], rtol=1e-4, atol=1e-6)
