"""The gate's defaults have one home, config/schema.yaml's ``compare`` section: evil_moe/gate/defaults.py
reads them from there, and every keyword default of the gate's functions and dataclasses is one of
those names, never a restated literal."""

from __future__ import annotations

import ast
import dataclasses
import inspect
from pathlib import Path

import pytest
import yaml

from evil_moe.gate import ceilings
from evil_moe.config import load_config
from evil_moe.gate import bootstrap, criteria, defaults, effects, power, rule, simulate, sizing

REPO = Path(__file__).resolve().parent.parent
SCHEMA = yaml.safe_load((REPO / "config" / "schema.yaml").read_text())["properties"]["compare"]["properties"]
# the gate's knobs that functions take as keywords (pass_margin_rel is not one: None there means "not given")
KEYS = ("min_drop", "pass_margin", "min_seeds", "n_boot", "ci", "power", "seed", "resample", "multiplicity")
# knobs that share a name but are not the gate's: the simulator's experiment seed and its cheaper
# bootstrap counts (documented in simulate_gate and operating_characteristics); cluster_bootstrap
# runs only the nested schemes (the crossed one is crossed_bootstrap); Effect.n_boot records the
# resamples an Effect was computed with (0: not recorded)
NOT_THE_GATES = {("simulate_gate", "seed"), ("simulate_gate", "n_boot"), ("operating_characteristics", "n_boot"),
                 ("cluster_bootstrap", "resample"), ("Effect", "n_boot")}
MODULES = (defaults, bootstrap, effects, power, sizing, criteria, rule, simulate, ceilings)


def test_defaults_are_the_schema_and_the_filled_config():
    # worked out by reading the schema file directly (0.05, 0.10, 3, 2000, 0.95, 0.8, 0, crossed, holm)
    assert (defaults.MIN_DROP, defaults.PASS_MARGIN, defaults.MIN_SEEDS, defaults.N_BOOT, defaults.CI,
            defaults.POWER, defaults.SEED, defaults.RESAMPLE, defaults.MULTIPLICITY) == (
        0.05, 0.10, 3, 2000, 0.95, 0.8, 0, "crossed", "holm")
    assert {k: getattr(defaults, k.upper()) for k in KEYS} == {k: SCHEMA[k]["default"] for k in KEYS}
    cc = load_config().compare  # defaults filled by the config loader
    assert {k: getattr(defaults, k.upper()) for k in KEYS} == {k: getattr(cc, k) for k in KEYS}


def _keyword_defaults():
    for mod in MODULES:
        for name, fn in inspect.getmembers(mod, inspect.isfunction):
            if fn.__module__ != mod.__name__:
                continue
            for p in inspect.signature(fn).parameters.values():
                if (p.name in KEYS and p.default not in (inspect.Parameter.empty, None)
                        and (name, p.name) not in NOT_THE_GATES):
                    yield f"{mod.__name__}.{name}", p.name, p.default


def test_every_keyword_default_is_the_schemas():
    found = list(_keyword_defaults())
    # the functions that restated them before (min_seeds eight times, n_boot/ci/power/seed in the effects)
    names = {(f, k) for f, k, _ in found}
    assert {("evil_moe.gate.rule.decide_gate", "min_seeds"), ("evil_moe.gate.criteria.drop_vs_vanilla", "min_seeds"),
            ("evil_moe.gate.effects.paired_effect", "n_boot"), ("evil_moe.gate.simulate.simulate_gate", "min_drop"),
            ("evil_moe.gate.ceilings.mode_rates", "ci")} <= names
    wrong = [(f, k, v) for f, k, v in found if v != SCHEMA[k]["default"]]
    assert not wrong


def test_dataclass_defaults_are_the_schemas():
    fields = {(cls.__name__, f.name): f.default for cls in (effects.Effect, criteria.ArmVerdict, criteria.GateVerdict, criteria.Limits)
              for f in dataclasses.fields(cls) if f.default is not dataclasses.MISSING}
    assert fields[("ArmVerdict", "min_seeds")] == fields[("GateVerdict", "min_seeds")] == SCHEMA["min_seeds"]["default"]
    assert fields[("GateVerdict", "multiplicity")] == SCHEMA["multiplicity"]["default"]
    assert fields[("Effect", "resample")] == SCHEMA["resample"]["default"]
    assert fields[("GateVerdict", "alpha")] == pytest.approx(0.025)  # (1 − 0.95) / 2


@pytest.mark.parametrize("path", sorted((REPO / "evil_moe" / "gate").glob("*.py")),
                         ids=lambda p: p.name)
def test_no_gate_default_is_a_restated_literal(path):
    """A keyword default named like a gate knob is a name (from evil_moe.gate.defaults), not a
    number or string written again (equal today, but it would not follow the schema)."""
    literal = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            args = node.args
            pos = list(zip(args.args[len(args.args) - len(args.defaults):], args.defaults))
            for arg, default in pos + [(a, d) for a, d in zip(args.kwonlyargs, args.kw_defaults) if d is not None]:
                if (arg.arg in KEYS and isinstance(default, ast.Constant) and default.value is not None
                        and (node.name, arg.arg) not in NOT_THE_GATES):
                    literal.append(f"{node.name}({arg.arg}={default.value!r})")
        elif isinstance(node, ast.ClassDef):  # dataclass fields
            for f in node.body:
                if (isinstance(f, ast.AnnAssign) and isinstance(f.target, ast.Name) and f.target.id in KEYS
                        and isinstance(f.value, ast.Constant) and (node.name, f.target.id) not in NOT_THE_GATES):
                    literal.append(f"{node.name}.{f.target.id} = {f.value.value!r}")
    assert not literal, literal
