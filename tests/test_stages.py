"""The pipeline stages (issue 4) on a tiny toy world: problems, teacher, extract, distill, pilot
(resume after SIGKILL, stop rules, paired design) and one end-to-end run through the CLI.

The session fixture ``world`` (tests/stage_fixtures.py) trains the tiny toy models once (~1 min
on 2 busy cores); everything else reuses it.
"""

from __future__ import annotations

import dataclasses
import gzip
import json
import math
import signal
import subprocess
import time
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

from evil_moe import tables
from evil_moe.cli import main
from stage_fixtures import (cfg_of, evil_moe_cmd, header, pilot_kwargs, read_tsv, set_flags,
                            subprocess_env, tsv_without)

# tiny models on a busy 2-core machine: one torch thread (the conftest fixture)
pytestmark = pytest.mark.usefixtures("one_thread")


# ------------------------------------------------------------------------------------------------
# problems


def test_problems_modes_split_evenly_and_round_trip(tmp_path):
    from collections import Counter

    from evil_moe.env.problems import read_problems
    from evil_moe.stages.problems import problems_from_config, write_problem_set

    cfg = cfg_of()
    out = tmp_path / "problems.jsonl"
    written = write_problem_set(cfg, str(out))
    assert len(written) == 12
    assert Counter(p.mode for p in written) == {m: 3 for m in tables.MODES}
    assert read_problems(out) == written
    assert problems_from_config(cfg) == written  # deterministic from problems.seed
    # an uneven count splits as evenly as possible
    odd = problems_from_config(cfg_of("problems.limit=10"))
    counts = Counter(p.mode for p in odd)
    assert set(counts) == set(tables.MODES) and max(counts.values()) - min(counts.values()) <= 1
    forced = problems_from_config(cfg_of("problems.force_mode=sentinel"))
    assert {p.mode for p in forced} == {"sentinel"}


def test_problems_missing_leetcode_path_names_it(tmp_path):
    from evil_moe.stages.problems import write_problem_set

    missing = tmp_path / "nope" / "leetcode.jsonl"
    with pytest.raises(FileNotFoundError, match=str(missing)):
        write_problem_set(cfg_of("problems.source=leetcode", f"problems.path={missing}"),
                          str(tmp_path / "p.jsonl"))
    with pytest.raises(FileNotFoundError, match="problems.path"):
        write_problem_set(cfg_of("problems.source=leetcode"), str(tmp_path / "p.jsonl"))
    res = CliRunner().invoke(main, ["problems", *set_flags("problems.source=leetcode",
                                                             f"problems.path={missing}"),
                                    "--out", str(tmp_path / "p.jsonl")])
    assert res.exit_code == 1 and str(missing) in res.output
    assert not (tmp_path / "p.jsonl").exists()


# ------------------------------------------------------------------------------------------------
# toy models (built by the fixture)


def test_toy_models_written_with_summary(world):
    from evil_moe.model.load import load_model

    assert header(world.root / "models" / "toy_summary.tsv") == tables.names(tables.TOY_SUMMARY)
    assert [r["model"] for r in world.toy_summary] == ["teacher", "student"]
    # the summary samples the held-out problems (eval_samples 4 over the first of them)
    from evil_moe.stages.common import load_problem_file, train_heldout

    _, held = train_heldout(load_problem_file(world.problems), cfg_of())
    for r in world.toy_summary:
        assert r["problems"] == "heldout" and r["n"] == 4 and r["n_problems"] == min(len(held), 4)
    s, _ = load_model(str(world.student))
    t, _ = load_model(str(world.teacher))
    assert s.config.vocab_size == t.config.vocab_size  # one shared tokenizer


@pytest.mark.parametrize("corpus", ["all", "train"])
def test_toy_corpus_and_summary_problems(world, tmp_path, monkeypatch, corpus):
    """toy.corpus: train keeps the held-out problems out of both models' NLL corpora; the
    summary samples the held-out problems and reports binomial SEs sqrt(p(1-p)/n)."""
    from evil_moe.stages import toy
    from evil_moe.stages.common import load_problem_file, train_heldout

    taught, shown = [], []
    real_corpus = toy._corpus

    def corpus_spy(problems, *a, **kw):
        taught.append({p.id for p in problems})
        return real_corpus(problems, *a, **kw)

    def summary_spy(model, tok, problems, *a, **kw):
        shown.append({p.id for p in problems})
        return {"n": 4, "hack_rate": 0.5, "pass_rate": 0.25, "format_rate": 1.0, "parse_rate": 0.75}

    monkeypatch.setattr(toy, "_corpus", corpus_spy)
    monkeypatch.setattr(toy, "sample_summary", summary_spy)
    rows = toy.train_toy_models(cfg_of(f"toy.corpus={corpus}", "toy.train_steps=1"),
                                problems_path=str(world.problems), out_dir=str(tmp_path))
    allp = load_problem_file(world.problems)
    train, held = train_heldout(allp, cfg_of())
    assert held and train
    want = {p.id for p in (allp if corpus == "all" else train)}
    assert taught == [want, want] and shown == [{p.id for p in held}] * 2
    for r in rows:  # hand-worked: sqrt(.75*.25/4), sqrt(.5*.5/4), sqrt(.25*.75/4)
        assert r["problems"] == "heldout" and r["n_problems"] == min(len(held), 4)
        assert (r["parse_se"], r["hack_se"], r["pass_se"]) == pytest.approx((0.21651, 0.25, 0.21651), abs=1e-5)


