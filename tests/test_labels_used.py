"""Labels used: what labelled data each arm's training reads (Arm.label_sources, Detector.label_sources,
evil_moe/rl/arms/base.py and evil_moe/rl/detectors/registry.py) and how many labels one run read
(evil_moe.gate.summary.label_count): compare/summary.tsv's labels and labels_n."""

from __future__ import annotations

import pytest

from evil_moe.config import load_config
from evil_moe.gate.summary import label_columns, label_count
from evil_moe.rl.arms.base import Arm
from evil_moe.rl.arms.registry import ARMS
from evil_moe.rl.detectors.registry import DETECTORS, LABEL_SOURCES

# every registered arm's answer under the gradient detector with the fpr threshold (the default) and
# under the probe with a per-step budget: worked out from what each arm does (docs/arms.md)
EXPECTED = {
    #                         gradient, fpr                 probe, budget
    "vanilla":               ((), ()),
    "untrained":             ((), ()),
    "erase":                 (("vhack",), ("vhack",)),                 # projects along v_hack
    "random_v":              ((), ()),                                 # a random V: no label
    "subtract":              (("vhack",), ("vhack",)),
    "subtract_random":       ((), ()),
    "route":                 (("vhack", "calibration"), ("calibration_fit",)),
    "route_dose_matched":    ((), ()),                                 # route's dose, no flags
    "route_random":          ((), ()),                                 # route's count, random rows
    "filter":                (("vhack", "calibration"), ("calibration_fit",)),
    "filter_random":         ((), ()),
    "moe":                   (("authored",), ("authored",)),           # router pinned on the pairs
    "moe_dose_matched":      ((), ()),
    "moe_random":            ((), ()),                                 # the pairs' labels shuffled
    "oracle_reward":         (("oracle_pass",), ("oracle_pass",)),
    "route_oracle":          (("rollouts",), ("rollouts",)),
    "route_oracle_dose_matched": ((), ()),
    "route_oracle_random":   ((), ()),
    "route_oracle_dose":     (("rollouts",), ("rollouts",)),
    "filter_oracle":         (("rollouts",), ("rollouts",)),
    "filter_oracle_random":  ((), ()),
    "erase_planted":         (("planted",), ("planted",)),
    "penalty":               (("vhack", "calibration"), ("calibration_fit",)),  # the run's detector
    "penalty_random":        ((), ()),                                 # penalty's rate, random rows
    "penalty_oracle":        (("rollouts",), ("rollouts",)),
    "penalty_oracle_random": ((), ()),
    "inoculation":           ((), ()),                                 # an instruction: no label
    "inoculation_placebo":   ((), ()),
    "advantage_mod":         (("authored",), ("authored",)),           # the direction: the pairs' sides
    "advantage_mod_random":  ((), ()),                                 # a random direction
}


def _pc(*sets):
    return load_config(overrides=list(sets)).pilot


def test_every_registered_arm_states_the_labels_it_reads():
    """A new arm is added here with its answer (the test fails until it is): the table above."""
    assert set(EXPECTED) == set(ARMS), set(EXPECTED) ^ set(ARMS)
    default, probe = _pc(), _pc("pilot.detector=probe", "pilot.detector_calibration=budget")
    for name, (want_default, want_probe) in EXPECTED.items():
        assert ARMS[name].label_sources(default) == want_default, name
        assert ARMS[name].label_sources(probe) == want_probe, name
        assert set(ARMS[name].label_sources(default)) <= set(LABEL_SOURCES)


@pytest.mark.parametrize("detector, calibration, want", [
    ("gradient", "fpr", ("vhack", "calibration")),      # its score reads v_hack; the threshold clean rows
    ("gradient", "budget", ("vhack",)),
    ("gradient", "teacher", ("vhack",)),                 # held-out clean teacher completions
    ("probe", "fpr", ("calibration",)),                  # the fit rows are among the calibration rows
    ("probe", "budget", ("calibration_fit",)),
    ("pattern", "fpr", ()),                              # label-free
    ("noisy_label", "fpr", ("rollouts",)),               # the true label through a noisy channel
])
def test_each_detector_states_what_its_flags_rest_on(detector, calibration, want):
    assert DETECTORS[detector].label_sources(calibration) == want
    if detector != "pattern" and calibration in DETECTORS[detector].calibrations + ("fpr",):
        pc = _pc(f"pilot.detector={detector}", f"pilot.detector_calibration={calibration}")
        assert ARMS["route"].label_sources(pc) == want


def test_a_new_arm_inherits_its_answer_and_declares_only_new_labels():
    class Flagger(Arm):
        name, role, needs_sample_grads = "flagger", "treatment", True

    class Ceiling(Flagger):
        reads_label = True

    class Reader(Arm):
        uses_labels = ("authored",)

    pc = _pc("pilot.detector=probe")
    assert Flagger.label_sources(pc) == ("calibration",)
    assert Ceiling.label_sources(pc) == ("rollouts",)
    assert Reader.label_sources(pc) == ("authored",)


def test_label_counts_and_columns():
    cfg = load_config(overrides=["pilot.steps=5", "pilot.prompts_per_step=4", "pilot.group=6"])
    assert label_count("rollouts", cfg, None, None) == 5 * 4 * 6
    audit = {"n_scored": 300, "n_labels": 64}
    assert label_count("calibration", cfg, audit, None) == 300
    assert label_count("calibration_fit", cfg, audit, None) == 64
    assert label_count("calibration", cfg, None, None) is None
    assert label_count("vhack", cfg, None, 12) == 24 and label_count("vhack", cfg, None, None) is None
    assert label_count("planted", cfg, None, None) == 0
    from evil_moe.env.authored import load_authored

    fmt = "toy" if cfg.problems.source == "toy" else "leetcode"
    n = sum(len(a.pairs()) for a in load_authored(fmt=fmt))
    assert n > 0 and label_count("authored", cfg, None, None) == 2 * n
    rows = [{"arm": a} for a in ("vanilla", "route", "route_oracle", "erase")]
    label_columns(rows, cfg, audit, 12)
    assert [(r["labels"], r["labels_n"]) for r in rows] == [
        ("none", 0), ("vhack+calibration", 24 + 300), ("rollouts", 120), ("vhack", 24)]
    label_columns(rows, cfg, None, None)  # no audit, no v_hack checks: unknown, never 0
    assert [r["labels_n"] for r in rows] == [0, None, 120, None]
