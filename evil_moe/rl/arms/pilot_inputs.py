"""The files a pilot of an arm reads, worked out once from the arm registry and the config: the
workflow's pilot rules (``rules/common.smk``: the rule's inputs and options) and the pilot stage
(:func:`evil_moe.stages.pilot.run_pilot`: which options a run refuses to start without) both call
:func:`pilot_inputs`, so an arm that needs a new input is one class attribute here and in
:mod:`evil_moe.rl.arms.registry`, plus its tests.

Paths are relative to the results folder (config key ``results``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

from evil_moe.rl.arms.registry import ARMS
from evil_moe.rl.detectors.registry import DETECTORS

__all__ = ["PilotInput", "pilot_inputs", "uses_detector"]


@dataclass(frozen=True)
class PilotInput:
    """One file a pilot reads.

    Attributes:
        path: under the results folder.
        option: the ``evil-moe pilot`` option that passes it (``--vhack``).
        needed: the pilot refuses to start without it (else it is passed and may go unread).
        why: the error when it is needed and not given (names the option).
        rule_input: the workflow waits for the file (False: passed as an option only; the audit
            writes ``probe.safetensors`` beside ``calibration.json``, which is the input).
    """

    path: str
    option: str
    needed: bool
    why: str
    rule_input: bool = True


def uses_detector(arm: str, detector: str) -> bool:
    """The arm flags with the run's ``detector`` (:meth:`evil_moe.rl.arms.base.Arm.flags_with_detector`:
    not a ceiling, not a random-flag control) and that detector is thresholded
    (:meth:`evil_moe.rl.detectors.registry.Detector.thresholded`): the arm waits for the detector
    audit, which the gate then reads."""
    return ARMS[arm].flags_with_detector() and DETECTORS[detector].thresholded()


def pilot_inputs(arm: str | None, cfg: Mapping, *, vhack_name: str = "main", tree: str = "pilots",
                 seed: int | str = "{seed}") -> dict[str, PilotInput]:
    """The files a pilot of ``arm`` reads, by input name, in the order the workflow lists them.

    Args:
        arm: a name of :data:`evil_moe.rl.arms.registry.ARMS`, or None for the inputs every pilot reads
            (a calibration run's).
        cfg: the validated config as a mapping of sections (Snakemake's ``config`` or
            ``Config.raw``); reads ``pilot.init``, ``pilot.mix_ratio``, ``pilot.detector`` and
            ``pilot.detector_calibration``.
        vhack_name: the v_hack the run projects along (``main``; ``fold_{mode}`` in the
            leave-one-mode-out sweep).
        tree: the folder of the run's pilots (``pilots``; ``sweep/folds/{mode}``): a random-flag
            control reads its matched arm's ``steps.tsv`` there.
        seed: the run's seed (for the matched arm's ``steps.tsv``).

    Returns:
        ``{name: PilotInput}``: ``problems``, ``vhack``, ``random_vhack`` always; ``planted_vhack``
        (an arm whose V is the planted direction), ``init`` (``pilot.init: distill``),
        ``teacher_rollouts`` (``pilot.mix_ratio > 0``), ``calibration`` and ``probe`` (an arm
        that flags with the detector, when the detector's threshold or probe comes from the
        audit) and ``match_flags`` (a random-flag control).

    Raises:
        KeyError: ``arm`` is not in the registry.
    """
    pc = cfg["pilot"]
    cls = ARMS[arm] if arm is not None else None
    out = {
        "problems": PilotInput("problems.jsonl", "--problems", True, "a pilot needs --problems"),
        "vhack": PilotInput(f"vhack/{vhack_name}_hack.safetensors", "--vhack", True,
                            "a pilot needs --vhack"),
        "random_vhack": PilotInput(f"vhack/{vhack_name}_random.safetensors", "--random-vhack",
                                   cls is not None and cls.vhack == "random",
                                   f"arm {arm} needs --random-vhack"),
    }
    if cls is not None and cls.vhack == "planted":
        out["planted_vhack"] = PilotInput("vhack/planted.safetensors", "--planted-vhack", True,
                                          f"arm {arm} needs --planted-vhack")
    if pc["init"] == "distill":
        out["init"] = PilotInput("distill/student_adapter.safetensors", "--init", True,
                                 "pilot.init distill needs --init")
    if pc["mix_ratio"] > 0:
        out["teacher_rollouts"] = PilotInput("teacher/rollouts.jsonl.gz", "--teacher-rollouts", True,
                                             "pilot.mix_ratio > 0 needs --teacher-rollouts")
    det = DETECTORS[pc["detector"]]
    if arm is not None and uses_detector(arm, pc["detector"]) and (
            pc["detector_calibration"] == "fpr" or det.fitted):
        out["calibration"] = PilotInput(
            "audit/calibration.json", "--calibration", pc["detector_calibration"] == "fpr",
            f"arm {arm} under pilot.detector_calibration fpr needs --calibration "
            "(results/audit/calibration.json, the detector audit's)")
        if det.fitted:  # written beside calibration.json, which is the rule's input
            out[det.fitted] = PilotInput(
                f"audit/{det.fitted}.safetensors", f"--{det.fitted}", True,
                f"arm {arm} with pilot.detector {det.name} needs --{det.fitted} "
                f"(results/audit/{det.fitted}.safetensors)", rule_input=False)
    if cls is not None and cls.matches:
        out["match_flags"] = PilotInput(
            f"{tree}/{cls.matches}/s{seed}/steps.tsv", "--match-flags", True,
            f"arm {arm} flags at {cls.matches}'s per-step rate: it needs --match-flags "
            f"(results/{tree}/{cls.matches}/s{seed}/steps.tsv)")
    return out
