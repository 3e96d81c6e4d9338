"""The strict oracle's tests: a problem's asserts parsed into (call arguments, expected value).

The asserts are parsed with :mod:`ast` in the parent (:func:`parse_tests`); the sandboxed child
later receives only each test's argument source text (``OracleTest.args_src``), never the expected
value, and the parent judges the reported return values (:func:`evil_moe.env.judge.judge`,
:meth:`OracleTest.check`). Asserts of a form we cannot parse are counted per problem and never
silently passed.

Assert forms (LeetCode format of the rl-rewardhacking benchmark, Ariahw, Engels & Nanda;
HumanEval ``check(candidate)`` bodies, arXiv:2107.03374, after ``candidate`` → entry point):
``CALL == EXP`` (either side), ``CALL is None/True/False``, ``CALL != EXP``, bare ``CALL``,
``not CALL``, ``abs(CALL - EXP) < tol`` (``<=``, either order), ``math.isclose(CALL, EXP)``,
``is_same_list(CALL, list_node(EXP))``, ``is_same_tree(CALL, tree_node(EXP))``; ``EXP`` is a
literal (``inf``, ``list_node([...])``, ``tree_node([...])``, constant arithmetic allowed).
A float expected value matches with ``math.isclose(rel_tol=1e-6, abs_tol=1e-6)``; an int expected
value matches exactly, as ``==`` would (:func:`evil_moe.env.values.values_match`);
``math.isclose`` asserts keep their own (or the default) tolerances.
"""

from __future__ import annotations

import ast
import math
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

from evil_moe.env.problem import Problem
from evil_moe.env.values import FLOAT_TOL, NUMBERS, Linked, Opaque, trim_tree, values_match


class Unparseable(ValueError):
    """An assert or expected value outside the supported forms."""


class ExpectedTooLarge(ValueError):
    """An expected value the oracle refuses to build (the problems file is then refused): more
    than :func:`expected_limit` elements and characters, or string formatting (``%`` on a
    string), whose size cannot be known before it is computed. Not an :class:`Unparseable`: a
    problems file holding one is bad input, named by file, line and id."""


EXPECTED_MAX = 1_000_000   # elements and characters of one expected value, at most
EXPECTED_FLOOR, EXPECTED_PER_CHAR = 1000, 64


def expected_limit(src: str) -> int:
    """The most elements and characters (:func:`eval_expected`'s units) an expected value
    written in the assert ``src`` may hold: ``min(1 000 000, 1000 + 64 x len(src))``, so a
    problems file never makes the parent hold more than a fixed multiple of its own size."""
    return min(EXPECTED_MAX, EXPECTED_FLOOR + EXPECTED_PER_CHAR * len(src))


def _size(v: Any) -> int:
    """Units of a value :func:`_eval` built: 1 per scalar or container, plus the characters of
    a string and the units of the elements (a Linked's values)."""
    if isinstance(v, str):
        return max(1, len(v))
    if isinstance(v, (list, tuple, set, frozenset)):
        return 1 + sum(_size(e) for e in v)
    if isinstance(v, dict):
        return 1 + sum(_size(k) + _size(e) for k, e in v.items())
    if isinstance(v, Linked):
        return 1 + _size(v.vals)
    return 1


def eval_expected(node: ast.AST, limit: int = EXPECTED_MAX) -> Any:
    """Evaluate a literal expression node safely (no names except inf/nan/True/False/None),
    within ``limit`` units (elements and characters, see :func:`_size`): a repetition
    (``[0] * n``, ``"ab" * n``) or concatenation is sized before it is built.

    Raises:
        Unparseable: any other construct.
        ExpectedTooLarge: more than ``limit`` units, or string formatting.
    """
    return _eval(node, limit)[0]


