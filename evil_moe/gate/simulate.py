"""Synthetic per-completion outcomes with planted effects, and the separation gate simulated on
them: the generator the gate's tests and ``benchmarks/gate_power.py`` use (never the workflow).
The model is :func:`simulate_outcomes`'; the operating characteristics it gives are tabled in
``docs/gate.md``.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import numpy as np
import pandas as pd

from evil_moe.gate.defaults import CI, MIN_DROP, MIN_SEEDS, MULTIPLICITY, PASS_MARGIN, POWER, RESAMPLE
from evil_moe.gate.effects import Effect, effect_from_cells
from evil_moe.gate.power import VarianceComponents, critical, planned_mde, satterthwaite
from evil_moe.gate.criteria import CRITERIA, ArmVerdict, GateVerdict, Limits
from evil_moe.gate.rule import decide_arm, decide_gate

@dataclass(frozen=True)
class Planted:
    """A planted effect for one (arm, view): the drop of its expected hack rate and pass rate
    below the unshifted arms' (rate points, marginal over problems, seeds and runs)."""

    hack_drop: float = 0.0
    pass_drop: float = 0.0


#: The generator's default spread, on the logit scale (see :func:`simulate_outcomes`).
DEFAULT_SPREAD = {"problem_sd": 1.0, "seed_sd": 0.5, "run_sd": 0.25, "arm_problem_sd": 0.5, "run_problem_sd": 0.25}

#: Variance components of a hack-rate difference between two arms under :func:`simulate_outcomes`'
#: defaults (rate 0.5, :data:`DEFAULT_SPREAD`), measured as the mean of :func:`evil_moe.gate.effects.paired_effect`'s
#: estimates over 400 simulated experiments with no planted effect at 3 seeds × 9 problems × 64
#: samples (``tests/test_gate_simulate.py`` re-measures them): 0.0051, 0.0192, 0.379, 0.0061. A planning
#: default for :func:`planned_mde`, not a measurement of the toy.
DEFAULT_COMPONENTS = VarianceComponents(between_seed=0.005, between_problem=0.019, within_problem=0.38,
                                        seed_problem=0.006)


def _expit(x: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-x))


_GH = np.polynomial.hermite_e.hermegauss(60)


def _marginal_rate(centre: float, sd: float, shift: float = 0.0) -> float:
    """``E[expit(centre − shift + sd·Z)]``, Z standard normal (Gauss–Hermite, 60 nodes)."""
    x, w = _GH
    return float((w * _expit(centre - shift + sd * x)).sum() / w.sum())


@functools.lru_cache(maxsize=1024)
def _logit_shift(centre: float, sd: float, drop: float) -> float:
    """The logit shift that lowers the marginal rate by ``drop`` (bisection; raises if impossible)."""
    if drop == 0:
        return 0.0
    base = _marginal_rate(centre, sd)
    target = base - drop
    if not 0.0 < target < 1.0:
        raise ValueError(f"cannot plant a drop of {drop} below a marginal rate of {base:.3f}")
    lo, hi = (0.0, 50.0) if drop > 0 else (-50.0, 0.0)
    for _ in range(100):
        mid = (lo + hi) / 2
        if _marginal_rate(centre, sd, mid) > target:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


def _simulate_rates(cells: Mapping[tuple[str, str], Planted], S: int, P: int, hack_rate: float, pass_rate: float,
                    problem_sd: float, seed_sd: float, run_sd: float, arm_problem_sd: float, run_problem_sd: float,
                    gen: np.random.Generator) -> dict[str, np.ndarray]:
    """Per metric the ``C × S × P`` rates of :func:`simulate_outcomes`' model (cells in order)."""
    keys = list(cells)
    arms = list(dict.fromkeys(a for a, _ in keys))
    arm_i = np.array([arms.index(a) for a, _ in keys])
    A = len(arms)
    tot_sd = math.sqrt(problem_sd ** 2 + seed_sd ** 2 + run_sd ** 2 + arm_problem_sd ** 2 + run_problem_sd ** 2)
    out = {}
    for metric, r, attr in (("hack", hack_rate, "hack_drop"), ("pass", pass_rate, "pass_drop")):
        centre = math.log(r / (1 - r))
        shift = np.array([_logit_shift(centre, tot_sd, getattr(cells[k], attr)) for k in keys])
        eta = problem_sd * gen.standard_normal(P)
        u = seed_sd * gen.standard_normal(S)
        v = run_sd * gen.standard_normal((A, S))
        g = arm_problem_sd * gen.standard_normal((A, P))           # arm × problem, shared by seeds
        h = run_problem_sd * gen.standard_normal((A, S, P))        # run (arm × seed) × problem
        logit = (centre + eta[None, None, :] + u[None, :, None] + v[arm_i][:, :, None] + g[arm_i][:, None, :]
                 + h[arm_i] - shift[:, None, None])
        out[metric] = _expit(logit)
    return out


