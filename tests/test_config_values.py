"""Config values that YAML and JSON schema accept but no run can use: nan and infinities."""

from __future__ import annotations

import pytest
import yaml

from evil_moe.config import ConfigError, load_config

DEFAULT = "config/config.yaml"


@pytest.mark.parametrize("override, key, shown", [
    ("pilot.lr=.inf", "pilot.lr", "inf"),
    ("pilot.lr=-.inf", "pilot.lr", "-inf"),
    ("grader.timeout=.nan", "grader.timeout", "nan"),
    ("grader.format_bonus=.NaN", "grader.format_bonus", "nan"),
    ("pilot.betas=[0.9, .inf]", "pilot.betas[1]", "inf"),
    ("grader.wall_timeout=.Inf", "grader.wall_timeout", "inf"),
])
def test_non_finite_numbers_are_refused_naming_the_key(override, key, shown):
    with pytest.raises(ConfigError) as e:
        load_config([DEFAULT], [override])
    assert str(e.value) == f"config key '{key}': {shown} is not a finite number"


def test_non_finite_in_a_config_file(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump({"pilot": {"lr": float("inf")}, "grader": {"pass_reward": 1.0}}))
    with pytest.raises(ConfigError, match=r"config key 'pilot\.lr': inf is not a finite number"):
        load_config([DEFAULT, bad])


def test_finite_numbers_and_the_new_grader_keys_pass():
    cfg = load_config([DEFAULT], ["pilot.lr=0.001", "grader.isolation=rlimit-only",
                                  "grader.wall_timeout=12.5"])
    assert (cfg.pilot.lr, cfg.grader.isolation, cfg.grader.wall_timeout) == (0.001, "rlimit-only", 12.5)
    assert load_config([DEFAULT]).grader.isolation == "auto"
    with pytest.raises(ConfigError, match="grader.isolation"):
        load_config([DEFAULT], ["grader.isolation=none"])


@pytest.mark.parametrize("override, key", [("pilot.seeds=[0, 0, 1]", "pilot.seeds"),
                                           ("sweep.seeds=[3, 3]", "sweep.seeds")])
def test_a_repeated_seed_is_refused_naming_the_key(override, key):
    # a repeated seed would run the same pilot twice under one name and count it as two seeds
    with pytest.raises(ConfigError, match=rf"config key '{key}': .* non-unique elements"):
        load_config([DEFAULT], [override])
