"""Shared state of the workflow: the validated config, derived lists, and every input/params
function (get_*). The stage files (rules/*.smk) hold only rules.

Config: config/config.yaml (the embedded default), merged with any --configfile; validated here
against config/schema.yaml (unknown or wrong-typed keys fail before any job runs, naming the key)
and filled with the schema's defaults.
"""

import hashlib
import inspect
import json
import os
import shlex
from pathlib import Path

from snakemake.common import overwrite_function_params
from snakemake.exceptions import WorkflowError
from snakemake.utils import validate

from evil_moe.rl.arms import ARMS as ARM_REGISTRY
from evil_moe.config import PILOT_RUN_INDEPENDENT, ConfigError
from evil_moe.config import validate as check_config
from evil_moe.gate.verdict import decision_text, verdict_line
from evil_moe.env.loopholes import MODES as LOOPHOLE_MODES
from evil_moe.cluster.resources import ResourceError, job_size, pilot_priority

# ---- config ---------------------------------------------------------------------------------
# evil_moe.config gives one sentence naming the bad key (snakemake's own message dumps the whole
# schema); then snakemake.utils.validate checks the same schema and fills the defaults in place.
try:
    check_config(config)
except ConfigError as err:
    raise WorkflowError(f"invalid config: {err}") from None

validate(config, "../config/schema.yaml")

if config["problems"]["source"] == "leetcode":
    if not config["problems"]["path"]:
        raise WorkflowError(
            "invalid config: problems.source is leetcode but 'problems.path' is not set"
        )
    if not Path(config["problems"]["path"]).is_file():
        raise WorkflowError(
            f"invalid config: 'problems.path': problem file not found: {config['problems']['path']}"
        )
MAKE_TEACHER = config["teacher"]["make"] == "sft"
if config["models"]["build"] == "none":
    # with teacher.make sft the teacher is made from the student: models.teacher is not read
    for _key in ("student",) if MAKE_TEACHER else ("student", "teacher"):
        if not config["models"][_key]:
            raise WorkflowError(
                f"invalid config: models.build is none but 'models.{_key}' is not set"
            )

RESULTS = config["results"]
ARMS = list(config["pilot"]["arms"])
SEEDS = list(config["pilot"]["seeds"])
MODES = (
    [config["problems"]["force_mode"]]
    if config["problems"]["force_mode"]
    else list(config["problems"]["modes"])
)
# Every arm and loophole mode there is (wildcard constraints must not depend on the chosen ones):
# the arm registry (evil_moe/rl/arms.py) and evil_moe.env.loopholes.MODES; the schema's enums are
# held equal to them by tests/test_schema.py.
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
# PILOT_RUN_INDEPENDENT (evil_moe/config.py): pilot keys left out of each run's params, so adding
# a seed or an arm does not rerun the others, and the test-only failure switches reach only the
# arm they name (see get_pilot_config).
# Config each stage reads (its params; editing anything else does not rerun it): a whole section,
# or "section.key" for single keys (the toy models only need pilot.max_new, not every pilot knob).
STAGE_SECTIONS = {
    "problems": ["problems"],
    "toy_models": ["toy", "problems", "adapter", "grader", "pilot.max_new"],
    "teacher": ["problems", "grader", "models", "teacher"],
    "make_teacher": [
        "problems",
        "grader",
        "models",
        "sft",
        "teacher.elicit",
        "teacher.temperature",
        "teacher.top_p",
        "teacher.max_new",
        "teacher.batch_prompts",
        "vhack.known_modes",
        "pilot.group",
        "pilot.prompts_per_step",
        "pilot.max_new",
        "pilot.betas",
    ],
    "extract": [
        "problems",
        "models",
        "adapter",
        "vhack",
        "pilot.group",
        "pilot.prompts_per_step",
        "pilot.max_new",
        "pilot.temperature",
    ],
    "distill": [
        "problems",
        "models",
        "adapter",
        "distill",
        "pilot.group",
        "pilot.prompts_per_step",
        "pilot.max_new",
        "pilot.temperature",
        "pilot.betas",
    ],
    "pilot": ["problems", "grader", "models", "adapter", "vhack", "pilot"],
    "reevaluate": ["problems", "grader", "models", "adapter", "pilot", "reevaluate"],
    "compare": ["pilot", "compare", "vhack.known_modes"],
    "detector_sweep": ["pilot", "compare", "detector_sweep"],
    "planted_vhack": ["problems", "models", "adapter", "toy"],
    "planted_checks": ["pilot", "compare"],
}


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