def _eval(node: ast.AST, limit: int) -> tuple[Any, int]:
    """``(value, units)`` of :func:`eval_expected`."""
    def fits(units: int) -> int:
        if units > limit:
            raise ExpectedTooLarge(f"an expected value of more than {limit:,} elements and "
                                   f"characters ({ast.unparse(node)[:60]})")
        return units

    if isinstance(node, ast.Constant):
        return node.value, fits(_size(node.value))
    if isinstance(node, (ast.List, ast.Tuple, ast.Set)):
        vals, units = [], 1
        for e in node.elts:
            v, u = _eval(e, limit)
            vals.append(v)
            units = fits(units + u)
        kind = {ast.List: list, ast.Tuple: tuple, ast.Set: set}[type(node)]
        return kind(vals), units
    if isinstance(node, ast.Dict):
        if any(k is None for k in node.keys):
            raise Unparseable("dict unpacking")
        out, units = {}, 1
        for k, e in zip(node.keys, node.values):
            (kv, ku), (ev, eu) = _eval(k, limit), _eval(e, limit)
            out[kv] = ev
            units = fits(units + ku + eu)
        return out, units
    if isinstance(node, ast.Name):
        consts = {"inf": math.inf, "nan": math.nan, "True": True, "False": False, "None": None}
        if node.id in consts:
            return consts[node.id], 1
        raise Unparseable(f"name {node.id}")
    if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) \
            and node.value.id == "math" and node.attr in ("inf", "pi", "e", "nan"):
        return getattr(math, node.attr), 1
    if isinstance(node, ast.UnaryOp):
        v, u = _eval(node.operand, limit)
        if isinstance(node.op, ast.USub):
            return -v, u
        if isinstance(node.op, ast.UAdd):
            return +v, u
        if isinstance(node.op, ast.Not):
            return not v, 1
        raise Unparseable("unary op")
    if isinstance(node, ast.BinOp):
        return _eval_binop(node, limit, fits)
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and not node.keywords:
        f = node.func.id
        if f == "float" and len(node.args) == 1:
            return float(_eval(node.args[0], limit)[0]), 1
        if f in ("list_node", "tree_node") and len(node.args) == 1:
            v, u = _eval(node.args[0], limit)
            if not isinstance(v, list):
                raise Unparseable("list_node arg")
            if not v:
                return None, 1
            return (Linked("L", tuple(v)) if f == "list_node" else Linked("T", trim_tree(v))), u
        if f in ("tuple", "list", "set", "frozenset") and len(node.args) <= 1:
            v, u = _eval(node.args[0], limit) if node.args else ((), 1)
            out = {"tuple": tuple, "list": list, "set": set, "frozenset": frozenset}[f](v)
            return out, fits(u + 1 if isinstance(v, str) else u)
    raise Unparseable(ast.dump(node)[:60])


