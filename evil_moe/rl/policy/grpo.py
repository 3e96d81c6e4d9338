"""Dr.GRPO loss with behaviour-policy importance ratios and one constant normaliser.

Formulas (docs/method.md, "The loss"):

* Advantages per group of G completions of one prompt: ``A = R − mean(R)`` (Dr.GRPO,
  arXiv:2503.20783, drops GRPO's ``/std(R)``; ``scale_std=True`` restores it, arXiv:2402.03300).
  Groups whose rewards are all equal have ``A ≡ 0`` (no gradient at β = 0) and are counted.
* Per completion token: ``ρ = exp(logπθ − logπ_behaviour)`` and the PPO-clip term
  ``ℓ = −min(ρ·A, clip(ρ, 1−ε, 1+ε)·A)``, plus ``β·K3`` with
  ``K3 = exp(logπ_ref − logπθ) − (logπ_ref − logπθ) − 1`` when a reference is given.
* Loss ``= Σ_{completion tokens} ℓ / (G · max_new · P)`` — a constant, never the per-sample
  token count (Dr.GRPO). The distill NLL (:func:`nll_loss`) and the v_hack pair loss use the same
  :class:`DrGRPONormaliser` object, so their gradients are on one scale.

Behaviour policy: ``logπ_behaviour`` must be the log-prob under the model that generated the
tokens. For fresh student rollouts with one inner step it is the student's own detached
log-prob (``ρ ≡ 1``: :func:`on_policy_behaviour`); for teacher rows it is the teacher's log-prob
recorded at generation time. Using the student's log-prob on teacher rows makes ``ρ ≡ 1``
*silently* while the data are off-policy; :class:`RolloutBatch` + :func:`behaviour_logp` make
that construction impossible (teacher rows without recorded log-probs raise ``ValueError``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

import torch

from evil_moe.model.logprobs import Batch, build_batch

__all__ = [
    "DrGRPONormaliser",
    "Advantages",
    "group_advantages",
    "LossStats",
    "dr_grpo_loss",
    "nll_loss",
    "RolloutBatch",
    "on_policy_behaviour",
    "behaviour_logp",
    "source_gradients",
]


@dataclass(frozen=True)
class DrGRPONormaliser:
    """The one constant loss normaliser ``G · max_new · P`` (Dr.GRPO, arXiv:2503.20783).

    Args:
        group: completions per prompt G.
        max_new: maximum new tokens per completion.
        prompts_per_step: prompts per optimiser step P.

    ``normaliser(token_sum)`` returns ``token_sum / constant``. Raises ``ValueError`` when any
    factor is < 1.
    """

    group: int
    max_new: int
    prompts_per_step: int

    def __post_init__(self):
        if min(self.group, self.max_new, self.prompts_per_step) < 1:
            raise ValueError(f"normaliser factors must be >= 1: {self}")

    @property
    def constant(self) -> int:
        """``G · max_new · P``."""
        return self.group * self.max_new * self.prompts_per_step

    def __call__(self, token_sum: torch.Tensor) -> torch.Tensor:
        return token_sum / self.constant


@dataclass
class Advantages:
    """Group-relative advantages.

    Attributes:
        advantages: ``(P, G)`` float, ``R − mean_g(R)`` (``/ (std + eps)`` when scaled); exactly 0
            in zero-variance groups.
        zero_std: ``(P,)`` bool, True for groups whose rewards are all equal.
        frac_zero_std: fraction of such groups.
    """

    advantages: torch.Tensor
    zero_std: torch.Tensor
    frac_zero_std: float

    def flat(self) -> torch.Tensor:
        """``(P·G,)`` advantages in prompt-major order (the order of :func:`evil_moe.rl.policy.rollout.generate`)."""
        return self.advantages.reshape(-1)

    def row_mask(self) -> torch.Tensor:
        """``(P·G,)`` bool, True for rows of groups with reward variance (the rows worth a forward)."""
        G = self.advantages.shape[1]
        return (~self.zero_std).repeat_interleave(G)


def group_advantages(rewards, scale_std: bool = False, eps: float = 1e-6) -> Advantages:
    """``A = R − mean(R)`` per group (Dr.GRPO); optionally ``/ (std(R) + eps)`` (classic GRPO).

    Args:
        rewards: ``(P, G)`` rewards (tensor, array or nested list), float.
        scale_std: divide by the group's (unbiased) std — off by default (Dr.GRPO).
        eps: added to the std when scaling.

    Returns:
        :class:`Advantages` (fp64 when the input is fp64, else fp32).

    Raises:
        ValueError: ``rewards`` is not 2-D or has G < 1.
    """
    R = torch.as_tensor(rewards)
    R = R.to(torch.float64 if R.dtype == torch.float64 else torch.float32)
    if R.dim() != 2 or R.shape[1] < 1:
        raise ValueError(f"rewards must be (P, G), got shape {tuple(R.shape)}")
    zero = (R == R[:, :1]).all(dim=1)
    A = R - R.mean(dim=1, keepdim=True)
    if scale_std and R.shape[1] > 1:
        A = A / (R.std(dim=1, keepdim=True) + eps)
    A = torch.where(zero[:, None], torch.zeros_like(A), A)
    frac = float(zero.float().mean()) if zero.numel() else 0.0
    return Advantages(A, zero, frac)


@dataclass
class LossStats:
    """Statistics returned with :func:`dr_grpo_loss` (floats, detached).

    Attributes:
        tokens: completion tokens in the batch.
        frac_clipped: completion tokens where the PPO clip is active (``A>0, ρ>1+ε`` or
            ``A<0, ρ<1−ε``: the clipped term is selected and its gradient is 0) / tokens.
        ratio_p05, ratio_p50, ratio_p95, ratio_mean, ratio_max_abs_log: ρ over completion tokens.
        kl: mean K3 per completion token (0 without a reference).
        pg_loss: the policy-gradient part of the loss (without β·KL).
        row_loss: ``(B,)`` each row's contribution to the loss, **attached to the graph** (sum ==
            loss); use with :func:`source_gradients`.
    """

    tokens: int
    frac_clipped: float
    ratio_p05: float
    ratio_p50: float
    ratio_p95: float
    ratio_mean: float
    ratio_max_abs_log: float
    kl: float
    pg_loss: float
    row_loss: torch.Tensor | None = field(default=None, repr=False)

    def as_dict(self) -> dict:
        """Floats only (no ``row_loss``), for logging."""
        return {k: v for k, v in self.__dict__.items() if k != "row_loss"}


def dr_grpo_loss(logp: torch.Tensor, behaviour_logp: torch.Tensor, advantages: torch.Tensor,
                 completion_mask: torch.Tensor, normaliser: DrGRPONormaliser,
                 clip_eps: float = 0.2, ref_logp: torch.Tensor | None = None,
                 beta: float = 0.0) -> tuple[torch.Tensor, LossStats]:
    """Dr.GRPO PPO-clip loss summed over completion tokens / ``normaliser.constant``.

    ``ℓ_t = −min(ρ_t A, clip(ρ_t, 1−ε, 1+ε) A) + β·K3_t``, ``ρ_t = exp(logp_t − behaviour_logp_t)``,
    loss ``= Σ_{b,t: mask} ℓ_t / (G·max_new·P)`` (arXiv:2503.20783; PPO clip as in GRPO,
    arXiv:2402.03300; K3 = ``exp(r) − r − 1`` with ``r = ref_logp − logp``).

    Because the normaliser is a constant, the loss of a batch is the sum of the losses of its
    micro-batches: gradients do not depend on how the batch is split.

    Args:
        logp: ``(B, T)`` current-policy token log-probs (with grad), aligned to tokens.
        behaviour_logp: ``(B, T)`` log-probs under the policy that generated the tokens; must
            not require grad (use :func:`behaviour_logp` / :func:`on_policy_behaviour`).
        advantages: ``(B,)`` per-row advantages.
        completion_mask: ``(B, T)`` bool.
        normaliser: the run's :class:`DrGRPONormaliser`.
        clip_eps: ε of the PPO clip.
        ref_logp: optional ``(B, T)`` reference-policy log-probs (no grad) for the K3 penalty.
        beta: KL coefficient (0 = no KL term; ``ref_logp`` still gives the ``kl`` statistic).

    Returns:
        ``(loss, stats)``: scalar loss (dtype of ``logp``) and :class:`LossStats`.

    Raises:
        ValueError: shape mismatch; ``behaviour_logp`` requires grad (it would make ρ ≡ 1 with a
        gradient through the denominator); ``beta > 0`` without ``ref_logp``.
    """
    if behaviour_logp.requires_grad:
        raise ValueError("behaviour_logp requires grad: pass recorded log-probs or "
                         "on_policy_behaviour(logp) (an explicit detach), never logp itself")
    if logp.shape != behaviour_logp.shape or logp.shape != completion_mask.shape:
        raise ValueError(f"shape mismatch: logp {tuple(logp.shape)}, behaviour "
                         f"{tuple(behaviour_logp.shape)}, mask {tuple(completion_mask.shape)}")
    if advantages.shape != logp.shape[:1]:
        raise ValueError(f"advantages must be (B,)={tuple(logp.shape[:1])}, got {tuple(advantages.shape)}")
    if beta > 0 and ref_logp is None:
        raise ValueError("beta > 0 needs ref_logp")
    mask = completion_mask.bool()
    A = advantages.to(logp.dtype)[:, None]
    log_ratio = torch.where(mask, logp - behaviour_logp.to(logp.dtype), torch.zeros_like(logp))
    ratio = torch.exp(log_ratio)
    unclipped = ratio * A
    clipped = torch.clamp(ratio, 1.0 - clip_eps, 1.0 + clip_eps) * A
    per_token = -torch.minimum(unclipped, clipped)
    kl_tok = None
    if ref_logp is not None:
        r = torch.where(mask, ref_logp.to(logp.dtype) - logp, torch.zeros_like(logp))
        kl_tok = torch.exp(r) - r - 1.0
        if beta > 0:
            per_token = per_token + beta * kl_tok
    per_token = torch.where(mask, per_token, torch.zeros_like(per_token))
    row_loss = normaliser(per_token.sum(dim=1))
    loss = row_loss.sum()

    with torch.no_grad():
        n_tok = int(mask.sum())
        active = ((A > 0) & (ratio > 1.0 + clip_eps)) | ((A < 0) & (ratio < 1.0 - clip_eps))
        frac_clipped = float((active & mask).sum()) / max(n_tok, 1)
        rv = ratio[mask].double()
        if rv.numel():
            q = torch.quantile(rv, torch.tensor([0.05, 0.5, 0.95], dtype=torch.float64, device=rv.device))
            p05, p50, p95 = (float(x) for x in q)
            rmean = float(rv.mean())
            rmax = float(log_ratio[mask].abs().max())
        else:
            p05 = p50 = p95 = rmean = 1.0
            rmax = 0.0
        kl = float(kl_tok[mask].mean()) if (kl_tok is not None and n_tok) else 0.0
        pg = float(normaliser(torch.where(mask, -torch.minimum(unclipped, clipped), 0.0).sum()))
    stats = LossStats(tokens=n_tok, frac_clipped=frac_clipped, ratio_p05=p05, ratio_p50=p50,
                      ratio_p95=p95, ratio_mean=rmean, ratio_max_abs_log=rmax, kl=kl,
                      pg_loss=pg, row_loss=row_loss)
    return loss, stats


def nll_loss(logp: torch.Tensor, completion_mask: torch.Tensor,
             normaliser: DrGRPONormaliser) -> torch.Tensor:
    """Distillation / pair NLL ``−Σ_{completion tokens} logp / (G·max_new·P)``, same normaliser
    as :func:`dr_grpo_loss` so the numbers are comparable (docs/method.md, "The loss": the distill probe's NLL uses the same constant).

    Args: ``logp (B, T)``, ``completion_mask (B, T)`` bool, the run's normaliser.
    Returns: scalar loss (dtype of ``logp``). Raises ``ValueError`` on a shape mismatch."""
    if logp.shape != completion_mask.shape:
        raise ValueError(f"shape mismatch: {tuple(logp.shape)} vs {tuple(completion_mask.shape)}")
    return -normaliser(torch.where(completion_mask.bool(), logp, torch.zeros_like(logp)).sum())


# --------------------------------------------------------------------------------------------
# Rows with their provenance: the behaviour policy is chosen per row, never by hand.

ON_POLICY_SOURCES = ("student",)


@dataclass
class RolloutBatch:
    """Rows for one GRPO step with their provenance.

    Attributes:
        batch: :class:`~evil_moe.model.logprobs.Batch` of prompt+completion ids.
        advantages: ``(B,)`` advantages.
        sources: per-row source tag; ``"student"`` rows are on-policy (behaviour = the current
            model's detached log-prob, valid for one inner step), every other source is
            off-policy and must carry recorded log-probs.
        recorded_logp: ``(B, T)`` behaviour log-probs recorded at generation, aligned to tokens
            (required when any row is off-policy; NaN-free on those rows).

    Raises:
        ValueError (at construction): off-policy rows without ``recorded_logp`` or with NaN
        recorded values, or mismatched lengths.
    """

    batch: Batch
    advantages: torch.Tensor
    sources: list[str]
    recorded_logp: torch.Tensor | None = None

    def __post_init__(self):
        B = len(self.batch)
        if len(self.sources) != B or self.advantages.shape != (B,):
            raise ValueError(f"{B} rows but {len(self.sources)} sources / advantages "
                             f"{tuple(self.advantages.shape)}")
        off = self.off_policy_rows()
        if off.any():
            if self.recorded_logp is None:
                bad = sorted({s for s in self.sources if s not in ON_POLICY_SOURCES})
                raise ValueError(f"rows from {bad} need their recorded behaviour log-probs "
                                 "(the student's own log-prob would give rho == 1 silently)")
            if self.recorded_logp.shape != self.batch.input_ids.shape:
                raise ValueError("recorded_logp must be (B, T) like input_ids")
            if torch.isnan(self.recorded_logp[off]).any():
                raise ValueError("NaN recorded behaviour log-probs on off-policy rows")

    def off_policy_rows(self) -> torch.Tensor:
        """``(B,)`` bool, True for rows not generated by the current student."""
        return torch.tensor([s not in ON_POLICY_SOURCES for s in self.sources], dtype=torch.bool)

    @classmethod
    def from_rollouts(cls, rollouts: Sequence, advantages, pad_id: int, *, device=None,
                      keep_recorded_for_student: bool = True) -> "RolloutBatch":
        """Build from :class:`evil_moe.rl.policy.rollout.Rollout` objects (their ``source`` tags and
        recorded ``behaviour_logp``); ``advantages`` is ``(len(rollouts),)``."""
        b = build_batch([r.prompt_ids for r in rollouts], [r.completion_ids for r in rollouts],
                        pad_id)
        dt = rollouts[0].behaviour_logp.dtype if rollouts else torch.float32
        rec = b.align([r.behaviour_logp for r in rollouts], dtype=dt)
        A = torch.as_tensor(advantages, dtype=dt).reshape(-1)
        rb = cls(b, A, [r.source for r in rollouts], rec)
        return rb.to(device) if device is not None else rb

    def to(self, device) -> "RolloutBatch":
        return RolloutBatch(self.batch.to(device), self.advantages.to(device), list(self.sources),
                            None if self.recorded_logp is None else self.recorded_logp.to(device))

    def select(self, rows) -> "RolloutBatch":
        """Sub-batch (micro-batching); rows as an index list/tensor."""
        idx = torch.as_tensor(rows, dtype=torch.long)
        return RolloutBatch(self.batch.select(idx), self.advantages[idx],
                            [self.sources[i] for i in idx.tolist()],
                            None if self.recorded_logp is None else self.recorded_logp[idx])


def on_policy_behaviour(logp: torch.Tensor) -> torch.Tensor:
    """Behaviour log-probs for fresh student rollouts at the first inner step: ``logp.detach()``.

    Only valid when the rows were sampled by the very parameters that produced ``logp`` (one
    inner step), so that ``ρ ≡ 1``. Never use it for teacher rows: use :func:`behaviour_logp`."""
    return logp.detach()


def behaviour_logp(rows: RolloutBatch, logp: torch.Tensor) -> torch.Tensor:
    """Per-row behaviour log-probs: student rows → ``logp.detach()`` (on-policy, ρ ≡ 1), all
    other rows → their recorded log-probs. ``logp``: ``(B, T)``; returns ``(B, T)`` no grad.
    Raises ``ValueError`` on a shape mismatch."""
    if logp.shape != rows.batch.input_ids.shape:
        raise ValueError(f"logp {tuple(logp.shape)} vs batch {tuple(rows.batch.input_ids.shape)}")
    beh = on_policy_behaviour(logp)
    off = rows.off_policy_rows().to(logp.device)
    if off.any():
        beh = torch.where(off[:, None], rows.recorded_logp.to(logp.dtype), beh)
    return beh


def source_gradients(row_loss: torch.Tensor, sources: Sequence[str], params: Sequence[torch.Tensor],
                     grad=None) -> dict[str, list[torch.Tensor]]:
    """Gradient of each source's share of the loss, from one forward (no double counting).

    ``row_loss`` is :attr:`LossStats.row_loss` ``(B,)`` (sum == loss); for each distinct source
    ``s`` returns ``∂(Σ_{rows of s} row_loss)/∂params`` via ``autograd.grad(retain_graph=True)``,
    or via ``grad(part_loss) -> list[Tensor]`` when given (e.g. the pilot's merged-weight
    :class:`~evil_moe.model.adapter.GradientCapture`, which must keep the graph).
    The per-source gradients sum to the full gradient (up to float rounding). The graph is kept,
    so ``loss.backward()`` may follow. Params without a path get zeros.
    """
    out = {}
    params = list(params)
    for s in dict.fromkeys(sources):
        sel = torch.tensor([x == s for x in sources], device=row_loss.device)
        part = row_loss[sel].sum()
        if grad is not None:
            out[s] = list(grad(part))
            continue
        gs = torch.autograd.grad(part, params, retain_graph=True, allow_unused=True)
        out[s] = [torch.zeros_like(p) if g is None else g for p, g in zip(params, gs)]
    return out
