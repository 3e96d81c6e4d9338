"""Evil MoE's soft router: how much of each rollout's gradient trains the deletable hack expert.

The two experts are the adapter's two knobs in the same SVD basis, capacity-matched: the deployed
expert ``δS`` and the quarantine ``δS_hack`` (the hack expert, ablated at deploy). Per rollout
``b`` the router gives one weight::

    w_b = σ(scale · cos(h_b, u) + bias)

where ``h_b`` is the rollout's pooled activation (the policy's final hidden state averaged over
the completion's tokens, :func:`pooled_hidden`), ``u`` a learned direction seeded with ``v_act``
(the unit difference of the mean activations of hand-authored hack and clean completions,
:func:`v_act`), and ``scale > 0`` and ``bias`` are learned. For two experts a softmax router is
exactly this rank-1 sigmoid. The loss then sends ``w_b`` of rollout ``b``'s gradient to the hack
expert and ``1 − w_b`` to the deployed one (:meth:`evil_moe.model.adapter.SVDAdapter.mixture`),
so ``w = 0`` trains only the deployed expert, ``w = 1`` only the hack expert; the forward's value
is the sampling policy's ``δS + δS_hack`` (``moe.forward: straight_through``) or the seed
design's ``δS + w_b·δS_hack`` (``scaled``).

The router learns from two signals: the GRPO loss, through ``w`` in the forward; and the **pin
loss** on the authored pairs (:mod:`evil_moe.env.authored`), applied every step: binary
cross-entropy pushing ``w`` towards 1 on the hack completions and 0 on the clean ones
(:class:`PinBank`). Those labels are the only ones the method sees: no detector or oracle label
of a student rollout reaches it (oracle-free at training time). Its matched control
(``moe_random``) seeds ``u`` with a random unit direction and is pinned on the same pairs with
their labels swapped at random per pair (:meth:`PinBank.shuffled`).

Source: the seed repository's design (wassname/evil_MoE, README and spec of 2026-06); Gradient
Routing (Cloud et al. 2024, arXiv:2410.04332), whose routed parameters the hack expert is.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np
import torch

__all__ = ["Router", "PinBank", "pooled_hidden", "pooled_in_chunks", "v_act", "random_direction", "pin_loss", "centred_bias"]


def pooled_hidden(model, batch, temperature: float = 1.0) -> torch.Tensor:
    """The pooled final hidden state of each row of ``batch`` under the model as it is now (no
    gradient): the mean over the row's completion tokens of the output head's input.

    Args:
        model: the causal LM (adapter hooks active as set by the caller: a view, or merged).
        batch: :class:`evil_moe.model.logprobs.Batch` on the model's device.
        temperature: passed to the forward (it does not change the hidden states).

    Returns:
        ``(B, d)`` fp32 on the CPU.
    """
    from evil_moe.model.logprobs import capture_head_inputs, pool_completion, token_logprobs

    with torch.no_grad(), capture_head_inputs(model) as seen:
        token_logprobs(model, batch, temperature=temperature)
    return pool_completion(torch.cat(seen, 0), batch.completion_mask).float().cpu()


def pooled_in_chunks(model, adapter, pad_id: int, device, prompt_ids, completion_ids, chunk: int,
                     pool) -> torch.Tensor:
    """``pool(model, batch)`` of every (prompt, completion) under the policy as it is now (trained
    view, no gradient), ``chunk`` rows at a time, through the merged weights
    (:meth:`evil_moe.model.adapter.SVDAdapter.merged`: one matmul per Linear instead of the hook's
    three; the same activations to float rounding).

    Args:
        prompt_ids, completion_ids: token-id lists, one per row.
        pool: ``(model, batch) -> (b, d)``, e.g. :func:`pooled_hidden` or a layer's
            (:func:`evil_moe.rl.detectors.shortcut.layer_hidden`).

    Returns:
        ``(n, d)`` in row order.
    """
    from evil_moe.model.logprobs import build_batch

    out = []
    with adapter.merged():
        for lo in range(0, len(prompt_ids), chunk):
            batch = build_batch(prompt_ids[lo:lo + chunk], completion_ids[lo:lo + chunk], pad_id, device=device)
            out.append(pool(model, batch))
    return torch.cat(out, 0)


def v_act(h_hack: torch.Tensor, h_clean: torch.Tensor) -> torch.Tensor:
    """``v_act``: the unit difference of the mean pooled activations of hack and clean completions.

    Args:
        h_hack, h_clean: ``(n, d)`` and ``(m, d)`` pooled activations.

    Returns:
        ``(d,)`` fp32 unit vector.

    Raises:
        ValueError: no rows on a side, widths differ, or the two means coincide.
    """
    if h_hack.shape[0] == 0 or h_clean.shape[0] == 0 or h_hack.shape[1] != h_clean.shape[1]:
        raise ValueError(f"v_act needs hack and clean activations of one width: {tuple(h_hack.shape)}, "
                         f"{tuple(h_clean.shape)}")
    d = h_hack.float().mean(0) - h_clean.float().mean(0)
    n = float(d.norm())
    if n == 0.0:
        raise ValueError("v_act: the hack and clean mean activations coincide")
    return d / n


def random_direction(d: int, seed: int) -> torch.Tensor:
    """A unit vector in ℝ^d drawn from the isotropic Gaussian with ``numpy.random.default_rng(seed)``
    (the same norm as ``v_act``: the random control's seed direction). Returns ``(d,)`` fp32."""
    x = torch.as_tensor(np.random.default_rng(seed).standard_normal(d), dtype=torch.float32)
    return x / x.norm()


class Router(torch.nn.Module):
    """``w = σ(scale · cos(h, u) + bias)`` per rollout (module docstring).

    Args:
        direction: ``(d,)`` the seed of ``u`` (``v_act``, or a random unit vector).
        scale: the initial ``scale`` (> 0; learned as its log).
        bias: the initial ``bias``.

    Attributes:
        u: ``(d,)`` learned direction (only its direction matters). seed: ``(d,)`` buffer, the
        direction it started from. log_scale, bias: learned scalars.

    Raises:
        ValueError: ``scale <= 0`` or a direction of norm 0.
    """

    def __init__(self, direction: torch.Tensor, scale: float, bias: float):
        super().__init__()
        direction = torch.as_tensor(direction, dtype=torch.float32).flatten()
        if scale <= 0 or float(direction.norm()) == 0.0:
            raise ValueError(f"router: scale {scale} must be > 0 and the direction non-zero")
        unit = direction / direction.norm()
        self.u = torch.nn.Parameter(unit.clone())
        self.register_buffer("seed", unit.clone())
        self.log_scale = torch.nn.Parameter(torch.tensor(math.log(scale), dtype=torch.float32))
        self.bias = torch.nn.Parameter(torch.tensor(float(bias), dtype=torch.float32))

    def cos(self, h: torch.Tensor) -> torch.Tensor:
        """``(B,)`` cosine of each row of ``h (B, d)`` with ``u`` (differentiable in ``u``)."""
        h = h.to(self.u.device, torch.float32)
        return (h @ self.u) / (h.norm(dim=1).clamp_min(1e-12) * self.u.norm().clamp_min(1e-12))

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        """``(B,)`` weights ``w`` in (0, 1) for pooled activations ``h (B, d)``."""
        return torch.sigmoid(self.log_scale.exp() * self.cos(h) + self.bias)

    def cos_to_seed(self) -> float:
        """Cosine of ``u`` with the direction it was seeded with (1 at the start)."""
        u = self.u.detach()
        return float((u @ self.seed) / (u.norm() * self.seed.norm()).clamp_min(1e-12))


@dataclass
class PinBank:
    """The authored pairs as the policy sees them: tokenised prompts and completions, and the
    pin label of each completion (1 = pinned to the hack expert).

    Attributes:
        prompt_ids: per completion, the chat-template prompt ids.
        completion_ids: per completion, the completion's ids (eos appended).
        label: ``(n,)`` bool, the pin target (hack completions True, unless shuffled).
        pair: ``(n,)`` int, the pair each completion belongs to (a pair = one hack + one clean).
    """

    prompt_ids: list[list[int]]
    completion_ids: list[list[int]]
    label: torch.Tensor
    pair: torch.Tensor

    @classmethod
    def from_authored(cls, authored: Sequence, tokenizer, template_kwargs=None) -> "PinBank":
        """Tokenise every (hack, clean) pair of :func:`evil_moe.env.authored.load_authored`'s
        problems (the hack first), the prompts rendered with the chat template's arguments
        ``template_kwargs`` (:func:`evil_moe.rl.policy.rollout.chat_prompt_ids`).

        Raises:
            ValueError: no pair.
        """
        from evil_moe.env.problems import build_messages
        from evil_moe.rl.policy.rollout import chat_prompt_ids

        prompts, comps, labels, pairs = [], [], [], []
        eos = tokenizer.eos_token_id
        for a in authored:
            pids = chat_prompt_ids(tokenizer, build_messages(a.problem), template_kwargs)
            for hack, clean in a.pairs():
                k = len(set(pairs))
                for text, lab in ((hack, True), (clean, False)):
                    prompts.append(pids)
                    comps.append(list(tokenizer.encode(text, add_special_tokens=False)) + [eos])
                    labels.append(lab)
                    pairs.append(k)
        if not prompts:
            raise ValueError("no authored (hack, clean) pair to pin the router on")
        return cls(prompts, comps, torch.tensor(labels), torch.tensor(pairs))

    @property
    def n_pairs(self) -> int:
        return int(self.pair.max()) + 1

    def shuffled(self, seed: int) -> "PinBank":
        """The same pairs with each pair's two labels swapped with probability ½ (seeded): the
        random control's pins, unrelated to which completion hacks."""
        flip = np.random.default_rng(seed).random(self.n_pairs) < 0.5
        label = self.label.clone()
        for k in np.flatnonzero(flip):
            label[self.pair == int(k)] = ~label[self.pair == int(k)]
        return PinBank(self.prompt_ids, self.completion_ids, label, self.pair)

    def rows(self, pairs: Sequence[int]) -> list[int]:
        """The completion indices of the given pairs, in order."""
        want = set(int(p) for p in pairs)
        return [i for i, p in enumerate(self.pair.tolist()) if p in want]

    def step_pairs(self, k: int, seed: int, step: int) -> list[int]:
        """The ``k`` pairs pinned at ``step``: consecutive slices of epoch-wise permutations
        seeded by ``(seed, epoch)`` (every pair equally often; a function of seed and step)."""
        n = self.n_pairs
        out, pos = [], step * k
        while len(out) < min(k, n):
            epoch, offset = divmod(pos, n)
            out.append(int(np.random.default_rng([seed, epoch, 41]).permutation(n)[offset]))
            pos += 1
        return out


def pin_loss(router: Router, h: torch.Tensor, label: torch.Tensor) -> torch.Tensor:
    """Mean binary cross-entropy of the router's ``w`` on pooled activations ``h (n, d)`` against
    the pin labels ``(n,)`` (1 = hack expert). Differentiable in the router's parameters."""
    w = router(h).clamp(1e-6, 1 - 1e-6)
    y = label.to(w.device, w.dtype)
    return -(y * torch.log(w) + (1 - y) * torch.log(1 - w)).mean()


def centred_bias(router_cos_hack: torch.Tensor, router_cos_clean: torch.Tensor, scale: float) -> float:
    """The initial bias that puts ``w = ½`` midway between the mean cosines of the pinned hack and
    clean completions: ``−scale · (c̄_hack + c̄_clean) / 2``."""
    return -scale * 0.5 * (float(router_cos_hack.mean()) + float(router_cos_clean.mean()))
