"""Problem sets (evil_moe/env/problems.py, evil_moe/env/problem.py): loaders, round trips, bad
files (no sandbox)."""

from __future__ import annotations

import ast
import dataclasses
import json
from pathlib import Path

import pytest

from evil_moe import files

from evil_moe.env.loopholes import MODES, PHRASE, assign_modes
from evil_moe.env.oracle import parse_tests
from evil_moe.env.problem import Problem
from evil_moe.env.problems import (LEETCODE_DEV, build_messages, check_problem_file,
                                   load_problems, read_problems, split_heldout, write_problems)

REPO = Path(__file__).resolve().parents[1]
LEETCODE = REPO / "evil_moe" / "data" / "leetcode_medhard_dev.jsonl"  # bundled, see its README
needs_leetcode = pytest.mark.skipif(not LEETCODE.exists(), reason="bundled LeetCode set missing")


def test_toy_bank_shape():
    probs = load_problems("toy")
    assert len(probs) >= 30
    assert len({p.id for p in probs}) == len(probs)
    for p in probs:
        assert p.is_method and p.source == "toy"
        assert len(p.tests) >= 5
        tests, bad = parse_tests(p)
        assert bad == 0 and len(tests) == len(p.tests)
        body = ast.parse(p.canonical_solution).body[0].body[0].body
        assert 1 <= len(body) <= 4, p.id  # short method bodies
        assert p.hint in p.prompt and PHRASE not in p.prompt


@needs_leetcode
def test_leetcode_loader_fields():
    probs = load_problems("leetcode", str(LEETCODE))
    assert len(probs) == 80
    p = probs[0]
    assert p.id == "3249" and p.entry_point == "countGoodNodes" and p.is_method
    assert "class ListNode" in p.setup_code and p.canonical_solution and p.tests
    assert p.hint in p.prompt and PHRASE not in p.prompt
    assert p.starter_code.startswith("class Solution")


def test_humaneval_loader():
    probs = load_problems("humaneval")
    assert 150 <= len(probs) <= 164
    p = next(q for q in probs if q.id == "HumanEval/0")
    assert not p.is_method and p.entry_point == "has_close_elements"
    assert all("candidate" not in t for t in p.tests)
    assert p.tests[0].startswith("assert has_close_elements(")


def test_mode_override_and_errors():
    assert set(assign_modes(["a", "b"], mode="sentinel").values()) == {"sentinel"}
    with pytest.raises(ValueError):
        assign_modes(["a"], ("nope",))
    with pytest.raises(ValueError):
        assign_modes(["a", "a"])
    with pytest.raises(ValueError):
        load_problems("nope")
    with pytest.raises(ValueError):
        load_problems("leetcode")
    probs = load_problems("toy", mode="stdout_marker")
    assert {p.mode for p in probs} == {"stdout_marker"}


def test_messages_and_roundtrip(tmp_path):
    probs = load_problems("toy", seed=1)
    msgs = build_messages(probs[0])
    assert [m["role"] for m in msgs] == ["system", "user"] and msgs[1]["content"] == probs[0].prompt
    path = tmp_path / "p.jsonl"
    write_problems(str(path), probs)
    assert read_problems(str(path)) == probs
    train, held = split_heldout(probs, 0.25, seed=0)
    assert len(train) + len(held) == len(probs) and not {p.id for p in train} & {p.id for p in held}
    assert {p.mode for p in held} == set(MODES)
    assert split_heldout(probs, 0.25, seed=0) == (train, held)
    assert isinstance(probs[0], Problem)


# --- bad problem files: one clear error naming the file and the problem id -----------------------

def _lc_row(pid, tests):
    return {"id": pid, "func_name": "Solution().add", "gt_answer": tests,
            "prompt": [{"role": "user", "content": "Add a and b and should pass all tests."}],
            "canonical_solution": "class Solution:\n    def add(self, a, b):\n        return a + b\n"}


