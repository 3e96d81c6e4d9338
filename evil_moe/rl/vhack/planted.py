"""The planted world (``toy.plant``; docs/planted.md): a toy student whose hacking is switched by
a KNOWN direction ``u`` in δS space, so extraction can be scored against the truth.

- :class:`PlantSwitch` trains the switch into the student (the toy stage's batcher: per NLL batch
  a switch position ``τ``, ``δS = τ · scale · u`` in the switch modules, hack rows with
  probability ``h + (1 − h) τ``) and writes the plant as a k = 1 :class:`~evil_moe.rl.vhack.direction.VHack`;
- :func:`planted_direction` draws ``u`` per module; :func:`planted_vhack` places the plant in the
  pilot adapter's coordinates;
- :func:`plant_recovery` scores an extracted V against the plant beside the random-subspace null
  (:func:`span_cos_null`); :func:`planted_shift` measures what moving δS along a direction does
  to the pairs' log-likelihoods.

The stage that writes the planted v_hack and the planted checks is :mod:`evil_moe.stages.planted`.
"""

from __future__ import annotations

from typing import Sequence

import torch

from evil_moe.model.logprobs import build_batch, token_logprobs
from evil_moe.rl.vhack.direction import Pair, VHack

PLANT_FILE = "plant.safetensors"  # in the student's folder when toy.plant.enabled


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
    v_hack orientation, :class:`evil_moe.rl.vhack.planted.PlantSwitch`) and ``k ≥ 1`` rows in ``v``,
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


class PlantSwitch:
    """The planted hack switch during the student's NLL training (module docstring).

    Attaches an :class:`~evil_moe.model.adapter.SVDAdapter` to the switch modules only (its knobs
    are never trained; the switch weights are frozen so their SVD stays that of the
    initialisation), and is the ``batcher`` of :func:`_train`: per step it draws ``τ``, sets
    ``δS = τ · scale · u`` in every switch module, and draws each row from the hack pool with
    probability ``h + (1 − h) τ``, else from the clean pool.

    Args:
        model: the freshly built student.
        plant: the ``toy.plant`` dict (``modules, scale, frac, seed``).
        n_hack: rows ``0 .. n_hack−1`` of the training sequences are hacks, the rest clean.
        n_total: number of training sequences.
        h: the hack probability at ``τ = 0`` (``toy.student_hack_frac``).
        batch_size: rows per step.

    Raises:
        ValueError: a ``toy.plant.modules`` entry is not exactly one Linear of the model (names it).
    """

    def __init__(self, model, plant: dict, *, n_hack: int, n_total: int, h: float, batch_size: int):
        from evil_moe.model.adapter import SVDAdapter
        names = dict(model.named_modules())
        for m in plant["modules"]:
            if not isinstance(names.get(m), torch.nn.Linear):
                raise ValueError(f"toy.plant.modules: {m!r} is not a Linear of the toy model "
                                 f"(e.g. model.layers.1.mlp.down_proj)")
        self.adapter = SVDAdapter.attach(model, list(plant["modules"]), freeze_base=False)
        if sorted(self.adapter.names) != sorted(plant["modules"]):
            raise ValueError(f"toy.plant.modules {plant['modules']} matched {self.adapter.names}: "
                             "give full module names")
        self.u = {}
        for name, knob in self.adapter.modules_.items():
            model.get_submodule(name).weight.requires_grad_(False)
            knob.delta_s.requires_grad_(False)
            knob.delta_s_hack.requires_grad_(False)
            self.u[name] = planted_direction(plant["seed"], name, knob.r)
        self.scale, self.frac = float(plant["scale"]), float(plant["frac"])
        self.noise = float(plant.get("noise", 0.0))
        self.n_hack, self.n_total, self.h, self.batch_size = n_hack, n_total, float(h), batch_size

    def set(self, tau: float) -> None:
        """``δS = tau · scale · u`` in every switch module (``tau = 0``: the ordinary student)."""
        with torch.no_grad():
            for name, knob in self.adapter.modules_.items():
                knob.delta_s.copy_(tau * self.scale * self.u[name])

    def __call__(self, g: torch.Generator) -> list[int]:
        on = float(torch.rand((), generator=g)) < self.frac
        tau = float(torch.rand((), generator=g)) if on else 0.0
        self.set(tau)
        if self.noise > 0:  # a δS component orthogonal to u that must not change hacking
            with torch.no_grad():
                for name, knob in self.adapter.modules_.items():
                    u = self.u[name]
                    n = torch.randn(knob.r, generator=g)
                    n = n - (n @ u) * u
                    size = self.noise * float(torch.rand((), generator=g))
                    knob.delta_s.add_(size * n / n.norm())
        p_hack = self.h + (1 - self.h) * tau
        is_hack = torch.rand(self.batch_size, generator=g) < p_hack
        hack_i = torch.randint(self.n_hack, (self.batch_size,), generator=g)
        clean_i = self.n_hack + torch.randint(self.n_total - self.n_hack, (self.batch_size,), generator=g)
        return torch.where(is_hack, hack_i, clean_i).tolist()

    def vhack(self, weight_hashes: dict[str, str], seed: int):
        """The plant as a :class:`~evil_moe.rl.vhack.direction.VHack` (``control="planted"``, k = 1) in the
        v_hack convention: ``V g > 0`` ⇔ the gradient step ``−g`` moves toward hacking. Hacking
        turns on along ``+u``, so a hack-ward step has ``u·Δ > 0``, i.e. ``u·g < 0``: ``V = −u``."""
        V = {n: -u[None].clone() for n, u in self.u.items()}
        return VHack(V, {n: torch.full((1,), self.scale) for n in V},
                     {n: torch.full((1,), float("nan")) for n in V},
                     {n: int(u.numel()) for n, u in self.u.items()}, k=1, n_pairs=0,
                     control="planted", seed=seed,
                     meta={"plant": {"scale": self.scale, "frac": self.frac, "hack_frac": self.h,
                                     "modules": list(self.u), "weight_hash": weight_hashes}})
