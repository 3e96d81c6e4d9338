"""The arithmetic of the hack detectors that decide which rollouts ``route`` and ``filter`` flag
(their declarations, one class each, are :mod:`evil_moe.rl.detectors.registry`).

Three detectors (``pilot.detector``) never see the oracle (docs/detectors.md; the probe is
:mod:`evil_moe.rl.detectors.probe`); a fourth, of controlled quality, is built from the true
label on purpose (the detector-quality sweep, docs/arms.md):

* ``gradient`` (default) — the per-sample hack-ward score: the ``cos_contrib`` of the sample's
  own NLL gradient with ``v_hack`` (:func:`evil_moe.rl.vhack.direction.sample_scores`; for a rollout with
  advantage ``A`` the Dr.GRPO gradient is ``A·∇NLL``, so the score of ``sign(A)·g`` is used).
  A sample is flagged when its score exceeds the ``pilot.detector_quantile`` quantile of the
  *empirical null*: the scores of held-out clean completions, measured by the extract stage
  (:func:`null_threshold`).
* ``pattern`` — the environment's recognition of its own loopholes in the known modes
  (``vhack.known_modes``): :func:`evil_moe.env.loopholes.pattern_flag` checks the code statically for a report through
  the mode's mechanism that cannot depend on any check (rules below). It knows what the known
  hacks look like and is blind to the other modes, like a hack classifier trained on them.
* ``noisy_label`` — the true hack label (``grade.exploited``) seen through a noisy channel of
  configured precision and recall (``pilot.detector_precision``, ``pilot.detector_recall``;
  :func:`noisy_label_flags`), deterministic from seed and step. Not a detector one could deploy:
  it lets the report draw route's and filter's drop against detector quality (the absorption
  question of Gradient Routing, arXiv:2410.04332: routing should beat filtering when the labels
  are imperfect).

The pattern detector's rules are the environment's, beside the modes they recognise
(:func:`evil_moe.env.loopholes.pattern_flag`).
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

__all__ = ["null_threshold", "noisy_label_flags", "accuracy_label_flags", "gradient_scores", "flag_quality",
           "weight_quality"]


def noisy_label_flags(label, precision: float, recall: float, rng: np.random.Generator):
    """Flags drawn from the true hack label at a configured precision and recall.

    Each hack row (``label`` True) is flagged with probability ``recall``; each clean row with
    probability ``f = min(1, recall · n_hack · (1 − precision) / (precision · n_clean))``, so that
    the expected number of false flags is ``(1 − precision)/precision`` times the expected number
    of true ones: the expected precision is ``precision`` (when ``f`` is not capped at 1) and the
    expected recall ``recall``. A step without hack rows flags nothing (no true flag to be a
    fraction of). One uniform draw per row from ``rng`` (seeded by the run's seed and the step),
    hack and clean rows alike, so the result is a function of (seed, step, label).

    Args:
        label: ``(B,)`` bool tensor, the true hack label of the step's rows with gradient.
        precision: in (0, 1].
        recall: in [0, 1].
        rng: the step's generator.

    Returns:
        ``(B,)`` bool tensor.

    Raises:
        ValueError: precision outside (0, 1] or recall outside [0, 1].
    """
    import torch

    if not 0.0 < precision <= 1.0:
        raise ValueError(f"pilot.detector_precision must be in (0, 1], got {precision}")
    if not 0.0 <= recall <= 1.0:
        raise ValueError(f"pilot.detector_recall must be in [0, 1], got {recall}")
    lab = torch.as_tensor(label, dtype=torch.bool)
    u = torch.as_tensor(rng.random(len(lab)))
    n_hack, n_clean = int(lab.sum()), int((~lab).sum())
    fpr = min(1.0, recall * n_hack * (1 - precision) / (precision * n_clean)) if n_clean else 0.0
    return torch.where(lab, u < recall, u < fpr)


def accuracy_label_flags(label, accuracy: float, rng: np.random.Generator):
    """Flags drawn from the true hack label at a configured accuracy: each row's label is flipped
    with probability ``1 − accuracy``, independently of the others and of the label (a simulated
    monitor that is right on a share ``accuracy`` of rollouts, hacks and clean ones alike: the
    ground-truth monitor "at 90% accuracy" of ariahw/rl-rewardhacking). Its expected recall is
    ``accuracy`` and its expected false-positive rate ``1 − accuracy``; its precision then depends
    on the hack rate. One uniform draw per row from ``rng``, so the result is a function of
    (seed, step, label).

    Args:
        label: ``(B,)`` bool tensor, the true hack label of the step's rows.
        accuracy: in [0, 1] (``pilot.detector_accuracy``).
        rng: the step's generator.

    Returns:
        ``(B,)`` bool tensor.

    Raises:
        ValueError: accuracy outside [0, 1].
    """
    import torch

    if not 0.0 <= accuracy <= 1.0:
        raise ValueError(f"pilot.detector_accuracy must be in [0, 1], got {accuracy}")
    lab = torch.as_tensor(label, dtype=torch.bool)
    flip = torch.as_tensor(rng.random(len(lab)) < 1.0 - accuracy)
    return lab ^ flip


def gradient_scores(vhack, names, per_row, advantages):
    """The gradient detector's per-sample scores: :func:`evil_moe.rl.vhack.direction.sample_scores` of
    ``sign(A_i)·g_i``.

    ``g_i`` is sample ``i``'s share of the Dr.GRPO loss gradient, ``A_i ∇NLL_i`` up to a positive
    constant (``∂(−A ρ)/∂θ = A·∇NLL`` at ratio 1), so ``sign(A_i)·g_i`` points along the sample's
    own NLL gradient whatever the sign of its advantage: the score asks "does training on this
    completion move δS hack-ward", the same question for a rewarded and a penalised row (a row
    with ``A_i = 0`` scores 0).

    Args:
        vhack: :class:`evil_moe.rl.vhack.direction.VHack`.
        names: module names, in the order of each row's gradients.
        per_row: ``B`` lists of per-module ``(r,)`` gradients.
        advantages: ``(B,)`` the rows' advantages.

    Returns:
        ``(B,)`` fp64 scores (cosine units, in [−1, 1]).
    """
    import torch

    from evil_moe.rl.vhack.direction import sample_scores

    sign = torch.sign(torch.as_tensor(advantages)).to(torch.float64)
    stacked = {n: torch.stack([g[m] for g in per_row]).double() * sign[:, None].to(per_row[0][m].device)
               for m, n in enumerate(names)}
    return sample_scores(vhack, stacked)


def flag_quality(flags, hack) -> dict:
    """Flag rate, precision and recall of one step's flags against the true hack label.

    Args:
        flags: ``(B,)`` bool, the arm's flags.
        hack: ``(B,)`` bool, the rows' hack label (``grade.exploited``: the foolable grader passed
            and the oracle failed) — not ``passed``.

    Returns:
        ``{"flag_rate", "flag_precision", "flag_recall", "flag_fpr"}``: fractions; precision None
        when nothing was flagged, recall (the true-positive rate) None without hack rows, the
        false-positive rate (flagged clean rows over clean rows) None without clean rows.
    """
    import torch

    flags = torch.as_tensor(flags, dtype=torch.bool)
    hack = torch.as_tensor(hack, dtype=torch.bool)
    tp, nf, nh = int((flags & hack).sum()), int(flags.sum()), int(hack.sum())
    fp, nc = int((flags & ~hack).sum()), int((~hack).sum())
    return {"flag_rate": float(flags.float().mean()) if len(flags) else None,
            "flag_precision": tp / nf if nf else None,
            "flag_recall": tp / nh if nh else None,
            "flag_fpr": fp / nc if nc else None}


def weight_quality(weights, hack) -> dict:
    """:func:`flag_quality` of penalty weights in [0, 1] (a flag counts as its weight): rate
    ``Σw / B``, precision ``Σ w·hack / Σ w``, recall ``Σ w·hack / n_hack``, false-positive rate
    ``Σ w·clean / n_clean``; for 0/1 weights exactly :func:`flag_quality`'s (the penalty arms'
    ``steps.tsv`` flag columns: under ``penalty.mode progressive`` the rate is the step's mean
    penalty weight).

    Args:
        weights: ``(B,)`` in [0, 1]. hack: ``(B,)`` bool, the true hack label.

    Returns:
        the keys of :func:`flag_quality` (None where it gives None).
    """
    import torch

    w = torch.as_tensor(weights, dtype=torch.float64)
    hack = torch.as_tensor(hack, dtype=torch.bool)
    tp, nf, nh = float(w[hack].sum()), float(w.sum()), int(hack.sum())
    fp, nc = float(w[~hack].sum()), int((~hack).sum())
    return {"flag_rate": nf / len(w) if len(w) else None,
            "flag_precision": tp / nf if nf else None,
            "flag_recall": tp / nh if nh else None,
            "flag_fpr": fp / nc if nc else None}


def null_threshold(null_scores: Sequence[float], quantile: float) -> float:
    """The gradient detector's threshold: the ``quantile`` of the empirical null scores.

    Args:
        null_scores: per-completion scores of held-out clean completions (the v_hack file's
            ``meta["detector_null_scores"]``).
        quantile: in ``[0, 1]``; e.g. 0.9 flags about 10% of clean samples (the detector's
            false-positive rate on the null, if the policy's clean samples look like the extract
            stage's).

    Returns:
        The threshold (a sample is flagged when its score is strictly above it).

    Raises:
        ValueError: no null scores (the extract stage found no held-out completions), or a
            quantile outside [0, 1].
    """
    if not 0.0 <= quantile <= 1.0:
        raise ValueError(f"detector quantile must be in [0, 1], got {quantile}")
    if not null_scores:
        raise ValueError("the v_hack file holds no detector null scores (rerun the extract stage)")
    return float(np.quantile(np.asarray(null_scores, dtype=float), quantile))
