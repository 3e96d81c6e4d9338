"""The compare stage's figures (matplotlib, Agg; PNG and SVG): the held-out comparison the gate
makes, the training trajectories, the ceilings, absorption and where a step's time goes.

:func:`draw_figures` draws every figure of :data:`FIGURES` but the two drawn from the summary
rows' ceiling and per-mode columns (:func:`ceiling_figure`, :func:`absorption_figure`); the compare
stage (:mod:`evil_moe.stages.compare`) calls all three. :func:`vhack_curve_figure` is the extract
stage's n-pairs curve. Every figure is saved by :func:`save_figure`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Iterable

import numpy as np
import pandas as pd

from evil_moe.files import atomic_path, read_tsv
from evil_moe.pilots import Pilot
from evil_moe.rl.arms.registry import ARMS


FIGURES = ("heldout", "hack_rate", "pass_rate", "cin", "removed", "frac_clipped", "cos_contrib", "ceiling",
           "absorption", "phases")
# drawn only when the pilots evaluated along the run (pilot.eval_every > 0): heldout_trajectory_figure
TRAJECTORY_FIGURE = "heldout_trajectory"
# steps.tsv's per-phase seconds, in the order they run within a step (evil_moe/tables.py); "other"
# is the rest of a step's seconds (cin measurement, logging), "eval" the held-out evaluation per
# training step (its seconds summed over the run, divided by the steps).
PHASES = ("sample", "grade", "loss", "arm", "optimiser")
PHASE_COLORS = {"sample": "#1f77b4", "grade": "#ff7f0e", "loss": "#d62728", "arm": "#9467bd",
                "optimiser": "#8c564b", "other": "#bbbbbb", "eval": "#2ca02c"}
ARM_COLORS = {name: cls.colour for name, cls in ARMS.items() if cls.colour}  # each arm's own (evil_moe/rl/arms/registry.py)


def save_figure(fig, folder: Path, name: str) -> None:
    """Save ``fig`` as ``folder/name.png`` and ``.svg`` (atomically, no date or software metadata)
    and close it."""
    import matplotlib.pyplot as plt

    fig.tight_layout()
    for ext in ("png", "svg"):
        meta = {"Date": None} if ext == "svg" else {"Software": None}
        with atomic_path(Path(folder) / f"{name}.{ext}") as tmp:
            fig.savefig(tmp, format=ext, dpi=120, metadata=meta)
    plt.close(fig)


def _title(ax, text: str, fontsize: float = 10) -> None:
    """``ax``'s title, wrapped so that no line runs off the canvas: to the axes' share of the
    figure's width (at most 0.6 of it once the tick labels and a legend beside it take their
    room), at about 0.55 × fontsize points per character of DejaVu Sans."""
    import textwrap

    width_pt = ax.figure.get_figwidth() * 72 * min(0.6, ax.get_position().width)
    ax.set_title(textwrap.fill(text, max(20, int(width_pt / (0.55 * fontsize)))), fontsize=fontsize)


def _step_axis(ax) -> None:
    """A training-step x axis: integer ticks (steps are whole numbers)."""
    from matplotlib.ticker import MaxNLocator

    ax.set_xlabel("step")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))


def _legend_outside(ax, ncol: int = 1) -> None:
    """The legend to the right of the axes, where it covers no data (included in the saved
    figure's bounds by tight_layout)."""
    if ax.has_data() and ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.02, 1.0), borderaxespad=0.0, ncol=ncol)


def _series(pilots: dict[int, Pilot], col: str) -> pd.DataFrame:
    """Per step: mean, min and max of ``col`` over seeds."""
    frames = [pd.DataFrame({"step": p.steps["step"], "v": pd.to_numeric(p.steps[col], errors="coerce")})
              for p in pilots.values() if p.steps is not None and not p.steps.empty and col in p.steps.columns]
    if not frames:
        return pd.DataFrame(columns=["step", "mean", "min", "max"])
    g = pd.concat(frames).groupby("step")["v"]
    return pd.DataFrame({"mean": g.mean(), "min": g.min(), "max": g.max()}).reset_index().dropna()


