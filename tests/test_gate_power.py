"""Power, the MDE and planning (evil_moe/gate/power.py): t quantiles, the planned SE against
simulated grids and the gate's own simulation, and how many more seeds, problems or samples
would decide."""

from __future__ import annotations

import math

import numpy as np
import pytest

from evil_moe.gate import power, simulate, sizing
from gate_util import CROSSED, make_effect


def test_mde_uses_t_quantiles():
    # Student t table: t_{2}(.975) = 4.3027, t_{2}(.80) = 1.0607; t_{4}: 2.7764, 0.9410; normal: 1.9600, 0.8416
    assert power.mde_from_se(1.0, 2) == pytest.approx(4.3027 + 1.0607, abs=1e-3)
    assert power.mde_from_se(0.01, 4) == pytest.approx(0.01 * (2.7764 + 0.9410), abs=1e-5)
    assert power.mde_from_se(1.0, 10**7) == pytest.approx(1.9600 + 0.8416, abs=1e-3)
    assert power.mde_from_se(1.0, 0) == math.inf
    # power at the MDE is the power it was computed for
    assert power.power_lower(power.mde_from_se(0.03, 2), 0.03, 2) == pytest.approx(0.8)
    assert power.power_upper(0.0, 0.03, 4, margin=power.mde_from_se(0.03, 4)) == pytest.approx(0.8)


def test_planned_se_is_the_expected_interval_se():
    """On the crossed normal model d_sp = β_s + γ_p + ρ_sp + ε_sp (20 000 grids, closed forms worked
    out in this file): the mean of the crossed interval's SE² = f·Var*, of the nested one's, and
    the variance of D over grids are planned_se² (crossed, nested) and true_var."""
    comp = power.VarianceComponents(between_seed=0.004, between_problem=0.003, within_problem=0.4, seed_problem=0.001)
    S, P, n, R = 6, 16, 16, 20_000
    rng = np.random.default_rng(0)
    d = (rng.normal(0, math.sqrt(comp.between_seed), (R, S, 1)) + rng.normal(0, math.sqrt(comp.between_problem), (R, 1, P))
         + rng.normal(0, math.sqrt(comp.seed_problem + comp.within_problem / n), (R, S, P)))
    a = d.mean(axis=2) - d.mean(axis=(1, 2))[:, None]
    b = d.mean(axis=1) - d.mean(axis=(1, 2))[:, None]
    e = d - d.mean(axis=(1, 2))[:, None, None] - a[:, :, None] - b[:, None, :]
    f = max(S / (S - 1), P / (P - 1))
    crossed = f * (a.var(axis=1) / S + b.var(axis=1) / P + (e ** 2).mean(axis=(1, 2)) / (S * P))
    assert crossed.mean() == pytest.approx(power.planned_se(comp, S, P, n) ** 2, rel=0.02)
    m, w2 = d.mean(axis=2), d.var(axis=2)
    nested = S / (S - 1) * (m.var(axis=1) + (w2 / P).mean(axis=1)) / S
    assert nested.mean() == pytest.approx(power.planned_se(comp, S, P, n, "nested") ** 2, rel=0.02)
    true = d.mean(axis=(1, 2)).var()
    assert true == pytest.approx(power.true_var(comp, S, P, n), rel=0.03)
    assert crossed.mean() > true  # conservative
    # the point of the crossed gate: with a shared arm × problem term the nested SE² falls far below Var(D) at
    # 18 seeds (worked out: 0.000437 vs 0.000937), the crossed one does not
    wide = power.VarianceComponents(between_seed=0.004, between_problem=0.01, within_problem=0.4, seed_problem=0.001)
    assert power.true_var(wide, 18, P, n) == pytest.approx(0.004 / 18 + 0.01 / 16 + 0.026 / 288)
    assert power.planned_se(wide, 18, P, n, "nested") ** 2 < 0.5 * power.true_var(wide, 18, P, n)
    assert power.planned_se(wide, 18, P, n) ** 2 > power.true_var(wide, 18, P, n)
    se, mde = power.planned_mde(comp, S, P, n)
    assert power.planned_df(comp, S, P, n) == 5 and mde == pytest.approx(power.mde_from_se(se, 5))
    assert power.planned_df(comp, 18, 9, n) == 8  # min(S − 1, P − 1)
    assert power.planned_se(comp, 1, P, n) == math.inf
    with pytest.raises(ValueError, match="sizes must be >= 1"):
        power.planned_se(comp, 3, 0, 64)


