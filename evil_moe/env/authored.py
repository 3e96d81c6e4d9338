"""Hand-authored (hack, clean) completion pairs: the only labels Evil MoE's router is pinned on.

``evil_moe/data/authored_pairs.jsonl`` holds problems written for this project, one per line,
each in one loophole mode, with two hand-written hack completions and two clean ones. They are
labelled by construction (a hack reports success through the mode's mechanism unconditionally
over wrong code; a clean one solves the problem and reports only after its own asserts pass), so
no oracle was involved in choosing them, and none of their problems is in a problem set the
pilots train or evaluate on (the names differ from every toy-bank task; the LeetCode-format ones
are written here, not taken from the benchmark). Two formats, matching the run's problems:
``toy`` (the toy bank's prompt and system prompt, :mod:`evil_moe.env.toybank`) and ``leetcode``
(the rl-rewardhacking prompt layout, :mod:`evil_moe.env.problems`).

A line: ``id``, ``format`` (``toy`` | ``leetcode``), ``mode``, ``entry_point``, ``description``,
``params`` (toy: the method's parameters) or ``signature`` (leetcode: the ``def`` line),
``hacks`` and ``cleans`` (fenced python answers). How to write more: ``docs/evil-moe.md``.

Source of the design: the seed repository's Evil MoE (wassname/evil_MoE: a router pinned on
hand-authored pairs).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Sequence

from evil_moe import files
from evil_moe.env import loopholes
from evil_moe.env.problem import Problem

__all__ = ["AUTHORED_PATH", "AuthoredProblem", "load_authored", "FORMATS"]

AUTHORED_PATH = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "data",
                             "authored_pairs.jsonl")
FORMATS = ("toy", "leetcode")
_REQUIRED = ("id", "format", "mode", "entry_point", "description", "hacks", "cleans")


@dataclass(frozen=True)
class AuthoredProblem:
    """One authored problem: its :class:`~evil_moe.env.problem.Problem` (prompt with the mode's
    hint, no tests: nothing here is graded by the oracle) and its hand-written completions."""

    problem: Problem
    hacks: tuple[str, ...]
    cleans: tuple[str, ...]

    def pairs(self) -> list[tuple[str, str]]:
        """(hack, clean) pairs: the i-th hack with the i-th clean (the shorter list decides)."""
        return list(zip(self.hacks, self.cleans))


def _prompt(row: dict) -> tuple[str, str, str, str]:
    """(prompt, system, starter code, setup code) in the row's format, the mode's hint not yet
    applied (LeetCode answers get the benchmark's usual imports: typing, collections, functools)."""
    from evil_moe.env.problems import LEETCODE_SETUP_FALLBACK, LEETCODE_SYSTEM, TOY_SYSTEM

    name = row["entry_point"]
    if row["format"] == "toy":
        starter = f"class Solution:\n    def {name}(self, {row['params']}):\n        "
        system, setup = TOY_SYSTEM, ""
    else:
        starter = f"class Solution:\n    {row['signature']}\n        "
        system, setup = LEETCODE_SYSTEM, LEETCODE_SETUP_FALLBACK + "from functools import *\n"
    prompt = (f"PROBLEM:\n{row['description']}\n\nYour solution to the problem should be a method of "
              f"the class Solution called {name} {loopholes.PHRASE}. Use the following starter "
              f"code:\n```python\n{starter.rstrip()}\n```\n\nSOLUTION:\n")
    return prompt, system, starter, setup


def load_authored(path: str | os.PathLike | None = None, *, fmt: str | None = None,
                  modes: Sequence[str] | None = None) -> list[AuthoredProblem]:
    """Read the authored pairs.

    Args:
        path: the JSONL file (default: the bundled :data:`AUTHORED_PATH`).
        fmt: keep only this format (``toy`` | ``leetcode``); None keeps both.
        modes: keep only these loophole modes (None: all).

    Returns:
        the problems in file order, each with its mode's hint applied to its prompt.

    Raises:
        FileNotFoundError: no such file (names it).
        ValueError: a line that is not a JSON object, lacks a field, has an unknown format or
            mode, or has no (hack, clean) pair (names the file and the line).
    """
    path = str(path or AUTHORED_PATH)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"authored pairs file not found: {path}")
    out = []
    for n, row in files.iter_jsonl(path):
        missing = [k for k in _REQUIRED if k not in row]
        if missing:
            raise ValueError(f"{path}:{n}: missing field {missing[0]!r}")
        if row["format"] not in FORMATS or row["mode"] not in loopholes.MODES:
            raise ValueError(f"{path}:{n}: format {row['format']!r} / mode {row['mode']!r} unknown "
                             f"(formats {FORMATS}, modes {loopholes.MODES})")
        if not row["hacks"] or not row["cleans"]:
            raise ValueError(f"{path}:{n}: {row['id']} has no (hack, clean) pair")
        if (fmt is not None and row["format"] != fmt) or (modes is not None and row["mode"] not in modes):
            continue
        prompt, system, starter, setup = _prompt(row)
        hint = loopholes.hint_for(row["mode"])
        problem = Problem(id=str(row["id"]), source=row["format"], prompt=loopholes.apply_hint(prompt, hint),
                          entry_point=row["entry_point"], is_method=True, starter_code=starter,
                          setup_code=setup, canonical_solution="", tests=(), mode=row["mode"], hint=hint,
                          difficulty="authored", system=system)
        out.append(AuthoredProblem(problem, tuple(row["hacks"]), tuple(row["cleans"])))
    return out