def _per_job(func):
    """Mark a function Snakemake calls for every job (input, params, resources, priority): it
    reads the function's parameters (inspect.signature, ~15 us) two or three times per call, six
    or more times per pilot job; give them once, as Snakemake's own wrappers do
    (snakemake.ioutils.subpath). The function itself is unchanged."""
    overwrite_function_params(func, inspect.signature(func).parameters)
    return func


# ---- job sizes (threads, resources) ------------------------------------------------------------
# What a job asks the executor for follows from the config (evil_moe/cluster/resources.py: the model's
# size, group x prompts, max_new, micro-batches); the Slurm profile holds only the site.
_JOB_SIZES = {}


def _job_size(stage):
    if stage not in _JOB_SIZES:
        try:
            _JOB_SIZES[stage] = job_size(config, stage)
        except ResourceError as err:
            raise WorkflowError(f"invalid config: {err}") from None
    return _JOB_SIZES[stage]


def get_threads(stage):
    """CPUs of the stage's jobs: its config key (e.g. pilot.threads), which is also the torch
    thread count the stage uses, so every executor gives the same numbers."""
    return _job_size(stage).threads


def get_mem_mb(stage):
    """mem_mb of the stage's jobs (MiB): the estimate on the first attempt, attempt times it
    on a retry (--retries)."""
    size = _job_size(stage)

    @_per_job
    def mem_mb(wildcards, attempt):
        return size.mem_mb_at(attempt)

    return mem_mb


def get_runtime(stage):
    """runtime of the stage's jobs (minutes; Slurm --time): the estimate, attempt times it on
    a retry."""
    size = _job_size(stage)

    @_per_job
    def runtime(wildcards, attempt):
        return size.runtime_at(attempt)

    return runtime


@_per_job
def get_pilot_priority(wildcards):
    """Priority of a pilot job: the arm's relative cost (evil_moe.cluster.resources.pilot_priority), so
    the longest pilots start first and the short ones fill the cores at the end."""
    return pilot_priority(wildcards.arm)


def get_gpu(stage):
    """GPUs of the stage's jobs: 1 for a model stage when models.device is cuda, else 0."""
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
def _sections(stage):
    data = {}
    for item in STAGE_SECTIONS[stage]:
        name, _, key = item.partition(".")
        if key:
            data.setdefault(name, {})[key] = config[name][key]
            continue
        section = dict(config[name])
        if name == "pilot":
            for drop in PILOT_RUN_INDEPENDENT:
                section.pop(drop, None)
        data[name] = section
    return data


_CONFIG_FILES = {}


def _config_file(stage, data):
    """``@<file>`` for --config-json: the JSON written (atomically) to
    results/configs/<stage>-<sha256[:16]>.json, named by its content. The param is then a short
    path that still changes with every value, so Snakemake's params rerun trigger works and its
    "Params have changed" reason (and a failed job's shell command) does not print the whole
    config; diff the two named files to see what changed. Each distinct content is serialised and
    written once per Snakemake invocation (a 3,000-pilot sweep has a handful of them).
    """
    text = json.dumps(data, sort_keys=True, indent=1) + "\n"
    if text in _CONFIG_FILES:
        return _CONFIG_FILES[text]
    digest = hashlib.sha256(text.encode()).hexdigest()[:16]
    path = Path(res(f"configs/{stage}-{digest}.json"))
    if not path.is_file() or path.read_text() != text:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        tmp.write_text(text)
        tmp.replace(path)
    _CONFIG_FILES[text] = f"@{path}"
    return _CONFIG_FILES[text]


def get_stage_config(stage):
    """The config sections the stage reads, as ``@file`` for --config-json (_config_file)."""
    return _config_file(stage, _sections(stage))


_PILOT_CONFIGS = {}


@_per_job
def get_pilot_config(wildcards):
    """Config of one pilot run (``@file``, _config_file); the test-only switches pilot.fail_arm / fail_once_arm go
    only to the arm they name, so removing one reruns exactly that arm (and compare). The same
    for every seed of an arm: worked out once per arm."""
    arm = wildcards.arm
    if arm not in _PILOT_CONFIGS:
        data = _sections("pilot")
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
if config["toy"]["plant"]["enabled"] and config["models"]["build"] != "toy":
    raise WorkflowError(
        "invalid config: toy.plant.enabled needs models.build: toy (the plant is trained into "
        "the toy student)"
    )
if not PLANTED and any(ARM_REGISTRY[a].vhack == "planted" for a in ARMS):
    raise WorkflowError(
        "invalid config: pilot.arms lists a planted-direction arm (erase_planted) but "
        "toy.plant.enabled is false: there is no planted direction to erase along"
    )


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


