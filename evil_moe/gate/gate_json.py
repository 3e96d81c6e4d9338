"""``gate.json``: the gate's whole record of one comparison, built here from the pilots as read
(:mod:`evil_moe.pilots`) — the verdict and its sentence, every criterion row (one ``valid`` row
per pilot, then each treatment's), the positive control, each arm's status and numbers, the notes
beside the verdict, the ceilings and absorption, the detector's and the router's audits, the
sizes and the config. The compare stage (:mod:`evil_moe.stages.compare`) loads the pilots, calls
:func:`build_gate` and writes; the verdict's words are :mod:`evil_moe.gate.verdict`'s.
"""

from __future__ import annotations

from typing import Sequence

import pandas as pd

from evil_moe.env.loopholes import MODES
from evil_moe.gate import summary
from evil_moe.gate.audit import router_audit
from evil_moe.gate.ceilings import ceiling_columns, router_notes
from evil_moe.gate.judge import criterion_row, effect_or_none, judge, references
from evil_moe.gate.power import finite
from evil_moe.gate.summary import all_steps_max, all_steps_mean
from evil_moe.gate.trajectory import rebound_notes, rebounds, step_rates, trajectory_outcomes
from evil_moe.gate.verdict import ceiling_notes, change_text, sentence
from evil_moe.pilots import Pilot, last_step_outcomes
from evil_moe.rl.arms.registry import ARMS

TRUNCATION_NOTE = 0.5  # a held-out view whose truncated share exceeds this gets a note
SAMPLER_GAP_NOTE = 1e-3  # nats: a sampler/trainer gap above float noise gets a note


def _dose_note(arm: str, control: str, by: dict) -> list[str]:
    """The note that an arm and its dose-matched control sent the same share of their split
    gradient's energy to the hack expert (``steps.tsv`` ``hack_expert_share``, mean over steps
    and seeds); empty when either has none."""
    a = all_steps_mean(by.get(arm, {}), "hack_expert_share")
    c = all_steps_mean(by.get(control, {}), "hack_expert_share")
    if a is None or c is None:
        return []
    return [f"{arm} sent {a:.3f} of each step's split gradient energy to the hack expert (hack_expert_share, "
            f"mean over steps and seeds); its dose-matched control {control} {c:.3f}"]


def _flag_note(arm: str, cls, by: dict) -> list[str]:
    """The note on a flagging arm's detector: its flag rate (of the rows with gradient, or of every
    rollout for the penalty arms), precision and recall against the true hack label (``steps.tsv``,
    mean over steps and seeds) beside its random-flag control's precision; empty without them."""
    prec = all_steps_mean(by.get(arm, {}), "flag_precision")
    if prec is None:
        return []
    cprec = all_steps_mean(by.get(cls.control, {}), "flag_precision")
    rate = all_steps_mean(by.get(arm, {}), "flag_rate")
    rec = all_steps_mean(by.get(arm, {}), "flag_recall")
    rows = "rollouts" if cls.penalises else "rows with gradient"  # the penalty flags every rollout
    text = (f"{arm}'s detector flagged {rate:.3f} of the {rows}, precision {prec:.3f} and recall "
            f"{rec if rec is not None else float('nan'):.3f} against the true hack label (mean over steps and seeds)")
    if cprec is None:
        return [text]
    return [text + f", against random flags' precision {cprec:.3f} ({cls.control})"
            + ("" if prec > cprec else ": no better than chance")]


