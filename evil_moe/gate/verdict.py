"""The one place the separation gate's verdict is put into words.

Everything a reader is told about the verdict is written here, from the numbers of
:mod:`evil_moe.gate.rule`:

- :func:`sentence`: ``gate.json``'s one-sentence verdict with rounded numbers (the compare stage);
- :func:`gate_md`: ``gate.md``, the criteria as a short markdown table;
- :func:`plain_verdict`: the verdict in plain words (the change in hack rate, a rise reads as a
  rise), first on the report's page and in the README (:func:`change_text`);
- :func:`verdict_line` and :func:`arithmetic_line`: the report's first line and the gate's
  arithmetic below it (:func:`arithmetic_text`; reStructuredText; ``rules/common.smk`` and
  :mod:`evil_moe.gate.frontpage` call them for ``sweep_decision``; the criteria, notes and sweep
  decision below the figure are :func:`evil_moe.gate.frontpage.decision_text`);
- :func:`arm_verdict_cell`: an arm's verdict in the first page's per-arm table
  (:mod:`evil_moe.gate.frontpage`);
- :func:`arm_reason`, :func:`holm_reason`, :func:`underpowered_reason`, :func:`gate_reason`: the
  ``reason`` of each arm's and the gate's verdict (:mod:`evil_moe.gate.rule` calls them);
- :func:`finding_text`: an arm's finding in words, with its changes vs the untrained student
  ("no better than not training": :data:`FINDINGS`), first in its reason, the sentence, the
  verdict in plain words, the arithmetic and the per-arm table's verdict cell;
- :func:`more_text`: "about N seeds, … would decide it" (the reasons and the sentence);
- :func:`ceiling_notes`: each treatment beside its ceiling (``gate.json``'s notes, and the first
  page's in changes).

The first page, the README and ``make run`` speak one convention: every difference of rates is
the arm's rate minus the other side's (negative = lower, a true minus sign, :func:`change_text`).
``gate.json`` (its criteria rows, ``sentence`` and notes) and ``summary.tsv`` keep the drops the
gate is defined on (the other side's rate minus the arm's); only the words shown differ.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Sequence

from evil_moe.gate.criteria import CRITERIA, ArmVerdict, Criterion, GateVerdict
from evil_moe.gate.power import finite
from evil_moe.gate.rst import rst_text
from evil_moe.gate.sizing import Needed, plan

if TYPE_CHECKING:
    from evil_moe.gate.effects import Effect


def more_text(seeds: int | None, problems: int | None, samples: int | None) -> str:
    """What more data would decide: ``about 12 seeds, about 40 held-out problems or about 300
    samples per problem`` (the parts given; empty when none is)."""
    more = []
    if seeds is not None:
        more.append(f"about {seeds} seeds")
    if problems is not None:
        more.append(f"about {problems} held-out problems")
    if samples is not None:
        more.append(f"about {samples} samples per problem")
    return ", ".join(more[:-1]) + (" or " if len(more) > 1 else "") + more[-1] if more else ""


#: The words of each finding (:attr:`evil_moe.gate.criteria.GateCriterion.finding`), as the
#: reasons, the sentence, the verdict in plain words and the first page's table say it.
FINDINGS = {"no_better_than_untrained": "no better than not training"}


def finding_text(finding: str, criteria: Sequence[Criterion | dict]) -> str:
    """The finding's words (:data:`FINDINGS`) and the arm's changes against the other side of the
    criterion that declares it, with their intervals (the arm's rate minus that side's,
    :func:`change_text`): ``no better than not training (change vs untrained: pass rate −0.017
    [−0.069, +0.035], hack rate −0.102 [−0.195, −0.008])``. ``criteria``: the arm's
    :class:`~evil_moe.gate.criteria.Criterion` records, or its ``gate.json`` criterion rows."""
    rows = [c if isinstance(c, dict) else _effect_row(c) for c in criteria]
    (src,) = [k for k in CRITERIA.values() if k.finding == finding]
    vs = [r for r in rows if r.get("name") in CRITERIA and CRITERIA[r["name"]].against == src.against]
    changes = ", ".join(f"{CRITERIA[r['name']].metric} rate {change_text(r)}" for r in vs)
    return f"{FINDINGS[finding]} (change vs {src.other(None)}: {changes})" if changes else FINDINGS[finding]


def _effect_row(c: Criterion) -> dict:
    """A criterion's name and effect as a ``gate.json`` row's ``value``, ``ci_low``, ``ci_high``."""
    e = c.effect
    return {"name": c.name, "value": e.value, "ci_low": finite(e.ci_low), "ci_high": finite(e.ci_high)}


def arm_reason(arm: str, verdict: str, notes: Sequence[str], seeds: int | None = None,
               problems: int | None = None, samples: int | None = None, finding: str = "") -> str:
    """An arm's ``reason`` (:func:`evil_moe.gate.rule.decide_arm`): ``"<arm>: <verdict> — "``,
    the finding's words first when it has one (``finding``: :func:`finding_text`), and the notes
    of the criteria that decide it; for ``inconclusive``, what more would decide it (``seeds``,
    ``problems``, ``samples``; :func:`more_text`) or that nothing reachable would."""
    text = f"{arm}: {verdict.replace('_', ' ')} — " + "; ".join(([finding] if finding else []) + list(notes))
    if verdict != "inconclusive":
        return text
    more = more_text(seeds, problems, samples)
    tail = (more + " would decide it if the observed means hold" if more else
            "no reachable number of seeds, problems or samples would decide it at the observed means (a mean "
            "near its boundary)")
    return text + "; " + tail


def holm_reason(v: ArmVerdict, p_adj: float, alpha: float, family: int,
                binds: str, nd: Needed) -> str:
    """The ``reason`` of an arm separated before Holm's correction but not after it: its p-value,
    the adjusted one, the criterion that binds, and what more would decide it (``nd``)."""
    more = more_text(nd.seeds, nd.problems, nd.samples)
    return (f"{v.arm}: inconclusive — every criterion passes at the unadjusted level, but not after Holm's "
            f"correction for {family} treatment arms (p {v.p_value:.4f}, adjusted {p_adj:.4f} > {alpha:g}; "
            f"{binds} binds)" + (f"; {more} would decide it if the observed means hold" if more else "")
            + " — " + "; ".join(c.note for c in v.criteria))


def underpowered_reason(positive_control: Effect, pc: Criterion, min_seeds: int) -> str:
    """The gate's ``reason`` when its positive control fails drop_vs_vanilla: too few seeds (fewer
    than ``min_seeds``) or underpowered."""
    if positive_control.n_seeds < min_seeds:
        return (f"inconclusive (too few seeds): {positive_control.n_seeds} seeds, fewer than "
                f"min_seeds {min_seeds}, cannot separate any arm, the positive control included")
    return (f"inconclusive (underpowered): the positive control {positive_control.a[0]} does not "
            f"separate from vanilla ({pc.note}), so this experiment cannot tell a working arm "
            f"from a failing one")


def gate_reason(verdict: str, arms: Sequence[ArmVerdict],
                positive_control: Effect | None, pc: Criterion | None,
                multiplicity: str, alpha: float) -> str:
    """The gate's ``reason`` (:func:`evil_moe.gate.rule.decide_gate`) for ``separated`` (the
    separated arms' reasons), ``not_separated`` (every arm's) or ``inconclusive`` (the inconclusive
    arms'), with Holm's correction when it applied and the positive control's note."""
    if verdict == "separated":
        reason = "; ".join(a.reason for a in arms if a.verdict == "separated")
    elif verdict == "not_separated":
        reason = "; ".join(a.reason for a in arms)
    else:
        reason = "; ".join(a.reason for a in arms if a.verdict in ("inconclusive", "uninformative"))
    K = len(arms)
    if multiplicity == "holm" and K > 1:
        reason += f" (Holm's correction over {K} treatment arms, family-wise one-sided level {alpha:g})"
    reason += (f" (positive control {positive_control.a[0]}: {pc.note})" if pc is not None
               else " (no positive control: the gate's power was not checked)")
    return reason


def _r3(x) -> str:
    return "n/a" if x is None or not math.isfinite(x) else f"{x:.3f}"


def _ci(e) -> str:
    return "[no interval]" if not math.isfinite(e.ci_low) else f"[{e.ci_low:.3f}, {e.ci_high:.3f}]"


def _pass_text(p: Criterion) -> str:
    """The pass-rate drop and its margins: the absolute one, and the relative one beside it with
    which binds."""
    e = p.effect
    text = f"pass-rate drop {e.value:.3f} (upper {e.ci_high:.3f} vs margin {p.threshold:g}"
    if p.rel_effect is not None:
        text += (f" and {p.rel_margin:g} × vanilla's {e.mean_b:.3f} = {p.rel_margin * e.mean_b:.3f}, "
                 f"{p.binding} binds; drop − {p.rel_margin:g} × vanilla upper {p.rel_effect.ci_high:.3f} vs 0")
    return text + ")"


def _plan_text(c: Criterion) -> str:
    """Which of twice the seeds, problems or samples buys the most power (planned MDE each)."""
    return _plan_words(c.name, plan(c.effect))


def _plan_words(name: str, pl: dict | None) -> str:
    """:func:`_plan_text` from a :func:`evil_moe.gate.sizing.plan` dict (``gate.json``'s criterion
    ``plan``) of criterion ``name``; empty without a best option."""
    if not pl or pl.get("best") is None:
        return ""
    what = {"seeds": "seeds", "problems": "held-out problems", "samples": "samples per problem"}
    opts = ", ".join(f"{what[k]} {pl[k]['mde']:.3f}" for k in ("seeds", "problems", "samples")
                     if pl[k]["mde"] is not None)
    now = (pl.get("now") or {}).get("mde")
    return (f"; twice the {what[pl['best']]} buys the most power for {name} (planned MDE at twice the {opts}; "
            f"now {_r3(now if now is not None else math.inf)})")


def _untrained_drops(criteria: Sequence[Criterion]) -> str:
    """``, vs untrained: pass-rate drop -0.120 [-0.200, -0.040], hack drop 0.010 [-0.030, 0.050]``:
    the drops of the criteria against the untrained student (empty without them)."""
    vs = [c for c in criteria if CRITERIA[c.name].against == "untrained"]
    drops = ", ".join(f"{'pass-rate' if CRITERIA[c.name].metric == 'pass' else 'hack'} drop {c.effect.value:.3f} "
                      f"{_ci(c.effect)}" for c in vs)
    return f", vs untrained: {drops}" if drops else ""


def _arm_phrase(v: ArmVerdict) -> str:
    """One arm in the sentence: its drops vs vanilla and vs its control with intervals, its pass
    criterion, its drops vs the untrained student (or its finding: "but is no better than not
    training", with the changes), Holm's adjustment, and for an inconclusive arm what is open and
    what would decide."""
    by = {c.name: c for c in v.criteria}
    d, c, p = by["drop_vs_vanilla"], by["beats_control"], by["matched_pass"]
    view = d.effect.a[1]
    found = finding_text(v.finding, v.criteria) if v.finding else ""
    if v.verdict == "uninformative":  # the reason opens with why (apply_references)
        return v.reason.split("; the gate's criteria:")[0] + (f"; {v.arm} is {found}" if found else "")
    base = (f"{v.arm} ({view} view) lowers the held-out hack rate by {d.effect.value:.3f} {_ci(d.effect)} vs "
            f"vanilla and by {c.effect.value:.3f} {_ci(c.effect)} vs {c.effect.b[0]}, {_pass_text(p)}"
            + (f", but is {found}" if found else _untrained_drops(v.criteria)))
    if v.family > 1:
        base += f", p {v.p_value:.3g} (Holm-adjusted over {v.family} arms {v.p_adjusted:.3g})"
    if v.verdict == "inconclusive":
        open_ = [x for x in v.criteria if not x.passed and not x.rules_out]
        if open_:
            base += f"; undecided: {', '.join(x.name for x in open_)}"
        elif v.p_adjusted is not None and v.p_adjusted > v.p_value:
            base += "; every criterion passes, but not after Holm's correction"
        base += f"; MDE of the drop vs vanilla {_r3(d.mde)}"
        more = more_text(v.needed_seeds, v.needed_problems, v.needed_samples)
        base += f"; {more} would decide it" if more else ""
        hack_open = [x for x in open_ if CRITERIA[x.name].metric == "hack"]
        base += _plan_text(hack_open[0]) if hack_open else ""
    return base


def sentence(verdict: str, validity: list[dict], gate: GateVerdict | None,
             sizes: str) -> str:
    """``gate.json``'s ``sentence``: the verdict (``invalid``, ``separated``, ``not_separated``,
    ``inconclusive``) in one sentence with rounded numbers, opening with the verdict word.

    Args:
        verdict: the overall verdict. validity: the ``valid`` criteria rows (one per pilot).
        gate: the rule's :class:`~evil_moe.gate.criteria.GateVerdict` (``None``: no treatment arm ran).
        sizes: ``"S seeds × P held-out problems × n samples"``.
    """
    if verdict == "invalid":
        bad = [c for c in validity if not c["passed"]]
        which = "; ".join(f"{c['arm']} s{c['seed']}: {c['note']}" for c in bad)
        return (f"invalid: {len(bad)} of {len(validity)} pilots failed validity ({which}) "
                "— fix or rerun them before judging separation.")
    if gate is None:
        return "not separated: no treatment arm was run — the sweep is not justified."
    pc = gate.positive_control
    pc_text = ("no positive control: the gate's power was not checked" if pc is None else
               f"positive control {pc.effect.a[0]} drop {pc.effect.value:.3f} {_ci(pc.effect)}")
    if gate.too_few_seeds:
        return (f"inconclusive (too few seeds): {pc.effect.n_seeds} seeds, fewer than compare.min_seeds "
                f"{gate.min_seeds}, cannot separate any arm, the positive control included ({pc_text}; {sizes}) "
                f"— add seeds (pilot.seeds); the sweep is not scheduled.")
    if gate.underpowered:
        return (f"inconclusive (underpowered): the positive control {pc.effect.a[0]} does not separate from "
                f"vanilla (drop {pc.effect.value:.3f} {_ci(pc.effect)}, MDE {_r3(pc.mde)}), so this run cannot "
                f"tell a working arm from a failing one ({sizes}) — the sweep is not scheduled.")
    arms = {v.verdict: [] for v in gate.arms}
    for v in gate.arms:
        arms[v.verdict].append(v)
    if verdict == "separated":
        parts = "; ".join(_arm_phrase(v) for v in arms["separated"])
        return f"separated: {parts}, over {sizes}; {pc_text} — the sweep is justified."
    if verdict == "not_separated":
        parts = "; ".join(_arm_phrase(v) for v in gate.arms)
        what = ("separation" if any(v.finding for v in gate.arms) else
                f"an effect of min_drop {gate.arms[0].criteria[0].threshold:g}")
        return (f"not separated: {what} is ruled out for every treatment arm ({parts}), over {sizes}; {pc_text} "
                "— the sweep is not justified.")
    parts = "; ".join(_arm_phrase(v) for v in arms.get("inconclusive", []) + arms.get("uninformative", []))
    return f"inconclusive: {parts}; over {sizes}; {pc_text} — the sweep is not scheduled."


def gate_md(gate: dict) -> str:
    """``gate.md``: the verdict, its sentence, the criteria as a markdown table and the notes,
    from the ``gate.json`` dict."""
    lines = [f"# Separation gate: {gate['verdict']}", "", gate["sentence"], "",
             "| criterion | arm | vs | view | value [CI] | MDE | threshold | passed | note |",
             "|---|---|---|---|---|---|---|---|---|"]
    for c in gate["criteria"]:
        arm = c["arm"] + (f" s{c['seed']}" if "seed" in c else "")
        val = "" if c.get("value") is None else f"{c['value']:.3f}"
        if c.get("ci_low") is not None:
            val += f" [{c['ci_low']:.3f}, {c['ci_high']:.3f}]"
        mde = "" if c.get("mde") is None else f"{c['mde']:.3f}"
        lines.append(f"| {c['name']} | {arm} | {c.get('control', '')} | {c.get('view', '')} | {val} | {mde} "
                     f"| {c['threshold']} | {'yes' if c['passed'] else 'NO'} | {c.get('note', '')} |")
    if gate.get("notes"):
        lines += ["", "Notes:", ""] + [f"- {n}" for n in gate["notes"]]
    return "\n".join(lines) + "\n"


def _signed(x: float) -> str:
    """``+0.007`` / ``−0.279`` (a true minus sign) / ``0.000``."""
    if round(x, 3) == 0:
        return "0.000"
    return f"+{x:.3f}" if x > 0 else f"\u2212{-x:.3f}"


def change_text(c: dict) -> str:
    """A hack-rate criterion row of ``gate.json`` as the change it measures, sign so that a rise
    reads as a rise: ``+0.007 [−0.075, +0.089]`` is the arm's held-out hack rate minus the other
    side's (``−value``, interval ``[−ci_high, −ci_low]``; the rows store the drop; a missing end
    reads ``n/a``). A pass-rate row (``matched_pass``) reads the same way: the arm's pass rate
    minus vanilla's."""
    if c.get("value") is None:
        return "n/a"
    text = _signed(-c["value"])
    lo, hi = c.get("ci_low"), c.get("ci_high")
    if lo is not None or hi is not None:
        text += f" [{'n/a' if hi is None else _signed(-hi)}, {'n/a' if lo is None else _signed(-lo)}]"
    return text


_VERB = {"separated": "lowered hacking", "not_separated": "did not lower hacking",
         "uninformative": "is uninformative"}


def _arm_plain(arm: str, info: dict, crit: dict[str, dict]) -> str:
    """One treatment in :func:`plain_verdict`: its finding first when it has one ("is no better
    than not training", with its changes vs the untrained student), what happened to its hacking,
    vs vanilla and vs its matched control, and (without a finding) its changes vs the untrained
    student, with intervals."""
    verdict = info.get("verdict", "")
    d, c = crit.get("drop_vs_vanilla"), crit.get("beats_control")
    if d is None or d.get("value") is None:
        return f"{arm} was not compared ({verdict or 'no paired outcomes'})"
    if verdict == "inconclusive":  # undecided: say which way the estimate points
        verb = "did not lower hacking" if d["value"] <= 0 else "may lower hacking (not shown at these sizes)"
    else:
        verb = _VERB.get(verdict, verdict.replace("_", " "))
    if info.get("finding"):  # the finding is the verdict's first word on the arm
        found = finding_text(info["finding"], list(crit.values()))
        verb = f"is uninformative and {found}" if verdict == "uninformative" else f"is {found}"
    rates = (d.get("effect") or {})
    have = rates.get("mean_a") is not None and rates.get("mean_b") is not None
    text = (f"{arm} ({d.get('view')} view) {verb}: change in held-out hack rate vs vanilla "
            f"{change_text(d)}" + (f" ({rates['mean_a']:.3f} vs {rates['mean_b']:.3f})" if have else ""))
    if c is not None and c.get("value") is not None:
        text += f", vs its matched control {c.get('control')} {change_text(c)}"
    vs = [r for r in crit.values() if CRITERIA[r["name"]].against == "untrained" and r.get("value") is not None]
    if vs and not info.get("finding"):
        text += ", vs untrained " + ", ".join(f"{CRITERIA[r['name']].metric} rate {change_text(r)}" for r in vs)
    return text


def plain_verdict(gate: dict | None) -> str:
    """The verdict in plain words, first on the report's page and in the README: the verdict and,
    per treatment arm, whether its hacking went down, as the change in held-out hack rate (the arm's
    minus vanilla's and minus its matched control's, so that a rise reads as a rise:
    :func:`change_text`) with 95% intervals, and its changes in pass and hack rate vs the
    untrained student — first, as its finding, when the arm is "no better than not training"
    (:func:`finding_text`); then what the gate says about the sweep. Built from
    ``gate.json``'s ``arms`` and ``criteria`` (the same numbers as :func:`sentence`, which keeps
    the gate's arithmetic: margins, MDE, Holm; :func:`arithmetic_text` says it as changes). A gate
    too small to judge (too few seeds, or a positive control that does not separate) says so with
    the positive control's change (``gate.json`` ``positive_control``; :func:`_power_plain`); an
    invalid gate keeps its sentence, which has no difference of rates in it.

    Example: ``inconclusive: route (ablated view) did not lower hacking: change in held-out hack
    rate vs vanilla +0.007 [−0.075, +0.089] (0.318 vs 0.312), vs its matched control route_random
    −0.004 [−0.097, +0.089]; about 12 seeds would decide it.``
    """
    if gate is None:
        return "The separation gate has not been decided yet."
    verdict = gate.get("verdict", "invalid")
    sentence_ = gate.get("sentence", "")
    treatments = [a for a, i in (gate.get("arms") or {}).items() if i.get("role") == "treatment" and "verdict" in i]
    if "(too few seeds)" in sentence_ or "(underpowered)" in sentence_:
        return _power_plain(gate) or sentence_
    if verdict == "invalid" or not treatments:
        return sentence_  # these sentences are plain already (no difference of rates in them)
    by_arm = _rows_by_arm(gate)
    parts = [_arm_plain(a, gate["arms"][a], by_arm.get(a, {})) for a in treatments]
    ruled_out = ("separation" if any(gate["arms"][a].get("finding") for a in treatments) else
                 "an effect the size of compare.min_drop")
    tail = {"separated": "the sweep is justified", "not_separated": f"{ruled_out} is ruled out; no sweep"}.get(verdict)
    if verdict == "inconclusive":
        open_ = [a for a in treatments if gate["arms"][a].get("verdict") in ("inconclusive", "uninformative")]
        mores = {a: more_text(*(gate["arms"][a].get(f"needed_{k}") for k in ("seeds", "problems", "samples")))
                 for a in open_}
        if len(open_) == 1 and mores[open_[0]]:
            tail = f"{mores[open_[0]]} would decide it"
        else:
            tail = "; ".join(f"{m} would decide {a}" for a, m in mores.items() if m) or "more data is needed to decide"
    sizes = f"; over {gate['sizes']}" if gate.get("sizes") else ""
    return f"{verdict.replace('_', ' ')}: " + "; ".join(parts) + sizes + (f"; {tail}." if tail else ".")


def _rows_by_arm(gate: dict) -> dict[str, dict[str, dict]]:
    """``gate.json``'s rows of :data:`~evil_moe.gate.criteria.CRITERIA`, by arm and criterion."""
    by_arm: dict[str, dict[str, dict]] = {}
    for c in gate.get("criteria", []):
        if c.get("name") in CRITERIA:
            by_arm.setdefault(c.get("arm"), {})[c["name"]] = c
    return by_arm


def _min_seeds(gate: dict) -> int | None:
    return (gate.get("config") or {}).get("min_seeds")


def _pc_text(gate: dict) -> str:
    """The positive control's change in held-out hack rate vs vanilla (``gate.json``
    ``positive_control``), or that there was none."""
    pc = gate.get("positive_control")
    if not pc:
        return "no positive control: the gate's power was not checked"
    return f"positive control {pc.get('arm')} change in held-out hack rate vs vanilla {change_text(pc)}"


def _power_plain(gate: dict) -> str:
    """The verdict of a gate too small to judge, as changes: too few seeds (the positive
    control's seeds below ``compare.min_seeds``) or underpowered (the positive control does not
    separate from vanilla); empty when ``gate.json`` lacks the numbers (its sentence is used)."""
    pc, sizes = gate.get("positive_control"), gate.get("sizes") or ""
    if not pc or pc.get("value") is None:
        return ""
    if "(too few seeds)" in gate.get("sentence", ""):
        if pc.get("n_seeds") is None or _min_seeds(gate) is None:
            return ""
        return (f"inconclusive (too few seeds): {pc['n_seeds']} seeds, fewer than compare.min_seeds "
                f"{_min_seeds(gate)}, cannot separate any arm, the positive control included ({_pc_text(gate)}; "
                f"{sizes}) — add seeds (pilot.seeds); the sweep is not scheduled.")
    return (f"inconclusive (underpowered): the positive control {pc.get('arm')} does not separate from vanilla "
            f"(change in held-out hack rate {change_text(pc)}, MDE {_r3(pc.get('mde'))}), so this run cannot "
            f"tell a working arm from a failing one ({sizes}) — the sweep is not scheduled.")


def _pass_change(p: dict) -> str:
    """The ``matched_pass`` row as the change in pass rate (the arm's minus vanilla's) with its
    margins: the interval's lower end must stay above ``−pass_margin`` and, with a relative
    margin ``r``, the arm's rate minus ``(1 − r)`` × vanilla's must have its lower end above 0."""
    text = f"change in pass rate vs vanilla {change_text(p)}"
    if p.get("ci_high") is None:
        return text
    text += f" (lower end {_signed(-p['ci_high'])} vs margin \u2212{p['threshold']:g}"
    rel, r = p.get("rel_effect"), p.get("margin_rel")
    mean_b = (p.get("effect") or {}).get("mean_b")
    if rel and r is not None and mean_b is not None and rel.get("ci_high") is not None:
        text += (f" and \u2212{r:g} × vanilla's {mean_b:.3f} = {_signed(-r * mean_b)}, {p.get('binding')} binds; "
                 f"the arm's pass rate minus {1 - r:g} × vanilla's, lower end {_signed(-rel['ci_high'])} vs 0")
    return text + ")"


def _untrained_change(crit: dict[str, dict], finding: str | None) -> str:
    """The criteria against the untrained student as changes with the end each must clear
    (``change vs untrained: pass rate +0.120 [+0.040, +0.200] (lower end +0.040 vs 0), hack rate
    −0.010 [−0.050, +0.030] (upper end +0.030 vs +0.05)``), after the finding's words when the arm
    has it; empty without them. A drop's ``upper`` test (``ci_high < bound``) is the change's
    lower end above ``−bound``, a ``lower`` one its upper end below ``−bound``."""
    parts = []
    for name, r in crit.items():
        kind = CRITERIA[name]
        if kind.against != "untrained" or r.get("value") is None:
            continue
        bound = kind.bound * (r.get("threshold") or 0.0)
        end, at = ("lower", r.get("ci_high")) if kind.test == "upper" else ("upper", r.get("ci_low"))
        clause = "" if at is None else f" ({end} end {_signed(-at)} vs {_signed(-bound) if bound else '0'})"
        parts.append(f"{kind.metric} rate {change_text(r)}{clause}")
    if not parts:
        return ""
    return "; " + (f"{FINDINGS[finding]}: " if finding else "") + "change vs untrained: " + ", ".join(parts)


def _arm_arithmetic(arm: str, info: dict, crit: dict[str, dict]) -> str:
    """One treatment in :func:`arithmetic_text`: its changes vs vanilla and vs its control, its
    pass criterion, its changes vs the untrained student (with its finding), Holm's adjustment,
    and for an inconclusive arm what is open and what would decide it (as :func:`sentence`'s
    phrase, in changes)."""
    verdict = info.get("verdict", "")
    if verdict == "uninformative":  # the reason opens with why (apply_references)
        why = (info.get("reason") or f"{arm}: uninformative").split("; the gate's criteria:")[0]
        finding = info.get("finding")
        return why + (f"; {arm} is {finding_text(finding, list(crit.values()))}" if finding else "")
    d, c, p = (crit.get(k) for k in ("drop_vs_vanilla", "beats_control", "matched_pass"))
    if d is None or c is None or p is None:
        return f"{arm}: {verdict.replace('_', ' ') or 'not compared'}"
    text = (f"{arm} ({d.get('view')} view): change in held-out hack rate vs vanilla {change_text(d)}, vs "
            f"{c.get('control')} {change_text(c)}; {_pass_change(p)}{_untrained_change(crit, info.get('finding'))}")
    family, p_value, p_adj = info.get("family") or 1, info.get("p_value"), info.get("p_adjusted")
    if family > 1 and p_value is not None and p_adj is not None:
        text += f", p {p_value:.3g} (Holm-adjusted over {family} arms {p_adj:.3g})"
    if verdict == "inconclusive":
        open_ = [x for x in crit.values() if not x.get("passed") and not x.get("rules_out")]
        if open_:
            text += f"; undecided: {', '.join(x['name'] for x in open_)}"
        elif p_value is not None and p_adj is not None and p_adj > p_value:
            text += "; every criterion passes, but not after Holm's correction"
        text += f"; smallest fall in hack rate vs vanilla it could detect (MDE) {_r3(d.get('mde'))}"
        more = more_text(*(info.get(f"needed_{k}") for k in ("seeds", "problems", "samples")))
        text += f"; {more} would decide it" if more else ""
        hack_open = [x for x in open_ if CRITERIA[x["name"]].metric == "hack"]
        text += _plan_words(hack_open[0]["name"], hack_open[0].get("plan")) if hack_open else ""
    return text


def arithmetic_text(gate: dict) -> str:
    """The gate's arithmetic from ``gate.json`` in the first page's one convention: every
    difference is the arm's rate minus the other side's (:func:`change_text`; negative = lower,
    a true minus sign), as the per-arm table and :func:`plain_verdict` show it. The same content as
    ``gate.json``'s ``sentence`` (which keeps the drops the criteria are defined on): per arm the
    changes in hack rate vs vanilla and vs its matched control, the pass-rate change with its
    margins, Holm's adjustment, what is undecided, the MDE and what more would decide it; the
    sizes and the positive control. Empty when :func:`plain_verdict` is the whole of it (an
    invalid gate, no treatment arm, too few seeds, underpowered).
    """
    verdict, sentence_ = gate.get("verdict", ""), gate.get("sentence", "")
    arms = gate.get("arms") or {}
    treatments = [a for a, i in arms.items() if i.get("role") == "treatment" and "verdict" in i]
    if (verdict not in ("separated", "not_separated", "inconclusive") or not treatments
            or "(too few seeds)" in sentence_ or "(underpowered)" in sentence_):
        return ""
    by_arm = _rows_by_arm(gate)
    shown = {"separated": [a for a in treatments if arms[a]["verdict"] == "separated"],
             "not_separated": treatments,
             "inconclusive": [a for a in treatments if arms[a]["verdict"] == "inconclusive"]
             + [a for a in treatments if arms[a]["verdict"] == "uninformative"]}[verdict]
    parts = "; ".join(_arm_arithmetic(a, arms[a], by_arm.get(a, {})) for a in shown)
    sizes, pc = gate.get("sizes") or "", _pc_text(gate)
    if verdict == "separated":
        return f"{parts}; over {sizes}; {pc} — the sweep is justified."
    if verdict == "not_separated":
        d = by_arm.get(treatments[0], {}).get("drop_vs_vanilla") or {}
        fall = f" of {d['threshold']:g}" if d.get("threshold") is not None else ""
        what = ("separation" if any(arms[a].get("finding") for a in treatments)
                else f"a fall in hack rate{fall} (compare.min_drop)")
        return f"{what} is ruled out for every treatment arm ({parts}); over {sizes}; {pc} — the sweep is not justified."
    return f"{parts}; over {sizes}; {pc} — the sweep is not scheduled."


def verdict_line(gate: dict | None) -> str:
    """The report's first line: ``**Verdict: <verdict>**`` and :func:`plain_verdict` in plain
    words (reStructuredText), the verdict word said once; a placeholder before the gate is decided
    (``gate`` ``None``). The gate's arithmetic follows it (:func:`arithmetic_line`)."""
    if gate is None:
        return "The separation gate has not been decided yet."
    verdict, text = gate.get("verdict", "invalid"), plain_verdict(gate)
    word = verdict.replace("_", " ")
    if text.startswith(word):  # the text as a literal: an invalid pilot's reason names paths
        rest = text[len(word):]
        space = " " if rest[:1].isspace() else ""
        return f"**Verdict: {rst_text(word)}**{space}{rst_text(rest, line_start=False)}"
    return f"**Verdict: {rst_text(word)}.** {rst_text(text, line_start=False)}"


def arithmetic_line(gate: dict | None) -> str:
    """The gate's arithmetic below the verdict (reStructuredText): :func:`arithmetic_text`, in
    the changes the verdict and the per-arm table show; empty before the gate is decided and when
    the verdict line already says it all."""
    if gate is None or not gate.get("sentence"):
        return ""
    text = arithmetic_text(gate)
    if not text:
        return ""
    return ("*The gate's arithmetic* (each change is the arm's rate minus the other side's, "
            f"negative = lower): {text}")


def ceiling_notes(ceilings: dict, change: bool = False) -> list[str]:
    """One line per treatment: its drop beside its ceiling's and the share, the ceiling against its
    matched control and against the untrained student (not gate criteria).

    ``change=True`` says the same as changes, the first page's convention (the arm's hack rate
    minus the other side's, negative = lower, :func:`change_text`);
    ``gate.json``'s notes keep the drops (vanilla's rate minus the arm's)."""
    def iv(d):
        if d is None or d.get("value") is None:
            return "n/a"
        if change:
            return change_text(d)
        ci = "" if d.get("ci_low") is None else f" [{d['ci_low']:.3f}, {d['ci_high']:.3f}]"
        return f"{d['value']:.3f}{ci}"

    def share_iv(d):  # a ratio: on the first page its negative ends take the true minus too
        ci = "" if d.get("ci_low") is None else f" [{d['ci_low']:.3f}, {d['ci_high']:.3f}]"
        text = f"{d['value']:.3f}{ci}"
        return text.replace("-", "\u2212") if change else text

    effect, undefined = (("change in hack rate", "the ceiling's hack rate does not fall below vanilla's") if change
                         else ("drop", "the ceiling's drop is not above 0"))
    notes = []
    for arm, c in ceilings.items():
        share = c.get("share")
        what = (f"{arm} achieves {share_iv(share)} of what a perfect detector achieves"
                if share and share.get("value") is not None
                else f"{arm}'s share of the ceiling is undefined ({undefined})")
        dose = (f"; at {arm}'s own dose ({c['dose_ceiling']}) the perfect detector's {effect} is "
                f"{iv(c['dose_ceiling_drop'])}" if c.get("dose_ceiling") else "")
        pu, hu = c.get("ceiling_pass_drop_vs_untrained"), c.get("ceiling_drop_vs_untrained")
        untr = (f"; {c['ceiling']} vs the untrained student (changes): pass rate {change_text(pu)}, hack rate "
                f"{change_text(hu)}" if pu and hu else "")
        notes.append(f"{what}: its {effect} vs vanilla {iv(c['drop'])} ({c['view']} view), {c['ceiling']}'s "
                     f"{iv(c['ceiling_drop'])}; {c['ceiling']} vs its matched control {c['ceiling_control']}: "
                     f"{iv(c['ceiling_vs_control'])}{dose}{untr} (reported beside the gate, never a criterion)")
    return notes


def arm_verdict_cell(role: str, arm_gate: dict) -> str:
    """An arm's verdict on the first page's per-arm table: the gate's verdict for a treatment
    (``gate.json`` ``arms[arm]``, a dash when absent) with its finding's words (``not_separated
    (no better than not training)``), ``reported (<role>)`` for an arm the gate never judges (a
    ceiling, the positive control)."""
    if role == "treatment":
        finding = arm_gate.get("finding")
        return arm_gate.get("verdict", "–") + (f" ({FINDINGS[finding]})" if finding else "")
    return "reference" if role == "reference" else f"reported ({role.replace('_', ' ')})"
