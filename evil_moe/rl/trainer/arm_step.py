"""The arm's part of a training step (step 5 of :class:`evil_moe.rl.trainer.trainer.Trainer`):
the rows' detector scores (none of which reads the label; what they are scored with is a
:class:`Scoring`), the arm's flags and their quality against the true hack label (logged only),
the kept rows' advantages recomputed over the unflagged rows where the arm asks for it, and the
gradients the arm writes into ``δS`` and ``δS_hack`` (:mod:`evil_moe.rl.arms`: routing,
filtering, projection). :class:`ArmStep` holds the arm, its optimiser and its random-flag
control's balance; the trainer calls :meth:`ArmStep.apply` once per step.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np
import torch

from evil_moe.env.grader import extract_code
from evil_moe.rl.arms.base import Arm, FlagInputs, FlagRateMatch, SplitGrads, kept_advantages
from evil_moe.rl.detectors.detector import flag_quality, gradient_scores, null_threshold, pattern_flag
from evil_moe.rl.detectors.probe import Probe
from evil_moe.rl.policy import grpo
from evil_moe.rl.trainer.step import StepBatch, StepGradients
from evil_moe.rl.vhack.direction import VHack
from evil_moe.rl.vhack.projection import measure_grads


@dataclass
class Scoring:
    """What the step's rows with a gradient are scored with; none of it reads the label.

    Attributes:
        detector: the run's detector (``pilot.detector``).
        uses_detector: the arm flags with the gradient or probe detector (not a ceiling, not a
            random-flag control): its scores are computed and thresholded.
        threshold: the detector's threshold (None under ``pilot.detector_calibration: budget``,
            or when the arm does not use it).
        vhack: the v_hack the gradient detector reads (the run's first: its empirical null
            belongs to it, whatever ``pilot.vhack_refresh_every`` does).
        known_modes: the modes the pattern detector knows (``vhack.known_modes``).
        probe: the audit's probe (:class:`~evil_moe.rl.detectors.probe.Probe`), when loaded.
        score_rows: a calibration run: every row scored by every detector and placebo.
        placebos, shuffled: a calibration run's random-direction v_hacks and shuffled-label one.
        placebo_dirs: ``(n, d)`` random directions whose cosines with the pooled activations are
            the router's placebo (Evil MoE's arms; :class:`~evil_moe.rl.trainer.router_step.RouterStep`).
    """

    detector: str
    uses_detector: bool
    threshold: float | None
    vhack: VHack
    known_modes: frozenset[str]
    probe: Probe | None = None
    score_rows: bool = False
    placebos: Sequence[VHack] = ()
    shuffled: VHack | None = None
    placebo_dirs: torch.Tensor | None = None

    @property
    def needs_hidden(self) -> bool:
        """The step must keep the rows' pooled hidden states (the probe's input; a calibration
        run keeps them for the audit's probe)."""
        return self.score_rows or (self.uses_detector and self.detector == "probe")


def detector_threshold(pc, *, probe: Probe | None, calibration: dict | None, vhack: VHack) -> float | None:
    """The gradient or probe detector's threshold (``pilot.detector_calibration``): the
    ``pilot.detector_quantile`` quantile of the calibration runs' clean scores (``fpr``:
    ``calibration``, the audit's ``calibration.json``) or of the extract stage's held-out clean
    teacher completions' (``teacher``, gradient only: ``vhack.meta``); None under ``budget``
    (each step flags its top share instead).

    Raises:
        ValueError: the calibration file, or the probe, the detector needs was not given, or
            holds no clean scores for it.
    """
    if pc.detector == "probe" and probe is None:
        raise ValueError("pilot.detector probe needs the audit's probe (--probe audit/probe.safetensors)")
    if pc.detector_calibration == "budget":
        return None
    if pc.detector_calibration == "teacher":
        if pc.detector != "gradient":
            raise ValueError("pilot.detector_calibration teacher thresholds the gradient detector only")
        return null_threshold(vhack.meta.get("detector_null_scores") or [], pc.detector_quantile)
    entry = (calibration or {}).get(pc.detector)
    if not entry or not entry.get("clean_scores"):
        raise ValueError(f"pilot.detector_calibration fpr needs the calibration runs' clean {pc.detector} "
                         f"scores (--calibration audit/calibration.json)")
    return null_threshold(entry["clean_scores"], pc.detector_quantile)


