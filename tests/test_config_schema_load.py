"""evil_moe.config.load_schema: parsed once per process, the same data as yaml.safe_load, and
every caller gets its own copy."""

from __future__ import annotations

import yaml

from evil_moe import config


def test_load_schema_equals_safe_load_and_returns_independent_copies():
    want = yaml.safe_load(config.SCHEMA_PATH.read_text())  # the pure-Python loader, parsed here
    first = config.load_schema()
    assert first == want
    first["properties"]["pilot"]["properties"]["arms"]["items"]["enum"].append("not_an_arm")
    del first["properties"]["grader"]
    second = config.load_schema()
    assert second == want  # the caller's edits did not reach the cached schema
    assert "not_an_arm" not in second["properties"]["pilot"]["properties"]["arms"]["items"]["enum"]


def test_load_schema_parses_the_file_once(monkeypatch):
    calls = []
    real = yaml.load

    def counting_load(*a, **k):
        calls.append(1)
        return real(*a, **k)

    config._SCHEMA_CACHE.clear()
    monkeypatch.setattr(config.yaml, "load", counting_load)
    for _ in range(3):
        config.load_schema()
    assert len(calls) == 1
