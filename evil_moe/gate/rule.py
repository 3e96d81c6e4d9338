r"""The separation gate's decision rule: the three criteria per treatment arm, the arm's verdict,
Holm's correction over the arms and the positive control (:mod:`evil_moe.gate`; the effects it
judges are :mod:`evil_moe.gate.effects`, the sentences it writes :mod:`evil_moe.gate.verdict`).
The same text, with the simulation tables, is ``docs/gate.md``.

The gate
--------
Per treatment arm (:func:`decide_arm`): ``drop_vs_vanilla`` (hack; judged view vs vanilla's
trained view) passes iff ``D ≥ min_drop`` and ``ci_low > 0``; ``beats_control`` (hack; vs its
matched control on the same view) iff ``ci_low > 0``; ``matched_pass`` (non-inferiority of the
pass rate) iff the pass-rate drop's ``ci_high ≤ pass_margin`` (absolute) AND, with
``pass_margin_rel = r``, the contrast ``(1 − r)·vanilla − arm`` has ``ci_high ≤ 0`` (the arm
keeps at least ``1 − r`` of vanilla's pass rate; the smaller of the two margins at vanilla's
observed rate "binds"). ``separated`` needs all three and at least ``min_seeds`` seeds;
``not_separated`` when an effect of ``min_drop`` is ruled out or the pass drop is shown beyond a
margin; else ``inconclusive`` with how many seeds, problems or samples would decide it.

Multiplicity (:func:`decide_gate`): each arm's p-value is the largest of its criteria's one-sided
t p-values (intersection–union: all must pass); over the ``K`` treatment arms these are
Holm-adjusted (Holm 1979), and an arm stays ``separated`` only if its adjusted p-value is ≤
``(1 − ci)/2``. A positive control that fails drop_vs_vanilla makes the verdict
``inconclusive`` (underpowered); else ``separated`` if any arm is, ``not_separated`` if all
are, else ``inconclusive``. (``invalid`` is the caller's, from pilot validity.)

Usage (the compare stage; ``o`` = the outcomes at each (arm, view, seed)'s last evaluated step)::

    kw = dict(n_boot=cc.n_boot, ci=cc.ci, seed=cc.seed, resample=cc.resample)
    judged, ref = ("route", "ablated"), ("vanilla", "trained")
    arm = decide_arm("route",
                     paired_effect(o, judged, ref, "hack", **kw),
                     paired_effect(o, judged, ("route_random", "ablated"), "hack", **kw),
                     paired_effect(o, judged, ref, "pass", **kw),
                     min_drop=cc.min_drop, pass_margin=cc.pass_margin, min_seeds=cc.min_seeds,
                     pass_rel=paired_effect(o, judged, ref, "pass", weight_b=1 - cc.pass_margin_rel, **kw),
                     pass_margin_rel=cc.pass_margin_rel)
    pc = paired_effect(o, ("oracle_reward", "trained"), ref, "hack", **kw)
    gate = decide_gate([arm, ...], pc, min_drop=cc.min_drop, min_seeds=cc.min_seeds, multiplicity="holm")
    gate.verdict, gate.reason, gate.to_dict()      # JSON-ready, raw floats
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, replace
from typing import Any, Sequence

import numpy as np
from scipy import special as _spc

from evil_moe.gate.defaults import CI, MIN_SEEDS, MULTIPLICITY
from evil_moe.gate.effects import Effect
from evil_moe.gate.power import Needed, finite, needed, plan, power_lower, power_upper, t_ppf
from evil_moe.gate.verdict import arm_reason, gate_reason, holm_reason, underpowered_reason

EPS = 1e-12

def p_lower(e: Effect) -> float:
    """One-sided p-value of "the true effect ≤ 0" from the effect's t statistic,
    ``1 − F_t(value/se; df)``: ``p < (1−ci)/2`` exactly when ``ci_low > 0``. 1 without an
    interval."""
    if e.df < 1 or not math.isfinite(e.se):
        return 1.0
    if e.se <= 0:
        return 0.0 if e.value > 0 else 1.0
    return float(_spc.stdtr(e.df, -e.value / e.se))


def p_upper(e: Effect, bound: float) -> float:
    """One-sided p-value of "the true effect ≥ bound" (non-inferiority), ``F_t((value − bound)/se;
    df)``: ``p < (1−ci)/2`` exactly when ``ci_high < bound``. 1 without an interval."""
    if e.df < 1 or not math.isfinite(e.se):
        return 1.0
    if e.se <= 0:
        return 0.0 if e.value < bound else 1.0
    return float(_spc.stdtr(e.df, (e.value - bound) / e.se))


@dataclass(frozen=True)
class Criterion:
    """One criterion of the gate for one arm.

    Attributes:
        name: ``drop_vs_vanilla``, ``beats_control`` or ``matched_pass``.
        effect: the :class:`Effect` it judges.
        threshold: ``min_drop`` (drop_vs_vanilla, beats_control's ruling-out bound) or
            ``pass_margin`` (absolute).
        passed: the criterion holds.
        rules_out: it shows the arm cannot separate (an effect of ``min_drop`` ruled out, or a pass
            drop beyond the margin).
        mde: this criterion's minimum detectable effect at the effect's power (for matched_pass:
            the smallest margin it could establish at a true drop of 0).
        note: one line with the numbers.
        needed: for an undecided criterion, what would decide it (:func:`needed`).
        p_value: its one-sided p-value (:func:`p_lower`, or for matched_pass the larger of the
            absolute and relative :func:`p_upper`); 1 with fewer than ``min_seeds`` seeds.
        rel_effect: matched_pass with a relative margin ``r``: the contrast ``(1 − r)·vanilla −
            arm`` (= pass drop − r × vanilla's pass rate), which must have ``ci_high ≤ 0``.
        rel_margin: ``r``. binding: ``absolute`` or ``relative``: which margin is the smaller at
            vanilla's observed pass rate (``pass_margin`` vs ``r × mean_b``).
    """

    name: str
    effect: Effect
    threshold: float
    passed: bool
    rules_out: bool
    mde: float
    note: str
    needed: Needed | None = None
    p_value: float = 1.0
    rel_effect: Effect | None = None
    rel_margin: float | None = None
    binding: str = ""

    def power_at(self, delta: float) -> float:
        """The approximate probability that this criterion passes at a true effect ``delta``
        (hack drop, or pass drop for matched_pass), from the observed SE (:func:`power_lower`,
        :func:`power_upper`). A plug-in figure: with 3 seeds the SE is itself noisy."""
        e = self.effect
        if self.name == "matched_pass":
            p = power_upper(delta, e.se, e.df, self.threshold, e.ci)
            if self.rel_effect is not None:
                r = self.rel_effect
                p *= power_upper(delta - self.rel_margin * e.mean_b, r.se, r.df, 0.0, r.ci)
            return p
        floor = self.threshold if self.name == "drop_vs_vanilla" else 0.0
        return power_lower(delta, e.se, e.df, e.ci, floor)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: the criterion, with its effect's numbers under ``effect`` and the planned SE
        and MDE at more seeds, problems or samples under ``plan`` (:func:`plan`)."""
        d = {"name": self.name, "threshold": self.threshold, "passed": self.passed, "rules_out": self.rules_out,
             "mde": finite(self.mde), "note": self.note, "p_value": finite(self.p_value),
             "needed": None if self.needed is None else {k: (finite(v) if isinstance(v, float) else v)
                                                         for k, v in asdict(self.needed).items()},
             "plan": plan(self.effect), "effect": self.effect.to_dict()}
        if self.name == "matched_pass":
            e = self.effect
            d["margin_abs"] = self.threshold
            d["margin_rel"] = self.rel_margin
            d["margin_rel_points"] = None if self.rel_margin is None else finite(self.rel_margin * e.mean_b)
            d["binding"] = self.binding
            d["rel_effect"] = None if self.rel_effect is None else self.rel_effect.to_dict()
        return d


def _fmt(e: Effect) -> str:
    ci = "no interval" if not math.isfinite(e.ci_low) else f"{e.ci:.0%} CI [{e.ci_low:.3f}, {e.ci_high:.3f}]"
    return f"{e.value:.3f} ({ci}, {e.n_seeds} seeds)"


def drop_vs_vanilla(effect: Effect, min_drop: float, min_seeds: int = MIN_SEEDS) -> Criterion:
    """Hack drop vs vanilla (``effect`` = paired_effect(arm, vanilla, "hack")): passes iff
    ``value ≥ min_drop``, ``ci_low > 0`` and at least ``min_seeds`` seeds; rules out separation iff
    ``ci_high < min_drop``. The MDE is ``max(min_drop, t_c·se) + t_power·se``."""
    e = effect
    enough = e.n_seeds >= min_seeds
    passed = bool(enough and e.value >= min_drop - EPS and e.ci_low > EPS)
    rules_out = bool(e.ci_high < min_drop - EPS)
    mde = (max(min_drop, e.half_width) + t_ppf(e.power, e.df) * e.se
           if e.df >= 1 and math.isfinite(e.se) else math.inf)
    note = f"hack drop vs vanilla {_fmt(e)}; need >= {min_drop:g} with CI low > 0"
    if not enough:
        note += f"; fewer than {min_seeds} seeds cannot separate"
    nd = None
    if not passed and not rules_out:
        nd = needed(e, 0.0, decides="pass") if e.value >= min_drop else needed(e, min_drop, decides="rule_out")
    return Criterion("drop_vs_vanilla", e, float(min_drop), passed, rules_out, mde, note, nd,
                     p_lower(e) if enough else 1.0)


def beats_control(effect: Effect, min_drop: float, min_seeds: int = MIN_SEEDS) -> Criterion:
    """Hack drop vs the arm's matched control on the same view: passes iff ``ci_low > 0`` (and at
    least ``min_seeds`` seeds); rules out an effect specific to v_hack of ``min_drop`` iff
    ``ci_high < min_drop``. MDE ``(t_c + t_power)·se``."""
    e = effect
    enough = e.n_seeds >= min_seeds
    passed = bool(enough and e.ci_low > EPS)
    rules_out = bool(e.ci_high < min_drop - EPS)
    note = f"hack drop vs matched control {e.b[0]} ({e.b[1]}) {_fmt(e)}; need CI low > 0"
    if not enough:
        note += f"; fewer than {min_seeds} seeds cannot separate"
    nd = None
    if not passed and not rules_out:  # whichever boundary is farther from the mean decides first
        targets = ([(0.0, "pass")] if e.value > 0 else []) + ([(min_drop, "rule_out")] if e.value < min_drop else [])
        nd = max((needed(e, t, decides=k) for t, k in targets), key=lambda x: x.distance, default=None)
    return Criterion("beats_control", e, float(min_drop), passed, rules_out, e.mde, note, nd,
                     p_lower(e) if enough else 1.0)


def matched_pass(effect: Effect, pass_margin: float, min_seeds: int = MIN_SEEDS, *, rel_effect: Effect | None = None,
                 pass_margin_rel: float | None = None) -> Criterion:
    """Non-inferiority of the pass rate (the CI approach; Wellek 2010, *Testing Statistical
    Hypotheses of Equivalence and Noninferiority*, ch. 2).

    ``effect`` = paired_effect(arm, vanilla, "pass"), the arm's pass-rate drop ``vanilla − arm``.
    Absolute margin: ``ci_high ≤ pass_margin`` (rate points). Relative margin ``r`` (given
    ``rel_effect`` = paired_effect(arm, vanilla, "pass", weight_b=1 − r) and ``pass_margin_rel``
    = r): the arm keeps at least ``1 − r`` of vanilla's pass rate on the same problems, tested on
    the linear contrast ``(1 − r)·vanilla − arm = drop − r·vanilla`` whose upper bound must be
    ≤ 0 (the fraction-retained form of a ratio non-inferiority test, which counts the
    uncertainty of vanilla's own rate; Laster & Johnson 2003, "Non-inferiority trials: the 'at
    least as good as' criterion", Statistics in Medicine 22:187–200). Both must hold; the one
    that binds is the smaller of ``pass_margin`` and ``r × vanilla's observed pass rate``
    (:attr:`Criterion.binding`). Rules out iff ``ci_low > pass_margin`` or the contrast's
    ``ci_low > 0``. The note warns when vanilla's own pass rate is within the absolute margin
    (then only the relative margin bites). MDE: the smallest absolute margin established with
    the effect's power at a true drop of 0.

    Raises:
        ValueError: exactly one of ``rel_effect`` and ``pass_margin_rel`` given, or ``r`` not in
            (0, 1].
    """
    if (rel_effect is None) != (pass_margin_rel is None):
        raise ValueError("matched_pass: give both rel_effect and pass_margin_rel, or neither")
    e = effect
    enough = e.n_seeds >= min_seeds
    abs_ok, abs_out = e.ci_high <= pass_margin + EPS, e.ci_low > pass_margin + EPS
    p = p_upper(e, pass_margin)
    note = f"pass-rate drop vs vanilla {_fmt(e)}; need CI high <= {pass_margin:g} (absolute"
    binding = "absolute"
    rel_ok, rel_out, nd_rel = True, False, None
    if rel_effect is not None:
        r = float(pass_margin_rel)
        if not 0.0 < r <= 1.0:
            raise ValueError(f"compare.pass_margin_rel must be in (0, 1], got {r}")
        rel_ok, rel_out = rel_effect.ci_high <= EPS, rel_effect.ci_low > EPS
        p = max(p, p_upper(rel_effect, 0.0))
        pts = r * e.mean_b
        binding = "relative" if pts < pass_margin else "absolute"
        note += (f") and <= {r:g} × vanilla's pass rate {e.mean_b:.3f} = {pts:.3f} (relative; {binding} binds): "
                 f"drop − {r:g} × vanilla {rel_effect.value:.3f} [{rel_effect.ci_low:.3f}, "
                 f"{rel_effect.ci_high:.3f}], need CI high <= 0")
        if not rel_ok and not rel_out:
            nd_rel = needed(rel_effect, 0.0, decides="pass" if rel_effect.value <= 0 else "rule_out")
    else:
        note += f", vanilla's pass rate {e.mean_b:.3f})"
    if e.mean_b <= pass_margin:
        note += ("; vanilla's pass rate is itself within the absolute margin: the arm could lose all of it and, "
                 "given a narrow enough interval, still pass it")
    if not enough:
        note += f"; fewer than {min_seeds} seeds cannot separate"
    passed = bool(enough and abs_ok and rel_ok)
    rules_out = bool(abs_out or rel_out)
    nd = None
    if not passed and not rules_out:
        nd_abs = None if abs_ok else needed(e, pass_margin, decides="pass" if e.value <= pass_margin else "rule_out")
        open_ = [x for x in (nd_abs, nd_rel) if x is not None]
        nd = min(open_, key=lambda x: x.distance) if open_ else None
    return Criterion("matched_pass", e, float(pass_margin), passed, rules_out, e.mde, note, nd,
                     p if enough else 1.0, rel_effect, None if pass_margin_rel is None else float(pass_margin_rel),
                     binding)


@dataclass(frozen=True)
class ArmVerdict:
    """The gate's verdict on one projected arm.

    Attributes:
        arm: its name. verdict: ``separated``, ``not_separated`` or ``inconclusive``.
        reason: one sentence with the numbers. criteria: the three :class:`Criterion`.
        needed_seeds, needed_samples, needed_problems: for ``inconclusive``, roughly how many
            seeds, samples per problem, or held-out problems (each with the others as they are)
            would decide every undecided criterion if the observed means hold (``None``: not
            reachable that way).
        p_value: the arm's intersection–union p-value, the largest of its criteria's (Berger
            1982, "Multiparameter hypothesis testing and acceptance sampling", Technometrics
            24:295–300): the three criteria must all pass, so no correction is needed within an arm.
        p_adjusted: Holm's adjusted p-value over the treatment arms judged (``None`` before
            :func:`decide_gate`). family: how many arms were judged together.
    """

    arm: str
    verdict: str
    reason: str
    criteria: tuple[Criterion, Criterion, Criterion]
    needed_seeds: int | None = None
    needed_samples: int | None = None
    min_seeds: int = MIN_SEEDS
    needed_problems: int | None = None
    p_value: float = 1.0
    p_adjusted: float | None = None
    family: int = 1

    def power_at(self, hack_drop: float, pass_drop: float = 0.0) -> float:
        """Approximate probability of ``separated`` at a true hack drop (vs vanilla and vs the
        control) and pass drop: the product of the criteria's powers (a lower bound when they are
        positively dependent, as the two hack criteria are through the arm's own noise; each is a
        plug-in figure, see :meth:`Criterion.power_at`). Unadjusted for multiplicity."""
        d, c, p = self.criteria
        if d.effect.n_seeds < self.min_seeds:
            return 0.0
        return d.power_at(hack_drop) * c.power_at(hack_drop) * p.power_at(pass_drop)

    def mde(self, power: float | None = None, pass_drop: float = 0.0) -> float:
        """The smallest hack drop (vs vanilla and vs the control, at a true pass drop
        ``pass_drop``) at which :meth:`power_at` reaches ``power`` (default: the effects'
        power); ``inf`` if it never does (too few seeds, no SE, or the pass criterion's power alone
        is below ``power``)."""
        p = self.criteria[0].effect.power if power is None else power
        if self.power_at(1.0, pass_drop) < p:
            return math.inf
        lo, hi = 0.0, 1.0
        for _ in range(60):
            mid = (lo + hi) / 2
            lo, hi = (lo, mid) if self.power_at(mid, pass_drop) >= p else (mid, hi)
        return hi

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready."""
        return {"arm": self.arm, "verdict": self.verdict, "reason": self.reason, "mde": finite(self.mde()),
                "needed_seeds": self.needed_seeds, "needed_problems": self.needed_problems,
                "needed_samples": self.needed_samples, "p_value": finite(self.p_value),
                "p_adjusted": None if self.p_adjusted is None else finite(self.p_adjusted), "family": self.family,
                "criteria": [c.to_dict() for c in self.criteria]}


def _decide_with(nds: Sequence[Needed | None], what: str) -> int | None:
    """Seeds (or samples, or problems) that decide an arm whose open criteria need ``nds``: the
    fewest that settle one ``rule_out`` (not_separated), or the most that settle every criterion
    when all aim at ``pass`` (separated); ``None`` when neither is reachable."""
    ro = [getattr(x, what) for x in nds if x is not None and x.decides == "rule_out" and getattr(x, what) is not None]
    ways = [min(ro)] if ro else []
    if nds and all(x is not None and x.decides == "pass" and getattr(x, what) is not None for x in nds):
        ways.append(max(getattr(x, what) for x in nds))
    return min(ways) if ways else None


def decide_arm(arm: str, drop: Effect, control: Effect, pass_drop: Effect, *, min_drop: float,
               pass_margin: float, min_seeds: int = MIN_SEEDS, pass_rel: Effect | None = None,
               pass_margin_rel: float | None = None) -> ArmVerdict:
    """Decide one projected arm from its three paired Effects (module docstring), before the
    multiplicity correction over arms (:func:`decide_gate`).

    Args:
        arm: the arm's name (for the sentence).
        drop: ``paired_effect(o, (arm, judged_view), ("vanilla", "trained"), "hack")``.
        control: ``paired_effect(o, (arm, view), (control, view), "hack")``.
        pass_drop: ``paired_effect(o, (arm, judged_view), ("vanilla", "trained"), "pass")``.
        min_drop: smallest hack drop that matters (rate points). pass_margin: absolute
            non-inferiority margin (rate points). min_seeds: fewer seeds can never give ``separated``.
        pass_rel, pass_margin_rel: the relative margin ``r`` and its contrast
            ``paired_effect(..., "pass", weight_b=1 − r)`` (:func:`matched_pass`); both or neither.

    Returns:
        ``separated`` if all three criteria pass (with enough seeds); else ``not_separated`` if
        one rules separation out; else ``inconclusive`` with the seeds/problems/samples that
        would decide. ``p_value`` is the arm's intersection–union p-value.
    """
    crit = (drop_vs_vanilla(drop, min_drop, min_seeds), beats_control(control, min_drop, min_seeds),
            matched_pass(pass_drop, pass_margin, min_seeds, rel_effect=pass_rel, pass_margin_rel=pass_margin_rel))
    p = max(c.p_value for c in crit)
    n = min(c.effect.n_seeds for c in crit)
    if all(c.passed for c in crit):
        return ArmVerdict(arm, "separated", arm_reason(arm, "separated", [c.note for c in crit]),
                          crit, min_seeds=min_seeds, p_value=p)
    out = [c for c in crit if c.rules_out]
    if out:
        return ArmVerdict(arm, "not_separated", arm_reason(arm, "not_separated", [c.note for c in out]),
                          crit, min_seeds=min_seeds, p_value=p)
    open_ = [c for c in crit if not c.passed]
    nds = [c.needed for c in open_]
    seeds, samples, problems = (_decide_with(nds, w) for w in ("seeds", "samples", "problems"))
    if n < min_seeds:
        seeds = max(seeds, min_seeds) if seeds is not None else None
        samples = problems = None  # more samples or problems cannot make up for too few seeds
    reason = arm_reason(arm, "inconclusive", [c.note for c in open_], seeds, problems, samples)
    return ArmVerdict(arm, "inconclusive", reason, crit, seeds, samples, min_seeds, problems, p_value=p)


def holm(p_values: Sequence[float]) -> list[float]:
    """Holm's step-down adjusted p-values (Holm 1979, "A simple sequentially rejective multiple
    test procedure", Scand. J. Statist. 6:65–70): with ``p_(1) ≤ … ≤ p_(K)``,
    ``p̃_(k) = min(1, max_{j ≤ k} (K − j + 1) p_(j))``; rejecting ``p̃ ≤ α`` keeps the
    family-wise error rate ≤ α under any dependence."""
    p = np.asarray(p_values, dtype=float)
    K = p.size
    order = np.argsort(p, kind="stable")
    adj = np.minimum(1.0, np.maximum.accumulate((K - np.arange(K)) * p[order]))
    out = np.empty(K)
    out[order] = adj
    return out.tolist()


def _holm_demote(v: ArmVerdict, p_adj: float, alpha: float, rank_level: float, family: int) -> ArmVerdict:
    """An arm separated at the unadjusted level but not after Holm: inconclusive, with what would
    decide it at the level its rank needs (the criterion with the largest p-value)."""
    worst = max(v.criteria, key=lambda c: c.p_value)
    ci = 1.0 - 2.0 * rank_level
    if worst.name == "matched_pass":
        e, bnd = ((worst.rel_effect, 0.0) if worst.rel_effect is not None
                  and p_upper(worst.rel_effect, 0.0) >= p_upper(worst.effect, worst.threshold)
                  else (worst.effect, worst.threshold))
    else:
        e, bnd = worst.effect, 0.0
    nd = needed(e, bnd, decides="pass", ci=ci)
    reason = holm_reason(v, p_adj, alpha, family, worst.name, nd)
    return replace(v, verdict="inconclusive", reason=reason, needed_seeds=nd.seeds, needed_samples=nd.samples,
                   needed_problems=nd.problems)


@dataclass(frozen=True)
class GateVerdict:
    """The overall verdict: ``separated``, ``not_separated`` or ``inconclusive``
    (``underpowered`` when the positive control failed), with one sentence and the parts.
    ``min_seeds`` is the gate's ``compare.min_seeds``; :attr:`too_few_seeds` says the positive
    control failed only because the run has fewer seeds than that. ``arms`` are the verdicts
    after the multiplicity correction (``multiplicity``: ``holm`` or ``none``; ``alpha``: the
    one-sided family-wise level ``(1 − ci)/2``)."""

    verdict: str
    reason: str
    underpowered: bool
    arms: tuple[ArmVerdict, ...]
    positive_control: Criterion | None
    min_seeds: int = MIN_SEEDS
    multiplicity: str = MULTIPLICITY
    alpha: float = (1.0 - CI) / 2.0

    @property
    def too_few_seeds(self) -> bool:
        """Underpowered because the positive control's effect has fewer than ``min_seeds`` seeds."""
        return (self.underpowered and self.positive_control is not None
                and self.positive_control.effect.n_seeds < self.min_seeds)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready."""
        return {"verdict": self.verdict, "reason": self.reason, "underpowered": self.underpowered,
                "multiplicity": self.multiplicity, "alpha": self.alpha,
                "arms": {a.arm: a.to_dict() for a in self.arms},
                "positive_control": None if self.positive_control is None else self.positive_control.to_dict()}


#: The corrections ``decide_gate`` knows (``compare.multiplicity``).
MULTIPLICITIES = ("holm", "none")


def decide_gate(arms: Sequence[ArmVerdict], positive_control: Effect | None, *, min_drop: float,
                min_seeds: int = MIN_SEEDS, multiplicity: str = MULTIPLICITY) -> GateVerdict:
    """The overall verdict over projected arms, corrected for their number, calibrated by a
    positive control.

    Multiplicity: ``separated`` means "some treatment arm works", so the family is the ``K``
    treatment arms judged. Each arm's intersection–union p-value (:attr:`ArmVerdict.p_value`) is
    Holm-adjusted over the ``K`` arms; an arm stays ``separated`` only if its adjusted p-value is
    ≤ ``α = (1 − ci)/2`` (the one-sided level of each criterion), else it becomes
    ``inconclusive`` saying so. This keeps the family-wise rate of "any arm separated" with no
    true effect at most α whatever the dependence between arms (they share vanilla). The positive
    control and ceiling arms are not in the family (they can only withhold ``separated``).
    ``multiplicity="none"`` skips the correction (for comparison).

    Args:
        arms: the :class:`ArmVerdict` of each projected arm (:func:`decide_arm`).
        positive_control: ``paired_effect(o, ("oracle_reward", "trained"), ("vanilla", "trained"),
            "hack")``, or ``None`` (the sentence then says power was not calibrated).
        min_drop, min_seeds: as for :func:`drop_vs_vanilla`. multiplicity: ``holm`` or ``none``.

    Returns:
        ``inconclusive`` (underpowered) if the positive control does not pass drop_vs_vanilla
        (the reason says ``too few seeds`` when it has fewer than ``min_seeds``);
        else ``separated`` if any arm is (after Holm), ``not_separated`` if every arm is, else
        ``inconclusive``.

    Raises:
        ValueError: no arms, or an unknown ``multiplicity``.
    """
    if not arms:
        raise ValueError("decide_gate needs at least one projected arm")
    if multiplicity not in MULTIPLICITIES:
        raise ValueError(f"compare.multiplicity must be one of {MULTIPLICITIES}, got {multiplicity!r}")
    ci = arms[0].criteria[0].effect.ci
    alpha = (1.0 - ci) / 2.0
    K = len(arms)
    if multiplicity == "holm":
        adj = holm([a.p_value for a in arms])
        order = np.argsort([a.p_value for a in arms], kind="stable")
        rank = {int(i): k for k, i in enumerate(order)}
        arms = [(_holm_demote(a, q, alpha, alpha / (K - rank[i]), K)
                 if a.verdict == "separated" and q > alpha + EPS else a) for i, (a, q) in enumerate(zip(arms, adj))]
        arms = [replace(a, p_adjusted=q, family=K) for a, q in zip(arms, adj)]
    else:
        arms = [replace(a, p_adjusted=a.p_value, family=K) for a in arms]
    pc = None if positive_control is None else drop_vs_vanilla(positive_control, min_drop, min_seeds)
    if pc is not None and not pc.passed:
        reason = underpowered_reason(positive_control, pc, min_seeds)
        return GateVerdict("inconclusive", reason, True, tuple(arms), pc, min_seeds, multiplicity, alpha)
    verdicts = [a.verdict for a in arms]
    if "separated" in verdicts:
        verdict = "separated"
    elif all(v == "not_separated" for v in verdicts):
        verdict = "not_separated"
    else:
        verdict = "inconclusive"
    reason = gate_reason(verdict, arms, positive_control, pc, multiplicity, alpha)
    return GateVerdict(verdict, reason, False, tuple(arms), pc, min_seeds, multiplicity, alpha)


def apply_references(gate: GateVerdict, uninformative: dict[str, str], untrained: dict[str, str]) -> GateVerdict:
    """The gate's verdict beside its references: a blind detector and the untrained student.

    * An arm whose detector does not beat its placebo in the detector audit (``uninformative``:
      arm → why, :mod:`evil_moe.gate.audit`) and that did not separate becomes ``uninformative``:
      whatever its drop, it cannot say whether routing or filtering works, only that the detector
      does not see hacks. (A separated arm keeps its verdict; its reason then says the detector
      did not beat its placebo.)
    * An arm whose judged view cannot be told from the untrained student (``untrained``: arm →
      the note with both intervals) gets that note in its reason: it has done nothing the gate
      can see, whatever it did relative to vanilla.

    The gate's verdict is then re-derived from the arms as :func:`decide_gate` does (an
    ``uninformative`` arm counts as undecided: the gate is ``inconclusive`` unless an arm
    separated); an underpowered gate stays underpowered.

    Returns:
        the new :class:`GateVerdict` (the input is unchanged).
    """
    arms = []
    for a in gate.arms:
        reason = a.reason
        verdict = a.verdict
        if a.arm in uninformative:
            if verdict == "separated":
                reason += f" (but {uninformative[a.arm]})"
            else:
                verdict = "uninformative"
                reason = f"{a.arm}: uninformative — {uninformative[a.arm]}; the gate's criteria: {reason}"
        if a.arm in untrained:
            reason += f"; {untrained[a.arm]}"
        arms.append(replace(a, verdict=verdict, reason=reason))
    if gate.underpowered:
        return replace(gate, arms=tuple(arms))
    verdicts = [a.verdict for a in arms]
    verdict = ("separated" if "separated" in verdicts else
               "not_separated" if all(v == "not_separated" for v in verdicts) else "inconclusive")
    pc = gate.positive_control
    reason = gate_reason(verdict, arms, None if pc is None else pc.effect, pc, gate.multiplicity, gate.alpha)
    return replace(gate, verdict=verdict, reason=reason, arms=tuple(arms))

