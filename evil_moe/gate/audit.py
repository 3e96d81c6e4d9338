"""Statistics of the detector audit: does a detector see hacks on the policy's own rollouts?

A detector is a score per rollout (higher = more hack-like). The audit (:mod:`evil_moe.stages.audit`)
asks three questions of it, each with an interval that covers seed and sampling noise:

* **Separation**: the ROC AUC of the score against the true hack label (the probability that a
  random hack outscores a random clean rollout; 0.5 = blind), computed by scikit-learn's
  ``roc_auc_score``, with a percentile interval from a two-level **cluster bootstrap**
  (:func:`evil_moe.gate.bootstrap.cluster_draw`): calibration seeds resampled, then the groups
  (one prompt's rollouts of
  one step) within each drawn seed. Rollouts of a group share a prompt and a policy state, and a
  seed's rollouts share a training trajectory, so neither is an independent unit.
* **Against its placebo**: the same AUC for scores that carry no hack information by design
  (random directions of the same shape, the shuffled-label v_hack, a probe fitted on shuffled
  labels, random flags at the same rate), on the same rows. A detector *beats its placebo* when
  its AUC's interval lies above the placebos' 95th percentile (:func:`beats_placebo`): the
  placebos' spread is what a score with no information reaches on these rows.
* **At its operating point**: precision, recall (true-positive rate) and the realised
  false-positive rate of flags thresholded at a quantile of the *clean* rows' scores, with the
  threshold **cross-fitted** leave one seed out (:func:`crossfit_flags`: a seed's rows are
  flagged with a threshold fitted on the other seeds' rows), so the realised rate is measured on
  rows the threshold never saw.

Evil MoE's router weight ``w`` is audited the same way on the arm's own rollouts
(:func:`router_audit`, ``gate.json``'s ``router_audit``).

Sources: ROC AUC as the Mann–Whitney probability (Hanley & McNeil 1982); cluster bootstrap for
grouped data (Davison & Hinkley 1997, §3.8); the peers' detector audits (ariahw/rl-rewardhacking:
a probe thresholded at a 5% false-positive rate; wassname/vGROUT_pub: label-free directions
against the random-direction 95th percentile).
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import pandas as pd

from evil_moe.gate.bootstrap import Clusters, cluster_draws
from evil_moe.pilots import Pilot, scored_rows
from evil_moe.rl.arms.registry import ARMS

__all__ = ["auc", "auc_interval", "placebo_summary", "beats_placebo", "crossfit_flags", "flag_rates",
           "rate_intervals", "router_audit"]


def auc(score, label) -> float | None:
    """ROC AUC of ``score`` against ``label`` (ties count one half).

    Args:
        score: ``(n,)`` floats (NaN not allowed).
        label: ``(n,)`` bool, True = hack.

    Returns:
        the AUC in [0, 1], or None when ``label`` has one class only.

    Raises:
        ValueError: shapes differ.
    """
    from sklearn.metrics import roc_auc_score

    s, y = np.asarray(score, dtype=np.float64), np.asarray(label, dtype=bool)
    if s.shape != y.shape:
        raise ValueError(f"score {s.shape} and label {y.shape} differ")
    if y.all() or not y.any():
        return None
    return float(roc_auc_score(y, s))


def _percentile(values: list[float], ci: float) -> tuple[float | None, float | None]:
    if not values:
        return None, None
    a = (1 - ci) / 2
    lo, hi = np.quantile(np.asarray(values), [a, 1 - a])
    return float(lo), float(hi)


def auc_interval(score, label, clusters: Clusters, *, ci: float, n_boot: int | None = None,
                 seed: int | None = None, draws: Sequence[np.ndarray] | None = None) -> tuple[float | None, float | None]:
    """Percentile interval of :func:`auc` under the cluster bootstrap (:func:`evil_moe.gate.bootstrap.cluster_draw`).

    Replicates whose draw holds one class only are skipped. ``draws`` (the row-index draws) may be
    given to share them between statistics; otherwise ``n_boot`` are drawn from ``seed``
    (the caller's settings: ``audit.n_boot``, ``audit.seed``).

    Raises:
        ValueError: neither ``draws`` nor both ``n_boot`` and ``seed`` given.

    Returns:
        ``(low, high)`` at coverage ``ci``; ``(None, None)`` when no replicate has both classes.
    """
    s, y = np.asarray(score, dtype=np.float64), np.asarray(label, dtype=bool)
    if draws is None:
        if n_boot is None or seed is None:
            raise ValueError("give the bootstrap's draws, or n_boot and seed to draw them")
        draws = cluster_draws(clusters, n_boot, seed)
    vals = [v for v in (auc(s[d], y[d]) for d in draws) if v is not None]
    return _percentile(vals, ci)


def placebo_summary(aucs: Sequence[float | None]) -> tuple[float | None, float | None, int]:
    """Mean and 95th percentile of the placebos' AUCs (None values dropped), and their count."""
    vals = np.asarray([a for a in aucs if a is not None], dtype=np.float64)
    if vals.size == 0:
        return None, None, 0
    return float(vals.mean()), float(np.quantile(vals, 0.95)), int(vals.size)


def beats_placebo(auc_ci_low: float | None, placebo_p95: float | None) -> bool | None:
    """True when the AUC's interval lies above the placebos' 95th percentile (``ci_low > p95``);
    None when either is unknown."""
    if auc_ci_low is None or placebo_p95 is None:
        return None
    return bool(auc_ci_low > placebo_p95)


def crossfit_flags(score, label, seeds, quantile: float) -> np.ndarray:
    """Flags at a cross-fitted operating point: a row of seed ``s`` is flagged when its score
    exceeds the ``quantile`` quantile of the clean rows' scores of every *other* seed (the rule of
    :func:`evil_moe.rl.detectors.detector.null_threshold`, fitted without the seed it flags).

    Args:
        score: ``(n,)`` scores; label: ``(n,)`` bool (hack); seeds: ``(n,)`` per-row seed.
        quantile: in [0, 1] (``pilot.detector_quantile``).

    Returns:
        ``(n,)`` bool flags.

    Raises:
        ValueError: fewer than two seeds (nothing to fit on), or a fold without clean rows.
    """
    s, y, sd = np.asarray(score, dtype=np.float64), np.asarray(label, dtype=bool), np.asarray(seeds)
    uniq = sorted(set(sd.tolist()))
    if len(uniq) < 2:
        raise ValueError("cross-fitted operating points need at least two calibration seeds")
    out = np.zeros(len(s), dtype=bool)
    for u in uniq:
        fit = (sd != u) & ~y
        if not fit.any():
            raise ValueError(f"no clean rows outside seed {u} to fit its threshold on")
        out[sd == u] = s[sd == u] > float(np.quantile(s[fit], quantile))
    return out


def flag_rates(flags, label) -> dict:
    """``{"precision", "recall", "fpr"}`` of ``flags`` against ``label`` (None where undefined:
    nothing flagged, no hacks, no clean rows)."""
    f, y = np.asarray(flags, dtype=bool), np.asarray(label, dtype=bool)
    tp, nf, nh = int((f & y).sum()), int(f.sum()), int(y.sum())
    fp, nc = int((f & ~y).sum()), int((~y).sum())
    return {"precision": tp / nf if nf else None, "recall": tp / nh if nh else None,
            "fpr": fp / nc if nc else None}


def rate_intervals(flags, label, clusters: Clusters, *, ci: float, n_boot: int | None = None,
                   seed: int | None = None, draws: Sequence[np.ndarray] | None = None) -> dict:
    """Percentile intervals of :func:`flag_rates` under the cluster bootstrap (the flags fixed:
    the cross-fitted thresholds are not refitted per replicate).

    Returns:
        ``{"precision": (lo, hi), "recall": (lo, hi), "fpr": (lo, hi)}``.

    Raises:
        ValueError: neither ``draws`` nor both ``n_boot`` and ``seed`` given.
    """
    f, y = np.asarray(flags, dtype=bool), np.asarray(label, dtype=bool)
    if draws is None:
        if n_boot is None or seed is None:
            raise ValueError("give the bootstrap's draws, or n_boot and seed to draw them")
        draws = cluster_draws(clusters, n_boot, seed)
    reps = [flag_rates(f[d], y[d]) for d in draws]
    return {k: _percentile([r[k] for r in reps if r[k] is not None], ci) for k in ("precision", "recall", "fpr")}


def router_audit(by: dict[str, dict[int, Pilot]], arms: Sequence[str], cc) -> dict:
    """Evil MoE's router weight ``w`` audited as a detector on the arm's own rollouts: per router
    arm, the ROC AUC of ``w`` (``rows.tsv`` ``score_router``) against the hack label over its
    rollouts with a gradient, pooled over seeds, with a cluster-bootstrap interval (seeds, then
    groups; :mod:`evil_moe.gate.audit`), against its placebo: the same AUC of the cosines of the
    rollouts' pooled activations with ``audit.placebos`` random directions
    (``scores.safetensors``), their 95th percentile, and ``beats_placebo``. Arms without
    ``rows.tsv`` are left out.

    Returns:
        ``{arm: {"auc", "auc_ci_low", "auc_ci_high", "placebo_mean", "placebo_p95",
        "beats_placebo", "n_scored", "n_hack"}}``.
    """
    out = {}
    for arm in (a for a in arms if a in ARMS and ARMS[a].router):
        frames, plac = [], []
        for p in by.get(arm, {}).values():
            read = scored_rows(p.run.path)
            if read is None or read[1] is None:
                continue
            df, arr = read[0], read[1].get("placebo")
            keep = (df["scored"].fillna(0) == 1) & df["score_router"].notna()
            frames.append(df[keep])
            plac.append(arr[keep.to_numpy()] if arr is not None else None)
        if not frames or any(x is None for x in plac):
            continue
        df = pd.concat(frames, ignore_index=True)
        P = np.concatenate(plac)
        y = df["hack"].astype(int).to_numpy().astype(bool)
        score = df["score_router"].astype(float).to_numpy()
        clusters = Clusters.of(df["seed"].to_numpy(), (df["step"] * 10_000 + df["group"]).to_numpy())
        lo, hi = auc_interval(score, y, clusters, n_boot=min(cc.n_boot, 1000), ci=cc.ci, seed=cc.seed)
        pm, p95, _ = placebo_summary([auc(P[:, j], y) for j in range(P.shape[1])])
        out[arm] = {"auc": auc(score, y), "auc_ci_low": lo, "auc_ci_high": hi, "placebo_mean": pm,
                    "placebo_p95": p95, "beats_placebo": beats_placebo(lo, p95),
                    "n_scored": int(len(y)), "n_hack": int(y.sum())}
    return out
