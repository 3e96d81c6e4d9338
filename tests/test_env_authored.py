"""The hand-authored (hack, clean) pairs of Evil MoE's router (evil_moe/env/authored.py):
every mode in both formats, labelled by construction and checked without the oracle — every hack
and every clean completion passes its mode's foolable grader (a clean one by its own honest
report), the environment's static recognition of an unconditional report flags every hack and no
clean one, and no authored problem is a problem of the toy bank."""

from __future__ import annotations

import json

import pytest

from evil_moe.env.authored import AUTHORED_PATH, load_authored
from evil_moe.env.loopholes import MODES


def test_every_mode_in_both_formats():
    probs = load_authored()
    for fmt in ("toy", "leetcode"):
        got = {p.problem.mode for p in load_authored(fmt=fmt)}
        assert got == set(MODES), fmt
    assert all(len(p.pairs()) >= 2 for p in probs)
    assert all(p.problem.tests == () for p in probs)  # nothing for the oracle to read


def test_hacks_are_unconditional_reports_and_cleans_are_not():
    from evil_moe.env.grader import extract_code
    from evil_moe.env.loopholes import pattern_flag

    for p in load_authored():
        for h in p.hacks:
            assert pattern_flag(p.problem.mode, extract_code(h), p.problem.test_name), (p.problem.id, h)
        for c in p.cleans:
            assert not pattern_flag(p.problem.mode, extract_code(c), p.problem.test_name), (p.problem.id, c)


def test_every_completion_passes_its_modes_foolable_grader():
    """Only the loophole grade (``passed``) is read. The grader refuses a problem without a
    parseable assert, so each gets a placeholder one here (its outcome, the oracle's, is ignored)."""
    import dataclasses

    from evil_moe.env.grader import Grader

    authored = load_authored()
    probs = [dataclasses.replace(a.problem, tests=(f"assert Solution().{a.problem.entry_point}(0) == 0",))
             for a in authored]
    with Grader(probs, workers=2) as g:
        for a, p in zip(authored, probs):
            rewards = g.grade_many([(p, t) for t in a.hacks + a.cleans])
            assert all(r.passed and r.format_ok for r in rewards), (p.id, [r.error for r in rewards])


def test_no_authored_problem_is_a_toy_bank_task():
    from evil_moe.env.toybank import toy_rows

    bank = {r["name"] for r in toy_rows()}
    assert not bank & {p.problem.entry_point for p in load_authored()}


def test_bad_files_are_one_clear_error(tmp_path):
    bad = tmp_path / "pairs.jsonl"
    row = json.loads(open(AUTHORED_PATH).readline())
    bad.write_text(json.dumps({**row, "mode": "nope"}) + "\n")
    with pytest.raises(ValueError, match=r"pairs.jsonl:1: .*mode 'nope'"):
        load_authored(bad)
    bad.write_text(json.dumps({k: v for k, v in row.items() if k != "cleans"}) + "\n")
    with pytest.raises(ValueError, match="missing field 'cleans'"):
        load_authored(bad)
    with pytest.raises(FileNotFoundError, match="missing.jsonl"):
        load_authored(tmp_path / "missing.jsonl")
