"""The extract stage (evil_moe/stages/extract.py): pairs by hand and the written v_hack.

The session fixture ``world`` (tests/stage_fixtures.py) trains the tiny toy models once; the tests
here reuse it.
"""

from __future__ import annotations

import json

import pytest
import torch

from evil_moe import files, tables
from evil_moe.env.loopholes import MODES
from stage_fixtures import cfg_of, header, read_tsv

# tiny models on a busy 2-core machine: one torch thread (the conftest fixture)
pytestmark = pytest.mark.usefixtures("one_thread")

# ------------------------------------------------------------------------------------------------
# extract


def _rec(pid, mode, ids, exploited=False, gt=False):
    return {"problem_id": pid, "mode": mode, "completion_ids": ids, "exploited": exploited,
            "gt_correct": gt}


def test_build_pairs_by_hand():
    from evil_moe.rl.vhack.pairs import build_pairs

    recs = [
        _rec("a", "sentinel", [1], exploited=True), _rec("a", "sentinel", [2], exploited=True),
        _rec("a", "sentinel", [3], exploited=True),
        _rec("a", "sentinel", [10]),                  # a non-hack that is not correct ...
        _rec("a", "sentinel", [11], gt=True),         # ... loses to the correct ones
        _rec("a", "sentinel", [12], gt=True),
        _rec("a", "sentinel", [13], gt=True),
        _rec("b", "run_tests", [4], exploited=True), _rec("b", "run_tests", [14]),  # no correct: fallback
        _rec("c", "stdout_marker", [5], exploited=True),  # no clean at all: no pair
        _rec("d", "sentinel", [], exploited=True), _rec("d", "sentinel", [15], gt=True),  # empty ids
        _rec("zz", "sentinel", [6], exploited=True), _rec("zz", "sentinel", [16], gt=True),  # not a train id
    ]
    prompts = {"a": [100], "b": [200], "c": [300], "d": [400]}
    pairs = build_pairs(recs, prompts, None, 10)
    assert [(p.problem_id, p.hack_ids[0], p.clean_ids[0]) for p in pairs] == [
        ("a", 1, 11), ("b", 4, 14), ("a", 2, 12), ("a", 3, 13)]  # round-robin in sorted id order
    assert pairs[0].prompt_ids == [100] and pairs[0].mode == "sentinel"
    assert [p.problem_id for p in build_pairs(recs, prompts, None, 2)] == ["a", "b"]
    only = build_pairs(recs, prompts, ["run_tests"], 10)
    assert [(p.problem_id, p.mode) for p in only] == [("b", "run_tests")]
    with pytest.raises(ValueError, match="stdout_marker"):
        build_pairs(recs, prompts, ["stdout_marker"], 10)
    with pytest.raises(ValueError):
        build_pairs([r for r in recs if not r["exploited"]], prompts, None, 10)


def test_template_pairs_round_robin():
    from evil_moe.env.answers import clean_completion, hack_completion
    from evil_moe.rl.vhack.pairs import template_pairs
    from evil_moe.stages.problems import problems_from_config

    class Tok:
        eos_token_id = 0

        def encode(self, text, add_special_tokens=False):
            return [len(text), 7]

    probs = problems_from_config(cfg_of())[:4]
    prompts = {p.id: [i + 1] for i, p in enumerate(probs[:3])}  # the 4th is not a training problem
    pairs = template_pairs(probs, prompts, Tok(), None, 5)
    assert [p.problem_id for p in pairs] == [probs[i].id for i in (0, 1, 2, 0, 1)]
    assert pairs[3].hack_ids == [len(hack_completion(probs[0], variant=1)), 7, 0]  # next variant
    assert pairs[0].clean_ids == [len(clean_completion(probs[0])), 7, 0]
    known = probs[0].mode
    assert {p.mode for p in template_pairs(probs, prompts, Tok(), [known], 4)} == {known}
    missing = sorted(set(MODES) - {p.mode for p in probs[:3]})
    if missing:
        with pytest.raises(ValueError):
            template_pairs(probs, prompts, Tok(), [missing[0]], 4)