def _check_sim(cells, n_seeds, n_problems, n_samples, hack_rate, pass_rate) -> None:
    if not cells:
        raise ValueError("simulate_outcomes needs at least one (arm, view) cell")
    if min(n_seeds, n_problems, n_samples) < 1:
        raise ValueError(f"sizes must be >= 1, got {n_seeds}, {n_problems}, {n_samples}")
    for name, r in (("hack_rate", hack_rate), ("pass_rate", pass_rate)):
        if not 0.0 < r < 1.0:
            raise ValueError(f"{name} must be in (0, 1), got {r}")


def simulate_outcomes(cells: Mapping[tuple[str, str], Planted], *, n_seeds: int = 3, n_problems: int = 9,
                      n_samples: int = 64, hack_rate: float = 0.5, pass_rate: float = 0.15,
                      problem_sd: float = DEFAULT_SPREAD["problem_sd"], seed_sd: float = DEFAULT_SPREAD["seed_sd"],
                      run_sd: float = DEFAULT_SPREAD["run_sd"],
                      arm_problem_sd: float = DEFAULT_SPREAD["arm_problem_sd"],
                      run_problem_sd: float = DEFAULT_SPREAD["run_problem_sd"], truncated_rate: float = 0.02,
                      step: int = 20, modes: Sequence[str] = ("stdout", "raise"),
                      rng: int | np.random.Generator = 0) -> pd.DataFrame:
    """Synthetic per-completion outcomes (:data:`evil_moe.pilots.OUTCOME_COLUMNS`) for tests and documentation.

    Model (logit scale; hack and pass drawn independently, each with its own draws)::

        rate[(arm, view), s, p] = expit(logit(r) + η_p + u_s + v_{arm,s} + g_{arm,p} + h_{arm,s,p}
                                        − δ_{arm,view})
        η_p ~ N(0, problem_sd²)         per held-out problem, the same for every seed and arm (as
                                        in the pilots: one held-out split)
        u_s ~ N(0, seed_sd²)            per seed, shared by every arm (same task order and step-0
                                        samples)
        v_{arm,s} ~ N(0, run_sd²)       per training run (arm × seed), shared by the run's views
        g_{arm,p} ~ N(0, arm_problem_sd²)  arm × problem, the SAME in every seed (an arm that
                                        happens to help or hurt on a problem does so in every
                                        run): mean zero over the population of problems, so with
                                        no planted δ the arms' marginal rates are equal — but the
                                        mean of g over the P problems drawn is not 0, and a paired
                                        difference inherits it in every seed (the crossed design)
        h_{arm,s,p} ~ N(0, run_problem_sd²)  run × problem (seed × problem within an arm)
        outcome ~ Bernoulli(rate) per sample; truncated ~ Bernoulli(truncated_rate)

    ``δ`` is solved so that the *marginal* expected rate (over every term above) drops by the
    planted amount.

    Default spread (:data:`DEFAULT_SPREAD`), from what the toy showed: vanilla's held-
    out hack rate differed by ~0.2 between two seeds at 32 samples, and held-out hack rates of three
    seeds ranged .28–.46 at 128 samples; with ``seed_sd`` 0.5 and ``run_sd`` 0.25 at rate 0.5 the
    run-level sd of one arm's rate is ≈ 0.13. ``run_sd`` 0.25 sits above the point estimate of
    the arm-specific spread on purpose (the gate is tested where the seed level matters).
    ``arm_problem_sd`` 0.5 and ``run_problem_sd`` 0.25 are not measured: they put a
    sizable shared arm × problem term into the paired difference (sd ≈ 0.18 in rate points at
    0.5 for two arms), the case in which a scheme that resamples problems within seeds
    understates the variance.

    Args:
        cells: ``{(arm, view): Planted(...)}``; every arm's views share its run and arm × problem
            effects.
        n_seeds, n_problems, n_samples: sizes (seeds 0..S−1, problems ``p000``.., samples 0..n−1).
        hack_rate, pass_rate: rates at the centre (median problem, seed and run).
        problem_sd, seed_sd, run_sd, arm_problem_sd, run_problem_sd: spreads on the logit scale.
        truncated_rate: probability a completion is truncated. step: the step column.
        modes: problem ``p`` gets ``modes[p % len(modes)]``.
        rng: a numpy Generator or seed.

    Returns:
        The outcomes table, one row per completion.

    Raises:
        ValueError: empty ``cells``, a size below 1, a rate outside (0, 1), or a drop that cannot
            be planted.
    """
    _check_sim(cells, n_seeds, n_problems, n_samples, hack_rate, pass_rate)
    gen = rng if isinstance(rng, np.random.Generator) else np.random.default_rng(rng)
    keys = [(str(a), str(v)) for a, v in cells]
    cells = {(str(a), str(v)): x for (a, v), x in cells.items()}
    S, P, n, C = n_seeds, n_problems, n_samples, len(keys)
    rates = _simulate_rates(cells, S, P, hack_rate, pass_rate, problem_sd, seed_sd, run_sd, arm_problem_sd,
                            run_problem_sd, gen)
    cols = {m: (gen.random((C, S, P, n)) < rates[m][..., None]).astype(np.int8).ravel() for m in ("hack", "pass")}
    cols["truncated"] = (gen.random(C * S * P * n) < truncated_rate).astype(np.int8)
    ci, si, pi, ji = (x.ravel() for x in np.meshgrid(np.arange(C), np.arange(S), np.arange(P), np.arange(n),
                                                     indexing="ij"))
    return pd.DataFrame({
        "arm": np.array([a for a, _ in keys], dtype=object)[ci],
        "view": np.array([v for _, v in keys], dtype=object)[ci],
        "seed": si, "step": np.full(ci.size, step), "problem_id": np.array([f"p{p:03d}" for p in range(P)],
                                                                            dtype=object)[pi],
        "sample": ji, "mode": np.array([modes[p % len(modes)] for p in range(P)], dtype=object)[pi],
        "hack": cols["hack"], "pass": cols["pass"], "truncated": cols["truncated"]})


