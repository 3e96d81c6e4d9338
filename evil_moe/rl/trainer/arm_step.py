"""The arm's part of a training step (step 5 of :class:`evil_moe.rl.trainer.trainer.Trainer`), a mixin of
the trainer: the rows' detector scores (none of which reads the label), the arm's flags and their
quality against the true hack label (logged only), the kept rows' advantages recomputed over the
unflagged rows where the arm asks for it, and the gradients the arm writes into ``δS`` and
``δS_hack`` (:mod:`evil_moe.rl.arms.registry`: routing, filtering, projection).
"""

from __future__ import annotations

import numpy as np
import torch

from evil_moe.env.grader import extract_code
from evil_moe.rl.policy import grpo
from evil_moe.rl.arms.base import FlagInputs, SplitGrads, kept_advantages
from evil_moe.rl.detectors.detector import flag_quality, gradient_scores, pattern_flag
from evil_moe.rl.vhack.projection import measure_grads
from evil_moe.rl.trainer.step import StepBatch, StepGradients


class ArmStep:
    """The arm's hooks in the step, as methods of the trainer (they read its ``pc``, ``seed``,
    ``arm``, ``adapter``, ``opt``, ``ds``, ``dsh``, ``vhack``, ``proj_v``, ``detector_v``,
    ``known_modes``, ``threshold``, ``uses_detector``, ``probe``, ``rate_match``, ``score_rows``,
    ``shuffled``, ``placebos``, ``placebo_dirs``, ``P``, ``G``, and call ``gradients``)."""

    # -- 5. the arm -------------------------------------------------------------------------------
    def apply_arm(self, batch: StepBatch, grades, adv, grads: StepGradients, step: int) -> dict:
        """Flags, routing and gradient projection by the arm; writes ``δS.grad`` (and
        ``δS_hack.grad``). Returns the step's arm statistics for the log (``scores``: the rows'
        detector scores, :meth:`_scores`, kept for the rollout records)."""
        out = {"measured": measure_grads(self.vhack, self.adapter.names, grads.total)}
        flags = None
        out["scores"] = self._scores(batch, adv, grads) if (grads.per_row is not None or grads.router_w is not None) \
            and grads.rows else {}
        if self.arm.needs_sample_grads and grads.rows:
            flags, out["flags"] = self._flags(batch, grades, adv, grads, step, out["scores"])
            out["flag_rows"] = dict(zip(grads.rows, flags.tolist()))
            if self.arm.baseline(self.pc) == "kept":
                grads = self._rebaseline(batch, grades, adv, grads, flags, step)
        elif self.rate_match is not None:
            self.rate_match.count(step, 0)  # a step without rows still moves the balance
        per_row = grads.per_row if self.arm.needs_sample_grads and grads.per_row is not None else [grads.total]
        split = self.arm.split_gradients(per_row, flags, self.pc)
        if grads.split is not None:  # the router's forward already split the gradient
            ds_g, dsh_g = grads.split
            e_h, e_all = sum(float((g.double() ** 2).sum()) for g in dsh_g), \
                sum(float((g.double() ** 2).sum()) for g in ds_g + dsh_g)
            split = SplitGrads(ds_g, dsh_g, e_h / e_all if e_all > 0 else 0.0)
            out["hack_expert_share"] = split.removed_frac if grads.rows else None
        for p, g in zip(self.ds, split.delta_s or [torch.zeros_like(p) for p in self.ds]):
            p.grad = g.clone()
        for p, g in zip(self.dsh, split.delta_s_hack or [None] * len(self.dsh)):
            p.grad = None if g is None else g.clone()
        out["removed_frac"] = split.removed_frac if flags is not None or grads.split is not None else None
        projected = self.arm.on_gradients(self.adapter, self.proj_v, self.opt, self.pc)
        if projected is not None:
            out["projected"] = projected
            out["removed_frac"] = projected.removed_frac
        return out

    def _scores(self, batch: StepBatch, adv, grads: StepGradients) -> dict:
        """Detector scores of the rows with gradient (``grads.rows``), each ``(B,)``: ``pattern``
        (0/1, the static detector on the known modes), ``gradient`` (when the run's detector or
        the calibration run needs it), ``probe`` (when a probe is loaded); in a calibration run
        also ``shuffled`` (the shuffled-label v_hack) and ``placebo`` ``(B, n)`` (the random
        directions). None of them reads the label."""
        out = {"pattern": torch.tensor([
            float(p.mode in self.known_modes and pattern_flag(p.mode, extract_code(batch.flat[i].text), p.test_name))
            for i, p in ((i, batch.problems[i]) for i in grads.rows)], dtype=torch.float64)}
        A = adv.flat()[grads.rows]
        names = self.adapter.names
        if grads.per_row is not None and (self.score_rows or (self.uses_detector and self.pc.detector == "gradient")):
            out["gradient"] = gradient_scores(self.detector_v, names, grads.per_row, A).cpu()
        if self.probe is not None and grads.hidden is not None:
            out["probe"] = self.probe.score(grads.hidden).cpu()
        if grads.router_w is not None:  # Evil MoE: w, and the cosines of random directions (its placebo)
            out["router"] = grads.router_w.double()
            hn = grads.hidden / grads.hidden.norm(dim=1, keepdim=True).clamp_min(1e-12)
            out["placebo"] = (hn @ self.placebo_dirs.T).double()
        if self.score_rows:
            if self.shuffled is not None:
                out["shuffled"] = gradient_scores(self.shuffled, names, grads.per_row, A).cpu()
            if self.placebos:
                out["placebo"] = torch.stack([gradient_scores(v, names, grads.per_row, A).cpu()
                                              for v in self.placebos], 1)
        return out

    def _flags(self, batch, grades, adv, grads, step, scores: dict | None = None):
        """The detector's inputs over the rows with gradient, the arm's flags, and their
        rate / precision / recall / false-positive rate against the true hack label
        (``grade.exploited``; logged only).

        The label reaches the arm only when it declares ``reads_label`` (a ceiling) or the run's
        detector is ``noisy_label``; a random-flag control gets its matched count
        (:class:`evil_moe.rl.arms.base.FlagRateMatch`) and nothing else of the detector's."""
        scores = self._scores(batch, adv, grads) if scores is None else scores
        det = scores.get(self.pc.detector) if self.uses_detector else None
        rng = np.random.default_rng([self.seed, step, 31])
        hack = torch.tensor([bool(grades[i].exploited) for i in grads.rows], dtype=torch.bool)
        gives_label = self.arm.reads_label or (self.pc.detector == "noisy_label" and not self.arm.matches)
        count = self.rate_match.count(step, len(grads.rows)) if self.rate_match is not None else None
        budget = self.pc.detector_budget if self.pc.detector_calibration == "budget" else None
        flags = self.arm.flags(FlagInputs(det, scores["pattern"].bool(),
                                          self.threshold if self.threshold is not None else 0.0,
                                          self.pc.detector, rng, label=hack.clone() if gives_label else None,
                                          precision=self.pc.detector_precision, recall=self.pc.detector_recall,
                                          target_count=count, budget=budget))
        return flags, flag_quality(flags, hack)

    def _rebaseline(self, batch, grades, adv, grads: StepGradients, flags, step) -> StepGradients:
        """Recompute the kept rows' group advantages over the kept (unflagged) rows
        (:func:`evil_moe.rl.arms.base.kept_advantages`; flagged rows keep the whole group's advantage)
        and the per-sample gradients of the kept rows whose advantage changed. ``grads.total``
        and the loss statistics stay those of the step as sampled (they are logged as vanilla's
        are).

        Where the row's loss is linear in its advantage the new gradient is the old one times
        ``A'/A`` (exact: a student row at ``beta = 0`` has ``ρ ≡ 1``, so the clip never binds and
        its gradient is ``−(A/C)·Σ_t ∇log π``); the other rows get a new forward and backward
        (teacher rows: ``ρ ≠ 1``, the clip may bind; ``beta > 0``: the KL term does not scale
        with ``A``; ``A = 0``: nothing to scale)."""
        R = torch.tensor([self.arm.reward(w) for w in grades], dtype=torch.float32).reshape(self.P, self.G)
        kept = torch.ones(R.numel(), dtype=torch.bool)
        kept[torch.as_tensor(grads.rows)] = ~flags.bool()
        A = adv.flat()
        new = torch.where(kept, kept_advantages(R, kept.reshape(self.P, self.G), self.pc.scale_std).reshape(-1).to(A.dtype), A)
        changed = [j for j, i in enumerate(grads.rows) if bool(kept[i]) and float(new[i]) != float(A[i])]
        if not changed:
            return grads
        per_row = list(grads.per_row)
        redo = []
        for j in changed:
            i = grads.rows[j]
            if self.pc.beta == 0 and batch.flat[i].source == "student" and float(A[i]) != 0:
                scale = float(new[i]) / float(A[i])
                per_row[j] = [g * scale for g in per_row[j]]
            else:
                redo.append(j)
        if redo:
            sub = self.gradients(batch, grpo.Advantages(new.reshape(self.P, self.G), adv.zero_std, adv.frac_zero_std),
                                 [grads.rows[j] for j in redo], step)
            for j, g in zip(redo, sub.per_row):
                per_row[j] = g
        return StepGradients(grads.rows, grads.total, per_row, grads.loss, grads.stats, grads.cin_source)