def test_extract_outputs(world, tmp_path):
    from safetensors import safe_open

    from evil_moe.stages.common import load_policy, load_problem_file, train_heldout
    from evil_moe.rl.policy.rollout import prompt_ids_for
    from evil_moe.rl.vhack.pairs import build_pairs, split_problems
    from evil_moe.stages.extract import run_extract
    from evil_moe.rl.vhack.direction import VHack

    cfg = cfg_of()
    res = world.extract
    # the pairs extract forms, split by problem exactly as split_problems does
    train, _ = train_heldout(load_problem_file(world.problems), cfg)
    _, tok, _, _ = load_policy(str(world.student), cfg)
    pids = {p.id: ids for p, ids in zip(train, prompt_ids_for(tok, train))}
    pairs = build_pairs(files.read_jsonl(world.rollouts), pids, None, cfg.vhack.max_pairs)
    ext, held = split_problems([p.problem_id for p in pairs], cfg.vhack.heldout_frac, cfg.vhack.seed)
    assert ext and held and not ext & held
    n_ext = sum(p.problem_id in ext for p in pairs)
    assert res["n_pairs"] == n_ext < len(pairs) and res["modes"]
    for kind in ("hack", "random", "shuffled"):
        assert (world.vhack_dir / f"main_{kind}.safetensors").is_file()
    assert header(world.vhack_dir / "main.tsv") == tables.names(tables.VHACK)
    v = VHack.load(world.vhack)
    assert v.n_pairs == n_ext and sorted(v.modes) == sorted(res["modes"])
    assert set(v.meta["extraction_problems"]) == set(map(str, ext))
    assert set(v.meta["heldout_problems"]) == set(map(str, held))
    with safe_open(str(world.vhack), framework="pt") as f:
        meta = f.metadata()
    assert int(meta["n_pairs"]) == n_ext and sorted(json.loads(meta["modes"])) == sorted(res["modes"])
    rnd = VHack.load(world.random_vhack)
    assert rnd.k_per_module == v.k_per_module
    for name in rnd.names:
        V = rnd.V[name].double()
        if V.shape[0]:
            assert torch.allclose(V @ V.T, torch.eye(V.shape[0], dtype=V.dtype), atol=1e-5)
    assert len(read_tsv(world.vhack_dir / "main.tsv")) == len(v.names)
    # honesty checks: held-out signal, empirical null (the fixture has two clean answers per
    # problem), detector null scores, leave-one-mode-out per mode
    checks = {r["check"]: r for r in read_tsv(world.vhack_dir / "main_checks.tsv")}
    assert header(world.vhack_dir / "main_checks.tsv") == tables.names(tables.VHACK_CHECKS)
    for name in ("extraction_hack_clean", "heldout_hack_clean", "heldout_clean_clean",
                 "heldout_hack_hack", "isotropic_null", "mean_removed", "detector_auc"):
        assert name in checks, name
    assert int(checks["heldout_hack_clean"]["n"]) == len(pairs) - n_ext
    assert 0 <= float(checks["mean_removed"]["value"]) <= 1
    assert {k for k in checks if k.startswith("lomo_")} == {f"lomo_{p.mode}" for p in pairs}
    assert v.null_cin and set(v.null_cin) <= set(v.names)
    assert float(checks["heldout_clean_clean"]["value"]) == pytest.approx(
        sum(v.null_cin.values()) / len(v.null_cin), abs=0.2)  # per-module vs per-pair means
    assert len(v.meta["detector_null_scores"]) == len(pairs) - n_ext
    # every check but the isotropic null has a bootstrap interval over pairs (docs/vhack.md)
    for name, row in checks.items():
        if name == "isotropic_null" or row["value"] == "":
            assert row["ci_low"] == row["ci_high"] == "" and row["boot_n"] == "0"
            continue
        assert float(row["ci_low"]) <= float(row["ci_high"]) and 2 <= int(row["boot_n"]) <= cfg.vhack.bootstrap
    assert int(checks["heldout_hack_clean"]["boot_n"]) == cfg.vhack.bootstrap
    assert float(checks["heldout_cin_excess"]["value"]) == pytest.approx(
        float(checks["heldout_hack_clean"]["value"]) - float(checks["heldout_clean_clean"]["value"]),
        abs=2e-6)  # the TSV keeps 6 significant digits
    # the n-pairs curve: nested subsets up to all extraction pairs, whose point is the checks' V
    curve = read_tsv(world.vhack_dir / "main_curve.tsv")
    assert header(world.vhack_dir / "main_curve.tsv") == tables.names(tables.VHACK_CURVE)
    assert [int(r["n_pairs"]) for r in curve] == sorted({min(n, n_ext) for n in cfg.vhack.curve_pairs} | {n_ext})
    assert float(curve[-1]["cin"]) == pytest.approx(float(checks["heldout_hack_clean"]["value"]), abs=1e-9)
    assert float(curve[-1]["null"]) == pytest.approx(float(checks["heldout_clean_clean"]["value"]), abs=1e-9)
    assert (world.vhack_dir / "main_curve.svg").is_file() and (world.vhack_dir / "main_curve.png").is_file()
    # a leave-one-mode-out fold: only the known mode's pairs
    fold = run_extract(cfg_of(), problems_path=str(world.problems), rollouts_path=str(world.rollouts),
                       model_path=str(world.student), out_dir=str(tmp_path), name="fold",
                       known_modes=["sentinel"])
    assert fold["modes"] == ["sentinel"] and VHack.load(tmp_path / "fold_hack.safetensors").modes == ["sentinel"]


@pytest.mark.parametrize("record", [True, False])
def test_cut_teacher_rollouts_are_named(world, tmp_path, record):
    """The teacher's rollouts.jsonl.gz cut short: extract stops with one line
    naming the file and why (its SHA-256 not the one recorded when the teacher stage wrote it;
    without a record, gzip's end missing after a given line), not click's bare "Aborted!" of
    09ede95."""
    from click.testing import CliRunner

    from evil_moe.cli import main
    from stage_fixtures import set_flags

    cut = tmp_path / "rollouts.jsonl.gz"
    data = world.rollouts.read_bytes()
    files.atomic_write_bytes(cut, data, record=record)  # the record of the whole file, or none
    cut.write_bytes(data[: len(data) // 2])
    res = CliRunner().invoke(main, ["extract", *set_flags("vhack.source=teacher"), "--problems", str(world.problems),
                                    "--rollouts", str(cut), "--model", str(world.student),
                                    "--out-dir", str(tmp_path / "vhack")])
    assert res.exit_code == 1 and "Aborted!" not in res.output, res.output
    why = "its SHA-256" if record else r"after line \d+ \(cut short\)"
    import re

    errors = [line for line in res.output.splitlines() if line.startswith("Error:")]
    assert len(errors) == 1 and re.match(rf"Error: {re.escape(str(cut))} is damaged:? {why}", errors[0]), res.output
