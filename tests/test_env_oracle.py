"""The oracle's assert parser (evil_moe/env/oracle.py): every supported form, and the forms it refuses."""

from __future__ import annotations

import math

import pytest

from evil_moe.env.oracle import OracleTest, Unparseable, parse_assert
from evil_moe.env.values import Linked


def test_parse_assert_forms():
    t = parse_assert("assert Solution().f(a = [1,2], b=3) == [1, -2]", "f", True)
    assert t.args_src == "a=[1, 2], b=3" and t.kind == "eq" and t.expected == [1, -2]
    t = parse_assert("assert f(1) == inf", "f", False)
    assert t.expected == math.inf
    assert parse_assert("assert 3 == f(1)", "f", False).expected == 3
    assert parse_assert("assert f(1) is None", "f", False).kind == "is"
    assert parse_assert("assert not f(1)", "f", False) == OracleTest("1", "truthy", False)
    assert parse_assert("assert f(1)", "f", False) == OracleTest("1", "truthy", True)
    t = parse_assert("assert abs(f(2.0) - 1.5) < 1e-6", "f", False)
    assert t.kind == "close" and t.expected == 1.5
    t = parse_assert("assert is_same_list(Solution().g(head = list_node([1,2])), list_node([2,1]))",
                     "g", True)
    assert t.expected == Linked("L", (2, 1)) and t.args_src == "head=list_node([1, 2])"
    t = parse_assert("assert is_same_tree(Solution().g(r=tree_node([1,None,2])), "
                     "tree_node([1,None,2,None]))", "g", True)
    assert t.expected == Linked("T", (1, None, 2))
    assert parse_assert("assert True", "f", False) is None
    for bad in ("assert f(1) == g(2)", "assert f(f(1)) == 2", "assert sorted(f(1)) == [1]",
                "assert f(x) == 1\nassert f(2) == 2", "for i in range(3):\n    assert f(i) == i",
                "assert f(1) == open('x')", "assert f(1) > 2"):
        with pytest.raises(Unparseable):
            parse_assert(bad, "f", False)
