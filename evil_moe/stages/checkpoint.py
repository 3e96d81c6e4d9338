"""A stage's resumable state on disk (the pilot's ``checkpoint.pt``, make-teacher's): written
atomically with its content hash (:mod:`evil_moe.files`), read back only when it is intact.

A checkpoint is a cache of work done: a damaged one (a flipped bit, a copy cut short, a disk
that filled while it was written by another tool) is never trusted and never blocks a rerun.
:func:`read_checkpoint` names the file and the cause in one line, removes it and lets the stage
start afresh from step 0 (the same outputs, since a run is a function of its config and seed);
:func:`write_checkpoint` names the file when it cannot be written (a full disk) and leaves the
previous checkpoint as it was, so the next run resumes from there.
"""

from __future__ import annotations

import io
from pathlib import Path

import torch

from evil_moe import files


class CheckpointNotWritten(OSError):
    """The checkpoint could not be written (one line: the file, the cause, where a rerun
    resumes)."""


def write_checkpoint(path: str | Path, state: dict, resumes_from: str) -> None:
    """Serialise ``state`` (``torch.save``) in memory, then write it atomically with its SHA-256
    recorded beside it (:func:`evil_moe.files.atomic_write_bytes`).

    Args:
        path: the checkpoint file. state: what :func:`read_checkpoint` gives back.
        resumes_from: where a rerun resumes if this write fails (``"its last checkpoint"``,
            ``"step 0"``), said in the error.

    Raises:
        CheckpointNotWritten: the write failed (``No space left on device``, ...); the message
            names the file and the cause, and the previous checkpoint is left as it was.
    """
    buf = io.BytesIO()
    torch.save(state, buf)
    try:
        files.atomic_write_bytes(path, buf.getvalue())
    except OSError as err:
        raise CheckpointNotWritten(err.errno, f"{err.strerror}; the run stopped: make room and run "
                                              f"it again, it resumes from {resumes_from}") from None


def read_checkpoint(path: str | Path, who: str, required: tuple[str, ...] = ()) -> dict | None:
    """The state saved by :func:`write_checkpoint` at ``path``; None when there is none, or when
    it is damaged: its bytes are not those recorded when it was written
    (:func:`evil_moe.files.check_intact`), ``torch.load`` cannot read it, it is not a dict, or it
    lacks a key of ``required``. A damaged checkpoint is removed, and one line says so, naming
    the file and the cause: ``{who}: checkpoint <path> is damaged (<cause>): removed it,
    starting afresh from step 0``.
    """
    path = Path(path)
    if not path.exists():
        return None
    try:
        files.check_intact(path)
        state = torch.load(path, weights_only=False)
        if not isinstance(state, dict):
            raise ValueError(f"holds a {type(state).__name__}, not a checkpoint")
        missing = [k for k in required if k not in state]
        if missing:
            raise ValueError(f"no {missing[0]!r} in it")
    except Exception as err:  # noqa: BLE001 - any failure to read resume state means: start afresh
        cause = " ".join(str(err).split()) or type(err).__name__
        if isinstance(err, files.DamagedFile):  # its message names the file; keep the cause
            cause = "its SHA-256 is not the one recorded when it was written"
        print(f"{who}: checkpoint {path} is damaged ({cause[:300]}): removed it, starting afresh "
              "from step 0", flush=True)
        files.remove(path)
        return None
    return state


__all__ = ["write_checkpoint", "read_checkpoint", "CheckpointNotWritten"]
