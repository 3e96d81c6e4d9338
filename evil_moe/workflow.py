"""What the Snakefile asks of the package beyond its input functions: the run config's checks
with Snakemake's error, the jobs' sizes as the executor will see them, the per-stage config files
each rule passes to its command, and the one use of Snakemake's internals.

``rules/common.smk`` keeps only the workflow's derived lists, the input, params and resources
functions and the wildcard constraints; the rule files hold the rules. Everything here raises
:class:`snakemake.exceptions.WorkflowError` with one line starting ``invalid config``, so a bad
config stops ``snakemake`` before any job runs, naming the key.
"""

from __future__ import annotations

import hashlib
import inspect
import json
from pathlib import Path
from typing import Callable, Mapping

from snakemake.common import overwrite_function_params
from snakemake.exceptions import WorkflowError

from evil_moe import files
from evil_moe.checks import check_run_config
from evil_moe.cluster.resources import JobSize, gpu_for_auto, job_size, resolve_auto_device
from evil_moe.cluster.shapes import ResourceError
from evil_moe.cluster.gpu_memory import check_gpu_fit
from evil_moe.cluster.stages import MODEL_STAGES, STAGE_SECTIONS
from evil_moe.config import PILOT_RUN_INDEPENDENT, ConfigError
from evil_moe.env.problems import check_problem_file
from evil_moe.rl.arms.registry import ARMS


def check_config(config: dict) -> None:
    """The schema and the cross-key checks the CLI makes too (:func:`evil_moe.checks.check_run_config`),
    before Snakemake's own ``validate`` fills the defaults: one sentence naming the bad key
    (Snakemake's message dumps the whole schema). ``config`` is not modified.

    Raises:
        WorkflowError: ``invalid config: <what ConfigError says>``.
    """
    try:
        check_run_config(config)
    except ConfigError as err:
        raise WorkflowError(f"invalid config: {err}") from None


def check_inputs(config: Mapping) -> None:
    """The checks that need the validated config (defaults filled) and the files it names: the
    problem file as the problems job reads it (an error names the file, the line and the
    problem), the models ``models.build: none`` needs, the planted world's conditions and the
    detector audit's seeds.

    Raises:
        WorkflowError: one line starting ``invalid config`` that names the key.
    """
    problems = config["problems"]
    if problems["source"] == "leetcode":
        if not problems["path"]:
            raise WorkflowError(
                "invalid config: problems.source is leetcode but 'problems.path' is not set")
        if not Path(problems["path"]).is_file():
            raise WorkflowError(
                f"invalid config: 'problems.path': problem file not found: {problems['path']}")
    if problems["source"] == "leetcode" or problems["path"]:
        try:
            check_problem_file(problems["source"], problems["path"] or None)
        except (OSError, ValueError) as err:
            raise WorkflowError(f"invalid config: 'problems.path': {err}") from None
    if config["models"]["build"] == "none":
        # with teacher.make sft the teacher is made from the student: models.teacher is not read
        make_teacher = config["teacher"]["make"] == "sft"
        for key in ("student",) if make_teacher else ("student", "teacher"):
            if not config["models"][key]:
                raise WorkflowError(
                    f"invalid config: models.build is none but 'models.{key}' is not set")
    _check_planted(config)
    _check_audit_seeds(config)


def check_gate(path: str | Path) -> None:
    """The comparison's ``gate.json``, when there is one, is intact and JSON
    (:func:`evil_moe.files.read_json`): every Snakemake command of the workflow (a run, a dry
    run, the report) reads it while it builds the DAG, so a damaged one is named before
    anything else, with the way out (remove it and run again: compare remakes it).

    Raises:
        WorkflowError: one line naming the file, the cause and what to do.
    """
    if Path(path).is_file():
        try:
            files.read_json(path, "gate")
        except files.DamagedFile as err:
            raise WorkflowError(str(err)) from None


