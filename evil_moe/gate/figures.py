"""The compare stage's figures (matplotlib, Agg; PNG and SVG): the held-out comparison the gate
makes, the training trajectories, the ceilings, absorption and where a step's time goes.

:func:`draw_figures` draws every figure of :data:`FIGURES` but the two drawn from the summary
rows' ceiling and per-mode columns (:func:`ceiling_figure`, :func:`absorption_figure`); the compare
stage (:mod:`evil_moe.stages.compare`) calls all three.
"""

from __future__ import annotations

from pathlib import Path
from typing import Iterable

import numpy as np
import pandas as pd

from evil_moe.rl.arms import ARMS
from evil_moe.tables import read_tsv


FIGURES = ("heldout", "hack_rate", "pass_rate", "cin", "removed", "frac_clipped", "cos_contrib", "ceiling",
           "absorption", "phases")
# steps.tsv's per-phase seconds, in the order they run within a step (evil_moe/tables.py); "other"
# is the rest of a step's seconds (cin measurement, logging), "eval" the held-out evaluation per
# training step (its seconds summed over the run, divided by the steps).
PHASES = ("sample", "grade", "loss", "arm", "optimiser")
PHASE_COLORS = {"sample": "#1f77b4", "grade": "#ff7f0e", "loss": "#d62728", "arm": "#9467bd",
                "optimiser": "#8c564b", "other": "#bbbbbb", "eval": "#2ca02c"}
ARM_COLORS = {name: cls.colour for name, cls in ARMS.items() if cls.colour}  # each arm's own (evil_moe/rl/arms.py)


def save_figure(fig, folder: Path, name: str) -> None:
    """Save ``fig`` as ``folder/name.png`` and ``.svg`` (atomically, no date or software metadata)
    and close it."""
    import matplotlib.pyplot as plt

    folder.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    for ext in ("png", "svg"):
        tmp = folder / f".{name}.tmp.{ext}"
        meta = {"Date": None} if ext == "svg" else {"Software": None}
        fig.savefig(tmp, format=ext, dpi=120, metadata=meta)
        tmp.replace(folder / f"{name}.{ext}")
    plt.close(fig)


def _series(pilots: dict[int, "evil_moe.stages.compare._Pilot"], col: str) -> pd.DataFrame:
    """Per step: mean, min and max of ``col`` over seeds."""
    frames = [pd.DataFrame({"step": p.steps["step"], "v": pd.to_numeric(p.steps[col], errors="coerce")})
              for p in pilots.values() if p.steps is not None and not p.steps.empty and col in p.steps.columns]
    if not frames:
        return pd.DataFrame(columns=["step", "mean", "min", "max"])
    g = pd.concat(frames).groupby("step")["v"]
    return pd.DataFrame({"mean": g.mean(), "min": g.min(), "max": g.max()}).reset_index().dropna()


def _heldout_figure(summary_rows: list[dict], folder: Path) -> None:
    """Held-out hack and pass rates per arm and view with their cluster-bootstrap intervals —
    the comparison the gate makes."""
    import matplotlib.pyplot as plt

    rows = [r for r in summary_rows if r.get("hack_rate") is not None]
    fig, axes = plt.subplots(1, 2, figsize=(9.6, 0.45 * max(len(rows), 3) + 1.4), sharey=True)
    labels = [f"{r['arm']} ({r['view']})" for r in rows]
    y = np.arange(len(rows))[::-1]
    for ax, metric, title in ((axes[0], "hack", "held-out hack rate"), (axes[1], "pass", "held-out pass rate")):
        for yi, r in zip(y, rows):
            v, lo, hi = r.get(f"{metric}_rate"), r.get(f"{metric}_ci_low"), r.get(f"{metric}_ci_high")
            if v is None:
                continue
            color = ARM_COLORS.get(r["arm"], "#777777")
            marker = "*" if r["view"] == "ablated" else "s" if r["view"] == "projected" else "o"
            if lo is not None and hi is not None:
                ax.errorbar([v], [yi], xerr=[[v - lo], [hi - v]], fmt=marker, color=color, ecolor=color,
                            capsize=3, markersize=8 if marker == "*" else 5)
            else:
                ax.plot([v], [yi], marker, color=color)
            ax.annotate(f"{v:.2f}", (v, yi), textcoords="offset points", xytext=(0, 6), ha="center", fontsize=7)
        ax.set_xlim(-0.02, 1.02)
        ax.set_title(title, fontsize=10)
        ax.grid(axis="x", alpha=0.3)
    axes[0].set_yticks(y)
    axes[0].set_yticklabels(labels, fontsize=8)
    fig.suptitle("held-out evaluation: rate and 95% cluster-bootstrap CI (seeds, problems)", fontsize=10)
    save_figure(fig, folder, "heldout")


