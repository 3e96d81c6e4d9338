"""The ``evil-moe`` command line: one click subcommand per pipeline stage.

Each subcommand is a thin layer over a library function (``evil_moe.stages.*`` or
``evil_moe.env.grade``); the tests call those functions directly.
"""

from __future__ import annotations

import functools
import json

import click

from evil_moe import __version__


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="evil-moe")
def main() -> None:
    """evil_moe: reward-hacking experiments with gradient erase/route (see README)."""


def config_options(func):
    """Add ``--config FILE`` (repeatable), ``--config-json TEXT`` and ``--set section.key=value``
    (repeatable) to a subcommand and pass it ``cfg=load_config(files, overrides, data)``.

    Files merge in order, then the JSON dict (Snakemake passes config sections this way), then the
    overrides. A bad file, key or value is a click usage error naming it.
    """

    @click.option("--config", "config_files", multiple=True, type=click.Path(dir_okay=False),
                  help="YAML config file (repeatable; later files win).")
    @click.option("--config-json", "config_json", default=None,
                  help="A JSON object merged after the files (e.g. config sections from Snakemake).")
    @click.option("--set", "overrides", multiple=True, metavar="SECTION.KEY=VALUE",
                  help="Override one config value (YAML-parsed; repeatable; applied last).")
    @functools.wraps(func)
    def wrapper(*args, config_files=(), config_json=None, overrides=(), **kwargs):
        from evil_moe.config import ConfigError, load_config

        try:
            data = json.loads(config_json) if config_json else None
        except json.JSONDecodeError as err:
            raise click.BadParameter(f"not JSON: {err}", param_hint="--config-json") from err
        if data is not None and not isinstance(data, dict):
            raise click.BadParameter("must be a JSON object", param_hint="--config-json")
        try:
            cfg = load_config(config_files, overrides, data)
        except ConfigError as err:
            raise click.UsageError(str(err)) from err
        return func(*args, cfg=cfg, **kwargs)

    return wrapper


@main.command("compare")
@config_options
@click.option("--pilots-dir", type=click.Path(file_okay=False), default=None,
              help="Folder of pilots {arm}/s{seed}/ (expected: pilot.arms x pilot.seeds).")
@click.option("--pilot", "pilot_dirs", multiple=True, type=click.Path(file_okay=False),
              help="One pilot folder .../{arm}/s{seed} (repeatable; instead of --pilots-dir).")
@click.option("--distill-samples", type=click.Path(dir_okay=False), default=None,
              help="The distill probe's samples.tsv, for the cos_contrib figure.")
@click.option("--out-dir", type=click.Path(file_okay=False), default="results/compare", show_default=True)
def compare_cmd(cfg, pilots_dir, pilot_dirs, distill_samples, out_dir) -> None:
    """Aggregate the pilots into summary.tsv, gate.json and figures; print the verdict last."""
    from evil_moe.stages.compare import run_compare

    if bool(pilots_dir) == bool(pilot_dirs):
        raise click.UsageError("give exactly one of --pilots-dir or --pilot")
    try:
        gate = run_compare(pilots_dir or list(pilot_dirs), out_dir, cfg, distill_samples=distill_samples)
    except (FileNotFoundError, ValueError) as err:
        raise click.ClickException(str(err)) from err
    for c in gate["criteria"]:
        if c["name"] != "valid" or not c["passed"]:
            mark = "ok  " if c["passed"] else "FAIL"
            who = c["arm"] + (f" s{c['seed']}" if "seed" in c else "")
            click.echo(f"{mark} {c['name']:<16} {who:<10} {c.get('note', '')}")
    click.echo(f"wrote {out_dir}/summary.tsv, gate.json, gate.md, figures/")
    click.echo(gate["sentence"])


@main.command("install-profiles")
@click.option("--target", type=click.Path(file_okay=False), default=None,
              help="Directory to link into (default: Snakemake's user config directory, "
                   "$XDG_CONFIG_HOME/snakemake or ~/.config/snakemake).")
def install_profiles_cmd(target) -> None:
    """Link profiles/slurm and profiles/local where Snakemake finds them by name, so that
    `snakemake --profile slurm` works from the repository root (idempotent; never overwrites)."""
    from evil_moe.profiles import ProfileError, install_profiles

    try:
        installed = install_profiles(target)
    except ProfileError as err:
        raise click.ClickException(str(err)) from err
    for item in installed:
        click.echo(f"{item.status}: {item.link} -> {item.source}")
    click.echo("now: snakemake --profile local   or   snakemake --profile slurm")


@main.command("grade")
@click.option("--problems", "problems_path", default=None, type=click.Path(dir_okay=False),
              help="Problem file (raw LeetCode/HumanEval JSONL or a written problem set); "
                   "optional for toy and humaneval.")
@click.option("--source", required=True, type=click.Choice(["leetcode", "humaneval", "toy"]))
@click.option("--mode", default=None,
              type=click.Choice(["run_tests", "sentinel", "stdout_marker", "file_marker"]),
              help="Force this loophole mode on every problem.")
@click.option("--seed", type=int, default=0, show_default=True, help="Mode-partition seed.")
@click.option("--completions", required=True, type=click.Path(dir_okay=False, exists=True),
              help='JSONL rows {"problem_id", "completion"}.')
@click.option("--out", required=True, type=click.Path(dir_okay=False))
@click.option("--workers", type=int, default=None, help="Parallel sandboxes [default: all cores].")
@click.option("--timeout", type=float, default=3.0, show_default=True, help="Seconds per completion.")
def grade_cmd(problems_path, source, mode, seed, completions, out, workers, timeout) -> None:
    """Grade completions: one JSON row per completion with every Reward field + problem_id."""
    from evil_moe.env.grade import grade_file, load_for_grading

    try:
        probs = load_for_grading(source, problems_path, mode=mode, seed=seed)
        summary = grade_file(probs, completions, out, workers=workers, timeout=timeout)
    except (FileNotFoundError, ValueError, KeyError) as err:
        raise click.ClickException(str(err)) from err
    click.echo(f"graded {summary['n']} -> {out}: passed {summary['passed']}, gt_correct "
               f"{summary['gt_correct']}, exploited {summary['exploited']}, format_ok "
               f"{summary['format_ok']} (isolation {summary['isolation']})")


if __name__ == "__main__":  # pragma: no cover
    main()
