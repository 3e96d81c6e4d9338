"""Shared state of the workflow: the validated config, derived lists, and every input/params
function (get_*). The stage files (rules/*.smk) hold only rules; what the workflow asks of the
package beyond that (the config's checks, the job sizes, the per-stage config files, Snakemake's
internals) is evil_moe/workflow.py.

Config: config/config.yaml (the embedded default), merged with any --configfile; validated here
against config/schema.yaml (unknown or wrong-typed keys fail before any job runs, naming the key)
and filled with the schema's defaults.
"""

import shlex
import sys
from pathlib import Path

from snakemake.exceptions import WorkflowError
from snakemake.utils import validate

from evil_moe.files import DamagedFile, read_json
from evil_moe.rl.arms.registry import ARMS as ARM_REGISTRY
from evil_moe.rl.arms.pilot_inputs import pilot_inputs, uses_detector
from evil_moe.gate.frontpage import decision_text
from evil_moe.gate.verdict import verdict_line
from evil_moe.env.loopholes import MODES as LOOPHOLE_MODES
from evil_moe.cluster.resources import GATING_PRIORITY, pilot_priority
from evil_moe.cluster.stages import ARM_SECTIONS
from evil_moe.workflow import (
    ConfigFiles,
    JobSizes,
    check_config,
    check_gate,
    check_inputs,
    per_job,
    put_own_bin_on_path,
    share_svd_cache,
    report_docutils,
    sized_config,
    stage_config_param,
    stage_sections,
    vllm_warning,
)

# The rules call `evil-moe`: found beside this Snakemake without activating .venv.
put_own_bin_on_path()
# The report renders config and result text as text: docutils' raw and include off
# (report/docutils.conf), the text escaped where it enters (evil_moe/gate/rst.py).
report_docutils(Path(workflow.basedir) / "report")

# ---- config ---------------------------------------------------------------------------------
# evil_moe.workflow.check_config (the schema, then the cross-key checks the CLI makes too) gives
# one sentence naming the bad key (snakemake's own message dumps the whole schema); then
# snakemake.utils.validate checks the same schema and fills the defaults in place; then
# check_inputs checks the problem file, the models, the planted world and the audit's seeds.
check_config(config)
validate(config, "../config/schema.yaml")
check_inputs(config)
# pilot.sampler vllm from a Python without vLLM: said once, before any job (the pilots refuse too)
if not workflow.remote_exec and (_vllm := vllm_warning(config)):
    print(_vllm, file=sys.stderr)
# a large student's SVD factors: computed once per run into <results>/svd_cache (the jobs inherit it)
share_svd_cache(config)
MAKE_TEACHER = config["teacher"]["make"] == "sft"

RESULTS = config["results"]
# compare/gate.json is read while the DAG is built: a damaged one is named before anything else.
check_gate(f"{RESULTS}/compare/gate.json")
ARMS = list(config["pilot"]["arms"])
SEEDS = list(config["pilot"]["seeds"])
MODES = (
    [config["problems"]["force_mode"]]
    if config["problems"]["force_mode"]
    else list(config["problems"]["modes"])
)
# Every arm and loophole mode there is (wildcard constraints must not depend on the chosen ones):
# the arm registry (evil_moe/rl/arms/registry.py) and evil_moe.env.loopholes.MODES; the schema's enums are
# held equal to them by tests/test_config_schema.py.
ALL_ARMS = list(ARM_REGISTRY)
ALL_MODES = list(LOOPHOLE_MODES)
# The figures compare draws: evil_moe.gate.figures.FIGURES is their home, not imported here
# (pandas and scipy would add seconds to every snakemake call); tests/test_workflow_static.py
# holds this copy and compare.smk's outputs equal to it.
FIGURES = [
    "heldout",
    "hack_rate",
    "pass_rate",
    "cin",
    "removed",
    "frac_clipped",
    "cos_contrib",
    "ceiling",
    "absorption",
    "phases",
]
# The pilots evaluate along the run (pilot.eval_every > 0): each writes trajectory.tsv and compare
# draws evil_moe.gate.figures.TRAJECTORY_FIGURE; otherwise neither exists (the default's DAG).
TRAJECTORY = bool(config["pilot"]["eval_every"])
# PILOT_RUN_INDEPENDENT (evil_moe/config.py): pilot keys left out of each run's params, so adding
# a seed or an arm does not rerun the others, and the test-only failure switches reach only the
# arm they name (see get_pilot_config).
# Config each stage reads (its params; editing anything else does not rerun it): STAGE_SECTIONS
# of the one table of stages (evil_moe/cluster/stages.py), through evil_moe.workflow.stage_sections.