def heldout_figure(summary_rows: list[dict], folder: Path) -> None:
    """Held-out hack and pass rates per arm and view with their cluster-bootstrap intervals —
    the comparison the gate makes (``folder/heldout.png`` and ``.svg``; the README's figure,
    :mod:`evil_moe.gate.readme`). ``summary_rows``: ``compare/summary.tsv`` rows with
    ``hack_rate``, ``pass_rate`` and their ``*_ci_low``/``*_ci_high`` as floats or None."""
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


def phase_seconds(by: dict[str, dict[int, Pilot]], arms: Iterable[str]) -> pd.DataFrame:
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


def _phases_figure(by: dict[str, dict[int, Pilot]], arms: list[str], folder: Path) -> None:
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
        finite = left[np.isfinite(left)]
        top = float(finite.max()) if finite.size else 0.0
        ax.set_xlim(0, top * 1.15 if top > 0 else 1.0)  # room for the totals' labels (NaN seconds: none)
        ax.legend(fontsize=7, ncol=7, loc="upper center", bbox_to_anchor=(0.5, -0.16 - 0.6 / fig.get_figheight()),
                  borderaxespad=0.0, handlelength=1.2, columnspacing=1.0)
        ax.grid(axis="x", alpha=0.3)
    _title(ax, "where a step's time goes: steps.tsv's seconds_* per arm, mean over steps and seeds", 9)
    save_figure(fig, folder, "phases")


def _trajectory_figures(by: dict[str, dict[int, Pilot]], arms: list[str], folder: Path) -> None:
    """``hack_rate`` and ``pass_rate``: the training trajectories per arm, the mean line and the
    min–max band over seeds."""
    import matplotlib.pyplot as plt

    for col, title in (("hack_rate", "training hack rate (exploited)"), ("pass_rate", "training oracle pass rate")):
        fig, ax = plt.subplots(figsize=(7.6, 4))
        for arm in arms:
            s = _series(by.get(arm, {}), col)
            if s.empty:
                continue
            color = ARM_COLORS.get(arm)
            ax.plot(s["step"], s["mean"], color=color, label=f"{arm} (n={len(by[arm])})")
            ax.fill_between(s["step"].astype(float), s["min"].astype(float), s["max"].astype(float),
                            color=color, alpha=0.15, linewidth=0)
        _step_axis(ax)
        ax.set_ylabel(col)
        ax.set_ylim(-0.02, 1.02)
        _title(ax, f"{title}: mean and min–max over seeds")
        _legend_outside(ax)
        save_figure(fig, folder, col)


def _cin_figure(by: dict[str, dict[int, Pilot]], arms: list[str], folder: Path) -> None:
    """``cin``: each arm's cin against the isotropic (dashed) and empirical (dotted) nulls of the
    first arm that has them."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8.0, 4))
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
    _step_axis(ax)
    ax.set_ylabel("cosine")
    _title(ax, "cin (hack-ward gradient fraction) vs its nulls")
    _legend_outside(ax)
    save_figure(fig, folder, "cin")


def _removed_figure(by: dict[str, dict[int, Pilot]], arms: list[str], folder: Path) -> None:
    """``removed``: the energy share each arm removed per step, and the update's share in
    span(v_hack)."""
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11.0, 4))
    for arm in arms:
        for ax, col in ((axes[0], "removed_frac"), (axes[1], "update_span_frac")):
            s = _series(by.get(arm, {}), col)
            if not s.empty:
                ax.plot(s["step"], s["mean"], color=ARM_COLORS.get(arm), label=arm)
    axes[0].set_title("energy share the arm removed (its own V)", fontsize=10)
    axes[1].set_title("update energy share in span(v_hack)", fontsize=10)
    for ax in axes:
        _step_axis(ax)
    _legend_outside(axes[1])
    save_figure(fig, folder, "removed")


def _frac_clipped_figure(by: dict[str, dict[int, Pilot]], arms: list[str], folder: Path,
                         max_frac_clipped: float) -> None:
    """``frac_clipped``: the largest clip fraction over seeds per arm and step, with the validity
    bound."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8.0, 4))
    for arm in arms:
        s = _series(by.get(arm, {}), "frac_clipped")
        if s.empty:
            continue
        ax.plot(s["step"], s["max"], color=ARM_COLORS.get(arm), label=f"{arm} (max over seeds)")
    ax.axhline(max_frac_clipped, color="black", linestyle=":", label=f"validity bound {max_frac_clipped:g}")
    _step_axis(ax)
    ax.set_ylabel("frac_clipped")
    _title(ax, "fraction of tokens with the PPO clip active")
    _legend_outside(ax)
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
        _title(ax, "distill probe: does v_hack light up on hacks?")
        if ax.has_data():
            ax.legend(fontsize=7)
    save_figure(fig, folder, "cos_contrib")


