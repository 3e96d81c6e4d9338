"""The record of a training step (step 7 of :class:`evil_moe.rl.trainer.trainer.Trainer`): the
``steps.tsv`` row (:func:`step_row`, :data:`evil_moe.tables.STEPS`, every column in one place),
what each rollout record carries for the detector audit (:func:`row_audit`), the calibration
run's per-row arrays (:func:`row_arrays`), and the wall-clock seconds per phase of the step
(:class:`PhaseClock`). Functions of their inputs: the trainer passes what they read.
"""

from __future__ import annotations

import contextlib
import time

import torch

from evil_moe.env.grader import code_parses, extract_code, rates
from evil_moe import tables
from evil_moe.env.loopholes import MODES
from evil_moe.rl.detectors import registry  # noqa: F401  (registers the score_{detector} columns)
from evil_moe.rl.trainer.step import StepBatch, StepGradients

# the scores a rollout record carries: rows.tsv's score_{name} columns (every detector with a
# score, the calibration run's shuffled-label v_hack, Evil MoE's router weight)
SCORE_COLUMNS = tuple(n.removeprefix("score_") for n in tables.names(tables.AUDIT_ROWS) if n.startswith("score_"))


def flat_norm(tensors) -> float:
    return float(torch.sqrt(sum((t.detach().float() ** 2).sum() for t in tensors))) if tensors else 0.0


class PhaseClock:
    """Wall-clock seconds per named phase of a step (``steps.tsv`` ``seconds_<phase>``)."""

    def __init__(self):
        self.seconds: dict[str, float] = {}

    @contextlib.contextmanager
    def __call__(self, phase: str):
        t = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[phase] = self.seconds.get(phase, 0.0) + time.perf_counter() - t