wildcard_constraints:
    arm="|".join(ALL_ARMS),
    seed=r"\d+",
    mode="|".join(ALL_MODES),
    name="main|fold_(" + "|".join(ALL_MODES) + ")",
    toy="teacher|student",
    level=r"p[0-9.]+_r[0-9.]+",


def res(path):
    """A path under the results folder (config key results)."""
    return f"{RESULTS}/{path}"


# ---- job sizes (threads, resources) ------------------------------------------------------------
# What a job asks the executor for follows from the config (evil_moe/cluster/resources.py: the model's
# size, group x prompts, max_new, micro-batches); the Slurm profile holds only the site.
# models.device auto: the jobs use a GPU when they find one, so they ask for one where they would
# find one (evil_moe.workflow.sized_config, docs/job-sizes.md "GPUs").
SIZED_CONFIG = sized_config(config, workflow)
_job_size = JobSizes(SIZED_CONFIG)


def get_threads(stage):
    """CPUs of the stage's jobs: its config key (e.g. pilot.threads), which is also the torch
    thread count the stage uses, so every executor gives the same numbers."""
    return _job_size(stage).threads


def get_mem_mb(stage):
    """mem_mb of the stage's jobs (MiB): the estimate on the first attempt, attempt times it
    on a retry (--retries)."""
    size = _job_size(stage)

    @per_job
    def mem_mb(wildcards, attempt):
        return size.mem_mb_at(attempt)

    return mem_mb


def get_runtime(stage):
    """runtime of the stage's jobs (minutes; Slurm --time): the estimate, attempt times it on
    a retry."""
    size = _job_size(stage)

    @per_job
    def runtime(wildcards, attempt):
        return size.runtime_at(attempt)

    return runtime


@per_job
def get_pilot_priority(wildcards):
    """Priority of a pilot job: the arm's relative cost (evil_moe.cluster.resources.pilot_priority), so
    the longest pilots start first and the short ones fill the cores at the end."""
    return pilot_priority(wildcards.arm)


def get_gpu(stage):
    """GPUs of the stage's jobs: 1 for a model stage when models.device is cuda, or auto where
    the jobs would find a GPU (SIZED_CONFIG), else 0."""
    return _job_size(stage).gpu


# ---- models ---------------------------------------------------------------------------------
def _model_dirs():
    build = config["models"]["build"]
    if build == "toy":
        student, teacher = res("models/student"), res("models/teacher")
    elif build == "smollm2":
        student, teacher = res("models/smollm2"), res("models/smollm2")
    else:
        student, teacher = config["models"]["student"], config["models"]["teacher"]
    if MAKE_TEACHER:  # rule make_teacher writes it
        teacher = res("teacher_sft/model")
    return student, teacher


STUDENT, TEACHER = _model_dirs()


def get_model_input(which):
    """The file a stage waits for before loading the student or teacher: a built or made
    model's config.json, or nothing when models.build is none (a hub id or a ready local path)
    and the model is not made by the workflow (teacher.make sft makes the teacher).
    """
    if which == "teacher" and MAKE_TEACHER:
        return f"{TEACHER}/config.json"
    if config["models"]["build"] == "none":
        return []
    return f"{STUDENT if which == 'student' else TEACHER}/config.json"


