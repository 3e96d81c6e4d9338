"""The ``evil-moe`` command line: one click subcommand per pipeline stage.

Each subcommand is a thin layer over a library function (``evil_moe.stages.*`` or
``evil_moe.env.grade_cli``); the tests call those functions directly.

The group and its shared options: :mod:`evil_moe.cli.common`; the stages' commands:
:mod:`evil_moe.cli.stages`; the comparison's and the gate's: :mod:`evil_moe.cli.gate`; the
tools beside the workflow: :mod:`evil_moe.cli.tools`.
"""

from evil_moe.cli import gate, stages, tools  # noqa: F401  (each registers its commands)
from evil_moe.cli.common import config_options, main

__all__ = ["main", "config_options"]
