"""The one reader of pilot folders (``results/pilots/{arm}/s{seed}/``, and the re-evaluation's,
the detector sweep's and the calibration runs' of the same shape): what a finished pilot left —
``status.json``, ``steps.tsv``, ``outcomes.tsv``, ``trajectory.tsv``, ``rows.tsv`` and
``scores.safetensors`` — read
and checked in one place (each file against the SHA-256 recorded beside it when it was written:
:func:`evil_moe.files.check_intact`), for the gate (:mod:`evil_moe.stages.compare`), the planted
world's checks, the detector sweep, the re-evaluation and the detector audit. Like
:mod:`evil_moe.tables` it sits low: it imports only :mod:`evil_moe.files` (the arm registry's
answers and the collapse rule, where needed, come in as arguments).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Collection, Iterable, Sequence

import numpy as np
import pandas as pd

from evil_moe import files

#: The columns of ``outcomes.tsv`` the gate reads (one row per held-out completion).
OUTCOME_COLUMNS = ("arm", "view", "seed", "step", "problem_id", "sample", "mode", "hack", "pass", "truncated")
#: The columns of ``steps.tsv`` a pilot must have to be judged.
STEPS_REQUIRED = ("step", "hack_rate", "pass_rate", "frac_clipped", "cin", "null_cin")
# a bound is exceeded only beyond float noise
_EPS = 1e-12


@dataclass(frozen=True)
class PilotRun:
    """One pilot's folder: ``path`` holds ``steps.tsv``, ``eval.tsv``, ``outcomes.tsv`` and
    ``status.json``."""

    arm: str
    seed: int
    path: Path


@dataclass
class Pilot:
    """A pilot as read: its status and data (``None`` where missing).

    Attributes:
        run: the folder.
        status: ``ok``, ``invalid`` or ``missing``; ``reason`` says why.
        steps: ``steps.tsv`` sorted by step; ``outcomes``: ``outcomes.tsv`` (ids as text).
        trajectory: ``trajectory.tsv`` (the evaluations along the run, ``pilot.eval_every``;
            the columns of ``outcomes``), or None where the pilot wrote none.
        frac_clipped_max: the largest clip fraction of any step (None when not recorded).
        isolation: the grader's isolation level (``status.json``).
    """

    run: PilotRun
    status: str
    reason: str
    steps: pd.DataFrame | None = None
    outcomes: pd.DataFrame | None = None
    frac_clipped_max: float | None = None
    isolation: str | None = None
    trajectory: pd.DataFrame | None = None


def pilot_from_path(path: str | Path, arms: Collection[str]) -> PilotRun:
    """A :class:`PilotRun` from a pilot folder ``.../{arm}/s{seed}`` whose ``arm`` is one of
    ``arms`` (the registry's names); otherwise the arm and seed are read from the first row of
    its ``steps.tsv``.

    Raises:
        ValueError: neither the path nor a readable ``steps.tsv`` gives the arm and seed (names
            the path).
    """
    path = Path(path)
    m = re.fullmatch(r"s(\d+)", path.name)
    if m and path.parent.name in arms:
        return PilotRun(path.parent.name, int(m.group(1)), path)
    steps = path / "steps.tsv"
    if steps.is_file():
        df = pd.read_csv(steps, sep="\t", nrows=1)
        if {"arm", "seed"} <= set(df.columns) and len(df):
            return PilotRun(str(df["arm"].iloc[0]), int(df["seed"].iloc[0]), path)
    raise ValueError(f"cannot tell the arm and seed of pilot folder {path}: expected "
                     f".../{{arm}}/s{{seed}} or a steps.tsv with arm and seed columns")


def read_pilot(run: PilotRun, max_frac_clipped: float = 0.5, *, trains: bool = True,
               collapsed: Callable[[list[dict]], str | None] | None = None) -> Pilot:
    """Read one pilot folder and decide whether it is valid.

    Args:
        run: the folder.
        max_frac_clipped: a step clipping more makes the pilot invalid (``pilot.max_frac_clipped``).
        trains: the arm trains (False: the untrained reference, evaluated only: no steps to check).
        collapsed: the collapse rule applied to the steps' rows (``steps.tsv`` rows in step order
            as dicts, empty cells None), returning why they show a collapse or None
            (:func:`evil_moe.rl.trainer.collapse.collapsed` under the config's ``pilot``
            section); None: not applied.

    Returns:
        A :class:`Pilot` whose ``status`` is ``ok``, ``invalid`` (``status.json`` says so, also
        where a stop rule left no tables; no steps, a clip fraction over the bound / not
        recorded, a collapse; a file changed since it was written, then without data) or
        ``missing`` (no folder, ``status.json``, ``steps.tsv`` or ``outcomes.tsv``), with
        ``reason`` saying why.

    Raises:
        ValueError: ``steps.tsv`` lacks a column in :data:`STEPS_REQUIRED`, or ``outcomes.tsv``
            one of :data:`OUTCOME_COLUMNS` (names the file and the column).
    """
    p = Path(run.path)
    if not p.is_dir():
        return Pilot(run, "missing", f"no pilot folder {p}")
    state, why, isolation = _status(p / "status.json")
    stopped = f"status {state}" + (f" ({why})" if why else "")
    for name in ("status.json", "steps.tsv", "outcomes.tsv"):
        if not (p / name).is_file():
            if state not in ("ok", "missing"):  # a stop rule (a NaN, a collapse) left no tables
                return Pilot(run, "invalid", stopped)
            return Pilot(run, "missing", f"no {p / name}")
    try:
        steps = files.read_tsv(p / "steps.tsv", STEPS_REQUIRED).sort_values("step", kind="stable")
        outcomes = files.read_tsv(p / "outcomes.tsv", OUTCOME_COLUMNS)
        trajectory = (files.read_tsv(p / "trajectory.tsv", OUTCOME_COLUMNS) if (p / "trajectory.tsv").is_file()
                      else None)
    except files.DamagedFile as err:  # changed since the pilot wrote it: never judged
        return Pilot(run, "invalid", str(err))
    text = {"arm": str, "view": str, "problem_id": str, "mode": str}
    outcomes = outcomes.astype(text)
    fc = pd.to_numeric(steps["frac_clipped"], errors="coerce")
    fc_max = float(fc.max()) if fc.notna().any() else None
    pilot = Pilot(run, "ok", "ok", steps, outcomes, fc_max, isolation,
                  None if trajectory is None else trajectory.astype(text))
    if state != "ok":
        pilot.status, pilot.reason = "invalid", stopped
    elif not trains:  # the untrained reference: evaluated only, no steps to check
        pass
    elif steps.empty:
        pilot.status, pilot.reason = "invalid", "steps.tsv has no rows"
    elif fc_max is None:
        pilot.status, pilot.reason = "invalid", "frac_clipped not recorded"
    elif fc_max > max_frac_clipped + _EPS:
        pilot.status, pilot.reason = "invalid", f"frac_clipped {fc_max:.2f} > {max_frac_clipped:g}"
    elif collapsed is not None and (why := collapsed(
            steps.astype(object).where(steps.notna(), None).to_dict("records"))):
        pilot.status, pilot.reason = "invalid", why
    return pilot


def _status(path: Path) -> tuple[str, str | None, str | None]:
    """A pilot's ``status.json`` as ``(status, reason, isolation)``; ``missing``, or ``unreadable``
    (the reason says why: cut short, changed since it was written, not a JSON object)."""
    if not path.is_file():
        return "missing", None, None
    try:
        status = files.read_json(path, "pilot status")
        return str(status.get("status")), status.get("reason"), status.get("isolation")
    except files.DamagedFile as err:
        return "unreadable", str(err), None
    except (AttributeError, OSError) as err:
        return "unreadable", f"{path} is not a JSON object ({err})", None


def last_step_outcomes(pilots: Iterable[Pilot]) -> pd.DataFrame:
    """Per-completion outcomes of the pilots' last evaluated step, per (arm, view, seed)."""
    frames = []
    for p in pilots:
        o = p.outcomes
        if o is None or o.empty:
            continue
        last = o.groupby(["view"])["step"].transform("max")
        frames.append(o[o["step"] == last])
    if not frames:
        return pd.DataFrame(columns=list(OUTCOME_COLUMNS))
    return pd.concat(frames, ignore_index=True)


