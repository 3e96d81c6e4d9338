"""The hack direction ``v_hack``: per-module subspaces of δS-space that hacking moves along.

From (prompt, hack completion, clean completion) pairs (docs/method.md, "The hack direction"):

* per pair and per wrapped module, ``d = ∇_δS NLL(hack) − ∇_δS NLL(clean)`` with
  ``NLL(x) = −Σ_{completion tokens} logπ / (G·max_new·P)`` — the SAME
  :class:`~evil_moe.rl.grpo.DrGRPONormaliser` as the GRPO loss. Then ``d`` equals the Dr.GRPO
  gradient of the pair with advantage +1 on the hack and −1 on the clean completion (on-policy,
  ρ ≡ 1): ``−(+1)∇Σlogπ(hack)/C − (−1)∇Σlogπ(clean)/C`` (tested to 1e-6 in fp64);
* stack ``D ∈ ℝ^{n_pairs×r}`` per module, keep the top-k right singular vectors
  ``V ∈ ℝ^{k×r}`` (orthonormal rows), orient each row hack-ward by majority vote of
  ``sign(D vᵢ)`` over pairs. Since ``g = ∂L/∂δS`` and descent moves ``δS`` along ``−g``,
  ``V g > 0`` means the gradient step moves *towards* the hack completions.
* optional floors: ``ratio_floor`` keeps row i only if ``σᵢ/σ₁ ≥ ratio_floor`` (per module);
  ``quantile_floor`` pools the kept singular values of all modules and drops rows below that
  quantile. Rows with ``σ = 0`` are always dropped.

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
from typing import Sequence

import torch

from evil_moe.rl.grpo import DrGRPONormaliser, nll_loss
from evil_moe.model.logprobs import build_batch, token_logprobs

__all__ = ["Pair", "select_pairs", "completion_gradients", "pair_gradients", "VHack",
           "extract_vhack", "random_vhack", "mean_direction", "pair_cin", "sample_scores",
           "planted_direction", "planted_vhack", "span_cos_null", "plant_recovery", "planted_shift"]

VHACK_FORMAT = "evil_moe.rl.vhack.v1"


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
                         temperature: float = 1.0, rows_per_forward: int = 2) -> dict[str, torch.Tensor]:
    """Per-completion ``∇_δS NLL(completion)`` for every wrapped module.

    ``NLL = −Σ_{completion tokens} logπ / (G·max_new·P)`` with ``normaliser`` (the GRPO run's
    object) at the training temperature, at the adapter's current knob values and mode. Rows are
    scored ``rows_per_forward`` at a time (one forward), one ``autograd.grad`` per row; existing
    ``.grad`` of the knobs is left untouched.

    Args:
        model, adapter: the policy and its :class:`~evil_moe.model.adapter.SVDAdapter`.
        prompt_ids, completion_ids: ``n`` prompts and completions (token ids as generated).
        normaliser: the run's :class:`~evil_moe.rl.grpo.DrGRPONormaliser`.
        temperature: the sampling/training temperature.
        rows_per_forward: rows per forward pass (memory vs speed; the result does not depend on it).

    Returns:
        ``{module name: (n, r)}`` on the knob's device and dtype.

    Raises:
        ValueError: no rows, different lengths, or an empty completion (names the row).
    """
    if not completion_ids or len(prompt_ids) != len(completion_ids):
        raise ValueError(f"need matching non-empty prompts/completions, got {len(prompt_ids)} and "
                         f"{len(completion_ids)}")
    names = adapter.names
    params = adapter.delta_s_params()
    device = params[0].device
    rows: dict[str, list[torch.Tensor]] = {n: [] for n in names}
    step = max(1, int(rows_per_forward))
    for lo in range(0, len(completion_ids), step):
        hi = min(lo + step, len(completion_ids))
        for i in range(lo, hi):
            if not completion_ids[i]:
                raise ValueError(f"row {i} has an empty completion")
        batch = build_batch(prompt_ids[lo:hi], completion_ids[lo:hi], 0, device=device)
        logp = token_logprobs(model, batch, temperature)
        mask = batch.completion_mask
        for j in range(hi - lo):
            loss = nll_loss(logp[j:j + 1], mask[j:j + 1], normaliser)
            grads = torch.autograd.grad(loss, params, allow_unused=True, retain_graph=j + 1 < hi - lo)
            for n, prm, g in zip(names, params, grads):
                rows[n].append(torch.zeros_like(prm) if g is None else g.detach())
    return {n: torch.stack(v) for n, v in rows.items()}


def pair_gradients(model, adapter, pairs: Sequence[Pair], normaliser: DrGRPONormaliser,
                   temperature: float = 1.0, *, return_completions: bool = False):
    """Per-pair ``D = ∇_δS NLL(hack) − ∇_δS NLL(clean)`` for every wrapped module.

    Per pair, the two completions are scored in one forward (:func:`completion_gradients`);
    ``D_p = g(hack_p) − g(clean_p)`` equals the gradient of ``nll_loss(hack) − nll_loss(clean)``
    with ``normaliser`` (the GRPO run's object) and the training temperature.

    Args:
        model: the policy with ``adapter`` attached.
        adapter: :class:`~evil_moe.model.adapter.SVDAdapter`.
        pairs: the pairs (already filtered by :func:`select_pairs`).
        normaliser: the same :class:`~evil_moe.rl.grpo.DrGRPONormaliser` as training.
        temperature: the sampling/training temperature.
        return_completions: also return the per-completion gradients.

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
    G = completion_gradients(model, adapter, prompts, comps, normaliser, temperature)
    gh = {n: g[0::2] for n, g in G.items()}
    gc = {n: g[1::2] for n, g in G.items()}
    D = {n: gh[n] - gc[n] for n in G}
    return (D, gh, gc) if return_completions else D


def mean_direction(grads: Sequence[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """Unit mean gradient per module over all rows of the given ``{name: (n, r)}`` dicts.

    The mean NLL gradient of *any* completion is a generic direction (measured on the toy: V's
    top axis had |cos| 0.45 with it); :func:`extract_vhack` removes it from D before the SVD
    (science.md §4). Modules whose mean is 0 get a zero vector (nothing removed).
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
        save_file(t, str(path), metadata=meta)
        return path

    @classmethod
    def load(cls, path: str | os.PathLike) -> "VHack":
        """Load a file written by :meth:`save`. Raises ``ValueError`` on a wrong format."""
        from safetensors import safe_open
        from safetensors.torch import load_file

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
        keep = S > 0
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
        yield name, V.to(torch.float64), x, nrm, nrm > 0


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
    ‖d_{p,m}‖`` — the same aggregate as the training ``cin`` (:mod:`evil_moe.rl.projection`).
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
    the distill probe's ``cos_contrib`` and the route detector's score (science.md §4), compared
    against the empirical null of clean completions' scores. ``grads``: ``{name: (n, r)}``.
    """
    return _mean_over_modules(vhack, grads, lambda c, nrm: c.sum(1) / nrm)


# ---------------------------------------------------------------------------------------------
# the planted world (toy.plant; docs/planted.md): a known hack direction to score extraction


def planted_direction(seed: int, name: str, r: int) -> torch.Tensor:
    """The planted hack switch's unit direction ``u ∈ ℝ^r`` of module ``name`` (fp32).

    Gaussian, normalised (uniform on the sphere), drawn from a generator seeded by
    SHA-256 of ``"{seed}:{name}"`` — so it depends on the plant's seed and the module only, and
    the toy stage and any later stage compute the same ``u`` without sharing state.

    Raises:
        ValueError: ``r < 1``.
    """
    import hashlib

    if r < 1:
        raise ValueError(f"planted_direction: r must be >= 1 (module {name!r}, r={r})")
    key = int(hashlib.sha256(f"{seed}:{name}".encode()).hexdigest()[:15], 16)
    u = torch.randn(r, generator=torch.Generator().manual_seed(key), dtype=torch.float64)
    return (u / u.norm()).float()


def planted_vhack(plant: VHack, r: dict[str, int]) -> VHack:
    """The plant as a v_hack over an adapter's modules ``r`` (``{name: r}``, in order): the
    plant's row (``−u``, hack-ward oriented; k = 1) in each switch module, k = 0 (an empty ``(0, r)`` V, which every projection skips) in
    every other module.

    Raises:
        ValueError: a switch module is not among ``r`` or has another rank there (the pilot's
            adapter would not see the planted coordinates; names the module and the key
            ``adapter.target_modules``).
    """
    for name, u in plant.V.items():
        if name not in r:
            raise ValueError(f"planted module {name!r} is not wrapped by the adapter: add it to "
                             "adapter.target_modules (toy.plant.modules must be wrapped)")
        if r[name] != u.shape[1]:
            raise ValueError(f"planted module {name!r}: r={u.shape[1]} in the plant, {r[name]} "
                             "in the adapter")
    V = {n: plant.V[n].float() if n in plant.V else torch.zeros(0, rn) for n, rn in r.items()}
    S = {n: plant.singular_values[n] if n in plant.V else torch.zeros(0) for n in r}
    A = {n: plant.agreement[n] if n in plant.V else torch.zeros(0) for n in r}
    return VHack(V, S, A, dict(r), k=1, n_pairs=0, control="planted", seed=plant.seed,
                 meta=dict(plant.meta))


def span_cos_null(k: int, r: int, q: float | Sequence[float]) -> float | list[float]:
    """Quantile(s) ``q`` of ``‖V u‖`` for ``V`` ``k`` random orthonormal rows in ℝ^r and a fixed
    unit ``u`` (the cosine of ``u`` with ``span V``): ``‖V u‖² ~ Beta(k/2, (r−k)/2)`` (the squared
    length of a k-dimensional coordinate projection of a uniform unit vector). For k = 1 it is
    the null of one row's ``|cos|`` (mean ≈ sqrt(2/(π r))).

    Raises:
        ValueError: not ``1 ≤ k < r``.
    """
    from scipy.stats import beta

    if not 1 <= k < r:
        raise ValueError(f"span_cos_null needs 1 <= k < r (k={k}, r={r})")
    qs = [q] if isinstance(q, (int, float)) else list(q)
    out = [float(beta.ppf(x, k / 2, (r - k) / 2)) ** 0.5 for x in qs]
    return out[0] if isinstance(q, (int, float)) else out


def plant_recovery(v: VHack, plant: VHack, *, null_q: float = 0.95) -> list[dict]:
    """How much of the planted direction an extracted ``v`` recovers, per switch module.

    Per module with a planted row ``p = plant.V[name][0]`` (a unit vector; ``p = −u`` in the
    v_hack orientation, :class:`evil_moe.stages.toy.PlantSwitch`) and ``k ≥ 1`` rows in ``v``,
    writing ``u`` for ``p`` below (every score but ``oriented_cos`` ignores the sign):
    ``cos_top = |v_1 · u|`` (V's first, largest-σ row), ``cos_best = max_i |v_i · u|``,
    ``span_cos = ‖V u‖`` (the cosine of u with span V), against the null of a random k-row V
    (:func:`span_cos_null`): ``null_mean`` (its mean, ``B(k/2 + 1/2, (r−k)/2) / B(k/2, (r−k)/2)``),
    ``null_q`` (quantile ``null_q``), ``p_value = P_null(‖V u‖ ≥ observed)``, ``above_null``
    (``span_cos > null_q``). Also ``oriented_cos = v_1 · p`` (signed: > 0 when V's hack-ward
    orientation agrees with the plant's).

    Returns:
        one dict per switch module (:data:`evil_moe.tables.PLANT_RECOVERY` columns except
        ``v_hack``), in ``plant`` order; a module missing from ``v`` or with ``k = 0`` gets
        ``k = 0`` and NaN scores (nothing recovered, never above the null).
    """
    import math

    from scipy.stats import beta

    rows = []
    for name, U in plant.V.items():
        u = U[0].to(torch.float64)
        r = int(u.numel())
        V = v.V.get(name)
        k = 0 if V is None else int(V.shape[0])
        row = {"module": name, "r": r, "k": k}
        if k == 0 or k >= r:
            rows.append({**row, "cos_top": float("nan"), "oriented_cos": float("nan"),
                         "cos_best": float("nan"), "span_cos": float("nan"), "null_mean": float("nan"),
                         "null_q": float("nan"), "p_value": float("nan"), "above_null": False})
            continue
        c = V.to(torch.float64) @ u
        span = float(c.norm())
        a, b = k / 2, (r - k) / 2
        # E[sqrt(X)], X ~ Beta(a, b): B(a + 1/2, b) / B(a, b)
        mean = math.exp(math.lgamma(a + 0.5) + math.lgamma(a + b) - math.lgamma(a) - math.lgamma(a + b + 0.5))
        thr = span_cos_null(k, r, null_q)
        rows.append({**row, "cos_top": float(c[0].abs()), "oriented_cos": float(c[0]),
                     "cos_best": float(c.abs().max()), "span_cos": span, "null_mean": mean,
                     "null_q": thr, "p_value": float(beta.sf(span ** 2, a, b)),
                     "above_null": bool(span > thr)})
    return rows


def planted_shift(model, adapter, plant: VHack, pairs: Sequence[Pair], *, knob: str = "delta_s",
                  view: str = "trained", temperature: float = 1.0) -> float:
    """How much the planted switch moves hack against clean completions, in the adapter's δS
    coordinates: the mean over ``pairs`` of ``[log π(hack) − log π(clean)]`` (summed over
    completion tokens, nats) with ``knob = scale · u`` in every switch module minus the same at
    ``knob = 0`` (``u = −plant.V[name][0]``, ``scale = plant.meta["plant"]["scale"]``).

    ``knob``: ``delta_s`` or ``delta_s_hack`` (the quarantine); ``view``: ``trained`` (δS +
    δS_hack, the training forward) or ``ablated`` (δS_hack ignored, the deploy view). The plant
    works in these coordinates when the shift is large and positive with ``delta_s``/``trained``;
    with ``delta_s_hack``/``ablated`` it must be exactly 0 (the deploy view removes the
    quarantine). The adapter's knobs are restored afterwards.

    Raises:
        ValueError: an unknown knob or view; a switch module the adapter does not wrap.
    """
    if knob not in ("delta_s", "delta_s_hack") or view not in ("trained", "ablated"):
        raise ValueError(f"planted_shift: knob must be delta_s|delta_s_hack and view trained|ablated "
                         f"(got {knob!r}, {view!r})")
    missing = [n for n in plant.V if plant.V[n].shape[0] and n not in adapter.names]
    if missing:
        raise ValueError(f"planted_shift: switch module {missing[0]!r} is not wrapped by the adapter")
    scale = float(plant.meta.get("plant", {}).get("scale", 1.0))
    mods = adapter.modules_
    saved = {n: (k.delta_s.detach().clone(), k.delta_s_hack.detach().clone()) for n, k in mods.items()}
    pid = [list(p.prompt_ids) for p in pairs]
    batch_h = build_batch(pid, [list(p.hack_ids) for p in pairs], _pad_id(model))
    batch_c = build_batch(pid, [list(p.clean_ids) for p in pairs], _pad_id(model))

    def margin() -> torch.Tensor:
        ctx = adapter.ablated() if view == "ablated" else _null_ctx()
        with torch.no_grad(), ctx:
            lh = token_logprobs(model, batch_h, temperature).sum(1)
            lc = token_logprobs(model, batch_c, temperature).sum(1)
        return (lh - lc).double()

    try:
        with torch.no_grad():
            for k in mods.values():
                k.delta_s.zero_()
                k.delta_s_hack.zero_()
        base = margin()
        with torch.no_grad():
            for n, V in plant.V.items():
                if V.shape[0]:
                    getattr(mods[n], knob).copy_(-scale * V[0].to(mods[n].delta_s))
        on = margin()
    finally:
        with torch.no_grad():
            for n, k in mods.items():
                k.delta_s.copy_(saved[n][0])
                k.delta_s_hack.copy_(saved[n][1])
    return float((on - base).mean())


def _pad_id(model) -> int:
    pad = getattr(model.config, "pad_token_id", None)
    return int(pad if pad is not None else 0)


def _null_ctx():
    import contextlib

    return contextlib.nullcontext()
