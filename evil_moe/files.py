"""The ground floor for files: atomic writes, TSV and JSON-lines readers and writers, required
inputs. It imports nothing of the package, so every layer (env, model, rl, gate, stages, the
Snakefile) writes and reads files through it (docs/internals.md, "Floors").

Every writer here is atomic: the bytes go to a temporary file in the target's folder, are
flushed to disk and renamed over the target (``os.replace``), so a reader, Snakemake or a
resumed run never sees a half-written file; the file's mode honours the umask (results are
shared on clusters), whichever library wrote the bytes. Column-checked TSV writing (``write_tsv``) is in :mod:`evil_moe.tables`,
which defines the columns and writes through :func:`atomic_write_bytes`.
"""

from __future__ import annotations

import contextlib
import csv
import gzip
import io
import json
import os
import tempfile
from pathlib import Path
from typing import Iterable, Iterator, Mapping, Sequence

__all__ = ["require_file", "atomic_path", "atomic_write_bytes", "atomic_write_text", "write_json",
           "write_jsonl", "write_jsonl_gz", "read_jsonl", "read_tsv", "read_tsv_rows"]


def require_file(path: str | os.PathLike, what: str) -> Path:
    """Return ``Path(path)``.

    Raises:
        FileNotFoundError: nothing at ``path``; the message names ``what`` and the path.
    """
    p = Path(path)
    if not p.exists():
        raise FileNotFoundError(f"{what} not found: {p}")
    return p


def _umask_mode() -> int:
    """``0o666`` less the process's umask: the mode a plain ``open`` would give a new file. The
    umask is read from ``/proc/self/status`` where it can be (setting it to read it would leave
    it 0 for a moment to the process's other threads: the grader's), else set and restored."""
    try:
        status = Path("/proc/self/status").read_text()
        umask = int(status.split("\nUmask:", 1)[1].split()[0], 8)
    except (OSError, IndexError, ValueError):
        umask = os.umask(0)
        os.umask(umask)
    return 0o666 & ~umask


def _temp_in(folder: Path, name: str) -> tuple[int, str]:
    """A new temporary file beside ``folder/name`` (mode from the umask, not mkstemp's 0600)."""
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=f".{name}.", suffix=".tmp")
    os.fchmod(fd, _umask_mode())
    return fd, tmp


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[Path]:
    """For writers that take a path (``torch.save``, safetensors, ``savefig``): yield a temporary
    path in ``path``'s folder (parents created); when the block finishes, give it the umask's
    mode (whatever mode the writer created it with: safetensors' is 0600) and rename it to
    ``path``; when it raises, remove it and re-raise.

    Example::

        with atomic_path(out / "adapter.safetensors") as tmp:
            save_file(tensors, str(tmp))
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = _temp_in(path.parent, path.name)
    os.close(fd)
    try:
        yield Path(tmp)
        os.chmod(tmp, _umask_mode())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> None:
    """Write ``data`` to ``path`` via a temporary file in the same folder (flushed and fsynced)
    and ``os.replace``; parent folders are created."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = _temp_in(path.parent, path.name)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def atomic_write_text(path: str | os.PathLike, text: str) -> None:
    """Atomically write ``text`` (UTF-8) to ``path``."""
    atomic_write_bytes(path, text.encode())


def write_json(path: str | os.PathLike, obj) -> None:
    """Atomically write ``obj`` as indented JSON with a final newline."""
    atomic_write_bytes(path, (json.dumps(obj, indent=2, sort_keys=False) + "\n").encode())


def write_jsonl(path: str | os.PathLike, records: Iterable[Mapping]) -> None:
    """Atomically write records as plain JSON lines."""
    atomic_write_bytes(path, "".join(json.dumps(rec) + "\n" for rec in records).encode())


def write_jsonl_gz(path: str | os.PathLike, records: Iterable[Mapping]) -> None:
    """Atomically write records as gzip-compressed JSON lines (gzip mtime 0, so the bytes are
    reproducible)."""
    buf = io.BytesIO()
    with gzip.GzipFile(fileobj=buf, mode="wb", mtime=0) as gz:
        for rec in records:
            gz.write((json.dumps(rec) + "\n").encode())
    atomic_write_bytes(path, buf.getvalue())


def iter_jsonl(path: str | os.PathLike) -> Iterator[tuple[int, dict]]:
    """``(line number, object)`` for each non-blank line of a JSON-lines file, gzip or plain (by
    the ``.gz`` suffix), read lazily.

    Raises:
        FileNotFoundError: naming the path.
        ValueError: a line that is not JSON or not a JSON object, naming the path and the line.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no such file: {path}")
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as fh:
        for n, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(f"{path}:{n}: not a JSON line ({e.msg})") from None
            if not isinstance(row, dict):
                raise ValueError(f"{path}:{n}: not a JSON object")
            yield n, row


def read_jsonl(path: str | os.PathLike) -> list[dict]:
    """Every object of a JSON-lines file (:func:`iter_jsonl`: gzip or plain, blank lines skipped;
    the same errors)."""
    return [row for _, row in iter_jsonl(path)]


def read_tsv(path: str | os.PathLike, required: Sequence[str]):
    """Read a TSV into a pandas DataFrame and check it has the ``required`` columns.

    Raises:
        FileNotFoundError: no file at ``path``.
        ValueError: a required column is missing (names the file and the column).
    """
    import pandas as pd

    df = pd.read_csv(path, sep="\t", keep_default_na=True)
    missing = [c for c in required if c not in df.columns]
    if missing:
        raise ValueError(f"{path}: missing column {missing[0]!r} (has: {', '.join(map(str, df.columns))})")
    return df


def read_tsv_rows(path: str | os.PathLike) -> list[dict[str, str]]:
    """Read a TSV as a list of ``{column: text}`` dicts, every value left as its text (no type
    guessing: problem ids such as ``"3249"`` stay strings; empty cells are ``""``). For tables
    that are checked or compared field by field; :func:`read_tsv` gives a DataFrame.

    Raises:
        FileNotFoundError: no file at ``path``.
    """
    with open(path, newline="") as fh:
        return list(csv.DictReader(fh, delimiter="\t"))