def finished_pilot(path: str | Path) -> tuple[dict[str, Path], dict, str, int]:
    """A finished pilot's files — ``{"status", "adapter", "steps", "outcomes"}`` paths — its
    ``status.json``, and its arm and seed from the first row of its ``steps.tsv`` (what a
    re-evaluation reads: :mod:`evil_moe.stages.reevaluate`).

    Raises:
        FileNotFoundError: the folder or one of the files is missing (names the path).
        ValueError: the pilot did not finish (``status`` not ``ok``); its ``steps.tsv`` is empty.
        evil_moe.files.DamagedFile: its ``status.json``, adapter or ``steps.tsv`` changed since
            the pilot wrote it (names it).
    """
    src = Path(path)
    if not src.is_dir():
        raise FileNotFoundError(f"pilot folder not found: {src}")
    paths = {"status": files.require_file(src / "status.json", "pilot status"),
             "adapter": files.require_file(src / "adapter.safetensors", "pilot adapter"),
             "steps": files.require_file(src / "steps.tsv", "pilot steps"),
             "outcomes": files.require_file(src / "outcomes.tsv", "pilot outcomes")}
    status = files.read_json(paths["status"], "pilot status")
    files.check_intact(paths["adapter"])  # before any model is loaded
    if status.get("status") != "ok":
        raise ValueError(f"{paths['status']}: the pilot did not finish (status {status.get('status')!r})")
    first = next(iter(files.read_tsv_rows(paths["steps"])), None)
    if first is None:
        raise ValueError(f"{paths['steps']}: no steps")
    return paths, status, first["arm"], int(first["seed"])


def scored_rows(path: str | Path, required: Sequence[str] = ()
                ) -> tuple[pd.DataFrame, dict[str, np.ndarray] | None] | None:
    """A pilot's training rollouts (``rows.tsv``, :data:`evil_moe.tables.AUDIT_ROWS`; ``required``
    columns checked) and its per-row arrays (``scores.safetensors``: ``placebo``, ``hidden``, in
    ``rows.tsv`` order; None without the file); None when the folder has no ``rows.tsv``.

    Raises:
        ValueError: a required column is missing (names the file and the column).
        evil_moe.files.DamagedFile: either file changed since it was written (names it).
    """
    from safetensors.numpy import load_file

    rows_path, arr_path = Path(path) / "rows.tsv", Path(path) / "scores.safetensors"
    if not rows_path.is_file():
        return None
    arrays = load_file(str(files.check_intact(arr_path))) if arr_path.is_file() else None
    return files.read_tsv(rows_path, required), arrays


__all__ = ["OUTCOME_COLUMNS", "STEPS_REQUIRED", "PilotRun", "Pilot", "pilot_from_path", "read_pilot",
           "last_step_outcomes", "finished_pilot", "scored_rows"]