def draw_figures(by: dict[str, dict[int, Pilot]], arms: Iterable[str], folder: str | Path,
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
    heldout_figure(summary_rows or [], folder)
    _trajectory_figures(by, arms, folder)
    _cin_figure(by, arms, folder)
    _removed_figure(by, arms, folder)
    _frac_clipped_figure(by, arms, folder, max_frac_clipped)
    _cos_contrib_figure(folder, distill_samples)
    _phases_figure(by, arms, folder)
    return [folder / f"{n}.{e}" for n in FIGURES if n not in ("ceiling", "absorption") for e in ("png", "svg")]


def ceiling_figure(rows: list[dict], folder: Path) -> None:
    """Per treatment with a ceiling: its hack-rate drop vs vanilla beside its ceiling at its own
    dose (when it ran), its full ceiling's and the matched controls', with intervals."""
    import matplotlib.pyplot as plt

    by = {(r["arm"], r["view"]): r for r in rows}
    items = []
    for r in rows:
        if not r.get("ceiling"):
            continue
        cls = ARMS[r["arm"]]
        for a in (r["arm"], cls.control, r.get("dose_ceiling"), r["ceiling"], ARMS[r["ceiling"]].control):
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
        ax.margins(y=0.2)  # room above the top point's label
        ax.axvline(0, color="black", linewidth=0.8)
        ax.set_yticks(y)
        ax.set_yticklabels([i[0] for i in items], fontsize=8)
        ax.set_xlabel("held-out hack-rate drop vs vanilla (95% CI)")
    _title(ax, "each treatment beside its ceiling (true-label flags) and their matched controls", 9)
    save_figure(fig, folder, "ceiling")


def absorption_figure(rows: list[dict], known: list[str], folder: Path) -> None:
    """Held-out hack rate per arm and view on the modes the detector knows vs those it never saw."""
    import matplotlib.pyplot as plt

    items = [r for r in rows if r.get("hack_rate_known") is not None]
    fig, ax = plt.subplots(figsize=(8.0, 0.45 * max(len(items), 3) + 1.4))
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
        _legend_outside(ax)
    ax.set_xlabel("held-out hack rate (95% CI)")
    _title(ax, f"absorption: modes the detector knows ({', '.join(known)}) vs never saw", 9)
    save_figure(fig, folder, "absorption")


def heldout_trajectory_figure(rates: list[dict], rebounds: dict, folder: Path) -> None:
    """``heldout_trajectory``: each arm's held-out hack and pass rate on its judged view against
    the steps trained (an evaluation after step ``s`` at ``s + 1``; the untrained student, where
    every run starts, at 0), a line through each evaluation and the band of the gate's 95%
    intervals (cluster bootstrap over seeds × problems); a named rebound's peak, trough and
    rebound ringed on the hack panel. ``rates``: :func:`evil_moe.gate.trajectory.step_rates`'
    rows; ``rebounds``: :func:`evil_moe.gate.trajectory.rebounds`."""
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2), sharey=True)
    judged = [r for r in rates if r["arm"] in ARMS and r["view"] == ARMS[r["arm"]].views[0]]
    for ax, metric in zip(axes, ("hack", "pass")):
        for arm in dict.fromkeys(r["arm"] for r in judged):
            pts = sorted((r for r in judged if r["arm"] == arm), key=lambda r: r["step"])
            x = [r["step"] + 1 for r in pts]
            y = [r[f"{metric}_rate"] for r in pts]
            lo = [r[f"{metric}_ci_low"] if r[f"{metric}_ci_low"] is not None else np.nan for r in pts]
            hi = [r[f"{metric}_ci_high"] if r[f"{metric}_ci_high"] is not None else np.nan for r in pts]
            color = ARM_COLORS.get(arm, "#777777")
            label = f"{arm} ({pts[0]['view']})"
            if len(x) > 1:
                ax.plot(x, y, "o-", color=color, markersize=4, label=label)
                ax.fill_between(x, lo, hi, color=color, alpha=0.12, linewidth=0)
            else:  # the untrained student: one evaluation, at the start
                ax.errorbar(x, y, yerr=[[y[0] - lo[0]], [hi[0] - y[0]]], fmt="D", color=color, capsize=3,
                            markersize=5, label=label)
            found = rebounds.get(arm) if metric == "hack" else None
            if found:
                ring = [(s + 1, r[f"{metric}_rate"]) for s in (found["peak"], found["trough"], found["rebound"])
                        for r in pts if r["step"] == s]
                ax.plot(*zip(*ring), "o", markerfacecolor="none", markeredgecolor=color, markersize=11)
        _step_axis(ax)
        ax.set_xlabel("steps trained")
        ax.set_ylim(-0.02, 1.02)
        ax.set_ylabel(f"held-out {metric} rate")
        ax.grid(alpha=0.3)
    _title(axes[0], "held-out hack rate along the run (ringed: a rebound's peak, trough and rebound)")
    _title(axes[1], "held-out pass rate along the run; bands: 95% cluster-bootstrap CI (seeds × problems)")
    _legend_outside(axes[1])
    save_figure(fig, folder, TRAJECTORY_FIGURE)


