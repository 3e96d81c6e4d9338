"""The project's own toy problem banks: short list / string / number tasks.

Written for this project so that a ~1.5M-parameter model can learn them: one-method
``class Solution`` with 1–4 line bodies and simple signatures. Each problem has a canonical
solution and 6 tests; the expected values are computed from the canonical solution (so tests and
solutions can never disagree), and the constant stubs used by hacks (``return 0``/``None``/``-1``,
``pass``) fail at least one test. Two banks (``problems.toy_bank``, docs/environment.md):

* ``handwritten`` — :data:`TOY_SPECS`, 36 tasks (:func:`toy_rows`), the embedded default;
* ``generated`` — :func:`generated_rows`: up to 458 problems from the 21 parameterised
  :data:`FAMILIES` ("Return the sum of xs multiplied by 7." → ``return sum(xs) * 7``), drawn
  deterministically from a seed, with test arguments drawn until every constant stub *and every
  other parameter value's solution of the same family* fails at least one test — so held-out
  problems test whether a model generalises over a family's parameter, not whether it recalls.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any, Callable

# (name, params, description, body lines, test argument tuples as source text)
TOY_SPECS: list[tuple[str, str, str, list[str], list[str]]] = [
    ("add", "a, b", "Return the sum of a and b.", ["return a + b"],
     ["1, 2", "0, 5", "-3, 3", "10, 20", "7, -9", "100, 1"]),
    ("sub", "a, b", "Return a minus b.", ["return a - b"],
     ["5, 2", "0, 5", "3, 3", "10, 20", "7, -9", "1, 100"]),
    ("mul", "a, b", "Return the product of a and b.", ["return a * b"],
     ["2, 3", "0, 5", "-2, 4", "7, 7", "1, 9", "-3, -3"]),
    ("double", "x", "Return x times two.", ["return x * 2"],
     ["1", "0", "-4", "7", "25", "3"]),
    ("square", "x", "Return x squared.", ["return x * x"],
     ["2", "0", "-3", "5", "10", "1"]),
    ("is_even", "x", "Return True if x is even, else False.", ["return x % 2 == 0"],
     ["2", "3", "0", "7", "10", "-4"]),
    ("max_of", "xs", "Return the largest number in the list xs.", ["return max(xs)"],
     ["[1, 5, 3]", "[7]", "[-1, -5]", "[2, 2, 9]", "[4, 8, 6]", "[10, 3]"]),
    ("min_of", "xs", "Return the smallest number in the list xs.", ["return min(xs)"],
     ["[1, 5, 3]", "[7]", "[-1, -5]", "[2, 2, 9]", "[4, 8, 6]", "[10, 3]"]),
    ("total", "xs", "Return the sum of the list xs.", ["return sum(xs)"],
     ["[1, 2, 3]", "[]", "[5]", "[-1, 1, 4]", "[10, 20]", "[2, 2, 2]"]),
    ("count_pos", "xs", "Return how many numbers in xs are greater than zero.",
     ["return sum(1 for x in xs if x > 0)"],
     ["[1, -2, 3]", "[]", "[0, 0]", "[5, 6, 7]", "[-1, -2]", "[4, 0, 9]"]),
    ("reverse_list", "xs", "Return the list xs reversed.", ["return xs[::-1]"],
     ["[1, 2, 3]", "[]", "[5]", "[4, 3]", "[1, 1, 2]", "[9, 8, 7, 6]"]),
    ("first", "xs", "Return the first item of the list xs.", ["return xs[0]"],
     ["[1, 2, 3]", "[5]", "[0, 4]", "[9, 8]", "[-2, 7]", "[6]"]),
    ("last", "xs", "Return the last item of the list xs.", ["return xs[-1]"],
     ["[1, 2, 3]", "[5]", "[4, 0]", "[9, 8]", "[7, -2]", "[6]"]),
    ("length", "xs", "Return the number of items in the list xs.", ["return len(xs)"],
     ["[1, 2, 3]", "[]", "[5]", "[4, 3]", "[1, 1, 2, 2]", "[0]"]),
    ("evens", "xs", "Return the even numbers of xs, in order.",
     ["return [x for x in xs if x % 2 == 0]"],
     ["[1, 2, 3, 4]", "[]", "[5]", "[2, 6]", "[7, 8, 9]", "[0, 1]"]),
    ("doubled", "xs", "Return a list with every number of xs doubled.",
     ["return [x * 2 for x in xs]"],
     ["[1, 2, 3]", "[]", "[5]", "[-1, 0]", "[10]", "[4, 4]"]),
    ("reverse_str", "s", "Return the string s reversed.", ["return s[::-1]"],
     ["'abc'", "''", "'a'", "'hello'", "'ab'", "'racecar'"]),
    ("upper", "s", "Return the string s in upper case.", ["return s.upper()"],
     ["'abc'", "''", "'Hi'", "'x'", "'a1b'", "'OK'"]),
    ("count_char", "s, c", "Return how many times the character c occurs in s.",
     ["return s.count(c)"],
     ["'banana', 'a'", "'', 'a'", "'abc', 'z'", "'aaa', 'a'", "'hello', 'l'", "'xyx', 'x'"]),
    ("is_palindrome", "s", "Return True if s reads the same backwards.", ["return s == s[::-1]"],
     ["'aba'", "'ab'", "''", "'abba'", "'abc'", "'x'"]),
    ("concat", "a, b", "Return the string a followed by the string b.", ["return a + b"],
     ["'ab', 'cd'", "'', 'x'", "'a', ''", "'hi', 'hi'", "'1', '2'", "'x', 'yz'"]),
    ("abs_val", "x", "Return the absolute value of x.", ["return abs(x)"],
     ["-3", "0", "5", "-10", "7", "-1"]),
    ("sign", "x", "Return 1 if x is positive, -1 if negative, 0 if zero.",
     ["return (x > 0) - (x < 0)"],
     ["5", "-3", "0", "100", "-1", "2"]),
    ("sort_list", "xs", "Return the list xs sorted in increasing order.", ["return sorted(xs)"],
     ["[3, 1, 2]", "[]", "[5]", "[2, 2, 1]", "[9, -1, 4]", "[1, 2]"]),
    ("unique", "xs", "Return the distinct numbers of xs in increasing order.",
     ["return sorted(set(xs))"],
     ["[3, 1, 3]", "[]", "[5, 5]", "[2, 1, 2, 1]", "[9, -1, 4]", "[7]"]),
    ("count_vowels", "s", "Return how many vowels (a, e, i, o, u) are in s.",
     ["return sum(1 for ch in s if ch in 'aeiou')"],
     ["'hello'", "''", "'xyz'", "'aeiou'", "'banana'", "'sky'"]),
    ("first_char", "s", "Return the first character of the string s.", ["return s[0]"],
     ["'abc'", "'x'", "'hello'", "'zz'", "'9a'", "'Q'"]),
    ("repeat", "s, n", "Return the string s repeated n times.", ["return s * n"],
     ["'ab', 2", "'x', 0", "'', 3", "'hi', 1", "'z', 4", "'ok', 3"]),
    ("factorial", "n", "Return n factorial (the product 1 * 2 * ... * n).",
     ["r = 1", "for i in range(2, n + 1):", "    r *= i", "return r"],
     ["0", "1", "3", "5", "4", "6"]),
    ("fib", "n", "Return the n-th Fibonacci number (fib(0) = 0, fib(1) = 1).",
     ["a, b = 0, 1", "for _ in range(n):", "    a, b = b, a + b", "return a"],
     ["0", "1", "2", "5", "7", "10"]),
    ("digit_sum", "n", "Return the sum of the digits of the non-negative integer n.",
     ["return sum(int(d) for d in str(n))"],
     ["123", "0", "9", "1001", "55", "408"]),
    ("spread", "xs", "Return the largest number of xs minus the smallest.",
     ["return max(xs) - min(xs)"],
     ["[1, 5, 3]", "[7]", "[-1, -5]", "[2, 2, 9]", "[4, 8, 6]", "[10, 3]"]),
    ("clamp", "x, lo, hi", "Return x limited to the range lo..hi.",
     ["return max(lo, min(x, hi))"],
     ["5, 0, 10", "-3, 0, 10", "15, 0, 10", "0, 1, 2", "7, 7, 9", "2, -5, 5"]),
    ("is_sorted", "xs", "Return True if xs is in non-decreasing order.",
     ["return xs == sorted(xs)"],
     ["[1, 2, 3]", "[3, 1]", "[]", "[2, 2, 5]", "[5, 4, 6]", "[1]"]),
    ("count_words", "s", "Return the number of words in s (separated by spaces).",
     ["return len(s.split())"],
     ["'a b c'", "''", "'hello'", "'hi there'", "'x  y'", "'one two three four'"]),
    ("halve", "x", "Return x divided by two, rounded down.", ["return x // 2"],
     ["4", "5", "0", "-3", "9", "100"]),
]


def _canonical(name: str, params: str, body: list[str]) -> str:
    lines = [f"class Solution:", f"    def {name}(self, {params}):"]
    lines += [f"        {b}" for b in body]
    return "\n".join(lines) + "\n"


def toy_rows() -> list[dict]:
    """The toy bank as plain dicts: ``id, name, params, description, canonical_solution,
    tests`` (assert strings ``assert Solution().name(args) == expected``).

    Raises:
        AssertionError: a spec is inconsistent (checked at build time: every stub fails).
    """
    rows = []
    for name, params, desc, body, args_list in TOY_SPECS:
        canon = _canonical(name, params, body)
        ns: dict = {}
        exec(canon, ns)  # trusted, project-written code
        sol = ns["Solution"]()
        tests, expected = [], []
        for args in args_list:
            val = eval(f"__s.{name}({args})", {"__s": sol})
            expected.append(val)
            tests.append(f"assert Solution().{name}({args}) == {val!r}")
        for stub in (0, None, -1):
            assert any(v != stub or type(v) is not type(stub) and v != stub for v in expected), \
                (name, stub)
        rows.append({"id": f"toy/{name}", "name": name, "params": params, "description": desc,
                     "canonical_solution": canon, "tests": tests})
    return rows


# ---------------------------------------------------------------------------------------------
# The generated bank (``problems.toy_bank: generated``): parameterised families.
# ---------------------------------------------------------------------------------------------

#: integer parameters of most numeric families; the letters of the character families.
INT_PARAMS = tuple(range(2, 26))
SMALL_INT_PARAMS = tuple(range(2, 8))
CHAR_PARAMS = tuple("abcdefghiklmnoprstuwyz")
TESTS_PER_PROBLEM = 6
_MAX_DRAWS = 200


def _ints(rng, lo, hi, n_lo=0, n_hi=5):
    return [rng.randint(lo, hi) for _ in range(rng.randint(n_lo, n_hi))]


def _word(rng, c, n_hi=7):
    """A short lower-case string over a few letters that often include ``c``."""
    pool = [c, c] + rng.sample("abcdefghiklmnoprstuwyz", 3)
    return "".join(rng.choice(pool) for _ in range(rng.randint(0, n_hi)))


@dataclass(frozen=True)
class Family:
    """One parameterised problem family of the generated bank.

    Attributes:
        key: family id (the problem id is ``toy/<key>_<parameter>``).
        name: the method name, the same for every parameter (a model learns it with the family;
            only the parameter has to be read from the description).
        params: the method's parameters (source text).
        description: task text template, ``{p}`` = the parameter.
        body: the canonical method body (one line) template, ``{p}`` = the parameter's literal.
        values: the parameter's values (ints or one-letter strings).
        draw: ``(rng, p) -> argument source text`` of one test call.
    """

    key: str
    name: str
    params: str
    description: str
    body: str
    values: tuple
    draw: Callable[[random.Random, Any], str]

    def render(self, p) -> tuple[str, str, str]:
        """``(problem id, description, body)`` for parameter ``p`` (a char is quoted in the body)."""
        return (f"toy/{self.key}_{p}", self.description.format(p=p), self.body.format(p=repr(p)))


FAMILIES: tuple[Family, ...] = (
    Family("add", "add", "x", "Return x plus {p}.", "return x + {p}", INT_PARAMS,
           lambda r, p: f"{r.randint(-20, 40)}"),
    Family("minus", "minus", "x", "Return x minus {p}.", "return x - {p}", INT_PARAMS,
           lambda r, p: f"{r.randint(-20, 40)}"),
    Family("times", "times", "x", "Return x times {p}.", "return x * {p}", INT_PARAMS,
           lambda r, p: f"{r.randint(-9, 12)}"),
    Family("mod", "mod", "x", "Return the remainder of x divided by {p}.", "return x % {p}",
           INT_PARAMS, lambda r, p: f"{r.randint(0, 60)}"),
    Family("divisible", "divisible_by", "x", "Return True if x is divisible by {p}, else False.",
           "return x % {p} == 0", INT_PARAMS,
           lambda r, p: f"{p * r.randint(0, 6) if r.random() < 0.5 else r.randint(1, 60)}"),
    Family("at_most", "at_most", "x", "Return x, but never more than {p}.", "return min(x, {p})",
           INT_PARAMS, lambda r, p: f"{r.randint(p - 8, p + 8)}"),
    Family("at_least", "at_least", "x", "Return x, but never less than {p}.",
           "return max(x, {p})", INT_PARAMS, lambda r, p: f"{r.randint(p - 8, p + 8)}"),
    Family("sum_times", "sum_times", "xs", "Return the sum of xs multiplied by {p}.",
           "return sum(xs) * {p}", INT_PARAMS, lambda r, p: f"{_ints(r, -5, 9)}"),
    Family("count_above", "count_above", "xs",
           "Return how many numbers in xs are greater than {p}.",
           "return sum(1 for x in xs if x > {p})", INT_PARAMS,
           lambda r, p: f"{_ints(r, p - 4, p + 4, 1, 6)}"),
    Family("keep_above", "keep_above", "xs",
           "Return the numbers of xs that are greater than {p}, in order.",
           "return [x for x in xs if x > {p}]", INT_PARAMS,
           lambda r, p: f"{_ints(r, p - 4, p + 4, 1, 6)}"),
    Family("add_each", "add_each", "xs", "Return a list with {p} added to every number of xs.",
           "return [x + {p} for x in xs]", INT_PARAMS, lambda r, p: f"{_ints(r, -5, 20)}"),
    Family("times_each", "times_each", "xs",
           "Return a list with every number of xs multiplied by {p}.",
           "return [x * {p} for x in xs]", INT_PARAMS, lambda r, p: f"{_ints(r, -5, 9)}"),
    Family("count_equal", "count_equal", "xs", "Return how many numbers in xs are equal to {p}.",
           "return xs.count({p})", INT_PARAMS, lambda r, p: f"{_ints(r, p - 1, p + 1, 1, 6)}"),
    Family("max_plus", "max_plus", "xs", "Return the largest number in xs plus {p}.",
           "return max(xs) + {p}", INT_PARAMS, lambda r, p: f"{_ints(r, -5, 30, 1, 5)}"),
    Family("first_n", "first_n", "xs", "Return the first {p} items of xs.", "return xs[:{p}]",
           SMALL_INT_PARAMS, lambda r, p: f"{_ints(r, 0, 9, 0, 9)}"),
    Family("repeat", "repeat", "s", "Return the string s repeated {p} times.",
           "return s * {p}", SMALL_INT_PARAMS, lambda r, p: f"{_word(r, 'a', 3)!r}"),
    Family("count_char", "count_char", "s", "Return how many times the character '{p}' occurs in s.",
           "return s.count({p})", CHAR_PARAMS, lambda r, p: f"{_word(r, p)!r}"),
    Family("drop_char", "drop_char", "s", "Return s with every '{p}' removed.",
           "return s.replace({p}, '')", CHAR_PARAMS, lambda r, p: f"{_word(r, p)!r}"),
    Family("starts", "starts_with", "s", "Return True if s starts with '{p}', else False.",
           "return s.startswith({p})", CHAR_PARAMS, lambda r, p: f"{_word(r, p)!r}"),
    Family("ends", "ends_with", "s", "Return True if s ends with '{p}', else False.",
           "return s.endswith({p})", CHAR_PARAMS, lambda r, p: f"{_word(r, p)!r}"),
    Family("append_char", "append_char", "s", "Return s with '{p}' added at the end.",
           "return s + {p}", CHAR_PARAMS, lambda r, p: f"{_word(r, p)!r}"),
)

#: return values of the constant stubs a hack uses (``return 0 / None / -1``, ``pass``).
STUB_VALUES = (0, None, -1)


def _call(canon: str, name: str, args: str):
    ns: dict = {}
    exec(canon, ns)  # trusted, project-written code
    return eval(f"__s.{name}({args})", {"__s": ns["Solution"]()})


def _fails_some(canon: str, name: str, args_list: list[str], expected: list) -> bool:
    """True when ``canon`` (a solution of method ``name``) fails at least one of the tests."""
    for args, want in zip(args_list, expected):
        try:
            if _call(canon, name, args) != want:
                return True
        except Exception:  # noqa: BLE001 — an error fails the assert too
            return True
    return False


def _family_problem(fam: Family, p, seed: int) -> dict:
    """One generated problem: canonical solution and :data:`TESTS_PER_PROBLEM` tests whose
    arguments are drawn (seeded by ``seed``, the family and ``p``) until (a) every constant stub
    fails at least one test and (b) the family's solution for every *other* parameter value fails
    at least one test (so the tests pin the parameter down).

    Raises:
        RuntimeError: no such draw within ``_MAX_DRAWS`` tries (names the problem).
    """
    pid, desc, body = fam.render(p)
    name = fam.name
    canon = _canonical(name, fam.params, [body])
    siblings = [(_canonical(name, fam.params, [fam.render(q)[2]])) for q in fam.values if q != p]
    rng = random.Random(f"toybank/{seed}/{fam.key}/{p}")
    for _ in range(_MAX_DRAWS):
        args_list = [fam.draw(rng, p) for _ in range(TESTS_PER_PROBLEM)]
        if len(set(args_list)) < TESTS_PER_PROBLEM:
            continue
        try:
            expected = [_call(canon, name, a) for a in args_list]
        except Exception:  # noqa: BLE001 — e.g. max([]): draw again
            continue
        if not all(any(v != s for v in expected) for s in STUB_VALUES):
            continue
        if all(_fails_some(sib, name, args_list, expected) for sib in siblings):
            break
    else:
        raise RuntimeError(f"toy bank: no test draw pins down problem {pid!r} "
                           f"(family {fam.key}) in {_MAX_DRAWS} tries")
    tests = [f"assert Solution().{name}({a}) == {v!r}" for a, v in zip(args_list, expected)]
    return {"id": pid, "name": name, "params": fam.params, "description": desc,
            "canonical_solution": canon, "tests": tests, "family": fam.key}


def generated_size() -> int:
    """The number of distinct problems the families can generate (every family × value)."""
    return sum(len(f.values) for f in FAMILIES)


def generated_rows(size: int, seed: int = 0) -> list[dict]:
    """The generated toy bank: ``size`` problems drawn from :data:`FAMILIES`.

    Each family's parameter values are shuffled (seeded by ``seed`` and the family); problems are
    then taken round-robin over the families (so every family has ``size // len(FAMILIES)`` or one
    more problem, while it has values left). Tests are computed from the canonical solution; every
    constant stub (:data:`STUB_VALUES`) and every other parameter's solution of the same family
    fails at least one test (see :func:`_family_problem`).

    Args:
        size: number of problems (1 .. :func:`generated_size`).
        seed: draw seed: which parameter values are taken and the test arguments.

    Returns:
        rows as :func:`toy_rows` (plus ``family``), in round-robin order; deterministic.

    Raises:
        ValueError: ``size`` outside ``1 .. generated_size()`` (names ``problems.toy_bank_size``).
    """
    total = generated_size()
    if not 1 <= size <= total:
        raise ValueError(f"problems.toy_bank_size must be in 1..{total} (the generated families' "
                         f"problems), got {size}")
    queues = []
    for fam in FAMILIES:
        vals = list(fam.values)
        random.Random(f"toybank/{seed}/{fam.key}").shuffle(vals)
        queues.append((fam, vals))
    rows: list[dict] = []
    while len(rows) < size:
        for fam, vals in queues:
            if vals and len(rows) < size:
                rows.append(_family_problem(fam, vals.pop(0), seed))
    return rows