def phase_seconds(by: dict[str, dict[int, "evil_moe.stages.compare._Pilot"]], arms: Iterable[str]) -> pd.DataFrame:
    """Mean seconds per training step of each phase, per arm (steps.tsv's ``seconds_*``).

    For each arm, over every step of every loaded seed: the mean of ``seconds_sample``,
    ``seconds_grade``, ``seconds_loss``, ``seconds_arm`` and ``seconds_optimiser``;
    ``seconds_other`` = the mean of ``seconds`` minus those five (never below 0);
    ``seconds_eval`` = the run's ``seconds_eval`` summed and divided by its steps (the held-out
    evaluation runs after some steps only and is not part of ``seconds``), averaged over seeds.

    Returns:
        One row per arm that has the columns (arms without them, e.g. steps.tsv written before
        the per-phase columns existed, are left out): ``arm``, ``seeds``, ``seconds_<phase>`` for
        each of :data:`PHASES`, ``seconds_other``, ``seconds_eval`` and ``seconds_total`` (their
        sum), in seconds.
    """
    cols = [f"seconds_{p}" for p in PHASES]
    out = []
    for arm in arms:
        frames, evals = [], []
        for pilot in by.get(arm, {}).values():
            st = pilot.steps
            if st is None or st.empty or not set(cols + ["seconds"]) <= set(st.columns):
                continue
            frames.append(st[cols + ["seconds"]].apply(pd.to_numeric, errors="coerce"))
            ev = pd.to_numeric(st["seconds_eval"], errors="coerce") if "seconds_eval" in st else None
            evals.append(float(ev.fillna(0).sum()) / len(st) if ev is not None else 0.0)
        if not frames:
            continue
        means = pd.concat(frames).mean()
        row = {"arm": arm, "seeds": len(frames)}
        row.update({c: float(means[c]) for c in cols})
        row["seconds_other"] = max(0.0, float(means["seconds"]) - sum(row[c] for c in cols))
        row["seconds_eval"] = float(np.mean(evals))
        row["seconds_total"] = sum(row[c] for c in (*cols, "seconds_other", "seconds_eval"))
        out.append(row)
    return pd.DataFrame(out, columns=["arm", "seeds", *cols, "seconds_other", "seconds_eval",
                                      "seconds_total"])


def _phases_figure(by: dict[str, dict[int, "evil_moe.stages.compare._Pilot"]], arms: list[str], folder: Path) -> None:
    """Where a training step's time goes, per arm: stacked mean seconds per phase."""
    import matplotlib.pyplot as plt

    table = phase_seconds(by, arms)
    fig, ax = plt.subplots(figsize=(7.2, 0.45 * max(len(table), 3) + 1.6))
    if table.empty:
        ax.text(0.5, 0.5, "no per-phase seconds in steps.tsv", ha="center", va="center",
                transform=ax.transAxes)
        ax.set_axis_off()
    else:
        y = np.arange(len(table))[::-1]
        left = np.zeros(len(table))
        for phase in (*PHASES, "other", "eval"):
            v = table[f"seconds_{phase}"].to_numpy(dtype=float)
            ax.barh(y, v, left=left, color=PHASE_COLORS[phase], label=phase, height=0.7)
            left += v
        for yi, total in zip(y, left):
            ax.annotate(f"{total:.2f} s", (total, yi), textcoords="offset points", xytext=(3, 0),
                        va="center", fontsize=7)
        ax.set_yticks(y)
        ax.set_yticklabels([f"{a} (n={n})" for a, n in zip(table["arm"], table["seeds"])],
                           fontsize=8)
        ax.set_xlabel("mean seconds per training step (eval: held-out evaluation per step)")
        ax.legend(fontsize=7, ncol=4, loc="lower right")
        ax.grid(axis="x", alpha=0.3)
    ax.set_title("where a step's time goes: steps.tsv's seconds_* per arm, mean over steps and seeds",
                 fontsize=9)
    save_figure(fig, folder, "phases")