def notes(by: dict[str, dict[int, Pilot]], arms: Sequence[str], outcomes: pd.DataFrame, cc,
          isolation: Sequence[str], moe_forward: str = "straight_through") -> list[str]:
    """Things a reader must know beside the verdict (docs/method.md, docs/gate.md); the router
    arms' sampler gap is by design only under ``moe.forward: scaled``."""
    notes = []
    for arm in arms:
        cls = ARMS.get(arm)
        if cls is None or cls.role != "treatment" or not cls.control:
            continue
        dose_matched = cls.control in ARMS and ARMS[cls.control].match_by == "dose"
        if dose_matched:  # route, route_oracle, moe: the dose both sides sent to delta_s_hack
            notes += _dose_note(arm, cls.control, by)
        if cls.flags_rollouts():  # route / filter / penalty: the detector's flags against the true label
            notes += _flag_note(arm, cls, by)
            continue
        if dose_matched:
            continue
        if cls.shortcut:  # Advantage Modification projects nothing: its discount against its control's
            d = all_steps_mean(by.get(arm, {}), "shortcut_discount")
            dc = all_steps_mean(by.get(cls.control, {}), "shortcut_discount")
            if d is not None and dc is not None:
                notes.append(f"{arm} discounted its rewarded rollouts' reward by {d:.3f} on average (mean over steps "
                             f"and seeds), its control {cls.control} by {dc:.3f}")
            continue
        a = all_steps_mean(by.get(arm, {}), "removed_frac")
        c = all_steps_mean(by.get(cls.control, {}), "removed_frac")
        if cls.router and a is not None and c is not None:
            notes.append(f"{arm}'s router sent {a:.3f} of each step's gradient energy to the hack expert (mean over "
                         f"steps and seeds), its control {cls.control}'s {c:.3f}")
            continue
        if a is not None and c is not None:
            verb = "more than" if a > c else "no more than"
            notes.append(f"{arm} removed {a:.3f} of the energy it acted on per step (mean over steps and seeds), "
                         f"{verb} its control {cls.control} ({c:.3f})"
                         + ("" if a > c else ": the projection removed nothing specific to v_hack"))
    for arm in (a for a in arms if a in ARMS and ARMS[a].static_twin):
        twin = ARMS[arm].static_twin
        e = effect_or_none(outcomes, (arm, ARMS[arm].views[0]), twin, "hack", cc)
        if e is not None:
            same = e.ci_low <= 0 <= e.ci_high and abs(e.value) < cc.min_drop
            change = change_text({"value": e.value, "ci_low": finite(e.ci_low), "ci_high": finite(e.ci_high)})
            notes.append(f"{arm}'s deploy view vs {twin[0]}'s static projection ({twin[0]}'s final delta_s with "
                         f"the hack-ward part of its total update removed once): change in hack rate, {arm}'s "
                         f"minus the projection's, {change}"
                         + (f" — they coincide: {arm} is a post-hoc subtraction" if same else ""))
    if not outcomes.empty:
        tr = outcomes.groupby(["arm", "view"])["truncated"].mean()
        over = tr[tr > TRUNCATION_NOTE]
        if len(over):
            which = ", ".join(f"{a} ({v}) {x:.2f}" for (a, v), x in over.items())
            notes.append(f"truncation dominates held-out completions of {which}: raise pilot.max_new, "
                         "or the hack and pass rates measure running out of tokens")
    gaps = {a: all_steps_max(by.get(a, {}), "sampler_gap_p95") for a in arms}
    gaps = {a: g for a, g in gaps.items() if g is not None and g > SAMPLER_GAP_NOTE}
    routed = {a: gaps.pop(a) for a in list(gaps) if a in ARMS and ARMS[a].router and moe_forward == "scaled"}
    if routed:  # the scaled forward weighs the hack expert by w < 1: a gap by design
        which = ", ".join(f"{a} {g:.3f} (frac_clipped max {all_steps_max(by.get(a, {}), 'frac_clipped'):.3f})"
                          for a, g in routed.items())
        notes.append(f"the router's scaled forward (delta_s + w·delta_s_hack, moe.forward) differs from the sampled policy (both "
                     f"experts at full weight) by design; largest per-step 95th percentile of |log pi_train - "
                     f"log pi_sampler|, nats: {which}; the PPO clip bounds it (docs/evil-moe.md)")
    if gaps:
        which = ", ".join(f"{a} {g:.3f}" for a, g in gaps.items())
        notes.append(f"the training log-probs differ from the sampler's (largest per-step 95th percentile of "
                     f"|log pi_train - log pi_sampler|, nats: {which}): sampling applies a top-p or other "
                     "logits processing that training does not; on-policy ratios are computed against the "
                     "training distribution")
    bad_iso = sorted({i for i in isolation if i and i != "bwrap"})
    if bad_iso:
        notes.append(f"the grader ran with isolation {', '.join(bad_iso)} (not the bubblewrap sandbox)")
    return notes


def arm_info(arms: Sequence[str], seeds: Sequence[int], by: dict[str, dict[int, Pilot]], rows: list[dict],
              arm_extra: dict) -> dict:
    """``gate.json``'s ``arms``: per arm its role, control, views, per-seed status, summary rows and
    (treatments) its verdict and numbers."""
    arm_info = {}
    for a in arms:
        cls = ARMS.get(a)
        arm_info[a] = {"role": cls.role if cls else None, "control": cls.control if cls else None,
                       "views": list(cls.views) if cls else [],
                       "status": {str(s): (by[a][s].status if s in by.get(a, {}) else "missing") for s in seeds},
                       "rates": [r for r in rows if r["arm"] == a], **arm_extra.get(a, {})}
    return arm_info


def known_modes(cfg) -> list[str]:
    """``vhack.known_modes`` of the run (every mode when null or absent)."""
    try:
        known = cfg.vhack.known_modes
    except (AttributeError, KeyError):
        known = None
    return list(known) if known else list(MODES)