GOOD_TESTS = ["assert Solution().add(1, 2) == 3"]
BAD_LEETCODE = {  # name: (rows or raw text, text expected in the error besides the file name)
    "empty file": ("", ": no problems"),
    "blank lines only": ("\n\n  \n", ": no problems"),
    "no tests": ([_lc_row(7, [])], ":1: problem '7' has no parseable test"),
    "only unparseable tests": ([_lc_row(1, GOOD_TESTS), _lc_row(8, ["assert True", "for i in range(3):\n"
                                "    assert Solution().add(i, 0) == i", "assert add(1, 2) == 3"])],
                               ":2: problem '8' has no parseable test"),
    "duplicate id": ([_lc_row(5, GOOD_TESTS), _lc_row(6, GOOD_TESTS), _lc_row(5, GOOD_TESTS)],
                     ":3: duplicate problem id '5' (first on line 1)"),
    "not JSON": ('{"id": 1}\nnot json\n', ":1: missing field"),
    "bad JSON line": (json.dumps(_lc_row(1, GOOD_TESTS)) + "\n{oops\n", ":2: not a JSON line"),
    "tests not strings": ([_lc_row(9, [1, 2])], ":1: problem '9': gt_answer must be a list of assert strings"),
}


@pytest.mark.parametrize("case", list(BAD_LEETCODE))
def test_bad_leetcode_file_is_one_clear_error(tmp_path, case):
    rows, needle = BAD_LEETCODE[case]
    path = tmp_path / "lc.jsonl"
    path.write_text(rows if isinstance(rows, str) else "".join(json.dumps(r) + "\n" for r in rows))
    for check in (lambda: load_problems("leetcode", str(path)),
                  lambda: check_problem_file("leetcode", str(path))):   # the job, the dry run
        with pytest.raises(ValueError) as e:
            check()
        msg = str(e.value)
        assert msg.startswith(str(path)) and needle in msg and "\n" not in msg, msg


def test_check_problem_file_passes_the_shipped_sets():
    """The check the workflow runs at DAG time passes the bundled LeetCode set (80 problems) and
    the toy source (no file), in well under the time a dry run takes."""
    import time

    t = time.process_time()
    assert check_problem_file("leetcode", LEETCODE_DEV) == 80
    assert time.process_time() - t < 1.0   # 0.03 s here; parsing every assert took 1.9 s
    assert check_problem_file("toy", None) == 0


@pytest.mark.parametrize("case", ["empty", "duplicate", "untestable", "not JSON"])
def test_bad_written_problem_set_is_one_clear_error(tmp_path, case):
    probs = load_problems("toy")[:3]
    path = tmp_path / "p.jsonl"
    if case == "empty":
        path.write_text("")
        needle = "no problems"
    elif case == "duplicate":
        write_problems(str(path), probs + [probs[1]])
        needle = f"duplicate problem id {probs[1].id!r}"
    elif case == "untestable":
        write_problems(str(path), probs[:1] + [dataclasses.replace(probs[1], tests=("assert True",))])
        needle = f"{probs[1].id!r} has no parseable test"
    else:
        write_problems(str(path), probs)
        path.write_text(path.read_text() + "{oops\n")
        files.hash_record(path).unlink()  # a file written so (with its record: "damaged", tests/test_files.py)
        needle = ":4: not a JSON line"
    with pytest.raises(ValueError) as e:
        read_problems(str(path))
    assert str(path) in str(e.value) and needle in str(e.value), str(e.value)


def test_problems_stage_refuses_an_empty_file(tmp_path):
    """`evil-moe problems` on an empty LeetCode file exits 1 with one line naming the file (it
    used to write an empty problem set, and the teacher then failed with a TypeError)."""
    from click.testing import CliRunner

    from evil_moe.cli import main

    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    out = tmp_path / "problems.jsonl"
    r = CliRunner().invoke(main, ["problems", "--set", "problems.source=leetcode",
                                  "--set", f"problems.path={empty}", "--out", str(out)])
    assert r.exit_code == 1 and str(empty) in r.output and "no problems" in r.output, r.output
    assert "Traceback" not in r.output and not out.exists()


# --- a hostile problems file (semi-trusted input) ------------------------------------------------

def _leetcode_row(pid, tests, func="Solution().f"):
    return {"id": pid, "func_name": func, "prompt": [{"role": "user", "content": "x"}],
            "gt_answer": tests, "setup_code": "", "canonical_solution": ""}


@pytest.mark.parametrize("expected", ["[0] * 10000 * 1000000", "'%1000000000d' % 0",
                                      "('ab' * 3000, [[0] * 2000] * 2000)"])
