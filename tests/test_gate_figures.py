"""The compare figures (evil_moe/gate/figures.py): the numbers behind the phases figure, worked
out by hand, and every figure drawn."""

from __future__ import annotations

import pandas as pd
import pytest

from evil_moe.gate.figures import draw_figures, phase_seconds
from evil_moe.pilots import Pilot


def test_phase_seconds_means_per_arm_by_hand(tmp_path):
    """The phases figure's numbers (steps.tsv's seconds_* per arm), worked out by hand."""
    def steps(sample, loss, seconds, evals):
        n = len(sample)
        return pd.DataFrame({"step": range(n), "seconds": seconds, "seconds_sample": sample,
                             "seconds_grade": [0.5] * n, "seconds_loss": loss,
                             "seconds_arm": [0.0] * n, "seconds_optimiser": [0.1] * n,
                             "seconds_eval": evals})

    by = {
        # seed 0: steps of 9 and 11 s (mean 4 + 0.5 + 3 + 0 + 0.1 = 7.6 -> other 2.4), eval 6 s
        # seed 1: sample 6, loss 1 -> 7.6 again, seconds 8 -> other 0.4, eval 2 s after step 1
        "vanilla": {0: Pilot(None, "ok", "", steps([3, 5], [3, 3], [9, 11], [None, 6.0])),
                    1: Pilot(None, "ok", "", steps([6, 6], [1, 1], [8, 8], [None, 2.0]))},
        # steps.tsv without the per-phase columns (an older run): left out
        "erase": {0: Pilot(None, "ok", "", pd.DataFrame({"step": [0], "seconds": [3.0]}))},
    }
    table = phase_seconds(by, ["vanilla", "erase"])
    assert list(table.arm) == ["vanilla"]
    row = table.iloc[0]
    assert row.seeds == 2
    assert row.seconds_sample == pytest.approx(5.0) and row.seconds_loss == pytest.approx(2.0)
    assert row.seconds_grade == pytest.approx(0.5) and row.seconds_optimiser == pytest.approx(0.1)
    assert row.seconds_arm == 0.0
    assert row.seconds_other == pytest.approx(1.4)  # mean seconds 9 - 7.6
    assert row.seconds_eval == pytest.approx(2.0)  # (6/2 + 2/2) / 2
    assert row.seconds_total == pytest.approx(11.0)
    files = draw_figures(by, ["vanilla", "erase"], tmp_path)
    assert (tmp_path / "phases.png") in files and (tmp_path / "phases.png").stat().st_size > 1000


def _steps(n: int, rng, arm_shift: float) -> pd.DataFrame:
    import numpy as np

    x = np.arange(n)
    return pd.DataFrame({
        "step": x, "hack_rate": np.clip(0.2 + arm_shift + 0.02 * x + rng.normal(0, 0.05, n), 0, 1),
        "pass_rate": np.clip(0.5 - 0.01 * x + rng.normal(0, 0.05, n), 0, 1),
        "cin": 0.3 + rng.normal(0, 0.05, n), "null_cin": [0.25] * n, "null_cin_empirical": [0.28] * n,
        "removed_frac": 0.1 + rng.normal(0, 0.02, n), "update_span_frac": 0.2 + rng.normal(0, 0.02, n),
        "frac_clipped": np.abs(rng.normal(0.1, 0.05, n)), "seconds": [9.0] * n, "seconds_sample": [3.0] * n,
        "seconds_grade": [0.5] * n, "seconds_loss": [3.0] * n, "seconds_arm": [0.4] * n,
        "seconds_optimiser": [0.1] * n, "seconds_eval": [None] * (n - 1) + [6.0]})