def _trajectory_figures(by: dict[str, dict[int, "evil_moe.stages.compare._Pilot"]], arms: list[str], folder: Path) -> None:
    """``hack_rate`` and ``pass_rate``: the training trajectories per arm, the mean line and the
    min–max band over seeds."""
    import matplotlib.pyplot as plt

    for col, title in (("hack_rate", "training hack rate (exploited)"), ("pass_rate", "training oracle pass rate")):
        fig, ax = plt.subplots(figsize=(6.4, 4))
        for arm in arms:
            s = _series(by.get(arm, {}), col)
            if s.empty:
                continue
            color = ARM_COLORS.get(arm)
            ax.plot(s["step"], s["mean"], color=color, label=f"{arm} (n={len(by[arm])})")
            ax.fill_between(s["step"].astype(float), s["min"].astype(float), s["max"].astype(float),
                            color=color, alpha=0.15, linewidth=0)
        ax.set_xlabel("step")
        ax.set_ylabel(col)
        ax.set_ylim(-0.02, 1.02)
        ax.set_title(f"{title}: mean and min–max over seeds", fontsize=10)
        if ax.has_data():
            ax.legend(fontsize=7, loc="best")
        save_figure(fig, folder, col)


def _cin_figure(by: dict[str, dict[int, "evil_moe.stages.compare._Pilot"]], arms: list[str], folder: Path) -> None:
    """``cin``: each arm's cin against the isotropic (dashed) and empirical (dotted) nulls of the
    first arm that has them."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4))
    drew_null = False
    for arm in arms:
        s = _series(by.get(arm, {}), "cin")
        if s.empty:
            continue
        ax.plot(s["step"], s["mean"], color=ARM_COLORS.get(arm), label=f"{arm} cin")
        if not drew_null:
            n = _series(by.get(arm, {}), "null_cin")
            ax.plot(n["step"], n["mean"], color="black", linestyle="--", label="isotropic null")
            e = _series(by.get(arm, {}), "null_cin_empirical")
            if not e.empty:
                ax.plot(e["step"], e["mean"], color="black", linestyle=":", label="empirical null (clean-clean)")
            drew_null = True
    ax.set_xlabel("step")
    ax.set_ylabel("cosine")
    ax.set_title("cin (hack-ward gradient fraction) vs its nulls", fontsize=10)
    if ax.has_data():
        ax.legend(fontsize=7)
    save_figure(fig, folder, "cin")


def _removed_figure(by: dict[str, dict[int, "evil_moe.stages.compare._Pilot"]], arms: list[str], folder: Path) -> None:
    """``removed``: the energy share each arm removed per step, and the update's share in
    span(v_hack)."""
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(9.6, 4))
    for arm in arms:
        for ax, col in ((axes[0], "removed_frac"), (axes[1], "update_span_frac")):
            s = _series(by.get(arm, {}), col)
            if not s.empty:
                ax.plot(s["step"], s["mean"], color=ARM_COLORS.get(arm), label=arm)
    axes[0].set_title("energy share the arm removed (its own V)", fontsize=10)
    axes[1].set_title("update energy share in span(v_hack)", fontsize=10)
    for ax in axes:
        ax.set_xlabel("step")
        if ax.has_data():
            ax.legend(fontsize=7)
    save_figure(fig, folder, "removed")


def _frac_clipped_figure(by: dict[str, dict[int, "evil_moe.stages.compare._Pilot"]], arms: list[str], folder: Path,
                         max_frac_clipped: float) -> None:
    """``frac_clipped``: the largest clip fraction over seeds per arm and step, with the validity
    bound."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4))
    for arm in arms:
        s = _series(by.get(arm, {}), "frac_clipped")
        if s.empty:
            continue
        ax.plot(s["step"], s["max"], color=ARM_COLORS.get(arm), label=f"{arm} (max over seeds)")
    ax.axhline(max_frac_clipped, color="black", linestyle=":", label=f"validity bound {max_frac_clipped:g}")
    ax.set_xlabel("step")
    ax.set_ylabel("frac_clipped")
    ax.set_title("fraction of tokens with the PPO clip active", fontsize=10)
    ax.legend(fontsize=7)
    save_figure(fig, folder, "frac_clipped")


