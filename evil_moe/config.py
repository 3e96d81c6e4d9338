"""The typed run configuration, derived from ``config/schema.yaml`` (the one place knobs live).

Every knob is defined once, in the JSON schema (type, default, description). This module loads
YAML config files, merges them in order (like ``snakemake --configfile a b``), applies
``section.key=value`` overrides, validates the result against the schema, fills defaults, and
returns a :class:`Config` whose sections are frozen dataclasses generated from the schema, so
``cfg.pilot.steps`` is an ``int`` and a misspelt key is an error that names it.

The Snakemake workflow validates the same file with ``snakemake.utils.validate`` against the same
schema (``rules/common.smk``).
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import json
import math
import re
from pathlib import Path
from typing import Any, Iterable, Mapping

import jsonschema
import yaml

SCHEMA_PATH = Path(__file__).resolve().parent.parent / "config" / "schema.yaml"

# Pilot keys that do not change what one (arm, seed) pilot run computes (it is given --arm and
# --seed): the pilot leaves them out of its checkpoint key (evil_moe.stages.pilot) and the workflow
# out of each run's params (rules/common.smk), so adding a seed or an arm reruns no other run and
# the test-only failure switches reach only the arm they name.
PILOT_RUN_INDEPENDENT = ("arms", "seeds", "fail_arm", "fail_once_arm")


class ConfigError(ValueError):
    """A config file is missing, unreadable, or does not match the schema (message names the key)."""


_SCHEMA_CACHE: dict[str, dict] = {}


def load_schema() -> dict:
    """Return the config JSON schema (``config/schema.yaml``) as a dict (a fresh copy each call).

    The file is parsed once per process (with libyaml's ``CSafeLoader`` where PyYAML has it: the
    same data as ``yaml.safe_load``, ~10x faster; a workflow start reads the schema three times).

    Raises:
        ConfigError: the schema file is missing (a broken install).
    """
    if not SCHEMA_PATH.is_file():
        raise ConfigError(f"config schema not found: {SCHEMA_PATH}")
    text = SCHEMA_PATH.read_text()
    if text not in _SCHEMA_CACHE:
        _SCHEMA_CACHE.clear()
        _SCHEMA_CACHE[text] = yaml.load(text, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    return copy.deepcopy(_SCHEMA_CACHE[text])


def _fill_defaults(schema: Mapping, data: dict) -> dict:
    """Recursively fill ``default`` values of object properties missing from ``data`` (in place)."""
    for key, sub in schema.get("properties", {}).items():
        if key not in data and "default" in sub:
            data[key] = copy.deepcopy(sub["default"])
        if sub.get("type") == "object" and isinstance(data.get(key), dict):
            _fill_defaults(sub, data[key])
    return data


def _error_message(err: jsonschema.ValidationError) -> str:
    """One clear sentence naming the offending key for a schema validation error."""
    where = ".".join(str(p) for p in err.absolute_path)
    if err.validator == "additionalProperties":
        allowed = sorted(err.schema.get("properties", {}))
        extra = sorted(set(err.instance) - set(allowed))
        key = ".".join(filter(None, [where, extra[0] if extra else "?"]))
        return f"unknown config key '{key}' (allowed here: {', '.join(allowed)})"
    if err.validator == "enum":
        return f"config key '{where}': {err.instance!r} is not one of {err.validator_value}"
    if err.validator == "type":
        msg = f"config key '{where}': expected {err.validator_value}, got {err.instance!r}"
        wants = err.validator_value if isinstance(err.validator_value, list) else [err.validator_value]
        if isinstance(err.instance, str) and {"number", "integer"} & set(wants):
            fix = _number_fix(err.instance)
            if fix:
                msg += f" (YAML reads {err.instance} as text, not a number: write {fix})"
        return msg
    return f"config key '{where or '<root>'}': {err.message}"


_EXP_RE = re.compile(r"^([+-]?)([0-9]+)(?:\.([0-9]*))?[eE]([+-]?)([0-9]+)$")


def _number_fix(text: str) -> str | None:
    """The YAML spelling of ``text`` when it is a number in exponent notation that YAML reads as
    text: PyYAML follows YAML 1.1, whose floats need a dot and a signed exponent (``1e-3`` and
    ``1.5e3`` are strings there, ``1.0e-3`` and ``1.5e+3`` are numbers). None otherwise."""
    m = _EXP_RE.match(text.strip())
    if m is None:
        return None
    sign, whole, frac, esign, exp = m.groups()
    return f"{sign}{whole}.{frac or '0'}e{esign or '+'}{exp}"


def _non_finite(data: Any, where: str = "") -> tuple[str, float] | None:
    """(dotted key, value) of the first non-finite number (nan, inf, -inf) in ``data``."""
    if isinstance(data, float) and not math.isfinite(data):
        return where or "<root>", data
    if isinstance(data, dict):
        for key, value in data.items():
            found = _non_finite(value, f"{where}.{key}" if where else str(key))
            if found:
                return found
    if isinstance(data, (list, tuple)):
        for i, value in enumerate(data):
            found = _non_finite(value, f"{where}[{i}]")
            if found:
                return found
    return None


def validate(data: dict, schema: dict | None = None) -> dict:
    """Validate a config dict against the schema and fill its defaults.

    Args:
        data: the merged config (mapping of sections); not modified.

    Returns:
        A new dict with every default filled.

    Raises:
        ConfigError: a non-finite number (``nan``, ``.inf``; YAML and JSON schema both accept
            them) or the first schema violation, naming the key (unknown key, wrong type, value
            out of range, unknown enum value such as an arm name); calibration seeds shared
            with the pilots (names the key).

    The checks against the arm and detector registries and the resource model (the arm set, the
    detector's calibration, GPU memory, the vLLM sampler's tied head) are in
    :func:`evil_moe.checks.check_run_config`, which the CLI and the Snakefile call after this one:
    this module imports nothing of the package.
    """
    schema = schema or load_schema()
    data = _fill_defaults(schema, copy.deepcopy(dict(data or {})))
    bad = _non_finite(data)
    if bad is not None:
        raise ConfigError(f"config key '{bad[0]}': {bad[1]!r} is not a finite number")
    validator = jsonschema.Draft202012Validator(schema)
    errors = sorted(validator.iter_errors(data), key=lambda e: (len(e.absolute_path), str(e.absolute_path)))
    if errors:
        raise ConfigError(_error_message(errors[0]))
    _check_detector(data)
    return data


def _check_detector(data: dict) -> None:
    """Cross-key check of the detector's audit: ``audit.seeds`` disjoint from ``pilot.seeds`` and
    ``sweep.seeds`` (a threshold is never judged on the rollouts it was fitted on). One
    ConfigError naming the key. (Which calibrations a detector takes is the detector registry's:
    :func:`evil_moe.checks.check_run_config`.)"""
    pilot, audit, sweep = data.get("pilot"), data.get("audit"), data.get("sweep")
    if not all(isinstance(x, dict) for x in (pilot, audit, sweep)):
        return
    shared = sorted(set(audit.get("seeds", [])) & (set(pilot.get("seeds", [])) | set(sweep.get("seeds", []))))
    if shared:
        raise ConfigError(f"config key 'audit.seeds': {shared} also in pilot.seeds or sweep.seeds; the "
                          "calibration runs need seeds of their own")


def _deep_merge(base: dict, new: Mapping) -> dict:
    for key, value in new.items():
        if isinstance(value, Mapping) and isinstance(base.get(key), dict):
            _deep_merge(base[key], value)
        else:
            base[key] = copy.deepcopy(value)
    return base


def _parse_override(text: str) -> tuple[list[str], Any]:
    if "=" not in text:
        raise ConfigError(f"override {text!r} must look like section.key=value")
    key, value = text.split("=", 1)
    return key.strip().split("."), yaml.safe_load(value)


def merge_sources(files: Iterable[str | Path] = (), overrides: Iterable[str] = (),
                  data: Mapping | None = None) -> dict:
    """Merge YAML files (in order), then a dict, then ``a.b=value`` overrides (YAML-parsed values).

    Raises:
        ConfigError: a file is missing (names the path) or is not a YAML mapping.
    """
    merged: dict = {}
    for f in files:
        path = Path(f)
        if not path.is_file():
            raise ConfigError(f"config file not found: {path}")
        try:
            loaded = yaml.safe_load(path.read_text()) or {}
        except yaml.YAMLError as e:
            where = getattr(e, "problem_mark", None)
            at = f" (line {where.line + 1}, column {where.column + 1})" if where is not None else ""
            raise ConfigError(f"config file {path} is not valid YAML{at}: "
                              f"{getattr(e, 'problem', None) or e}") from None
        if not isinstance(loaded, dict):
            raise ConfigError(f"config file {path} is not a YAML mapping")
        _deep_merge(merged, loaded)
    if data:
        _deep_merge(merged, data)
    for text in overrides:
        keys, value = _parse_override(text)
        node = merged
        for k in keys[:-1]:
            node = node.setdefault(k, {})
            if not isinstance(node, dict):
                raise ConfigError(f"override {text!r}: '{k}' is not a section")
        node[keys[-1]] = value
    return merged


_JSON_TYPES = {"string": str, "integer": int, "number": float, "boolean": bool, "array": list, "object": dict}


def _section_class(name: str, schema: Mapping) -> type:
    fields = []
    for key, sub in schema.get("properties", {}).items():
        types = sub.get("type", "string")
        types = types if isinstance(types, list) else [types]
        py = [_JSON_TYPES[t] for t in types if t != "null"]
        annotation = py[0] if len(py) == 1 else Any
        fields.append((key, annotation, dataclasses.field(metadata={"description": sub.get("description", "")})))
    cls = dataclasses.make_dataclass(name.title().replace("_", "") + "Config", fields, frozen=True)
    cls.__doc__ = schema.get("description") or f"The ``{name}`` section of the run config (see config/schema.yaml)."
    return cls


_SCHEMA = load_schema()
SECTIONS: dict[str, type] = {
    name: _section_class(name, sub)
    for name, sub in _SCHEMA["properties"].items()
    if sub.get("type") == "object"
}


@dataclasses.dataclass(frozen=True)
class Config:
    """A validated run config: one frozen dataclass per section (``cfg.pilot.steps``).

    Build it with :func:`load_config`. ``raw`` keeps the validated dict (defaults filled).
    """

    raw: dict

    def __getattr__(self, name: str) -> Any:
        raw = object.__getattribute__(self, "raw")
        if name in SECTIONS:
            return SECTIONS[name](**raw[name])
        if name in raw:
            return raw[name]
        raise AttributeError(f"config has no section {name!r}")

    def to_dict(self) -> dict:
        """The validated config as a plain dict (a deep copy)."""
        return copy.deepcopy(self.raw)

    def digest(self, *sections: str) -> str:
        """Short SHA-256 of the given sections (all when none), for metadata and checkpoints."""
        part = {s: self.raw[s] for s in sections} if sections else self.raw
        return hashlib.sha256(json.dumps(part, sort_keys=True).encode()).hexdigest()[:16]


def load_config(files: Iterable[str | Path] = (), overrides: Iterable[str] = (),
                data: Mapping | None = None) -> Config:
    """Load, merge, validate and default-fill a run config.

    Args:
        files: YAML files merged in order (later wins), e.g. ``["config/config.yaml"]``.
        overrides: ``"section.key=value"`` strings applied last (values parsed as YAML).
        data: a dict merged after the files (e.g. a JSON-encoded config passed by Snakemake).

    Returns:
        A :class:`Config`.

    Raises:
        ConfigError: a missing file (names the path), an unknown key, a wrong type or an
            out-of-range value (names the key).
    """
    return Config(validate(merge_sources(files, overrides, data)))
