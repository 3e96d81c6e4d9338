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
from typing import Any, Callable, Sequence

import numpy as np
import torch

from evil_moe.rl.arms.base import Arm, FlagInputs, FlagRateMatch, SplitGrads, hack_expert_share, kept_advantages
from evil_moe.rl.detectors.detector import flag_quality, gradient_scores, weight_quality
from evil_moe.rl.detectors.registry import Detector, StepRows, get_detector, scored
from evil_moe.rl.policy import grpo
from evil_moe.rl.trainer.step import StepBatch, StepGradients
from evil_moe.rl.vhack.direction import VHack
from evil_moe.rl.vhack.projection import measure_grads


@dataclass
class Scoring:
    """What the step's rows with a gradient are scored with; none of it reads the label.

    Attributes:
        detector: the run's detector (``pilot.detector``;
            :data:`evil_moe.rl.detectors.registry.DETECTORS`).
        flags_with_detector: the arm's flags come from it
            (:meth:`evil_moe.rl.arms.base.Arm.flags_with_detector`).
        threshold: its threshold when the arm flags with it and it is thresholded (None under
            ``pilot.detector_calibration: budget``, or otherwise).
        vhack: the v_hack the gradient detector reads (the run's first: its empirical null
            belongs to it, whatever ``pilot.vhack_refresh_every`` does).
        known_modes: the modes the pattern detector knows (``vhack.known_modes``).
        fitted: the detector's fitted input (:attr:`~evil_moe.rl.detectors.registry.Detector.fitted`:
            the audit's probe), when loaded.
        score_rows: a calibration run: every row scored by every audited detector and placebo.
        placebos, shuffled: a calibration run's random-direction v_hacks and shuffled-label one.
        placebo_dirs: ``(n, d)`` random directions whose cosines with the pooled activations are
            the router's placebo (Evil MoE's arms; :class:`~evil_moe.rl.trainer.router_step.RouterStep`).
    """

    detector: Detector
    flags_with_detector: bool
    threshold: float | None
    vhack: VHack
    known_modes: frozenset[str]
    fitted: Any = None
    score_rows: bool = False
    placebos: Sequence[VHack] = ()
    shuffled: VHack | None = None
    placebo_dirs: torch.Tensor | None = None

    @property
    def detectors(self) -> list[Detector]:
        """The detectors the rows are scored with (:func:`evil_moe.rl.detectors.registry.scored`)."""
        return scored(self.detector.name, flags_with_detector=self.flags_with_detector,
                      score_rows=self.score_rows)

    def needs(self, what: str) -> bool:
        """Some detector the rows are scored with needs ``what`` (``sample_grads``, ``hidden``:
        :data:`evil_moe.rl.detectors.registry.NEEDS`) computed by the step."""
        return any(what in d.needs for d in self.detectors)

    @classmethod
    def of(cls, pc, *, arm: Arm, vhack: VHack, known_modes, calibration: dict | None = None, fitted=None,
           score_rows: bool = False, placebos: Sequence[VHack] = (), shuffled: VHack | None = None,
           placebo_dirs: torch.Tensor | None = None) -> Scoring:
        """The run's scoring (``pc``: the ``pilot`` section): its detector, and the threshold of
        a thresholded detector the arm flags with (:meth:`~evil_moe.rl.detectors.registry.Detector.threshold`;
        ``calibration``: the audit's ``calibration.json``).

        Raises:
            ValueError: the detector's fitted input, or its calibration, was not given (names
                the option); a calibration it does not take.
        """
        det = get_detector(pc.detector)
        flags = arm.flags_with_detector()
        threshold = None
        if flags and det.thresholded():
            if det.fitted and fitted is None:
                raise ValueError(f"pilot.detector {det.name} needs the audit's {det.fitted} "
                                 f"(--{det.fitted} audit/{det.fitted}.safetensors)")
            threshold = det.threshold(pc, calibration=calibration, vhack=vhack)
        return cls(det, flags, threshold, vhack, frozenset(known_modes), fitted, score_rows, list(placebos),
                   shuffled, placebo_dirs)


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
        penalty: the config's ``penalty`` section (a penalising arm's amount and mode).
    """

    def __init__(self, arm: Arm, pc, *, seed: int, adapter, optimizer, P: int, G: int, scoring: Scoring,
                 rate_match: FlagRateMatch | None = None, penalty=None):
        self.arm, self.pc, self.seed, self.penalty = arm, pc, seed, penalty
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
            flagging arm), ``removed_frac``, ``projected``, ``hack_expert_share`` (every arm that splits
            its gradient: the step's dose).
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
        elif self.rate_match is not None and self.arm.match_by == "count" and not self.arm.penalises:
            self.rate_match.count(step, 0)  # a step without rows still moves the balance
        per_row = grads.per_row if self.arm.needs_sample_grads and grads.per_row is not None else [grads.total]
        if self.arm.match_by == "dose":
            split = self.arm.split_gradients(per_row, flags, self.pc,
                                             dose=self.rate_match.share(step, bool(grads.rows)))
        else:
            split = self.arm.split_gradients(per_row, flags, self.pc)
        if grads.split is not None:  # the router's forward already split the gradient
            ds_g, dsh_g = grads.split
            split = SplitGrads(ds_g, dsh_g, hack_expert_share(ds_g, dsh_g))
        for p, g in zip(self.ds, split.delta_s or [torch.zeros_like(p) for p in self.ds]):
            p.grad = g.clone()
        for p, g in zip(self.dsh, split.delta_s_hack or [None] * len(self.dsh)):
            p.grad = None if g is None else g.clone()
        if self.arm.splits_gradient and grads.rows:  # the step's dose (router arms included)
            out["hack_expert_share"] = hack_expert_share(split.delta_s, split.delta_s_hack)
        out["removed_frac"] = split.removed_frac if flags is not None or grads.split is not None \
            or self.arm.match_by == "dose" else None
        projected = self.arm.on_gradients(self.adapter, proj_v, self.opt, self.pc)
        if projected is not None:
            out["projected"] = projected
            out["removed_frac"] = projected.removed_frac
        return out

    def scores(self, batch: StepBatch, adv, grads: StepGradients) -> dict:
        """Scores of the rows with gradient (``grads.rows``), each ``(B,)``: every detector of
        :attr:`Scoring.detectors` that could score them (e.g. ``pattern``, always; the run's
        ``gradient`` or ``probe`` when the arm flags with it); for Evil MoE's arms ``router``
        (its ``w``) and ``placebo`` ``(B, n)`` (the cosines of random directions with the pooled
        activations); in a calibration run also ``shuffled`` (the shuffled-label v_hack) and
        ``placebo`` ``(B, n)`` (the random directions' gradient scores). None of them reads the
        label."""
        sc = self.scoring
        A = adv.flat()[grads.rows]
        names = self.adapter.names
        rows = StepRows([batch.flat[i].text for i in grads.rows], [batch.problems[i] for i in grads.rows], A,
                        names, grads.per_row, grads.hidden, sc.vhack, sc.fitted, sc.known_modes)
        out = {}
        for d in sc.detectors:
            s = d.score(rows)
            if s is not None:
                out[d.name] = s
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
        """The detector's inputs over the rows with gradient (:meth:`flag_inputs`), the arm's
        flags, and their rate / precision / recall / false-positive rate against the true hack
        label (``grade.exploited``; logged only)."""
        scores = self.scores(batch, adv, grads) if scores is None else scores
        inputs, hack = self.flag_inputs(grades, grads.rows, step, scores)
        flags = self.arm.flags(inputs)
        return flags, flag_quality(flags, hack)

    def flag_inputs(self, grades, rows: Sequence[int], step: int, scores: dict) -> tuple[FlagInputs, torch.Tensor]:
        """What the arm flags ``rows`` (indices into the step's rollouts) with, and their true hack
        label (``grade.exploited``; for the log).

        The label reaches the arm only when it declares ``reads_label`` (a ceiling) or the run's
        detector needs it (``noisy_label``); a random-flag control gets its matched count
        (:class:`evil_moe.rl.arms.base.FlagRateMatch`) and nothing else of the detector's."""
        sc = self.scoring
        det = scores.get(sc.detector.name) if sc.flags_with_detector else None
        rng = np.random.default_rng([self.seed, step, 31])
        hack = torch.tensor([bool(grades[i].exploited) for i in rows], dtype=torch.bool)
        gives_label = self.arm.reads_label or ("label" in sc.detector.needs and not self.arm.matches)
        count = self.rate_match.count(step, len(rows)) if self.rate_match is not None else None
        budget = self.pc.detector_budget if self.pc.detector_calibration == "budget" else None
        return FlagInputs(det, scores["pattern"].bool(), sc.threshold if sc.threshold is not None else 0.0,
                          sc.detector.name, rng, label=hack.clone() if gives_label else None,
                          precision=self.pc.detector_precision, recall=self.pc.detector_recall,
                          accuracy=self.pc.detector_accuracy, target_count=count, budget=budget), hack

    def shape_rewards(self, batch: StepBatch, grades, R: torch.Tensor, step: int, *,
                      gradients: Callable[..., StepGradients]) -> tuple[torch.Tensor, dict]:
        """A penalising arm's rewards (:attr:`evil_moe.rl.arms.base.Arm.penalises`): every
        rollout of the step is flagged (or weighed) before the advantages are formed, and its
        reward becomes ``R − amount · w`` (:meth:`evil_moe.rl.arms.base.Arm.penalised`).

        The detector scores every rollout as it scores route's rows with gradient, from one pass
        over all of them at unit advantage when it needs per-row gradients or hidden states
        (``gradients(batch, adv, rows, step, scoring=True)``): the gradient detector's score of
        ``sign(A)·g`` is then that of the rollout's own NLL gradient whatever the reward (for a
        student row at ``pilot.beta`` 0 the same score route's step gives a row with ``A ≠ 0``;
        a row of a group without reward variance, which route never scores, is scored too).

        Args:
            batch, grades, step: the step so far.
            R: ``(P, G)`` the environment's rewards (:meth:`evil_moe.rl.arms.base.Arm.reward`).
            gradients: the trainer's gradients.

        Returns:
            ``((P, G) float32 rewards, stats)``: ``scores`` and ``score_rows`` (every row),
            ``flags`` (:func:`evil_moe.rl.detectors.detector.weight_quality` of the weights),
            ``flag_rows`` (a row is flagged when its weight is above 0).
        """
        rows = list(range(len(batch.flat)))
        sc = self.scoring
        unit = grpo.Advantages(torch.ones(self.P, self.G), torch.zeros(self.P, dtype=torch.bool), 0.0)
        if sc.flags_with_detector and (sc.needs("sample_grads") or sc.needs("hidden")):
            grads = gradients(batch, unit, rows, step, scoring=True)
        else:  # pattern, noisy_label, the label, random flags: no forward needed
            grads = StepGradients(rows, [])
        scores = self.scores(batch, unit, grads)
        inputs, hack = self.flag_inputs(grades, rows, step, scores)
        new, w = self.arm.penalised(R.reshape(-1), inputs, self.penalty)
        return new.to(R.dtype).reshape(R.shape), {
            "scores": scores, "score_rows": rows, "flags": weight_quality(w, hack),
            "flag_rows": {i: bool(x > 0) for i, x in zip(rows, w.tolist())}}

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
