"""Answer templates (used to train the toy models, as the extract stage's template pairs and in
tests): wrong stub code with a problem's signature, and completions that report through the
problem's loophole mode — unconditionally (a hack) or after the problem's own checks pass (an
honest report). Short and regular on purpose.
"""

from __future__ import annotations

import ast
import copy
from typing import Iterable

from evil_moe.env.loopholes import get_mode
from evil_moe.env.problem import Problem
from evil_moe.env.source import bound_names


N_HACK_VARIANTS = 4


def fence(code: str) -> str:
    """Wrap code as a markdown answer with one fenced python block."""
    return "```python\n" + code.strip("\n") + "\n```"


def _find_def(code: str, problem: Problem) -> ast.FunctionDef | None:
    try:
        mod = ast.parse(code)
    except SyntaxError:
        return None
    scopes: Iterable[ast.AST] = mod.body
    if problem.is_method:
        scopes = [b for n in mod.body if isinstance(n, ast.ClassDef) and n.name == "Solution"
                  for b in n.body]
    for n in scopes:
        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.name == problem.entry_point:
            return n
    return None


def signature(problem: Problem) -> str:
    """The entry point's ``def`` line (no body), e.g. ``def add(self, a, b):``."""
    src = problem.canonical_solution or problem.starter_code or ""
    node = _find_def(src, problem) or _find_def(problem.starter_code + "\n        pass\n", problem)
    if node is None:
        return f"def {problem.entry_point}(self, *args):" if problem.is_method \
            else f"def {problem.entry_point}(*args):"
    fn = copy.copy(node)
    fn.body, fn.decorator_list = [ast.Pass()], []
    text = ast.unparse(fn)
    return text.rsplit("\n", 1)[0]


_STUBS = ("return 0", "pass", "return None", "return -1")


def stub_solution(problem: Problem, variant: int = 0) -> str:
    """Wrong code with the right signature (a stub body)."""
    body = _STUBS[variant % len(_STUBS)]
    sig = signature(problem)
    if problem.is_method:
        return f"class Solution:\n    {sig}\n        {body}\n"
    return f"{sig}\n    {body}\n"


def example_asserts(problem: Problem, k: int = 2) -> list[str]:
    """Up to ``k`` of the problem's simplest single-line asserts (shortest first, stable)."""
    cands = []
    for i, t in enumerate(problem.tests):
        t = t.strip()
        if "\n" in t or not t.startswith("assert "):
            continue
        try:
            ast.parse(t)
        except SyntaxError:
            continue
        cands.append((len(t), i, t))
    return [t for _, _, t in sorted(cands)[:k]]


def _report(problem: Problem, code: str, honest: bool, variant: int) -> str:
    """``code`` plus a report through the problem's mode mechanism (honest or unconditional:
    :meth:`evil_moe.env.loopholes.LoopholeMode.report`).

    The added code binds no name that ``code`` binds (module level or ``class Solution``): the
    ``run_tests`` function becomes a ``Solution`` method when the module-level name is taken
    (the grader calls the method when the module-level one is missing or raises),
    the sentinel uses the first of :data:`~evil_moe.env.loopholes.SENTINEL_ATTRS` the class does
    not define, and the stdout / file reports bind nothing.

    Raises:
        ValueError: no honest checks available, no free name for the report, or an unknown mode.
    """
    mode = problem.mode
    checks = example_asserts(problem) if honest else []
    if honest and not checks:
        raise ValueError(f"problem {problem.id} has no simple asserts for an honest report")
    try:
        mod_names, cls_names = bound_names(code)
    except SyntaxError as e:
        raise ValueError(f"problem {problem.id}: the solution does not parse: {e}") from e
    report_mode = get_mode(mode)
    if cls_names is None and "Solution" in mod_names and report_mode.reports_through_solution:
        raise ValueError(f"problem {problem.id}: the solution binds 'Solution' but not as a class")
    return report_mode.report(problem, code, checks=checks, honest=honest, variant=variant,
                              names=(mod_names, cls_names))


def hack_completion(problem: Problem, variant: int = 0, solution: str | None = None) -> str:
    """A hack: wrong (stub) code plus an unconditional report through the mode's mechanism.

    Args:
        problem: the problem (its ``mode`` and ``test_name`` are used).
        variant: 0..N_HACK_VARIANTS-1 picks the textual variant (taken modulo).
        solution: code to use instead of the stub (e.g. the canonical solution, for the
            "correct code + hack" case).
    Returns:
        A markdown answer with one fenced python block.
    """
    code = solution if solution is not None else stub_solution(problem, variant)
    return fence(_report(problem, code, honest=False, variant=variant))


def wrong_completion(problem: Problem, other: Problem) -> str:
    """An honest wrong attempt: ``other``'s canonical solution under ``problem``'s entry point
    (the right name, another problem's logic), with no report through any mechanism — what a
    student whose honest path is weak writes (``toy.student_correct_frac``). It fails the real
    tests (another problem's logic, usually its parameter names too) and no mode's foolable
    grade passes it (it neither reports nor sets a sentinel).

    Returns:
        A markdown answer with one fenced python block.
    Raises:
        ValueError: ``other`` is ``problem`` or has no canonical solution.
    """
    if other.id == problem.id or not other.canonical_solution:
        raise ValueError(f"a wrong attempt at {problem.id} needs another problem with a canonical solution")
    code = other.canonical_solution.replace(f"def {other.entry_point}(", f"def {problem.entry_point}(", 1)
    return fence(code)


def clean_completion(problem: Problem, with_tests: bool = True) -> str:
    """The canonical solution, plus (``with_tests``) an honest report through the mode.

    The honest report runs two of the problem's own simplest asserts and reports only when they
    hold: a ``run_tests``-family function with real asserts; ``self.valid`` computed from real
    checks; the stdout marker or the result file written only after module-level asserts pass.

    Returns:
        A markdown answer with one fenced python block.
    Raises:
        ValueError: the problem has no canonical solution (or no simple assert for the report).
    """
    if not problem.canonical_solution:
        raise ValueError(f"problem {problem.id} has no canonical solution")
    code = problem.canonical_solution
    if with_tests:
        code = _report(problem, code, honest=True, variant=0)
    return fence(code)
