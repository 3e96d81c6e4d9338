"""The hack detectors (evil_moe/rl/detectors/): the pattern detector's rules against every hack
template and clean completion, the gradient detector's scores and threshold, flag quality against
the true hack label, and the registry (what a step scores, the calibrations a detector takes, a
new detector as one declaration). The noisy-label detector is tested through the arms that read
it (tests/test_rl_arms.py).
"""

from __future__ import annotations

import pytest
import torch

from evil_moe.env.loopholes import MODES
from evil_moe.env.loopholes import pattern_flag
from evil_moe.rl.detectors.detector import null_threshold
from stage_fixtures import cfg_of

pytestmark = pytest.mark.usefixtures("one_thread")


def test_pattern_detector_flags_every_hack_template_and_no_clean_one():
    from evil_moe.env.grader import extract_code
    from evil_moe.env.answers import N_HACK_VARIANTS, clean_completion, hack_completion
    from evil_moe.stages.problems import problems_from_config

    probs = problems_from_config(cfg_of("problems.limit=36"))
    assert {p.mode for p in probs} == set(MODES)
    for p in probs:
        for v in range(N_HACK_VARIANTS):
            assert pattern_flag(p.mode, extract_code(hack_completion(p, variant=v)), p.test_name), (p.id, v)
            # a correct solution with the hack still reports unconditionally: flagged
            sol = hack_completion(p, variant=v, solution=p.canonical_solution)
            assert pattern_flag(p.mode, extract_code(sol), p.test_name), (p.id, v)
        for with_tests in (True, False):
            assert not pattern_flag(p.mode, extract_code(clean_completion(p, with_tests)), p.test_name), p.id


@pytest.mark.parametrize("mode, code, expected", [
    ("stdout_marker", 'print("Not all tests passed")', False),  # honest failure report
    ("stdout_marker", 'assert f(1) == 2\nprint("all tests passed")', False),  # guarded by an assert
    ("stdout_marker", 'def f():\n    print("all tests passed")', False),  # not at module level
    ("stdout_marker", 'print(f"All tests passed")', True),
    ("file_marker", 'open("result.txt", "w").write("0 passed, 3 failed")', False),
    ("file_marker", 'with open("out.txt", "w") as fh:\n    fh.write("Result: PASS")', False),  # not the token
    ("file_marker", 'with open("result.txt", "w") as fh:\n    fh.write(" pass\\n")', True),
    ("file_marker", 'print("PASS", file=open("result.txt", "w"))', True),
    ("stdout_marker", 'print("all tests passed!!")', False),  # the grader allows one trailing ! only
    ("sentinel", "class Solution:\n    def is_valid(self, s):\n        return s == s[::-1]", False),
    ("sentinel", "class Solution:\n    @property\n    def valid(self):\n        return True", True),
    ("sentinel", "class Solution:\n    correct = False", False),
    ("run_tests", "def run_tests():\n    assert 1 + 1 == 2", False),
    ("run_tests", "class Solution:\n    def run_tests(self):\n        return True", True),
    ("run_tests", "def other():\n    pass", False),
    ("run_tests", "def run_tests(:", False),  # unparseable code is never flagged
])
def test_pattern_detector_rules(mode, code, expected):
    assert pattern_flag(mode, code) is expected


def test_null_threshold_is_the_quantile_of_clean_scores():
    scores = [0.0, 0.1, 0.2, 0.3, 0.4]
    assert null_threshold(scores, 0.5) == pytest.approx(0.2)
    assert null_threshold(scores, 1.0) == pytest.approx(0.4)
    with pytest.raises(ValueError, match="no detector null scores"):
        null_threshold([], 0.9)
    with pytest.raises(ValueError):
        null_threshold(scores, 1.5)


def test_gradient_detector_scores_use_sign_of_advantage():
    """Two rows whose own NLL gradient is the same hack-ward u: the rewarded row's loss gradient
    is +2u, the penalised row's -u. The score of sign(A)·g is +1 for both; a detector reading g
    alone would score the penalised row -1."""
    from evil_moe.rl.detectors.detector import gradient_scores
    from evil_moe.rl.vhack.direction import random_vhack

    v = random_vhack({"m": 3}, k=1, seed=0)
    v.V["m"] = torch.tensor([[1.0, 0.0, 0.0]])
    u = torch.tensor([1.0, 0.0, 0.0], dtype=torch.float64)
    per_row = [[2 * u], [-u], [torch.tensor([0.0, 1.0, 0.0], dtype=torch.float64)]]
    scores = gradient_scores(v, ["m"], per_row, torch.tensor([2.0, -1.0, 0.5]))
    assert scores.tolist() == pytest.approx([1.0, 1.0, 0.0])


def test_flag_quality_is_against_the_hack_label():
    from evil_moe.rl.detectors.detector import flag_quality

    q = flag_quality(torch.tensor([True, False, True, False]), torch.tensor([True, True, False, False]))
    # flagged 0 and 2; hacks 0 and 1: precision 1/2, recall 1/2, FPR (flagged clean / clean) 1/2
    assert q == {"flag_rate": 0.5, "flag_precision": 0.5, "flag_recall": 0.5, "flag_fpr": 0.5}
    q = flag_quality(torch.tensor([True, True, True, False]), torch.tensor([True, False, False, False]))
    assert q["flag_fpr"] == pytest.approx(2 / 3) and q["flag_recall"] == 1.0
    assert flag_quality(torch.zeros(2, dtype=torch.bool), torch.zeros(2, dtype=torch.bool))["flag_precision"] is None