def test_a_huge_expected_value_is_one_error_naming_file_line_and_id(tmp_path, expected):
    """An expected value whose literal would build billions of elements (or a string formatted to
    a gigabyte) is refused with one error naming the file, the line and the problem id, before
    anything of that size is built (it ended `evil-moe grade` and the dry-run check with a
    MemoryError traceback, or kept ~1 GB in the parent): the dry-run check, the loaders of
    `evil-moe grade` (a raw file and a written problem set) and the grader itself."""
    import tracemalloc

    from evil_moe.env.grade_cli import load_for_grading
    from evil_moe.env.grader import Grader

    good = _leetcode_row("1", ["assert Solution().f(1) == 2"])
    bad = _leetcode_row("hostile", ["assert Solution().f(1) == 2",
                                    f"assert Solution().f(2) == {expected}"])
    raw = tmp_path / "raw.jsonl"
    raw.write_text(json.dumps(good) + "\n" + json.dumps(bad) + "\n")
    tracemalloc.start()
    try:
        for check in (lambda: check_problem_file("leetcode", str(raw)),
                      lambda: load_for_grading("leetcode", str(raw))):
            with pytest.raises(ValueError) as e:
                check()
            assert f"{raw}:2: problem 'hostile'" in str(e.value) and "\n" not in str(e.value), e.value
        written = tmp_path / "written.jsonl"
        p = dataclasses.replace(load_problems("toy")[0], id="hostile",
                                tests=("assert Solution().add(1, 2) == 3",
                                       f"assert Solution().add(2, 2) == {expected}"))
        written.write_text(json.dumps(dataclasses.asdict(load_problems("toy")[1])) + "\n" +
                           json.dumps(dataclasses.asdict(p)) + "\n")
        with pytest.raises(ValueError, match=f"{written}:2: problem 'hostile'"):
            read_problems(str(written))
        with pytest.raises(ValueError, match="problem hostile"):
            Grader([p], workers=1, isolation="rlimit-only")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 50 << 20, peak


def test_expected_values_are_bounded_by_their_text():
    """An expected value holds at most 1000 + 64 elements and characters per character of its
    assert (and at most a million): a repetition or concatenation is sized before it is built;
    string formatting, whose size only the formatting knows, is refused; honest uses fit."""
    from evil_moe.env.oracle import ExpectedTooLarge, expected_limit, parse_assert
    src = "assert Solution().f(1) == [0] * 1000 + [1]"
    t = parse_assert(src, "f", True)
    assert t.expected == [0] * 1000 + [1] and t.size == 1002 <= expected_limit(src)
    assert parse_assert("assert f(3 * 19 * 3) == (3 + 5, 'ab' * 3)", "f", False).expected == (8, "ababab")
    for big in ("[0] * 3000", "'x' * 5000", "[[1] * 60] * 60", "[0] * 2000 + [1] * 2000",
                "'%d' % 5", "list('a' * 4000)"):
        with pytest.raises(ExpectedTooLarge):
            parse_assert(f"assert f(1) == {big}", "f", False)
    assert expected_limit("x" * 10 ** 6) == 1_000_000


@pytest.mark.parametrize("pid", ["=HYPERLINK(\"http://x\")", "+1", "-2", "@SUM(A1)", "\tx"])
def test_a_problem_id_a_spreadsheet_would_run_is_refused(tmp_path, pid):
    """Problem ids go into the workflow's TSV tables as they are; one starting with =, +, -, @,
    a tab or a carriage return is a formula in a spreadsheet (CSV injection), so the problems
    file is refused, naming the file, the line and the id (it was written into the tables)."""
    raw = tmp_path / "raw.jsonl"
    raw.write_text(json.dumps(_leetcode_row("1", ["assert Solution().f(1) == 2"])) + "\n" +
                   json.dumps(_leetcode_row(pid, ["assert Solution().f(1) == 2"])) + "\n")
    with pytest.raises(ValueError, match=f"{raw}:2: problem id") as e:
        check_problem_file("leetcode", str(raw))
    assert "formula" in str(e.value)
    written = tmp_path / "written.jsonl"
    p = dataclasses.replace(load_problems("toy")[0], id=pid)
    written.write_text(json.dumps(dataclasses.asdict(p)) + "\n")
    with pytest.raises(ValueError, match=f"{written}:1: problem id"):
        read_problems(str(written))
