"""Held-out evaluation of a pilot's policy, in each of its arm's views.

:func:`evaluate` samples the same held-out problems with the same seeds for every arm of a seed
(paired), in each view the arm declares (:meth:`evil_moe.rl.arms.base.Arm.eval_views`), grades every
completion and returns one :data:`evil_moe.tables.OUTCOMES` row per completion and
:data:`evil_moe.tables.EVAL` rates per view × mode. :func:`_view` is the sampling context of a
view (``trained``, ``ablated``: the deploy view, ``projected``).
"""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, Callable, Sequence

import torch

from evil_moe.rl.vhack.projection import project_vector
from evil_moe.rl.policy.rollout import generate
from evil_moe.rl.policy.rollout import prompt_ids_for
from evil_moe.env.grader import rates

if TYPE_CHECKING:
    from evil_moe.rl.trainer.trainer import Trainer

# The held-out sampling seed of the chunk starting at held-out index c0 in run seed s:
# HELDOUT_SEED_STRIDE·s + HELDOUT_SEED_BASE + c0 (+ a re-evaluation's seed_offset); which offsets
# keep clear of every pilot's held-out and training seeds: evil_moe.stages.reevaluate.
HELDOUT_SEED_STRIDE = 7_000_003
HELDOUT_SEED_BASE = 999_983


def heldout_seed(seed: int, c0: int, seed_offset: int = 0) -> int:
    """The sampling seed of the held-out chunk starting at index ``c0`` in run seed ``seed``:
    ``HELDOUT_SEED_STRIDE·seed + HELDOUT_SEED_BASE + c0 + seed_offset`` (the same in every view
    and every evaluation of the run, and in every arm: paired draws)."""
    return seed * HELDOUT_SEED_STRIDE + HELDOUT_SEED_BASE + c0 + seed_offset


@contextlib.contextmanager
def _view(trainer: Trainer, view: str, init_ds: Sequence[torch.Tensor]):
    """Sampling context of a view: ``trained`` (δS + δS_hack), ``ablated`` (δS_hack = 0, the
    deploy view), ``projected`` (δS with the hack-ward part of its total update removed once —
    the static counterpart of ``subtract``: ``δS_init − P(u)``, ``u = −(δS − δS_init)``, gated
    as ``pilot.gate``; δS_hack kept)."""
    ad = trainer.adapter
    if view == "trained":
        yield
    elif view == "ablated":
        with ad.ablated():
            yield
    elif view == "projected":
        saved = [p.detach().clone() for p in trainer.ds]
        with torch.no_grad():
            for name, p, p0 in zip(ad.names, trainer.ds, init_ds):
                V = trainer.vhack.V.get(name)
                if V is None or V.shape[0] == 0:
                    continue
                u = -(p.detach() - p0.to(p.device))
                _, removed, _ = project_vector(u, V, trainer.pc.gate)
                p.add_(removed.to(p.dtype))
        try:
            yield
        finally:
            with torch.no_grad():
                for p, s in zip(trainer.ds, saved):
                    p.copy_(s)
    else:
        raise ValueError(f"unknown view {view!r}")


def evaluate(trainer: Trainer, heldout, step: int, init_ds, *,
             seed_offset: int = 0, progress: Callable[[int], object] | None = None
             ) -> tuple[list[dict], list[dict]]:
    """Held-out evaluation: ``pilot.heldout_samples`` completions per held-out problem in each
    of the arm's views.

    Sampling is paired across arms: the same problems, in the same chunks (``pilot.eval_chunk``
    problems per ``generate`` call), with seeds that depend only on the run seed and the chunk
    (plus ``seed_offset``: 0 in the pilot; :mod:`evil_moe.stages.reevaluate` draws fresh samples).
    ``progress(n)`` is called with the number of completions graded after each chunk (a
    progress bar's ``update``; :func:`evaluation_total` completions in all).

    Returns:
        ``(eval_rows, outcome_rows)``: :data:`evil_moe.tables.EVAL` rows per view × mode (plus
        ``all``) and :data:`evil_moe.tables.OUTCOMES` rows, one per completion. Empty lists when
        there is no held-out problem.
    """
    if not heldout:
        return [], []
    pc, tok = trainer.pc, trainer.tok
    prompts = prompt_ids_for(tok, heldout, template_kwargs=trainer.template_kwargs)
    rows, outcomes = [], []
    chunk = max(1, pc.eval_chunk)
    for view in trainer.arm.eval_views(pc):
        recs = []
        with _view(trainer, view, init_ds):
            for c0 in range(0, len(heldout), chunk):
                rolls = generate(trainer.model, tok, prompts[c0:c0 + chunk], n=pc.heldout_samples,
                                 max_new=pc.max_new, temperature=pc.temperature, top_p=pc.top_p,
                                 seed=heldout_seed(trainer.seed, c0, seed_offset),
                                 adapter=trainer.adapter,
                                 source="student", engine=trainer.engine)
                probs = [heldout[c0 + r.prompt_index] for r in rolls]
                grades = trainer.grader.grade_many([(p, r.text) for p, r in zip(probs, rolls)])
                if progress is not None:
                    progress(len(rolls))
                for p, r, w in zip(probs, rolls, grades):
                    recs.append({"mode": p.mode, "exploited": w.exploited, "gt_correct": w.gt_correct,
                                 "format_ok": w.format_ok, "truncated": r.truncated})
                    outcomes.append({"arm": trainer.arm.name, "view": view, "seed": trainer.seed,
                                     "step": step, "problem_id": p.id, "sample": r.sample_index,
                                     "mode": p.mode, "hack": int(bool(w.exploited)),
                                     "pass": int(bool(w.gt_correct)), "truncated": int(bool(r.truncated))})
        for m in sorted({x["mode"] for x in recs}) + ["all"]:
            sub = recs if m == "all" else [x for x in recs if x["mode"] == m]
            rows.append({"step": step, "arm": trainer.arm.name, "seed": trainer.seed, "view": view,
                         "mode": m, **rates(sub),
                         "truncated_rate": sum(bool(x["truncated"]) for x in sub) / max(len(sub), 1)})
    return rows, outcomes


def evaluation_total(trainer: Trainer, heldout) -> int:
    """The completions :func:`evaluate` samples and grades: views × held-out problems ×
    ``pilot.heldout_samples``."""
    return len(trainer.arm.eval_views(trainer.pc)) * len(heldout or ()) * trainer.pc.heldout_samples


__all__ = ["evaluate", "evaluation_total", "heldout_seed"]
