"""The compare figures (evil_moe/gate/figures.py): the numbers behind the phases figure, worked
out by hand, and every figure drawn."""

from __future__ import annotations

import pandas as pd
import pytest

from evil_moe.gate.figures import draw_figures, phase_seconds
from evil_moe.stages.compare import _Pilot


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
        "vanilla": {0: _Pilot(None, "ok", "", steps([3, 5], [3, 3], [9, 11], [None, 6.0])),
                    1: _Pilot(None, "ok", "", steps([6, 6], [1, 1], [8, 8], [None, 2.0]))},
        # steps.tsv without the per-phase columns (an older run): left out
        "erase": {0: _Pilot(None, "ok", "", pd.DataFrame({"step": [0], "seconds": [3.0]}))},
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
