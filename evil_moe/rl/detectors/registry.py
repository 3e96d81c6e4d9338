"""The hack detectors, one declaration each, in one registry (:data:`DETECTORS`).

A detector says which of a step's rollouts look like hacks. Each is a small class that declares
what it needs (per-row gradients, pooled hidden states, the label), how it scores a rollout
(:meth:`Detector.score`), how it flags (:meth:`Detector.flag`: above a threshold, the top share
of the step, or on its own), how its threshold is fitted (:attr:`Detector.calibrations`,
:meth:`Detector.threshold`) and how the detector audit scores it and its placebos on the
calibration runs (:meth:`Detector.audit`). The trainer, the pilot's inputs, the audit, the gate,
the config check, the schema's enum (``pilot.detector``, held equal by
``tests/test_config_schema.py``), the ``rows.tsv`` score columns (``score_{detector}``, one per
detector with a score) and the table of docs/detectors.md (held equal by
``tests/test_docs_registries.py``) all read it; none names a detector.

Adding a detector is one class here with its entry in :data:`DETECTORS`, its name in the
schema's enum and its row in docs/detectors.md (docs/internals.md, "Adding a detector").

The detectors (docs/detectors.md):

===============  ===========================================================================
detector         flags a rollout when
===============  ===========================================================================
``gradient``     the ``cos_contrib`` of ``sign(A)·g`` (its own loss gradient) with ``v_hack``
                 is above the threshold (:func:`~evil_moe.rl.detectors.detector.gradient_scores`)
``probe``        a logistic probe on its pooled final hidden state, fitted on labelled
                 calibration rollouts, is above the threshold (:mod:`~evil_moe.rl.detectors.probe`)
``pattern``      its code reports success through its mode's mechanism unconditionally, in the
                 known modes (:func:`~evil_moe.env.loopholes.pattern_flag`)
``noisy_label``  the true label, through a channel of set precision and recall (a detector of
                 controlled quality; :func:`~evil_moe.rl.detectors.detector.noisy_label_flags`)
===============  ===========================================================================
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, ClassVar, Sequence

import numpy as np

from evil_moe import tables
from evil_moe.rl.detectors import detector as D

if TYPE_CHECKING:  # torch is imported where it is used: the config check reads the registry
    import torch  # and must not pay torch's import

    from evil_moe.rl.vhack.direction import VHack

NEEDS = ("sample_grads", "hidden", "label", "code")
CALIBRATIONS = ("fpr", "teacher", "budget")
# The labelled data an arm's training may read (Arm.label_sources, Detector.label_sources; counted
# by the gate, evil_moe.gate.summary.label_count; docs/arms.md, "Labels used").
LABEL_SOURCES = {
    "rollouts": "the true hack label of every one of its own training rollouts",
    "oracle_pass": "the oracle's pass of every one of its own training rollouts (its reward)",
    "calibration": "the hack label of every scored rollout of the calibration runs (the clean ones set the fpr "
                   "threshold; the probe is fitted on audit.label_budget of them)",
    "calibration_fit": "the hack label of the audit.label_budget calibration rollouts the probe is fitted on",
    "vhack": "v_hack's (hack, clean) pairs: the grader's label of the teacher completions it is extracted from "
             "(vhack.source teacher) or the authored pairs' (authored)",
    "authored": "the labels of the shipped authored (hack, clean) pairs (moe.pairs)",
    "planted": "none read: the planted hack direction itself, the toy world's truth",
}


@dataclass
class StepRows:
    """What the training step hands a detector for its ``B`` rows with a gradient.

    Attributes:
        texts: the completions.
        problems: each row's :class:`~evil_moe.env.problem.Problem` (its mode and test name).
        advantages: ``(B,)`` the rows' advantages.
        names: the adapter's module names (the order of each row's gradients).
        per_row: ``B`` lists of per-module ``(r,)`` gradients, or None (not computed this step).
        hidden: ``(B, d)`` pooled final hidden states, or None.
        vhack: the v_hack the gradient detector reads (the run's first).
        fitted: the detector's fitted input (:attr:`Detector.fitted`; the probe), or None.
        known_modes: the loophole modes the pattern detector knows (``vhack.known_modes``).
    """

    texts: Sequence[str]
    problems: Sequence[Any]
    advantages: torch.Tensor
    names: Sequence[str]
    per_row: list | None
    hidden: torch.Tensor | None
    vhack: VHack
    fitted: Any = None
    known_modes: frozenset = frozenset()


@dataclass
class AuditRows:
    """The calibration runs' scored rollouts, as the detector audit hands them to a detector.

    Attributes:
        rows: the scored rows of ``rows.tsv`` (a DataFrame, :data:`evil_moe.tables.AUDIT_ROWS`).
        label: ``(n,)`` bool, the hack label (the audit's only use of it: fits and rates).
        seeds, steps: ``(n,)`` each row's calibration seed and step.
        placebo: ``(n, P)`` the random directions' gradient scores, or None.
        hidden: ``(n, d)`` pooled hidden states, or None.
        audit: the config's ``audit`` section (``seed``, ``placebos``, ``label_budget``).
        quantile: the operating point (``pilot.detector_quantile``).
    """

    rows: Any
    label: np.ndarray
    seeds: np.ndarray
    steps: np.ndarray
    placebo: np.ndarray | None
    hidden: np.ndarray | None
    audit: Any
    quantile: float

    def column(self, name: str) -> np.ndarray:
        """A score column of ``rows`` as fp64 (empty cells NaN)."""
        import pandas as pd

        return pd.to_numeric(self.rows[name], errors="coerce").to_numpy(dtype=np.float64)


@dataclass
class AuditScores:
    """A detector's scores on the calibration rollouts, for the detector audit.

    Attributes:
        score: ``(n,)`` fp64 scores (cross-fitted where the detector is fitted), or None (it
            could not be scored: its quality rows are left out).
        placebos: its placebos' scores, each ``(n,)``.
        flags: ``(n,)`` bool flags at the operating point, or None: the audit then cross-fits
            the ``quantile`` threshold leave one seed out (:func:`evil_moe.gate.audit.crossfit_flags`).
        calibration: the entry of ``calibration.json`` (the clean scores a pilot's ``fpr``
            threshold is a quantile of), or None.
        n_labels: labelled calibration rollouts it was fitted on.
        fitted: a fitted detector to save as ``audit/{name}.safetensors`` (its ``save(path)``),
            or None.
        refit: for a detector fitted on labels, ``refit(budget, rng, shuffle=False) -> (scores,
            fitted mask) | None`` (the label-budget curve, ``probe_curve.tsv``); else None.
    """

    score: np.ndarray | None
    placebos: list[np.ndarray] = field(default_factory=list)
    flags: np.ndarray | None = None
    calibration: dict | None = None
    n_labels: int = 0
    fitted: Any = None
    refit: Callable | None = None


class Detector:
    """Base detector. Class attributes (the detector's declaration):

    Attributes:
        name: registry key (``pilot.detector``; the ``score_{name}`` column of ``rows.tsv``).
        needs: what the step must compute for it, a subset of :data:`NEEDS`: ``sample_grads``
            (each row's own loss gradient), ``hidden`` (pooled final hidden states), ``label``
            (the true hack label: only a detector of controlled quality, never a deployable
            one), ``code`` (the completion's code).
        calibrations: the ``pilot.detector_calibration`` values its threshold may come from
            (:data:`CALIBRATIONS`); empty for a detector that flags on its own. A detector with
            calibrations is *thresholded*: an arm flagging with it waits for the detector audit
            (its ``fpr`` threshold) and the gate calls it ``uninformative`` unless the audit
            shows the detector beating its placebo.
        fitted: the name of the file the audit fits for it (``probe`` →
            ``audit/probe.safetensors``, the pilot's ``--probe``), or None.
        always_scored: scored at every step of an arm with per-row gradients whatever the run's
            detector (cheap and label-free: logged in ``rows.tsv`` for every flagging arm).
        audited: a row in ``audit/quality.tsv`` (scored in the calibration runs).
        unit: the unit of its score (``rows.tsv`` ``score_{name}``), or None (it has no score).
        placebo: its placebo in the audit, in words (``{n}``: ``audit.placebos``).
        description: one line for docs/detectors.md.
        uses_labels: labelled data its score reads that :meth:`label_sources` cannot derive from
            the above (names of :data:`LABEL_SOURCES`; the gradient detector: ``vhack``).
    """

    name: ClassVar[str] = ""
    needs: ClassVar[frozenset[str]] = frozenset()
    calibrations: ClassVar[tuple[str, ...]] = ()
    fitted: ClassVar[str | None] = None
    always_scored: ClassVar[bool] = False
    audited: ClassVar[bool] = True
    unit: ClassVar[str | None] = None
    placebo: ClassVar[str] = ""
    description: ClassVar[str] = ""
    uses_labels: ClassVar[tuple[str, ...]] = ()

    @classmethod
    def label_sources(cls, calibration: str) -> tuple[str, ...]:
        """The labelled data its flags rest on under ``pilot.detector_calibration`` =
        ``calibration`` (names of :data:`LABEL_SOURCES`, in order, each once): :attr:`uses_labels`;
        ``rollouts`` when it needs the label; a thresholded detector's ``fpr`` threshold reads
        which calibration rows are clean (``calibration``, which covers a fitted detector's fit
        rows), else a fitted detector its fit rows (``calibration_fit``); the ``teacher``
        threshold v_hack's held-out clean teacher completions (``vhack``)."""
        out = list(cls.uses_labels) + (["rollouts"] if "label" in cls.needs else [])
        if cls.thresholded() and calibration == "fpr":
            out.append("calibration")
        elif cls.fitted:
            out.append("calibration_fit")
        if cls.thresholded() and calibration == "teacher":
            out.append("vhack")
        return tuple(dict.fromkeys(out))

    @classmethod
    def thresholded(cls) -> bool:
        """Its flags are scores above a fitted threshold (it declares :attr:`calibrations`)."""
        return bool(cls.calibrations)

    def score(self, rows: StepRows) -> torch.Tensor | None:
        """``(B,)`` fp64 scores of the step's rows, or None when its inputs were not computed
        (or it has no score)."""
        return None

    def weight(self, scores) -> torch.Tensor | None:
        """``(B,)`` fp64 penalty weights in [0, 1] from its ``scores`` (the monitor penalty's
        ``progressive`` mode, :mod:`evil_moe.rl.arms.by_reward`), or None: it has no score to
        weigh by."""
        return None

    def flag(self, inputs) -> torch.Tensor:
        """``(B,)`` bool flags from the step's :class:`~evil_moe.rl.arms.base.FlagInputs`: by
        default its scores above ``inputs.threshold``, or the ``ceil(budget·B)`` highest scores
        under a budget (ties broken by row order).

        Raises:
            ValueError: no scores.
        """
        import torch

        if inputs.scores is None:
            raise ValueError(f"the {self.name} detector needs per-sample scores")
        if inputs.budget is not None:
            out = torch.zeros(len(inputs.scores), dtype=torch.bool)
            k = min(len(out), math.ceil(inputs.budget * len(out) - 1e-9))
            if k:
                out[torch.argsort(-inputs.scores.double(), stable=True)[:k]] = True
            return out
        return inputs.scores > inputs.threshold

    def threshold(self, pc, *, calibration: dict | None, vhack: VHack) -> float | None:
        """The threshold of a flagging pilot (``pc``: the ``pilot`` section): the
        ``detector_quantile`` quantile of the calibration runs' clean scores (``fpr``:
        ``calibration``, the audit's ``calibration.json``); None under ``budget`` (each step
        flags its top share); ``teacher`` is the gradient detector's own.

        Raises:
            ValueError: a calibration it does not declare; the calibration file not given or
                holding no clean scores for it (names the option).
        """
        if pc.detector_calibration not in self.calibrations:
            raise ValueError(f"pilot.detector_calibration {pc.detector_calibration} does not threshold the "
                             f"{self.name} detector (it takes {', '.join(self.calibrations) or 'none'})")
        if pc.detector_calibration == "budget":
            return None
        entry = (calibration or {}).get(self.name)
        if not entry or not entry.get("clean_scores"):
            raise ValueError(f"pilot.detector_calibration fpr needs the calibration runs' clean {self.name} "
                             f"scores (--calibration audit/calibration.json)")
        return D.null_threshold(entry["clean_scores"], pc.detector_quantile)

    def load_fitted(self, path):
        """The fitted input :attr:`fitted` names, read from ``path``."""
        raise NotImplementedError(f"the {self.name} detector reads no fitted file")

    def audit(self, data: AuditRows) -> AuditScores | None:
        """Its scores and placebos on the calibration rollouts (None: it is not audited)."""
        return None


class Gradient(Detector):
    """The per-sample hack-ward score: the ``cos_contrib`` of the rollout's own loss gradient
    (``sign(A)·g``) with ``v_hack``; thresholded at the quantile of clean scores."""

    name = "gradient"
    needs = frozenset({"sample_grads"})
    calibrations = ("fpr", "teacher", "budget")
    unit = "cosine"
    placebo = "{n} random directions (same k per module) and the shuffled-label v_hack"
    description = "cos_contrib of sign(A)·g with v_hack: does training on this rollout move delta_s hack-ward?"
    uses_labels = ("vhack",)

    def score(self, rows: StepRows):
        if rows.per_row is None:
            return None
        return D.gradient_scores(rows.vhack, rows.names, rows.per_row, rows.advantages).cpu()

    def weight(self, scores):
        """Its score clipped to [0, 1]: the hack-ward part of the cosine (a rollout whose NLL
        gradient points away from v_hack is not penalised)."""
        return scores.double().clamp(0.0, 1.0)

    def threshold(self, pc, *, calibration, vhack):
        """As :meth:`Detector.threshold`, and under ``teacher`` the quantile of the extract
        stage's held-out clean teacher completions' scores (``vhack.meta``)."""
        if pc.detector_calibration == "teacher":
            return D.null_threshold(vhack.meta.get("detector_null_scores") or [], pc.detector_quantile)
        return super().threshold(pc, calibration=calibration, vhack=vhack)

    def audit(self, data: AuditRows) -> AuditScores:
        """Its logged scores; placebos: the random directions' scores and the shuffled-label
        v_hack's; every clean scored row is its ``fpr`` calibration."""
        score = data.column("score_gradient")
        shuffled = data.column("score_shuffled")
        placebos = ([data.placebo[:, j] for j in range(data.placebo.shape[1])] if data.placebo is not None
                    else []) + ([shuffled] if data.rows["score_shuffled"].notna().any() else [])
        calibration = {"clean_scores": [float(x) for x in score[~data.label]],
                       "seeds": sorted(set(data.seeds.tolist())), "n_rows": int(len(score))}
        return AuditScores(score, placebos, calibration=calibration)


class Probe(Detector):
    """The labelled-budget probe: a logistic regression on the pooled final hidden state, fitted
    on ``audit.label_budget`` labelled calibration rollouts (:mod:`evil_moe.rl.detectors.probe`)."""

    name = "probe"
    needs = frozenset({"hidden"})
    calibrations = ("fpr", "budget")
    fitted = "probe"
    unit = "logit"
    placebo = "{n} probes fitted on labels shuffled within each step"
    description = "the logit of a logistic regression on the policy's pooled final hidden state"

    def score(self, rows: StepRows):
        if rows.fitted is None or rows.hidden is None:
            return None
        return rows.fitted.score(rows.hidden).cpu()

    def weight(self, scores):
        """``σ(logit)``: the probe's probability that the rollout is a hack."""
        import torch

        return torch.sigmoid(scores.double())

    def load_fitted(self, path):
        from evil_moe.rl.detectors.probe import Probe as Fit

        return Fit.load(path)

    def audit(self, data: AuditRows) -> AuditScores | None:
        """Cross-fitted leave one seed out on ``audit.label_budget`` labels
        (:class:`~evil_moe.rl.detectors.probe.Folds`); placebos: probes fitted on labels shuffled
        within each step; the pilots' probe fitted on rows of every seed, its calibration the
        clean rows it did not see. None without hidden states."""
        from evil_moe.rl.detectors.probe import Folds

        if data.hidden is None:
            return None
        a = data.audit
        folds = Folds(data.seeds, data.label, data.steps, data.hidden, a.seed)
        cf = folds.scores(a.label_budget, np.random.default_rng([a.seed, 11])) if len(data.seeds) else None
        if cf is None:  # too few labels, or no row with a gradient at all
            return AuditScores(None, refit=folds.scores)
        score, fitted = cf
        placebos = [p[0] for p in (folds.scores(a.label_budget, np.random.default_rng([a.seed, 13, i]), shuffle=True)
                                   for i in range(a.placebos)) if p is not None]
        probe, calibration = folds.final(a.label_budget, np.random.default_rng([a.seed, 17]))
        return AuditScores(score, placebos, flags=folds.crossfit_flags(score, fitted, data.quantile),
                           calibration=calibration,
                           n_labels=min(a.label_budget, int((data.seeds != data.seeds[0]).sum())),
                           fitted=probe, refit=folds.scores)


class Pattern(Detector):
    """The environment's static recognition of an unconditional report through the mode's
    mechanism, in the known modes (:func:`~evil_moe.env.loopholes.pattern_flag`)."""

    name = "pattern"
    needs = frozenset({"code"})
    always_scored = True
    unit = "0/1"
    placebo = "{n} draws of random flags at the detector's flag rate"
    description = ("1 when the code reports success through its mode's mechanism unconditionally "
                   "(a test function without asserts, valid = True, a module-level marker or PASS write), "
                   "in the known modes")

    def score(self, rows: StepRows):
        import torch

        from evil_moe.env.grader import extract_code
        from evil_moe.env.loopholes import pattern_flag

        return torch.tensor([float(p.mode in rows.known_modes
                                   and pattern_flag(p.mode, extract_code(text), p.test_name))
                             for text, p in zip(rows.texts, rows.problems)], dtype=torch.float64)

    def weight(self, scores):
        """Its verdict, 0 or 1 (progressive is then threshold)."""
        return scores.double()

    def flag(self, inputs):
        return inputs.pattern.clone()

    def audit(self, data: AuditRows) -> AuditScores:
        """Its logged verdicts; placebos: random flags at its flag rate; its flags are its
        verdicts (no threshold)."""
        a = data.audit
        score = data.column("score_pattern")
        rng = np.random.default_rng([a.seed, 7])
        placebos = [(rng.random(len(score)) < score.mean()).astype(float) for _ in range(a.placebos)]
        return AuditScores(score, placebos, flags=score > 0.5)


class NoisyLabel(Detector):
    """The true hack label through a noisy channel of configured precision and recall
    (``pilot.detector_precision``, ``pilot.detector_recall``), or of configured accuracy
    (``pilot.detector_accuracy``, when set: each row's label flipped with probability
    ``1 − accuracy``): the detector-quality sweep's detector of controlled quality, not a
    deployable one. It has no score (a penalty in ``progressive`` mode refuses it)."""

    name = "noisy_label"
    needs = frozenset({"label"})
    audited = False
    description = ("the true label through a channel of set precision and recall: a detector of controlled "
                   "quality for the detector-quality sweep, not a deployable one")

    def flag(self, inputs):
        if inputs.label is None:
            raise ValueError("the noisy_label detector needs the true hack label")
        if inputs.accuracy is not None:
            return D.accuracy_label_flags(inputs.label, inputs.accuracy, inputs.rng)
        return D.noisy_label_flags(inputs.label, inputs.precision, inputs.recall, inputs.rng)


DETECTORS: dict[str, type[Detector]] = {cls.name: cls for cls in (Gradient, Probe, Pattern, NoisyLabel)}
# the rows.tsv score columns (score_{detector}): one per detector with a score (evil_moe.tables)
tables.register_names("detector", [name for name, cls in DETECTORS.items() if cls.unit is not None])


def get_detector(name: str) -> Detector:
    """An instance of the detector ``name``.

    Raises:
        ValueError: unknown detector (names it and lists the known ones).
    """
    if name not in DETECTORS:
        raise ValueError(f"unknown detector {name!r}; expected one of {list(DETECTORS)}")
    return DETECTORS[name]()


def scored(detector: str, *, flags_with_detector: bool, score_rows: bool) -> list[Detector]:
    """The detectors a step scores its rows with, in registry order: those scored always, the
    run's ``detector`` when the arm flags with it, and in a calibration run (``score_rows``)
    every audited one."""
    return [cls() for name, cls in DETECTORS.items()
            if cls.always_scored or (score_rows and cls.audited) or (flags_with_detector and name == detector)]


__all__ = ["DETECTORS", "Detector", "StepRows", "AuditRows", "AuditScores", "get_detector", "scored",
           "NEEDS", "CALIBRATIONS", "LABEL_SOURCES"]