def simulate_counts(cells: Mapping[tuple[str, str], Planted], *, n_seeds: int = 3, n_problems: int = 9,
                    n_samples: int = 64, hack_rate: float = 0.5, pass_rate: float = 0.15,
                    rng: int | np.random.Generator = 0, **spread: float) -> dict[str, np.ndarray]:
    """The same model as :func:`simulate_outcomes`, drawn as per-cell successes: ``{"hack", "pass"}``
    → ``C × S × P`` binomial counts out of ``n_samples`` (cells in the order of ``cells``) — the
    sufficient statistic of the table, for fast simulation (:func:`simulate_gate`).

    Raises:
        ValueError: as :func:`simulate_outcomes`, or an unknown spread name.
    """
    _check_sim(cells, n_seeds, n_problems, n_samples, hack_rate, pass_rate)
    bad = set(spread) - set(DEFAULT_SPREAD)
    if bad:
        raise ValueError(f"unknown spread {sorted(bad)} (known: {sorted(DEFAULT_SPREAD)})")
    sp = {**DEFAULT_SPREAD, **spread}
    gen = rng if isinstance(rng, np.random.Generator) else np.random.default_rng(rng)
    rates = _simulate_rates(cells, n_seeds, n_problems, hack_rate, pass_rate, sp["problem_sd"], sp["seed_sd"],
                            sp["run_sd"], sp["arm_problem_sd"], sp["run_problem_sd"], gen)
    return {m: gen.binomial(n_samples, rates[m]) for m in ("hack", "pass")}


