"""Advantage Modification in the training step (Wu & Tang 2026, arXiv:2604.01476), for the arms
with a shortcut direction (:attr:`evil_moe.rl.arms.base.Arm.shortcut`; docs/arms.md):
:class:`ShortcutStep` computes the direction once per pilot from the authored pairs under the
starting policy (or draws the random control's), scores the step's rollouts along it under the
sampling policy, and gives the rewards the group advantages are taken over
(:meth:`ShortcutStep.rewards`, between grading and the advantages, so the change reaches the
loss and nothing else) and its columns of the step's row (:meth:`ShortcutStep.log_columns`).
"""

from __future__ import annotations

import torch

from evil_moe.env.authored import load_authored
from evil_moe.rl.detectors import router as R
from evil_moe.rl.detectors.shortcut import layer_hidden, n_layers, resolve_layer, shortcut_scores
from evil_moe.rl.trainer.step import StepBatch


class ShortcutStep:
    """The shortcut direction of one arm × seed and the step's discounted rewards.

    ``authored``: ``v`` = the unit difference of the mean activations, at layer
    ``advantage_mod.layer`` (None = mid depth), of the authored pairs' hack and clean completions
    in the run's format (``moe.pairs``, the pairs Evil MoE's router is pinned on), under the
    policy the pilot starts from (trained view). ``random``: a unit vector drawn from
    ``numpy.random.default_rng(advantage_mod.seed · 1_000_003 + seed)`` at the same layer (the
    real direction is not computed). The direction is part of the checkpoint.

    Args:
        cfg: the run config (``advantage_mod``, ``moe.pairs``, ``pilot``, ``problems.source``).
        arm: the arm (its :attr:`~evil_moe.rl.arms.base.Arm.shortcut` and ``shortcut_rewards``).
        seed: the run seed.
        model, tok, adapter, device: the policy.

    Raises:
        ValueError: ``advantage_mod.layer`` beyond the model's depth; no authored pair.
    """

    def __init__(self, cfg, *, arm, seed: int, model, tok, adapter, device):
        self.cfg, self.pc, self.ac, self.arm = cfg, cfg.pilot, cfg.advantage_mod, arm
        self.model, self.tok, self.adapter, self.device = model, tok, adapter, device
        self.layer = resolve_layer(self.ac.layer, n_layers(model))
        if arm.shortcut == "authored":
            fmt = "toy" if cfg.problems.source == "toy" else "leetcode"
            bank = R.PinBank.from_authored(load_authored(cfg.moe.pairs, fmt=fmt), tok,
                                           dict(cfg.models.chat_template_kwargs))
            h = self.hidden(bank.prompt_ids, bank.completion_ids)
            self.direction = R.v_act(h[bank.label], h[~bank.label])
        else:
            width = model.get_input_embeddings().embedding_dim
            self.direction = R.random_direction(width, self.ac.seed * 1_000_003 + seed)

    def hidden(self, prompt_ids, completion_ids) -> torch.Tensor:
        """``(n, d)`` activations at :attr:`layer` of the completions under the policy as it is
        now (trained view, no gradient, through the merged weights), in chunks of
        ``pilot.micro_batch`` (8 when 0)."""
        return R.pooled_in_chunks(self.model, self.adapter, self.tok.pad_token_id, self.device, prompt_ids,
                                  completion_ids, self.pc.micro_batch or 8,
                                  lambda m, b: layer_hidden(m, b, self.layer))

    def rewards(self, batch: StepBatch, R_arm: torch.Tensor) -> tuple[torch.Tensor, dict]:
        """The step's rewards after the discount (the arm's ``shortcut_rewards``) and the per-row
        values for the log.

        Args:
            batch: the step's rollouts (``P·G``, prompt-major).
            R_arm: ``(P, G)`` the arm's rewards.

        Returns:
            ``(R', info)``: ``(P, G)`` rewards for :func:`evil_moe.rl.policy.grpo.group_advantages`;
            ``info`` holds ``score`` and ``discount``, each ``(P·G,)`` fp64 in flat order.
        """
        P, G = R_arm.shape
        s = shortcut_scores(self.hidden([r.prompt_ids for r in batch.flat],
                                        [r.completion_ids for r in batch.flat]), self.direction)
        R_new, discount = self.arm.shortcut_rewards(R_arm, s.reshape(P, G), self.ac)
        return R_new, {"score": s, "discount": discount.reshape(-1)}

    @staticmethod
    def log_columns(info: dict, R_arm: torch.Tensor, adv_before, adv_after, recs: list[dict], idx: list[int]) -> dict:
        """The step's Advantage Modification columns: the mean shortcut score of the step's
        rollouts and of its hack and clean student rollouts (``recs``, at flat indices ``idx``;
        the label logged only, never used), the mean discount over the rewarded rollouts, and
        the mean ``|A' − A|`` over every rollout (``adv_before``: the advantages of the
        undiscounted rewards)."""
        s, d = info["score"], info["discount"]
        r = R_arm.reshape(-1)
        hk = [float(s[i]) for i, rec in zip(idx, recs) if rec["exploited"]]
        cl = [float(s[i]) for i, rec in zip(idx, recs) if not rec["exploited"]]
        paid = r > 0
        return {"shortcut_score": float(s.mean()),
                "shortcut_score_hack": sum(hk) / len(hk) if hk else None,
                "shortcut_score_clean": sum(cl) / len(cl) if cl else None,
                "shortcut_discount": float(d[paid].mean()) if bool(paid.any()) else None,
                "shortcut_adv_change": float((adv_after.flat().double() - adv_before.flat().double()).abs().mean())}

    def state(self) -> dict:
        """The direction (the checkpoint's part: a resumed run keeps the starting policy's)."""
        return {"direction": self.direction.clone()}

    def load_state(self, ck: dict) -> None:
        """Restore :meth:`state`."""
        self.direction = ck["direction"].clone()