def test_needed_is_the_smallest_size_that_decides():
    e = make_effect(0.08, se=0.04, comp=(0.0002, 0.0005, 0.4))
    comp, P, n = e.components, 9, 64
    nd = sizing.needed(e, 0.0, decides="pass")
    half = lambda S, P_, n_: power.critical(power.planned_df(comp, S, P_, n_)) * power.planned_se(comp, S, P_, n_)
    assert nd.distance == pytest.approx(0.08) and nd.decides == "pass"
    assert half(nd.seeds, P, n) < 0.08 <= half(nd.seeds - 1, P, n)
    assert half(3, P, nd.samples) < 0.08 <= half(3, P, nd.samples - 1)
    assert half(3, nd.problems, n) < 0.08 <= half(3, nd.problems - 1, n)
    # run-to-run noise alone keeps the half width above the distance: samples and problems cannot decide
    big = make_effect(0.08, se=0.04, comp=(0.01, 0.001, 0.4))
    assert sizing.needed(big, 0.0).samples is None and sizing.needed(big, 0.0).problems is None
    assert sizing.needed(big, 0.0).seeds > 3
    # a large arm × problem term: with 9 problems no number of seeds decides (df and σ_C²/P stay), problems do
    wide = make_effect(0.08, se=0.04, comp=(0.0001, 0.02, 0.4))
    nd = sizing.needed(wide, 0.0)
    assert nd.seeds is None and nd.problems is not None and nd.problems > 9
    # at 3 seeds twice the seeds buys most (t on 2 df → 5 df); at 10 seeds, with the arm × problem
    # term dominating, twice the problems does (planned MDE 0.113 vs 0.154 for seeds or samples)
    assert sizing.plan(wide)["best"] == "seeds"
    pl = sizing.plan(make_effect(0.08, se=0.04, n_seeds=10, comp=(0.0001, 0.02, 0.4)))
    assert pl["best"] == "problems" and pl["problems"]["mde"] == pytest.approx(0.113, abs=5e-4)
    assert pl["seeds"]["mde"] == pytest.approx(0.154, abs=5e-4)
    assert pl["problems"]["se"] == pytest.approx(power.planned_se(wide.components, 10, 18, 64))


def test_planning_predicts_the_se_at_more_seeds_and_more_problems():
    """Components estimated at 6 seeds × 16 problems predict (planned_se) the mean SE² the gate
    then shows at 12 seeds and at 32 problems, and true_var the variance of D over experiments."""
    base = simulate.simulate_gate(200, n_seeds=6, seed=21, **CROSSED)
    comp = power.VarianceComponents(*(base[f"control_{f}"].mean() for f in
                                   ("between_seed", "between_problem", "within_problem", "seed_problem")))
    assert (base["control_se"] ** 2).mean() == pytest.approx(power.planned_se(comp, 6, 16, 16) ** 2, rel=0.15)
    for S, P in ((12, 16), (6, 32)):
        r = simulate.simulate_gate(200, n_seeds=S, seed=22 + S + P, **{**CROSSED, "n_problems": P})
        assert (r["control_se"] ** 2).mean() == pytest.approx(power.planned_se(comp, S, P, 16) ** 2, rel=0.15), (S, P)
        assert r["control_value"].var() == pytest.approx(power.true_var(comp, S, P, 16), rel=0.3), (S, P)
