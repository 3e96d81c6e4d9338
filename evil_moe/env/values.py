"""Values on both sides of the oracle's comparison, in the parent.

The sandboxed child reports each oracle call's return value in a tagged JSON serialisation (see
``sandbox_zygote._harness``); :func:`decode` turns it back into Python values, within a budget of
the parent's work per completion (:data:`PARENT_SECONDS`, 2 million values;
:class:`ReportTooCostly`). :func:`values_match` compares a decoded value with an expected value
(:func:`evil_moe.env.oracle.eval_expected`) with Python ``==`` semantics, except that a float
expected value matches with ``math.isclose(rel_tol=1e-6, abs_tol=1e-6)`` (:data:`FLOAT_TOL`); an
int expected value matches exactly, as ``==`` would. A ``fractions.Fraction`` or
``decimal.Decimal`` answer is the number it holds (``Fraction(3, 2) == 1.5``); NaN equals
nothing, itself included. Sets and dict keys compare through :func:`canon`, so a forged report
costs linear time.
"""

from __future__ import annotations

import decimal
import math
import time
from dataclasses import dataclass
from fractions import Fraction
from typing import Any, Iterable

FLOAT_TOL = 1e-6


@dataclass(frozen=True)
class Linked:
    """A ListNode ("L") or TreeNode ("T") as its LeetCode list serialisation."""

    kind: str
    vals: tuple


class Opaque:
    """A value we could not serialise: equal to nothing."""

    def __eq__(self, other):  # pragma: no cover - trivial
        return False

    __hash__ = object.__hash__

    def __repr__(self):
        return "<opaque>"


def trim_tree(vals: list) -> tuple:
    """A LeetCode tree serialisation without its trailing ``None`` entries."""
    vals = list(vals)
    while vals and vals[-1] is None:
        vals.pop()
    return tuple(vals)


PARENT_SECONDS = 5.0   # the parent's own time to decode and compare one completion's report
_MAX_NODES = 2_000_000  # decoded values per completion


class ReportTooCostly(ValueError):
    """One completion's report needs more than its share of the parent's work."""


class DecodeBudget:
    """Nodes and seconds the parent may spend decoding one completion's report."""

    def __init__(self, seconds: float = PARENT_SECONDS, nodes: int = _MAX_NODES):
        self.deadline = time.monotonic() + seconds
        self.nodes = nodes

    def step(self) -> None:
        self.nodes -= 1
        if self.nodes < 0:
            raise ReportTooCostly("report too large")
        if self.nodes % 4096 == 0 and time.monotonic() > self.deadline:
            raise ReportTooCostly("report too slow to decode")


DECIMAL_EXPONENT = 5000   # beyond it a Decimal equals no int, float or Fraction a report can hold


def _canon_number(x: Any) -> str | None:
    """:func:`canon` of an int, float, Fraction or Decimal: equal numbers, equal strings (an
    integral value as the int, a Fraction a float holds exactly as the float; a Decimal as the
    Fraction it equals, or, past :data:`DECIMAL_EXPONENT`, as its digits without trailing zeros:
    an int or Fraction that large has more digits than a report's JSON may carry)."""
    if isinstance(x, decimal.Decimal):
        if x.is_nan():
            return None
        if x.is_infinite():
            return _canon_number(-math.inf if x.is_signed() else math.inf)
        if x.is_zero() or abs(x.adjusted()) <= DECIMAL_EXPONENT:
            return _canon_number(Fraction(x))
        sign, digits, exp = x.as_tuple()
        text = "".join(map(str, digits))
        kept = text.rstrip("0")
        return "D" + "-" * sign + kept + "e" + str(exp + len(text) - len(kept))
    if isinstance(x, Fraction):
        if x.denominator == 1:
            return "i" + hex(x.numerator)
        try:
            f = float(x)
        except OverflowError:
            f = math.inf
        if math.isfinite(f) and Fraction(f) == x:
            return "f" + f.hex()
        return f"q{x.numerator:x}/{x.denominator:x}"
    if isinstance(x, bool) or isinstance(x, int):
        return "i" + hex(int(x))
    if math.isnan(x):
        return None
    if math.isfinite(x) and x.is_integer():
        return "i" + hex(int(x))
    return "f" + x.hex()


def canon(x: Any) -> str | None:
    """A string that is equal for two decoded hashable values exactly when Python's ``==`` says
    they are equal (``True == 1 == 1.0``, ``-0.0 == 0``, ``Fraction(1, 2) == 0.5``), or None for
    a value equal to nothing here (NaN, unhashable or opaque values). Set elements and dict keys
    are compared through it, so a forged report of values that share one ``hash`` costs linear
    time (strings hash with a secret key), never a quadratic set build."""
    if x is None:
        return "N"
    if isinstance(x, (bool, int, float, Fraction, decimal.Decimal)):
        return _canon_number(x)
    if isinstance(x, str):
        return "s" + x
    if isinstance(x, tuple):
        parts = []
        for e in x:
            c = canon(e)
            if c is None:
                return None
            parts.append(f"{len(c)}:{c}")
        return "t" + "".join(parts)
    if isinstance(x, SetVal):
        if x.bad:
            return None
        return "z" + "".join(f"{len(c)}:{c}" for c in sorted(x.keys))
    if isinstance(x, (frozenset, set)):
        return canon(SetVal.of(x))
    return None


class SetVal:
    """A reported set or frozenset: its elements' :func:`canon` strings (``bad`` when one is
    equal to nothing). Equal to a Python set exactly when ``==`` would be."""

    __slots__ = ("keys", "bad")

    def __init__(self, keys: frozenset, bad: bool):
        self.keys, self.bad = keys, bad

    @classmethod
    def of(cls, elems: Iterable) -> "SetVal":
        keys, bad = set(), False
        for e in elems:
            c = canon(e)
            if c is None:
                bad = True
            else:
                keys.add(c)
        return cls(frozenset(keys), bad)

    def __len__(self) -> int:
        return len(self.keys) + self.bad

    def __repr__(self) -> str:
        return f"SetVal({sorted(self.keys)!r}, bad={self.bad})"


