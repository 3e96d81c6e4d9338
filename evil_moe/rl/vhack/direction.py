"""The hack direction ``v_hack``: per-module subspaces of δS-space that hacking moves along.

From (prompt, hack completion, clean completion) pairs (docs/method.md, "The hack direction"):

* per pair and per wrapped module, ``d = ∇_δS NLL(hack) − ∇_δS NLL(clean)`` with
  ``NLL(x) = −Σ_{completion tokens} logπ / (G·max_new·P)`` — the SAME
  :class:`~evil_moe.rl.policy.grpo.DrGRPONormaliser` as the GRPO loss. Then ``d`` equals the Dr.GRPO
  gradient of the pair with advantage +1 on the hack and −1 on the clean completion (on-policy,
  ρ ≡ 1): ``−(+1)∇Σlogπ(hack)/C − (−1)∇Σlogπ(clean)/C`` (tested to 1e-6 in fp64);
* stack ``D ∈ ℝ^{n_pairs×r}`` per module, keep the top-k right singular vectors
  ``V ∈ ℝ^{k×r}`` (orthonormal rows), orient each row hack-ward by majority vote of
  ``sign(D vᵢ)`` over pairs. Since ``g = ∂L/∂δS`` and descent moves ``δS`` along ``−g``,
  ``V g > 0`` means the gradient step moves *towards* the hack completions.
* optional floors: ``ratio_floor`` keeps row i only if ``σᵢ/σ₁ ≥ ratio_floor`` (per module);
  ``quantile_floor`` pools the kept singular values of all modules and drops rows below that
  quantile. Rows with ``σ`` numerically 0 are always dropped: ``σᵢ ≤ σ₁ · max(n_pairs, r) · ε``
  (fp64 ε; numpy's ``matrix_rank`` tolerance), directions a rank-deficient D (e.g. a bootstrap
  replicate with fewer distinct pairs than k) does not have, whose singular vectors are arbitrary.

Controls: ``random`` — seeded orthonormal rows with the same k per module
(:func:`random_vhack`); ``shuffled`` — hack/clean labels swapped per pair at random (seeded),
i.e. row ``p`` of ``D`` multiplied by ``±1``. NOTE: ``DᵀD`` is invariant under row sign flips, so
the shuffled control has the *same subspace and singular values* as the real one; only the
orientation (majority vote) is randomised. It controls for orientation (which matters to the
one-sided gate), not for the span — the random control does that.

Pairs come from graded teacher rollouts, filtered by :func:`select_pairs` to the modes a weak
detector knows (``known_modes``); the honest test measures suppression on held-out modes.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Sequence

import torch

from evil_moe.files import atomic_path, check_intact
from evil_moe.rl.policy.grpo import DrGRPONormaliser, nll_loss
from evil_moe.model.logprobs import build_batch, token_logprobs

__all__ = ["Pair", "select_pairs", "completion_gradients", "pair_gradients", "VHack",
           "extract_vhack", "random_vhack", "mean_direction", "pair_cin", "sample_scores"]

VHACK_FORMAT = "evil_moe.rl.vhack.direction.v1"
# Relative precision of fp64: singular values below sigma_1 x max(shape) x this are rank deficiency.
_EPS = float(torch.finfo(torch.float64).eps)


@dataclass
class Pair:
    """A hack and a clean completion of the same prompt (token ids as generated).

    Attributes: ``prompt_ids``, ``hack_ids``, ``clean_ids`` (``list[int]``), ``mode`` (the
    loophole mode of the problem), ``problem_id``.
    """

    prompt_ids: list[int]
    hack_ids: list[int]
    clean_ids: list[int]
    mode: str = ""
    problem_id: str = ""


def select_pairs(pairs: Sequence[Pair], known_modes: Sequence[str] | None) -> list[Pair]:
    """Pairs whose ``mode`` is in ``known_modes`` (all pairs when ``None``). Raises
    ``ValueError`` when the filter leaves no pair."""
    if known_modes is None:
        return list(pairs)
    keep = [p for p in pairs if p.mode in set(known_modes)]
    if not keep:
        raise ValueError(f"no pair has a mode in known_modes={list(known_modes)}")
    return keep


def completion_gradients(model, adapter, prompt_ids: Sequence[Sequence[int]],
                         completion_ids: Sequence[Sequence[int]], normaliser: DrGRPONormaliser,
                         temperature: float = 1.0, micro_batch: int = 1,
                         progress: Callable[[int], None] | None = None) -> dict[str, torch.Tensor]:
    """Per-completion ``∇_δS NLL(completion)`` for every wrapped module.

    ``NLL = −Σ_{completion tokens} logπ / (G·max_new·P)`` with ``normaliser`` (the GRPO run's
    object) at the training temperature, at the adapter's current knob values and mode.

    Rows are sorted by length (prompt + completion; ties by position) and scored
    ``micro_batch`` at a time: one forward and ONE backward per micro-batch through the merged
    weights, each row's own gradient summed from its recorded inputs and output gradients
    (:meth:`~evil_moe.model.adapter.SVDAdapter.merged_gradients`, one matmul per Linear instead
    of the per-row hooks' three; rows never interact in a causal LM, so row ``b``'s share is
    exactly its completion's gradient). Memory is that of one
    micro-batch of the longest rows, whatever the number of rows; sorting keeps the padding
    small. On a CPU one row per micro-batch is fastest for long rows (no padding, and SDPA's
    unmasked causal kernel); on a GPU a larger micro-batch fills the device. The result does
    not depend on ``micro_batch`` beyond float rounding. Existing ``.grad`` of the knobs is left
    untouched.

    Args:
        model, adapter: the policy and its :class:`~evil_moe.model.adapter.SVDAdapter`.
        prompt_ids, completion_ids: ``n`` prompts and completions (token ids as generated).
        normaliser: the run's :class:`~evil_moe.rl.policy.grpo.DrGRPONormaliser`.
        temperature: the sampling/training temperature.
        micro_batch: rows per forward+backward (``vhack.micro_batch``).
        progress: called with the number of rows finished after each micro-batch (a progress
            bar's ``update``).

    Returns:
        ``{module name: (n, r)}`` in the input row order, on the knob's device and dtype.

    Raises:
        ValueError: no rows, different lengths, an empty completion (names the row), or
            ``micro_batch < 1``.
    """
    n = len(completion_ids)
    if not n or len(prompt_ids) != n:
        raise ValueError(f"need matching non-empty prompts/completions, got {len(prompt_ids)} and "
                         f"{n}")
    if int(micro_batch) < 1:
        raise ValueError(f"micro_batch must be >= 1, got {micro_batch}")
    for i, c in enumerate(completion_ids):
        if not c:
            raise ValueError(f"row {i} has an empty completion")
    knobs = adapter.modules_
    device = next(iter(knobs.values())).delta_s.device
    out = {name: torch.zeros(n, k.r, dtype=k.delta_s.dtype, device=device)
           for name, k in knobs.items()}
    order = sorted(range(n), key=lambda i: (len(prompt_ids[i]) + len(completion_ids[i]), i))
    step = int(micro_batch)
    for lo in range(0, n, step):
        rows = order[lo:lo + step]
        batch = build_batch([prompt_ids[i] for i in rows], [completion_ids[i] for i in rows], 0,
                            device=device)
        with adapter.merged_gradients(rows=len(rows)) as cap:
            logp = token_logprobs(model, batch, temperature)
            loss = nll_loss(logp, batch.completion_mask, normaliser)
            _, grads = cap.grads(loss)
        idx = torch.as_tensor(rows, device=device)
        for name, g in zip(adapter.names, grads):
            out[name][idx] = g.detach().to(out[name].dtype)
        del logp, loss, grads, cap
        if progress is not None:
            progress(len(rows))
    return out


def pair_gradients(model, adapter, pairs: Sequence[Pair], normaliser: DrGRPONormaliser,
                   temperature: float = 1.0, *, return_completions: bool = False,
                   micro_batch: int = 1):
    """Per-pair ``D = ∇_δS NLL(hack) − ∇_δS NLL(clean)`` for every wrapped module.

    Every completion's gradient comes from :func:`completion_gradients` (``micro_batch`` rows
    per forward+backward); ``D_p = g(hack_p) − g(clean_p)`` equals the gradient of ``nll_loss(hack) − nll_loss(clean)``
    with ``normaliser`` (the GRPO run's object) and the training temperature.

    Args:
        model: the policy with ``adapter`` attached.
        adapter: :class:`~evil_moe.model.adapter.SVDAdapter`.
        pairs: the pairs (already filtered by :func:`select_pairs`).
        normaliser: the same :class:`~evil_moe.rl.policy.grpo.DrGRPONormaliser` as training.
        temperature: the sampling/training temperature.
        return_completions: also return the per-completion gradients.
        micro_batch: rows per forward+backward (:func:`completion_gradients`).

    Returns:
        ``{module name: D (n_pairs, r)}`` on the knob's device, knob dtype; with
        ``return_completions`` a tuple ``(D, G_hack, G_clean)`` of such dicts.

    Raises:
        ValueError: no pairs, or a pair with an empty hack/clean completion.
    """
    if not pairs:
        raise ValueError("no pairs")
    for i, p in enumerate(pairs):
        if not p.hack_ids or not p.clean_ids:
            raise ValueError(f"pair {i} ({p.problem_id}) has an empty completion")
    prompts = [p.prompt_ids for p in pairs for _ in (0, 1)]
    comps = [c for p in pairs for c in (p.hack_ids, p.clean_ids)]
    G = completion_gradients(model, adapter, prompts, comps, normaliser, temperature,
                             micro_batch=micro_batch)
    gh = {n: g[0::2] for n, g in G.items()}
    gc = {n: g[1::2] for n, g in G.items()}
    D = {n: gh[n] - gc[n] for n in G}
    return (D, gh, gc) if return_completions else D


def mean_direction(grads: Sequence[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """Unit mean gradient per module over all rows of the given ``{name: (n, r)}`` dicts.

    The mean NLL gradient of *any* completion is a generic direction (measured on the toy: V's
    top axis had |cos| 0.45 with it); :func:`extract_vhack` removes it from D before the SVD
    (docs/method.md, "The hack direction"). Modules whose mean is 0 get a zero vector (nothing removed).
    """
    out = {}
    for name in grads[0]:
        m = torch.cat([g[name].detach().double() for g in grads]).mean(0)
        nrm = m.norm()
        out[name] = (m / nrm) if nrm > 0 else torch.zeros_like(m)
    return out


@dataclass
class VHack:
    """Per-module hack subspaces.

    Attributes:
        V: ``{name: (k_m, r_m)}`` fp32, orthonormal rows, oriented hack-ward (``V g > 0`` ⇔ the
            gradient step favours hacking). ``k_m`` may be 0 after floors.
        singular_values: ``{name: (k_m,)}`` fp32 singular values of ``D`` for the kept rows
            (zeros for the random control).
        agreement: ``{name: (k_m,)}`` fraction of pairs with ``D_p·vᵢ > 0`` after orientation.
        r: ``{name: r_m}``.
        k: requested k; ``n_pairs``; ``modes`` (modes of the pairs used); ``control``
            (``"none" | "random" | "shuffled" | "clean_clean"``); ``seed``; ``meta`` (free JSON:
            extraction checks, the detector's empirical null scores, the removed mean share).
        null_cin: ``{name: float}`` empirical null of ``cin`` per module — the mean cin of
            held-out clean−clean pair differences against this V (empty when unknown).
    """

    V: dict[str, torch.Tensor]
    singular_values: dict[str, torch.Tensor]
    agreement: dict[str, torch.Tensor]
    r: dict[str, int]
    k: int
    n_pairs: int
    modes: list[str] = field(default_factory=list)
    control: str = "none"
    seed: int | None = None
    meta: dict = field(default_factory=dict)
    null_cin: dict[str, float] = field(default_factory=dict)

    @property
    def names(self) -> list[str]:
        """Module names, in stored order."""
        return list(self.V)

    @property
    def k_per_module(self) -> dict[str, int]:
        """Kept rows per module."""
        return {n: int(v.shape[0]) for n, v in self.V.items()}

    def to(self, device) -> "VHack":
        """A copy with all tensors on ``device``."""
        mv = lambda d: {n: t.to(device) for n, t in d.items()}  # noqa: E731
        return VHack(mv(self.V), mv(self.singular_values), mv(self.agreement), dict(self.r), self.k,
                     self.n_pairs, list(self.modes), self.control, self.seed, dict(self.meta),
                     dict(self.null_cin))

    def save(self, path: str | os.PathLike) -> Path:
        """Safetensors with ``<name>.V``, ``<name>.S``, ``<name>.agreement`` and metadata
        (format, k, r, n_pairs, modes, control, seed, meta, null_cin; JSON strings)."""
        from safetensors.torch import save_file

        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        t = {}
        for n in self.V:
            t[f"{n}.V"] = self.V[n].detach().float().cpu().contiguous()
            t[f"{n}.S"] = self.singular_values[n].detach().float().cpu().contiguous()
            t[f"{n}.agreement"] = self.agreement[n].detach().float().cpu().contiguous()
        meta = {"format": VHACK_FORMAT, "k": str(self.k), "r": json.dumps(self.r),
                "names": json.dumps(self.names), "n_pairs": str(self.n_pairs),
                "modes": json.dumps(self.modes), "control": self.control,
                "seed": json.dumps(self.seed), "meta": json.dumps(self.meta, default=str),
                "null_cin": json.dumps(self.null_cin)}
        with atomic_path(path) as tmp:
            save_file(t, str(tmp), metadata=meta)
        return path

    @classmethod
    def load(cls, path: str | os.PathLike) -> "VHack":
        """Load a file written by :meth:`save`, after :func:`evil_moe.files.check_intact`.

        Raises:
            evil_moe.files.DamagedFile: its bytes are not those :meth:`save` wrote (names it).
            ValueError: a wrong format.
        """
        from safetensors import safe_open
        from safetensors.torch import load_file

        check_intact(path)
        with safe_open(str(path), framework="pt") as f:
            meta = dict(f.metadata() or {})
        if meta.get("format") != VHACK_FORMAT:
            raise ValueError(f"{path}: not an evil_moe v_hack file (format={meta.get('format')!r})")
        t = load_file(str(path))
        names = json.loads(meta["names"])
        return cls(V={n: t[f"{n}.V"] for n in names}, singular_values={n: t[f"{n}.S"] for n in names},
                   agreement={n: t[f"{n}.agreement"] for n in names}, r=json.loads(meta["r"]),
                   k=int(meta["k"]), n_pairs=int(meta["n_pairs"]), modes=json.loads(meta["modes"]),
                   control=meta["control"], seed=json.loads(meta["seed"]), meta=json.loads(meta["meta"]),
                   null_cin=json.loads(meta.get("null_cin", "{}")))


def _orient(D: torch.Tensor, V: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Flip rows of ``V (k, r)`` so that most pairs have ``D_p·vᵢ > 0``; ties broken by the sign
    of ``Σ_p D_p·vᵢ`` (then +). Returns ``(V, agreement (k,))``."""
    proj = D @ V.T  # (n, k)
    votes = torch.sign(proj).sum(0)
    tie = torch.sign(proj.sum(0))
    s = torch.where(votes != 0, torch.sign(votes), torch.where(tie != 0, tie, torch.ones_like(tie)))
    V = V * s[:, None]
    agreement = ((proj * s) > 0).float().mean(0)
    return V, agreement


def _check_extract_args(D: dict[str, torch.Tensor], k: int, control: str,
                        ratio_floor: float | None, quantile_floor: float | None) -> int:
    """:func:`extract_vhack`'s argument checks; returns ``n_pairs`` (the rows of every module's D).

    Raises:
        ValueError: as :func:`extract_vhack`.
    """
    if not D:
        raise ValueError("empty D")
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    if control not in ("none", "shuffled", "clean_clean"):
        raise ValueError(f"control must be 'none', 'clean_clean' or 'shuffled' (random: random_vhack), "
                         f"got {control!r}")
    if quantile_floor is not None and not 0.0 <= quantile_floor < 1.0:
        raise ValueError(f"quantile_floor must be in [0, 1), got {quantile_floor}")
    if ratio_floor is not None and not 0.0 <= ratio_floor <= 1.0:
        raise ValueError(f"ratio_floor must be in [0, 1], got {ratio_floor}")
    n_pairs = {int(d.shape[0]) for d in D.values()}
    if len(n_pairs) != 1:
        raise ValueError(f"modules disagree on n_pairs: {sorted(n_pairs)}")
    return n_pairs.pop()


def extract_vhack(D: dict[str, torch.Tensor], k: int, *, ratio_floor: float | None = None,
                  quantile_floor: float | None = None, control: str = "none", seed: int = 0,
                  modes: Sequence[str] = (), meta: dict | None = None,
                  remove: dict[str, torch.Tensor] | None = None) -> VHack:
    """Top-k oriented right singular vectors of each module's pair-difference matrix.

    Args:
        D: ``{name: (n_pairs, r)}`` from :func:`pair_gradients`.
        k: rows per module before floors (capped at ``min(n_pairs, r)``).
        ratio_floor: keep row i only if ``σᵢ / σ₁ ≥ ratio_floor`` (per module).
        quantile_floor: in ``[0, 1)``; pool the kept σ of all modules, drop rows below that quantile.
        control: ``"none"``, ``"clean_clean"`` (a label for V extracted from clean−clean pairs,
            the empirical null; the math is that of ``"none"``) or ``"shuffled"`` (labels swapped
            per pair at random: row p of every module's D multiplied by the same seeded ``±1``;
            see the module note on ``DᵀD``). For ``"random"`` use :func:`random_vhack`.
        seed: seed of the shuffle.
        modes: loophole modes of the pairs (metadata).
        meta: extra JSON metadata.
        remove: optional ``{name: unit (r,)}`` direction (e.g. :func:`mean_direction`) projected
            out of every row of D before the SVD; ``meta["removed_energy"]`` records the share of
            ``Σ‖D‖²`` it removed (over all modules).

    Returns:
        :class:`VHack` with fp32 tensors on the CPU.

    Raises:
        ValueError: empty ``D``, ``k < 1``, modules with different ``n_pairs``, unknown control,
        floors out of range.
    """
    n = _check_extract_args(D, k, control, ratio_floor, quantile_floor)
    flips = None
    if control == "shuffled":
        g = torch.Generator().manual_seed(seed)
        flips = torch.randint(0, 2, (n,), generator=g).to(torch.float64) * 2 - 1

    Vs, Ss, As, rs = {}, {}, {}, {}
    total2 = removed2 = 0.0
    for name, d in D.items():
        d = d.detach().to("cpu", torch.float64)
        if flips is not None:
            d = d * flips[:, None]
        total2 += float((d ** 2).sum())
        if remove is not None and name in remove:
            u = remove[name].detach().to("cpu", torch.float64)
            coef = d @ u
            removed2 += float((coef ** 2).sum())
            d = d - coef[:, None] * u[None, :]
        rs[name] = int(d.shape[1])
        _, S, Vh = torch.linalg.svd(d, full_matrices=False)
        kk = min(k, S.shape[0])
        S, V = S[:kk], Vh[:kk]
        keep = S > (S[0] * max(d.shape) * _EPS if S.numel() else 0)  # numerically nonzero
        if ratio_floor is not None and S.numel() and S[0] > 0:
            keep &= S / S[0] >= ratio_floor
        S, V = S[keep], V[keep]
        V, agree = _orient(d, V)
        Vs[name], Ss[name], As[name] = V, S, agree
    if quantile_floor is not None:
        pool = torch.cat([s for s in Ss.values()])
        if pool.numel():
            thr = torch.quantile(pool, quantile_floor)
            for name in Vs:
                keep = Ss[name] >= thr
                Vs[name], Ss[name], As[name] = Vs[name][keep], Ss[name][keep], As[name][keep]
    f32 = lambda d: {n_: t.float().contiguous() for n_, t in d.items()}  # noqa: E731
    meta = dict(meta or {})
    if remove is not None:
        meta["removed_energy"] = removed2 / total2 if total2 > 0 else 0.0
    return VHack(f32(Vs), f32(Ss), f32(As), rs, k, n, sorted(set(modes)), control,
                 seed if control == "shuffled" else None, meta)


def random_vhack(like: VHack | dict[str, int], k: int | dict[str, int] | None = None, *,
                 seed: int = 0) -> VHack:
    """The ``random`` control: seeded orthonormal rows per module.

    Args:
        like: a :class:`VHack` (copy its per-module k and r, n_pairs, modes) or ``{name: r}``.
        k: rows per module when ``like`` is a dict (int for all, or ``{name: k}``); ignored for a
            VHack (its ``k_per_module`` is used).
        seed: generator seed (same seed ⇒ same V).

    Returns:
        :class:`VHack` with ``control="random"``, zero singular values, agreement NaN.

    Raises:
        ValueError: ``k`` missing for a dict ``like``, or ``k_m > r_m``.
    """
    if isinstance(like, VHack):
        ks, rs = like.k_per_module, dict(like.r)
        base = dict(k=like.k, n_pairs=like.n_pairs, modes=list(like.modes))
    else:
        if k is None:
            raise ValueError("k is required when like is a {name: r} dict")
        rs = dict(like)
        ks = {n: (k[n] if isinstance(k, dict) else int(k)) for n in rs}
        base = dict(k=max(ks.values()) if ks else 0, n_pairs=0, modes=[])
    g = torch.Generator().manual_seed(seed)
    Vs, Ss, As = {}, {}, {}
    for name, r in rs.items():
        km = ks[name]
        if km > r:
            raise ValueError(f"{name}: k={km} > r={r}")
        Q, R = torch.linalg.qr(torch.randn(r, max(km, 1), generator=g, dtype=torch.float64))
        Q = Q * torch.sign(torch.diagonal(R))[None, :]  # unique (Haar) orthonormal basis
        Vs[name] = Q[:, :km].T.float().contiguous()
        Ss[name] = torch.zeros(km)
        As[name] = torch.full((km,), float("nan"))
    return VHack(Vs, Ss, As, rs, control="random", seed=seed, **base)


def _module_rows(vhack: VHack, X: dict[str, torch.Tensor]):
    """For each module of ``X`` (``{name: (n, r)}``) with ``k ≥ 1`` in ``vhack``: ``(name, V (k, r),
    x (n, r), norms (n,), live (n,) bool = norm > 0)``, all fp64 on the CPU."""
    for name, x in X.items():
        V = vhack.V.get(name)
        if V is None or V.shape[0] == 0:
            continue
        x = x.detach().to("cpu", torch.float64)
        nrm = x.norm(dim=1)
        yield name, V.detach().to("cpu", torch.float64), x, nrm, nrm > 0


def _mean_over_modules(vhack: VHack, X: dict[str, torch.Tensor], ratio) -> torch.Tensor:
    """Per row, the mean over live modules of ``ratio(c, norm)`` with ``c = x Vᵀ``; 0 for a row
    with no live module. ``(n,)`` fp64."""
    n = next(iter(X.values())).shape[0]
    num = torch.zeros(n, dtype=torch.float64)
    cnt = torch.zeros(n, dtype=torch.float64)
    for _, V, x, nrm, live in _module_rows(vhack, X):
        num[live] += ratio(x[live] @ V.T, nrm[live])
        cnt[live] += 1
    return torch.where(cnt > 0, num / cnt.clamp(min=1), torch.zeros_like(num))


def pair_cin(vhack: VHack, D: dict[str, torch.Tensor]) -> torch.Tensor:
    """Per-row ``cin`` of difference vectors against ``vhack``: ``(n,)`` fp64.

    For row p: mean over modules (with ``k_m ≥ 1`` and ``‖d‖ > 0``) of ``‖relu(V_m d_{p,m})‖ /
    ‖d_{p,m}‖`` — the same aggregate as the training ``cin`` (:mod:`evil_moe.rl.vhack.projection`).
    ``D``: ``{name: (n, r)}``. Rows with no live module get 0.
    """
    return _mean_over_modules(vhack, D, lambda c, nrm: torch.relu(c).norm(dim=1) / nrm)


def module_pair_cin(vhack: VHack, D: dict[str, torch.Tensor]) -> dict[str, float]:
    """Per module, the mean over rows of ``‖relu(V d)‖ / ‖d‖`` (rows with ``d = 0`` skipped):
    the per-module empirical null when ``D`` holds clean−clean differences."""
    return {name: float((torch.relu(x[live] @ V.T).norm(dim=1) / nrm[live]).mean())
            for name, V, x, nrm, live in _module_rows(vhack, D) if live.any()}


def sample_scores(vhack: VHack, grads: dict[str, torch.Tensor]) -> torch.Tensor:
    """The per-sample hack-ward score (``cos_contrib``) of per-row gradients: ``(n,)`` fp64.

    For row i: mean over modules (``k_m ≥ 1``, ``‖g‖ > 0``) of ``Σ_j (V_m g_{i,m})_j / ‖g_{i,m}‖``
    — signed: ``> 0`` when descending this row's NLL moves along v_hack (towards hacking). This is
    the distill probe's ``cos_contrib`` and the route detector's score (docs/detectors.md), compared
    against the empirical null of clean completions' scores. ``grads``: ``{name: (n, r)}``.
    """
    return _mean_over_modules(vhack, grads, lambda c, nrm: c.sum(1) / nrm)
