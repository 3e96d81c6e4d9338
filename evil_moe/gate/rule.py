r"""The separation gate's decision rule: an arm's verdict from its criteria, Holm's correction over
the arms and the positive control (:mod:`evil_moe.gate`; the criteria, one declaration each, are
:mod:`evil_moe.gate.criteria`, the effects they judge :mod:`evil_moe.gate.effects`, the sentences
it writes :mod:`evil_moe.gate.verdict`). The same text, with the simulation tables, is
``docs/gate.md``.

The gate
--------
Per treatment arm (:func:`decide_arm`, over :data:`~evil_moe.gate.criteria.CRITERIA`): ``drop_vs_vanilla`` (hack; judged view vs vanilla's
trained view) passes iff ``D ≥ min_drop`` and ``ci_low > 0``; ``beats_control`` (hack; vs its
matched control on the same view) iff ``ci_low > 0``; ``matched_pass`` (non-inferiority of the
pass rate) iff the pass-rate drop's ``ci_high ≤ pass_margin`` (absolute) AND, with
``pass_margin_rel = r``, the contrast ``(1 − r)·vanilla − arm`` has ``ci_high ≤ 0`` (the arm
keeps at least ``1 − r`` of vanilla's pass rate; the smaller of the two margins at vanilla's
observed rate "binds"); ``pass_vs_untrained`` (superiority of the pass rate over the untrained
student) iff the pass-rate drop vs untrained has ``ci_high < 0``; ``hack_vs_untrained``
(non-inferiority of the hack rate) iff the hack drop vs untrained has ``ci_low > −min_drop``.
``separated`` needs all five and at least ``min_seeds`` seeds; ``not_separated`` when an effect
of ``min_drop`` is ruled out, the pass drop is shown beyond a margin, a gain in pass rate over
the untrained student is ruled out or a hack rate above its plus ``min_drop`` is shown; else
``inconclusive`` with how many seeds, problems or samples would decide it. An arm whose pass
rate is not shown above the untrained student's is "no better than not training"
(:attr:`~evil_moe.gate.criteria.ArmVerdict.finding`), said first in its reason.

Multiplicity (:func:`decide_gate`): each arm's p-value is the largest of its criteria's one-sided
t p-values (intersection–union: all must pass); over the ``K`` treatment arms these are
Holm-adjusted (Holm 1979), and an arm stays ``separated`` only if its adjusted p-value is ≤
``(1 − ci)/2``. A positive control that fails drop_vs_vanilla makes the verdict
``inconclusive`` (underpowered); else ``separated`` if any arm is, ``not_separated`` if all
are, else ``inconclusive``. (``invalid`` is the caller's, from pilot validity.)

Usage (the compare stage; ``o`` = the outcomes at each (arm, view, seed)'s last evaluated step)::

    kw = dict(n_boot=cc.n_boot, ci=cc.ci, seed=cc.seed, resample=cc.resample)
    judged, ref = ("route", "ablated"), ("vanilla", "trained")
    effects = {"drop_vs_vanilla": paired_effect(o, judged, ref, "hack", **kw),
               "beats_control": paired_effect(o, judged, ("route_dose_matched", "ablated"), "hack", **kw),
               "matched_pass": paired_effect(o, judged, ref, "pass", **kw),
               "pass_vs_untrained": paired_effect(o, judged, ("untrained", "trained"), "pass", **kw),
               "hack_vs_untrained": paired_effect(o, judged, ("untrained", "trained"), "hack", **kw)}
    rel = {"matched_pass": paired_effect(o, judged, ref, "pass", weight_b=1 - cc.pass_margin_rel, **kw)}
    arm = decide_arm("route", effects, Limits(cc.min_drop, cc.pass_margin, cc.min_seeds, cc.pass_margin_rel), rel)
    pc = paired_effect(o, ("oracle_reward", "trained"), ref, "hack", **kw)
    gate = decide_gate([arm, ...], pc, min_drop=cc.min_drop, min_seeds=cc.min_seeds, multiplicity="holm")
    gate.verdict, gate.reason, gate.to_dict()      # JSON-ready, raw floats
"""

from __future__ import annotations

from dataclasses import replace
from typing import Mapping, Sequence

import numpy as np

from evil_moe.gate.criteria import (CRITERIA, EPS, ArmVerdict, GateVerdict, Limits, drop_vs_vanilla)
from evil_moe.gate.defaults import MIN_SEEDS, MULTIPLICITY
from evil_moe.gate.effects import Effect
from evil_moe.gate.sizing import Needed, needed
from evil_moe.gate.verdict import arm_reason, finding_text, gate_reason, holm_reason, underpowered_reason

def _decide_with(nds: Sequence[Needed | None], what: str) -> int | None:
    """Seeds (or samples, or problems) that decide an arm whose open criteria need ``nds``: the
    fewest that settle one ``rule_out`` (not_separated), or the most that settle every criterion
    when all aim at ``pass`` (separated); ``None`` when neither is reachable."""
    ro = [getattr(x, what) for x in nds if x is not None and x.decides == "rule_out" and getattr(x, what) is not None]
    ways = [min(ro)] if ro else []
    if nds and all(x is not None and x.decides == "pass" and getattr(x, what) is not None for x in nds):
        ways.append(max(getattr(x, what) for x in nds))
    return min(ways) if ways else None


