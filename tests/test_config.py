"""The config loader (evil_moe/config.py): a malformed file is one error naming it, and the pilot
keys that do not change one run are keys of the schema. (Values: tests/test_config_values.py; the
schema's copies of facts held elsewhere: tests/test_config_schema.py.)
"""

from __future__ import annotations

import pytest

from evil_moe.config import PILOT_RUN_INDEPENDENT, load_schema


def test_malformed_yaml_config_is_one_error_naming_the_file(tmp_path):
    """A YAML syntax error is one ConfigError naming the file and the line, not a traceback."""
    from evil_moe.config import ConfigError, load_config

    bad = tmp_path / "bad.yaml"
    bad.write_text("pilot:\n  steps: [1\n")
    with pytest.raises(ConfigError) as e:
        load_config([bad])
    msg = str(e.value)
    assert msg.startswith(f"config file {bad} is not valid YAML (line ") and "\n" not in msg


def test_run_independent_pilot_keys_are_the_schema_keys_that_name_runs():
    """PILOT_RUN_INDEPENDENT (left out of a pilot run's checkpoint key and workflow params) is
    exactly the pilot keys that say which runs exist (arms, seeds) and the test-only failure
    switches (each names an arm: a string-or-null key whose description says 'Test only')."""
    pilot = load_schema()["properties"]["pilot"]["properties"]
    test_only = {k for k, v in pilot.items() if v.get("description", "").startswith("Test only")}
    assert test_only == {"fail_arm", "fail_once_arm"}
    assert PILOT_RUN_INDEPENDENT == ("arms", "seeds", *sorted(test_only))
    assert set(PILOT_RUN_INDEPENDENT) <= set(pilot)


@pytest.mark.parametrize("text, fix", [("1e-3", "1.0e-3"), ("1E-7", "1.0e-7"), ("3e4", "3.0e+4")])
def test_a_number_yaml_reads_as_text_is_refused_with_the_fix(text, fix):
    """YAML 1.1 (PyYAML, Snakemake) reads ``1e-3`` as the string '1e-3': the error says so and
    how to write it (a dot and a signed exponent), and that spelling is accepted."""
    from evil_moe.config import ConfigError, load_config

    with pytest.raises(ConfigError) as e:
        load_config(overrides=[f"pilot.lr={text}"])
    msg = str(e.value)
    assert msg.startswith("config key 'pilot.lr': expected number, got") and f"write {fix}" in msg, msg
    assert load_config(overrides=[f"pilot.lr={fix}"]).pilot.lr == float(text)
