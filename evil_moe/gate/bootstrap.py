"""The cluster bootstrap of the gate and the detector audit, in one place: what a replicate
resamples. The held-out effects' crossed two-way bootstrap (:func:`crossed_indices`: ``S`` seeds
and ONE multiset of ``P`` problems per replicate; :func:`crossed_bootstrap`, also the ceilings'
ratio, :func:`evil_moe.gate.ceilings.crossed_ratio`), the nested schemes kept for comparison
(:func:`cluster_bootstrap`: problems redrawn within each drawn seed), and the audit's two-level
draw of rows (:class:`Clusters`, :func:`cluster_draw`: seeds, then the groups of each drawn
seed). Why crossed, and the variance each scheme estimates: docs/gate.md; the statistics built on
the draws are :mod:`evil_moe.gate.effects`, :mod:`evil_moe.gate.ceilings` and
:mod:`evil_moe.gate.audit`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from evil_moe.gate.power import resample_scheme


def crossed_indices(S: int, P: int, n_boot: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """The crossed bootstrap's draws: ``(n_boot, S)`` seed indices and ``(n_boot, P)`` problem
    indices, uniform with replacement, drawn in that order from ``rng`` (the same replicate
    shares one multiset of problems across its seeds)."""
    return rng.integers(0, S, size=(n_boot, S)), rng.integers(0, P, size=(n_boot, P))


def cluster_bootstrap(d: np.ndarray, n_p: np.ndarray, n_boot: int, rng: np.random.Generator,
                      resample: str | Sequence[str] = "nested") -> np.ndarray:
    """Resampled effects ``D*`` of the *nested* schemes (``nested``, ``seed``, ``problem``).

    Args:
        d: ``S × Pmax`` per-problem paired differences ``d_sp``, seed ``s``'s in its first
            ``n_p[s]`` columns (the rest ignored; NaN-padded).
        n_p: ``S`` problems per seed (each >= 1).
        n_boot: number of resamples. rng: numpy Generator.
        resample: ``nested`` draws ``S`` seeds with replacement and, for each drawn seed, its own
            ``P_s`` problems with replacement; ``seed`` keeps each drawn seed's mean whole;
            ``problem`` redraws the problems of every seed, the seeds fixed.

    Returns:
        ``n_boot`` values of ``D*`` (mean over drawn seeds of the mean over drawn problems). All
        indices are drawn at once: seeds ``(n_boot, S)``, problems ``(n_boot, S, Pmax)``.

    Raises:
        ValueError: ``resample`` is ``crossed`` (:func:`crossed_bootstrap` needs the grid) or
            unknown.
    """
    scheme = resample_scheme(resample)
    if scheme == "crossed":
        raise ValueError("cluster_bootstrap runs the nested schemes; the crossed one is crossed_bootstrap")
    d = np.asarray(d, dtype=float)
    n_p = np.asarray(n_p, dtype=np.int64)
    S, Pmax = d.shape
    si = (rng.integers(0, S, size=(n_boot, S)) if scheme in ("nested", "seed")
          else np.broadcast_to(np.arange(S), (n_boot, S)))
    if scheme == "seed":
        m = np.nanmean(d, axis=1)
        return m[si].mean(axis=1)
    k = n_p[si]                                                    # problems of each drawn seed
    pi = np.minimum((rng.random((n_boot, S, Pmax)) * k[..., None]).astype(np.int64), k[..., None] - 1)
    vals = d[si[..., None], pi]
    used = np.arange(Pmax) < k[..., None]                          # draw P_s problems for seed s
    m = np.where(used, vals, 0.0).sum(axis=2) / k
    return m.mean(axis=1)


def crossed_bootstrap(d: np.ndarray, n_boot: int, rng: np.random.Generator) -> np.ndarray:
    """Resampled effects ``D*`` of the crossed two-way bootstrap (seeds × problems).

    Each replicate draws ``S`` seeds with replacement (counts ``w_s``) and ONE multiset of ``P``
    problems with replacement (counts ``u_p``) used by every drawn seed, and returns the mean
    over drawn seeds of the mean over the drawn problems present in that seed:
    ``D* = Σ_s w_s m*_s / Σ_s w_s`` with ``m*_s = Σ_p u_p d_sp / Σ_p u_p`` (sums over present
    cells). A drawn seed none of whose drawn problems it has is left out of that replicate; a
    replicate with no usable seed is ``NaN`` (the caller drops and counts it). Without missing
    cells this is the "pigeonhole" bootstrap of McCullagh (2000, "Resampling and exchangeable
    arrays", Bernoulli 6:285–301), Owen (2007, "The pigeonhole bootstrap", Ann. Appl. Stat.
    1:386–411).

    Args:
        d: ``S × P`` paired differences on the seed × problem grid, ``NaN`` where a problem was
            not compared in a seed.
        n_boot: resamples. rng: numpy Generator.

    Returns:
        ``n_boot`` values (float; ``NaN`` for an empty replicate). Indices are drawn at once,
        ``(n_boot, S)`` and ``(n_boot, P)``, and counted; cost ``O(n_boot · S · P)``.
    """
    d = np.asarray(d, dtype=float)
    S, P = d.shape
    present = np.isfinite(d)
    row = np.arange(n_boot)[:, None]
    si, pi = crossed_indices(S, P, n_boot, rng)
    w = np.bincount((row * S + si).ravel(), minlength=n_boot * S)
    u = np.bincount((row * P + pi).ravel(), minlength=n_boot * P)
    w, u = w.reshape(n_boot, S).astype(float), u.reshape(n_boot, P).astype(float)
    num = u @ np.where(present, d, 0.0).T                          # n_boot × S
    den = u @ present.T.astype(float)
    ok = den > 0
    m = np.where(ok, num / np.where(ok, den, 1.0), 0.0)
    wt = w * ok
    tot = wt.sum(axis=1)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(tot > 0, (wt * m).sum(axis=1) / np.where(tot > 0, tot, 1.0), np.nan)


@dataclass(frozen=True)
class Clusters:
    """The cluster structure of ``n`` rows: ``seed`` and ``group`` per row (any hashables; a
    group is unique within its seed)."""

    seed: np.ndarray
    group: np.ndarray

    @classmethod
    def of(cls, seeds: Sequence, groups: Sequence) -> "Clusters":
        """From per-row seeds and groups (e.g. ``step * G + group``).

        Raises:
            ValueError: lengths differ.
        """
        s, g = np.asarray(seeds), np.asarray(groups)
        if s.shape != g.shape:
            raise ValueError(f"{len(s)} seeds but {len(g)} groups")
        return cls(s, g)

    def index(self) -> dict:
        """``{seed: [row indices per group]}``."""
        out: dict = {}
        for i, (s, g) in enumerate(zip(self.seed.tolist(), self.group.tolist())):
            out.setdefault(s, {}).setdefault(g, []).append(i)
        return {s: list(gs.values()) for s, gs in out.items()}


def cluster_draw(index: dict, rng: np.random.Generator) -> np.ndarray:
    """One two-level bootstrap draw of row indices: seeds with replacement, then the groups of
    each drawn seed with replacement (every row of a drawn group comes along).

    Args:
        index: :meth:`Clusters.index`.
        rng: the generator.

    Returns:
        ``(m,)`` int row indices (with repeats).
    """
    seeds = list(index)
    rows: list[int] = []
    for s in rng.choice(len(seeds), size=len(seeds), replace=True):
        groups = index[seeds[s]]
        for g in rng.choice(len(groups), size=len(groups), replace=True):
            rows += groups[g]
    return np.asarray(rows, dtype=np.int64)


def cluster_draws(clusters: "Clusters", n_boot: int, seed: int) -> list[np.ndarray]:
    """``n_boot`` row-index draws of the cluster bootstrap (:func:`cluster_draw`) from ``seed``,
    to share between statistics."""
    rng = np.random.default_rng(seed)
    index = clusters.index()
    return [cluster_draw(index, rng) for _ in range(n_boot)]
