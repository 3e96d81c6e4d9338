"""The ground floor for files: atomic writes, TSV and JSON-lines readers and writers, required
inputs, and the content hash that lets a later reader notice damage. It imports nothing of the
package, so every layer (env, model, rl, gate, stages, the Snakefile) writes and reads files
through it (docs/internals.md, "Floors").

Every writer here is atomic: the bytes go to a temporary file in the target's folder, are
flushed to disk and renamed over the target (``os.replace``), so a reader, Snakemake or a
resumed run never sees a half-written file; the file's mode honours the umask (results are
shared on clusters), whichever library wrote the bytes. Column-checked TSV writing
(``write_tsv``) is in :mod:`evil_moe.tables`, which defines the columns and writes through
:func:`atomic_write_bytes`.

Every writer also records the file's SHA-256 beside it, in ``.<name>.sha256`` (``sha256sum``'s
format: ``cd <folder> && sha256sum -c .<name>.sha256`` checks it by hand), and every reader here
checks it (:func:`check_intact`): a file changed after it was written (a flipped bit, a copy cut
short, a full disk) is refused with one line naming it, the cause and what to do
(:class:`DamagedFile`), instead of being read as other numbers. A file without the record (one
the user supplies, or one written before records existed) is read unchecked; parse errors still
name the file.
"""

from __future__ import annotations

import contextlib
import csv
import gzip
import hashlib
import io
import json
import os
import tempfile
import zlib
from pathlib import Path
from typing import Iterable, Iterator, Mapping, Sequence

__all__ = ["require_file", "atomic_path", "atomic_write_bytes", "atomic_write_text", "write_json",
           "write_jsonl", "write_jsonl_gz", "read_jsonl", "read_json", "read_tsv", "read_tsv_rows",
           "DamagedFile", "check_intact", "hash_record", "remove", "sha256_of"]


class DamagedFile(ValueError):
    """A file is not what was written: its content's SHA-256 is not the one recorded beside it
    when it was written, or it cannot be parsed (cut short, not gzip, not JSON). The one-line
    message names the file, the cause and what to do."""


REMAKE = "remove it and run again (the workflow remakes it)"


def hash_record(path: str | os.PathLike) -> Path:
    """Where the SHA-256 of ``path`` is recorded when it is written: ``.<name>.sha256`` beside
    it."""
    p = Path(path)
    return p.with_name(f".{p.name}.sha256")


def remove(path: str | os.PathLike) -> None:
    """Remove a file the workflow wrote and its hash record (:func:`hash_record`); either may
    be missing already."""
    Path(path).unlink(missing_ok=True)
    hash_record(path).unlink(missing_ok=True)


def sha256_of(path: str | os.PathLike) -> str:
    """The SHA-256 of a file's bytes (hex), read in 1 MiB blocks."""
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def check_intact(path: str | os.PathLike) -> Path:
    """Check that ``path``'s bytes are those its writer recorded (:func:`hash_record`); returns
    ``Path(path)``. Without a record (a file the user supplies, or one written before records
    existed) nothing is checked.

    Raises:
        DamagedFile: the SHA-256 differs from the record (or the record itself is unreadable);
            the message names the file and says what to do: remove it and run again, or, for a
            change made on purpose, remove the record.
    """
    p = Path(path)
    record = hash_record(p)
    try:
        text = record.read_text()
    except FileNotFoundError:
        return p
    except (OSError, UnicodeDecodeError) as err:
        raise DamagedFile(f"{record}: unreadable hash record of {p} ({err}); remove the record "
                          f"to read {p.name} unchecked") from None
    want = text.split(" ", 1)[0].strip()
    got = sha256_of(p)
    if got != want:
        raise DamagedFile(f"{p} is damaged: its SHA-256 is {got[:12]}…, not the {want[:12]}… recorded "
                          f"when it was written ({record.name}): {REMAKE}; if you changed it on purpose, "
                          f"remove {record.name} beside it")
    return p


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


def _written_beside(path: Path, data: bytes) -> str:
    """A new temporary file beside ``path`` holding ``data``, flushed and fsynced (removed if
    that fails). Returns its path."""
    fd, tmp = _temp_in(path.parent, path.name)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return tmp


