"""The teacher stage (evil_moe/stages/teacher.py): recorded log-probs, resume from parts.

The session fixture ``world`` (tests/stage_fixtures.py) trains the tiny toy models once; the tests
here reuse it.
"""

from __future__ import annotations

import pytest
import torch

from evil_moe import files, tables
from stage_fixtures import cfg_of, header, read_tsv

# tiny models on a busy 2-core machine: one torch thread (the conftest fixture)
pytestmark = pytest.mark.usefixtures("one_thread")

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
    recs = files.read_jsonl(tmp_path / "rollouts.jsonl.gz")
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
    import evil_moe.rl.policy.rollout
    from evil_moe.stages.teacher import run_teacher

    cfg = _teacher_cfg()
    kw = dict(problems_path=str(world.problems), model_path=str(world.teacher), out_dir=str(tmp_path))
    real_write = files.write_jsonl_gz

    def crash(*a, **k):
        raise RuntimeError("killed")

    monkeypatch.setattr(files, "write_jsonl_gz", crash)
    with pytest.raises(RuntimeError, match="killed"):
        run_teacher(cfg, **kw)
    parts = sorted((tmp_path / "_work").glob("part_*.jsonl"))
    assert [p.name for p in parts] == ["part_00000.jsonl", "part_00001.jsonl", "part_00002.jsonl"]
    assert not (tmp_path / "rollouts.jsonl.gz").exists()
    contents = [files.read_jsonl(p) for p in parts]
    mtimes = {p.name: p.stat().st_mtime_ns for p in parts}
    parts[1].unlink()  # this batch was lost: only it is regenerated

    calls = []
    real_generate = evil_moe.rl.policy.rollout.generate

    def counting_generate(*a, **k):
        calls.append(k.get("seed"))
        return real_generate(*a, **k)

    seen = {}

    def check_then_write(path, records):
        seen.update({p.name: p.stat().st_mtime_ns for p in (tmp_path / "_work").glob("part_*.jsonl")})
        real_write(path, records)

    monkeypatch.setattr(evil_moe.rl.policy.rollout, "generate", counting_generate)
    monkeypatch.setattr(files, "write_jsonl_gz", check_then_write)
    res = run_teacher(cfg, **kw)
    assert calls == [cfg.teacher.seed * 1_000_003 + 1]  # only the missing batch
    assert seen["part_00000.jsonl"] == mtimes["part_00000.jsonl"]  # kept parts untouched
    assert seen["part_00002.jsonl"] == mtimes["part_00002.jsonl"]
    final = files.read_jsonl(tmp_path / "rollouts.jsonl.gz")
    assert final == contents[0] + contents[1] + contents[2] and res["n"] == len(final)
    assert header(tmp_path / "summary.tsv") == tables.names(tables.TEACHER_SUMMARY)


def test_teacher_drops_parts_of_another_config(world, tmp_path, monkeypatch):
    from evil_moe.stages.teacher import run_teacher

    kw = dict(problems_path=str(world.problems), model_path=str(world.teacher), out_dir=str(tmp_path))
    real_write = files.write_jsonl_gz

    def crash(*a, **k):
        raise RuntimeError("killed")

    monkeypatch.setattr(files, "write_jsonl_gz", crash)
    with pytest.raises(RuntimeError):
        run_teacher(_teacher_cfg(), **kw)
    assert len(list((tmp_path / "_work").glob("part_*.jsonl"))) == 3
    monkeypatch.setattr(files, "write_jsonl_gz", real_write)
    res = run_teacher(_teacher_cfg("teacher.n=1"), **kw)  # not the crashed run's config
    assert res["n"] == 8 and len(files.read_jsonl(tmp_path / "rollouts.jsonl.gz")) == 8


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
    kept = sorted(p.name for p in work.iterdir() if p.name != files.hash_record(key_file).name)
    assert kept == ["key.txt"] and key_file.read_text() == "k2"
