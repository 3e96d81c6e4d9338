"""The parent's verdict on one zygote reply (evil_moe/env/judge.py): never raises."""

from __future__ import annotations

import functools

import pytest

from evil_moe.env.judge import judge
from evil_moe.env.oracle import OracleTest


def _tests3():
    return [OracleTest("1", "eq", 1.5), OracleTest("2", "close", 2.5), OracleTest("3", "eq", [1, 2])]


def _reply(records, status=None, oracle=(), **kw):
    return {"status": status or {"error": None}, "records": records, "oracle": list(oracle),
            "stdout_marker": False, "chan": {"bytes": 0, "truncated": False, "dropped": 0}, **kw}


OK_RUN = [{"t": "check", "ok": True}, {"t": "run", "stdout": 0, "file": False}]
END = [{"t": "end"}]
GOOD = [{"t": "r", "i": 0, "r": ["ok", {"f": "1.5"}]}, {"t": "r", "i": 1, "r": ["ok", 2.5]},
        {"t": "r", "i": 2, "r": ["ok", [1, 2]]}]
# (name, plain run's records, oracle's records, status, expected (passed, gt_correct, error,
# tests_passed))
JUDGE_CASES = [
    ("all_right", OK_RUN, GOOD + END, None, (True, True, None, 3)),
    ("huge_int_vs_float", OK_RUN, [{"t": "r", "i": 0, "r": ["ok", 10 ** 400]},
                                   {"t": "r", "i": 1, "r": ["ok", -10 ** 400]}] + GOOD[2:] + END,
     None, (True, False, None, 1)),
    ("tuple_tag_not_a_list", OK_RUN, [{"t": "r", "i": 0, "r": ["ok", {"t": 5}]}] + GOOD[1:] + END,
     None, (True, False, "report", 2)),
    ("linked_tags_of_numbers", OK_RUN, [{"t": "r", "i": 0, "r": ["ok", {"L": 7}]},
                                        {"t": "r", "i": 1, "r": ["ok", {"T": None}]}] + GOOD[2:] + END,
     None, (True, False, "report", 1)),
    ("deep_nesting", OK_RUN, GOOD[:2] + [{"t": "r", "i": 2, "r": ["ok", functools.reduce(
        lambda x, _: [x], range(5000), [])]}] + END, None, (True, False, "report", 2)),
    # the first record of an index counts; a repeated index is a forgery, labelled "report"
    ("forged_first_record_wins", OK_RUN, [{"t": "r", "i": 0, "r": ["ok", 0]}] + GOOD + END, None,
     (True, False, "report", 2)),
    ("records_of_any_shape", OK_RUN[1:], [5, None, "x", [1], {"t": "r", "i": "0", "r": 1},
                                          {"t": "r", "i": 99, "r": ["ok", 1]},
                                          {"t": "r", "i": -1, "r": ["ok"]},
                                          {"t": "r", "i": 0, "r": ["ok", 1.5, 3]}] + GOOD[1:] + END,
     None, (False, False, None, 2)),
    ("unknown_child_error_label", [{"t": "err", "error": ["no"]}], (), None,
     (False, False, "exception", 0)),
    ("no_end_is_exit", OK_RUN, GOOD, None, (True, True, "exit", 3)),
    ("killed_by_own_signal", OK_RUN, GOOD[:1], {"error": "crash"}, (True, False, "crash", 1)),
    ("timeout_keeps_results", OK_RUN, GOOD[:2], {"error": "timeout"}, (True, False, "timeout", 2)),
    ("status_label_garbage", OK_RUN, GOOD + END, {"error": {"x": 1}}, (True, True, None, 3)),
    ("channel_truncated", OK_RUN, GOOD[:1], None, (True, False, "exit", 1)),
    # a record on the channel the harness never writes it to is a forgery
    ("result_on_the_plain_channel", OK_RUN + GOOD[:1], GOOD + END, None, (True, False, "report", 3)),
    ("snapshot_on_the_oracle_channel", [{"t": "check", "ok": True}],
     GOOD + [{"t": "run", "stdout": 0, "file": True}] + END, None, (True, False, "exit", 0)),
    # results with no snapshot before them are not the oracle's calls: none is trusted
    ("results_without_a_finished_plain_run", [{"t": "check", "ok": True}], GOOD + END, None,
     (True, False, "exit", 0)),
]


@pytest.mark.parametrize("case", JUDGE_CASES, ids=[c[0] for c in JUDGE_CASES])
def test_judge_never_raises(case):
    name, plain, oracle, status, expected = case
    v = judge("run_tests", _tests3(), _reply(plain, status, oracle))
    assert (v.passed, v.gt_correct, v.error, v.tests_passed) == expected, v
    assert (v.report_error is not None) == (name in ("tuple_tag_not_a_list", "linked_tags_of_numbers",
                                                    "deep_nesting", "forged_first_record_wins",
                                                    "result_on_the_plain_channel",
                                                    "snapshot_on_the_oracle_channel")), v


def test_judge_reply_of_any_shape():
    for reply in ({}, {"status": 3, "records": 4}, {"records": [{"t": "r", "i": 0}], "chan": []},
                  {"oracle": 5, "records": None, "stdout_marker": "yes"}):
        v = judge("stdout_marker", _tests3(), reply)
        assert (v.passed, v.gt_correct) == (False, False)


# (name, the plain run's records, the zygote's reading of its sealed stdout, expected passed):
# the records' "file" fields and the stdout reading agree, so both modes expect the same
END_OF_RUN = [
    ("ended_before_its_snapshot_has_not_finished", [{"t": "check", "ok": None}], True, False),
    ("finished_without_the_marker", [{"t": "check", "ok": None},
                                     {"t": "run", "stdout": 17, "file": False}], False, False),
    ("finished_with_the_marker", [{"t": "check", "ok": None},
                                  {"t": "run", "stdout": 17, "file": True}], True, True),
    ("old_snapshot_dict_counts_for_nothing", [{"t": "check", "ok": None},
                                              {"t": "run", "stdout": 17, "file": False}],
     {"pre": True, "run": True}, False),
]


@pytest.mark.parametrize("mode", ["stdout_marker", "file_marker"])
@pytest.mark.parametrize("case", END_OF_RUN, ids=[c[0] for c in END_OF_RUN])
def test_the_end_of_run_rule(case, mode):
    """The mode rules read the plain run's snapshot (the ``run`` record, and the zygote's reading
    of the stdout it sealed): taken after the module, the check and the shutdown sequence, before
    any oracle call; a run that ended before it has not finished."""
    name, records, marker, expected = case
    v = judge(mode, _tests3(), _reply(records, stdout_marker=marker))
    assert v.passed is expected, v