def _commit(tmp: str, path: Path, digest: str | None) -> None:
    """Rename the finished temporary file ``tmp`` to ``path``, ``digest`` (its SHA-256) recorded
    first (:func:`hash_record`; None: no record). The record is written once the new bytes are
    on disk and before they are renamed into place: a run killed between the two renames leaves
    a record the old file does not match, so the file reads as damaged, never as complete; a
    write that fails before (a full disk) leaves the old file and its record as they were. On
    any failure ``tmp`` is removed; an OSError names ``path`` and the cause.
    """
    try:
        if digest is not None:
            record = hash_record(path)
            os.replace(_written_beside(record, f"{digest}  {path.name}\n".encode()), record)
        os.replace(tmp, path)
    except OSError as err:
        Path(tmp).unlink(missing_ok=True)
        raise OSError(err.errno, f"cannot write {path}: {err.strerror or err}") from None
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[Path]:
    """For writers that take a path (``savefig``, ``torch.save``, safetensors): yield a temporary
    path in ``path``'s folder (parents created); when the block finishes, give it the umask's
    mode (whatever mode the writer created it with), record its SHA-256 (:func:`hash_record`)
    and rename it to ``path``; when it raises, remove it and re-raise. A
    writer that can give its bytes (``torch.save`` to a buffer, ``safetensors.torch.save``)
    should use :func:`atomic_write_bytes`, whose errors name the file.

    Example::

        with atomic_path(out / "figure.svg") as tmp:
            fig.savefig(tmp)
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = _temp_in(path.parent, path.name)
    os.close(fd)
    try:
        yield Path(tmp)
        os.chmod(tmp, _umask_mode())
        digest = sha256_of(tmp)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    _commit(tmp, path, digest)


def atomic_write_bytes(path: str | os.PathLike, data: bytes, record: bool = True) -> None:
    """Write ``data`` to ``path`` via a temporary file in the same folder (flushed and fsynced)
    and ``os.replace``, its SHA-256 recorded beside it (:func:`hash_record`; ``record=False`` for
    a file of the repository, such as the README, that is no output); parent folders are
    created.

    Raises:
        OSError: naming ``path`` and the cause (``No space left on device``); ``path`` and its
            record are left as they were.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        tmp = _written_beside(path, data)
    except OSError as err:
        raise OSError(err.errno, f"cannot write {path}: {err.strerror or err}") from None
    _commit(tmp, path, hashlib.sha256(data).hexdigest() if record else None)


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
    the ``.gz`` suffix), read lazily, after :func:`check_intact`.

    Raises:
        FileNotFoundError: naming the path.
        DamagedFile: the file is not what was written, or is cut short or not gzip or not text
            (naming the path and the line reached).
        ValueError: a line that is not JSON or not a JSON object, naming the path and the line.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no such file: {path}")
    check_intact(path)
    opener = gzip.open if path.suffix == ".gz" else open
    n = 0
    try:
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
    except (EOFError, gzip.BadGzipFile, zlib.error, UnicodeDecodeError) as err:
        cause = "cut short" if isinstance(err, EOFError) else str(err)
        raise DamagedFile(f"{path} is damaged after line {n} ({cause}): {REMAKE}") from None


def read_json(path: str | os.PathLike, what: str = "file"):
    """The JSON value in ``path``, after :func:`check_intact`.

    Raises:
        FileNotFoundError: naming ``what`` and the path.
        DamagedFile: the file is not what was written, or is not JSON (cut short, say); the
            message names it, the cause and what to do.
    """
    p = require_file(path, what)
    check_intact(p)
    try:
        return json.loads(p.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        cause = (f"{err.msg}: line {err.lineno} column {err.colno}" if isinstance(err, json.JSONDecodeError)
                 else str(err))
        raise DamagedFile(f"{p} is damaged: not JSON ({cause}): {REMAKE}") from None


def read_jsonl(path: str | os.PathLike) -> list[dict]:
    """Every object of a JSON-lines file (:func:`iter_jsonl`: gzip or plain, blank lines skipped;
    the same errors)."""
    return [row for _, row in iter_jsonl(path)]


def read_tsv(path: str | os.PathLike, required: Sequence[str]):
    """Read a TSV into a pandas DataFrame (after :func:`check_intact`) and check it has the
    ``required`` columns.

    Raises:
        FileNotFoundError: no file at ``path``.
        DamagedFile: the file is not what was written.
        ValueError: a required column is missing (names the file and the column).
    """
    import pandas as pd

    check_intact(path)
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
        DamagedFile: the file is not what was written (:func:`check_intact`).
    """
    check_intact(path)
    with open(path, newline="") as fh:
        return list(csv.DictReader(fh, delimiter="\t"))