def by_arm(pilots: Sequence[Pilot]) -> dict[str, dict[int, Pilot]]:
    """The pilots that have steps, by arm and seed (what the numbers and figures read)."""
    out: dict[str, dict[int, Pilot]] = {}
    for p in pilots:
        if p.steps is not None:
            out.setdefault(p.run.arm, {})[p.run.seed] = p
    return out


def validity_rows(pilots: Sequence[Pilot], max_fc: float) -> list[dict]:
    """One ``valid`` criterion row per pilot: ok, or its status and why (``max_fc``: the clip bound)."""
    return [{"name": "valid", "arm": p.run.arm, "seed": p.run.seed, "value": p.frac_clipped_max,
             "threshold": max_fc, "passed": p.status == "ok",
             "note": "ok" if p.status == "ok" else f"{p.status}: {p.reason}"} for p in pilots]


def build_gate(pilots: Sequence[Pilot], cfg, audit: dict | None = None,
               vhack_pairs: int | None = None) -> tuple[dict, list[dict]]:
    """The gate of the expected ``pilots`` (read, or marked missing; in the order expected):
    ``(gate.json's dict, summary rows)``.

    Judges the treatments on the pilots' last evaluated held-out outcomes
    (:func:`evil_moe.gate.judge.judge`, against vanilla, the matched controls and the untrained
    student, beside ``audit``, the detector audit's pooled row of ``pilot.detector``), and gathers each arm's numbers
    (:mod:`evil_moe.gate.summary`), the ceilings and absorption, the router's audit
    (:func:`evil_moe.gate.audit.router_audit`) and the notes (:func:`notes`); where the pilots
    evaluated along the run, the held-out ``trajectory`` (per arm, view and step) and the
    ``rebounds`` (per trained arm: the rebound rule's finding or null,
    :mod:`evil_moe.gate.trajectory`), with a note on each. ``cfg``: the run
    config (``compare``, ``pilot.max_frac_clipped``, ``pilot.detector``, ``moe.forward``,
    ``vhack.known_modes``); ``vhack_pairs``: the pairs v_hack was extracted from (the labels it
    read, :func:`evil_moe.gate.summary.label_columns`), None when not known. Keys in
    ``gate.json``'s order; the caller adds ``ignored``.
    """
    cc = cfg.compare
    max_fc = float(cfg.pilot.max_frac_clipped)
    arms = list(dict.fromkeys(p.run.arm for p in pilots))
    seeds = sorted({p.run.seed for p in pilots})
    by, validity = by_arm(pilots), validity_rows(pilots, max_fc)
    outcomes = last_step_outcomes(p for p in pilots if p.outcomes is not None)
    routers = router_audit(by, arms, cc)
    verdict, gate_v, crit_rows, arm_extra = judge(outcomes, arms, cc, validity,
                                                  references(arms, audit, cfg.pilot.detector))
    isolation = [p.isolation for p in pilots if p.isolation]
    rows = summary.summary_rows(by, arms, outcomes, seeds, cc)
    known = known_modes(cfg)
    summary.flag_columns(rows, by)
    summary.label_columns(rows, cfg, audit, vhack_pairs)
    ceilings = ceiling_columns(rows, outcomes, cc, known)
    summary.router_columns(rows, routers)
    size = summary.sizes(outcomes)
    pc_crit = gate_v.positive_control if gate_v is not None else None
    along = trajectory_outcomes(pilots)
    traj = {"trajectory": step_rates(along, cc), "rebounds": rebounds(along, cc)} if not along.empty else {}
    gate = {"verdict": verdict,
            "sentence": sentence(verdict, validity, gate_v, size),
            "underpowered": bool(gate_v.underpowered) if gate_v is not None else False,
            "criteria": validity + crit_rows,
            "positive_control": None if pc_crit is None else criterion_row(pc_crit, pc_crit.effect.a[0], None, "trained"),
            "arms": arm_info(arms, seeds, by, rows, arm_extra),
            "notes": (notes(by, arms, outcomes, cc, isolation, cfg.moe.forward) + ceiling_notes(ceilings)
                      + router_notes(routers) + rebound_notes(traj.get("rebounds"), traj.get("trajectory", []))),
            "ceilings": ceilings, "known_modes": known, **traj,
            "detector": None if audit is None else audit,
            "router_audit": routers,
            "isolation": sorted(set(isolation)), "sizes": size,
            "config": dict(cfg.raw["compare"]), "max_frac_clipped": max_fc,
            "pilots": [str(p.run.path) for p in pilots]}
    return gate, rows
