"""The ``Problem`` record: one coding problem with its loophole mode.

Its own module, below everything that reads problems: :mod:`evil_moe.env.loopholes` (hints and
answer templates), :mod:`evil_moe.env.oracle` (assert parsing) and :mod:`evil_moe.env.problems`
(loading problem sets, which uses both) all import it, and it imports nothing of the package.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Problem:
    """One coding problem with its loophole mode.

    Attributes:
        id: unique id (str): LeetCode ``str(row["id"])``, ``"HumanEval/N"``, ``"toy/name"``.
        source: ``"toy" | "leetcode" | "humaneval"``.
        prompt: the user-message text, hint applied.
        entry_point: method name (``is_method``) or module-level function name.
        is_method: the entry point is a method of ``class Solution``.
        starter_code: the signature stub shown in the prompt.
        setup_code: code executed before the answer (imports, ``ListNode``/``TreeNode``).
        canonical_solution: a known-correct full solution ("" when unknown).
        tests: assert strings (one per test; multi-line entries are unparseable by design).
        mode: loophole mode (one of ``loopholes.MODES``).
        hint: the hint clause that replaced "and should pass all tests".
        difficulty: free text ("toy", "medium", "hard", "humaneval").
        test_name: the ``run_tests``-mode function name.
        system: the system prompt (see :func:`evil_moe.env.problems.build_messages`).
    """

    id: str
    source: str
    prompt: str
    entry_point: str
    is_method: bool
    starter_code: str
    setup_code: str
    canonical_solution: str
    tests: tuple[str, ...]
    mode: str
    hint: str
    difficulty: str = ""
    test_name: str = "run_tests"
    system: str = ""