def _model_arg(input, configured):
    built = input.get("model")
    return str(Path(built).parent) if built else configured


def get_student(wildcards, input):
    """--model for the student: the built model's folder (its config.json is input.model) or
    models.student as given (models.build none)."""
    return _model_arg(input, STUDENT)


def get_teacher(wildcards, input):
    """--model for the teacher: the built model's folder or models.teacher as given."""
    return _model_arg(input, TEACHER)


# ---- stage configs (params.cfg) --------------------------------------------------------------
# The config files the rules pass to --config-json (evil_moe.workflow.ConfigFiles: named by their
# content under results/configs/, not written by a dry run); the sections each stage reads:
# evil_moe.workflow.stage_sections.
_config_file = ConfigFiles(RESULTS, dryrun=lambda: workflow.dryrun)


def get_stage_config(stage):
    """The config sections the stage reads, as a params function giving ``@file`` for
    --config-json (_config_file; a function, so that the file is written while the DAG is built,
    when Snakemake knows whether this is a dry run, not while this file is parsed)."""
    return stage_config_param(_config_file, stage, stage_sections(config, stage))


_PILOT_CONFIGS = {}


@per_job
def get_pilot_config(wildcards):
    """Config of one pilot run (``@file``, _config_file); the test-only switches pilot.fail_arm / fail_once_arm go
    only to the arm they name, so removing one reruns exactly that arm (and compare). The same
    for every seed of an arm: worked out once per arm."""
    arm = wildcards.arm
    if arm not in _PILOT_CONFIGS:
        data = stage_sections(config, "pilot")
        spec = ARM_REGISTRY[arm]
        if not spec.router:  # only Evil MoE's arms read moe and audit.placebos
            data.pop("audit")
            if spec.shortcut:  # Advantage Modification reads the authored pairs only
                data["moe"] = {"pairs": data["moe"]["pairs"]}
            else:
                data.pop("moe")
        for (
            name
        ) in (
            ARM_SECTIONS
        ):  # penalty, inoculation, advantage_mod: only to the arms that read them
            if name not in spec.sections:
                data.pop(name)
        for key in ("fail_arm", "fail_once_arm"):
            if config["pilot"][key] == arm:
                data["pilot"][key] = arm
        _PILOT_CONFIGS[arm] = _config_file("pilot", data)
    return _PILOT_CONFIGS[arm]


# ---- v_hack ---------------------------------------------------------------------------------
def get_known_modes(wildcards):
    """--known-modes for extract: fold_{mode} knows every mode but the held-out one; main knows
    vhack.known_modes (nothing passed = the stage's default, all modes)."""
    if wildcards.name.startswith("fold_"):
        heldout = wildcards.name.removeprefix("fold_")
        return "--known-modes " + ",".join(m for m in MODES if m != heldout)
    known = config["vhack"]["known_modes"]
    return "--known-modes " + ",".join(known) if known else ""


# ---- the planted world (toy.plant; docs/planted.md) -------------------------------------------
PLANTED = config["toy"]["plant"]["enabled"] and config["models"]["build"] == "toy"


def get_plant_input(wildcards):
    """The toy student's planted direction (written beside the model by rule toy_model)."""
    return {
        "model": res("models/student/config.json"),
        "problems": res("problems.jsonl"),
    }


def get_planted_checks_input(wildcards):
    """The planted checks read the plant, the extracted v_hack and its controls, and every
    pilot's held-out outcomes and final adapter."""
    return {
        "planted": res("vhack/planted.safetensors"),
        "hack": res("vhack/main_hack.safetensors"),
        "random": res("vhack/main_random.safetensors"),
        "shuffled": res("vhack/main_shuffled.safetensors"),
        "outcomes": [f"{d}/outcomes.tsv" for d in _pilot_dirs("pilots", SEEDS)],
        "adapters": [f"{d}/adapter.safetensors" for d in _pilot_dirs("pilots", SEEDS)],
    }