# ---- pilots ---------------------------------------------------------------------------------
def _pilot_inputs(vhack_name, arm=None):
    inputs = {
        "problems": res("problems.jsonl"),
        "model": get_model_input("student"),
        "vhack": res(f"vhack/{vhack_name}_hack.safetensors"),
        "random_vhack": res(f"vhack/{vhack_name}_random.safetensors"),
    }
    if arm in ARM_REGISTRY and ARM_REGISTRY[arm].vhack == "planted":
        inputs["planted_vhack"] = res("vhack/planted.safetensors")
    if config["pilot"]["init"] == "distill":
        inputs["init"] = res("distill/student_adapter.safetensors")
    if config["pilot"]["mix_ratio"] > 0:
        inputs["teacher_rollouts"] = res("teacher/rollouts.jsonl.gz")
    return inputs


def _match_flags(tree, wildcards):
    """A random-flag control waits for the steps.tsv of the arm whose per-step flag rates it
    follows (evil_moe.rl.arms.FlagRateMatch), same tree and seed."""
    matched = ARM_REGISTRY[wildcards.arm].matches
    if not matched:
        return {}
    return {"match_flags": res(f"{tree}/{matched}/s{wildcards.seed}/steps.tsv")}


@_per_job
def get_pilot_input(wildcards):
    """Inputs of a pilot run (v_hack from the known modes; the planted direction for an arm
    that erases along it; a random-flag control also waits for its matched arm's steps.tsv).
    """
    return {**_pilot_inputs("main", wildcards.arm), **_match_flags("pilots", wildcards)}


@_per_job
def get_fold_pilot_input(wildcards):
    """Inputs of a leave-one-mode-out pilot run (v_hack without the held-out mode)."""
    return {
        **_pilot_inputs(f"fold_{wildcards.mode}", wildcards.arm),
        **_match_flags(f"sweep/folds/{wildcards.mode}", wildcards),
    }


@_per_job
def get_pilot_options(wildcards):
    """Optional pilot arguments: --init (pilot.init distill), --teacher-rollouts (mix_ratio > 0),
    --match-flags (random-flag controls), --planted-vhack (an arm whose V is the planted
    direction): the rule's optional inputs (_pilot_inputs, _match_flags), worked out from the
    wildcards (a function of the wildcards alone is cheaper for Snakemake to call than one of the
    job's input)."""
    tree = f"sweep/folds/{wildcards.mode}" if "mode" in wildcards.keys() else "pilots"
    inputs = {**_pilot_inputs("main", wildcards.arm), **_match_flags(tree, wildcards)}
    options = []
    for key in ("planted_vhack", "init", "teacher_rollouts", "match_flags"):
        if key in inputs:
            options += [f"--{key.replace('_', '-')}", inputs[key]]
    return shlex.join(options)


# ---- the detector-quality sweep (config/detector_sweep.yaml; docs/arms.md) ---------------------
def level_name(level):
    """Folder name of one detector_sweep level: p{precision}_r{recall} (%g)."""
    return f"p{level['precision']:g}_r{level['recall']:g}"


SWEEP_LEVELS = {level_name(lv): lv for lv in config["detector_sweep"]["levels"]}


@_per_job
def get_level_pilot_config(wildcards):
    """Config of one detector-sweep pilot (``@file``, _config_file): the pilot's, with the
    noisy_label detector at the level's precision and recall."""
    if wildcards.level not in SWEEP_LEVELS:
        raise WorkflowError(
            f"invalid config: detector sweep level {wildcards.level} is not in detector_sweep.levels"
        )
    data = _sections("pilot")
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
    if not path or not Path(path).is_file():
        return None
    return json.loads(Path(path).read_text())


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
    """Targets of the default run: the pilot comparison, the gate note, the toy models' summary
    (embedded default), and the sweep when the gate says separated."""
    targets = [res("compare/summary.tsv"), res("compare/gate.json")]
    targets += [res(f"compare/figures/{f}.svg") for f in FIGURES]
    targets.append(res("sweep/decision.rst"))
    if config["models"]["build"] == "toy":
        targets.append(res("models/toy_summary.tsv"))
    if PLANTED:
        targets += [res("planted/recovery.tsv"), res("planted/checks.tsv")]
    return targets + get_sweep_input(wildcards)


def get_detector_sweep_target(wildcards):
    """The detector-quality sweep's summary when detector_sweep.levels is set (it does not wait
    for the gate: it is a measurement of the method, not a larger sweep)."""
    return [res("detector_sweep/summary.tsv")] if SWEEP_LEVELS else []
