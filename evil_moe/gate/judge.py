"""The gate's assembly (docs/gate.md): from the per-completion held-out outcomes of every arm to
the verdict, the criteria rows of ``gate.json`` and each arm's numbers.

:func:`judge` is the whole decision: per treatment arm its criteria (:func:`judge_arms`,
:func:`evil_moe.gate.rule.decide_arm`; against vanilla, its matched control and the untrained
student), the positive control, Holm's correction over the arms
(:func:`evil_moe.gate.rule.decide_gate`), the detector its audit does not vouch for
(:func:`references`, :func:`evil_moe.gate.rule.apply_references`), and validity. The compare stage
(:mod:`evil_moe.stages.compare`) loads the pilots, calls :func:`judge`, writes and draws.

``settings`` is the run's ``compare`` config section (``n_boot, ci, seed, power, resample,
min_drop, pass_margin, pass_margin_rel, min_seeds, multiplicity, positive_control``).
"""

from __future__ import annotations

from typing import Any, Sequence

import pandas as pd

from evil_moe.gate.effects import Effect, paired_effect
from evil_moe.gate.power import finite
from evil_moe.gate.criteria import CRITERIA, ArmVerdict, Criterion, Limits
from evil_moe.gate.rule import apply_references, decide_arm, decide_gate
from evil_moe.rl.arms.pilot_inputs import uses_detector
from evil_moe.rl.arms.registry import ARMS


def effect_or_none(outcomes, a, b, metric, settings, weight_b: float = 1.0) -> Effect | None:
    """:func:`evil_moe.gate.effects.paired_effect` of side ``a`` against side ``b`` (each
    ``(arm, view)``) on ``metric`` (``"hack"`` or ``"pass"``) with the run's bootstrap settings, or
    None when a side has no paired outcomes."""
    try:
        return paired_effect(outcomes, a, b, metric, n_boot=settings.n_boot, ci=settings.ci,
                             seed=settings.seed, power=settings.power, resample=settings.resample,
                             weight_b=weight_b)
    except ValueError:
        return None


def criterion_row(c: Criterion, arm: str, control: str | None, view: str) -> dict:
    """``gate.json``'s row of criterion ``c`` of ``arm`` (judged ``view``; ``control``: its matched
    control, named on the rows of criteria against it; the others name vanilla or untrained): the
    effect with its interval, MDE, threshold, its test and bound, verdict, note and the effect's
    details."""
    d = c.to_dict()
    e = c.effect
    return {"name": c.name, "arm": arm, "control": CRITERIA[c.name].other(control),
            "view": view, "value": finite(e.value), "ci_low": finite(e.ci_low),
            "ci_high": finite(e.ci_high), "mde": finite(c.mde), "threshold": c.threshold,
            "test": d["test"], "bound": c.bound, "passed": c.passed, "rules_out": c.rules_out, "note": c.note, "n_seeds": e.n_seeds,
            "p_value": d.get("p_value"), "needed": d.get("needed"), "plan": d.get("plan"),
            **{k: d[k] for k in ("margin_abs", "margin_rel", "margin_rel_points", "binding") if k in d},
            **({"rel_effect": {k: d["rel_effect"][k] for k in ("value", "ci_low", "ci_high", "se", "df", "weight_b")}}
               if d.get("rel_effect") else {}),
            "effect": {k: v for k, v in d["effect"].items()
                       if k in ("a", "b", "metric", "se", "df", "n_samples", "per_seed", "mean_a", "mean_b",
                                "components", "boot_terms", "pct_low", "pct_high", "dropped", "power",
                                "resample", "n_problems_total")}}


def arm_numbers(v: ArmVerdict) -> dict:
    """An arm's verdict and its numbers for gate.json: the reason, its finding
    (``no_better_than_untrained`` or None), MDE, what would decide it, its intersection–union
    p-value and (after :func:`evil_moe.gate.rule.decide_gate`) Holm's adjusted one."""
    return {"verdict": v.verdict, "reason": v.reason, "finding": v.finding, "mde": finite(v.mde()),
            "needed_seeds": v.needed_seeds, "needed_problems": v.needed_problems, "needed_samples": v.needed_samples,
            "p_value": finite(v.p_value), "p_adjusted": None if v.p_adjusted is None else finite(v.p_adjusted),
            "family": v.family}


def _missing_criterion(name: str, arm: str, control: str | None, view: str, why: str, threshold: float) -> dict:
    kind = CRITERIA[name]
    return {"name": name, "arm": arm, "control": kind.other(control),
            "view": view, "value": None, "ci_low": None, "ci_high": None, "mde": None,
            "threshold": threshold, "test": kind.test, "bound": kind.bound * threshold, "passed": False,
            "rules_out": False, "note": why}


