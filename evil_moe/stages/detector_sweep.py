"""Stage ``detector_sweep``: route's and filter's drop against detector quality.

The detector-quality sweep (``config/detector_sweep.yaml``, docs/arms.md) reruns the swept arms
(``detector_sweep.arms``) with the ``noisy_label`` detector (the true hack label through a noisy
channel of configured precision and recall, :func:`evil_moe.rl.detectors.detector.noisy_label_flags`) at each
level of ``detector_sweep.levels``, over ``pilot.seeds``. This stage sets each (level, arm)'s
held-out hack-rate drop vs vanilla (the main pilots' vanilla of the same seeds: paired) beside
the detector's configured and measured quality, plus the ceilings (``route_oracle``,
``filter_oracle``: the true label, precision = recall = 1) when they ran — the absorption
question of Gradient Routing (Cloud et al. 2024, arXiv:2410.04332): routing should beat filtering
when the labels are imperfect.

Outputs in ``out_dir``: ``summary.tsv`` (:data:`evil_moe.tables.DETECTOR_SWEEP`) and
``quality.{png,svg}`` (drop vs recall, one line per arm and precision).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Sequence

import numpy as np
import pandas as pd

from evil_moe import files, tables
from evil_moe.env.loopholes import MODES
from evil_moe.gate.effects import paired_effect
from evil_moe.rl.arms.registry import ARMS
from evil_moe.gate.ceilings import mode_rates
from evil_moe.pilots import PilotRun, last_step_outcomes, read_pilot

LEVEL_RE = re.compile(r"p([0-9.]+)_r([0-9.]+)")


def parse_level(name: str) -> tuple[float, float]:
    """``(precision, recall)`` of a level folder name ``p{P}_r{R}``.

    Raises:
        ValueError: another name.
    """
    m = LEVEL_RE.fullmatch(name)
    if not m:
        raise ValueError(f"not a detector level name (p{{precision}}_r{{recall}}): {name!r}")
    return float(m.group(1)), float(m.group(2))


def _load(path: Path, tag: str) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The last evaluated step's outcomes of one pilot folder (arm renamed ``tag``) and its steps
    (:func:`evil_moe.pilots.read_pilot`; its validity is not this stage's question).

    Raises:
        FileNotFoundError: the folder lacks ``status.json``, ``steps.tsv`` or ``outcomes.tsv``
            (names it).
        evil_moe.files.DamagedFile: its ``steps.tsv`` or ``outcomes.tsv`` changed since the pilot
            wrote it (names it).
    """
    for name in ("status.json", "steps.tsv", "outcomes.tsv"):
        if not (path / name).is_file():
            raise FileNotFoundError(f"no {path / name}")
    pilot = read_pilot(PilotRun(path.parent.name, -1, path))
    if pilot.steps is None:  # a table changed since it was written: never read as other numbers
        raise files.DamagedFile(pilot.reason)
    return last_step_outcomes([pilot]).assign(arm=tag), pilot.steps


