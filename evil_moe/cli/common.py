"""The ``evil-moe`` click group and what its commands share: ``--config`` / ``--config-json``
/ ``--set`` (:func:`config_options`), the arm names for ``--help``, and :func:`fail` (a library
error as one CLI error line). The commands are in :mod:`evil_moe.cli.stages`,
:mod:`evil_moe.cli.gate` and :mod:`evil_moe.cli.tools`.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path

import click

from evil_moe import __version__


def arm_names() -> list[str]:
    """The arms the config schema allows (the registry in evil_moe/rl/arms/registry.py; a test checks they
    agree) — read from the schema so that ``--help`` does not import torch."""
    from evil_moe.config import load_schema

    return list(load_schema()["properties"]["pilot"]["properties"]["arms"]["items"]["enum"])


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="evil-moe")
def main() -> None:
    """evil_moe: reward-hacking experiments with gradient erase/route (see README)."""


def config_options(func):
    """Add ``--config FILE`` (repeatable), ``--config-json TEXT`` and ``--set section.key=value``
    (repeatable) to a subcommand and pass it ``cfg=load_run_config(files, overrides, data)``
    (:mod:`evil_moe.checks`: the schema and the cross-key checks, as the Snakefile).

    Files merge in order, then the JSON dict (``@FILE``: read from FILE; Snakemake passes config
    sections this way), then the overrides. A bad file, key or value is a click usage error
    naming it.
    """

    @click.option("--config", "config_files", multiple=True, type=click.Path(dir_okay=False),
                  help="YAML config file (repeatable; later files win).")
    @click.option("--config-json", "config_json", default=None,
                  help="A JSON object merged after the files, or @FILE holding one (the "
                       "workflow passes each stage's config sections so).")
    @click.option("--set", "overrides", multiple=True, metavar="SECTION.KEY=VALUE",
                  help="Override one config value (YAML-parsed; repeatable; applied last).")
    @functools.wraps(func)
    def wrapper(*args, config_files=(), config_json=None, overrides=(), **kwargs):
        from evil_moe.checks import load_run_config
        from evil_moe.config import ConfigError

        if config_json and config_json.startswith("@"):
            try:
                config_json = Path(config_json[1:]).read_text()
            except OSError as err:
                raise click.BadParameter(f"cannot read {config_json[1:]}: {err.strerror}",
                                         param_hint="--config-json") from err
        try:
            data = json.loads(config_json) if config_json else None
        except json.JSONDecodeError as err:
            raise click.BadParameter(f"not JSON: {err}", param_hint="--config-json") from err
        if data is not None and not isinstance(data, dict):
            raise click.BadParameter("must be a JSON object", param_hint="--config-json")
        try:
            cfg = load_run_config(config_files, overrides, data)
        except ConfigError as err:
            raise click.UsageError(str(err)) from err
        return func(*args, cfg=cfg, **kwargs)

    return wrapper


def fail(err: Exception):
    """Turn a library error into one clear CLI error line (exit 1)."""
    raise click.ClickException(str(err)) from err