def get_planted_pilot_flags(wildcards, input):
    """--pilot DIR for every pilot whose outcomes the planted checks read."""
    dirs = [str(Path(p).parent) for p in input.outcomes]
    return " ".join(f"--pilot {shlex.quote(d)}" for d in dirs)


# ---- the detector audit (rules/audit.smk; docs/detectors.md) --------------------------------
# audit.seeds are disjoint from pilot.seeds and sweep.seeds (evil_moe.workflow.check_inputs)
AUDIT_SEEDS = list(config["audit"]["seeds"])
# The audit runs whenever an arm flags with a detector (its quality table is then part of the
# comparison); such an arm waits for it when its threshold or probe comes from it
# (evil_moe.rl.arms.pilot_inputs).
AUDIT = any(uses_detector(a, config["pilot"]["detector"]) for a in ARMS)


def _pilot_inputs(vhack_name, arm=None, tree="pilots", seed="{seed}"):
    """The files a pilot reads (evil_moe.rl.arms.pilot_inputs.pilot_inputs, shared with the pilot
    stage), under the results folder, with the student model after the problems."""
    found = pilot_inputs(arm, config, vhack_name=vhack_name, tree=tree, seed=seed)
    inputs = {}
    for key, item in found.items():
        if item.rule_input:
            inputs[key] = res(item.path)
        if key == "problems":
            inputs["model"] = get_model_input("student")
    return inputs


def get_calibrate_input(wildcards):
    """Inputs of a calibration run: the pilot's (student, problems, v_hack, the distilled
    student with pilot.init distill) and the shuffled-label v_hack (a placebo)."""
    inputs = _pilot_inputs("main")
    inputs.pop("random_vhack")
    return {**inputs, "shuffled": res("vhack/main_shuffled.safetensors")}


def get_calibrate_options(wildcards):
    """--init / --teacher-rollouts of a calibration run (as the pilots')."""
    inputs = _pilot_inputs("main")
    options = []
    for key in ("init", "teacher_rollouts"):
        if key in inputs:
            options += [f"--{key.replace('_', '-')}", inputs[key]]
    return shlex.join(options)


def get_calibration_runs(wildcards, input):
    """--calibration-run DIR for every calibration run."""
    return " ".join(
        f"--calibration-run {shlex.quote(str(Path(p).parent))}" for p in input.runs
    )


# ---- pilots ---------------------------------------------------------------------------------
@per_job
def get_pilot_input(wildcards):
    """Inputs of a pilot run (v_hack from the known modes; the planted direction for an arm
    that erases along it; a random-flag control also waits for its matched arm's steps.tsv).
    """
    return _pilot_inputs("main", wildcards.arm, "pilots", wildcards.seed)


@per_job
def get_fold_pilot_input(wildcards):
    """Inputs of a leave-one-mode-out pilot run (v_hack without the held-out mode)."""
    return _pilot_inputs(
        f"fold_{wildcards.mode}",
        wildcards.arm,
        f"sweep/folds/{wildcards.mode}",
        wildcards.seed,
    )


# The order of the pilot's optional arguments on its command line.
PILOT_OPTIONS = (
    "planted_vhack",
    "init",
    "teacher_rollouts",
    "match_flags",
    "calibration",
    "probe",
)


@per_job
def get_pilot_options(wildcards):
    """Optional pilot arguments: --init (pilot.init distill), --teacher-rollouts (mix_ratio > 0),
    --match-flags (random-flag controls), --planted-vhack (an arm whose V is the planted
    direction), --calibration and --probe (the detector audit's): the optional inputs of
    evil_moe.rl.arms.pilot_inputs, worked out from the wildcards (a function of the wildcards alone is
    cheaper for Snakemake to call than one of the job's input)."""
    tree = f"sweep/folds/{wildcards.mode}" if "mode" in wildcards.keys() else "pilots"
    found = pilot_inputs(wildcards.arm, config, tree=tree, seed=wildcards.seed)
    options = []
    for key in PILOT_OPTIONS:
        if key in found:
            options += [found[key].option, res(found[key].path)]
    return shlex.join(options)