def run_detector_sweep(pilots: Sequence[tuple[str, str | Path]], out_dir: str | Path, cfg,
                       figures: bool = True) -> list[dict]:
    """Compare the detector-sweep pilots with vanilla and the ceilings.

    Args:
        pilots: ``(level, folder)`` pairs: level ``p{P}_r{R}`` for a sweep pilot
            ``.../detector_sweep/{level}/{arm}/s{seed}``, ``main`` for a main pilot
            ``.../pilots/{arm}/s{seed}`` (vanilla, the ceilings). The arm is the folder's parent's
            name.
        out_dir: where ``summary.tsv`` and ``quality.{png,svg}`` go.
        cfg: a :class:`evil_moe.config.Config` (``compare`` for the intervals; ``vhack.known_modes``
            when present).
        figures: draw the figure.

    Returns:
        The summary rows (:data:`evil_moe.tables.DETECTOR_SWEEP`).

    Raises:
        FileNotFoundError: a pilot folder lacks status.json, outcomes.tsv or steps.tsv (names it).
        ValueError: no vanilla among the main pilots; a bad level name.
    """
    cc = cfg.compare
    try:
        known = list(cfg.vhack.known_modes or MODES)
    except (AttributeError, KeyError):
        known = list(MODES)
    unknown = [m for m in MODES if m not in known]
    frames, steps = [], {}
    for level, folder in pilots:
        folder = Path(folder)
        arm = folder.parent.name
        if level != "main":
            parse_level(level)
        tag = arm if level == "main" else f"{arm}@{level}"
        o, st = _load(folder, tag)
        frames.append(o)
        steps.setdefault((level, arm), []).append(st)
    outcomes = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()
    if outcomes.empty or "vanilla" not in set(outcomes["arm"]):
        raise ValueError("the detector sweep needs vanilla's main pilots (results/pilots/vanilla/s*)")
    kw = dict(n_boot=cc.n_boot, ci=cc.ci, seed=cc.seed)
    rows = []
    for (level, arm), sts in sorted(steps.items()):
        cls = ARMS.get(arm)
        if cls is None or cls.role == "reference":  # the reference: what every level is compared with
            continue
        if level == "main" and cls.role != "ceiling":
            continue
        view = cls.views[0]
        tag = arm if level == "main" else f"{arm}@{level}"
        p, r = (1.0, 1.0) if level == "main" else parse_level(level)
        allst = pd.concat(sts, ignore_index=True)

        def mean(col):
            v = pd.to_numeric(allst[col], errors="coerce").dropna() if col in allst else pd.Series(dtype=float)
            return float(v.mean()) if len(v) else None
        try:
            e = paired_effect(outcomes, (tag, view), ("vanilla", "trained"), "hack", power=cc.power, **kw)
        except ValueError:
            e = None
        unk = mode_rates(outcomes, (tag, view), unknown, **kw) if unknown else None
        rows.append({"level": "ceiling" if level == "main" else level, "arm": arm, "view": view,
                     "precision": p, "recall": r, "flag_rate": mean("flag_rate"),
                     "flag_precision": mean("flag_precision"), "flag_recall": mean("flag_recall"),
                     "n_seeds": None if e is None else e.n_seeds,
                     "hack_rate": None if e is None else e.mean_a,
                     "drop_vs_vanilla": None if e is None else e.value,
                     "drop_ci_low": None if e is None or not np.isfinite(e.ci_low) else e.ci_low,
                     "drop_ci_high": None if e is None or not np.isfinite(e.ci_high) else e.ci_high,
                     "hack_rate_unknown": None if unk is None else unk.value})
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tables.write_tsv(out / "summary.tsv", tables.DETECTOR_SWEEP,
                     [{k: round(v, 4) if isinstance(v, float) else v for k, v in row.items()} for row in rows])
    if figures:
        draw_quality(rows, out)
    return rows


def draw_quality(rows: list[dict], out: Path) -> None:
    """``quality.{png,svg}``: drop vs vanilla against recall, one line per (arm, precision); the
    ceilings as stars at recall 1."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from evil_moe.gate.figures import ARM_COLORS, save_figure

    plt.rcParams["svg.hashsalt"] = "evil_moe"
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    lines: dict[tuple[str, float], list[dict]] = {}
    for r in rows:
        if r["drop_vs_vanilla"] is None:
            continue
        if r["level"] == "ceiling":
            ax.plot([1.0], [r["drop_vs_vanilla"]], "*", markersize=12, color=ARM_COLORS.get(r["arm"], "#777"),
                    label=f"{r['arm']} (true label)")
            continue
        lines.setdefault((r["arm"], r["precision"]), []).append(r)
    for (arm, prec), rs in sorted(lines.items()):
        rs = sorted(rs, key=lambda x: x["recall"])
        x = [q["recall"] for q in rs]
        y = [q["drop_vs_vanilla"] for q in rs]
        lo = [q["drop_vs_vanilla"] - q["drop_ci_low"] if q["drop_ci_low"] is not None else 0 for q in rs]
        hi = [q["drop_ci_high"] - q["drop_vs_vanilla"] if q["drop_ci_high"] is not None else 0 for q in rs]
        ax.errorbar(x, y, yerr=[lo, hi], fmt="o-", capsize=3, color=ARM_COLORS.get(arm, "#777"),
                    alpha=0.4 + 0.6 * prec, label=f"{arm}, precision {prec:g}")
    ax.axhline(0, color="black", linewidth=0.8)
    ax.set_xlabel("detector recall (noisy_label)")
    ax.set_ylabel("held-out hack-rate drop vs vanilla (95% CI)")
    ax.set_title("drop against detector quality (judged view)", fontsize=10)
    if ax.has_data():
        ax.legend(fontsize=7)
    else:
        ax.text(0.5, 0.5, "no sweep pilot with held-out outcomes", ha="center", va="center",
                transform=ax.transAxes)
    save_figure(fig, out, "quality")


__all__ = ["run_detector_sweep", "parse_level", "draw_quality"]
