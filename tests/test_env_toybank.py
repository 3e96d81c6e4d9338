"""The generated toy problem bank (evil_moe/env/toybank.py, docs/environment.md)."""

from __future__ import annotations

import collections

import pytest

from evil_moe.env import toybank
from evil_moe.env.answers import stub_solution
from evil_moe.env.problems import load_problems


def _run(code: str, tests) -> list[bool]:
    """Which asserts hold for ``code`` (an exception counts as a failure)."""
    out = []
    for t in tests:
        ns: dict = {}
        try:
            exec(code, ns)
            exec(t, ns)
            out.append(True)
        except Exception:  # noqa: BLE001
            out.append(False)
    return out


@pytest.fixture(scope="module")
def every_problem():
    return toybank.generated_rows(toybank.generated_size(), seed=0)


def test_generated_bank_is_deterministic_and_seeded():
    a = toybank.generated_rows(120, seed=0)
    assert a == toybank.generated_rows(120, seed=0)
    b = toybank.generated_rows(120, seed=1)
    assert [r["id"] for r in a] != [r["id"] for r in b]  # another seed draws other parameters
    # the first problems are the families' first (shuffled) values, one per family, in order
    assert [r["family"] for r in a[:len(toybank.FAMILIES)]] == [f.key for f in toybank.FAMILIES]


def test_generated_bank_counts_and_balance(every_problem):
    # 14 families over the 24 integers 2..25, 2 over the 6 integers 2..7, 5 over 22 letters
    per = collections.Counter(len(f.values) for f in toybank.FAMILIES)
    assert per == {24: 14, 6: 2, 22: 5}
    assert toybank.generated_size() == 14 * 24 + 2 * 6 + 5 * 22 == 458 == len(every_problem)
    assert len({r["id"] for r in every_problem}) == 458
    rows = toybank.generated_rows(400, seed=0)
    n = collections.Counter(r["family"] for r in rows)
    # round-robin: the two 6-value families run out, the other 19 share the remaining 388
    assert n["first_n"] == n["repeat"] == 6
    rest = [c for k, c in n.items() if k not in ("first_n", "repeat")]
    assert len(rest) == 19 and sum(rest) == 388 and max(rest) - min(rest) <= 1


def test_canonical_passes_and_every_stub_fails():
    probs = load_problems("toy", toy_bank="generated", toy_bank_size=toybank.generated_size())
    assert len(probs) == 458
    for p in probs:
        assert len(p.tests) == toybank.TESTS_PER_PROBLEM
        assert all(_run(p.canonical_solution, p.tests)), p.id
        for variant in range(4):  # return 0 / pass / return None / return -1
            assert not all(_run(stub_solution(p, variant), p.tests)), (p.id, variant)


def test_tests_pin_the_parameter_down(every_problem):
    """Every other parameter's solution of the same family fails at least one test: a model that
    copies the family but not the parameter cannot pass (so held-out problems test the copy)."""
    fams = {f.key: f for f in toybank.FAMILIES}
    for r in every_problem:
        fam = fams[r["family"]]
        for q in fam.values:
            _, _, body = fam.render(q)
            code = f"class Solution:\n    def {r['name']}(self, {r['params']}):\n        {body}\n"
            if code == r["canonical_solution"]:
                continue
            assert not all(_run(code, r["tests"])), (r["id"], q)


def test_load_problems_generated_and_handwritten():
    gen = load_problems("toy", toy_bank="generated", toy_bank_size=400)
    assert len(gen) == 400 and all(p.source == "toy" and p.is_method for p in gen)
    assert collections.Counter(p.mode for p in gen) == {m: 100 for m in
                                                        ("run_tests", "sentinel", "stdout_marker", "file_marker")}
    first = toybank.generated_rows(1)[0]
    assert gen[0].id == first["id"] and gen[0].entry_point == toybank.FAMILIES[0].name == "add"
    # one method name per family: only the parameter (in the description) tells problems apart
    assert len({p.entry_point for p in gen}) == len(toybank.FAMILIES)
    assert len({p.prompt for p in gen}) == 400
    assert "Return " in gen[0].prompt and gen[0].entry_point in gen[0].starter_code
    hand = load_problems("toy")
    assert len(hand) == len(toybank.TOY_SPECS) == 36 and hand == load_problems("toy", toy_bank="handwritten")


def test_bad_bank_settings_name_the_key():
    from evil_moe.config import ConfigError, load_config
    from evil_moe.stages.problems import problems_from_config

    with pytest.raises(ConfigError, match="problems.toy_bank"):
        load_config((), ["problems.toy_bank=huge"])
    with pytest.raises(ConfigError, match="problems.toy_bank_size"):
        load_config((), ["problems.toy_bank_size=459"])
    with pytest.raises(ValueError, match="problems.toy_bank_size"):
        toybank.generated_rows(0)
    cfg = load_config((), ["problems.toy_bank=generated", "problems.toy_bank_size=50"])
    assert len(problems_from_config(cfg)) == 50
