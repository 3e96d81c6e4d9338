"""The thin SVD of a weight, ``W = U diag(S) Vh`` in fp32, that the SVD adapter
(:mod:`evil_moe.model.adapter`) steers along, cached by a content hash of ``W`` (in memory for
weights up to 4M entries, and on disk under a ``cache_dir`` for any size, written atomically), and
the bytes its factors take (:func:`svd_factor_bytes`: what decides whether the disk cache is on by
default, :func:`evil_moe.stages.common.svd_cache_dir`).

Jobs that share a cache (the ~60 model jobs of a GPU run, on the shared filesystem) take each
SVD once: the first job to miss an entry marks it (``<key>.computing``, created exclusively),
computes and writes it; a job that finds the mark waits for the entry instead
(:func:`cached_or_computed`), and computes it itself only after :data:`WAIT_S` seconds without
it (a writer that died; the entry is the same either way).
"""

from __future__ import annotations

import hashlib
import os
import time
from pathlib import Path
from typing import Iterable

import torch
from torch import nn

from evil_moe.files import atomic_path, check_intact

_SVD_CACHE: dict[str, tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = {}
_MEM_CACHE_MAX_NUMEL = 1 << 22  # in-memory cache only for weights up to 4M entries


def weight_hash(weight: torch.Tensor) -> str:
    """SHA-256 of a weight's shape, dtype and raw bytes (content hash used as SVD cache key)."""
    w = weight.detach().contiguous().cpu()
    h = hashlib.sha256()
    h.update(f"{tuple(w.shape)}|{w.dtype}".encode())
    h.update(w.view(torch.uint8).numpy().tobytes() if w.numel() else b"")
    return h.hexdigest()


def _read_svd(path: Path, shape) -> tuple | None:
    """A cached SVD, or None when the file is unreadable, not what was written
    (:func:`evil_moe.files.check_intact`) or of the wrong shape (recomputed)."""
    from safetensors.torch import load_file

    try:
        check_intact(path)
        d = load_file(str(path))
        out = (d["U"], d["S"], d["Vh"])
    except Exception:  # noqa: BLE001 - a broken cache entry is recomputed and replaced
        return None
    r = min(int(shape[0]), int(shape[1]))
    if tuple(out[0].shape) != (int(shape[0]), r) or tuple(out[2].shape) != (r, int(shape[1])):
        return None
    return out


def _write_svd(path: Path, out: tuple) -> None:
    """Write atomically (temp file + rename): concurrent jobs sharing the cache never read a
    partial file; two writers of the same key write identical bytes."""
    from safetensors.torch import save_file

    with atomic_path(path) as tmp:
        save_file({"U": out[0], "S": out[1], "Vh": out[2]}, str(tmp))


# How long a job waits for an entry another job marked as being computed before computing it
# itself (a 151936 x 2560 head's SVD takes seconds on a GPU, minutes on a CPU), and the poll.
WAIT_S = 1800.0
POLL_S = 2.0


def cached_or_computed(path: Path, shape, compute, *, wait_s: float = WAIT_S,
                       poll_s: float = POLL_S) -> tuple:
    """The entry at ``path`` (:func:`_read_svd`), computed by ``compute()`` and written by the
    first job to need it: it creates ``<path>.computing`` exclusively (``O_EXCL``, also on NFS)
    and removes it after the atomic write; a job that finds the mark polls for the entry every
    ``poll_s`` seconds and computes it itself after ``wait_s`` (or once the mark is gone without
    an entry). Returns ``(U, S, Vh)``."""
    mark = path.with_name(path.name + ".computing")
    deadline = time.monotonic() + wait_s
    while True:
        out = _read_svd(path, shape) if path.exists() else None
        if out is not None:
            return out
        try:
            fd = os.open(mark, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except FileExistsError:
            if time.monotonic() < deadline:
                time.sleep(poll_s)
                continue
            fd = None  # the marking job is gone or stuck: compute it here
        try:
            if fd is not None:
                os.write(fd, f"{os.uname().nodename} {os.getpid()}\n".encode())
                os.close(fd)
            out = compute()
            _write_svd(path, out)
            return out
        finally:
            if fd is not None:
                mark.unlink(missing_ok=True)


def thin_svd(weight: torch.Tensor, *, cache_dir: str | os.PathLike | None = None):
    """Thin SVD ``W = U diag(S) Vh`` in fp32, cached by content hash (in memory for weights up
    to 4M entries; on disk under ``cache_dir`` for any size).

    Args:
        weight: ``(d_out, d_in)`` tensor, any float dtype/device.
        cache_dir: optional directory for an on-disk cache (``<hash>.safetensors``, written
            atomically, computed once by the jobs sharing it: :func:`cached_or_computed`; an
            unreadable or mis-shaped entry is recomputed and replaced).

    Returns:
        ``(U (d_out, r), S (r,), Vh (r, d_in))`` fp32 on ``weight.device``, ``r = min(d_out, d_in)``.
    """
    key = weight_hash(weight)
    dev = weight.device
    if key in _SVD_CACHE:
        return tuple(t.to(dev) for t in _SVD_CACHE[key])
    def compute():
        U, S, Vh = torch.linalg.svd(weight.detach().float(), full_matrices=False)
        return U.contiguous().cpu(), S.contiguous().cpu(), Vh.contiguous().cpu()

    if cache_dir:
        Path(cache_dir).mkdir(parents=True, exist_ok=True)
        out = cached_or_computed(Path(cache_dir) / f"{key}.safetensors", weight.shape, compute)
    else:
        out = compute()
    if weight.numel() <= _MEM_CACHE_MAX_NUMEL:  # big models: use cache_dir, not host RAM
        _SVD_CACHE[key] = out
    return tuple(t.to(dev) for t in out)


def matches(name: str, targets: Iterable[str]) -> bool:
    """Whether the module ``name`` is one of ``targets`` (its full name or its last dotted parts)."""
    return bool(name) and any(name == t or name.endswith("." + t) for t in targets)


def svd_factor_bytes(model: nn.Module, target_modules: Iterable[str]) -> int:
    """Bytes of the fp32 ``U`` and ``Vh`` that :meth:`SVDAdapter.attach` would compute (and an
    on-disk cache would hold) for ``model``'s Linears matching ``target_modules``:
    ``4 · Σ r·(d_in + d_out)``, ``r = min(d_in, d_out)``."""
    targets = tuple(target_modules)
    total = 0
    for name, mod in model.named_modules():
        if isinstance(mod, nn.Linear) and matches(name, targets):
            d_out, d_in = mod.weight.shape
            total += 4 * min(d_in, d_out) * (d_in + d_out)
    return total