def _gate_cells(n_arms: int, drop: float, control_drop: float, pass_drop: float, positive_control_drop: float,
                untrained: Planted) -> tuple[list[tuple[str, str]], dict[tuple[str, str], Planted]]:
    """The arms of a simulated experiment: the (treatment, control) names and the planted effect of
    every (arm, view) cell, in the order :func:`simulate_counts` draws them."""
    van, pc = ("vanilla", "trained"), ("oracle_reward", "trained")
    names = [("erase", "random_v")] + [(f"erase{k + 1}", f"random_v{k + 1}") for k in range(1, n_arms)]
    cells = {van: Planted(), pc: Planted(positive_control_drop), ("untrained", "trained"): untrained}
    for a, c in names:
        cells[(a, "trained")] = Planted(drop, pass_drop)
        cells[(c, "trained")] = Planted(control_drop)
    return names, cells


_EFFECT_FIELDS = ("value", "ci_low", "ci_high", "se", "df", "pct_low", "pct_high", "mde")
#: The prefix of each criterion's effect in :func:`simulate_gate`'s rows.
_PREFIX = {"drop": "drop_vs_vanilla", "control": "beats_control", "pass": "matched_pass",
           "untrained_pass": "pass_vs_untrained", "untrained_hack": "hack_vs_untrained"}
_COMPONENT_FIELDS = ("between_seed", "between_problem", "within_problem", "seed_problem")


def _experiment_row(i: int, effs: Mapping[str, Effect], gv: GateVerdict, verdicts: Sequence[ArmVerdict], S: int,
                    P: int, at: float, pass_drop: float, with_power: bool) -> dict[str, Any]:
    """One row of :func:`simulate_gate`'s table from an experiment's first-arm and positive-control
    Effects (``effs``), the gate after the correction (``gv``) and the arms' verdicts before it."""
    av, raw = gv.arms[0], verdicts[0]
    row: dict[str, Any] = {"experiment": i, "verdict": av.verdict, "verdict_raw": raw.verdict, "finding": raw.finding,
                           "gate": gv.verdict, "p_value": raw.p_value, "p_adjusted": av.p_adjusted,
                           "any_separated": any(v.verdict == "separated" for v in gv.arms),
                           "any_separated_raw": any(v.verdict == "separated" for v in verdicts),
                           "power": raw.power_at(at, pass_drop) if with_power else math.nan,
                           "arm_mde": raw.mde(pass_drop=pass_drop) if with_power else math.nan}
    for k, e in effs.items():
        row.update({f"{k}_{f}": getattr(e, f) for f in _EFFECT_FIELDS})
        row[f"{k}_df_satterthwaite"] = (satterthwaite(e.boot_terms, (S - 1, P - 1, (S - 1) * (P - 1)))
                                        if e.boot_terms else math.nan)
        row.update({f"{k}_{f}": getattr(e.components, f) for f in _COMPONENT_FIELDS})
    for c in raw.criteria:
        row[f"{c.name}_mde"], row[f"{c.name}_passed"] = c.mde, c.passed
    return row