def _check_planted(config: Mapping) -> None:
    """toy.plant needs the toy models; an arm that erases along the planted direction needs the
    plant (:func:`check_inputs`)."""
    plant = config["toy"]["plant"]["enabled"]
    if plant and config["models"]["build"] != "toy":
        raise WorkflowError(
            "invalid config: toy.plant.enabled needs models.build: toy (the plant is trained into "
            "the toy student)")
    planted = plant and config["models"]["build"] == "toy"
    if not planted and any(ARMS[a].vhack == "planted" for a in config["pilot"]["arms"]):
        raise WorkflowError(
            "invalid config: pilot.arms lists a planted-direction arm (erase_planted) but "
            "toy.plant.enabled is false: there is no planted direction to erase along")


def _check_audit_seeds(config: Mapping) -> None:
    """audit.seeds disjoint from pilot.seeds and sweep.seeds (:func:`check_inputs`)."""
    audit = set(config["audit"]["seeds"])
    shared = audit & set(list(config["pilot"]["seeds"]) + list(config["sweep"]["seeds"]))
    if shared:
        raise WorkflowError(
            "invalid config: audit.seeds must be disjoint from pilot.seeds and sweep.seeds "
            f"(shared: {sorted(shared)}): a detector threshold fitted on a seed's rollouts would "
            "be judged on them")


def vllm_warning(config: Mapping) -> str | None:
    """One line for a run whose pilots sample with vLLM (``pilot.sampler: vllm``) from a Python
    without it (``None`` otherwise). The jobs run the ``evil-moe`` of the Python that runs
    Snakemake (:func:`put_own_bin_on_path`; a Slurm job inherits the environment), so every pilot
    would stop at its start (:func:`evil_moe.rl.policy.vllm_sampler.require_vllm`). Looked up, not
    imported (``importlib.util.find_spec``: every Snakemake call reads the Snakefile);
    ``evil-moe slurm-check`` imports it."""
    import importlib.util
    import sys

    from evil_moe.rl.policy.vllm_sampler import GPU_ENV_COMMAND

    if config["pilot"]["sampler"] != "vllm" or importlib.util.find_spec("vllm") is not None:
        return None
    return (f"WARNING: pilot.sampler is vllm but vLLM is not installed in {sys.executable}, the "
            "Python the jobs run: every pilot would stop at its start; build the GPU environment "
            f"with `{GPU_ENV_COMMAND}` and run snakemake from it (docs/gpu.md), or set "
            "pilot.sampler: hf")


def share_svd_cache(config: Mapping, environ: dict | None = None) -> str | None:
    """Where the jobs keep the SVD factors of a student too large for the default cache: when
    ``EVIL_MOE_SVD_CACHE`` is unset and the adapter's fp32 ``U`` and ``Vh`` (from the config's
    shape: Qwen3-4B's 31.6 GiB) exceed :data:`evil_moe.stages.common.SVD_CACHE_DEFAULT_MAX_BYTES`,
    set it (``os.environ`` unless ``environ`` is given; every job inherits it, Slurm's too) to
    ``<results>/svd_cache``: on the filesystem every job already shares, so the factors are
    computed once per run by the first job that misses them (:func:`evil_moe.model.svd.cached_or_computed`)
    and read by the rest, where each of ~60 jobs took 253 SVDs before. Returns the folder set,
    or None (a smaller model keeps ``~/.cache``; a user's setting is kept)."""
    import os

    from evil_moe.cluster.shapes import adapter_linears, model_shape
    from evil_moe.stages.common import SVD_CACHE_DEFAULT_MAX_BYTES

    env = os.environ if environ is None else environ
    if "EVIL_MOE_SVD_CACHE" in env:
        return None
    try:
        dims = adapter_linears(model_shape(config), list(config["adapter"]["target_modules"]))
    except ResourceError:  # an unsizable hub id: the job sizes name models.params
        return None
    if 4 * sum(min(o, i) * (o + i) for o, i in dims) <= SVD_CACHE_DEFAULT_MAX_BYTES:
        return None
    env["EVIL_MOE_SVD_CACHE"] = str((Path(config["results"]) / "svd_cache").resolve())
    return env["EVIL_MOE_SVD_CACHE"]