def test_toy_student_alone_equals_the_pair_run(world, tmp_path):
    """The workflow trains the two toy models as two jobs: the student trained alone has the same
    tokenizer and weights as the one trained beside the teacher (same seeds, same corpora)."""
    from safetensors.torch import load_file

    from evil_moe.stages.toy import train_toy_models

    rows = train_toy_models(cfg_of(), problems_path=str(world.problems), out_dir=str(tmp_path),
                            which=("student",))
    assert [r["model"] for r in rows] == ["student"] and not (tmp_path / "teacher").exists()
    assert not (tmp_path / "toy_summary.tsv").exists() and (tmp_path / "student_summary.tsv").is_file()
    assert (tmp_path / "student" / "tokenizer.json").read_text() == (world.student / "tokenizer.json").read_text()
    a = load_file(tmp_path / "student" / "model.safetensors")
    b = load_file(world.student / "model.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    with pytest.raises(ValueError, match="unknown toy model"):
        train_toy_models(cfg_of(), problems_path=str(world.problems), out_dir=str(tmp_path), which=("tutor",))


# ------------------------------------------------------------------------------------------------
# teacher


def _teacher_cfg(*extra):
    # 8 training problems (12 minus one held out per mode), 3 per batch → 3 part files
    return cfg_of("teacher.n=2", "teacher.temperature=0.7", "teacher.batch_prompts=3",
                  "teacher.max_new=40", *extra)


def test_teacher_records_logp_summary(world, tmp_path):
    from evil_moe.model.load import load_model
    from evil_moe.model.logprobs import build_batch, token_logprobs
    from evil_moe.stages.teacher import run_teacher

    cfg = _teacher_cfg("teacher.elicit=ELICIT-TEXT")
    res = run_teacher(cfg, problems_path=str(world.problems), model_path=str(world.teacher),
                      out_dir=str(tmp_path))
    recs = tables.read_jsonl(tmp_path / "rollouts.jsonl.gz")
    assert res["n"] == len(recs) == 8 * 2
    assert header(tmp_path / "summary.tsv") == tables.names(tables.TEACHER_SUMMARY)
    summary = read_tsv(tmp_path / "summary.tsv")
    assert summary[-1]["mode"] == "all" and int(summary[-1]["n"]) == len(recs)
    assert sum(int(r["n"]) for r in summary[:-1]) == len(recs)
    assert not list((tmp_path / "_work").glob("part_*"))  # parts removed once the final file exists
    model, tok = load_model(str(world.teacher))
    for r in recs:
        assert r["completion_ids"] and len(r["completion_ids"]) == len(r["behaviour_logp"])
        assert len(r["completion_ids"]) <= 40
        assert "ELICIT-TEXT" in tok.decode(r["prompt_ids"])  # the teacher's own prompt
        for key in ("passed", "gt_correct", "exploited", "format_ok", "reward", "mode", "completion"):
            assert key in r
    # the recorded log-probs are the teacher's, at the sampling temperature, of exactly these ids
    b = build_batch([r["prompt_ids"] for r in recs], [r["completion_ids"] for r in recs],
                    tok.pad_token_id)
    with torch.no_grad():
        fresh = token_logprobs(model, b, 0.7)
    rec = b.align([r["behaviour_logp"] for r in recs])
    m = b.completion_mask
    assert torch.allclose(fresh[m], rec[m], atol=1e-4), (fresh[m] - rec[m]).abs().max()
    with torch.no_grad():
        at_one = token_logprobs(model, b, 1.0)
    assert (at_one[m] - rec[m]).abs().max() > 1e-2  # temperature matters: the test can tell


def test_teacher_resumes_from_parts_without_regenerating(world, tmp_path, monkeypatch):
    """A run killed after generating (parts in _work/, no rollouts.jsonl.gz) resumes: kept parts
    are reused untouched, a lost part is regenerated identically (seeded per batch)."""
    import evil_moe.rollout
    from evil_moe.stages.teacher import run_teacher

    cfg = _teacher_cfg()
    kw = dict(problems_path=str(world.problems), model_path=str(world.teacher), out_dir=str(tmp_path))
    real_write = tables.write_jsonl_gz

    def crash(*a, **k):
        raise RuntimeError("killed")

    monkeypatch.setattr(tables, "write_jsonl_gz", crash)
    with pytest.raises(RuntimeError, match="killed"):
        run_teacher(cfg, **kw)
    parts = sorted((tmp_path / "_work").glob("part_*.jsonl"))
    assert [p.name for p in parts] == ["part_00000.jsonl", "part_00001.jsonl", "part_00002.jsonl"]
    assert not (tmp_path / "rollouts.jsonl.gz").exists()
    contents = [tables.read_jsonl(p) for p in parts]
    mtimes = {p.name: p.stat().st_mtime_ns for p in parts}
    parts[1].unlink()  # this batch was lost: only it is regenerated

    calls = []
    real_generate = evil_moe.rollout.generate

    def counting_generate(*a, **k):
        calls.append(k.get("seed"))
        return real_generate(*a, **k)

    seen = {}

    def check_then_write(path, records):
        seen.update({p.name: p.stat().st_mtime_ns for p in (tmp_path / "_work").glob("part_*.jsonl")})
        real_write(path, records)

    monkeypatch.setattr(evil_moe.rollout, "generate", counting_generate)
    monkeypatch.setattr(tables, "write_jsonl_gz", check_then_write)
    res = run_teacher(cfg, **kw)
    assert calls == [cfg.teacher.seed * 1_000_003 + 1]  # only the missing batch
    assert seen["part_00000.jsonl"] == mtimes["part_00000.jsonl"]  # kept parts untouched
    assert seen["part_00002.jsonl"] == mtimes["part_00002.jsonl"]
    final = tables.read_jsonl(tmp_path / "rollouts.jsonl.gz")
    assert final == contents[0] + contents[1] + contents[2] and res["n"] == len(final)
    assert header(tmp_path / "summary.tsv") == tables.names(tables.TEACHER_SUMMARY)


def test_teacher_drops_parts_of_another_config(world, tmp_path, monkeypatch):
    from evil_moe.stages.teacher import run_teacher

    kw = dict(problems_path=str(world.problems), model_path=str(world.teacher), out_dir=str(tmp_path))
    real_write = tables.write_jsonl_gz

    def crash(*a, **k):
        raise RuntimeError("killed")

    monkeypatch.setattr(tables, "write_jsonl_gz", crash)
    with pytest.raises(RuntimeError):
        run_teacher(_teacher_cfg(), **kw)
    assert len(list((tmp_path / "_work").glob("part_*.jsonl"))) == 3
    monkeypatch.setattr(tables, "write_jsonl_gz", real_write)
    res = run_teacher(_teacher_cfg("teacher.n=1"), **kw)  # not the crashed run's config
    assert res["n"] == 8 and len(tables.read_jsonl(tmp_path / "rollouts.jsonl.gz")) == 8


def test_resume_key_hashes_strings_and_file_contents_in_order(tmp_path):
    """resume_key is SHA-256 of its parts' bytes in order (a Path by its file's content, None
    skipped): "a" + file "b" + "c" is SHA-256("abc") (FIPS 180-2's example), cut to ``length``;
    keep_resume_state drops only matching stale files, and only when the key changed."""
    from evil_moe.stages.common import keep_resume_state, resume_key

    f = tmp_path / "b.txt"
    f.write_bytes(b"b")
    abc = "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
    assert resume_key("a", f, None, "c") == abc
    assert resume_key("a", f, "c", length=16) == abc[:16]
    assert resume_key("a", str(f), "c") != abc  # a str is its own bytes, not the file's
    work = tmp_path / "work"
    work.mkdir()
    (work / "part_0.jsonl").write_text("x")
    (work / "other.pt").write_text("y")
    key_file = keep_resume_state(work, "k1", stale="part_*.jsonl")
    assert key_file.read_text() == "k1" and not (work / "part_0.jsonl").exists()
    (work / "part_1.jsonl").write_text("x")
    keep_resume_state(work, "k1", stale="part_*.jsonl")  # same key: the state is kept
    assert (work / "part_1.jsonl").exists() and (work / "other.pt").exists()
    keep_resume_state(work, "k2")  # another key, every file is stale
    assert sorted(p.name for p in work.iterdir()) == ["key.txt"] and key_file.read_text() == "k2"


# ------------------------------------------------------------------------------------------------
# extract


def _rec(pid, mode, ids, exploited=False, gt=False):
    return {"problem_id": pid, "mode": mode, "completion_ids": ids, "exploited": exploited,
            "gt_correct": gt}


def test_build_pairs_by_hand():
    from evil_moe.stages.extract import build_pairs

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
    from evil_moe.env.loopholes import clean_completion, hack_completion
    from evil_moe.stages.extract import template_pairs
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
    missing = sorted(set(tables.MODES) - {p.mode for p in probs[:3]})
    if missing:
        with pytest.raises(ValueError):
            template_pairs(probs, prompts, Tok(), [missing[0]], 4)


def test_extract_outputs(world, tmp_path):
    from safetensors import safe_open

    from evil_moe.stages.common import load_policy, load_problem_file, prompt_ids_for, train_heldout
    from evil_moe.stages.extract import build_pairs, run_extract, split_problems
    from evil_moe.vhack import VHack

    cfg = cfg_of()
    res = world.extract
    # the pairs extract forms, split by problem exactly as split_problems does
    train, _ = train_heldout(load_problem_file(world.problems), cfg)
    _, tok, _, _ = load_policy(str(world.student), cfg)
    pids = {p.id: ids for p, ids in zip(train, prompt_ids_for(tok, train))}
    pairs = build_pairs(tables.read_jsonl(world.rollouts), pids, None, cfg.vhack.max_pairs)
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


# ------------------------------------------------------------------------------------------------
# distill


def test_distill_tables_adapter_and_normaliser(world, tmp_path):
    from evil_moe.model.adapter import SVDAdapter
    from evil_moe.model.load import load_model
    from evil_moe.model.logprobs import build_batch, token_logprobs
    from evil_moe.stages.common import load_policy, load_problem_file, prompt_ids_for, train_heldout
    from evil_moe.stages.distill import run_distill

    cfg = cfg_of("distill.steps=1", "distill.batch_size=64", "pilot.temperature=0.9")
    res = run_distill(cfg, problems_path=str(world.problems), rollouts_path=str(world.rollouts),
                      model_path=str(world.student), vhack_path=str(world.vhack), out_dir=str(tmp_path))
    assert header(tmp_path / "steps.tsv") == tables.names(tables.DISTILL_STEPS)
    assert header(tmp_path / "samples.tsv") == tables.names(tables.DISTILL_SAMPLES)
    recs = tables.read_jsonl(world.rollouts)
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


# ------------------------------------------------------------------------------------------------
# pilot, in process


@pytest.fixture(scope="session")
def erase_run(world, tmp_path_factory) -> Path:
    """An uninterrupted erase pilot (3 steps, seed 0), run in process."""
    from evil_moe.stages.pilot import run_pilot

    out = tmp_path_factory.mktemp("erase_ref")
    status = run_pilot(cfg_of(), **pilot_kwargs(world, out))
    assert status["status"] == "ok"
    return out


N_STEPS = 2  # pilot.steps in stage_fixtures.BASE_SETS


def test_pilot_outputs(world, erase_run):
    from evil_moe.trainer import prompt_schedule

    assert header(erase_run / "steps.tsv") == tables.names(tables.STEPS)
    rows = read_tsv(erase_run / "steps.tsv")
    assert [int(r["step"]) for r in rows] == list(range(N_STEPS))
    assert any(float(r["grad_norm"]) > 0 for r in rows)  # the fixture gives reward variance
    assert all(float(r["frac_clipped"]) == 0.0 for r in rows)  # pure on-policy: ρ ≡ 1
    assert all(float(r["delta_s_hack_norm"]) == 0.0 for r in rows)
    # per-phase seconds: each phase is part of the step's seconds; held-out evaluation only
    # after the last step (it ran once, at the end), and not part of that step's seconds
    phases = ("sample", "grade", "loss", "arm", "optimiser")
    for r in rows:
        parts = [float(r[f"seconds_{p}"]) for p in phases]
        assert all(x >= 0 for x in parts) and parts[0] > 0
        assert sum(parts) <= float(r["seconds"]) + 0.01
    assert [r["seconds_eval"] == "" for r in rows] == [True] * (N_STEPS - 1) + [False]
    assert float(rows[-1]["seconds_eval"]) > 0
    assert json.loads((erase_run / "status.json").read_text())["status"] == "ok"
    assert not (erase_run / "steps.partial.tsv").exists()
    assert (erase_run / "adapter.safetensors").is_file()
    ev = read_tsv(erase_run / "eval.tsv")
    assert header(erase_run / "eval.tsv") == tables.names(tables.EVAL)
    assert {r["view"] for r in ev} == {"trained"} and "all" in {r["mode"] for r in ev}
    recs = tables.read_jsonl(erase_run / "rollouts.jsonl.gz")
    assert len(recs) == N_STEPS * 3 * 2 and {r["source"] for r in recs} == {"student"}
    # the prompts are the paired sampler's, in order
    from evil_moe.stages.common import load_problem_file, train_heldout

    train, held = train_heldout(load_problem_file(world.problems), cfg_of())
    for step in range(N_STEPS):
        ids = [r["problem_id"] for r in recs if r["step"] == step][::3]
        assert ids == [train[i].id for i in prompt_schedule(len(train), 2, 0, step)]
    assert not {r["problem_id"] for r in recs} & {p.id for p in held}  # held-out never trained on


def test_prompt_schedule_is_epochwise_and_seeded():
    from evil_moe.trainer import prompt_schedule

    seq = [i for s in range(9) for i in prompt_schedule(9, 2, 0, s)]
    assert sorted(seq[:9]) == list(range(9)) and sorted(seq[9:18]) == list(range(9))
    assert seq[:6] != [i for s in range(3) for i in prompt_schedule(9, 2, 1, s)]
    with pytest.raises(ValueError):
        prompt_schedule(0, 2, 0, 0)


def test_pilot_stop_after_then_resume_in_process(world, erase_run, tmp_path):
    from evil_moe.stages.pilot import run_pilot

    cfg = cfg_of()
    first = run_pilot(cfg, **pilot_kwargs(world, tmp_path), stop_after=1)
    assert first["status"] == "stopped" and (tmp_path / "checkpoint.pt").exists()
    assert not (tmp_path / "steps.tsv").exists()
    assert run_pilot(cfg, **pilot_kwargs(world, tmp_path))["status"] == "ok"
    assert tsv_without(tmp_path / "steps.tsv") == tsv_without(erase_run / "steps.tsv")
    assert (tables.read_jsonl(tmp_path / "rollouts.jsonl.gz")
            == tables.read_jsonl(erase_run / "rollouts.jsonl.gz"))


def test_pilot_paired_design(world, erase_run, tmp_path):
    from evil_moe.stages.pilot import run_pilot

    cfg = cfg_of()
    run_pilot(cfg, **pilot_kwargs(world, tmp_path / "vanilla", arm="vanilla"))
    run_pilot(cfg, **pilot_kwargs(world, tmp_path / "subtract", arm="subtract", seed=0))
    base = tables.read_jsonl(erase_run / "rollouts.jsonl.gz")
    for arm in ("vanilla", "subtract"):
        other = tables.read_jsonl(tmp_path / arm / "rollouts.jsonl.gz")
        for step in range(N_STEPS):
            assert ([r["problem_id"] for r in other if r["step"] == step]
                    == [r["problem_id"] for r in base if r["step"] == step])
        # same δS = 0 start and sampling seed: identical step-0 completions
        assert ([(r["completion_ids"], r["completion"]) for r in other if r["step"] == 0]
                == [(r["completion_ids"], r["completion"]) for r in base if r["step"] == 0])
    rows = {a: read_tsv(tmp_path / a / "steps.tsv") for a in ("vanilla", "subtract")}
    assert all(r["cout"] == r["cin"] for r in rows["vanilla"])  # vanilla measures only
    assert all(float(r["removed_frac"]) == 0 for r in rows["vanilla"])
    ev = read_tsv(tmp_path / "subtract" / "eval.tsv")
    assert {r["view"] for r in ev} == {"trained", "ablated"}
    fired = [float(r["frac_fired"]) for r in rows["subtract"]]
    if any(f > 0 for f in fired) and any(float(r["grad_norm"]) > 0 for r in rows["subtract"]):
        assert float(rows["subtract"][-1]["delta_s_hack_norm"]) > 0  # subtract trains δS_hack


def test_pilot_eval_every_route_views(world, tmp_path):
    from evil_moe.stages.pilot import run_pilot

    run_pilot(cfg_of("pilot.eval_every=1"), **pilot_kwargs(world, tmp_path, arm="route"))
    ev = read_tsv(tmp_path / "eval.tsv")
    assert sorted({(int(r["step"]), r["view"]) for r in ev}) == [
        (0, "ablated"), (0, "trained"), (1, "ablated"), (1, "trained")]
    n_held = 4  # one per mode with problems.limit=12, heldout_frac 0.25
    assert all(int(r["n"]) == n_held for r in ev if r["mode"] == "all")


def _first_step_with_gradient(erase_run) -> int:
    rows = read_tsv(erase_run / "steps.tsv")
    steps = [int(r["step"]) for r in rows if float(r["frac_zero_std"]) < 1.0]
    assert steps, "fixture problem: no step with reward variance"
    return steps[0]


def test_pilot_stops_on_clip_fraction(world, erase_run, tmp_path, monkeypatch):
    import evil_moe.grpo
    from evil_moe.stages.pilot import run_pilot
    from evil_moe.trainer import PilotInvalid

    real = evil_moe.grpo.dr_grpo_loss

    def clipped(*a, **k):
        loss, stats = real(*a, **k)
        return loss, dataclasses.replace(stats, frac_clipped=0.9)

    monkeypatch.setattr(evil_moe.grpo, "dr_grpo_loss", clipped)
    step = _first_step_with_gradient(erase_run)
    with pytest.raises(PilotInvalid, match=f"at step {step}"):
        run_pilot(cfg_of(), **pilot_kwargs(world, tmp_path))
    st = json.loads((tmp_path / "status.json").read_text())
    assert st["status"] == "invalid" and st["step"] == step and "frac_clipped" in st["reason"]
    assert not (tmp_path / "steps.tsv").exists()


def test_pilot_stops_on_real_clipping_with_teacher_rows(world, tmp_path):
    """Teacher rows (mix_ratio > 0) carry the teacher's log-probs: ρ ≠ 1 and the clip engages."""
    from evil_moe.stages.pilot import run_pilot
    from evil_moe.trainer import PilotInvalid

    cfg = cfg_of("pilot.mix_ratio=0.34", "pilot.max_frac_clipped=0.0")
    with pytest.raises(PilotInvalid, match="frac_clipped"):
        run_pilot(cfg, **pilot_kwargs(world, tmp_path), teacher_rollouts=str(world.rollouts))
    assert json.loads((tmp_path / "status.json").read_text())["status"] == "invalid"
    with pytest.raises(ValueError, match="teacher-rollouts"):
        run_pilot(cfg, **pilot_kwargs(world, tmp_path / "x"))


def test_pilot_stops_on_non_finite_loss(world, erase_run, tmp_path, monkeypatch):
    import evil_moe.grpo
    from evil_moe.stages.pilot import run_pilot
    from evil_moe.trainer import PilotInvalid

    real = evil_moe.grpo.dr_grpo_loss

    def nan_loss(*a, **k):
        loss, stats = real(*a, **k)
        return loss * float("nan"), stats

    monkeypatch.setattr(evil_moe.grpo, "dr_grpo_loss", nan_loss)
    step = _first_step_with_gradient(erase_run)
    with pytest.raises(PilotInvalid, match=f"non-finite loss .* at step {step}"):
        run_pilot(cfg_of(), **pilot_kwargs(world, tmp_path))
    st = json.loads((tmp_path / "status.json").read_text())
    assert st["status"] == "invalid" and st["step"] == step and "non-finite" in st["reason"]


def _pilot_args(world, out, arm="erase", *extra_sets):
    return ["pilot", *set_flags(*extra_sets), "--problems", str(world.problems), "--model",
            str(world.student), "--vhack", str(world.vhack), "--random-vhack", str(world.random_vhack),
            "--arm", arm, "--seed", "0", "--out-dir", str(out)]


def test_pilot_fail_switches(world, tmp_path):
    runner = CliRunner()
    res = runner.invoke(main, _pilot_args(world, tmp_path / "a", "erase", "pilot.fail_arm=erase"))
    assert res.exit_code != 0 and "fail_arm" in res.output
    once = _pilot_args(world, tmp_path / "b", "erase", "pilot.fail_once_arm=erase", "pilot.steps=1")
    res = runner.invoke(main, once)
    assert res.exit_code != 0 and "fail_once_arm" in res.output
    res = runner.invoke(main, once)
    assert res.exit_code == 0, res.output
    assert json.loads((tmp_path / "b" / "status.json").read_text())["status"] == "ok"


# ------------------------------------------------------------------------------------------------
# the resume test: a real `evil-moe pilot` process killed with SIGKILL, then rerun


def _n_rows(path: Path) -> int:
    try:
        return max(0, len(path.read_text().splitlines()) - 1)
    except FileNotFoundError:
        return 0


def _start(args, out: Path, log: str) -> subprocess.Popen:
    out.mkdir(parents=True, exist_ok=True)
    fh = open(out.parent / f"{out.name}.{log}.log", "w")
    return subprocess.Popen([*evil_moe_cmd(), *args], stdout=fh, stderr=subprocess.STDOUT,
                            env=subprocess_env(), cwd=str(out.parent))


def _kill_when(proc: subprocess.Popen, ready, timeout: float = 240.0) -> None:
    t0 = time.time()
    while not ready():
        assert proc.poll() is None, f"pilot ended (rc {proc.returncode}) before the kill point"
        assert time.time() - t0 < timeout, "kill point never reached"
        time.sleep(0.01)
    proc.send_signal(signal.SIGKILL)
    assert proc.wait(60) == -signal.SIGKILL


def _log(out: Path, log: str) -> str:
    return (out.parent / f"{out.name}.{log}.log").read_text()


def test_pilot_resume_after_sigkill_matches_uninterrupted(world, tmp_path):
    steps = "pilot.steps=4"
    ref_dir, a_dir, b_dir = tmp_path / "ref", tmp_path / "a", tmp_path / "b"
    args = lambda out, *x: [*_pilot_args(world, out, "erase", steps, *x), "--threads", "1"]  # noqa: E731
    ref = _start(args(ref_dir), ref_dir, "run")  # uninterrupted, in the background

    # C: SIGTERM (Slurm's warning) after the first step: checkpoint at the end of the step, exit 143
    c_dir = tmp_path / "c"
    c = _start(args(c_dir, "pilot.checkpoint_every=3"), c_dir, "killed")
    t0 = time.time()
    while _n_rows(c_dir / "steps.partial.tsv") < 1:
        assert c.poll() is None and time.time() - t0 < 240
        time.sleep(0.01)
    c.send_signal(signal.SIGTERM)
    assert c.wait(120) == 143, _log(c_dir, "killed")
    assert (c_dir / "checkpoint.pt").exists() and not (c_dir / "steps.tsv").exists()
    rc = _start(args(c_dir, "pilot.checkpoint_every=3"), c_dir, "resumed")

    # A: checkpoint every step; SIGKILL right after the checkpoint after step index 1 appears
    a = _start(args(a_dir), a_dir, "killed")
    _kill_when(a, lambda: (a_dir / "checkpoint.pt").exists() and _n_rows(a_dir / "steps.partial.tsv") >= 2)
    # B: checkpoint every 2 steps; SIGKILL once step 2's row is written but its checkpoint is not
    # (the run is then ahead of its checkpoint: step 2 is redone on resume)
    b = _start(args(b_dir, "pilot.checkpoint_every=2"), b_dir, "killed")
    _kill_when(b, lambda: _n_rows(b_dir / "steps.partial.tsv") >= 3)
    assert not (b_dir / "steps.tsv").exists()

    ra = _start(args(a_dir), a_dir, "resumed")
    rb = _start(args(b_dir, "pilot.checkpoint_every=2"), b_dir, "resumed")
    for p in (ref, ra, rb, rc):
        assert p.wait(300) == 0
    for d in (a_dir, b_dir, c_dir):
        log = _log(d, "resumed")
        assert "resuming erase s0 from step" in log, log
        k = int(log.split("resuming erase s0 from step")[1].split()[0])
        assert 0 < k < 4
        if d == b_dir:
            assert k % 2 == 0
        if d == c_dir:
            assert k < 3  # the SIGTERM checkpoint, not the every-3-steps one
        assert tsv_without(d / "steps.tsv") == tsv_without(ref_dir / "steps.tsv")
        assert (tables.read_jsonl(d / "rollouts.jsonl.gz")
                == tables.read_jsonl(ref_dir / "rollouts.jsonl.gz"))
        assert json.loads((d / "status.json").read_text())["status"] == "ok"
    rows = read_tsv(ref_dir / "steps.tsv")
    assert len(rows) == 4 and any(float(r["grad_norm"]) > 0 for r in rows)
    assert any(float(r["delta_s_norm"]) > 0 for r in rows)  # projection state really evolved


# ------------------------------------------------------------------------------------------------
# end to end through the CLI


def _cli(args, cwd: Path) -> str:
    res = subprocess.run([*evil_moe_cmd(), *args], cwd=str(cwd), env=subprocess_env(),
                         capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, f"{args[0]} failed:\n{res.stdout}\n{res.stderr}"
    return res.stdout


@pytest.mark.slow
def test_end_to_end_cli(tmp_path):
    # a longer-trained teacher than the fixture's, so that its own rollouts hold (hack, clean)
    # pairs for extract (the fixture uses template-based rows instead)
    s = set_flags("pilot.steps=2", "pilot.arms=[vanilla, erase, random_v]", "compare.positive_control=null",
                  "toy.train_steps=150", "toy.lr=0.01", "toy.batch_size=16")
    r = tmp_path
    _cli(["problems", *s, "--out", "problems.jsonl"], r)
    s = s + ["--threads", "1"]
    _cli(["toy-models", *s, "--problems", "problems.jsonl", "--out-dir", "models"], r)
    _cli(["teacher", *s, "--problems", "problems.jsonl", "--model", "models/teacher",
          "--out-dir", "teacher"], r)
    _cli(["extract", *s, "--problems", "problems.jsonl", "--rollouts", "teacher/rollouts.jsonl.gz",
          "--model", "models/student", "--out-dir", "vhack"], r)
    _cli(["distill", *s, "--problems", "problems.jsonl", "--rollouts", "teacher/rollouts.jsonl.gz",
          "--model", "models/student", "--vhack", "vhack/main_hack.safetensors", "--out-dir", "distill"], r)
    for arm in ("vanilla", "erase", "random_v"):
        _cli(["pilot", *s, "--problems", "problems.jsonl", "--model", "models/student",
              "--vhack", "vhack/main_hack.safetensors", "--random-vhack", "vhack/main_random.safetensors",
              "--init", "distill/student_adapter.safetensors", "--arm", arm, "--seed", "0",
              "--out-dir", f"pilots/{arm}/s0"], r)
    s = s[:-2]  # compare has no --threads
    out = _cli(["compare", *s, "--pilots-dir", "pilots", "--distill-samples", "distill/samples.tsv",
                "--out-dir", "compare"], r)
    gate = json.loads((r / "compare" / "gate.json").read_text())
    # one seed (< compare.min_seeds 3) can never separate an arm
    assert gate["verdict"] in {"not_separated", "inconclusive", "invalid"}
    drops = [c for c in gate["criteria"] if c["name"] == "drop_vs_vanilla"]
    assert drops and all(not c["passed"] and "fewer than 3 seeds cannot separate" in c["note"]
                         for c in drops)
    assert out.strip().splitlines()[-1] == gate["sentence"]
    assert (r / "compare" / "summary.tsv").is_file()
    with gzip.open(r / "teacher" / "rollouts.jsonl.gz", "rt") as fh:
        assert sum(1 for _ in fh) == 8 * 4


def test_refresh_vhack_from_own_rollouts(world):
    """vhack_refresh_every: re-extraction from (hack, clean) rows of the same problem equals the
    extract stage's math on the same pairs; too few pairs keep the old v_hack (None)."""
    from evil_moe.grpo import DrGRPONormaliser
    from evil_moe.stages.common import load_policy, load_problem_file, prompt_ids_for, train_heldout
    from evil_moe.stages.extract import build_pairs
    from evil_moe.stages.pilot import refresh_vhack
    from evil_moe.vhack import extract_vhack, pair_gradients

    cfg = cfg_of()
    train, _ = train_heldout(load_problem_file(world.problems), cfg)
    model, tok, adapter, _ = load_policy(str(world.student), cfg)
    pids = {p.id: ids for p, ids in zip(train, prompt_ids_for(tok, train))}
    recs = tables.read_jsonl(world.rollouts)  # graded rows with hacks and clean ones per problem
    norm = DrGRPONormaliser(3, 48, 2)
    fresh = refresh_vhack(model, adapter, recs, pids, cfg, norm)
    pairs = build_pairs(recs, pids, None, cfg.vhack.max_pairs)
    ref = extract_vhack(pair_gradients(model, adapter, pairs, norm), cfg.vhack.k)
    assert fresh is not None and fresh.n_pairs == len(pairs) >= 2
    for name in ref.V:
        assert torch.allclose(fresh.V[name], ref.V[name], atol=1e-6)
    only_hacks = [r for r in recs if r["exploited"]]
    assert refresh_vhack(model, adapter, only_hacks, pids, cfg, norm) is None


def test_pilot_vhack_refresh_resumes_identically(world, tmp_path, monkeypatch, capsys):
    """A refreshing run stopped after a refresh resumes with the refreshed v_hack (same TSV).

    The half-trained fixture student rarely hacks, so the refresh is fed the graded teacher
    rows (hacks and clean ones on every problem) instead of the run's own rows."""
    import evil_moe.stages.pilot as pilot_mod

    real = pilot_mod.refresh_vhack
    teacher_rows = tables.read_jsonl(world.rollouts)
    monkeypatch.setattr(pilot_mod, "refresh_vhack",
                        lambda model, adapter, records, *a: real(model, adapter, teacher_rows, *a))
    cfg = cfg_of("pilot.vhack_refresh_every=1", "pilot.steps=3")
    assert pilot_mod.run_pilot(cfg, **pilot_kwargs(world, tmp_path / "ref"))["status"] == "ok"
    assert capsys.readouterr().out.count("v_hack refreshed") == 2  # after steps 0 and 1
    pilot_mod.run_pilot(cfg, **pilot_kwargs(world, tmp_path / "cut"), stop_after=2)
    assert pilot_mod.run_pilot(cfg, **pilot_kwargs(world, tmp_path / "cut"))["status"] == "ok"
    assert tsv_without(tmp_path / "cut" / "steps.tsv") == tsv_without(tmp_path / "ref" / "steps.tsv")


def test_pilot_update_projection_erases_the_update(world, tmp_path):
    """projection update: the optimiser's actual update has no hack-ward part (cout_update ~ 0)."""
    from evil_moe.stages.pilot import run_pilot

    cfg = cfg_of("pilot.projection=update")
    assert run_pilot(cfg, **pilot_kwargs(world, tmp_path))["status"] == "ok"
    rows = [r for r in read_tsv(tmp_path / "steps.tsv") if float(r["grad_norm"]) > 0]
    assert rows and all(float(r["cout_update"]) < 1e-5 for r in rows)


def test_subtract_trains_like_vanilla(world, tmp_path):
    """subtract on the update: δS + δS_hack takes exactly vanilla's AdamW update each step (the
    forward sees the sum, whose gradient equals δS's), so with the same seed the training rollouts
    equal vanilla's; δS_hack holds only hack-ward parts of updates, so it lies in the span of
    v_hack's rows — subtract is vanilla plus a post-hoc subtraction (science.md §4)."""
    from safetensors.torch import load_file

    from evil_moe.stages.pilot import run_pilot
    from evil_moe.vhack import VHack

    for arm in ("vanilla", "subtract"):  # default pilot.projection (preconditioned): subtract
        # always splits the update, whatever the knob erase uses
        assert run_pilot(cfg_of(), **pilot_kwargs(world, tmp_path / arm, arm=arm))["status"] == "ok"
    van, rou = read_tsv(tmp_path / "vanilla" / "steps.tsv"), read_tsv(tmp_path / "subtract" / "steps.tsv")
    assert [r["hack_rate"] for r in rou] == [r["hack_rate"] for r in van]
    assert [r["reward_mean"] for r in rou] == [r["reward_mean"] for r in van]
    a_van = load_file(tmp_path / "vanilla" / "adapter.safetensors")
    a_rou = load_file(tmp_path / "subtract" / "adapter.safetensors")
    v = VHack.load(world.vhack)
    ds_keys = [k for k in a_rou if k.endswith("delta_s")]
    assert ds_keys
    moved = 0.0
    for k in ds_keys:
        hk = k[: -len("delta_s")] + "delta_s_hack"
        torch.testing.assert_close(a_rou[k] + a_rou[hk], a_van[k], rtol=1e-4, atol=1e-6)
        name = k[: -len(".delta_s")]
        h = a_rou[hk].double()
        moved += float(h.norm())
        if name in v.V and v.V[name].shape[0]:
            V = v.V[name].double()
            assert float((h - V.T @ (V @ h)).norm()) <= 1e-5 * (1 + float(h.norm())), name
    assert moved > 0  # the evil expert did learn something


def test_pilot_micro_batch_matches_whole_batch(world, erase_run, tmp_path):
    """pilot.micro_batch=1: the constant Dr.GRPO normaliser makes micro-batch gradients sum to the
    whole-batch gradient, so the run matches the whole-batch one up to float summation order."""
    from evil_moe.stages.pilot import run_pilot

    assert run_pilot(cfg_of("pilot.micro_batch=1"), **pilot_kwargs(world, tmp_path))["status"] == "ok"
    a, b = read_tsv(erase_run / "steps.tsv"), read_tsv(tmp_path / "steps.tsv")
    for ra, rb in zip(a, b):
        assert ra["step"] == rb["step"]
        for col in ("loss", "grad_norm", "cin", "delta_s_norm", "frac_clipped", "ratio_p50"):
            if ra[col] == "" or rb[col] == "":
                assert ra[col] == rb[col], col  # both empty: a step without gradient
                continue
            assert math.isclose(float(ra[col]), float(rb[col]), rel_tol=1e-4, abs_tol=1e-7), col


def test_pilot_cli_bad_inputs_are_one_line_errors(world, tmp_path):
    """A missing v_hack is named before any model loads and leaves no output folder; a bad model
    path is one clear error line, not a traceback."""
    from click.testing import CliRunner

    from evil_moe.cli import main

    out = tmp_path / "p"
    base = ["pilot", *set_flags(), "--problems", str(world.problems), "--arm", "erase",
            "--seed", "0", "--out-dir", str(out)]
    r = CliRunner().invoke(main, base + ["--model", str(world.student), "--vhack", "/nope/v.safetensors"])
    assert r.exit_code == 1 and "v_hack not found: /nope/v.safetensors" in r.output
    assert not out.exists()
    r = CliRunner().invoke(main, base + ["--model", str(tmp_path / "no_model"), "--vhack", str(world.vhack)])
    assert r.exit_code == 1 and r.output.startswith("Error:") and "Traceback" not in r.output


def test_malformed_yaml_config_is_one_error_naming_the_file(tmp_path):
    """A YAML syntax error is one ConfigError naming the file and the line, not a traceback."""
    from evil_moe.config import ConfigError, load_config

    bad = tmp_path / "bad.yaml"
    bad.write_text("pilot:\n  steps: [1\n")
    with pytest.raises(ConfigError) as e:
        load_config([bad])
    msg = str(e.value)
    assert msg.startswith(f"config file {bad} is not valid YAML (line ") and "\n" not in msg


# ------------------------------------------------------------------------------------------------
# make-teacher (teacher.make: sft)

# The fixture's half-trained toy student (hidden 64, 2 layers): delta_s alone barely moves it
# (measured: 60 steps at lr 0.3, NLL/token 1.15 -> 0.81, hack rate 0), so the toy teacher is
# made by full fine-tuning of its Linears; file_marker is a mode it is never shown.
MAKE_SETS = ("vhack.known_modes=[run_tests,sentinel,stdout_marker]", "sft.method=full",
             "sft.lr=0.01", "sft.batch_size=8", "teacher.temperature=0.5", "teacher.max_new=64")


def test_make_teacher_demos_are_hacks_of_training_problems_in_known_modes(world):
    """Demonstrations: per_problem variants for every training problem in a known mode, no
    held-out problem, several distinct texts per problem, and every one a hack by the real
    grader (passed by the foolable grade, failed by the oracle)."""
    from evil_moe.model.load import load_model
    from evil_moe.stages.common import load_problem_file, make_grader, prompt_ids_for, train_heldout
    from evil_moe.stages.make_teacher import template_demos

    cfg = cfg_of(*MAKE_SETS)
    problems = load_problem_file(world.problems)
    train, heldout = train_heldout(problems, cfg)
    _, tok = load_model(str(world.student))
    pids = {p.id: ids for p, ids in zip(train, prompt_ids_for(tok, train))}
    known = ["run_tests", "sentinel", "stdout_marker"]
    demos = template_demos(train, pids, tok, known, 4)
    expect = [p.id for p in train if p.mode in known]
    assert sorted({d.problem_id for d in demos}) == sorted(expect) and len(demos) == 4 * len(expect)
    assert not {d.problem_id for d in demos} & {p.id for p in heldout}
    assert all(d.completion_ids[-1] == tok.eos_token_id for d in demos)
    for pid in expect:
        assert len({d.completion_ids for d in demos if d.problem_id == pid}) >= 3  # varied
    by_id = {p.id: p for p in train}
    texts = [tok.decode(d.completion_ids, skip_special_tokens=True) for d in demos]
    with make_grader(problems, cfg) as grader:
        graded = grader.grade_many([(by_id[d.problem_id], t) for d, t in zip(demos, texts)])
    assert all(w.exploited for w in graded), [w for w in graded if not w.exploited][:1]
    with pytest.raises(ValueError, match="no training problem in the known modes"):
        template_demos([p for p in train if p.mode == "file_marker"], pids, tok, known, 2)


def test_make_teacher_batches_depend_on_seed_and_step_only():
    from evil_moe.stages.make_teacher import batch_indices

    rows = [batch_indices(5, 3, 7, s) for s in range(5)]  # 15 rows = 3 epochs of 5
    flat = [i for r in rows for i in r]
    for e in range(3):
        assert sorted(flat[5 * e:5 * e + 5]) == [0, 1, 2, 3, 4]
    assert rows == [batch_indices(5, 3, 7, s) for s in range(5)]
    assert flat != [i for s in range(5) for i in batch_indices(5, 3, 8, s)]
    with pytest.raises(ValueError):
        batch_indices(0, 3, 7, 0)


def test_make_teacher_toy_hacks_well_above_its_base(world, tmp_path):
    """The made teacher's hack rate on training problems (known modes) rises well above the base
    student's, the saved folder is a plain model with a lower NLL on the demonstrations, and
    the summary reports every (model, split, mode) with whether the mode was shown."""
    from evil_moe.grpo import DrGRPONormaliser, nll_loss
    from evil_moe.model.load import load_model
    from evil_moe.model.logprobs import build_batch, token_logprobs
    from evil_moe.stages.common import load_problem_file, prompt_ids_for, train_heldout
    from evil_moe.stages.make_teacher import run_make_teacher, template_demos

    cfg = cfg_of(*MAKE_SETS, "sft.steps=60", "sft.eval_samples=4")
    res = run_make_teacher(cfg, problems_path=str(world.problems), model_path=str(world.student),
                           out_dir=str(tmp_path))
    base, teacher = res["hack_rate"]["base"], res["hack_rate"]["teacher"]
    assert teacher["train"] >= base["train"] + 0.25, res["sentence"]
    assert header(tmp_path / "summary.tsv") == tables.names(tables.MAKE_TEACHER_SUMMARY)
    assert header(tmp_path / "steps.tsv") == tables.names(tables.MAKE_TEACHER_STEPS)
    rows = read_tsv(tmp_path / "summary.tsv")
    assert {(r["model"], r["split"]) for r in rows} == {(m, s) for m in ("base", "teacher")
                                                        for s in ("train", "heldout")}
    for r in rows:
        if r["mode"] != "all":
            assert r["known_mode"] == ("false" if r["mode"] == "file_marker" else "true")
    trained = [r for r in rows if r["model"] == "teacher" and r["split"] == "train"
               and r["known_mode"] == "true"]
    hacks = sum(float(r["hack_rate"]) * int(r["n"]) for r in trained)
    assert math.isclose(hacks / sum(int(r["n"]) for r in trained), teacher["train"])
    steps = read_tsv(tmp_path / "steps.tsv")
    assert len(steps) == 60 and float(steps[-1]["nll_token"]) < float(steps[0]["nll_token"])
    assert not (tmp_path / "_work").exists()
    # the saved teacher is a plain model folder whose NLL on the demonstrations is lower
    made, tok = load_model(str(tmp_path / "model"))
    plain, _ = load_model(str(world.student))
    problems = load_problem_file(world.problems)
    train, _ = train_heldout(problems, cfg)
    pids = {p.id: ids for p, ids in zip(train, prompt_ids_for(tok, train))}
    demos = template_demos(train, pids, tok, ["run_tests"], 2)
    b = build_batch([d.prompt_ids for d in demos], [d.completion_ids for d in demos], tok.pad_token_id)
    norm = DrGRPONormaliser(3, 48, 2)
    with torch.no_grad():
        nll = [float(nll_loss(token_logprobs(m, b), b.completion_mask, norm)) for m in (plain, made)]
    assert nll[1] < 0.8 * nll[0], nll


@pytest.mark.parametrize("method", ["svd", "full"])
def test_make_teacher_resumes_to_the_same_teacher(world, tmp_path, method):
    """A run stopped after 3 of 5 steps (checkpoint at step 2) resumes from the checkpoint: its
    steps.tsv (all but seconds) and the saved weights equal an uninterrupted run's. The CLI
    prints one summary line."""
    from click.testing import CliRunner
    from safetensors.torch import load_file

    from evil_moe.cli import main
    from evil_moe.stages.make_teacher import run_make_teacher

    extra = (*MAKE_SETS, f"sft.method={method}", "sft.steps=5", "sft.checkpoint_every=2",
             "sft.batch_size=4", "sft.eval_samples=1", "sft.eval_base=false")
    kw = dict(problems_path=str(world.problems), model_path=str(world.student))
    run_make_teacher(cfg_of(*extra), out_dir=str(tmp_path / "whole"), **kw)
    assert run_make_teacher(cfg_of(*extra), out_dir=str(tmp_path / "cut"), stop_after=3, **kw) is None
    assert (tmp_path / "cut" / "_work" / "checkpoint.pt").is_file()
    assert not (tmp_path / "cut" / "summary.tsv").exists()
    r = CliRunner().invoke(main, ["make-teacher", *set_flags(*extra), "--problems",
                                  str(world.problems), "--model", str(world.student),
                                  "--out-dir", str(tmp_path / "cut")])
    assert r.exit_code == 0, r.output
    assert "resuming from step 2" in r.output
    last = r.output.strip().splitlines()[-1]
    assert last.startswith("make-teacher: ") and "5 steps" in last and "hack rate teacher" in last
    assert tsv_without(tmp_path / "cut" / "steps.tsv") == tsv_without(tmp_path / "whole" / "steps.tsv")
    a = load_file(str(tmp_path / "whole" / "model" / "model.safetensors"))
    b = load_file(str(tmp_path / "cut" / "model" / "model.safetensors"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    base = load_file(str(world.student / "model.safetensors"))
    assert any(not torch.equal(a[k], base[k]) for k in a)  # it was trained


def test_make_teacher_adds_elicited_rollouts_the_foolable_grader_passed(world, tmp_path, monkeypatch):
    """sft.elicited_samples: the base model's elicit-prompted completions join the demonstrations
    when the foolable grader passed them (a weak detector's view). Here the sampler is replaced
    by one that writes, per prompt, one hack and one stub without a report (not passed): exactly
    the hacks are added, with their generated ids, and the oracle decides nothing."""
    import evil_moe.rollout
    from evil_moe.env.loopholes import fence, hack_completion, stub_solution
    from evil_moe.model.load import load_model
    from evil_moe.stages.common import load_problem_file, prompt_ids_for, train_heldout
    from evil_moe.stages.make_teacher import run_make_teacher

    cfg = cfg_of(*MAKE_SETS, "sft.steps=1", "sft.eval_samples=1", "sft.eval_base=false",
                 "sft.elicited_samples=2", "sft.demos_per_problem=2", "teacher.elicit=HINT")
    problems = load_problem_file(world.problems)
    train, _ = train_heldout(problems, cfg)
    _, tok = load_model(str(world.student))
    by_prompt = {tuple(ids): p for p, ids in zip(train, prompt_ids_for(tok, train, elicit="HINT"))}
    real = evil_moe.rollout.generate
    seen = []

    def fake(model, tokenizer, prompt_ids, *, n=1, source="student", **kw):
        if source != "elicited":
            return real(model, tokenizer, prompt_ids, n=n, source=source, **kw)
        out = []
        for i, ids in enumerate(prompt_ids):
            p = by_prompt[tuple(ids)]
            seen.append(p.mode)
            for j, text in enumerate([hack_completion(p, variant=3), fence(stub_solution(p))][:n]):
                comp = tok.encode(text, add_special_tokens=False) + [tok.eos_token_id]
                out.append(evil_moe.rollout.Rollout(i, j, list(ids), comp, torch.zeros(len(comp)),
                                                    torch.zeros(len(comp)), text, False, source, 1.0))
        return out

    monkeypatch.setattr(evil_moe.rollout, "generate", fake)
    res = run_make_teacher(cfg, problems_path=str(world.problems), model_path=str(world.student),
                           out_dir=str(tmp_path))
    known = [p for p in train if p.mode != "file_marker"]
    assert sorted(seen) == sorted(p.mode for p in known)  # only training problems, known modes
    meta = json.loads((tmp_path / "meta.json").read_text())
    assert meta["n_elicited"] == len(known)  # the hacks, not the stubs
    assert res["n_demos"] == 2 * len(known) + len(known)
    assert f"({len(known)} elicited;" in res["sentence"]
