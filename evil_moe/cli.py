"""The ``evil-moe`` command line: one click subcommand per pipeline stage.

Each subcommand is a thin layer over a library function (``evil_moe.stages.*`` or
``evil_moe.env.grade``); the tests call those functions directly.
"""

from __future__ import annotations

import click

from evil_moe import __version__


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="evil-moe")
def main() -> None:
    """evil_moe: reward-hacking experiments with gradient erase/route (see README)."""


if __name__ == "__main__":  # pragma: no cover
    main()