def simulate_gate(n_experiments: int, *, drop: float = 0.0, control_drop: float = 0.0, pass_drop: float = 0.0,
                  positive_control_drop: float = 0.3, untrained_hack_drop: float = 0.0,
                  untrained_pass_drop: float = 0.0, n_arms: int = 1, n_seeds: int = 3, n_problems: int = 9,
                  n_samples: int = 64, min_drop: float = MIN_DROP, pass_margin: float = PASS_MARGIN,
                  pass_margin_rel: float | None = None, min_seeds: int = MIN_SEEDS, n_boot: int = 1000,
                  ci: float = CI, power: float = POWER, resample: str | Sequence[str] = RESAMPLE,
                  multiplicity: str = MULTIPLICITY, hack_rate: float = 0.5, pass_rate: float = 0.15,
                  with_power: bool = True, seed: int = 0, **spread: float) -> pd.DataFrame:
    """Run the gate on ``n_experiments`` synthetic experiments (:func:`simulate_counts`, the
    statistics of :func:`evil_moe.gate.effects.effect_from_cells` — exactly what
    :func:`evil_moe.gate.effects.paired_effect` computes from the equivalent table, tested).

    Each experiment has ``vanilla``, the untrained student ``untrained`` (a planted
    ``untrained_hack_drop`` and ``untrained_pass_drop``: with ``untrained_hack_drop = drop`` and
    ``untrained_pass_drop = pass_drop`` the treatments' outcomes are the untrained student's in
    distribution, as an arm that deletes all its training), ``n_arms`` treatment arms ``erase``,
    ``erase2``, … (each a planted ``drop`` in hacking and ``pass_drop`` in passing), their
    matched controls ``random_v``, ``random_v2``, … (``control_drop``) and the positive control
    ``oracle_reward`` (``positive_control_drop``), all on the ``trained`` view; each arm is judged
    on every criterion of :data:`~evil_moe.gate.criteria.CRITERIA` on its sides, the arms
    together (:func:`evil_moe.gate.rule.decide_gate`, ``multiplicity``). The gate's thresholds
    default to ``compare.*``'s (:mod:`evil_moe.gate.defaults`), except ``pass_margin_rel`` (none)
    and ``n_boot`` (1000, for speed).

    Returns:
        One row per experiment: for the first arm's Effects (prefix ``drop_``, ``control_``,
        ``pass_``, ``untrained_pass_``, ``untrained_hack_``) and the positive control's (``pc_``)
        their ``value, ci_low, ci_high, se, df, pct_low, pct_high, mde`` and variance components;
        the first arm's ``finding`` and ``verdict`` after the
        multiplicity correction and ``verdict_raw`` before it, ``p_value``, ``p_adjusted``,
        ``power`` (:meth:`ArmVerdict.power_at` at the planted drops, or at 0.15 when no drop is
        planted) and ``arm_mde`` (NaN unless ``with_power``: they cost most of the time), each
        criterion's MDE and outcome (``{name}_mde``, ``{name}_passed``); over all arms ``any_separated`` (after the correction) and
        ``any_separated_raw`` (before); and the overall ``gate`` verdict.

    Raises:
        ValueError: ``n_arms`` < 1, or as :func:`simulate_counts`.
    """
    if n_arms < 1:
        raise ValueError(f"n_arms must be >= 1, got {n_arms}")
    rs = np.random.SeedSequence(seed).spawn(n_experiments)
    van, pc = ("vanilla", "trained"), ("oracle_reward", "trained")
    names, cells = _gate_cells(n_arms, drop, control_drop, pass_drop, positive_control_drop,
                               Planted(untrained_hack_drop, untrained_pass_drop))
    idx = {k: i for i, k in enumerate(cells)}
    S, P, n = n_seeds, n_problems, n_samples
    full = np.full((S, P), n)
    seeds, problems = list(range(S)), [f"p{p:03d}" for p in range(P)]
    at = drop if drop > 0 else 0.15
    limits = Limits(min_drop, pass_margin, min_seeds, pass_margin_rel)
    rows = []
    for i in range(n_experiments):
        cnt = simulate_counts(cells, n_seeds=S, n_problems=P, n_samples=n, hack_rate=hack_rate, pass_rate=pass_rate,
                              rng=np.random.default_rng(rs[i]), **spread)
        kw = dict(n_boot=n_boot, ci=ci, seed=i, power=power, resample=resample)

        def eff(a, b, metric, **extra):
            return effect_from_cells(a, b, metric, seeds, problems, cnt[metric][idx[a]], full, cnt[metric][idx[b]],
                                     full, **kw, **extra)

        verdicts, first = [], None
        for a, c in names:
            effs = {name: eff(*k.sides(a, "trained", c), k.metric) for name, k in CRITERIA.items()}
            rel = {name: eff(*k.sides(a, "trained", c), k.metric, weight_b=1.0 - pass_margin_rel)
                   for name, k in CRITERIA.items() if k.relative and pass_margin_rel is not None}
            verdicts.append(decide_arm(a, effs, limits, rel))
            if first is None:
                first = effs
        effs = {**{k: first[name] for k, name in _PREFIX.items()}, "pc": eff(pc, van, "hack")}
        gv = decide_gate(verdicts, effs["pc"], min_drop=min_drop, min_seeds=min_seeds, multiplicity=multiplicity)
        rows.append(_experiment_row(i, effs, gv, verdicts, S, P, at, pass_drop, with_power))
    return pd.DataFrame(rows)