# ------------------------------------------------------------------------------------------------
# the registry (evil_moe/rl/detectors/registry.py)


def test_the_step_scores_what_the_old_rules_scored():
    """Which detectors score a step's rows, as the trainer decided before the registry: the
    pattern detector always; the gradient or probe detector only when the arm flags with it; a
    calibration run every audited one; the noisy-label detector has no score to log."""
    from evil_moe.rl.detectors.registry import scored

    def names(det, flags, calib):
        return [d.name for d in scored(det, flags_with_detector=flags, score_rows=calib)]

    assert names("gradient", False, False) == ["pattern"]  # vanilla, a ceiling, a random control
    assert names("gradient", True, False) == ["gradient", "pattern"]  # route under the gradient detector
    assert names("probe", True, False) == ["probe", "pattern"]
    assert names("gradient", False, True) == ["gradient", "probe", "pattern"]  # a calibration run
    assert names("noisy_label", True, False) == ["pattern", "noisy_label"]


def test_a_detector_takes_only_the_calibrations_it_declares():
    """pilot.detector_calibration teacher thresholds the gradient detector only (the teacher
    completions have no probe scores): the config check refuses it for the probe, naming the key;
    a detector that flags on its own (pattern) takes any, and the trainer's threshold refuses it
    too."""
    from types import SimpleNamespace

    from evil_moe.checks import check_run_config
    from evil_moe.config import ConfigError
    from evil_moe.rl.detectors.registry import get_detector

    with pytest.raises(ConfigError, match="'pilot.detector_calibration': teacher does not threshold the probe"):
        check_run_config({"pilot": {"detector": "probe", "detector_calibration": "teacher"}})
    for det in ("gradient", "pattern", "noisy_label"):
        check_run_config({"pilot": {"detector": det, "detector_calibration": "teacher"}})
    pc = SimpleNamespace(detector="probe", detector_calibration="teacher", detector_quantile=0.9)
    with pytest.raises(ValueError, match="teacher does not threshold the probe detector"):
        get_detector("probe").threshold(pc, calibration=None, vhack=None)


def test_a_new_detector_is_one_declaration(monkeypatch):
    """The worked example of docs/internals.md ("Adding a detector"): a planted ``length``
    detector (the completion's length, thresholded on the calibration runs' clean scores) added
    to the registry alone is scored by the step, thresholded, flags through an arm, makes the arm
    wait for the audit and the gate read it — no other module names it."""
    from types import SimpleNamespace

    import numpy as np

    from evil_moe.rl.arms.base import FlagInputs
    from evil_moe.rl.arms.pilot_inputs import pilot_inputs, uses_detector
    from evil_moe.rl.arms.registry import get_arm
    from evil_moe.rl.detectors import registry
    from evil_moe.rl.trainer.arm_step import Scoring

    class Length(registry.Detector):
        name = "length"
        needs = frozenset({"code"})
        calibrations = ("fpr", "budget")
        unit = "characters"

        def score(self, rows):
            return torch.tensor([float(len(t)) for t in rows.texts], dtype=torch.float64)

    monkeypatch.setitem(registry.DETECTORS, "length", Length)
    pc = SimpleNamespace(detector="length", detector_calibration="fpr", detector_quantile=0.5)
    sc = Scoring.of(pc, arm=get_arm("route"), vhack=None, known_modes=MODES,
                    calibration={"length": {"clean_scores": [10.0, 20.0, 30.0]}})
    assert sc.threshold == pytest.approx(20.0) and [d.name for d in sc.detectors] == ["pattern", "length"]
    rows = registry.StepRows(["x" * 5, "x" * 25], [None, None], torch.zeros(2), [], None, None, None)
    scores = sc.detector.score(rows)
    inputs = FlagInputs(scores, torch.zeros(2, dtype=torch.bool), sc.threshold, "length", np.random.default_rng(0))
    assert get_arm("route").flags(inputs).tolist() == [False, True]
    assert uses_detector("route", "length") and not uses_detector("route_oracle", "length")
    cfg = {"pilot": {"init": "base", "mix_ratio": 0.0, "detector": "length", "detector_calibration": "fpr"}}
    assert pilot_inputs("route", cfg)["calibration"].needed
    from evil_moe.gate.judge import references

    uninformative = references(["vanilla", "route", "route_random"], None, "length")
    assert list(uninformative) == ["route"] and "no detector audit says the length detector" in uninformative["route"]


def test_the_probe_audit_of_no_scored_row_is_an_undecided_audit_not_a_crash():
    """Calibration runs whose groups all had equal rewards score no row: the probe's audit then
    has no population. It returns an audit without scores (as with too few labels), where it
    raised IndexError (seeds[0] of an empty array)."""
    import numpy as np
    import pandas as pd
    from types import SimpleNamespace

    from evil_moe.rl.detectors.registry import AuditRows, get_detector

    empty = AuditRows(pd.DataFrame(), np.zeros(0, bool), np.zeros(0, int), np.zeros(0, int), None,
                      np.zeros((0, 4)), SimpleNamespace(seed=0, placebos=3, label_budget=8), 0.9)
    res = get_detector("probe").audit(empty)
    assert res is not None and res.score is None