def _row(arm, view, hack, drop=None, **extra):
    r = {"arm": arm, "view": view, "hack_rate": hack, "hack_ci_low": max(0.0, hack - 0.2),
         "hack_ci_high": min(1.0, hack + 0.2), "pass_rate": 0.5, "pass_ci_low": 0.3, "pass_ci_high": 0.7,
         "hack_rate_known": hack, "hack_known_ci_low": 0.0, "hack_known_ci_high": 0.95,
         "hack_rate_unknown": hack / 2, "hack_unknown_ci_low": 0.0, "hack_unknown_ci_high": 0.9}
    if drop is not None:
        r.update(drop_vs_vanilla=drop, drop_ci_low=drop - 0.3, drop_ci_high=drop + 0.3)
    r.update(extra)
    return r


def test_every_figure_is_readable(tmp_path, monkeypatch):
    """Every compare figure with realistic data (5 arms × 3 seeds × 20 steps, values near the
    axes' ends): no text runs off the canvas (titles, labels, ticks, legends, annotations), no
    legend covers a plotted point or bar, and a step axis ticks at whole steps."""
    import matplotlib
    import numpy as np
    from matplotlib.text import Text

    from evil_moe.gate import figures

    arms = ["vanilla", "untrained", "route", "route_random", "route_oracle"]
    rng = np.random.default_rng(0)
    by = {a: {s: Pilot(None, "ok", "", _steps(20, rng, 0.1 * i)) for s in range(3)}
          for i, a in enumerate(arms) if a != "untrained"}
    rows = [_row("vanilla", "trained", 0.95), _row("untrained", "trained", 0.02, 0.9),
            _row("route", "ablated", 0.31, -0.01, ceiling="route_oracle", ceiling_share=-0.02),
            _row("route_random", "ablated", 0.33, -0.02), _row("route_oracle", "ablated", 0.03, 0.28)]
    drawn = {}
    save = figures.save_figure

    def check(fig, folder, name):
        fig.tight_layout()
        fig.canvas.draw()
        r = fig.canvas.get_renderer()
        canvas = fig.bbox
        hidden = set()  # labels of ticks outside the view limits are never drawn
        for ax in fig.axes:
            for axis in (ax.xaxis, ax.yaxis):
                lo, hi = sorted(axis.get_view_interval())
                for tick in axis.get_major_ticks() + axis.get_minor_ticks():
                    if not lo - 1e-9 <= tick.get_loc() <= hi + 1e-9:
                        hidden |= {id(tick.label1), id(tick.label2)}
        for t in fig.findobj(Text):
            if not t.get_visible() or not t.get_text().strip() or id(t) in hidden:
                continue
            b = t.get_window_extent(r)
            assert b.x0 >= canvas.x0 - 1 and b.x1 <= canvas.x1 + 1 and b.y0 >= canvas.y0 - 1 and \
                b.y1 <= canvas.y1 + 1, f"{name}: text {t.get_text()!r} runs off the figure ({b} vs {canvas})"
        for ax in fig.axes:
            legend = ax.get_legend()
            if legend is not None:
                lb = legend.get_window_extent(r)
                for line in ax.lines:
                    xy = ax.transData.transform(np.asarray(line.get_xydata(), dtype=float))
                    inside = (xy[:, 0] > lb.x0) & (xy[:, 0] < lb.x1) & (xy[:, 1] > lb.y0) & (xy[:, 1] < lb.y1)
                    assert not inside.any(), f"{name}: the legend covers {line.get_label()!r}"
                for patch in ax.patches:
                    assert not patch.get_window_extent(r).overlaps(lb), f"{name}: the legend covers a bar"
            if ax.get_xlabel() == "step":
                ticks = ax.get_xticks()
                assert np.allclose(ticks, np.round(ticks)), f"{name}: step ticks {ticks}"
        drawn[name] = True
        save(fig, folder, name)

    monkeypatch.setattr(figures, "save_figure", check)
    figures.draw_figures(by, arms, tmp_path, summary_rows=rows)
    figures.ceiling_figure(rows, tmp_path)
    figures.absorption_figure(rows, ["run_tests", "stdout_marker"], tmp_path)
    assert set(drawn) == set(figures.FIGURES)
    assert matplotlib.get_backend().lower() == "agg"