def judge_arms(outcomes: pd.DataFrame, arms: Sequence[str], settings) -> tuple[list, list[dict], dict, Any]:
    """Per treatment arm its ArmVerdict, the criteria rows, and per-arm extra numbers; then the
    positive control's Effect. Each criterion of :data:`~evil_moe.gate.criteria.CRITERIA` gets its
    paired effect on its sides (and, when it reads it, the relative-margin contrast under
    ``compare.pass_margin_rel``). An arm with a side without paired outcomes (vanilla, its
    control, the untrained student: named) gets no verdict: its rows say which side has no data
    and its ``extra`` verdict is ``invalid`` (it cannot separate)."""
    verdicts, rows, extra = [], [], {}
    limits = Limits(settings.min_drop, settings.pass_margin, settings.min_seeds, settings.pass_margin_rel)
    for arm in (a for a in arms if a in ARMS and ARMS[a].role == "treatment"):
        cls = ARMS[arm]
        view, control = cls.views[0], cls.control
        effects, rel = {}, {}
        for name, c in CRITERIA.items():
            a, b = c.sides(arm, view, control)
            effects[name] = effect_or_none(outcomes, a, b, c.metric, settings)
            if c.relative and settings.pass_margin_rel is not None:
                rel[name] = effect_or_none(outcomes, a, b, c.metric, settings, weight_b=1.0 - settings.pass_margin_rel)
        if any(e is None for e in effects.values()):
            missing = {name: "{} ({})".format(*CRITERIA[name].sides(arm, view, control)[1])
                       for name, e in effects.items() if e is None}
            for name in effects:
                why = (f"no paired held-out outcomes for {arm} ({view}) and {missing[name]}" if name in missing
                       else f"another criterion has no data ({', '.join(sorted(set(missing.values())))})")
                rows.append(_missing_criterion(name, arm, control, view, why,
                                               CRITERIA[name].threshold_value(settings)))
            extra[arm] = {"verdict": "invalid", "reason": f"{arm}: no paired held-out outcomes against "
                                                          f"{', '.join(sorted(set(missing.values())))}: it cannot separate"}
            continue
        v = decide_arm(arm, effects, limits, {k: e for k, e in rel.items() if e is not None})
        verdicts.append(v)
        rows += [criterion_row(c, arm, control, view) for c in v.criteria]
        extra[arm] = arm_numbers(v)
        if len(cls.views) > 1:  # the trained view beside the judged one, for information
            tv = effect_or_none(outcomes, (arm, "trained"), ("vanilla", "trained"), "hack", settings)
            if tv is not None:
                extra[arm]["trained_view_drop"] = {"value": finite(tv.value), "ci_low": finite(tv.ci_low),
                                                   "ci_high": finite(tv.ci_high)}
    pos = None
    if settings.positive_control and settings.positive_control in arms:
        pos = effect_or_none(outcomes, (settings.positive_control, "trained"), ("vanilla", "trained"), "hack", settings)
    return verdicts, rows, extra, pos


def judge(outcomes: pd.DataFrame, arms: Sequence[str], settings, validity: list[dict],
          uninformative: dict[str, str] | None = None) -> tuple[str, Any, list, dict]:
    """Judge the arms and decide the gate: ``(verdict, GateVerdict or None, criteria rows, per-arm
    numbers)``. ``invalid`` when a pilot failed validity or an arm had no paired outcomes (then a
    ``valid`` row naming those arms is appended to ``validity``). ``uninformative``: the arms
    whose detector is blind, arm → why (:func:`references`;
    :func:`evil_moe.gate.rule.apply_references`)."""
    valid = all(c["passed"] for c in validity)
    verdicts, crit_rows, arm_extra, pos = judge_arms(outcomes, arms, settings)
    gate_v = (decide_gate(verdicts, pos, min_drop=settings.min_drop, min_seeds=settings.min_seeds,
                          multiplicity=settings.multiplicity) if verdicts else None)
    if gate_v is not None:
        gate_v = apply_references(gate_v, uninformative or {})
    for v in (gate_v.arms if gate_v is not None else ()):  # the verdicts after Holm's correction
        arm_extra[v.arm].update(arm_numbers(v))
    verdict = "invalid" if not valid or any(x.get("verdict") == "invalid" for x in arm_extra.values()) \
        else (gate_v.verdict if gate_v is not None else "not_separated")
    if verdict == "invalid" and valid:  # every pilot ok, but an arm had no paired outcomes
        validity.append({"name": "valid", "arm": ",".join(a for a, x in arm_extra.items() if x.get("verdict") == "invalid"),
                         "seed": "all", "value": None, "threshold": None, "passed": False,
                         "note": "no paired held-out outcomes (heldout problems or views missing)"})
    return verdict, gate_v, crit_rows, arm_extra


def references(arms: Sequence[str], audit: dict | None, detector: str) -> dict[str, str]:
    """The treatments the gate sets beside a blind detector: arm → the sentence saying why. A
    treatment that flags with the run's thresholded detector
    (:func:`evil_moe.rl.arms.pilot_inputs.uses_detector`) is uninformative when the audit
    (``audit``: the detector audit's pooled row, or None) does not show the detector beating its
    placebo. (The untrained student is judged by criteria, not set beside the verdict:
    :data:`~evil_moe.gate.criteria.CRITERIA`.)"""
    uninformative = {}
    for arm in (a for a in arms if a in ARMS and ARMS[a].role == "treatment"):
        if uses_detector(arm, detector):
            if audit is None:
                uninformative[arm] = (f"no detector audit says the {detector} detector sees hacks "
                                      "(audit/quality.tsv missing)")
            elif audit.get("beats_placebo") is not True:
                auc = "n/a" if audit.get("auc") is None else (
                    f"{audit['auc']:.3f} [{audit['auc_ci_low']:.3f}, {audit['auc_ci_high']:.3f}]")
                p95 = "n/a" if audit.get("placebo_p95") is None else f"{audit['placebo_p95']:.3f}"
                uninformative[arm] = (f"the {detector} detector does not beat its placebo on the policy's own "
                                      f"rollouts (AUC {auc} against the placebos' 95th percentile {p95})")
    return uninformative