def row_audit(batch: StepBatch, adv, grads: StepGradients, arm_stats: dict, G: int) -> list[dict]:
    """Per row of the step (flat order; ``G`` rows per group) what the detector audit reads from the rollout
    records: ``group``, ``sample``, ``advantage``, ``zero_variance`` (its group's rewards are
    all equal: no policy gradient), ``scored`` (it had a gradient, so a detector score),
    ``flag`` (the arm's flag; None where the arm does not flag or the row had no gradient) and
    ``score_<detector>`` (None where not computed). The label is the record's ``exploited``
    (logged, never read by training)."""
    zero = adv.zero_std.reshape(-1)  # (P,)
    # the scored rows: those with gradient, or every row a penalising arm scored before its advantages
    pos = {i: j for j, i in enumerate(arm_stats.get("score_rows", grads.rows))}
    flags = arm_stats.get("flag_rows", {})
    scores = arm_stats.get("scores", {})
    out = []
    for i in range(len(batch.flat)):
        j = pos.get(i)
        row = {"group": i // G, "sample": i % G, "advantage": float(adv.flat()[i]),
               "zero_variance": bool(zero[i // G]),
               "scored": j is not None and bool(scores), "flag": flags.get(i)}
        for name in SCORE_COLUMNS:
            row[f"score_{name}"] = None if j is None or name not in scores else float(scores[name][j])
        out.append(row)
    return out

def row_arrays(idx: list[int], grads: StepGradients, scores: dict, *, width: int, n_placebo: int) -> dict:
    """The calibration run's (and a router arm's) per-row arrays, aligned with the step's student
    records (``idx``: their flat indices): ``placebo`` ``(n, n_placebo)`` fp64 (NaN where not
    scored) and ``hidden`` ``(n, width)`` fp32 pooled hidden states (zeros where not scored;
    ``width``: the output head's input features), present at every step, a step without
    gradients included."""
    pos = {i: j for j, i in enumerate(grads.rows)}
    d = width
    out = {"placebo": torch.full((len(idx), n_placebo), float("nan"), dtype=torch.float64),
           "hidden": torch.zeros(len(idx), d, dtype=torch.float32)}
    for k, i in enumerate(idx):
        j = pos.get(i)
        if j is None:
            continue
        if "placebo" in scores:
            out["placebo"][k] = scores["placebo"][j]
        if grads.hidden is not None:
            out["hidden"][k] = grads.hidden[j].float()
    return out

def step_row(step: int, *, arm: str, seed: int, stud, recs: list[dict], adv, grads: StepGradients,
             arm_stats: dict, upd: dict, knobs: tuple[list, list], router: dict, t0: float,
             clock: PhaseClock) -> dict:
    """The step's ``steps.tsv`` row (:data:`evil_moe.tables.STEPS`), every column but
    ``seconds_eval`` (the run loop's): rates of the student rows ``stud`` (``(rollout, grade,
    problem)``) and their records ``recs``, advantage, loss and arm statistics (``arm_stats``:
    :meth:`~evil_moe.rl.trainer.arm_step.ArmStep.apply`'s), the update's (``upd``), the norms of
    ``knobs`` (``δS``, ``δS_hack``), a router arm's columns (``router``:
    :meth:`~evil_moe.rl.trainer.router_step.RouterStep.log_columns`) or Advantage Modification's
    (:meth:`~evil_moe.rl.trainer.advantage_step.ShortcutStep.log_columns`; empty for the others), and
    the wall-clock seconds of the step (since ``t0``) and of each phase (``clock``)."""
    n = max(len(recs), 1)
    parsed = [code_parses(extract_code(r.text)) for r, _, _ in stud]
    ent = [float(r.entropy.mean()) for r, _, _ in stud if len(r.entropy)]
    m = arm_stats["measured"]
    projected = arm_stats.get("projected") or upd["acted"]
    flags = arm_stats.get("flags", {})
    st = grads.stats
    row = {
        "step": step, "arm": arm, "seed": seed,
        "reward_mean": sum(x["reward"] for x in recs) / n,
        **{k: v for k, v in rates(recs).items() if k in ("hack_rate", "pass_rate", "format_rate")},
        "parse_rate": sum(parsed) / n,
        "hack_parsed_rate": sum(bool(x["exploited"]) and ok for x, ok in zip(recs, parsed)) / n,
        "truncated_rate": sum(bool(x["truncated"]) for x in recs) / n,
        "entropy": sum(ent) / len(ent) if ent else None,
        "frac_zero_std": adv.frac_zero_std,
        "loss": grads.loss, "grad_norm": m.grad_norm,
        "cin": m.cin, "cin_student": grads.cin_source.get("student"),
        "cin_teacher": grads.cin_source.get("teacher"),
        "cout": projected.cout if projected is not None else m.cin,
        "cout_update": upd["cout_update"],
        "frac_fired": m.frac_fired, "coverage": m.coverage,
        "null_cin": m.null_cin, "null_cin_empirical": m.null_cin_empirical,
        "grad_span_frac": m.span_frac, "update_span_frac": upd["proposed"].span_frac,
        "removed_frac": arm_stats.get("removed_frac") if arm_stats.get("removed_frac") is not None
        else (upd["acted"].removed_frac if upd["acted"] is not None else 0.0),
        "flag_rate": flags.get("flag_rate"), "flag_precision": flags.get("flag_precision"),
        "flag_recall": flags.get("flag_recall"), "flag_fpr": flags.get("flag_fpr"),
        "kl": st["kl"],
        "frac_clipped": st["frac_clipped"],
        "ratio_p05": st["ratio_p05"], "ratio_p50": st["ratio_p50"], "ratio_p95": st["ratio_p95"],
        "sampler_gap_p95": st["sampler_gap_p95"], "sampler_gap_max": st["sampler_gap_max"],
        "delta_s_norm": flat_norm(knobs[0]), "delta_s_hack_norm": flat_norm(knobs[1]),
        "hack_expert_share": arm_stats.get("hack_expert_share"),
        **router,
        "tokens": sum(len(r.completion_ids) for r, _, _ in stud),
        "seconds": round(time.time() - t0, 3),
    }
    for mode in MODES:
        sub = [x for x in recs if x["mode"] == mode]
        row[f"hack_rate_{mode}"] = rates(sub)["hack_rate"]
    row.update({f"seconds_{k}": round(v, 3) for k, v in clock.seconds.items()})
    return row