def operating_characteristics(n_experiments: int = 400, *, seeds: Sequence[int] = (3, 6, 10, 18),
                              n_problems: int = 16, n_samples: int = 16, drop: float = 0.15,
                              schemes: Sequence[str] = ("crossed", "nested"), n_boot: int = 500,
                              **kw: Any) -> pd.DataFrame:
    """The gate's false-positive rate and power by simulation, per (scheme, seeds).

    For each, :func:`simulate_gate` with no planted effect (``fpr_*``, seed 1) and with ``drop``
    planted vs vanilla and vs the control (``power_*``, seed 2), ``n_experiments`` each, at
    ``n_problems`` × ``n_samples`` and the default spread unless ``kw`` says otherwise. Columns:
    ``fpr_separated`` (the arm's verdict, nominal ≤ 0.025 one-sided), ``fpr_drop`` and
    ``fpr_control`` (drop_vs_vanilla's and beats_control's ``ci_low > 0`` alone, nominal 0.025),
    ``fpr_percentile`` (beats_control with the percentile interval), ``fpr_satterthwaite``
    (beats_control with the plug-in Satterthwaite df instead, crossed only), ``se_ratio`` (mean SE of the
    control effect over the sd of its value across experiments: < 1 means the SE understates
    the variance), ``power_separated``, ``power_drop`` (drop_vs_vanilla passes), ``reported_power``
    (mean of :meth:`ArmVerdict.power_at`), ``mde`` (mean reported MDE of drop_vs_vanilla under no
    effect), ``planned_mde`` (:func:`planned_mde` from the mean estimated components of the
    drop effect), and ``binomial_se`` of a rate of 0.025 over ``n_experiments``.
    """
    rows = []
    for scheme in schemes:
        for S in seeds:
            args = dict(n_seeds=S, n_problems=n_problems, n_samples=n_samples, resample=scheme, n_boot=n_boot, **kw)
            null = simulate_gate(n_experiments, seed=1, **args)
            alt = simulate_gate(n_experiments, drop=drop, seed=2, **args)
            comp = VarianceComponents(*(float(null[f"drop_{f}"].mean()) for f in
                                        ("between_seed", "between_problem", "within_problem", "seed_problem")))
            rows.append({"resample": scheme, "n_seeds": S, "n_problems": n_problems, "n_samples": n_samples,
                         "fpr_separated": float((null["verdict"] == "separated").mean()),
                         "fpr_drop": float((null["drop_ci_low"] > 0).mean()),
                         "fpr_control": float((null["control_ci_low"] > 0).mean()),
                         "fpr_percentile": float((null["control_pct_low"] > 0).mean()),
                         "fpr_satterthwaite": float((null["control_value"] / null["control_se"] > np.array(
                             [critical(x, kw.get("ci", CI)) if x >= 1 else math.inf
                              for x in null["control_df_satterthwaite"].fillna(0)])).mean()),
                         "se_ratio": float(null["control_se"].mean() / null["control_value"].std(ddof=1)),
                         "power_separated": float((alt["verdict"] == "separated").mean()),
                         "power_drop": float(alt["drop_vs_vanilla_passed"].mean()),
                         "reported_power": float(alt["power"].mean()),
                         "mde": float(null["drop_vs_vanilla_mde"].replace(math.inf, np.nan).mean()),
                         "planned_mde": planned_mde(comp, S, n_problems, n_samples, resample=scheme)[1],
                         "binomial_se": math.sqrt(0.025 * 0.975 / n_experiments)})
    return pd.DataFrame(rows)

