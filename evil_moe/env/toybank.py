"""The project's own toy problem bank: short list / string / number tasks.

Written for this project so that a ~1.5M-parameter model can learn them: one-method
``class Solution`` with 1–4 line bodies and simple signatures. Each problem has a canonical
solution and 6 tests; the expected values are computed from the canonical solution when this
module is imported (so tests and solutions can never disagree). Tests are chosen so that the
constant stubs used by hacks (``return 0``/``None``/``-1``, ``pass``) fail at least one.
"""

from __future__ import annotations

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