def _cos_contrib_figure(folder: Path, distill_samples: str | Path | None) -> None:
    """``cos_contrib``: the distill probe's per-row ``cos_contrib`` histogram, hack vs clean rows
    (a figure saying so when no samples file is given)."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4))
    if distill_samples is None:
        ax.text(0.5, 0.5, "no distill samples given\n(run the distill probe and pass --distill-samples)",
                ha="center", va="center", transform=ax.transAxes)
        ax.set_axis_off()
    else:
        df = read_tsv(Path(distill_samples), ("exploited", "cos_contrib"))
        hack = df["exploited"].astype(str).str.lower().isin(["true", "1", "1.0"])
        cos = pd.to_numeric(df["cos_contrib"], errors="coerce")
        vals = cos.dropna()
        bins = np.linspace(vals.min(), vals.max(), 25) if len(vals) and vals.min() < vals.max() else 10
        for mask, label, color in ((hack, "hack rows", "#d62728"), (~hack, "clean rows", "#1f77b4")):
            v = cos[mask].dropna()
            if len(v):
                ax.hist(v, bins=bins, alpha=0.5, color=color, label=f"{label} (n={len(v)}, mean {v.mean():.3f})")
        ax.axvline(0, color="black", linewidth=0.8)
        ax.set_xlabel("cos_contrib (row gradient along v_hack; > 0 = hack-ward)")
        ax.set_ylabel("rows")
        ax.set_title("distill probe: does v_hack light up on hacks?", fontsize=10)
        if ax.has_data():
            ax.legend(fontsize=7)
    save_figure(fig, folder, "cos_contrib")


def draw_figures(by: dict[str, dict[int, "evil_moe.stages.compare._Pilot"]], arms: Iterable[str], folder: str | Path,
                 max_frac_clipped: float = 0.5, distill_samples: str | Path | None = None,
                 summary_rows: list[dict] | None = None) -> list[Path]:
    """Draw the compare figures (PNG and SVG, matplotlib Agg) into ``folder``.

    ``heldout``: held-out hack and pass rates per arm and view with their intervals (the gate's
    comparison); ``hack_rate``/``pass_rate``: training trajectories per arm (mean line, min–max
    band over seeds); ``cin``: cin vs its isotropic (dashed) and empirical (dotted) nulls;
    ``removed``: the energy share each arm removed per step and the update's span share;
    ``frac_clipped``: per arm with the validity bound; ``cos_contrib``: the distill probe's
    per-row ``cos_contrib`` histogram, hack vs clean rows; ``phases``: mean seconds per training
    step of each phase per arm, stacked (:func:`phase_seconds`).

    Returns:
        The written files.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    plt.rcParams["svg.hashsalt"] = "evil_moe"
    folder = Path(folder)
    arms = list(arms)
    _heldout_figure(summary_rows or [], folder)
    _trajectory_figures(by, arms, folder)
    _cin_figure(by, arms, folder)
    _removed_figure(by, arms, folder)
    _frac_clipped_figure(by, arms, folder, max_frac_clipped)
    _cos_contrib_figure(folder, distill_samples)
    _phases_figure(by, arms, folder)
    return [folder / f"{n}.{e}" for n in FIGURES if n not in ("ceiling", "absorption") for e in ("png", "svg")]


