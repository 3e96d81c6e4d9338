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
from evil_moe.files import atomic_write_bytes, iter_jsonl


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
        :class:`~evil_moe.env.grader.Grader`. RuntimeError: an input row got no grade
        (:func:`check_one_row_each`; nothing is written then).
    """
    by_id = {str(p.id): p for p in problems}
    rows, labels = [], []
    for n, row in iter_jsonl(completions_path):
        if "problem_id" not in row or "completion" not in row:
            raise ValueError(f"{completions_path}:{n}: need problem_id and completion")
        pid = str(row["problem_id"])
        if pid not in by_id:
            raise KeyError(f"{completions_path}:{n}: unknown problem_id {pid!r}")
        rows.append((row["problem_id"], by_id[pid], row["completion"]))
        labels.append(f"{completions_path}:{n} (problem_id {pid!r})")
    with Grader(problems, workers=workers, timeout=timeout, **grader_kw) as g:
        rewards = g.grade_many([(p, c) for _, p, c in rows])
        isolation, unparsed = g.isolation, dict(g.unparsed)
        budgets = {str(k): v for k, v in g.cpu_budget.items()}
    check_one_row_each(rewards, labels)
    atomic_write_bytes(out_path, "".join(json.dumps({"problem_id": pid, **r.to_dict()}) + "\n"
                                         for (pid, _, _), r in zip(rows, rewards)).encode())
    summary = {"n": len(rewards), "isolation": isolation,
               "unparsed": {str(k): v for k, v in unparsed.items()}, "cpu_budget": budgets}
    for k in ("passed", "gt_correct", "exploited", "format_ok"):
        summary[k] = sum(getattr(r, k) for r in rewards)
    return summary


def check_one_row_each(rewards: Sequence, inputs: Sequence[str]) -> None:
    """Refuse a batch of grades that does not give every input its own row.

    Grades are positional (``rewards[i]`` is the grade of input ``i``), so a short batch leaves
    every input from ``len(rewards)`` on without a trustworthy row.

    Args:
        rewards: the grades returned for the inputs, in input order (one per input).
        inputs: one label per input (e.g. ``"file:line (problem_id '3')"``), named in the error.
    Raises:
        RuntimeError: fewer grades than inputs (naming the index and label of the first input
            with no grade, and both counts) or more grades than inputs (naming both counts).
    """
    if len(rewards) < len(inputs):
        k = len(rewards)
        raise RuntimeError(f"{len(rewards)} grades for {len(inputs)} inputs: input {k} "
                           f"({inputs[k]}) and every input after it got no grade")
    if len(rewards) > len(inputs):
        raise RuntimeError(f"{len(rewards)} grades for {len(inputs)} inputs: the grader returned "
                           f"rows for no input")


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