# ---- the detector-quality sweep (config/detector_sweep.yaml; docs/arms.md) ---------------------
def level_name(level):
    """Folder name of one detector_sweep level: p{precision}_r{recall} (%g)."""
    return f"p{level['precision']:g}_r{level['recall']:g}"


SWEEP_LEVELS = {level_name(lv): lv for lv in config["detector_sweep"]["levels"]}


@per_job
def get_level_pilot_config(wildcards):
    """Config of one detector-sweep pilot (``@file``, _config_file): the pilot's, with the
    noisy_label detector at the level's precision and recall."""
    if wildcards.level not in SWEEP_LEVELS:
        raise WorkflowError(
            f"invalid config: detector sweep level {wildcards.level} is not in detector_sweep.levels"
        )
    data = stage_sections(config, "pilot")
    level = SWEEP_LEVELS[wildcards.level]
    data["pilot"].update(
        detector="noisy_label",
        detector_precision=level["precision"],
        detector_recall=level["recall"],
    )
    return _config_file("pilot", data)


def get_detector_sweep_input(wildcards):
    """outcomes.tsv of every detector-sweep pilot (level x arm x seed) and of the main pilots
    it is compared with (vanilla; the ceilings when they ran)."""
    arms = config["detector_sweep"]["arms"]
    out = [
        res(f"detector_sweep/{lv}/{arm}/s{seed}/outcomes.tsv")
        for lv in SWEEP_LEVELS
        for arm in arms
        for seed in SEEDS
    ]
    main = ["vanilla"] + [
        ARM_REGISTRY[a].ceiling for a in arms if ARM_REGISTRY[a].ceiling in ARMS
    ]
    return out + [
        res(f"pilots/{a}/s{seed}/outcomes.tsv") for a in main for seed in SEEDS
    ]


def get_detector_sweep_pilots(wildcards, input):
    """--pilot LEVEL=DIR for every pilot folder among the inputs (LEVEL 'main' for the main
    pilots)."""
    flags = []
    for p in input.pilots:
        d = Path(p).parent
        level = (
            d.parent.parent.name
            if d.parent.parent.parent.name == "detector_sweep"
            else "main"
        )
        flags.append(f"--pilot {shlex.quote(f'{level}={d}')}")
    return " ".join(flags)


def get_out_dir(wildcards, output):
    """The folder of a stage's first output (its --out-dir)."""
    return str(Path(output[0]).parent)


def get_compare_out_dir(wildcards, output):
    """The folder of compare's gate.json (its --out-dir): its first output is a figure under
    figures/ when the pilots evaluate along the run (pilot.eval_every)."""
    return str(Path(output.gate).parent)


def get_models_dir(wildcards, output):
    """results/models: the parent of the student and teacher folders."""
    return str(Path(output[0]).parent.parent)


# ---- compare and the gate --------------------------------------------------------------------
def _pilot_dirs(tree, seeds):
    return [res(f"{tree}/{arm}/s{seed}") for arm in ARMS for seed in seeds]


def _finished(dirs):
    """With compare.allow_missing, only the pilot folders whose outcomes exist (a failed pilot is
    then named by the gate instead of blocking it); otherwise all of them."""
    if config["compare"]["allow_missing"]:
        return [d for d in dirs if Path(f"{d}/outcomes.tsv").is_file()]
    return dirs


def get_compare_input(wildcards):
    """outcomes.tsv of every pilot (arm x seed) the comparison aggregates (its steps.tsv,
    eval.tsv and status.json are written with it)."""
    return [f"{d}/outcomes.tsv" for d in _finished(_pilot_dirs("pilots", SEEDS))]


