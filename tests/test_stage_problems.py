"""The problems stage (evil_moe/stages/problems.py): the mode split and the written problem set.

The session fixture ``world`` (tests/stage_fixtures.py) trains the tiny toy models once; the tests
here reuse it.
"""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from evil_moe.env.loopholes import MODES
from evil_moe.cli import main
from stage_fixtures import cfg_of, set_flags

# tiny models on a busy 2-core machine: one torch thread (the conftest fixture)
pytestmark = pytest.mark.usefixtures("one_thread")

# ------------------------------------------------------------------------------------------------
# problems


def test_problems_modes_split_evenly_and_round_trip(tmp_path):
    from collections import Counter

    from evil_moe.env.problems import read_problems
    from evil_moe.stages.problems import problems_from_config, write_problem_set

    cfg = cfg_of()
    out = tmp_path / "problems.jsonl"
    written = write_problem_set(cfg, str(out))
    assert len(written) == 12
    assert Counter(p.mode for p in written) == {m: 3 for m in MODES}
    assert read_problems(out) == written
    assert problems_from_config(cfg) == written  # deterministic from problems.seed
    # an uneven count splits as evenly as possible
    odd = problems_from_config(cfg_of("problems.limit=10"))
    counts = Counter(p.mode for p in odd)
    assert set(counts) == set(MODES) and max(counts.values()) - min(counts.values()) <= 1
    forced = problems_from_config(cfg_of("problems.force_mode=sentinel"))
    assert {p.mode for p in forced} == {"sentinel"}


def test_problems_missing_leetcode_path_names_it(tmp_path):
    from evil_moe.stages.problems import write_problem_set

    missing = tmp_path / "nope" / "leetcode.jsonl"
    with pytest.raises(FileNotFoundError, match=str(missing)):
        write_problem_set(cfg_of("problems.source=leetcode", f"problems.path={missing}"),
                          str(tmp_path / "p.jsonl"))
    with pytest.raises(FileNotFoundError, match="problems.path"):
        write_problem_set(cfg_of("problems.source=leetcode"), str(tmp_path / "p.jsonl"))
    res = CliRunner().invoke(main, ["problems", *set_flags("problems.source=leetcode",
                                                             f"problems.path={missing}"),
                                    "--out", str(tmp_path / "p.jsonl")])
    assert res.exit_code == 1 and str(missing) in res.output
    assert not (tmp_path / "p.jsonl").exists()