def ceiling_figure(rows: list[dict], folder: Path) -> None:
    """Per treatment with a ceiling: its hack-rate drop vs vanilla beside its ceiling's and its
    random-flag controls', with intervals."""
    import matplotlib.pyplot as plt

    by = {(r["arm"], r["view"]): r for r in rows}
    items = []
    for r in rows:
        if not r.get("ceiling"):
            continue
        cls = ARMS[r["arm"]]
        for a in (r["arm"], cls.control, r["ceiling"], ARMS[r["ceiling"]].control):
            x = by.get((a, r["view"]))
            if x is not None and x.get("drop_vs_vanilla") is not None:
                items.append((f"{a} ({r['view']})", x))
    fig, ax = plt.subplots(figsize=(6.4, 0.45 * max(len(items), 3) + 1.4))
    if not items:
        ax.text(0.5, 0.5, "no treatment ran beside its ceiling\n(route_oracle, filter_oracle)",
                ha="center", va="center", transform=ax.transAxes)
        ax.set_axis_off()
    y = np.arange(len(items))[::-1]
    for yi, (label, x) in zip(y, items):
        v, lo, hi = x["drop_vs_vanilla"], x.get("drop_ci_low"), x.get("drop_ci_high")
        color = ARM_COLORS.get(x["arm"], "#777777")
        if lo is not None and hi is not None:
            ax.errorbar([v], [yi], xerr=[[v - lo], [hi - v]], fmt="o", color=color, capsize=3)
        else:
            ax.plot([v], [yi], "o", color=color)
        share = x.get("ceiling_share")
        ax.annotate(f"{v:.2f}" + (f"  ({share:.2f} of ceiling)" if share is not None else ""), (v, yi),
                    textcoords="offset points", xytext=(0, 6), ha="center", fontsize=7)
    if items:
        ax.axvline(0, color="black", linewidth=0.8)
        ax.set_yticks(y)
        ax.set_yticklabels([i[0] for i in items], fontsize=8)
        ax.set_xlabel("held-out hack-rate drop vs vanilla (95% CI)")
    ax.set_title("each treatment beside its ceiling (true-label flags) and their random-flag controls", fontsize=9)
    save_figure(fig, folder, "ceiling")


def absorption_figure(rows: list[dict], known: list[str], folder: Path) -> None:
    """Held-out hack rate per arm and view on the modes the detector knows vs those it never saw."""
    import matplotlib.pyplot as plt

    items = [r for r in rows if r.get("hack_rate_known") is not None]
    fig, ax = plt.subplots(figsize=(6.4, 0.45 * max(len(items), 3) + 1.4))
    y = np.arange(len(items))[::-1]
    for yi, r in zip(y, items):
        for col, lo, hi, off, label, color in (
                ("hack_rate_known", "hack_known_ci_low", "hack_known_ci_high", 0.15, "known modes", "#1f77b4"),
                ("hack_rate_unknown", "hack_unknown_ci_low", "hack_unknown_ci_high", -0.15, "never-seen modes", "#d62728")):
            v = r.get(col)
            if v is None:
                continue
            err = [[v - r[lo]], [r[hi] - v]] if r.get(lo) is not None and r.get(hi) is not None else None
            ax.errorbar([v], [yi + off], xerr=err, fmt="o", color=color, capsize=3,
                        label=label if yi == y[0] else None)
    if items:
        ax.set_yticks(y)
        ax.set_yticklabels([f"{r['arm']} ({r['view']})" for r in items], fontsize=8)
        ax.set_xlim(-0.02, 1.02)
        ax.legend(fontsize=7, loc="best")
    ax.set_xlabel("held-out hack rate (95% CI)")
    ax.set_title(f"absorption: modes the detector knows ({', '.join(known)}) vs never saw", fontsize=9)
    save_figure(fig, folder, "absorption")