class ArmStep:
    """The arm's hooks in the step.

    Args:
        arm: the arm (:class:`~evil_moe.rl.arms.base.Arm`).
        pc: the config's ``pilot`` section.
        seed: the run seed (the flags' random draws: ``numpy.random.default_rng([seed, step, 31])``).
        adapter, optimizer: the policy's adapter (whose ``δS`` and ``δS_hack`` gradients the arm
            writes) and its optimiser (the preconditioned projection reads it).
        P, G: prompts per step, rows per group.
        scoring: what the rows are scored with (:class:`Scoring`).
        rate_match: a random-flag control's matched count
            (:class:`~evil_moe.rl.arms.base.FlagRateMatch`), else None.
    """

    def __init__(self, arm: Arm, pc, *, seed: int, adapter, optimizer, P: int, G: int, scoring: Scoring,
                 rate_match: FlagRateMatch | None = None):
        self.arm, self.pc, self.seed = arm, pc, seed
        self.adapter, self.opt, self.P, self.G = adapter, optimizer, P, G
        self.ds, self.dsh = adapter.delta_s_params(), adapter.delta_s_hack_params()
        self.scoring, self.rate_match = scoring, rate_match

    def apply(self, batch: StepBatch, grades, adv, grads: StepGradients, step: int, *, vhack: VHack,
              proj_v: VHack, gradients: Callable[..., StepGradients]) -> dict:
        """Flags, routing and gradient projection by the arm; writes ``δS.grad`` (and
        ``δS_hack.grad``).

        Args:
            batch, grades, adv, grads, step: the step so far.
            vhack: the v_hack every arm is measured against (``measured``).
            proj_v: the V the arm acts along.
            gradients: ``(batch, adv, rows, step) -> StepGradients``, the trainer's gradients,
                for the rows :meth:`rebaseline` recomputes.

        Returns:
            the step's arm statistics for the log: ``measured``, ``scores`` (the rows' detector
            scores, :meth:`scores`, kept for the rollout records), ``flags``/``flag_rows`` (a
            flagging arm), ``removed_frac``, ``projected``, ``hack_expert_share`` (a router).
        """
        out = {"measured": measure_grads(vhack, self.adapter.names, grads.total)}
        flags = None
        out["scores"] = self.scores(batch, adv, grads) if (grads.per_row is not None or grads.router_w is not None) \
            and grads.rows else {}
        if self.arm.needs_sample_grads and grads.rows:
            flags, out["flags"] = self.flags(batch, grades, adv, grads, step, out["scores"])
            out["flag_rows"] = dict(zip(grads.rows, flags.tolist()))
            if self.arm.baseline(self.pc) == "kept":
                grads = self.rebaseline(batch, grades, adv, grads, flags, step, gradients)
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
        projected = self.arm.on_gradients(self.adapter, proj_v, self.opt, self.pc)
        if projected is not None:
            out["projected"] = projected
            out["removed_frac"] = projected.removed_frac
        return out

    def scores(self, batch: StepBatch, adv, grads: StepGradients) -> dict:
        """Detector scores of the rows with gradient (``grads.rows``), each ``(B,)``: ``pattern``
        (0/1, the static detector on the known modes), ``gradient`` (when the run's detector or
        the calibration run needs it), ``probe`` (when a probe is loaded); in a calibration run
        also ``shuffled`` (the shuffled-label v_hack) and ``placebo`` ``(B, n)`` (the random
        directions). None of them reads the label."""
        sc = self.scoring
        out = {"pattern": torch.tensor([
            float(p.mode in sc.known_modes and pattern_flag(p.mode, extract_code(batch.flat[i].text), p.test_name))
            for i, p in ((i, batch.problems[i]) for i in grads.rows)], dtype=torch.float64)}
        A = adv.flat()[grads.rows]
        names = self.adapter.names
        if grads.per_row is not None and (sc.score_rows or (sc.uses_detector and sc.detector == "gradient")):
            out["gradient"] = gradient_scores(sc.vhack, names, grads.per_row, A).cpu()
        if sc.probe is not None and grads.hidden is not None:
            out["probe"] = sc.probe.score(grads.hidden).cpu()
        if grads.router_w is not None:  # Evil MoE: w, and the cosines of random directions (its placebo)
            out["router"] = grads.router_w.double()
            hn = grads.hidden / grads.hidden.norm(dim=1, keepdim=True).clamp_min(1e-12)
            out["placebo"] = (hn @ sc.placebo_dirs.T).double()
        if sc.score_rows:
            if sc.shuffled is not None:
                out["shuffled"] = gradient_scores(sc.shuffled, names, grads.per_row, A).cpu()
            if sc.placebos:
                out["placebo"] = torch.stack([gradient_scores(v, names, grads.per_row, A).cpu()
                                              for v in sc.placebos], 1)
        return out

    def flags(self, batch, grades, adv, grads: StepGradients, step: int, scores: dict | None = None):
        """The detector's inputs over the rows with gradient, the arm's flags, and their
        rate / precision / recall / false-positive rate against the true hack label
        (``grade.exploited``; logged only).

        The label reaches the arm only when it declares ``reads_label`` (a ceiling) or the run's
        detector is ``noisy_label``; a random-flag control gets its matched count
        (:class:`evil_moe.rl.arms.base.FlagRateMatch`) and nothing else of the detector's."""
        scores = self.scores(batch, adv, grads) if scores is None else scores
        sc = self.scoring
        det = scores.get(sc.detector) if sc.uses_detector else None
        rng = np.random.default_rng([self.seed, step, 31])
        hack = torch.tensor([bool(grades[i].exploited) for i in grads.rows], dtype=torch.bool)
        gives_label = self.arm.reads_label or (sc.detector == "noisy_label" and not self.arm.matches)
        count = self.rate_match.count(step, len(grads.rows)) if self.rate_match is not None else None
        budget = self.pc.detector_budget if self.pc.detector_calibration == "budget" else None
        flags = self.arm.flags(FlagInputs(det, scores["pattern"].bool(),
                                          sc.threshold if sc.threshold is not None else 0.0,
                                          sc.detector, rng, label=hack.clone() if gives_label else None,
                                          precision=self.pc.detector_precision, recall=self.pc.detector_recall,
                                          target_count=count, budget=budget))
        return flags, flag_quality(flags, hack)

    def rebaseline(self, batch, grades, adv, grads: StepGradients, flags, step: int,
                   gradients: Callable[..., StepGradients]) -> StepGradients:
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
            sub = gradients(batch, grpo.Advantages(new.reshape(self.P, self.G), adv.zero_std, adv.frac_zero_std),
                            [grads.rows[j] for j in redo], step)
            for j, g in zip(redo, sub.per_row):
                per_row[j] = g
        return StepGradients(grads.rows, grads.total, per_row, grads.loss, grads.stats, grads.cin_source)

    def state(self) -> float | None:
        """The random-flag control's running balance (the checkpoint's ``flag_balance``), else None."""
        return None if self.rate_match is None else self.rate_match.balance

    def load_state(self, balance: float | None) -> None:
        """Restore :meth:`state`."""
        if self.rate_match is not None and balance is not None:
            self.rate_match.balance = float(balance)
