"""Decoding reported values and comparing them with expected ones (evil_moe/env/values.py)."""

from __future__ import annotations

import math

from evil_moe.env.oracle import OracleTest
from evil_moe.env.values import Linked, decode, values_match


def test_values_match_and_decode():
    assert values_match(0.1 + 0.2, 0.3) and values_match(2, 2.0) and not values_match(2, 2.1)
    assert values_match([1.0000001, (2, 3)], [1.0, (2, 3)])
    assert not values_match([1, 2], (1, 2))
    assert values_match(decode({"f": "inf"}), math.inf)
    assert values_match(decode({"t": [1, {"s": [2]}]}), (1, {2}))
    assert not values_match(decode({"x": "Weird"}), decode({"x": "Weird"}))
    assert decode({"L": [1, 2]}) == Linked("L", (1, 2))
    assert not values_match(decode({"L": [1, 2]}), [1, 2])
    assert values_match(decode({"d": [["a", 1]]}), {"a": 1})


def test_huge_ints_never_overflow_the_comparison():
    assert not values_match(10 ** 400, 1.5) and not values_match(-(10 ** 400), -math.inf)
    assert not values_match([1.5, 10 ** 400], [1.5, 2.0]) and values_match(10 ** 400, 10 ** 400)
    assert not OracleTest("1", "close", 2.5, 1e-6).check(10 ** 400)
    assert OracleTest("1", "close", 2.5, 1e-6).check(2.5 + 1e-9)
    assert values_match(3, 3.0000001) and not values_match(10 ** 20, 1e20 * 1.5)