def get_compare_audit(wildcards):
    """The detector audit's quality table, when the run has one (AUDIT)."""
    return {"audit": res("audit/quality.tsv")} if AUDIT else {}


def get_compare_audit_option(wildcards, input):
    """--audit of the comparison (get_compare_audit)."""
    return f"--audit {shlex.quote(input.audit)}" if "audit" in input.keys() else ""


def get_compare_pilots(wildcards):
    """--pilot DIR for every expected pilot (arm x seed) of the comparison, finished or not:
    the gate names a missing one."""
    return " ".join(f"--pilot {shlex.quote(d)}" for d in _pilot_dirs("pilots", SEEDS))


# ---- re-evaluation (optional target results/reeval/compare/gate.json; docs/running.md) -------
def get_reeval_input(wildcards):
    """A finished pilot's outputs the re-evaluation reads (its final adapter, steps, outcomes,
    status), the problems and the student; v_hack and the initial adapter only when the arm
    evaluates the projected view (Arm.projected_view with pilot.static_projection)."""
    pilot = res(f"pilots/{wildcards.arm}/s{wildcards.seed}")
    inputs = {
        "problems": res("problems.jsonl"),
        "model": get_model_input("student"),
        "adapter": f"{pilot}/adapter.safetensors",
        "steps": f"{pilot}/steps.tsv",
        "outcomes": f"{pilot}/outcomes.tsv",
        "status": f"{pilot}/status.json",
    }
    if (
        ARM_REGISTRY[wildcards.arm].projected_view
        and config["pilot"]["static_projection"]
    ):
        inputs["vhack"] = res("vhack/main_hack.safetensors")
        if config["pilot"]["init"] == "distill":
            inputs["init"] = res("distill/student_adapter.safetensors")
    return inputs


def get_reeval_options(wildcards, input):
    """--vhack and --init of a re-evaluation that reads them (get_reeval_input)."""
    opts = [
        f"--{k} {shlex.quote(input[k])}" for k in ("vhack", "init") if k in input.keys()
    ]
    return " ".join(opts)


def get_reeval_pilots_dir(wildcards, input):
    """--pilots-dir of a re-evaluation: the folder above the pilot's {arm}/s{seed}/."""
    return str(Path(input.status).parents[2])


def get_reeval_out_dir(wildcards, output):
    """--out-dir of a re-evaluation: the mirror folder above {arm}/s{seed}/."""
    return str(Path(output.outcomes).parents[2])


def get_reeval_compare_input(wildcards):
    """outcomes.tsv of every re-evaluated pilot (arm x seed) under results/reeval/pilots."""
    return [f"{d}/outcomes.tsv" for d in _pilot_dirs("reeval/pilots", SEEDS)]


def get_reeval_compare_pilots(wildcards):
    """--pilot DIR for every re-evaluated pilot."""
    return " ".join(
        f"--pilot {shlex.quote(d)}" for d in _pilot_dirs("reeval/pilots", SEEDS)
    )


def get_pilot_flags(wildcards, input):
    """--pilot DIR for every pilot folder among the inputs."""
    dirs = [str(Path(p).parent) for p in input.pilots]
    return " ".join(f"--pilot {shlex.quote(d)}" for d in dirs)


def get_sweep_compare_input(wildcards):
    """Pilots of the sweep comparison: every arm over pilot.seeds plus sweep.seeds."""
    seeds = SEEDS + [s for s in config["sweep"]["seeds"] if s not in SEEDS]
    return [f"{d}/outcomes.tsv" for d in _finished(_pilot_dirs("pilots", seeds))]


def get_fold_compare_input(wildcards):
    """Pilots of one leave-one-mode-out fold: every arm over pilot.seeds."""
    return [
        f"{d}/outcomes.tsv" for d in _pilot_dirs(f"sweep/folds/{wildcards.mode}", SEEDS)
    ]