class DictVal:
    """A reported dict: ``{canon(key): value}`` (``bad`` when a key is equal to nothing here or
    repeats, which no real dict reports)."""

    __slots__ = ("items", "bad")

    def __init__(self, items: dict, bad: bool):
        self.items, self.bad = items, bad

    def __len__(self) -> int:
        return len(self.items) + self.bad

    def __repr__(self) -> str:
        return f"DictVal({self.items!r}, bad={self.bad})"


def decode(v: Any, budget: DecodeBudget | None = None) -> Any:
    """Decode the child's tagged JSON serialisation (see ``sandbox_zygote._harness``) into
    Python values; sets become :class:`SetVal`, dicts :class:`DictVal`.

    Args:
        v: one parsed value (the zygote passes only the flat, depth-bounded schema of
            ``sandbox_zygote.valid_value``).
        budget: the parent's remaining work for this completion (default: a fresh one).
    Raises:
        ReportTooCostly: the value needs more than the budget (the test then fails, ``report``).
    """
    budget = budget or DecodeBudget()
    budget.step()
    if isinstance(v, list):
        return [decode(e, budget) for e in v]
    if isinstance(v, dict):
        if "f" in v:
            try:
                return float(v["f"])
            except (TypeError, ValueError):
                return Opaque()
        if "t" in v:
            return tuple(decode(e, budget) for e in v["t"])
        if "s" in v:
            return SetVal.of(decode(e, budget) for e in v["s"])
        if "d" in v:
            items, bad = {}, False
            for pair in v["d"]:
                if not isinstance(pair, list) or len(pair) != 2:
                    bad = True
                    continue
                c = canon(decode(pair[0], budget))
                if c is None or c in items:
                    bad = True
                    continue
                items[c] = decode(pair[1], budget)
            return DictVal(items, bad)
        if "q" in v:
            n, d = v["q"] if isinstance(v["q"], list) and len(v["q"]) == 2 else (0, 0)
            if type(n) is int and type(d) is int and d > 0:
                return Fraction(n, d)
            return Opaque()
        if "D" in v:
            try:
                d = decimal.Decimal(v["D"])
            except (TypeError, ValueError, ArithmeticError):
                return Opaque()
            return Opaque() if d.is_snan() else d   # == raises on a signalling NaN
        if "L" in v:
            return Linked("L", tuple(decode(e, budget) for e in v["L"]))
        if "T" in v:
            return Linked("T", trim_tree([decode(e, budget) for e in v["T"]]))
        return Opaque()
    return v


NUMBERS = (int, float, Fraction, decimal.Decimal)   # a decoded report's numbers


def _numbers_close(got: Any, exp: Any, tol: float) -> bool:
    """``isclose(got, exp, rel=abs=tol)`` for two numbers (int, float, Fraction, Decimal); a
    finite number too large for a float is compared exactly (so ``10**400`` is close to no
    float, never an OverflowError). NaN is close to nothing, as ``nan == nan`` is False."""
    try:
        fg, fe = float(got), float(exp)
    except OverflowError:
        return got == exp
    if math.isnan(fe) or math.isnan(fg):
        return False
    if math.isinf(fg) and isinstance(got, decimal.Decimal) and got.is_finite():
        return False      # a far-out Decimal converts to inf but equals no float
    return math.isclose(fg, fe, rel_tol=tol, abs_tol=tol)


def values_match(got: Any, exp: Any, tol: float = FLOAT_TOL) -> bool:
    """Python ``==`` semantics, except that a float *expected* value is matched with
    ``isclose(rel=abs=tol)`` (the LeetCode judge's tolerance for float answers; the literal in an
    assert is a rounded print). An int expected value is matched exactly, as ``==`` would
    (``23.0`` equals ``23``, ``23.0000092`` does not; ``Fraction(46, 2)`` and ``Decimal("23.0")``
    do). A NaN expected value matches nothing, a NaN answer included. Sets and dict keys compare
    exactly (through :func:`canon`), dict values recursively.

    Args:
        got: a decoded reported value (:func:`decode`).
        exp: the expected value (:func:`evil_moe.env.oracle.eval_expected`; Python sets and dicts).
    """
    if isinstance(got, Opaque) or isinstance(exp, Opaque):
        return False
    if isinstance(exp, float) and isinstance(got, NUMBERS) and not isinstance(got, bool):
        return _numbers_close(got, exp, tol)
    if isinstance(got, list) and isinstance(exp, list) or \
            isinstance(got, tuple) and isinstance(exp, tuple):
        return len(got) == len(exp) and all(values_match(a, b, tol) for a, b in zip(got, exp))
    if isinstance(got, Linked) and isinstance(exp, Linked):
        return got.kind == exp.kind and values_match(got.vals, exp.vals, tol)
    if isinstance(exp, (set, frozenset)):
        if not isinstance(got, SetVal) or got.bad:
            return False
        want = SetVal.of(exp)
        return not want.bad and got.keys == want.keys
    if isinstance(exp, dict):
        if not isinstance(got, DictVal) or got.bad:
            return False
        want = {}
        for k, v in exp.items():
            c = canon(k)
            if c is None:
                return False
            want[c] = v
        return got.items.keys() == want.keys() and \
            all(values_match(got.items[c], want[c], tol) for c in want)
    if isinstance(got, (SetVal, DictVal)):
        return False
    try:
        return bool(got == exp)
    except Exception:  # pragma: no cover
        return False
