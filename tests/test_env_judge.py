"""The parent's verdict on one zygote reply (evil_moe/env/judge.py): never raises (issue 13)."""

from __future__ import annotations

import functools

import pytest

from evil_moe.env.judge import judge
from evil_moe.env.oracle import OracleTest


def _tests3():
    return [OracleTest("1", "eq", 1.5), OracleTest("2", "close", 2.5), OracleTest("3", "eq", [1, 2])]


def _reply(records, status=None, **kw):
    return {"status": status or {"error": None}, "records": records, "stdout_marker": False,
            "chan": {"bytes": 0, "truncated": False, "dropped": 0}, **kw}


OK_RUN = [{"t": "check", "ok": True}, {"t": "run", "stdout": 0, "file": False}]
END = [{"t": "end"}]
GOOD = [{"t": "r", "i": 0, "r": ["ok", {"f": "1.5"}]}, {"t": "r", "i": 1, "r": ["ok", 2.5]},
        {"t": "r", "i": 2, "r": ["ok", [1, 2]]}]
JUDGE_CASES = [  # (name, records, status, expected (passed, gt_correct, error, tests_passed))
    ("all_right", OK_RUN + GOOD + END, None, (True, True, None, 3)),
    ("huge_int_vs_float", OK_RUN + [{"t": "r", "i": 0, "r": ["ok", 10 ** 400]},
                                    {"t": "r", "i": 1, "r": ["ok", -10 ** 400]}] + GOOD[2:] + END,
     None, (True, False, None, 1)),
    ("tuple_tag_not_a_list", OK_RUN + [{"t": "r", "i": 0, "r": ["ok", {"t": 5}]}] + GOOD[1:] + END,
     None, (True, False, "report", 2)),
    ("linked_tags_of_numbers", OK_RUN + [{"t": "r", "i": 0, "r": ["ok", {"L": 7}]},
                                         {"t": "r", "i": 1, "r": ["ok", {"T": None}]}] + GOOD[2:] + END,
     None, (True, False, "report", 1)),
    ("deep_nesting", OK_RUN + GOOD[:2] + [{"t": "r", "i": 2, "r": ["ok", functools.reduce(
        lambda x, _: [x], range(5000), [])]}] + END, None, (True, False, "report", 2)),
    # the first record of an index counts; a repeated index is a forgery, labelled "report"
    ("forged_first_record_wins", OK_RUN + [{"t": "r", "i": 0, "r": ["ok", 0]}] + GOOD + END, None,
     (True, False, "report", 2)),
    ("records_of_any_shape", [5, None, "x", [1], {"t": 7}, {"t": "r", "i": "0", "r": 1},
                              {"t": "r", "i": 99, "r": ["ok", 1]}, {"t": "r", "i": -1, "r": ["ok"]},
                              {"t": "check", "ok": "yes"}, {"t": "r", "i": 0, "r": ["ok", 1.5, 3]}]
     + GOOD[1:] + END, None, (False, False, None, 2)),
    ("unknown_child_error_label", [{"t": "err", "error": ["no"]}], None, (False, False, "exception", 0)),
    ("no_end_is_exit", OK_RUN + GOOD, None, (True, True, "exit", 3)),
    ("killed_by_own_signal", OK_RUN + GOOD[:1], {"error": "crash"}, (True, False, "crash", 1)),
    ("timeout_keeps_results", OK_RUN + GOOD[:2], {"error": "timeout"}, (True, False, "timeout", 2)),
    ("status_label_garbage", OK_RUN + GOOD + END, {"error": {"x": 1}}, (True, True, None, 3)),
    ("channel_truncated", OK_RUN + GOOD[:1], None, (True, False, "exit", 1)),
]


@pytest.mark.parametrize("case", JUDGE_CASES, ids=[c[0] for c in JUDGE_CASES])
def test_judge_never_raises(case):
    name, records, status, expected = case
    v = judge("run_tests", _tests3(), _reply(records, status))
    assert (v.passed, v.gt_correct, v.error, v.tests_passed) == expected, v
    assert (v.report_error is not None) == (expected[2] == "report")


def test_judge_reply_of_any_shape():
    for reply in ({}, {"status": 3, "records": 4}, {"records": [{"t": "r", "i": 0}], "chan": []}):
        v = judge("stdout_marker", _tests3(), reply)
        assert (v.passed, v.gt_correct) == (False, False)


MARKERS = {"pre": True, "run": False}
# (name, records, the zygote's stdout snapshots, expected passed): the records' "file" fields and
# the snapshots agree, so both modes expect the same
END_OF_RUN = [
    ("ended_during_the_calls_reads_the_first_snapshot",
     [{"t": "check", "ok": None}, {"t": "pre", "stdout": 17, "file": True}], MARKERS, True),
    ("ended_during_the_shutdown_has_not_finished",
     [{"t": "check", "ok": None}, {"t": "pre", "stdout": 17, "file": True}, {"t": "post"}],
     MARKERS, False),
    ("finished_reads_the_second_snapshot",
     [{"t": "check", "ok": None}, {"t": "pre", "stdout": 17, "file": True}, {"t": "post"},
      {"t": "run", "stdout": 17, "file": False}, {"t": "end"}], MARKERS, False),
    ("finished_with_the_marker", [{"t": "check", "ok": None}, {"t": "pre", "stdout": 0, "file": False},
                                  {"t": "post"}, {"t": "run", "stdout": 17, "file": True},
                                  {"t": "end"}], {"pre": False, "run": True}, True),
    ("old_boolean_marker_counts_for_nothing", [{"t": "check", "ok": None},
                                                {"t": "run", "stdout": 17, "file": False}], True, False),
]


@pytest.mark.parametrize("mode", ["stdout_marker", "file_marker"])
@pytest.mark.parametrize("case", END_OF_RUN, ids=[c[0] for c in END_OF_RUN])
def test_the_end_of_run_rule(case, mode):
    """The mode rules read the plain run after its shutdown (``run``), or, when the job ended
    during the oracle's calls (``pre`` and no ``post``), the snapshot before them; a job that
    ended during its shutdown (``post`` and no ``run``) has not finished. The stdout rule reads
    the zygote's sealed snapshot of the same point."""
    name, records, markers, expected = case
    v = judge(mode, _tests3(), _reply(records, stdout_marker=markers))
    assert v.passed is expected, v
