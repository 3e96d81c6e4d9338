"""v_hack statistics of any subset of pairs, batched over modules, in the coordinates of the
stored gradients' own span: what the extract stage's honesty checks and their bootstrap
(:mod:`evil_moe.stages.extract`, docs/vhack.md) compute for every replicate.

Every quantity the checks need — the SVD of a pair-difference matrix ``D`` with its floors and
majority-vote orientation (:func:`evil_moe.rl.vhack.direction.extract_vhack`), the mean direction removed
from ``D`` first (:func:`evil_moe.rl.vhack.direction.mean_direction`), ``cin`` of other rows against ``V``
(:func:`evil_moe.rl.vhack.direction.pair_cin`) and the per-completion detector score
(:func:`evil_moe.rl.vhack.direction.sample_scores`) — is unchanged by an orthogonal change of coordinates
in each module's ``δS`` space, and every vector involved lies in the span of the ``2N`` stored
completion gradients (``N`` pairs: first and second completion each). So each module's
gradients are written once in an orthonormal basis of that span (:meth:`GradientStack.from_gradients`:
``Zᵀ = Q R`` for the ``(2N, r)`` stack ``Z``, coordinates ``Y = Rᵀ``, so ``Y Yᵀ = Z Zᵀ``): width
``min(2N, r)`` instead of ``r``. The modules are zero-padded to one width ``P`` (zeros change no
inner product) and stacked, so one batched SVD serves all of them. A replicate then costs a
batched SVD of ``(modules, rows, P)``, never a pass over the model-sized ``r``, and keeps nothing
but the scalars the caller takes from it: memory is the stack (``modules × 2N × P`` fp64) plus
one replicate's working set, whatever the number of replicates.

Results equal the dict functions of :mod:`evil_moe.rl.vhack.direction` on the same rows to float rounding
(those return V in fp32; here everything stays fp64); ``tests/test_rl_vhack_stack.py`` holds them
equal.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Sequence

import torch

__all__ = ["GradientStack", "StackedV", "mean_direction", "extract", "cin", "scores"]

_EPS = float(torch.finfo(torch.float64).eps)
# Modules factorised per batched QR call: their (2N, r) fp64 stacks together at most this many bytes.
QR_CHUNK_BYTES = 256 * 2**20


@dataclass
class GradientStack:
    """Per-module completion gradients of ``N`` pairs in coordinates of their span.

    Attributes:
        names: the modules, in the order of the input dicts (``M`` of them).
        r: ``(M,)`` int64, each module's rank (the width of its ``δS``).
        first, second: ``(M, N, P)`` fp64: the coordinates of each pair's first and second
            completion's gradient; ``P = max_m min(2N, r_m)``, zero-padded.
        diff: ``first − second`` (the pair differences ``d``), ``(M, N, P)``.
    """

    names: list[str]
    r: torch.Tensor
    first: torch.Tensor
    second: torch.Tensor
    diff: torch.Tensor

    @property
    def n(self) -> int:
        """Pairs (rows) ``N``."""
        return int(self.first.shape[1])

    @classmethod
    def from_gradients(cls, first: Mapping[str, torch.Tensor],
                       second: Mapping[str, torch.Tensor]) -> "GradientStack":
        """Write ``{name: (N, r)}`` first- and second-completion gradients in an orthonormal basis
        of their span, per module (Householder QR, fp64 on the CPU), and stack the modules.

        Raises:
            ValueError: no module, the two dicts differ in modules, or a module's two tensors
                differ in shape (names it).
        """
        names = list(first)
        if not names or set(names) != set(second):
            raise ValueError(f"first and second must hold the same modules, got {len(names)} "
                             f"and {len(second)}")
        n = int(first[names[0]].shape[0])
        for name in names:
            if first[name].shape != second[name].shape or first[name].shape[0] != n:
                raise ValueError(f"module {name!r}: first {tuple(first[name].shape)} and second "
                                 f"{tuple(second[name].shape)} must both be ({n}, r)")
        r = [int(first[m].shape[1]) for m in names]
        width = [min(2 * n, rm) for rm in r]
        P = max(width)
        F = torch.zeros(len(names), n, P, dtype=torch.float64)
        S = torch.zeros_like(F)
        by_r: dict[int, list[int]] = {}
        for i, rm in enumerate(r):
            by_r.setdefault(rm, []).append(i)
        for rm, idx in by_r.items():
            per = max(1, QR_CHUNK_BYTES // max(1, 2 * n * rm * 8))
            for lo in range(0, len(idx), per):
                chunk = idx[lo:lo + per]
                Z = torch.stack([torch.cat([first[names[i]], second[names[i]]]).detach()
                                 .to("cpu", torch.float64) for i in chunk])  # (G, 2N, r)
                R = torch.linalg.qr(Z.mT, mode="r").R  # (G, q, 2N): Zᵀ = Q R
                Y = R.mT  # (G, 2N, q), Y Yᵀ = Z Zᵀ
                q = Y.shape[2]
                F[chunk, :, :q] = Y[:, :n]
                S[chunk, :, :q] = Y[:, n:]
                del Z, R, Y
        return cls(names, torch.tensor(r, dtype=torch.long), F, S, F - S)


@dataclass
class StackedV:
    """v_hack of every module at once, in a :class:`GradientStack`'s coordinates.

    Attributes:
        V: ``(M, K, P)`` fp64 orthonormal rows oriented hack-ward; rows a floor dropped are 0.
        S: ``(M, K)`` their singular values.
        keep: ``(M, K)`` bool, the rows kept (``k_m = keep[m].sum()``).
        removed_energy: the share of ``D``'s energy along the removed mean, or None when
            nothing was removed.
    """

    V: torch.Tensor
    S: torch.Tensor
    keep: torch.Tensor
    removed_energy: float | None = None

    @property
    def has(self) -> torch.Tensor:
        """``(M,)`` bool: modules with at least one kept row."""
        return self.keep.any(dim=1)


def _rows(rows: Sequence[int]) -> torch.Tensor:
    return torch.as_tensor(list(rows), dtype=torch.long)


def mean_direction(stack: GradientStack, rows: Sequence[int], how: str) -> torch.Tensor | None:
    """The unit mean gradient per module to remove before the SVD (as
    :func:`evil_moe.rl.vhack.checks.removed_mean`): ``clean`` = over the second completions of
    ``rows``, ``all`` = over both completions, ``none`` = None. ``(M, P)``; a module whose mean
    is 0 gets a zero vector.

    Raises:
        ValueError: an unknown ``how`` (names ``vhack.remove_mean``).
    """
    if how == "none":
        return None
    idx = _rows(rows)
    if how == "clean":
        m = stack.second[:, idx].mean(dim=1)
    elif how == "all":
        m = torch.cat([stack.first[:, idx], stack.second[:, idx]], dim=1).mean(dim=1)
    else:
        raise ValueError(f"vhack.remove_mean: {how!r} is not one of clean, all, none")
    nrm = m.norm(dim=1, keepdim=True)
    return torch.where(nrm > 0, m / torch.where(nrm > 0, nrm, torch.ones_like(nrm)),
                       torch.zeros_like(m))


def extract(stack: GradientStack, rows: Sequence[int], k: int, *, ratio_floor: float | None = None,
            quantile_floor: float | None = None, remove: torch.Tensor | None = None) -> StackedV:
    """:func:`evil_moe.rl.vhack.direction.extract_vhack` of the pair differences ``stack.diff[:, rows]``
    (repeats allowed: a bootstrap replicate), every module in one batched SVD.

    Per module: ``remove`` (``(M, P)`` unit vectors, :func:`mean_direction`) projected out of D;
    the top ``min(k, rows, r_m)`` right singular vectors; rows with ``σ`` numerically 0
    (``σ₁ · max(rows, r_m) · ε``) dropped, and those below ``ratio_floor · σ₁``; then rows below the ``quantile_floor`` quantile of all modules'
    kept σ; each row flipped so that most rows of D have ``D vᵢ > 0`` (ties by the sign of
    ``Σ D vᵢ``, then +).

    Raises:
        ValueError: ``k < 1`` or no rows.
    """
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    idx = _rows(rows)
    if idx.numel() == 0:
        raise ValueError("no rows to extract from")
    D = stack.diff[:, idx]  # (M, n, P)
    removed = None
    if remove is not None:
        total2 = float((D ** 2).sum())
        coef = D @ remove[:, :, None]  # (M, n, 1)
        removed2 = float((coef ** 2).sum())
        D = D - coef * remove[:, None, :]
        removed = removed2 / total2 if total2 > 0 else 0.0
    _, S, Vh = torch.linalg.svd(D, full_matrices=False)
    K = min(int(k), S.shape[1])
    S, V = S[:, :K], Vh[:, :K]
    # numerically nonzero in the module's own shape (n x r_m), as extract_vhack decides
    tol = S[:, :1] * torch.clamp(stack.r, min=idx.numel())[:, None] * _EPS
    keep = (S > tol) & (torch.arange(K)[None, :] < stack.r[:, None])
    if ratio_floor is not None:
        s1 = S[:, :1]
        keep &= torch.where(s1 > 0, S / torch.where(s1 > 0, s1, torch.ones_like(s1)) >= ratio_floor,
                            torch.ones_like(keep))
    proj = D @ V.mT  # (M, n, K)
    votes = torch.sign(proj).sum(dim=1)
    tie = torch.sign(proj.sum(dim=1))
    sign = torch.where(votes != 0, torch.sign(votes),
                       torch.where(tie != 0, tie, torch.ones_like(tie)))
    V = V * sign[:, :, None]
    if quantile_floor is not None:
        pool = S[keep]
        if pool.numel():
            keep &= S >= torch.quantile(pool, quantile_floor)
    return StackedV(V * keep[:, :, None], S * keep, keep, removed)


def _mean_over_modules(v: StackedV, X: torch.Tensor, ratio) -> torch.Tensor:
    """Per row of ``X (M, n, P)``, the mean over live modules (a kept row in ``v`` and a
    non-zero vector) of ``ratio(c (M, n, K), norm (M, n))`` with ``c = x Vᵀ``; 0 for a row with
    no live module. ``(n,)`` fp64."""
    nrm = X.norm(dim=2)
    live = (nrm > 0) & v.has[:, None]
    val = ratio(X @ v.V.mT, torch.where(live, nrm, torch.ones_like(nrm)))
    num = torch.where(live, val, torch.zeros_like(val)).sum(dim=0)
    cnt = live.sum(dim=0)
    return torch.where(cnt > 0, num / cnt.clamp(min=1), torch.zeros_like(num))


def cin(v: StackedV, X: torch.Tensor) -> torch.Tensor:
    """Per-row ``cin`` of difference vectors ``X (M, n, P)`` (e.g. ``stack.diff[:, rows]``)
    against ``v``: the mean over modules of ``‖relu(V d)‖ / ‖d‖`` (:func:`evil_moe.rl.vhack.direction.pair_cin`).
    ``(n,)`` fp64."""
    return _mean_over_modules(v, X, lambda c, nrm: torch.relu(c).norm(dim=2) / nrm)


def scores(v: StackedV, X: torch.Tensor) -> torch.Tensor:
    """Per-row detector score of completion gradients ``X (M, n, P)``: the mean over modules of
    ``Σ_j (V g)_j / ‖g‖`` (:func:`evil_moe.rl.vhack.direction.sample_scores`). ``(n,)`` fp64."""
    return _mean_over_modules(v, X, lambda c, nrm: c.sum(dim=2) / nrm)
