"""Stages ``calibrate`` and ``audit``: does a detector see hacks on the policy's own rollouts?

**Calibration runs** (:func:`run_calibration`, rule ``calibrate``): vanilla Dr.GRPO on the seeds
``audit.seeds`` (disjoint from ``pilot.seeds``), training identical to vanilla's, that score
every rollout with a gradient under every detector and its placebos — the gradient detector
(v_hack), ``audit.placebos`` random directions with the same k per module, the shuffled-label
v_hack, the pattern detector — and keep each rollout's pooled final hidden state (the probe's
input). Their labels are the only oracle labels a training run's detector ever sees, and only
through :func:`run_audit`'s fits; they are counted in ``quality.tsv`` (``n_labels``).

**The audit** (:func:`run_audit`, rule ``audit``; route's and filter's pilots wait for it) reads
the calibration runs and writes, in ``out_dir``:

- ``calibration.json`` — per detector the clean rollouts' scores its threshold is a quantile of
  (``pilot.detector_calibration: fpr``): the gradient detector's over every calibration rollout
  with a gradient; the probe's over the calibration rollouts it was not fitted on;
- ``probe.safetensors`` — the probe (:class:`evil_moe.rl.detectors.probe.Probe`) fitted on
  ``audit.label_budget`` labelled calibration rollouts (``pilot.detector: probe``);
- ``quality.tsv`` — :data:`evil_moe.tables.AUDIT_QUALITY`: per detector and mode its AUC with a
  cluster-bootstrap interval, its placebos' mean and 95th percentile, ``beats_placebo``, and
  precision / recall / false-positive rate at the operating point cross-fitted leave one seed out
  (:mod:`evil_moe.gate.audit`); the population every rate is over (rollouts with a gradient) and
  the zero-variance rollouts left out of it are counted;
- ``probe_curve.tsv`` and ``figures/probe_curve.{png,svg}`` — the probe's cross-fitted AUC against
  its label budget (``audit.budget_curve``), beside the gradient and pattern detectors' AUCs.

Which detectors are audited, their scores, placebos, operating points and calibrations are each
detector's own (:meth:`evil_moe.rl.detectors.registry.Detector.audit`); this stage loads the
calibration runs, computes the statistics (:mod:`evil_moe.gate.audit`) and writes.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np

from evil_moe import files, tables
from evil_moe.config import Config
from evil_moe.gate import audit as stats
from evil_moe.gate.bootstrap import Clusters, cluster_draw, cluster_draws
from evil_moe.pilots import scored_rows
from evil_moe.rl.detectors.registry import DETECTORS, AuditRows, AuditScores

N_DRAWS = 5  # label draws per budget of the probe curve


def run_calibration(cfg: Config, *, seed: int, out_dir: str, problems_path: str, model_path: str,
                    vhack_path: str, shuffled_vhack_path: str | None = None,
                    init_adapter: str | None = None, teacher_rollouts: str | None = None,
                    stop_after: int | None = None) -> dict:
    """One calibration run of the detector audit: vanilla on ``seed`` with every rollout scored.

    Writes the pilot's training outputs (``steps.tsv``, ``rows.tsv``, ``rollouts.jsonl.gz``,
    ``adapter.safetensors``, ``status.json``) plus ``scores.safetensors`` (the random placebos'
    scores and the pooled hidden states, in ``rows.tsv`` order); no held-out evaluation
    (:func:`evil_moe.stages.pilot.run_pilot` with ``calibrate``).

    Raises:
        ValueError: ``seed`` is one of ``pilot.seeds`` (a threshold fitted on it would be judged on
            the rollouts it was fitted on).
        FileNotFoundError: an input is missing (names it).
    """
    from evil_moe.stages.pilot import run_pilot

    if seed in cfg.pilot.seeds:
        raise ValueError(f"calibration seed {seed} is one of pilot.seeds {list(cfg.pilot.seeds)}: "
                         "audit.seeds must be disjoint from them")
    return run_pilot(cfg, problems_path=problems_path, model_path=model_path, vhack_path=vhack_path,
                     random_vhack_path=None, arm="vanilla", seed=seed, out_dir=out_dir,
                     init_adapter=init_adapter, teacher_rollouts=teacher_rollouts, stop_after=stop_after,
                     calibrate=True, shuffled_vhack_path=shuffled_vhack_path)


@dataclass
class CalibrationRows:
    """Every calibration rollout (``rows``, :data:`evil_moe.tables.AUDIT_ROWS` as a DataFrame) and
    its arrays: ``placebo`` ``(n, P)`` random-direction scores, ``hidden`` ``(n, d)`` pooled hidden
    states (None when absent)."""

    rows: "pd.DataFrame"  # noqa: F821
    placebo: np.ndarray | None
    hidden: np.ndarray | None

    @classmethod
    def load(cls, dirs: Sequence[str | Path]) -> "CalibrationRows":
        """Read ``rows.tsv`` and ``scores.safetensors`` of each calibration run folder.

        Raises:
            FileNotFoundError: a folder lacks ``rows.tsv`` or ``status.json`` (names it).
            ValueError: a run did not finish ``ok``; the arrays and rows disagree in length.
        """
        import pandas as pd

        frames, plac, hid = [], [], []
        for d in map(Path, dirs):
            for name in ("status.json", "rows.tsv"):
                if not (d / name).is_file():
                    raise FileNotFoundError(f"calibration run output not found: {d / name}")
            status = files.read_json(d / "status.json", "calibration run status").get("status")
            if status != "ok":
                raise ValueError(f"calibration run {d} did not finish ok (status {status!r})")
            df, arrays = scored_rows(d, tables.names(tables.AUDIT_ROWS))
            df, arrays = df.astype({"problem_id": str}), arrays or {}
            for key, acc in (("placebo", plac), ("hidden", hid)):
                if key in arrays:
                    if len(arrays[key]) != len(df):
                        raise ValueError(f"{d}: {key} has {len(arrays[key])} rows, rows.tsv {len(df)}")
                    acc.append(arrays[key])
            frames.append(df)
        rows = pd.concat(frames, ignore_index=True)
        return cls(rows, np.concatenate(plac) if len(plac) == len(frames) and plac else None,
                   np.concatenate(hid).astype(np.float64) if len(hid) == len(frames) and hid else None)


def _groups(df) -> np.ndarray:
    return (df["step"].astype(int) * 10_000 + df["group"].astype(int)).to_numpy()


def run_audit(cfg: Config, *, calibration_dirs: Sequence[str | Path], out_dir: str | Path,
              figures: bool = True) -> dict:
    """Fit the detectors' thresholds and the probe on the calibration runs and audit every
    detector (outputs in the module docstring).

    Args:
        cfg: the run config (``audit``, ``pilot.detector_quantile``).
        calibration_dirs: the calibration run folders (``audit/calibration/s{seed}``).
        out_dir: where the outputs go (created).
        figures: draw the probe-curve figure.

    Returns:
        ``{"quality": [rows], "calibration": {...}}``.

    Raises:
        FileNotFoundError / ValueError: as :meth:`CalibrationRows.load`; fewer than two seeds.
    """
    a = cfg.audit
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    data = CalibrationRows.load(calibration_dirs)
    df = data.rows
    scored = (df["scored"].fillna(0).astype(int) == 1).to_numpy()
    seeds_all = df["seed"].astype(int).to_numpy()
    if len(set(seeds_all.tolist())) < 2:
        raise ValueError("the detector audit needs calibration runs on at least two seeds (audit.seeds)")
    sub = df[scored].reset_index(drop=True)
    y = sub["hack"].astype(int).to_numpy().astype(bool)
    seeds = sub["seed"].astype(int).to_numpy()
    clusters = Clusters.of(seeds, _groups(sub))
    draws = cluster_draws(clusters, a.n_boot, a.seed)
    q = cfg.pilot.detector_quantile
    counts = _counts(df, scored)
    rows = AuditRows(sub, y, seeds, sub["step"].astype(int).to_numpy(),
                     data.placebo[scored] if data.placebo is not None else None,
                     data.hidden[scored] if data.hidden is not None else None, a, q)
    found: dict[str, AuditScores] = {}
    for name, cls in DETECTORS.items():
        res = cls().audit(rows) if cls.audited else None
        if res is not None:
            found[name] = res
    quality, calibration = [], {}
    for det in sorted(n for n, r in found.items() if r.score is not None):  # rows by detector name
        res, cls = found[det], DETECTORS[det]
        flags = res.flags if res.flags is not None or not cls.thresholded() else _crossfit_or_none(
            res.score, y, seeds, q)
        for mode in ["all"] + sorted(set(sub["mode"].astype(str))):
            m = np.ones(len(sub), dtype=bool) if mode == "all" else (sub["mode"].astype(str) == mode).to_numpy()
            quality.append(_quality_row(cls, mode, m, res, flags, y, seeds, clusters, draws, counts[mode], q, a))
    for det, res in found.items():
        if res.score is not None and res.calibration is not None:
            calibration[det] = res.calibration
        if res.fitted is not None:
            res.fitted.save(out / f"{DETECTORS[det].fitted}.safetensors")
    tables.write_tsv(out / "quality.tsv", tables.AUDIT_QUALITY, quality)
    files.write_json(out / "calibration.json", calibration)
    refit = next((r.refit for r in found.values() if r.refit is not None), None)
    curve = _label_curve(refit, len(y), a, clusters, y) if refit is not None else []
    tables.write_tsv(out / "probe_curve.tsv", tables.PROBE_CURVE, curve)
    if figures:
        probe_curve_figure(curve, quality, out / "figures")
    return {"quality": quality, "calibration": calibration}


def _counts(df, scored: np.ndarray) -> dict:
    """Population counts per mode (and 'all'): rows, zero-variance rows, scored rows."""
    out = {}
    modes = df["mode"].astype(str).to_numpy()
    zero = (df["zero_variance"].fillna(0).astype(int) == 1).to_numpy()
    for mode in ["all"] + sorted(set(modes.tolist())):
        m = np.ones(len(df), dtype=bool) if mode == "all" else modes == mode
        out[mode] = {"n_rows": int(m.sum()), "n_zero_variance": int((m & zero).sum()),
                     "n_scored": int((m & scored).sum())}
    return out


def _crossfit_or_none(score, y, seeds, q: float) -> np.ndarray | None:
    """:func:`evil_moe.gate.audit.crossfit_flags`, or None where it cannot be fitted (the scored
    rows come from one seed, or a seed's complement has no clean row: a tiny run); the quality
    table then leaves the operating point's rates empty and ``n_seeds`` says why."""
    try:
        return stats.crossfit_flags(score, y, seeds, q)
    except ValueError:
        return None


def _quality_row(det, mode, m, res: AuditScores, flags, y, seeds, clusters, draws, counts, q, a) -> dict:
    """One :data:`evil_moe.tables.AUDIT_QUALITY` row of detector class ``det`` (its scores and
    placebos ``res``): ``m`` selects the mode's scored rows."""
    score, placebo_scores = res.score, res.placebos
    ok = m & ~np.isnan(score)
    idx = np.flatnonzero(ok)
    pos = {i: k for k, i in enumerate(idx)}
    sub_draws = [np.asarray([pos[i] for i in d if i in pos], dtype=np.int64) for d in draws]
    sub_clusters = Clusters(clusters.seed[idx], clusters.group[idx])
    value = stats.auc(score[idx], y[idx])
    lo, hi = stats.auc_interval(score[idx], y[idx], sub_clusters, draws=sub_draws, ci=a.ci)
    pl = [stats.auc(p[idx], y[idx]) for p in placebo_scores if not np.isnan(p[idx]).any()]
    pmean, p95, n_pl = stats.placebo_summary(pl)
    if flags is None:  # no cross-fitted operating point (one scored seed)
        rates = dict.fromkeys(("precision", "recall", "fpr"))
        ivs = dict.fromkeys(("precision", "recall", "fpr"), (None, None))
    else:
        rates = stats.flag_rates(flags[idx], y[idx])
        ivs = stats.rate_intervals(flags[idx], y[idx], sub_clusters, draws=sub_draws, ci=a.ci)
    row = {"detector": det.name, "mode": mode,
           "population": "calibration rollouts with a gradient (groups with reward variance)",
           "n_seeds": len(set(seeds.tolist())), **counts, "n_hack": int(y[idx].sum()), "n_labels": res.n_labels,
           "auc": value, "auc_ci_low": lo, "auc_ci_high": hi, "placebo": det.placebo.format(n=a.placebos),
           "n_placebos": n_pl, "placebo_mean": pmean, "placebo_p95": p95,
           "beats_placebo": stats.beats_placebo(lo, p95),
           "quantile": q if det.thresholded() else None}
    for k in ("precision", "recall", "fpr"):
        row[k] = rates[k]
        row[f"{k}_ci_low"], row[f"{k}_ci_high"] = ivs[k]
    return row


def _label_curve(refit, n_max: int, a, clusters, y) -> list[dict]:
    """The cross-fitted AUC of the detector fitted on labels (the probe) at each label budget
    (:data:`evil_moe.tables.PROBE_CURVE`): ``refit(budget, rng, shuffle=False)`` is its
    :attr:`~evil_moe.rl.detectors.registry.AuditScores.refit` over the ``n_max`` scored rows."""
    rng = np.random.default_rng([a.seed, 19])
    index = clusters.index()
    rows = []
    for budget in sorted({min(b, n_max) for b in a.budget_curve}):
        fits = [refit(budget, rng) for _ in range(N_DRAWS)]
        fits = [f[0] for f in fits if f is not None]
        if not fits:
            continue
        aucs = [stats.auc(f, y) for f in fits]
        boot = []
        for i in range(a.n_boot):
            d = cluster_draw(index, rng)
            v = stats.auc(fits[i % len(fits)][d], y[d])
            if v is not None:
                boot.append(v)
        lo, hi = stats._percentile(boot, a.ci)
        placebo = [p[0] for p in (refit(budget, rng, shuffle=True) for _ in range(a.placebos)) if p is not None]
        _, p95, _ = stats.placebo_summary([stats.auc(p, y) for p in placebo])
        rows.append({"budget": budget, "auc": float(np.mean([v for v in aucs if v is not None])),
                     "auc_ci_low": lo, "auc_ci_high": hi, "n_draws": len(fits), "placebo_p95": p95})
    return rows


def probe_curve_figure(curve: list[dict], quality: list[dict], folder: Path) -> None:
    """``probe_curve.{png,svg}``: the probe's AUC against its label budget with its interval and
    its placebo's 95th percentile, beside the gradient and pattern detectors' pooled AUCs."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from evil_moe.gate.figures import save_figure

    fig, ax = plt.subplots(figsize=(6.4, 4.0))
    if curve:
        b = [r["budget"] for r in curve]
        ax.plot(b, [r["auc"] for r in curve], "o-", color="#1f77b4", label="probe (cross-fitted)")
        ax.fill_between(b, [r["auc_ci_low"] or np.nan for r in curve], [r["auc_ci_high"] or np.nan for r in curve],
                        color="#1f77b4", alpha=0.2, label="95% interval")
        ax.plot(b, [r["placebo_p95"] if r["placebo_p95"] is not None else np.nan for r in curve], "--",
                color="#7f7f7f", label="probe on shuffled labels (p95)")
        ax.set_xscale("log", base=2)
    colours = {"gradient": "#d62728", "pattern": "#2ca02c"}
    for r in quality:
        if r["mode"] == "all" and r["detector"] in colours and r["auc"] is not None:
            ax.axhline(r["auc"], color=colours[r["detector"]], lw=1.2,
                       label=f"{r['detector']} detector (no labels)")
    ax.axhline(0.5, color="black", lw=0.6, ls=":")
    ax.set_ylim(0.3, 1.02)
    ax.set_xlabel("labelled calibration rollouts")
    ax.set_ylabel("ROC AUC on the policy's rollouts")
    ax.set_title("Detector quality against label budget")
    ax.legend(fontsize=7, loc="lower right")
    save_figure(fig, folder, "probe_curve")


__all__ = ["run_calibration", "run_audit", "CalibrationRows", "probe_curve_figure"]
