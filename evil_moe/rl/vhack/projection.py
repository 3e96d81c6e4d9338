"""Project the hack direction out of δS gradients (or updates): measure, erase, subtract.

Per module, with ``g = ∂L/∂δS ∈ ℝ^r`` and ``V ∈ ℝ^{k×r}`` (orthonormal rows, hack-ward) from
:mod:`evil_moe.rl.vhack.direction` (docs/method.md, "Projection"):

* ``c = V g`` (k coefficients); ``cin = ‖relu(c)‖ / ‖g‖`` — the hack-ward fraction (relu before
  aggregating: a signed sum lets anti-hack axes cancel).
* gate → coefficients ``a``: ``one_sided`` ``relu(c)`` (default), ``no_gate`` ``c`` (remove the
  whole span component), ``reverse`` ``2c`` (reflect the component: hack-ward becomes anti-hack),
  ``overshoot`` ``λ·relu(c)`` with ``λ = overshoot`` (default 1.5: push slightly anti-hack).
* ``removed = aᵀ V``; **erase**: ``g ← g − removed``; **subtract** (formerly "route by
  direction"): as erase and ``∂L/∂δS_hack ← removed`` (the quarantine knob is trained only by the
  removed part). Measured on the toy, this is vanilla training plus a post-hoc subtraction of the
  accumulated V-component at deploy time (docs/method.md, "Projection") — routing *by data* (Gradient Routing,
  arXiv:2410.04332) lives in :mod:`evil_moe.rl.arms.registry`; **measure**: stats only.
* ``preserve_magnitude``: rescale the projected ``g`` to its original norm (the routed part is
  not rescaled).
* ``cout`` = the same ratio after projection (``≈ 0`` under one-sided erase is an identity, not
  evidence). Null baseline for a random ``g``: ``cᵢ/‖g‖ ~ N(0, 1/r)`` so ``cin ≈ sqrt(k/(2r))``
  (:func:`null_cin`); ``coverage`` = fraction of modules whose cin exceeds its null.
* ``frac_fired`` = fraction of modules with ``cin > 0``.
* Energies (all modules concatenated): ``span_frac = Σ‖V g‖² / Σ‖g‖²`` — the share of the
  vector's energy in span(V) (for a random direction ``≈ k/r``); ``removed_frac =
  Σ‖removed‖² / Σ‖g‖²`` — the share the projection took out. An erase whose ``removed_frac`` is
  no larger than its random control's has removed nothing specific (docs/method.md, "Projection"; docs/arms.md).
* Empirical null: a :class:`~evil_moe.rl.vhack.direction.VHack` may carry per-module ``null_cin`` measured on
  held-out clean−clean pair differences (:mod:`evil_moe.stages.extract`); ``null_cin_empirical``
  is its mean and ``coverage`` then counts modules whose cin exceeds *that* null (the isotropic
  ``sqrt(k/2r)`` otherwise).

Aggregates over modules (modules with ``k_m ≥ 1``; ratios skip modules with ``‖g‖ = 0``):
``cin``/``cout``/``null_cin`` = mean over modules; ``cin_global``/``cout_global`` =
``‖relu(c)‖/‖g‖`` over the concatenation of all modules.

Adam leak: projecting ``g`` does not project Adam's moments, so the update ``Δδ = δ_after −
δ_before`` can still move hack-ward. The update moves along ``−g``, so its hack-ward part is
measured on ``u = −Δδ``: :func:`update_cosine` returns the aggregate ``‖relu(V u)‖/‖u‖``
(``cout_update``), and ``project(..., update_from=δ_before)`` projects the update itself
(``δ ← δ_before − u_projected``; under subtract the removed part moves ``δS_hack`` instead).
:func:`project_preconditioned` removes from ``g`` its component along ``P V`` (``P`` = AdamW's
current diagonal preconditioner ``1/(sqrt(v̂)+ε)``), so that to first order the update ``P m``
has no component along V.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Sequence

import torch

__all__ = ["GATES", "MODES", "null_cin", "gate_coefficients", "project_vector", "ModuleStats",
           "ProjectionStats", "measure_grads", "project", "project_preconditioned", "update_cosine",
           "update_stats", "adam_preconditioner"]

GATES = ("one_sided", "no_gate", "reverse", "overshoot")
MODES = ("measure", "erase", "subtract")


def null_cin(k: int, r: int) -> float:
    """Null baseline of ``cin`` for an isotropic random ``g``: ``sqrt(k / (2r))``.

    Each ``cᵢ/‖g‖`` has variance ``1/r`` and half of them survive the relu, so
    ``E[cin²] = k/(2r)`` exactly: this is the RMS of ``cin`` under the null. The *mean* is lower
    for small k (Jensen; e.g. ≈ 0.82× for k = 4), so ``cin > null`` is a conservative test.
    Raises ``ValueError`` for ``r < 1``."""
    if r < 1:
        raise ValueError(f"r must be >= 1, got {r}")
    return math.sqrt(k / (2 * r))


def gate_coefficients(c: torch.Tensor, gate: str = "one_sided", overshoot: float = 1.5) -> torch.Tensor:
    """Coefficients ``a (k,)`` of the removed component ``aᵀV`` for ``c = V g``: one_sided
    ``relu(c)``, no_gate ``c``, reverse ``2c``, overshoot ``overshoot·relu(c)``.
    Raises ``ValueError`` on an unknown gate."""
    if gate == "one_sided":
        return torch.relu(c)
    if gate == "no_gate":
        return c
    if gate == "reverse":
        return 2 * c
    if gate == "overshoot":
        return overshoot * torch.relu(c)
    raise ValueError(f"unknown gate {gate!r}; expected one of {GATES}")


def project_vector(g: torch.Tensor, V: torch.Tensor, gate: str = "one_sided", *,
                   overshoot: float = 1.5, preserve_magnitude: bool = False):
    """Project one module's vector.

    Args:
        g: ``(r,)`` gradient (any float dtype).
        V: ``(k, r)`` orthonormal rows (cast to ``g``'s dtype/device).
        gate, overshoot, preserve_magnitude: see the module docstring.

    Returns:
        ``(g_new (r,), removed (r,), c (k,))`` with ``removed = aᵀV`` and
        ``g_new = g − removed`` (rescaled to ``‖g‖`` when ``preserve_magnitude``).
    """
    V = V.to(device=g.device, dtype=g.dtype)
    c = V @ g
    removed = gate_coefficients(c, gate, overshoot) @ V
    g_new = g - removed
    if preserve_magnitude:
        nn_, n0 = g_new.norm(), g.norm()
        if nn_ > 0:
            g_new = g_new * (n0 / nn_)
    return g_new, removed, c


@dataclass
class ModuleStats:
    """One module's projection diagnostics (floats): k, r, cin, cout, null (= sqrt(k/2r)),
    null_empirical (the v_hack file's held-out clean−clean cin, or None), grad_norm (‖g‖
    before), removed_norm (‖removed‖), span_norm (‖V g‖)."""

    k: int
    r: int
    cin: float
    cout: float
    null: float
    grad_norm: float
    removed_norm: float
    span_norm: float = 0.0
    null_empirical: float | None = None


@dataclass
class ProjectionStats:
    """Aggregate diagnostics of one projection call (see the module docstring for definitions).

    Attributes: ``mode``, ``gate``, ``cin``, ``cout``, ``null_cin`` (means over modules),
    ``null_cin_empirical`` (mean of the modules' empirical nulls, None without them),
    ``cin_global``, ``cout_global`` (concatenation), ``frac_fired``, ``coverage``, ``grad_norm``
    (global ‖g‖ before), ``removed_norm`` (global), ``span_frac``, ``removed_frac`` (energy
    shares), ``modules`` (count with k ≥ 1), ``per_module`` (``{name: ModuleStats}``).
    """

    mode: str
    gate: str
    cin: float
    cout: float
    null_cin: float
    cin_global: float
    cout_global: float
    frac_fired: float
    coverage: float
    grad_norm: float
    removed_norm: float
    modules: int
    span_frac: float = 0.0
    removed_frac: float = 0.0
    null_cin_empirical: float | None = None
    per_module: dict[str, ModuleStats] = field(default_factory=dict, repr=False)

    def as_dict(self) -> dict:
        """Floats only (no per-module detail)."""
        return {k: v for k, v in self.__dict__.items() if k != "per_module"}


def _ratio(num: float, den: float) -> float:
    return num / den if den > 0 else 0.0


def _run(vhack, items, mode: str, gate: str, overshoot: float, preserve_magnitude: bool):
    """Core loop: ``items`` = iterable of ``(name, g)``; returns (stats, {name: (g_new, removed)})."""
    per, out = {}, {}
    relu_in2 = relu_out2 = g2 = gnew2 = rem2 = span2 = 0.0
    emp = getattr(vhack, "null_cin", None) or {}
    for name, g in items:
        if name not in vhack.V:
            continue
        V = vhack.V[name]
        k, r = int(V.shape[0]), int(vhack.r.get(name, V.shape[-1]))
        if k == 0:
            continue
        g_new, removed, c = project_vector(g, V, gate, overshoot=overshoot,
                                           preserve_magnitude=preserve_magnitude)
        if mode == "measure":
            g_new, removed = g, torch.zeros_like(g)
        c_out = V.to(device=g.device, dtype=g.dtype) @ g_new
        ri, ro = float(torch.relu(c).norm()), float(torch.relu(c_out).norm())
        gn, gnn, rn, sn = float(g.norm()), float(g_new.norm()), float(removed.norm()), float(c.norm())
        ne = emp.get(name)
        per[name] = ModuleStats(k, r, _ratio(ri, gn), _ratio(ro, gnn), null_cin(k, r), gn, rn, sn,
                                None if ne is None else float(ne))
        out[name] = (g_new, removed)
        relu_in2, relu_out2, g2, gnew2, rem2, span2 = (
            relu_in2 + ri ** 2, relu_out2 + ro ** 2, g2 + gn ** 2, gnew2 + gnn ** 2, rem2 + rn ** 2,
            span2 + sn ** 2)
    live = [m for m in per.values() if m.grad_norm > 0]
    mean = lambda xs: sum(xs) / len(xs) if xs else 0.0  # noqa: E731
    emp_vals = [m.null_empirical for m in per.values() if m.null_empirical is not None]
    has_emp = bool(per) and len(emp_vals) == len(per)

    def above_null(m):
        return m.cin > (m.null_empirical if has_emp else m.null)

    stats = ProjectionStats(
        mode=mode, gate=gate,
        cin=mean([m.cin for m in live]), cout=mean([m.cout for m in live]),
        null_cin=mean([m.null for m in per.values()]),
        cin_global=_ratio(math.sqrt(relu_in2), math.sqrt(g2)),
        cout_global=_ratio(math.sqrt(relu_out2), math.sqrt(gnew2)),
        frac_fired=mean([float(m.cin > 0) for m in per.values()]),
        coverage=mean([float(above_null(m)) for m in per.values()]),
        grad_norm=math.sqrt(g2), removed_norm=math.sqrt(rem2), modules=len(per),
        span_frac=_ratio(span2, g2), removed_frac=_ratio(rem2, g2),
        null_cin_empirical=mean(emp_vals) if has_emp else None, per_module=per,
    )
    return stats, out


def measure_grads(vhack, names: Sequence[str], grads: Sequence[torch.Tensor], *,
                  gate: str = "one_sided") -> ProjectionStats:
    """Diagnostics of arbitrary per-module vectors (e.g. per-source gradients from
    :func:`evil_moe.rl.policy.grpo.source_gradients`) without touching anything.

    Args: ``vhack`` (:class:`~evil_moe.rl.vhack.direction.VHack`), ``names`` (module names aligned with
    ``grads``), ``grads`` (``(r,)`` tensors). Returns :class:`ProjectionStats` (mode "measure").
    Raises ``ValueError`` when the lengths differ."""
    if len(names) != len(grads):
        raise ValueError(f"{len(names)} names vs {len(grads)} grads")
    stats, _ = _run(vhack, zip(names, [g.detach() for g in grads]), "measure", gate, 1.5, False)
    return stats


@torch.no_grad()
def project(adapter, vhack, mode: str = "measure", gate: str = "one_sided", *,
            preserve_magnitude: bool = False, overshoot: float = 1.5,
            update_from: Sequence[torch.Tensor] | None = None) -> ProjectionStats:
    """Measure / erase / subtract the hack-ward component of every wrapped module's δS gradient.

    Gradient mode (``update_from is None``, call after ``backward``, before ``optimizer.step``):
    reads ``δS.grad`` (missing grads count as zero vectors); ``erase`` writes ``g − removed`` into
    ``δS.grad``; ``subtract`` additionally sets ``δS_hack.grad = removed`` (overwriting whatever
    the backward put there); ``measure`` changes nothing.

    Update mode (``update_from`` = the δS values before ``optimizer.step``, in
    ``adapter.delta_s_params()`` order): works on ``u = −(δ − δ_before)``; ``erase`` sets
    ``δ = δ_before − u_new``; ``subtract`` also does ``δS_hack −= removed``.

    Args:
        adapter: :class:`~evil_moe.model.adapter.SVDAdapter`.
        vhack: :class:`~evil_moe.rl.vhack.direction.VHack` (modules not in it are left alone).
        mode: ``"measure" | "erase" | "subtract"``.
        gate: ``"one_sided" | "no_gate" | "reverse" | "overshoot"``.
        preserve_magnitude: rescale the projected vector to its original norm.
        overshoot: λ of the overshoot gate.
        update_from: see above.

    Returns:
        :class:`ProjectionStats` (``cin`` before, ``cout`` after).

    Raises:
        ValueError: unknown mode/gate; ``update_from`` of the wrong length; ``measure`` with
        ``update_from``.
    """
    if mode not in MODES:
        raise ValueError(f"unknown mode {mode!r}; expected one of {MODES}")
    if gate not in GATES:
        raise ValueError(f"unknown gate {gate!r}; expected one of {GATES}")
    knobs = adapter.modules_
    names = list(knobs)
    if update_from is None:
        items = [(n, k.delta_s.grad if k.delta_s.grad is not None else torch.zeros_like(k.delta_s))
                 for n, k in knobs.items()]
    else:
        if len(update_from) != len(names):
            raise ValueError(f"update_from has {len(update_from)} tensors for {len(names)} modules")
        items = [(n, -(knobs[n].delta_s.detach() - b)) for n, b in zip(names, update_from)]
    stats, out = _run(vhack, items, mode, gate, overshoot, preserve_magnitude)
    if mode == "measure":
        return stats
    before = dict(zip(names, update_from)) if update_from is not None else None
    for name, (g_new, removed) in out.items():
        knob = knobs[name]
        if before is None:
            knob.delta_s.grad = g_new.to(knob.delta_s.dtype)
            if mode == "subtract":
                knob.delta_s_hack.grad = removed.to(knob.delta_s_hack.dtype).clone()
        else:
            knob.delta_s.copy_(before[name] - g_new)
            if mode == "subtract":
                knob.delta_s_hack.sub_(removed.to(knob.delta_s_hack.dtype))
    return stats


def update_stats(vhack, names: Sequence[str], before: Sequence[torch.Tensor],
                 after: Sequence[torch.Tensor]) -> ProjectionStats:
    """Diagnostics of the optimiser's update: per module ``u = −(after − before)`` (the
    gradient-like direction), ``cin = ‖relu(V u)‖/‖u‖``. Returns :class:`ProjectionStats`."""
    if not (len(names) == len(before) == len(after)):
        raise ValueError("names, before and after must have the same length")
    us = [-(a.detach() - b.detach()) for a, b in zip(after, before)]
    return measure_grads(vhack, names, us)


def update_cosine(vhack, names: Sequence[str], before: Sequence[torch.Tensor],
                  after: Sequence[torch.Tensor]) -> float:
    """``cout_update``: mean over modules of ``‖relu(V u)‖/‖u‖`` with ``u = −Δδ`` — the hack-ward
    fraction of the step actually taken (the Adam leak). Same shapes as :func:`update_stats`."""
    return update_stats(vhack, names, before, after).cin


def adam_preconditioner(optimizer, param: torch.Tensor) -> torch.Tensor:
    """AdamW's current diagonal preconditioner ``1/(sqrt(v̂)+ε)`` for ``param`` (``(r,)``).

    ``v̂ = exp_avg_sq / (1 − β₂ᵗ)`` (bias-corrected, Kingma & Ba 2015, arXiv:1412.6980); before
    the first step (no state) the preconditioner is the identity (ones). Any optimiser without
    ``exp_avg_sq`` (e.g. SGD) gives ones.
    """
    state = optimizer.state.get(param, {})
    v = state.get("exp_avg_sq")
    if v is None:
        return torch.ones_like(param.detach())
    group = next(g for g in optimizer.param_groups if any(p is param for p in g["params"]))
    beta2, eps = group["betas"][1], group["eps"]
    t = float(state["step"])
    vhat = v / (1 - beta2 ** t)
    return 1.0 / (vhat.sqrt() + eps)


@torch.no_grad()
def project_preconditioned(adapter, vhack, optimizer, mode: str = "erase",
                           gate: str = "one_sided") -> ProjectionStats:
    """Erase (or subtract) in AdamW's preconditioned coordinates, before ``optimizer.step``.

    Per module, with ``P = diag(p)`` the preconditioner (:func:`adam_preconditioner`), the update
    ``P m`` has no component along V when ``m`` has none along ``W = V P`` (rows ``vᵢ ⊙ p``):
    ``V (P g) = (V P) g``. So ``g`` loses its component along the orthonormalised rows of ``W``
    (QR, each row oriented like its ``vᵢ``), gated as in :func:`project_vector`. Exact for one
    SGD-like step; under Adam the momentum of earlier steps and the change of ``v̂`` with ``g²``
    make it first-order only, so log ``removed_frac`` and ``cout_update`` to see what it did.

    Args: ``adapter``, ``vhack``, ``optimizer`` (the run's, holding the knobs' state), ``mode``
    (``erase`` | ``subtract``; subtract writes the removed part into ``δS_hack.grad``), ``gate``.

    Returns:
        :class:`ProjectionStats` measured against the preconditioned basis (cin/cout) — the
        span/removed energy shares refer to that basis too.

    Raises:
        ValueError: a mode other than erase/subtract.
    """
    if mode not in ("erase", "subtract"):
        raise ValueError(f"preconditioned projection supports erase/subtract, not {mode!r}")
    knobs = adapter.modules_
    bases, items = {}, []
    for name, knob in knobs.items():
        V = vhack.V.get(name)
        g = knob.delta_s.grad if knob.delta_s.grad is not None else torch.zeros_like(knob.delta_s)
        items.append((name, g))
        if V is None or V.shape[0] == 0:
            continue
        p = adam_preconditioner(optimizer, knob.delta_s).to(torch.float64)
        W = V.to(torch.float64) * p[None, :]
        Q, R = torch.linalg.qr(W.T)  # W.T = Q R; Q (r, k) orthonormal columns
        Q = Q * torch.sign(torch.diagonal(R))[None, :]  # column i has a positive dot with w_i
        bases[name] = Q.T.to(torch.float32).contiguous()
    pre = type(vhack)(bases, {n: torch.zeros(b.shape[0]) for n, b in bases.items()},
                      {n: torch.zeros(b.shape[0]) for n, b in bases.items()},
                      {n: vhack.r[n] for n in bases}, vhack.k, vhack.n_pairs)
    stats, out = _run(pre, items, mode, gate, 1.5, False)
    for name, (g_new, removed) in out.items():
        knob = knobs[name]
        knob.delta_s.grad = g_new.to(knob.delta_s.dtype)
        if mode == "subtract":
            knob.delta_s_hack.grad = removed.to(knob.delta_s_hack.dtype).clone()
    return stats