def decide_arm(arm: str, effects: Mapping[str, Effect], limits: Limits,
               rel_effects: Mapping[str, Effect] | None = None) -> ArmVerdict:
    """Decide one treatment arm from its paired Effect per criterion (module docstring), before
    the multiplicity correction over arms (:func:`decide_gate`).

    Args:
        arm: the arm's name (for the sentence).
        effects: ``{criterion name: Effect}`` for every one of
            :data:`~evil_moe.gate.criteria.CRITERIA` (its sides:
            :meth:`~evil_moe.gate.criteria.GateCriterion.sides`), e.g. ``drop_vs_vanilla``:
            ``paired_effect(o, (arm, judged_view), ("vanilla", "trained"), "hack")``.
        limits: the thresholds (``min_drop``, ``pass_margin``, ``min_seeds``, ``pass_margin_rel``).
        rel_effects: for a criterion that reads the relative-margin contrast (``matched_pass``
            under ``pass_margin_rel = r``), ``paired_effect(..., weight_b=1 − r)``; both or neither
            with ``limits.pass_margin_rel``.

    Returns:
        ``separated`` if every criterion passes (with enough seeds); else ``not_separated`` if
        one rules separation out; else ``inconclusive`` with the seeds/problems/samples that
        would decide. ``p_value`` is the arm's intersection–union p-value; ``finding`` the
        finding of the first criterion that declares one and whose interval does not clear its
        bound (:meth:`~evil_moe.gate.criteria.Criterion.clears`), its words opening the reason
        (:func:`~evil_moe.gate.verdict.finding_text`).

    Raises:
        KeyError: an effect missing for a criterion.
    """
    rel_effects = rel_effects or {}
    crit = tuple(c.judge(effects[name], rel_effects.get(name), limits) for name, c in CRITERIA.items())
    min_seeds = limits.min_seeds
    p = max(c.p_value for c in crit)
    n = min(c.effect.n_seeds for c in crit)
    finding = next((CRITERIA[c.name].finding for c in crit if CRITERIA[c.name].finding and not c.clears()), None)
    found = finding_text(finding, crit) if finding else ""
    if all(c.passed for c in crit):
        return ArmVerdict(arm, "separated", arm_reason(arm, "separated", [c.note for c in crit]),
                          crit, min_seeds=min_seeds, p_value=p)
    out = [c for c in crit if c.rules_out]
    if out:
        return ArmVerdict(arm, "not_separated", arm_reason(arm, "not_separated", [c.note for c in out], finding=found),
                          crit, min_seeds=min_seeds, p_value=p, finding=finding)
    open_ = [c for c in crit if not c.passed]
    nds = [c.needed for c in open_]
    seeds, samples, problems = (_decide_with(nds, w) for w in ("seeds", "samples", "problems"))
    if n < min_seeds:
        seeds = max(seeds, min_seeds) if seeds is not None else None
        samples = problems = None  # more samples or problems cannot make up for too few seeds
    reason = arm_reason(arm, "inconclusive", [c.note for c in open_], seeds, problems, samples, finding=found)
    return ArmVerdict(arm, "inconclusive", reason, crit, seeds, samples, min_seeds, problems, p_value=p,
                      finding=finding)


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
    e, bnd = worst.tested()
    nd = needed(e, bnd, decides="pass", ci=ci)
    reason = holm_reason(v, p_adj, alpha, family, worst.name, nd)
    return replace(v, verdict="inconclusive", reason=reason, needed_seeds=nd.seeds, needed_samples=nd.samples,
                   needed_problems=nd.problems)


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


def apply_references(gate: GateVerdict, uninformative: dict[str, str]) -> GateVerdict:
    """The gate's verdict beside a blind detector: an arm whose detector does not beat its
    placebo in the detector audit (``uninformative``: arm → why, :mod:`evil_moe.gate.audit`) and
    that did not separate becomes ``uninformative``: whatever its drop, it cannot say whether
    routing or filtering works, only that the detector does not see hacks. (A separated arm keeps
    its verdict; its reason then says the detector did not beat its placebo.) The untrained
    student is no reference set beside the verdict: the criteria against it decide
    (:data:`~evil_moe.gate.criteria.CRITERIA`).

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
        arms.append(replace(a, verdict=verdict, reason=reason))
    if gate.underpowered:
        return replace(gate, arms=tuple(arms))
    verdicts = [a.verdict for a in arms]
    verdict = ("separated" if "separated" in verdicts else
               "not_separated" if all(v == "not_separated" for v in verdicts) else "inconclusive")
    pc = gate.positive_control
    reason = gate_reason(verdict, arms, None if pc is None else pc.effect, pc, gate.multiplicity, gate.alpha)
    return replace(gate, verdict=verdict, reason=reason, arms=tuple(arms))
