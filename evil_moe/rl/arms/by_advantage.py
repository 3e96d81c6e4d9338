"""The arms that act on the advantages before the loss: Advantage Modification (Wu & Tang 2026,
arXiv:2604.01476, "When Reward Hacking Rebounds") and its control. Registered in
:data:`evil_moe.rl.arms.registry.ARMS`; the direction and the scores are
:mod:`evil_moe.rl.detectors.shortcut`, the step's part :mod:`evil_moe.rl.trainer.advantage_step`
(docs/arms.md, "Advantage Modification").

Each rollout gets a **shortcut score** ``s_i = ⟨h_i, v⟩``: ``h_i`` its activation at a middle
layer averaged over its completion's tokens, ``v`` the unit "shortcut" direction, the difference of
the mean activations of the authored hack and clean completions (domain-general contrastive pairs;
no label of the run's own rollouts). Within each group the scores are rescaled to ``[0, 1]`` and
the rollout's reward is discounted by them before the group baseline::

    p_i  = (s_i − min_g s) / (max_g s − min_g s)      (0 for every row of a group whose scores are equal)
    R'_i = R_i · (1 − λ · p_i)                          λ = advantage_mod.coef
    A'_i = R'_i − mean_g R'                             (Dr.GRPO; ÷ (std_g R' + ε) with pilot.scale_std)

so among a group's rewarded rollouts the most shortcut-like keeps ``1 − λ`` of its reward and the
least shortcut-like all of it; an unrewarded rollout's reward stays 0 (only rewarded rollouts are
discounted, the baseline then shares the change across the group). The paper's abstract fixes
what goes in (a shortcut concept score from domain-general contrastive pairs, read at mid depth,
integrated into the GRPO advantage computation to penalise hacking rollouts before the update);
its method section was not available to us, so the pooling, the in-group rescaling, the
multiplicative discount of the reward before the baseline and ``λ = 0.5`` are our reading,
named as such in docs/arms.md.
"""

from __future__ import annotations

import torch

from evil_moe.rl.arms.base import Arm

__all__ = ["AdvantageMod", "AdvantageModRandom", "group_unit_scores", "shortcut_discounted_rewards"]


def group_unit_scores(scores) -> torch.Tensor:
    """Each group's scores rescaled to ``[0, 1]``: ``(s − min_g s) / (max_g s − min_g s)``, 0 for
    every row of a group whose scores are all equal.

    Args:
        scores: ``(P, G)`` shortcut scores (any unit: the rescaling removes it).

    Returns:
        ``(P, G)`` fp64.

    Raises:
        ValueError: ``scores`` is not 2-D or not finite.
    """
    s = torch.as_tensor(scores, dtype=torch.float64)
    if s.dim() != 2:
        raise ValueError(f"shortcut scores must be (P, G), got shape {tuple(s.shape)}")
    if not bool(torch.isfinite(s).all()):
        raise ValueError("shortcut scores must be finite")
    lo, hi = s.min(dim=1, keepdim=True).values, s.max(dim=1, keepdim=True).values
    span = hi - lo
    return torch.where(span > 0, (s - lo) / torch.where(span > 0, span, 1.0), torch.zeros_like(s))


def shortcut_discounted_rewards(rewards, scores, coef: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Advantage Modification's rewards: ``R'_i = R_i · (1 − coef · p_i)``, ``p`` the group-rescaled
    shortcut scores (:func:`group_unit_scores`); the advantages are then the group's as usual
    (:func:`evil_moe.rl.policy.grpo.group_advantages`). Our reading of arXiv:2604.01476 (module
    docstring).

    Args:
        rewards: ``(P, G)`` the arm's rewards (≥ 0 in this environment).
        scores: ``(P, G)`` the rollouts' shortcut scores.
        coef: ``λ`` in [0, 1] (``advantage_mod.coef``).

    Returns:
        ``(R', discount)``: ``(P, G)`` rewards in the dtype of
        :func:`~evil_moe.rl.policy.grpo.group_advantages`'s input (fp64 for fp64 rewards, else
        fp32) and ``(P, G)`` fp64 ``coef · p`` (the fraction of each reward removed).

    Raises:
        ValueError: shapes differ, or ``coef`` outside [0, 1].
    """
    if not 0.0 <= float(coef) <= 1.0:
        raise ValueError(f"advantage_mod.coef must be in [0, 1], got {coef}")
    R = torch.as_tensor(rewards)
    R = R.to(torch.float64 if R.dtype == torch.float64 else torch.float32)
    p = group_unit_scores(scores)
    if R.shape != p.shape:
        raise ValueError(f"rewards {tuple(R.shape)} and shortcut scores {tuple(p.shape)} must be the same (P, G)")
    discount = float(coef) * p
    return (R.double() * (1.0 - discount)).to(R.dtype), discount


class AdvantageMod(Arm):
    """Advantage Modification (Wu & Tang 2026, arXiv:2604.01476): every rollout's reward is
    discounted by its shortcut score, rescaled within its group, before the group baseline
    (:func:`shortcut_discounted_rewards`), so the advantages push the policy away from the
    rollouts that read most like a shortcut. The direction is computed once per pilot from the
    authored pairs under the starting policy; the scores under the sampling policy at each step.
    Every rollout trains ``δS``; nothing is quarantined."""

    name = "advantage_mod"
    colour = "#7b4f2c"
    role = "treatment"
    control = "advantage_mod_random"
    shortcut = "authored"
    sections = ("moe", "advantage_mod")  # the authored pairs (moe.pairs) and the method's keys
    uses_labels = ("authored",)  # the direction: the authored pairs' hack and clean sides
    description = ("Advantage Modification (arXiv:2604.01476): each rollout's reward is discounted by its "
                   "mid-layer shortcut score (the authored pairs' mean difference), rescaled within its "
                   "group, before the group baseline")

    def shortcut_rewards(self, rewards, scores, cfg) -> tuple[torch.Tensor, torch.Tensor]:
        """The rewards the group advantages are taken over and the discount
        (:func:`shortcut_discounted_rewards`; ``cfg``: the ``advantage_mod`` section)."""
        return shortcut_discounted_rewards(rewards, scores, cfg.coef)


class AdvantageModRandom(AdvantageMod):
    name = "advantage_mod_random"
    colour = "#d9b38c"
    role = "control"
    control = None
    shortcut = "random"
    uses_labels = ()  # a random direction: no label
    description = ("Advantage Modification along a random unit direction at the same layer "
                   "(advantage_mod's control)")
