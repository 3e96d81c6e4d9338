"""The run config's cross-key checks against the rest of the package: the arm set against the
arm registry (matched controls, the positive control, the test switches), the detector's
calibration against the detector registry, the pilot's GPU memory model against the resource
model.

:mod:`evil_moe.config` is a leaf (schema, defaults, per-key errors) and cannot import the arm
registry or the resource model; these checks sit one floor up, and both entry points call them:
the CLI and the Slurm preflight (:mod:`evil_moe.cluster.slurm_check`) through
:func:`load_run_config` and the Snakefile through :func:`check_run_config` (``rules/common.smk``),
so a bad config is refused before any job runs with the same sentence.
"""

from __future__ import annotations

from pathlib import Path
from typing import Iterable, Mapping

from evil_moe.cluster.shapes import ResourceError
from evil_moe.cluster.gpu_memory import check_gpu_fit
from evil_moe.config import Config, ConfigError, merge_sources, validate
from evil_moe.rl.arms.registry import ARMS, check_arm_set
from evil_moe.rl.detectors.registry import DETECTORS

__all__ = ["check_run_config", "load_run_config"]


def check_run_config(data: dict) -> dict:
    """Validate ``data`` (:func:`evil_moe.config.validate`: the schema, defaults filled), then
    the cross-key checks of this module.

    Returns:
        the validated dict (defaults filled; ``data`` is not modified).

    Raises:
        ConfigError: what :func:`evil_moe.config.validate` raises; an arm set without vanilla,
            a listed arm's matched control or the positive control, or a test switch naming an
            arm that does not run (names what is missing); a thresholded detector with a
            calibration it does not take (``teacher`` for the probe); on a cuda config, a pilot whose GPU
            memory model exceeds ``models.gpu_mem_gb`` (names the key to lower, e.g.
            ``pilot.micro_batch``) or that cannot be sized (names ``models.params``).
    """
    data = validate(data)
    if isinstance(data.get("pilot"), dict) and isinstance(data.get("compare"), dict):
        _check_arms(data)
    if isinstance(data.get("pilot"), dict):
        _check_detector_calibration(data["pilot"])
        _check_penalty(data)
        _check_pilot_keys(data["pilot"])
    _check_gpu_memory(data)
    return data


def load_run_config(files: Iterable[str | Path] = (), overrides: Iterable[str] = (),
                    data: Mapping | None = None) -> Config:
    """:func:`evil_moe.config.load_config` with the cross-key checks (:func:`check_run_config`):
    what the CLI builds each stage's config with.

    Raises:
        ConfigError: as :func:`check_run_config`, or a missing or unreadable config file
            (names the path).
    """
    return Config(check_run_config(merge_sources(files, overrides, data)))


def _check_gpu_memory(data: dict) -> None:
    """On a cuda config, the pilot's memory model must fit ``models.gpu_mem_gb``
    (:func:`evil_moe.cluster.gpu_memory.check_gpu_fit`): one ConfigError naming the key to change."""
    if not all(isinstance(data.get(k), dict) for k in ("models", "pilot", "problems", "adapter")):
        return
    if not str(data["models"].get("device", "")).startswith("cuda"):
        return
    try:
        check_gpu_fit(data)
    except ResourceError as err:
        raise ConfigError(str(err)) from None


def _check_detector_calibration(pilot: dict) -> None:
    """A thresholded detector's ``pilot.detector_calibration`` must be one it declares
    (:attr:`evil_moe.rl.detectors.registry.Detector.calibrations`: ``teacher`` thresholds the
    gradient detector only, the teacher completions having no probe scores). One ConfigError
    naming the key."""
    det = DETECTORS.get(pilot.get("detector"))
    cal = pilot.get("detector_calibration")
    if det is not None and det.thresholded() and cal not in det.calibrations:
        raise ConfigError(f"config key 'pilot.detector_calibration': {cal} does not threshold the "
                          f"{det.name} detector; use {' or '.join(det.calibrations)} with pilot.detector {det.name}")


def _check_penalty(data: dict) -> None:
    """``penalty.mode progressive`` weighs the penalty by the detector's score: with an arm that
    penalises by the run's detector, that detector must have one (``noisy_label`` has none). One
    ConfigError naming the keys."""
    pilot, penalty = data.get("pilot"), data.get("penalty")
    if not isinstance(penalty, dict) or penalty.get("mode") != "progressive":
        return
    det = DETECTORS.get(pilot.get("detector"))
    arms = [a for a in pilot.get("arms", []) if a in ARMS and ARMS[a].penalises and ARMS[a].flags_with_detector()]
    if det is not None and det.unit is None and arms:
        raise ConfigError(f"config key 'penalty.mode': progressive weighs {arms[0]}'s penalty by the detector's "
                          f"score and pilot.detector {det.name} has none; use penalty.mode threshold or a "
                          f"detector with a score ({', '.join(n for n, c in DETECTORS.items() if c.unit)})")


def _check_pilot_keys(pilot: dict) -> None:
    """Pilot keys that would be ignored: ``pilot.detector_accuracy`` without the noisy_label
    detector (the only one that reads it), ``pilot.eval_every`` not below ``pilot.steps`` (no
    evaluation along the run: the trajectory would hold the final one only).

    Raises:
        ConfigError: one line naming the key and the cause."""
    acc, det = pilot.get("detector_accuracy"), pilot.get("detector")
    if acc is not None and det != "noisy_label":
        raise ConfigError(f"config key 'pilot.detector_accuracy': {acc} is read only by the noisy_label detector, "
                          f"and pilot.detector is {det}; set pilot.detector noisy_label or leave it null")
    every, steps = pilot.get("eval_every") or 0, pilot.get("steps")
    if every and isinstance(steps, int) and every >= steps:
        raise ConfigError(f"config key 'pilot.eval_every': {every} is not below pilot.steps {steps}, so no "
                          "evaluation would run along the training; use a smaller value, or 0 for the final "
                          "evaluation only")


def _check_arms(data: dict) -> None:
    """Cross-key check of the arm set (``pilot.arms`` against the arms' matched controls and
    ``compare.positive_control``, and the test switches ``pilot.fail_arm`` /
    ``pilot.fail_once_arm`` against ``pilot.arms``): one ConfigError naming what is wrong."""
    try:
        check_arm_set(data["pilot"]["arms"], data["compare"].get("positive_control"))
    except ValueError as err:
        raise ConfigError(str(err)) from None
    for key in ("fail_arm", "fail_once_arm"):  # the test switches must name an arm that runs
        arm = data["pilot"].get(key)
        if arm is not None and arm not in data["pilot"]["arms"]:
            raise ConfigError(f"config key 'pilot.{key}': {arm!r} is not in pilot.arms "
                              f"{data['pilot']['arms']}")
