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
        return f"config key '{where}': expected {err.validator_value}, got {err.instance!r}"
    return f"config key '{where or '<root>'}': {err.message}"


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
            out of range, unknown enum value such as an arm name); an arm set without vanilla,
            a listed arm's matched control or the positive control (names what is missing);
            on a cuda config, a pilot whose GPU memory model exceeds ``models.gpu_mem_gb``
            (names the key to lower, e.g. ``pilot.micro_batch``) or that cannot be sized
            (names ``models.params``).
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
    if isinstance(data.get("pilot"), dict) and isinstance(data.get("compare"), dict):
        _check_arms(data)
    _check_gpu_memory(data)
    _check_sampler(data)
    return data


def _check_sampler(data: dict) -> None:
    """``pilot.sampler: vllm`` cannot take a knob on a tied ``lm_head`` (the engine ties the head
    to the input embedding; :class:`evil_moe.rl.vllm_sampler.VLLMSampler` refuses it at run
    time): refused here, before any job runs, when the student's shape says its head is tied
    (:func:`evil_moe.cluster.resources.model_shape`; left to the run-time check when the shape
    cannot be worked out). One ConfigError naming ``adapter.target_modules``."""
    if not all(isinstance(data.get(k), dict) for k in ("models", "pilot", "problems", "adapter")):
        return
    if data["pilot"].get("sampler") != "vllm" or "lm_head" not in data["adapter"].get("target_modules", ()):
        return
    from evil_moe.cluster.resources import ResourceError, model_shape

    try:
        tied = model_shape(data).tied
    except (ResourceError, KeyError):
        return
    if tied:
        raise ConfigError(
            "pilot.sampler vllm: the student's lm_head shares its weight with the input embedding "
            "(tied), so vLLM cannot take its knob: remove lm_head from 'adapter.target_modules' "
            "or use pilot.sampler hf (docs/gpu.md)")


def _check_gpu_memory(data: dict) -> None:
    """On a cuda config, the pilot's memory model must fit ``models.gpu_mem_gb``
    (:func:`evil_moe.cluster.resources.check_gpu_fit`): one ConfigError naming the key to change."""
    if not all(isinstance(data.get(k), dict) for k in ("models", "pilot", "problems", "adapter")):
        return
    if not str(data["models"].get("device", "")).startswith("cuda"):
        return
    from evil_moe.cluster.resources import ResourceError, check_gpu_fit

    try:
        check_gpu_fit(data)
    except ResourceError as err:
        raise ConfigError(str(err)) from None


def _check_arms(data: dict) -> None:
    """Cross-key check of the arm set (``pilot.arms`` against the arms' matched controls and
    ``compare.positive_control``, and the test switches ``pilot.fail_arm`` /
    ``pilot.fail_once_arm`` against ``pilot.arms``): one ConfigError naming what is wrong."""
    from evil_moe.rl.arms import check_arm_set

    try:
        check_arm_set(data["pilot"]["arms"], data["compare"].get("positive_control"))
    except ValueError as err:
        raise ConfigError(str(err)) from None
    for key in ("fail_arm", "fail_once_arm"):  # the test switches must name an arm that runs
        arm = data["pilot"].get(key)
        if arm is not None and arm not in data["pilot"]["arms"]:
            raise ConfigError(f"config key 'pilot.{key}': {arm!r} is not in pilot.arms "
                              f"{data['pilot']['arms']}")


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
