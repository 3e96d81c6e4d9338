"""Evil MoE's router in the training step, for the arms with a router
(:attr:`evil_moe.rl.arms.base.Arm.router`; docs/method.md): :class:`RouterStep` sets the router up
(the pin bank, the seed direction, the centred bias, its Adam), computes the step's Dr.GRPO loss
under the router's mixture of the two experts (:meth:`RouterStep.gradients`, in place of
:class:`evil_moe.rl.trainer.gradient_step.GradientStep`), takes the router's own step
(:meth:`RouterStep.step`: its GRPO gradient plus the pin loss) and gives its columns of the step's
row (:meth:`RouterStep.log_columns`). The trainer holds one and calls it from its named phases.
"""

from __future__ import annotations

import torch

from evil_moe.env.authored import load_authored
from evil_moe.model.logprobs import token_logprobs
from evil_moe.rl.detectors import router as R
from evil_moe.rl.policy import grpo
from evil_moe.rl.policy.grpo import DrGRPONormaliser, RolloutBatch
from evil_moe.rl.trainer.step import PilotInvalid, StepBatch, StepGradients, loss_stats, part_stats


class RouterStep:
    """Evil MoE's router of one arm × seed (:mod:`evil_moe.rl.detectors.router`).

    Built from the authored pairs in the run's format as a
    :class:`~evil_moe.rl.detectors.router.PinBank` (their labels shuffled per pair for
    ``moe_random``), the seed direction (``v_act`` of their pooled activations under the starting
    policy, or a random unit vector for ``moe_random``, which never computes ``v_act`` unless
    ``moe.control_direction`` is ``v_act``, the break-it check), the bias centred between the
    pinned hack and clean cosines, and its Adam. ``placebo_dirs`` are ``audit.placebos`` random
    directions whose cosines are the on-policy placebo of ``w``. Turns on ``δS_hack``'s gradient
    (the router's forward differentiates the hack expert directly).

    Args:
        cfg: the run config (``moe``, ``audit``, ``pilot``, ``problems.source``).
        kind: the arm's :attr:`~evil_moe.rl.arms.base.Arm.router` (``authored`` or ``random``).
        seed: the run seed.
        model, tok, adapter, device: the policy.
        normaliser: the Dr.GRPO normaliser.
    """

    def __init__(self, cfg, *, kind: str, seed: int, model, tok, adapter, device,
                 normaliser: DrGRPONormaliser):
        self.cfg, self.pc, self.seed = cfg, cfg.pilot, seed
        self.model, self.tok, self.adapter, self.device = model, tok, adapter, device
        self.normaliser = normaliser
        self.ds, self.dsh = adapter.delta_s_params(), adapter.delta_s_hack_params()
        mc = cfg.moe
        fmt = "toy" if cfg.problems.source == "toy" else "leetcode"
        bank = R.PinBank.from_authored(load_authored(mc.pairs, fmt=fmt), tok,
                                       dict(cfg.models.chat_template_kwargs))
        rseed = mc.seed * 1_000_003 + seed
        authored = bank.label  # shuffling swaps labels within pairs; the rows stay
        if kind == "random":
            bank = bank.shuffled(rseed)
        h = self.pair_hidden(bank, range(len(bank.label)))
        seeded = kind == "authored" or mc.control_direction == "v_act"  # the latter: a break-it check
        direction = (R.v_act(h[authored], h[~authored]) if seeded
                     else R.random_direction(h.shape[1], rseed))
        c = R.Router(direction, mc.scale, 0.0).cos(h).detach()
        bias = R.centred_bias(c[bank.label], c[~bank.label], mc.scale)
        self.router = R.Router(direction, mc.scale, bias).to(device)
        self.opt = torch.optim.Adam(self.router.parameters(), lr=mc.lr)
        self.pin_bank = bank
        for p in self.dsh:  # the router's forward differentiates the hack expert directly
            p.requires_grad_(True)
        a = cfg.audit
        self.placebo_dirs = torch.stack([R.random_direction(h.shape[1], a.seed * 1_000 + i)
                                         for i in range(a.placebos)])

    def pair_hidden(self, bank, rows) -> torch.Tensor:
        """Pooled activations ``(len(rows), d)`` of the pin bank's completions under the policy as
        it is now (trained view, no gradient), in chunks of ``pilot.micro_batch`` (8 when 0),
        through the merged weights (:meth:`evil_moe.model.adapter.SVDAdapter.merged`: one matmul
        per Linear instead of the hook's three; the same activations to float rounding)."""
        rows = list(rows)
        return R.pooled_in_chunks(self.model, self.adapter, self.tok.pad_token_id, self.device,
                                  [bank.prompt_ids[i] for i in rows], [bank.completion_ids[i] for i in rows],
                                  self.pc.micro_batch or 8,
                                  lambda m, b: R.pooled_hidden(m, b, self.pc.temperature))

    def gradients(self, batch: StepBatch, adv, rows: list[int], step: int) -> StepGradients:
        """Evil MoE's loss and gradients: per micro-batch, the rows' pooled activations under the
        sampling policy (trained view, no gradient, through the merged weights), the router's
        ``w``, and the Dr.GRPO loss under :meth:`evil_moe.model.adapter.SVDAdapter.mixture`
        (δS's gradient × (1 − w_b), δS_hack's × w_b; ``moe.forward``). The behaviour log-probs
        are the sampler's recorded ones (the policy drew the tokens with both experts at full
        weight): under ``straight_through`` the loss's forward is that policy (importance ratio 1
        at the first inner step); under ``scaled`` it is ``δS + w_b·δS_hack``, scored against the
        sampled one (``frac_clipped``, ``sampler_gap_*``). Returns the δS and δS_hack gradients
        (``split``; ``total`` = their sum), ``w`` and the router's GRPO gradient
        (``router_grads``).

        Raises:
            PilotInvalid: a non-finite loss.
        """
        pc = self.pc
        rparams = list(self.router.parameters())
        if not rows:
            zero = [torch.zeros_like(p) for p in self.ds]
            return StepGradients([], zero, None, 0.0, loss_stats([]), split=(zero, [torch.zeros_like(p) for p in self.dsh]),
                                 router_w=torch.zeros(0), router_grads=[torch.zeros_like(p) for p in rparams])
        rb = RolloutBatch.from_rollouts([batch.flat[i] for i in rows], adv.flat()[rows],
                                        self.tok.pad_token_id, device=self.device)
        mb = pc.micro_batch or len(rows)
        gs_ds = [torch.zeros_like(p) for p in self.ds]
        gs_dsh = [torch.zeros_like(p) for p in self.dsh]
        gs_r = [torch.zeros_like(p) for p in rparams]
        parts, ws, hs, loss_sum = [], [], [], 0.0
        sels = [list(range(lo, min(lo + mb, len(rows)))) for lo in range(0, len(rows), mb)]
        chunks = [rb if len(sel) == len(rows) else rb.select(sel) for sel in sels]
        with self.adapter.merged():  # the sampling policy's activations, one matmul per Linear
            pooled = [R.pooled_hidden(self.model, part.batch, pc.temperature) for part in chunks]
        for sel, part, h in zip(sels, chunks, pooled):
            w = self.router(h.to(self.device))
            with self.adapter.mixture(w, forward=self.cfg.moe.forward):
                logp = token_logprobs(self.model, part.batch, temperature=pc.temperature)
            ref = None
            if pc.beta > 0:
                with torch.no_grad(), self.adapter.zeroed():
                    ref = token_logprobs(self.model, part.batch, temperature=pc.temperature)
            beh = part.recorded_logp.to(logp.device, logp.dtype) * part.batch.completion_mask
            loss, st = grpo.dr_grpo_loss(logp, beh, part.advantages, part.batch.completion_mask,
                                         self.normaliser, clip_eps=pc.clip_eps, ref_logp=ref, beta=pc.beta)
            if not torch.isfinite(loss):
                raise PilotInvalid(f"non-finite loss ({float(loss.detach())}) at step {step}")
            grads = torch.autograd.grad(loss, self.ds + self.dsh + rparams, allow_unused=True)
            for acc, g in zip(gs_ds + gs_dsh + gs_r, grads):
                if g is not None:
                    acc += g.detach()
            parts.append(part_stats(part, [batch.flat[rows[i]] for i in sel], logp, beh, st, ref))
            loss_sum += float(loss.detach())
            ws.append(w.detach().cpu())
            hs.append(h)
        total = [a + b for a, b in zip(gs_ds, gs_dsh)]
        return StepGradients(rows, total, None, loss_sum, loss_stats(parts), {}, torch.cat(hs, 0),
                             split=(gs_ds, gs_dsh), router_w=torch.cat(ws, 0), router_grads=gs_r)

    def step(self, router_grads: list[torch.Tensor], step: int) -> dict:
        """The router's step after the knobs' step: ``router_grads`` (its GRPO gradient, from
        this step's loss: :attr:`StepGradients.router_grads`) plus ``moe.pin_weight`` × the pin
        loss on this step's authored pairs (:meth:`evil_moe.rl.detectors.router.PinBank.step_pairs`;
        their activations under the policy after the knobs' step), then Adam. Returns the pin
        loss and the router's state for the log."""
        mc = self.cfg.moe
        rows = self.pin_bank.rows(self.pin_bank.step_pairs(mc.pin_pairs, self.seed, step))
        h = self.pair_hidden(self.pin_bank, rows).to(self.device)
        loss = R.pin_loss(self.router, h, self.pin_bank.label[rows])
        params = list(self.router.parameters())
        pin = torch.autograd.grad(loss, params)
        for p, g_rl, g_pin in zip(params, router_grads, pin):
            p.grad = g_rl.to(p.device) + mc.pin_weight * g_pin
        self.opt.step()
        return {"router_pin_loss": float(loss.detach()), "router_cos_seed": self.router.cos_to_seed(),
                "router_scale": float(self.router.log_scale.detach().exp()), "router_bias": float(self.router.bias.detach())}

    @staticmethod
    def log_columns(recs: list[dict], hack_expert_share: float | None, router_state: dict) -> dict:
        """Evil MoE's columns of the step's row: the mean ``w`` over the hack and the clean
        rollouts with a gradient (``recs``' ``score_router``; the label is logged, never used),
        the share of the gradient's energy that went to the hack expert, and the pin loss and
        the router's state (``router_state``: :meth:`step`'s)."""
        w = [(r["score_router"], bool(r["exploited"])) for r in recs if r.get("score_router") is not None]
        hk, cl = [x for x, e in w if e], [x for x, e in w if not e]
        return {"router_w_hack": sum(hk) / len(hk) if hk else None,
                "router_w_clean": sum(cl) / len(cl) if cl else None,
                "hack_expert_share": hack_expert_share, **router_state}

    def state(self) -> dict:
        """The router's and its Adam's states (the checkpoint's router part)."""
        return {"state": self.router.state_dict(), "optimizer": self.opt.state_dict()}

    def load_state(self, ck: dict) -> None:
        """Restore :meth:`state`."""
        self.router.load_state_dict(ck["state"])
        self.opt.load_state_dict(ck["optimizer"])
