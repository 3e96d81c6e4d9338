"""The commands a user runs beside the workflow: ``grade`` (a file of completions in the
sandbox, :mod:`evil_moe.env.grade_cli`), ``install-profiles``, ``slurm-check`` and ``cancel-run``
(:mod:`evil_moe.cluster`).
"""

from __future__ import annotations

import click

from evil_moe.env.loopholes import MODES
from evil_moe.cli.common import fail, main


@main.command("install-profiles")
@click.option("--target", type=click.Path(file_okay=False), default=None,
              help="Directory to link into (default: Snakemake's user config directory, "
                   "$XDG_CONFIG_HOME/snakemake or ~/.config/snakemake).")
def install_profiles_cmd(target) -> None:
    """Link profiles/slurm and profiles/local where Snakemake finds them by name, so that
    `snakemake --profile slurm` works from the repository root (idempotent; never overwrites)."""
    from evil_moe.cluster.profiles import ProfileError, install_profiles

    try:
        installed = install_profiles(target)
    except ProfileError as err:
        raise click.ClickException(str(err)) from err
    for item in installed:
        click.echo(f"{item.status}: {item.link} -> {item.source}")
    click.echo("now: snakemake --profile local   or   snakemake --profile slurm")


@main.command("slurm-check")
@click.option("--profile", default="profiles/slurm", show_default=True,
              help="Snakemake profile: a folder with config.yaml, or a name installed by "
                   "install-profiles.")
@click.option("--configfile", "configfiles", multiple=True, type=click.Path(dir_okay=False),
              help="Config merged on top of config/config.yaml, as for snakemake (repeatable).")
@click.option("--no-node-checks", is_flag=True,
              help="Skip the srun that runs the grader's sandbox probe on a compute node of each "
                   "grading partition.")
def slurm_check_cmd(profile, configfiles, no_node_checks) -> None:
    """Preflight: the planned jobs' requests (from the config and the profile) against the
    cluster's partitions and limits, and a working bubblewrap (the grader's sandbox) on a node
    of each grading partition; one line per mismatch, exit 1 when there is any."""
    from evil_moe.config import ConfigError
    from evil_moe.cluster.shapes import ResourceError
    from evil_moe.cluster.slurm_check import CheckError, run_check

    try:
        mismatches, report = run_check(profile, configfiles, node_checks=not no_node_checks)
    except (CheckError, ConfigError, ResourceError) as err:
        raise click.ClickException(str(err)) from err
    click.echo(report)
    for line in mismatches:
        click.echo(f"MISMATCH {line}")
    if mismatches:
        click.echo(f"slurm-check: {len(mismatches)} mismatch(es); fix the lines above (the EDIT "
                   "values of the profile, or the config) and rerun")
        raise SystemExit(1)
    click.echo("slurm-check: OK, every planned job fits this cluster")


@main.command("cancel-run")
@click.option("--directory", "-d", "workdir", default=".", show_default=True,
              type=click.Path(file_okay=False, exists=True),
              help="The folder Snakemake ran in (its --directory).")
@click.option("--dry-run", "-n", is_flag=True, help="Only list the jobs it would cancel.")
@click.option("--force", is_flag=True,
              help="Cancel although a Snakemake driver of this folder runs on this host.")
@click.option("--wait", "wait_s", type=click.FloatRange(min=0), default=300, show_default=True,
              help="Seconds to wait for the cancelled jobs to end (0: do not wait).")
def cancel_run_cmd(workdir, dry_run, force, wait_s) -> None:
    """After a killed Snakemake (SIGKILL, a lost login session): cancel the Slurm jobs its runs
    submitted from this folder and wait until they have ended; then `snakemake --unlock` and
    rerun. Refuses while a Snakemake driver of this folder is alive on this host."""
    from evil_moe.cluster.slurm_runs import CancelError, cancel_run

    try:
        cancel_run(workdir, dry_run=dry_run, force=force, wait_s=wait_s, log=click.echo)
    except CancelError as err:
        fail(err)


@main.command("grade")
@click.option("--problems", "problems_path", default=None, type=click.Path(dir_okay=False),
              help="Problem file (raw LeetCode/HumanEval JSONL or a written problem set); "
                   "optional for toy and humaneval.")
@click.option("--source", required=True, type=click.Choice(["leetcode", "humaneval", "toy"]))
@click.option("--mode", default=None,
              type=click.Choice(MODES),
              help="Force this loophole mode on every problem.")
@click.option("--seed", type=int, default=0, show_default=True, help="Mode-partition seed.")
@click.option("--completions", required=True, type=click.Path(dir_okay=False, exists=True),
              help='JSONL rows {"problem_id", "completion"}.')
@click.option("--out", required=True, type=click.Path(dir_okay=False))
@click.option("--workers", type=int, default=None, help="Parallel sandboxes [default: all cores].")
@click.option("--timeout", type=float, default=3.0, show_default=True,
              help="CPU seconds per completion.")
@click.option("--isolation", type=click.Choice(["auto", "bwrap", "rlimit-only"]), default="auto",
              show_default=True,
              help="The sandbox (auto/bwrap: refuse when bubblewrap cannot run) or rlimit-only.")
def grade_cmd(problems_path, source, mode, seed, completions, out, workers, timeout,
              isolation) -> None:
    """Grade completions: one JSON row per completion with every Reward field + problem_id."""
    from evil_moe.env.grade_cli import grade_file, load_for_grading

    try:
        probs = load_for_grading(source, problems_path, mode=mode, seed=seed)
        summary = grade_file(probs, completions, out, workers=workers, timeout=timeout,
                             isolation=isolation)
    except (OSError, ValueError, KeyError) as err:
        raise click.ClickException(str(err)) from err
    click.echo(f"graded {summary['n']} -> {out}: passed {summary['passed']}, gt_correct "
               f"{summary['gt_correct']}, exploited {summary['exploited']}, format_ok "
               f"{summary['format_ok']} (isolation {summary['isolation']})")