def get_gate(wildcards):
    """gate.json of the pilot comparison; waits for the compare checkpoint."""
    return checkpoints.compare.get().output.gate


def _read_gate(path):
    """compare/gate.json's content (None before compare ran); a damaged one stops the workflow
    with one line naming it and how to recover (evil_moe.files.read_json)."""
    if not path or not Path(path).is_file():
        return None
    try:
        return read_json(path, "gate")
    except DamagedFile as err:
        raise WorkflowError(str(err)) from None


def _fold_modes():
    return MODES if config["sweep"]["folds"] and len(MODES) > 1 else []


def _sweep_outputs():
    outputs = []
    if config["sweep"]["seeds"]:
        outputs.append(res("sweep/compare/gate.json"))
    outputs += [res(f"sweep/folds/{m}/compare/gate.json") for m in _fold_modes()]
    return outputs


def get_sweep_input(wildcards):
    """The sweep's outputs when the gate says separated; otherwise nothing (the report says why
    the sweep was not justified, from results/sweep/decision.rst)."""
    gate = _read_gate(checkpoints.compare.get().output.gate)
    if gate and gate.get("verdict") == "separated":
        return _sweep_outputs()
    return []


# The figure on the report's first page (compare/figures/{FRONT_FIGURE}.svg, with the caption
# report/fig_{FRONT_FIGURE}.rst); the per-arm table beside it is compare/summary.tsv.
FRONT_FIGURE = "heldout"


def get_front_figure(wildcards):
    """The comparison figure shown on the report's first page (FRONT_FIGURE)."""
    return res(f"compare/figures/{FRONT_FIGURE}.svg")


def get_front_caption(wildcards):
    """The caption of the first page's figure: the text of report/fig_{FRONT_FIGURE}.rst."""
    return (Path(workflow.basedir) / "report" / f"fig_{FRONT_FIGURE}.rst").read_text()


def get_verdict_text(wildcards, input):
    """The first line of the report: the gate's verdict and its sentence (reStructuredText;
    evil_moe.gate.verdict writes it)."""
    return verdict_line(_read_gate(input.gate))


def get_decision_text(wildcards, input):
    """reStructuredText of the gate's failed or deciding criteria and the sweep decision
    (the report's first page, below the figure; evil_moe.gate.verdict writes it)."""
    return decision_text(
        _read_gate(input.gate),
        sweep_seeds=config["sweep"]["seeds"],
        fold_modes=_fold_modes(),
        sweep_dir=res("sweep/"),
    )


def get_final_output(wildcards):
    """Targets of the default run: the pilot comparison, the gate note, every pilot's tables, the
    toy models' summary (embedded default), and the sweep when the gate says separated.
    """
    targets = [res("compare/summary.tsv"), res("compare/gate.json")]
    targets += [res(f"compare/figures/{f}.svg") for f in FIGURES]
    # each pilot's report tables: Snakemake does not remake a deleted intermediate file while the
    # comparison after it is up to date, so a pilot folder removed by hand would stay missing (and
    # --report would fail on it); as targets, the pilot runs again and the comparison after it
    targets += [
        f"{d}/{t}"
        for d in _finished(_pilot_dirs("pilots", SEEDS))
        for t in ("steps.tsv", "eval.tsv", "outcomes.tsv")
    ]
    targets.append(res("sweep/decision.rst"))
    if config["models"]["build"] == "toy":
        targets.append(res("models/toy_summary.tsv"))
    if AUDIT:
        targets.append(res("audit/quality.tsv"))
    if PLANTED:
        targets += [res("planted/recovery.tsv"), res("planted/checks.tsv")]
    return targets + get_sweep_input(wildcards)


def get_detector_sweep_target(wildcards):
    """The detector-quality sweep's summary when detector_sweep.levels is set (it does not wait
    for the gate: it is a measurement of the method, not a larger sweep)."""
    return [res("detector_sweep/summary.tsv")] if SWEEP_LEVELS else []