def vhack_curve_figure(curve: list[dict], isotropic: float | None, prefix) -> None:
    """Draw the n-pairs curve: left, held-out ``cin`` and its empirical null against the number
    of extraction pairs, with their bootstrap intervals (bands) and the isotropic null (dashed);
    right, their difference ``excess`` with its interval and 0. Writes ``{prefix}.png`` and
    ``{prefix}.svg`` (matplotlib Agg, no timestamps). ``curve``: rows of
    :data:`evil_moe.tables.VHACK_CURVE`."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    prefix = Path(prefix)
    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(10.0, 4.0))
    n = [r["n_pairs"] for r in curve]

    def band(axis, col, label, color):
        pts = [(x, r[col], r[f"{col}_ci_low"], r[f"{col}_ci_high"]) for x, r in zip(n, curve)
               if r[col] is not None]
        if not pts:
            return
        xs, ys, lo, hi = zip(*pts)
        axis.plot(xs, ys, "o-", color=color, label=label)
        if all(v is not None for v in lo + hi):
            axis.fill_between(xs, lo, hi, color=color, alpha=0.2)

    band(ax, "cin", "held-out hack-clean cin", "C3")
    band(ax, "null", "held-out clean-clean cin (empirical null)", "C0")
    if isotropic is not None:
        ax.axhline(isotropic, color="grey", ls="--", lw=1, label="isotropic null sqrt(k/2r)")
    band(ax2, "excess", "cin minus null", "C2")
    ax2.axhline(0.0, color="grey", ls="--", lw=1)
    for axis in (ax, ax2):
        if n and max(n) > 2 * min(n):
            axis.set_xscale("log", base=2)
        axis.set_xlabel("extraction (hack, clean) pairs")
        axis.legend(fontsize=8)
    ax.set_ylabel("cin against V")
    ax2.set_ylabel("held-out cin above its null")
    ax.set_title("v_hack: held-out cin and its null", fontsize=10)
    ax2.set_title("the signal above the null (bootstrap interval)", fontsize=10)
    save_figure(fig, prefix.parent, prefix.name)