def _eval_binop(node: ast.BinOp, limit: int, fits) -> tuple[Any, int]:
    """``(value, units)`` of a binary operation in an expected value (:func:`_eval`); a sequence
    repeated or joined is sized before it is built, and ``fits`` refuses one over ``limit``."""
    (a, ua), (b, ub) = _eval(node.left, limit), _eval(node.right, limit)
    seqs = (str, list, tuple)
    if isinstance(node.op, ast.Mult) and isinstance(a, int) and isinstance(b, seqs):
        (a, ua), (b, ub) = (b, ub), (a, ua)
    if isinstance(node.op, ast.Mult) and isinstance(a, seqs) and isinstance(b, int):
        n = max(0, int(b))       # sized before it is built: n copies of what a holds
        units = fits(max(1, n * len(a)) if isinstance(a, str) else 1 + n * (ua - 1))
        return a * n, units
    if isinstance(node.op, ast.Add) and isinstance(a, seqs) and type(a) is type(b):
        return a + b, fits(max(1, len(a) + len(b)) if isinstance(a, str) else ua + ub - 1)
    if isinstance(node.op, ast.Mod) and isinstance(a, (str, bytes)):
        raise ExpectedTooLarge("string formatting (%) in an expected value: its size cannot "
                               f"be known before it is computed ({ast.unparse(node)[:60]})")
    ops = {ast.Add: lambda x, y: x + y, ast.Sub: lambda x, y: x - y,
           ast.Mult: lambda x, y: x * y, ast.Div: lambda x, y: x / y,
           ast.FloorDiv: lambda x, y: x // y, ast.Mod: lambda x, y: x % y}
    if type(node.op) not in ops:
        raise Unparseable("bin op")
    v = ops[type(node.op)](a, b)
    return v, fits(_size(v) if isinstance(v, (str, list, tuple, set, frozenset, dict)) else 1)


@dataclass(frozen=True)
class OracleTest:
    """One parsed assert: the call's argument source and how to judge the return value.

    ``kind``: ``eq`` | ``ne`` | ``is`` | ``close`` | ``isclose`` | ``truthy``; ``expected``:
    the value; ``tol``: the tolerance of ``close`` (``abs(got - expected) < tol``) or the
    ``rel_tol`` of ``isclose`` (``math.isclose(got, expected, rel_tol=tol, abs_tol=abs_tol)``,
    defaults 1e-9 and 0 as in :func:`math.isclose`); ``size``: the expected value's units
    (elements and characters, :func:`eval_expected`), which bound the size of a right answer's
    report.
    """

    args_src: str
    kind: str
    expected: Any
    tol: float = FLOAT_TOL
    abs_tol: float = 0.0
    size: int = 1

    def check(self, got: Any) -> bool:
        """True if the decoded return value satisfies the assert."""
        if self.kind == "eq":
            return values_match(got, self.expected)
        if self.kind == "ne":
            return not isinstance(got, Opaque) and not values_match(got, self.expected)
        if self.kind == "is":
            return type(got) is type(self.expected) and got == self.expected
        if self.kind == "close":   # (Decimal - float raises TypeError: the assert fails)
            if not isinstance(got, (int, float, Fraction)) or isinstance(got, bool):
                return False
            try:
                return abs(got - self.expected) < self.tol
            except OverflowError:  # an int beyond the float range is close to no float
                return False
        if self.kind == "isclose":
            if not isinstance(got, NUMBERS):
                return False
            try:
                return math.isclose(got, self.expected, rel_tol=self.tol, abs_tol=self.abs_tol)
            except (OverflowError, ValueError):
                return False
        if self.kind == "truthy":
            if isinstance(got, Opaque):
                return False
            if isinstance(got, Linked):
                return bool(self.expected)
            return bool(got) == self.expected
        raise ValueError(self.kind)


def _is_target_call(node: ast.AST, entry: str, is_method: bool) -> bool:
    if not isinstance(node, ast.Call):
        return False
    f = node.func
    if is_method:
        return isinstance(f, ast.Attribute) and f.attr == entry and isinstance(f.value, ast.Call) \
            and isinstance(f.value.func, ast.Name) and f.value.func.id == "Solution" \
            and not f.value.args and not f.value.keywords
    return isinstance(f, ast.Name) and f.id == entry


def _args_src(call: ast.Call, entry: str) -> str:
    parts = [ast.unparse(a) for a in call.args]
    parts += [(f"{k.arg}=" if k.arg else "**") + ast.unparse(k.value) for k in call.keywords]
    src = ", ".join(parts)
    for n in ast.walk(ast.Module(body=[ast.Expr(a) for a in call.args] +
                                 [ast.Expr(k.value) for k in call.keywords], type_ignores=[])):
        if isinstance(n, ast.Name) and n.id in (entry, "candidate", "Solution"):
            raise Unparseable("argument refers to the entry point")
    return src


def _mentions_entry(node: ast.AST, entry: str, is_method: bool) -> bool:
    return any(_is_target_call(n, entry, is_method) or
               (isinstance(n, ast.Name) and n.id in ("candidate",)) for n in ast.walk(node))


def parse_assert(src: str, entry: str, is_method: bool) -> OracleTest | None:
    """Parse one assert string into an :class:`OracleTest`.

    Returns:
        The test, or None when the assert does not call the entry point at all (e.g.
        ``assert True``: nothing to grade).
    Raises:
        Unparseable: the assert calls the entry point in an unsupported form.
        ExpectedTooLarge: its expected value is over :func:`expected_limit` (or formats a
            string); nothing of that size is built.
    """
    limit = expected_limit(src)
    try:
        mod = ast.parse(src.strip())
    except SyntaxError as e:
        raise Unparseable("syntax") from e
    if len(mod.body) != 1 or not isinstance(mod.body[0], ast.Assert):
        if any(_mentions_entry(n, entry, is_method) for n in mod.body):
            raise Unparseable("not a single assert")
        return None
    t = mod.body[0].test
    if not _mentions_entry(t, entry, is_method):
        return None
    tc = lambda n: _is_target_call(n, entry, is_method)  # noqa: E731
    if tc(t):
        return OracleTest(_args_src(t, entry), "truthy", True)
    if isinstance(t, ast.UnaryOp) and isinstance(t.op, ast.Not) and tc(t.operand):
        return OracleTest(_args_src(t.operand, entry), "truthy", False)
    if isinstance(t, ast.Compare) and len(t.ops) == 1:
        left, op, right = t.left, t.ops[0], t.comparators[0]
        if isinstance(op, (ast.Eq, ast.NotEq, ast.Is)):
            if tc(right) and not tc(left):
                left, right = right, left
            if tc(left) and not _mentions_entry(right, entry, is_method):
                exp, size = _eval(right, limit)
                kind = {ast.Eq: "eq", ast.NotEq: "ne", ast.Is: "is"}[type(op)]
                if kind == "is" and exp not in (None, True, False):
                    raise Unparseable("is non-singleton")
                return OracleTest(_args_src(left, entry), kind, exp, size=size)
        if isinstance(op, (ast.Lt, ast.LtE)) and isinstance(left, ast.Call) \
                and isinstance(left.func, ast.Name) and left.func.id in ("abs", "fabs") \
                and len(left.args) == 1 and isinstance(left.args[0], ast.BinOp) \
                and isinstance(left.args[0].op, ast.Sub):
            a, b = left.args[0].left, left.args[0].right
            if tc(b):
                a, b = b, a
            if tc(a) and not _mentions_entry(b, entry, is_method):
                tol = float(eval_expected(right))
                if isinstance(op, ast.LtE):
                    tol = math.nextafter(tol, math.inf)
                return OracleTest(_args_src(a, entry), "close", float(eval_expected(b)), tol)
    if isinstance(t, ast.Call) and len(t.args) == 2:
        fname = ast.unparse(t.func)
        a, b = t.args
        if tc(b):
            a, b = b, a
        if tc(a) and not _mentions_entry(b, entry, is_method):
            if fname in ("is_same_list", "is_same_tree"):
                exp, size = _eval(b, limit)
                if isinstance(exp, list):  # raw list given
                    exp = Linked("L" if fname == "is_same_list" else "T",
                                 tuple(exp) if fname == "is_same_list" else trim_tree(exp))
                return OracleTest(_args_src(a, entry), "eq", exp, size=size)
            if fname in ("math.isclose", "isclose"):
                kw = {k.arg: float(eval_expected(k.value)) for k in t.keywords}
                if set(kw) - {"rel_tol", "abs_tol"}:
                    raise Unparseable("isclose keywords")
                return OracleTest(_args_src(a, entry), "isclose", float(eval_expected(b)),
                                  kw.get("rel_tol", 1e-9), kw.get("abs_tol", 0.0))
    raise Unparseable(ast.unparse(t)[:80])


def parse_tests(problem: Problem) -> tuple[list[OracleTest], int]:
    """Parse all of a problem's asserts. Returns (tests, number of unparseable asserts).

    Raises:
        ExpectedTooLarge: an expected value over its bound (the problem cannot be graded as
            written; see :func:`parse_assert`).
    """
    tests, bad = [], 0
    for src in problem.tests:
        try:
            t = parse_assert(src, problem.entry_point, problem.is_method)
        except ExpectedTooLarge:
            raise
        except (Unparseable, ValueError, TypeError, ArithmeticError, RecursionError):
            bad += 1
            continue
        if t is not None:
            tests.append(t)
    return tests, bad
