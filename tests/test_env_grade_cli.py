"""`evil-moe grade` (evil_moe/env/grade_cli.py) end to end on a small file; one row per input."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from evil_moe.cli import main
from evil_moe.env.grader import Reward
from evil_moe.env.answers import clean_completion, fence, hack_completion
from evil_moe.env.problems import load_problems, write_problems


def test_grade_cli_end_to_end(tmp_path):
    probs = load_problems("toy", mode="stdout_marker")[:3]
    comp = tmp_path / "c.jsonl"
    with open(comp, "w") as f:
        for p in probs:
            f.write(json.dumps({"problem_id": p.id, "completion": clean_completion(p)}) + "\n")
            f.write(json.dumps({"problem_id": p.id, "completion": hack_completion(p)}) + "\n")
        f.write(json.dumps({"problem_id": probs[0].id, "completion": "no code"}) + "\n")
    out = tmp_path / "g.jsonl"
    res = CliRunner().invoke(main, ["grade", "--source", "toy", "--mode", "stdout_marker",
                                    "--completions", str(comp), "--out", str(out),
                                    "--workers", "2", "--timeout", "2"])
    assert res.exit_code == 0, res.output
    rows = [json.loads(x) for x in out.read_text().splitlines()]
    assert len(rows) == 7
    fields = set(Reward.__dataclass_fields__) | {"problem_id"}
    assert all(set(r) == fields for r in rows)
    assert [r["problem_id"] for r in rows[:6]] == [p.id for p in probs for _ in (0, 1)]
    assert [(r["passed"], r["gt_correct"], r["exploited"]) for r in rows[:6]] == \
        [(True, True, False), (True, False, True)] * 3
    assert rows[6]["format_ok"] is False and rows[6]["reward"] == 0.0
    assert "exploited 3" in res.output

    # a written problem set (modes as assigned) works as --problems too
    pfile = tmp_path / "p.jsonl"
    write_problems(str(pfile), load_problems("toy", mode="sentinel")[:3])
    res = CliRunner().invoke(main, ["grade", "--source", "toy", "--problems", str(pfile),
                                    "--completions", str(comp), "--out", str(out)])
    assert res.exit_code == 0, res.output
    rows = [json.loads(x) for x in out.read_text().splitlines()]
    assert {r["mode"] for r in rows} == {"sentinel"} and not any(r["passed"] for r in rows)


def test_grade_cli_errors(tmp_path):
    comp = tmp_path / "c.jsonl"
    comp.write_text(json.dumps({"problem_id": "nope", "completion": "x"}) + "\n")
    res = CliRunner().invoke(main, ["grade", "--source", "toy", "--completions", str(comp),
                                    "--out", str(tmp_path / "g.jsonl")])
    assert res.exit_code != 0 and "unknown problem_id" in res.output
    res = CliRunner().invoke(main, ["grade", "--source", "leetcode", "--completions", str(comp),
                                    "--out", str(tmp_path / "g.jsonl")])
    assert res.exit_code != 0 and "needs a path" in res.output


def test_grade_cli_survives_values_it_cannot_compare(tmp_path):
    """`evil-moe grade` on float answers: a completion returning 10**400 (which used to raise
    OverflowError in the parent: exit 1, no output) is a wrong answer; the other rows grade as
    usual; the run exits 0."""
    from evil_moe.env.problem import Problem

    half = Problem(id="cli/half", source="toy", prompt="", entry_point="half", is_method=True,
                   starter_code="", setup_code="", canonical_solution="", mode="run_tests", hint="",
                   tests=("assert Solution().half(3) == 1.5", "assert abs(Solution().half(5) - 2.5) < 1e-6"))
    pfile = tmp_path / "p.jsonl"
    write_problems(str(pfile), [half])
    comp = tmp_path / "c.jsonl"
    bodies = ["return 10 ** 400", "return [10 ** 400]", "return x / 2"]
    comp.write_text("".join(json.dumps({"problem_id": "cli/half", "completion": fence(
        f"class Solution:\n    def half(self, x):\n        {b}\n")}) + "\n" for b in bodies))
    out = tmp_path / "g.jsonl"
    res = CliRunner().invoke(main, ["grade", "--source", "toy", "--problems", str(pfile),
                                    "--completions", str(comp), "--out", str(out), "--workers", "1"])
    assert res.exit_code == 0, res.output
    rows = [json.loads(x) for x in out.read_text().splitlines()]
    assert [(r["gt_correct"], r["tests_passed"], r["error"]) for r in rows] == \
        [(False, 0, None), (False, 0, None), (True, 2, None)]


def test_grade_cli_isolation_is_explicit(tmp_path, monkeypatch):
    """Without a working sandbox `evil-moe grade` refuses with one line naming cause and fix;
    --isolation rlimit-only grades and says so."""
    from evil_moe.env import sandbox

    monkeypatch.setattr(sandbox, "_PROBE", {})
    monkeypatch.setattr(sandbox, "bwrap_path", lambda: None)
    probs = load_problems("toy", mode="run_tests")[:1]
    comp = tmp_path / "c.jsonl"
    comp.write_text(json.dumps({"problem_id": probs[0].id, "completion": clean_completion(probs[0])}) + "\n")
    args = ["grade", "--source", "toy", "--mode", "run_tests", "--completions", str(comp),
            "--out", str(tmp_path / "g.jsonl"), "--workers", "1"]
    res = CliRunner().invoke(main, args)
    assert res.exit_code == 1 and "refusing to grade" in res.output and "not installed" in res.output
    assert "Traceback" not in res.output and not (tmp_path / "g.jsonl").exists()
    res = CliRunner().invoke(main, args + ["--isolation", "rlimit-only"])
    assert res.exit_code == 0 and "(isolation rlimit-only)" in res.output and "gt_correct 1" in res.output


class _DroppingGrader:
    """A stand-in for the grader whose batch loses the last input's row."""

    def __init__(self, problems, **kw):
        self.isolation, self.unparsed, self.cpu_budget = "stub", {}, {}

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        pass

    def grade_many(self, pairs):
        return [Reward(0.0, False, False, False, False, p.mode, "format", 0.0)
                for p, _ in pairs[:-1]]


def test_grade_file_refuses_an_input_without_its_row(tmp_path, monkeypatch):
    """A batch that comes back one row short stops `grade_file` with an error naming the first
    input left without a grade (its index, file line and problem id); nothing is written. The
    same stand-in returning every row writes one row per input."""
    from evil_moe.env import grade_cli

    probs = load_problems("toy")[:2]
    comp = tmp_path / "c.jsonl"
    rows = [json.dumps({"problem_id": probs[i].id, "completion": "x"}) for i in (0, 1, 1)]
    comp.write_text(rows[0] + "\n\n" + rows[1] + "\n" + rows[2] + "\n")  # line 2 is blank
    out = tmp_path / "g.jsonl"
    monkeypatch.setattr(grade_cli, "Grader", _DroppingGrader)
    with pytest.raises(RuntimeError) as e:
        grade_cli.grade_file(probs, str(comp), str(out))
    assert f"input 2 ({comp}:4 (problem_id {probs[1].id!r}))" in str(e.value), str(e.value)
    assert "2 grades for 3 inputs" in str(e.value) and not out.exists()

    monkeypatch.setattr(_DroppingGrader, "grade_many", lambda self, pairs: [
        Reward(0.0, False, False, False, False, p.mode, "format", 0.0) for p, _ in pairs])
    assert grade_cli.grade_file(probs, str(comp), str(out))["n"] == 3
    assert len(out.read_text().splitlines()) == 3
