"""The optimiser of the routing arms: one AdamW state per module, its preconditioner shared by
both knobs, each knob moved only by the gradient routed to it.

The forward sees ``s = δS + δS_hack`` per module (:mod:`evil_moe.model.adapter`), so a routing
arm (route, its controls and ceilings, moe) trains one effective knob whose gradient the arm
divides between the deployed knob ``δS`` and the quarantine ``δS_hack``. Giving each knob an AdamW
of its own (the earlier design) lets the optimiser, not the data, move the quarantine:

* a knob that receives a *zero* gradient keeps moving by its momentum (PyTorch's AdamW updates
  every parameter whose ``grad`` is a tensor), so one routed row launches steps for the rest of
  the run (measured: route seed 2 routed one row in 20 steps and ended with ‖δS_hack‖ 7.40 against
  ‖δS‖ 12.89);
* AdamW's per-coordinate normalisation makes a step about ``lr`` per coordinate whatever the
  gradient's size, so a knob fed one row moves as far as a knob fed a whole batch.

:class:`SplitAdamW` keeps, per module, one first moment per knob, each accumulating only the
gradient routed to that knob, and one second moment over both::

    m_δS   ← β1 m_δS   + (1 − β1) g_δS          v ← β2 v + (1 − β2) (g_δS² + g_δS_hack²)
    m_hack ← β1 m_hack + (1 − β1) g_δS_hack
    δS      ← δS (1 − lr λ)      − lr · m̂_δS   / (√v̂ + ε)
    δS_hack ← δS_hack (1 − lr λ) − lr · m̂_hack / (√v̂ + ε)

(``m̂ = m / (1 − β1ᵗ)``, ``v̂ = v / (1 − β2ᵗ)``: AdamW, Loshchilov & Hutter, arXiv:1711.05101). The
preconditioner is the energy of everything routed through the coordinate, so a knob's step is its
routed gradients' share of it: a knob that was never routed to stays exactly where it started, a
row routed once moves the quarantine by that row's momentum-weighted share and no more, and a
small dose moves it a small amount, each knob bounded per coordinate as AdamW's own step is
(``v`` is at least the knob's own second moment). With nothing routed to ``δS_hack`` the arm is
exactly AdamW on ``δS``. (A second moment of the *summed* gradient ``(g_δS + g_δS_hack)²`` would make
the two updates add up to AdamW on the summed knob, but the parts of a Dr.GRPO gradient cancel
across a group — its advantages sum to zero — so the parts can be far larger than their sum and
that step is unbounded: measured on moe, ‖δS‖ 29.8 after one step against AdamW's bound of about
lr·√n = 2.3.) Arms that train ``δS`` alone keep :class:`torch.optim.AdamW`.

Sources: AdamW (arXiv:1711.05101); Gradient Routing (Cloud et al. 2024, arXiv:2410.04332), whose
routed parameters are the quarantine here.
"""

from __future__ import annotations

import math
from typing import Sequence

import torch

__all__ = ["SplitAdamW"]


class SplitAdamW(torch.optim.Optimizer):
    """AdamW with one preconditioner per module shared by ``δS`` and ``δS_hack``, and one first
    moment per knob (the module docstring).

    Args:
        delta_s: the ``δS`` Parameters, one ``(r,)`` per module.
        delta_s_hack: the ``δS_hack`` Parameters, the same shapes in the same order.
        lr, betas, eps, weight_decay: AdamW's (decoupled weight decay, applied to each knob).

    ``step()`` reads each knob's ``.grad`` (``None`` = nothing routed to it this step: zero). A
    module whose two grads are both ``None`` is skipped (no state change), as AdamW skips a
    parameter without a gradient. The state (per module: ``step``, ``exp_avg``, ``exp_avg_hack``,
    ``exp_avg_sq``) lives on the ``δS`` parameter, so ``state_dict`` / ``load_state_dict`` work
    as for any optimiser.

    Raises:
        ValueError: the two lists differ in length or a pair in shape; a hyper-parameter out of
            range.
    """

    def __init__(self, delta_s: Sequence[torch.nn.Parameter], delta_s_hack: Sequence[torch.nn.Parameter],
                 *, lr: float, betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8,
                 weight_decay: float = 0.0):
        delta_s, delta_s_hack = list(delta_s), list(delta_s_hack)
        if len(delta_s) != len(delta_s_hack):
            raise ValueError(f"{len(delta_s)} delta_s knobs but {len(delta_s_hack)} delta_s_hack knobs")
        for i, (p, q) in enumerate(zip(delta_s, delta_s_hack)):
            if p.shape != q.shape:
                raise ValueError(f"knob pair {i}: delta_s {tuple(p.shape)} vs delta_s_hack {tuple(q.shape)}")
        if lr <= 0 or eps <= 0 or weight_decay < 0 or not all(0.0 <= b < 1.0 for b in betas):
            raise ValueError(f"SplitAdamW: lr {lr}, betas {betas}, eps {eps}, weight_decay {weight_decay}")
        self.n_pairs = len(delta_s)
        super().__init__(delta_s + delta_s_hack,
                         dict(lr=lr, betas=tuple(betas), eps=eps, weight_decay=weight_decay))

    @torch.no_grad()
    def step(self, closure=None):
        """One step (see the module docstring); ``closure`` is not supported (returns None)."""
        if closure is not None:
            raise ValueError("SplitAdamW.step takes no closure")
        group = self.param_groups[0]
        lr, (b1, b2), eps, wd = group["lr"], group["betas"], group["eps"], group["weight_decay"]
        params = group["params"]
        for p, q in zip(params[:self.n_pairs], params[self.n_pairs:]):
            if p.grad is None and q.grad is None:
                continue
            gp = p.grad if p.grad is not None else torch.zeros_like(p)
            gq = q.grad if q.grad is not None else torch.zeros_like(q)
            st = self.state[p]
            if not st:
                st["step"] = torch.zeros((), dtype=torch.float64)
                st["exp_avg"] = torch.zeros_like(p)
                st["exp_avg_hack"] = torch.zeros_like(q)
                st["exp_avg_sq"] = torch.zeros_like(p)
            st["step"] += 1
            t = float(st["step"])
            st["exp_avg"].lerp_(gp, 1 - b1)
            st["exp_avg_hack"].lerp_(gq, 1 - b1)
            st["exp_avg_sq"].mul_(b2).addcmul_(gp, gp, value=1 - b2).addcmul_(gq, gq, value=1 - b2)
            denom = (st["exp_avg_sq"].sqrt() / math.sqrt(1 - b2 ** t)).add_(eps)
            step_size = lr / (1 - b1 ** t)
            if wd:
                p.mul_(1 - lr * wd)
                q.mul_(1 - lr * wd)
            p.addcdiv_(st["exp_avg"], denom, value=-step_size)
            q.addcdiv_(st["exp_avg_hack"], denom, value=-step_size)
        return None
