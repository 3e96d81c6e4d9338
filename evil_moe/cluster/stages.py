"""The one table of the workflow's stages: per stage the config it reads (its params: editing
anything else does not rerun it), the rules that run it, whose job size it takes, its thread-count
key, whether it loads a model (a GPU on a cuda config), whether it is light, and whether its
jobs grade completions in the sandbox. ``rules/common.smk`` (each rule's ``params.cfg``),
:mod:`evil_moe.cluster.resources` (job sizes) and :mod:`evil_moe.cluster.slurm_check` (the
preflight) read their views of it from here. Imports nothing of the package.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Stage", "TABLE", "STAGE_SECTIONS", "RULE_STAGE", "GRADING_RULES", "SIZE_STAGES",
           "THREAD_KEYS", "MODEL_STAGES", "LIGHT_STAGES"]


@dataclass(frozen=True)
class Stage:
    """One stage of the workflow.

    Attributes:
        name: the stage (``get_stage_config(name)`` in the rules; a job size of its own unless
            ``size`` names another's).
        sections: the config it reads: a whole section, or ``"section.key"`` for one key (the toy
            models need ``pilot.max_new``, not every pilot knob); None: no config (a converter).
        rules: the rules that run it (their jobs take the stage's size).
        size: the stage whose job size its rules take (None: its own).
        threads: the config section holding its torch thread count (None: one thread).
        model: it loads the student or teacher and runs it (a GPU on a cuda config).
        light: one thread, the base memory, the minimum time.
        grading: its jobs grade completions in the sandbox (the bubblewrap preflight checks
            their partitions).
    """

    name: str
    sections: tuple[str, ...] | None
    rules: tuple[str, ...]
    size: str | None = None
    threads: str | None = None
    model: bool = False
    light: bool = False
    grading: bool = False


_PILOT_SECTIONS = ("problems", "grader", "models", "adapter", "vhack", "pilot", "moe", "audit")
# Sections only the arms that name them in their ``Arm.sections`` read (the monitor penalty,
# inoculation prompting, Advantage Modification): the pilot rule passes each to those arms only,
# so an overlay that sets one reruns just them.
ARM_SECTIONS = ("penalty", "inoculation", "advantage_mod")

TABLE: tuple[Stage, ...] = (
    Stage("problems", ("problems",), ("problems",), light=True),
    Stage("toy_models", ("toy", "problems", "adapter", "grader", "pilot.max_new"), ("toy_model",),
          threads="toy", grading=True),
    Stage("convert_smollm2", None, ("convert_smollm2",), light=True),
    Stage("make_teacher", ("problems", "grader", "models", "sft", "teacher.elicit", "teacher.temperature",
                           "teacher.top_p", "teacher.max_new", "teacher.batch_prompts", "vhack.known_modes",
                           "pilot.group", "pilot.prompts_per_step", "pilot.max_new", "pilot.betas"),
          ("make_teacher",), threads="sft", model=True, grading=True),
    Stage("teacher", ("problems", "grader", "models", "teacher"), ("teacher",), threads="teacher",
          model=True, grading=True),
    Stage("extract", ("problems", "models", "adapter", "vhack", "moe.pairs", "pilot.group",
                      "pilot.prompts_per_step", "pilot.max_new", "pilot.temperature"),
          ("extract",), threads="vhack", model=True),
    Stage("distill", ("problems", "models", "adapter", "distill", "pilot.group", "pilot.prompts_per_step",
                      "pilot.max_new", "pilot.temperature", "pilot.betas"),
          ("distill",), threads="distill", model=True),
    Stage("pilot", _PILOT_SECTIONS + ARM_SECTIONS, ("pilot", "fold_pilot", "level_pilot"), threads="pilot", model=True,
          grading=True),
    Stage("reevaluate", ("problems", "grader", "models", "adapter", "pilot", "reevaluate"), ("reevaluate",),
          threads="pilot", model=True, grading=True),
    Stage("compare", ("pilot", "compare", "vhack.known_modes", "moe.forward"),
          ("compare", "sweep_compare", "fold_compare", "reeval_compare"), light=True),
    # a calibration run is a vanilla pilot on audit.seeds: it grades its rollouts in the sandbox
    Stage("calibrate", _PILOT_SECTIONS, ("calibrate",), size="pilot", grading=True),
    Stage("audit", ("audit", "pilot.detector_quantile"), ("audit",), size="compare"),
    Stage("detector_sweep", ("pilot", "compare", "detector_sweep"), ("detector_sweep",), size="compare"),
    Stage("planted_vhack", ("problems", "models", "adapter", "toy"), ("planted_vhack",), size="extract"),
    Stage("planted_checks", ("pilot", "compare"), ("planted_checks",), size="compare"),
)

# Views of the table, for the modules that read one aspect of it.
STAGE_SECTIONS: dict[str, list[str]] = {s.name: list(s.sections) for s in TABLE if s.sections is not None}
RULE_STAGE: dict[str, str] = {rule: s.size or s.name for s in TABLE for rule in s.rules}
GRADING_RULES: tuple[str, ...] = tuple(rule for s in TABLE if s.grading for rule in s.rules)
SIZE_STAGES: tuple[str, ...] = tuple(s.name for s in TABLE if s.size is None)
THREAD_KEYS: dict[str, str] = {s.name: s.threads for s in TABLE if s.threads}
MODEL_STAGES: tuple[str, ...] = tuple(s.name for s in TABLE if s.model)
LIGHT_STAGES: tuple[str, ...] = tuple(s.name for s in TABLE if s.light)