def per_job(func: Callable) -> Callable:
    """Mark a function Snakemake calls for every job (input, params, resources, priority): it
    reads the function's parameters (``inspect.signature``, ~15 us) two or three times per call,
    six or more times per pilot job; give them once, as Snakemake's own wrappers do
    (``snakemake.ioutils.subpath``, through ``snakemake.common.overwrite_function_params``, the
    one Snakemake internal the workflow uses). The function itself is unchanged."""
    overwrite_function_params(func, inspect.signature(func).parameters)
    return func


def _model_partitions(workflow) -> list[str]:
    """The ``slurm_partition`` the profile gives the model rules (set-resources, default-resources)."""
    found = set()
    settings = workflow.resource_settings
    for name, res in dict(settings.overwrite_resources or {}).items():
        if name in MODEL_STAGES and "slurm_partition" in dict(res):
            found.add(str(dict(res)["slurm_partition"]))
    default = dict(settings.default_resources or {}).get("slurm_partition")
    return sorted(found or ({str(default)} if default else set()))


def sized_config(config: dict, workflow) -> dict:
    """The config the jobs are sized with: ``models.device: auto`` resolved to where the jobs
    would find a GPU (:func:`evil_moe.cluster.resources.gpu_for_auto`, docs/job-sizes.md "GPUs"):
    on this machine (the local executor), in the Slurm partitions the model rules go to (the
    Slurm executor), or inside a Slurm job that got one; ``config`` itself for any other device.

    Args:
        config: the validated config; workflow: Snakemake's ``workflow`` object (its executor
            flags and the profile's resources).

    Raises:
        WorkflowError: the GPU found under ``auto`` is too small for the pilot (names the key).
    """
    if config["models"]["device"] != "auto":
        return config
    where = "job" if workflow.remote_exec else ("local" if workflow.local_exec else "cluster")
    try:
        partitions = _model_partitions(workflow) if where == "cluster" else ()
    except (AttributeError, TypeError, ValueError):
        partitions = ()
    sized = resolve_auto_device(config, gpu_for_auto(where, partitions))
    if sized["models"]["device"] == "cuda":
        try:
            check_gpu_fit(sized)
        except ResourceError as err:
            raise WorkflowError(
                f"invalid config (models.device auto finds a GPU): {err}") from None
    return sized


class JobSizes:
    """Each stage's :class:`~evil_moe.cluster.resources.JobSize` for one sized config, worked out
    once per stage (the rules ask for threads, memory, runtime and GPUs separately)."""

    def __init__(self, sized: Mapping):
        self.sized = sized
        self._sizes: dict[str, JobSize] = {}

    def __call__(self, stage: str) -> JobSize:
        """The stage's job size.

        Raises:
            WorkflowError: ``invalid config: <ResourceError>`` (the model cannot be sized).
        """
        if stage not in self._sizes:
            try:
                self._sizes[stage] = job_size(self.sized, stage)
            except ResourceError as err:
                raise WorkflowError(f"invalid config: {err}") from None
        return self._sizes[stage]


def put_own_bin_on_path(environ: dict | None = None) -> str:
    """Put the bin folder of the running interpreter first on ``PATH`` (``os.environ`` unless
    ``environ`` is given) and return it: the rules call ``evil-moe``, installed in the same
    environment as the Snakemake that runs them, so ``.venv/bin/snakemake …`` works without
    activating ``.venv``. The folder is ``sys.executable``'s, not resolved (a venv's python is a
    link to the base interpreter's)."""
    import os
    import sys

    env = os.environ if environ is None else environ
    own = str(Path(sys.executable).parent)
    path = env.get("PATH", "")
    if path.split(os.pathsep)[0] != own:  # idempotent: the Snakefile may be read more than once
        env["PATH"] = os.pathsep.join([own, path])
    return own


