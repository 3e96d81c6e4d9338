"""The ``evil-moe grade`` command's helpers (:mod:`evil_moe.cli`): the problems to grade
(:func:`load_for_grading`) and a JSONL file of completions graded into a JSONL file of rewards
(:func:`grade_file`).
"""

from __future__ import annotations

import dataclasses
import json
from typing import Sequence

from evil_moe.env.grader import Grader
from evil_moe.env.loopholes import apply_hint, hint_for
from evil_moe.env.problem import Problem
from evil_moe.env.problems import load_problems, read_problems
from evil_moe.tables import atomic_write_bytes


def grade_file(problems: Sequence[Problem], completions_path: str, out_path: str, *,
               workers: int | None = None, timeout: float = 3.0, **grader_kw) -> dict:
    """Grade a JSONL file of ``{"problem_id", "completion"}`` rows (the ``evil-moe grade`` stage).

    Args:
        problems: the problem set (ids must match ``problem_id``; compared as strings).
        completions_path: input JSONL.
        out_path: output JSONL, one row per input row: every
            :class:`~evil_moe.env.grader.Reward` field plus ``problem_id``.
        workers, timeout, grader_kw: passed to :class:`~evil_moe.env.grader.Grader`.
    Returns:
        Summary dict: ``n, passed, gt_correct, exploited, format_ok, isolation, unparsed,
        cpu_budget`` (CPU seconds per problem id, see :meth:`~evil_moe.env.grader.Grader._size_budgets`).
    Raises:
        KeyError: a row names an unknown problem id. ValueError: a malformed row (naming the
        file and line). evil_moe.env.sandbox.SandboxUnavailable: see
        :class:`~evil_moe.env.grader.Grader`.
    """
    by_id = {str(p.id): p for p in problems}
    rows = []
    with open(completions_path) as f:
        for i, line in enumerate(f):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(f"{completions_path}:{i + 1}: not a JSON line ({e.msg})") from None
            if not isinstance(row, dict) or "problem_id" not in row or "completion" not in row:
                raise ValueError(f"{completions_path}:{i + 1}: need problem_id and completion")
            pid = str(row["problem_id"])
            if pid not in by_id:
                raise KeyError(f"{completions_path}:{i + 1}: unknown problem_id {pid!r}")
            rows.append((row["problem_id"], by_id[pid], row["completion"]))
    with Grader(problems, workers=workers, timeout=timeout, **grader_kw) as g:
        rewards = g.grade_many([(p, c) for _, p, c in rows])
        isolation, unparsed = g.isolation, dict(g.unparsed)
        budgets = {str(k): v for k, v in g.cpu_budget.items()}
    atomic_write_bytes(out_path, "".join(json.dumps({"problem_id": pid, **r.to_dict()}) + "\n"
                                         for (pid, _, _), r in zip(rows, rewards)).encode())
    summary = {"n": len(rewards), "isolation": isolation,
               "unparsed": {str(k): v for k, v in unparsed.items()}, "cpu_budget": budgets}
    for k in ("passed", "gt_correct", "exploited", "format_ok"):
        summary[k] = sum(getattr(r, k) for r in rewards)
    return summary


def load_for_grading(source: str, problems_path: str | None = None, *, mode: str | None = None,
                     seed: int = 0) -> list[Problem]:
    """Problems for ``evil-moe grade``.

    Args:
        source: ``toy`` | ``leetcode`` | ``humaneval``.
        problems_path: a problem-set file written by
            :func:`evil_moe.env.problems.write_problems` (rows with ``entry_point``; used as-is,
            modes included), or a raw source file (LeetCode JSONL / HumanEval JSONL). Optional for
            toy and humaneval; required for leetcode.
        mode: force this loophole mode on every problem (raw or written file alike).
        seed: mode-partition seed for raw files.
    Raises:
        ValueError: leetcode without a path; unknown source or mode.
        FileNotFoundError: missing file.
    """
    if problems_path is not None:
        with open(problems_path) as f:
            first = next((ln for ln in f if ln.strip()), "")
        if first and "entry_point" in json.loads(first):
            probs = read_problems(problems_path)
            if mode is not None:
                hint_for(mode)
                probs = [_remode(p, mode) for p in probs]
            return probs
    return load_problems(source, problems_path, mode=mode, seed=seed)


def _remode(p: Problem, mode: str) -> Problem:
    """``p`` in loophole mode ``mode``: its hint replaced by that mode's."""
    hint = hint_for(mode, p.test_name)
    raw = p.prompt.replace(p.hint, "and should pass all tests", 1) if p.hint else p.prompt
    return dataclasses.replace(p, mode=mode, hint=hint, prompt=apply_hint(raw, hint))
