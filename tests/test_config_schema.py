"""config/schema.yaml keeps copies of facts whose home is in the package (the config check and
`evil-moe --help` read the schema without importing the package's heavy modules, and Snakemake
validates against the file): each copy is held equal to its home here, and the lists of loophole
modes and arms are spelled nowhere else in the code or the rules.
"""

from __future__ import annotations

import inspect
import re
from pathlib import Path

import numpy as np
import pytest
import torch

from evil_moe.rl.arms.registry import ARMS, get_arm
from evil_moe.rl.arms.base import Arm, FlagInputs
from evil_moe.config import load_schema
from evil_moe.env.loopholes import MODES
from evil_moe.rl.detectors.registry import DETECTORS

REPO = Path(__file__).resolve().parent.parent


def _enums(node, path=""):
    """(dotted path, enum list) of every ``enum`` in the schema (``[]`` for an array's items)."""
    if isinstance(node, dict):
        if "enum" in node:
            yield path, node["enum"]
        for key, sub in node.items():
            if key == "properties":
                for name, prop in sub.items():
                    yield from _enums(prop, f"{path}.{name}" if path else name)
            elif key == "items":
                yield from _enums(sub, path + "[]")


def _prop(*keys):
    node = load_schema()
    for k in keys:
        node = node["properties"][k]
    return node


def test_every_loophole_mode_enum_is_loopholes_modes():
    """The three schema enums of loophole modes (and problems.modes' default) list
    evil_moe.env.loopholes.MODES in its order; an enum naming any mode names them all."""
    found = {path: enum for path, enum in _enums(load_schema()) if set(enum) & {"run_tests", *MODES}}
    assert set(found) == {"problems.modes[]", "problems.force_mode", "vhack.known_modes[]"}
    for path, enum in found.items():
        assert [m for m in enum if m is not None] == list(MODES), path
    assert _prop("problems", "modes")["default"] == list(MODES)


def test_arm_enums_follow_the_registry():
    """pilot.arms allows every registered arm, in registry order; detector_sweep.arms allows the
    arms whose flags are the configured detector's (found by asking each arm to flag under the
    pattern detector: only those return the pattern; the random-flag controls and the ceilings
    refuse without a target count or the label)."""
    assert _prop("pilot", "arms")["items"]["enum"] == list(ARMS)
    pattern = torch.tensor([True, False, True])

    def flags_by_detector(name):
        inputs = FlagInputs(None, pattern, 0.0, "pattern", np.random.default_rng(0))
        try:
            flags = get_arm(name).flags(inputs)
        except ValueError:
            return False
        return flags is not None and flags.tolist() == pattern.tolist()

    # the penalty flags by the detector too, but the sweep reruns the routing/filtering arms only
    assert [a for a in ARMS if flags_by_detector(a) and ARMS[a].penalises] == ["penalty"]
    swept = [a for a in ARMS if flags_by_detector(a) and not ARMS[a].penalises]
    assert swept == ["route", "filter"]
    assert _prop("detector_sweep", "arms")["items"]["enum"] == swept


def test_detector_enum_is_the_detector_registry():
    """pilot.detector allows every registered detector, in registry order; the calibrations the
    schema allows are every one a detector may declare."""
    from evil_moe.rl.detectors.registry import CALIBRATIONS, DETECTORS

    assert _prop("pilot", "detector")["enum"] == list(DETECTORS)
    assert set(_prop("pilot", "detector_calibration")["enum"]) == set(CALIBRATIONS)
    assert all(set(cls.calibrations) <= set(CALIBRATIONS) for cls in DETECTORS.values())


def test_grader_defaults_are_the_schemas():
    """The grader's keyword defaults (Grader, grade_file, `evil-moe grade`, an arm's pass reward)
    are the schema's grader defaults; wall_timeout null means 3 x timeout + 5 in both."""
    from evil_moe.cli import main
    from evil_moe.env.grade_cli import grade_file
    from evil_moe.env.grader import Grader

    schema = {k: v.get("default") for k, v in _prop("grader")["properties"].items()}
    assert schema["timeout"] == 3.0 and schema["pass_reward"] == 1.0  # the values checked below
    grader = inspect.signature(Grader.__init__).parameters
    shared = set(schema) & set(grader)
    assert shared == set(schema)  # every grader key is a Grader keyword
    for key in shared:
        assert grader[key].default == schema[key], key
    assert inspect.signature(grade_file).parameters["timeout"].default == schema["timeout"]
    assert inspect.signature(Arm.__init__).parameters["pass_reward"].default == schema["pass_reward"]
    assert inspect.signature(get_arm).parameters["pass_reward"].default == schema["pass_reward"]
    cli = {p.name: p for p in main.commands["grade"].params}
    for key in ("timeout", "workers", "isolation"):
        assert cli[key].default == schema[key], key
    assert list(cli["isolation"].type.choices) == _prop("grader", "isolation")["enum"]
    assert set(cli["source"].type.choices) == set(_prop("problems", "source")["enum"])
    assert list(cli["mode"].type.choices) == list(MODES)


def _code_files():
    files = [REPO / "Snakefile", *sorted((REPO / "rules").glob("*.smk"))]
    return files + sorted((REPO / "evil_moe").rglob("*.py"))


@pytest.mark.parametrize("names, home", [
    (MODES, []),  # each registry is a dict of classes: no list of names anywhere
    (tuple(ARMS), []),
    (tuple(DETECTORS), []),
])
def test_the_lists_are_spelled_only_in_their_home(names, home):
    """No other module or rule file writes out the list (its first four names in a row, quoted
    or not, separated by commas and spaces): they read the home."""
    sep = r"""["']?\s*,\s*["']?"""
    pattern = re.compile(sep.join(re.escape(n) for n in names[:4]))
    hits = [str(f.relative_to(REPO)) for f in _code_files() if pattern.search(f.read_text())]
    assert hits == home