def report_docutils(report_dir: str | Path, environ: dict | None = None) -> str:
    """Render the report with ``report_dir/docutils.conf`` (raw HTML and file insertion off):
    point ``DOCUTILSCONFIG`` (``os.environ`` unless ``environ`` is given) at it and return the
    path. Snakemake renders ``report/workflow.rst`` and every caption with docutils' defaults,
    under which a config string placed in the page could run a script in whoever opens the
    shared report (``.. raw:: html``) or paste a file of the machine into it (``.. include::``);
    docutils reads its settings from the files ``DOCUTILSCONFIG`` names, in the Snakemake
    process that builds the report. The text itself is escaped where it enters the page
    (:mod:`evil_moe.gate.rst`); this is the second wall.

    Raises:
        FileNotFoundError: no ``docutils.conf`` in ``report_dir``.
    """
    import os

    conf = files.require_file(Path(report_dir) / "docutils.conf", "the report's docutils settings")
    env = os.environ if environ is None else environ
    env["DOCUTILSCONFIG"] = str(conf.resolve())
    return env["DOCUTILSCONFIG"]


def stage_sections(config: Mapping, stage: str) -> dict:
    """The config a stage reads (:data:`evil_moe.cluster.stages.STAGE_SECTIONS`: whole sections
    or single ``section.key`` values), so that editing anything else does not rerun it; the
    pilot's section without :data:`evil_moe.config.PILOT_RUN_INDEPENDENT` (adding a seed or an
    arm does not rerun the others)."""
    data: dict = {}
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


class ConfigFiles:
    """The ``@<file>`` a rule passes to ``--config-json``: the JSON written (atomically) to
    ``<results>/configs/<stage>-<sha256[:16]>.json``, named by its content. The param is then a
    short path that still changes with every value, so Snakemake's params rerun trigger works
    and its "Params have changed" reason (and a failed job's shell command) does not print the
    whole config; diff the two named files to see what changed. Each distinct content is
    serialised and written once per Snakemake invocation (a 3,000-pilot sweep has a handful).

    A dry run writes nothing: while ``dryrun()`` is true (``rules/common.smk`` passes Snakemake's
    ``workflow.dryrun``, known once the DAG is being built, which is why the rules' params call
    this from a function, :func:`stage_config_param`) the path is named but no file is written,
    and the first call outside a dry run writes it. A content first named under one stage keeps
    that name when another stage's params hold the same content (as since the files began; the
    rules' stage configs are named while the Snakefile is parsed, so the names do not depend on
    the order Snakemake builds its jobs in).

    Args:
        results: the results folder. dryrun: whether this invocation is a dry run (default:
            never)."""

    def __init__(self, results: str, dryrun: Callable[[], bool] = lambda: False):
        self.results = results
        self.dryrun = dryrun
        self._paths: dict[str, str] = {}
        self._written: set[str] = set()

    @staticmethod
    def _text(data: Mapping) -> str:
        return json.dumps(data, sort_keys=True, indent=1) + "\n"

    def name(self, stage: str, data: Mapping) -> str:
        """``@path`` of the file that holds ``data`` (writes nothing): ``<stage>-<sha>.json``, or
        the name this content was given first in this invocation."""
        return self._name(stage, self._text(data))

    def _name(self, stage: str, text: str) -> str:
        if text not in self._paths:
            digest = hashlib.sha256(text.encode()).hexdigest()[:16]
            self._paths[text] = f"@{self.results}/configs/{stage}-{digest}.json"
        return self._paths[text]

    def __call__(self, stage: str, data: Mapping) -> str:
        """``@path`` of the file holding ``data`` (:meth:`name`), written unless it already holds
        it or this is a dry run."""
        text = self._text(data)
        ref = self._name(stage, text)
        if text not in self._written and not self.dryrun():
            path = Path(ref[1:])
            if not path.is_file() or path.read_text() != text:
                files.atomic_write_text(path, text)
            self._written.add(text)
        return ref


def stage_config_param(config_files: ConfigFiles, stage: str, data: Mapping) -> Callable:
    """A rule's ``params`` function giving ``config_files(stage, data)`` (``@path``). The name is
    given now (:meth:`ConfigFiles.name`, while the Snakefile is parsed); the file is written when
    Snakemake calls the function, building the DAG, when it knows whether this is a dry run (the
    value itself, computed while parsing, would write it before that is known)."""
    config_files.name(stage, data)

    def param(wildcards) -> str:
        return config_files(stage, data)

    return per_job(param)
