"""SVD adapter with a deletable "evil expert" knob (AntiPaSTO-style singular-value steering).

For each targeted ``nn.Linear`` with weight ``W ∈ ℝ^{d_out×d_in}`` and thin SVD
``W = U diag(Σ) Vh`` (``U: d_out×r``, ``Vh: r×d_in``, ``r = min(d_in, d_out)``), two trainable
vectors ``δS, δS_hack ∈ ℝ^r`` (zero-initialised) change the layer to::

    y = W x + U diag(δS + δS_hack) Vh x

The base model is frozen (``requires_grad=False`` on all its parameters) and its module tree is
left unchanged: the extra term is added by a forward hook on each wrapped Linear, computed as
``((x @ Vhᵀ) * s) @ Uᵀ`` — never materialising a ``d_out×d_in`` matrix per step. At
``δS = δS_hack = 0`` the hook adds an exact zero, so logits are bit-identical to the base model.

``δS_hack`` is the quarantine of Gradient Routing (arXiv:2410.04332): only the routed gradient
trains it, and :meth:`SVDAdapter.ablated` zeroes it for the deploy view. :meth:`SVDAdapter.zeroed`
gives the reference (base) policy for free. :meth:`SVDAdapter.merged` folds the knobs into the
weights for fast sampling (hooks make generation ~2× slower).

Knob parameters are fp32 whatever the model dtype (Adam state stays fp32; fp64 for an fp64 model); ``U``/``Vh`` are kept
as buffers in the model dtype on the model device. The SVD itself is done in fp32 and cached by a
content hash of ``W`` (in memory, and optionally on disk via ``cache_dir``): :mod:`evil_moe.model.svd`.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections import OrderedDict
from pathlib import Path
from typing import Iterable, Iterator

import torch
from torch import nn

from evil_moe.files import REMAKE, DamagedFile, atomic_write_bytes, check_intact
from evil_moe.model.svd import matches, thin_svd

__all__ = [
    "DEFAULT_TARGETS",
    "SVDKnob",
    "SVDAdapter",
    "GradientCapture",
]

DEFAULT_TARGETS: tuple[str, ...] = (
    "q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj",
)
ADAPTER_FORMAT = "evil_moe.svd_adapter.v1"


class SVDKnob(nn.Module):
    """The adapter state of one wrapped Linear.

    Attributes:
        delta_s, delta_s_hack: ``(r,)`` fp32 Parameters (fp64 for an fp64 base), zero-initialised.
        U: ``(d_out, r)`` buffer, model dtype; ``S``: ``(r,)`` fp32 buffer (base singular values,
            informational); ``Vh``: ``(r, d_in)`` buffer, model dtype.
        r: rank ``min(d_in, d_out)``.
    """

    def __init__(self, linear: nn.Linear, *, cache_dir=None):
        super().__init__()
        W = linear.weight
        U, S, Vh = thin_svd(W, cache_dir=cache_dir)
        self.register_buffer("U", U.to(W.dtype), persistent=False)
        self.register_buffer("S", S, persistent=False)
        self.register_buffer("Vh", Vh.to(W.dtype), persistent=False)
        self.r = int(S.shape[0])
        kdt = torch.float64 if W.dtype == torch.float64 else torch.float32
        self.delta_s = nn.Parameter(torch.zeros(self.r, device=W.device, dtype=kdt))
        self.delta_s_hack = nn.Parameter(torch.zeros(self.r, device=W.device, dtype=kdt))

    def delta(self, x: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
        """``((x @ Vhᵀ) * s) @ Uᵀ`` for ``x (..., d_in)`` and ``s (r,)`` (or any shape that
        broadcasts against ``(..., r)``, e.g. ``(B, 1, r)`` per row); returns ``(..., d_out)``."""
        Vh = self.Vh if self.Vh.dtype == x.dtype else self.Vh.to(x.dtype)
        U = self.U if self.U.dtype == x.dtype else self.U.to(x.dtype)
        return ((x @ Vh.T) * s.to(x.dtype)) @ U.T

    def dense_delta(self, s: torch.Tensor) -> torch.Tensor:
        """``U diag(s) Vh``, ``(d_out, d_in)``, in fp32 or, for fp64 factors, fp64 (used only by
        the merge fast path)."""
        dt = torch.promote_types(self.U.dtype, torch.float32)
        return (self.U.to(dt) * s.to(dt)) @ self.Vh.to(dt)


class GradientCapture:
    """The inputs and outputs of the wrapped Linears in one :meth:`SVDAdapter.merged_gradients`
    context, and the knobs' gradient they give (see there)."""

    def __init__(self, adapter: "SVDAdapter", rows: int | None):
        self.adapter, self.rows = adapter, rows
        self.seen: dict[str, list[tuple[torch.Tensor, torch.Tensor]]] = {n: [] for n in adapter.names}

    def _hook(self, name: str):
        def hook(mod, inputs, output):
            if not torch.is_grad_enabled():
                return output
            if not output.requires_grad:  # nothing upstream needs grad: start the graph here
                output = output.detach().requires_grad_()
            if self.rows is not None and output.shape[0] != self.rows:
                raise ValueError(f"merged_gradients(rows={self.rows}): module {name!r} got a "
                                 f"batch of {output.shape[0]} rows")
            self.seen[name].append((inputs[0].detach(), output))
            return output

        return hook

    def grads(self, loss: torch.Tensor, *, retain_graph: bool = False):
        """``∂loss/∂s`` per wrapped module, ``list[(r,)]`` in :attr:`SVDAdapter.names` order
        (knob dtype; zeros for a module the loss does not reach), and with ``rows`` the per-row
        parts ``list[(B, r)]`` (else None): ``(totals, per_row)``.

        Raises:
            RuntimeError: nothing was recorded with gradient (the forward ran under no_grad).
        """
        pairs = [(n, x, y) for n, seen in self.seen.items() for x, y in seen]
        if not pairs:
            raise RuntimeError("merged_gradients: no forward with gradient was recorded")
        gys = torch.autograd.grad(loss, [y for _, _, y in pairs], retain_graph=retain_graph,
                                  allow_unused=True)
        mods = self.adapter.modules_
        total = {n: torch.zeros_like(k.delta_s) for n, k in mods.items()}
        per_row = ({n: torch.zeros(self.rows, k.r, dtype=k.delta_s.dtype, device=k.delta_s.device)
                    for n, k in mods.items()} if self.rows is not None else None)
        for (n, x, _), gy in zip(pairs, gys):
            if gy is None:
                continue
            knob = mods[n]
            dt = knob.delta_s.dtype
            a = (gy.to(dt) @ knob.U.to(dt)) * (x.to(dt) @ knob.Vh.to(dt).T)  # (..., r)
            if per_row is not None:
                b = a.reshape(a.shape[0], -1, a.shape[-1]).sum(1)
                per_row[n] += b
                total[n] += b.sum(0)
            else:
                total[n] += a.reshape(-1, a.shape[-1]).sum(0)
        names = self.adapter.names
        return [total[n] for n in names], (None if per_row is None else [per_row[n] for n in names])


class SVDAdapter(nn.Module):
    """δS / δS_hack knobs on a model's Linear layers (see module docstring for the formula).

    Create with :meth:`attach`. The adapter is an ``nn.Module`` holding only the knobs; pass
    ``adapter.delta_s_params()`` (and ``adapter.delta_s_hack_params()`` for routing) to the
    optimiser. The model's own parameters are frozen by :meth:`attach`.

    Attributes:
        model: the wrapped model (module tree unchanged; hooks registered).
        modules_: ``OrderedDict[name -> SVDKnob]`` in model order (also :attr:`knobs`).
        target_modules: the name suffixes that were matched.
        base_model_id: free-form identifier saved in the metadata.
        mode: ``"full"`` (δS+δS_hack), ``"ablated"`` (δS only) or ``"zeroed"`` (base model).
    """

    def __init__(self, model: nn.Module, names: list[str], target_modules: tuple[str, ...],
                 *, base_model_id: str = "", cache_dir=None):
        super().__init__()
        object.__setattr__(self, "model", model)  # not a submodule: keeps adapter.parameters() = knobs
        self.target_modules = tuple(target_modules)
        self.base_model_id = base_model_id or str(getattr(model.config, "_name_or_path", "") or "")
        self.mode = "full"
        self._bypass: set[str] = set()
        self._per_sample: dict[str, torch.Tensor] | None = None
        self._mixture: torch.Tensor | None = None
        self._mixture_forward = "straight_through"
        self.knobs = nn.ModuleDict()
        self._names: list[str] = []
        self._linears: dict[str, nn.Linear] = {}
        self._handles = []
        for name in names:
            lin = model.get_submodule(name)
            knob = SVDKnob(lin, cache_dir=cache_dir)
            self.knobs[name.replace(".", "__")] = knob
            self._names.append(name)
            self._linears[name] = lin
            self._handles.append(lin.register_forward_hook(self._make_hook(name, knob)))

    # ----------------------------------------------------------------------------------------
    @classmethod
    def attach(cls, model: nn.Module, target_modules: Iterable[str] = DEFAULT_TARGETS, *,
               base_model_id: str = "", cache_dir: str | os.PathLike | None = None,
               freeze_base: bool = True) -> "SVDAdapter":
        """Wrap every ``nn.Linear`` whose qualified name ends with one of ``target_modules``.

        Args:
            model: a causal LM (any architecture with ``nn.Linear`` layers).
            target_modules: name suffixes, e.g. :data:`DEFAULT_TARGETS` plus ``"lm_head"``
                (with tied embeddings, the ``lm_head`` knob changes only the output projection).
            base_model_id: saved in the adapter metadata (defaults to ``config._name_or_path``).
            cache_dir: optional on-disk SVD cache.
            freeze_base: set ``requires_grad=False`` on every model parameter.

        Returns:
            the adapter (its knobs are on the model's device).

        Raises:
            ValueError: no module matched, or a matched module is not an ``nn.Linear``.
        """
        targets = tuple(target_modules)
        names = []
        for name, mod in model.named_modules():
            if matches(name, targets):
                if not isinstance(mod, nn.Linear):
                    raise ValueError(f"target {name!r} is {type(mod).__name__}, not nn.Linear")
                names.append(name)
        if not names:
            raise ValueError(f"no module of the model matches target_modules={targets}")
        if freeze_base:
            for p in model.parameters():
                p.requires_grad_(False)
        return cls(model, names, targets, base_model_id=base_model_id, cache_dir=cache_dir)

    def detach_hooks(self) -> None:
        """Remove all forward hooks (the model becomes the plain base model again)."""
        for h in self._handles:
            h.remove()
        self._handles = []

    # ----------------------------------------------------------------------------------------
    @property
    def modules_(self) -> "OrderedDict[str, SVDKnob]":
        """``OrderedDict`` model-module name → :class:`SVDKnob`."""
        return OrderedDict((n, self.knobs[n.replace(".", "__")]) for n in self._names)

    @property
    def names(self) -> list[str]:
        """Qualified names of the wrapped Linears, in model order."""
        return list(self._names)

    @property
    def r(self) -> dict[str, int]:
        """Rank per wrapped module."""
        return {n: k.r for n, k in self.modules_.items()}

    def delta_s_params(self) -> list[nn.Parameter]:
        """The δS Parameters, in module order."""
        return [k.delta_s for k in self.modules_.values()]

    def delta_s_hack_params(self) -> list[nn.Parameter]:
        """The δS_hack Parameters, in module order."""
        return [k.delta_s_hack for k in self.modules_.values()]

    def effective_s(self, name: str) -> torch.Tensor:
        """``s`` used in the forward for module ``name`` under the current mode, ``(r,)`` fp32."""
        knob = self.modules_[name]
        if self.mode == "zeroed":
            return torch.zeros_like(knob.delta_s)
        if self.mode == "ablated":
            return knob.delta_s
        return knob.delta_s + knob.delta_s_hack

    def _make_hook(self, name: str, knob: SVDKnob):
        def hook(mod, inputs, output):
            if self.mode == "zeroed" or name in self._bypass:
                return output
            s = knob.delta_s if self.mode == "ablated" else knob.delta_s + knob.delta_s_hack
            x = inputs[0]
            if self._mixture is not None:  # δS's gradient × (1 − w_b), δS_hack's × w_b (mixture())
                w = self._mixture.to(knob.delta_s.dtype)[:, None]
                if x.shape[0] != w.shape[0]:
                    raise ValueError(f"mixture({w.shape[0]}): module {name!r} got a batch of {x.shape[0]} rows")
                ds, dsh = knob.delta_s, knob.delta_s_hack
                s = ds * (1 - w) + ds.detach() * w + dsh * w
                if self._mixture_forward == "straight_through":  # the value at full weight
                    s = s + (dsh * (1 - w)).detach()
                s = s.reshape(s.shape[0], *([1] * (x.dim() - 2)), s.shape[1])
            elif self._per_sample is not None:  # s_b = s + e_b per row b (see per_sample())
                e = self._per_sample[name]
                if x.shape[0] != e.shape[0]:
                    raise ValueError(f"per_sample({e.shape[0]}): module {name!r} got a batch of "
                                     f"{x.shape[0]} rows")
                s = s + e.reshape(e.shape[0], *([1] * (x.dim() - 2)), e.shape[1])
            return output + knob.delta(x, s)

        return hook

    # ----------------------------------------------------------------------------------------
    @contextlib.contextmanager
    def _mode(self, mode: str) -> Iterator["SVDAdapter"]:
        if self._bypass:
            raise RuntimeError("cannot change the adapter mode inside merged(): enter "
                               "zeroed()/ablated() first, then merged()")
        prev, self.mode = self.mode, mode
        try:
            yield self
        finally:
            self.mode = prev

    @contextlib.contextmanager
    def per_sample(self, batch_size: int) -> Iterator[list[torch.Tensor]]:
        """Context for per-sample ``δS`` gradients from ONE batched backward.

        Each wrapped module's forward uses ``s + e_b`` for row ``b``, where ``e`` is a zero
        ``(B, r)`` tensor (knob dtype, requiring grad) per module. The forward is unchanged in
        value (``e = 0``), and ``∂L/∂e[b]`` is row ``b``'s gradient of ``δS`` (equally of
        ``δS_hack``: the forward sees their sum)::

            ∂L/∂e[b] = Σ_{t ∈ row b} (Vh x_t) ⊙ (Uᵀ ∂L/∂y_t)

        because rows never interact in a causal LM forward. ``Σ_b ∂L/∂e[b] = ∂L/∂δS``. This is
        the "expanded weights" form of per-sample gradients (Goodfellow 2015, "Efficient
        per-example gradient computations", arXiv:1510.01799): one backward instead of ``B``.

        Args:
            batch_size: ``B``, the leading dimension of every wrapped module's input inside the
                context (a ``ValueError`` is raised by the forward otherwise).

        Yields:
            the ``e`` tensors, ``list[(B, r)]`` in :attr:`names` order; pass them to
            ``torch.autograd.grad``.

        Raises:
            RuntimeError: nested, or inside :meth:`merged` (hooks bypassed: no gradient).
        """
        if self._per_sample is not None or self._bypass or self._mixture is not None:
            raise RuntimeError("per_sample() cannot be nested or used inside merged() or mixture()")
        es = {n: torch.zeros(int(batch_size), k.r, dtype=k.delta_s.dtype, device=k.delta_s.device,
                             requires_grad=True) for n, k in self.modules_.items()}
        self._per_sample = es
        try:
            yield [es[n] for n in self._names]
        finally:
            self._per_sample = None

    @contextlib.contextmanager
    def mixture(self, w: torch.Tensor, forward: str = "straight_through") -> Iterator["SVDAdapter"]:
        """Context of Evil MoE's forward (:mod:`evil_moe.rl.detectors.router`): row ``b`` of every wrapped
        module sends ``w_b`` of its gradient to ``δS_hack`` and ``1 − w_b`` to ``δS``::

            scaled:            s_b = δS·(1 − w_b) + sg(δS)·w_b + w_b·δS_hack
            straight_through:  s_b = δS·(1 − w_b) + sg(δS)·w_b + w_b·δS_hack + sg((1 − w_b)·δS_hack)

        (sg: stop-gradient). Either way ``∂L/∂δS = Σ_b (1 − w_b) g_b``, ``∂L/∂δS_hack = Σ_b w_b
        g_b`` and ``∂L/∂w_b = ⟨g_b, δS_hack⟩`` summed over modules (``g_b``: row ``b``'s gradient
        with respect to its ``s_b``), evaluated at that forward's value. ``scaled`` (the seed
        design, wassname/evil_MoE) computes the forward at ``δS + w_b·δS_hack``: ``w = 0`` is the
        deploy view's forward, ``w = 1`` the trained view's, so a rollout sampled under the trained
        view is scored off-policy wherever ``w_b < 1``. ``straight_through`` keeps the value at the
        trained view's ``δS + δS_hack`` for every ``w`` (the policy that sampled the rollouts:
        the importance ratio is 1 at the first inner step, as for route) and only splits the
        gradient: soft Gradient Routing (arXiv:2410.04332) with a learned weight.

        Args:
            w: ``(B,)`` the rows' weights (may require grad: the router learns through them).
            forward: ``straight_through`` or ``scaled`` (config ``moe.forward``).

        Raises:
            RuntimeError: nested with itself or :meth:`per_sample`, inside :meth:`merged`, or
                outside the full view.
            ValueError: an unknown ``forward``.
        """
        if forward not in ("straight_through", "scaled"):
            raise ValueError(f"mixture(forward={forward!r}): expected 'straight_through' or 'scaled'")
        if self._mixture is not None or self._per_sample is not None or self._bypass or self.mode != "full":
            raise RuntimeError("mixture() needs the full view, outside merged(), per_sample() and itself")
        self._mixture, self._mixture_forward = w.flatten(), forward
        try:
            yield self
        finally:
            self._mixture = None

    @contextlib.contextmanager
    def merged_gradients(self, rows: int | None = None) -> Iterator["GradientCapture"]:
        """Context for the ``δS`` gradient from a forward with the knobs merged into the weights.

        Inside, every wrapped Linear computes ``y = W' x`` with ``W' = W + U diag(s) Vh``
        (:meth:`merged`; ``s`` of the current mode) and records its input ``x`` and its output
        ``y``; :meth:`GradientCapture.grads` then backpropagates a loss to the ``y`` only and
        forms, per module, ::

            ∂L/∂s = Σ_t (Uᵀ ∂L/∂y_t) ⊙ (Vh x_t)

        (the chain rule through ``y = W x + U diag(s) Vh x``, the same sum
        :meth:`per_sample` takes per row). The forward's value is the hooked forward's up to
        the rounding of ``W'``; its cost is one matmul per Linear instead of three, and the
        backward's two per Linear instead of three, plus the two matmuls of the sum above
        (the hooked loss cost 2.25-2.5x the plain one). Equal to the hooked
        gradient to float tolerance (tested).

        Args:
            rows: give per-row gradients too (``B``: the leading dimension of every wrapped
                module's input inside the context, as :meth:`per_sample`); None: totals only.

        Yields:
            a :class:`GradientCapture`; run the forward inside the context, then call its
            ``grads(loss)`` (as often as needed, ``retain_graph=True`` but the last).

        Raises:
            RuntimeError: nested, inside :meth:`merged` or :meth:`per_sample`, or in the
                ``zeroed`` mode (the forward would not depend on the knobs).
        """
        if self._per_sample is not None or self._bypass or self.mode == "zeroed":
            raise RuntimeError("merged_gradients() needs the full or ablated mode, outside "
                               "merged(), per_sample() and another merged_gradients()")
        cap = GradientCapture(self, rows)
        with self.merged():
            handles = [self._linears[n].register_forward_hook(cap._hook(n)) for n in self._names]
            try:
                yield cap
            finally:
                for h in handles:
                    h.remove()

    def zeroed(self):
        """Context: forward as the base model (both knobs ignored) — the reference policy."""
        return self._mode("zeroed")

    def ablated(self):
        """Context: forward with ``δS_hack`` ignored — the deploy view of routing."""
        return self._mode("ablated" if self.mode != "zeroed" else "zeroed")

    @contextlib.contextmanager
    def merged(self) -> Iterator["SVDAdapter"]:
        """Context for fast sampling: ``W ← W + U diag(s) Vh`` in place, hooks bypassed.

        ``s`` follows the current mode (full / ablated / zeroed). The sum is formed in fp32 (fp64
        for an fp64 model) and cast to the weight dtype; on exit the original weight tensors are restored bit-exactly
        (a copy of each is kept while merged: extra memory = the wrapped weights once). A weight
        shared with another module (a tied ``lm_head`` and input embedding) is untied for the
        context instead: the Linear gets a new Parameter holding its merged weight and gets the
        shared Parameter back on exit, so the input embedding never changes and the head costs
        one matmul, not the matmul plus the hook's two (+16% of a SmolLM2 decode step,
        measured). Runs under ``torch.no_grad``; do not backpropagate through a merged forward.
        """
        saved: dict[str, torch.Tensor] = {}
        untied: dict[str, nn.Parameter] = {}
        shared = self._shared_weight_ptrs()
        try:
            with torch.no_grad():
                for name, knob in self.modules_.items():
                    lin = self._linears[name]
                    if self.mode == "zeroed":
                        continue
                    s = self.effective_s(name).detach()
                    if torch.count_nonzero(s) == 0:
                        self._bypass.add(name)
                        continue
                    delta = knob.dense_delta(s)  # summed in fp32, or fp64 for an fp64 model
                    acc = torch.promote_types(lin.weight.dtype, delta.dtype)
                    merged = (lin.weight.data.to(acc) + delta.to(acc)).to(lin.weight.dtype)
                    if lin.weight.data_ptr() in shared:
                        untied[name] = lin.weight
                        lin.weight = nn.Parameter(merged, requires_grad=False)
                    else:
                        saved[name] = lin.weight.data.clone()
                        lin.weight.data.copy_(merged)
                    self._bypass.add(name)
            yield self
        finally:
            with torch.no_grad():
                for name, w in saved.items():
                    self._linears[name].weight.data.copy_(w)
                for name, param in untied.items():
                    self._linears[name].weight = param
            self._bypass.clear()

    def shared_weight_names(self) -> list[str]:
        """Wrapped modules whose weight tensor another module also uses (a tied ``lm_head``)."""
        shared = self._shared_weight_ptrs()
        return [n for n in self._names if self._linears[n].weight.data_ptr() in shared]

    def fold_into_weights(self) -> list[str]:
        """Make the knobs permanent: ``W ← W + U diag(s) Vh`` for every wrapped Linear (``s`` as
        in the forward under the current mode, summed in fp32 and cast to the weight dtype), then
        remove the hooks, so the model alone computes what model + adapter computed and can be
        saved with ``save_pretrained`` as a plain model. The adapter is spent afterwards.

        Returns:
            the names of the modules whose weight changed (``s ≠ 0``).

        Raises:
            ValueError: a module with ``s ≠ 0`` shares its weight with another module (a tied
                ``lm_head``): folding would change the embedding too (names the module).
            RuntimeError: called inside :meth:`merged`.
        """
        if self._bypass:
            raise RuntimeError("fold_into_weights() inside merged()")
        shared = self._shared_weight_ptrs()
        changed = []
        with torch.no_grad():
            todo = []
            for name, knob in self.modules_.items():
                s = self.effective_s(name).detach()
                if self.mode == "zeroed" or torch.count_nonzero(s) == 0:
                    continue
                if self._linears[name].weight.data_ptr() in shared:
                    raise ValueError(f"cannot fold delta_s into {name!r}: its weight is shared "
                                     "with another module (tied embedding)")
                todo.append((name, knob, s))
            for name, knob, s in todo:
                lin = self._linears[name]
                lin.weight.data.copy_((lin.weight.data.float() + knob.dense_delta(s))
                                      .to(lin.weight.dtype))
                changed.append(name)
        self.detach_hooks()
        return changed

    def _shared_weight_ptrs(self) -> set[int]:
        """data_ptrs of wrapped weights also used by a module that is not that Linear."""
        counts: dict[int, int] = {}
        for mod in self.model.modules():
            w = getattr(mod, "weight", None)
            if isinstance(w, torch.Tensor):
                counts[w.data_ptr()] = counts.get(w.data_ptr(), 0) + 1
        return {p for p, c in counts.items() if c > 1}

    # ----------------------------------------------------------------------------------------
    def save(self, path: str | os.PathLike, metadata: dict | None = None) -> Path:
        """Save both knobs as safetensors (``<name>.delta_s``, ``<name>.delta_s_hack``, fp32).

        Metadata (all strings): ``format``, ``base_model``, ``target_modules`` (JSON list),
        ``r`` (JSON dict name → r), ``extra`` (JSON of ``metadata``). Written atomically with
        its SHA-256 recorded beside it (:func:`evil_moe.files.atomic_write_bytes`), mode from the
        umask.

        Raises:
            OSError: the file cannot be written (a full disk; names it).
        """
        from safetensors.torch import save

        path = Path(path)
        tensors = {}
        for n, k in self.modules_.items():
            tensors[f"{n}.delta_s"] = k.delta_s.detach().float().cpu().contiguous()
            tensors[f"{n}.delta_s_hack"] = k.delta_s_hack.detach().float().cpu().contiguous()
        meta = {
            "format": ADAPTER_FORMAT,
            "base_model": self.base_model_id,
            "target_modules": json.dumps(list(self.target_modules)),
            "r": json.dumps(self.r),
            "extra": json.dumps(metadata or {}, default=str),
        }
        atomic_write_bytes(path, save(tensors, metadata=meta))
        return path

    @staticmethod
    def read_metadata(path: str | os.PathLike) -> dict:
        """Metadata of a saved adapter with JSON fields decoded.

        Raises:
            evil_moe.files.DamagedFile: not a safetensors file (cut short, say; names it).
        """
        from safetensors import SafetensorError, safe_open

        try:
            with safe_open(str(path), framework="pt") as f:
                meta = dict(f.metadata() or {})
        except SafetensorError as err:
            raise DamagedFile(f"{path} is damaged: not a safetensors file ({err}): {REMAKE}") from None
        for key in ("target_modules", "r", "extra"):
            if key in meta:
                meta[key] = json.loads(meta[key])
        return meta

    def load(self, path: str | os.PathLike, *, strict: bool = True) -> dict:
        """Load knobs saved by :meth:`save` into this adapter; returns the decoded metadata.

        Raises:
            evil_moe.files.DamagedFile: the file is not what :meth:`save` wrote (its SHA-256 is
                not the one recorded beside it, :func:`evil_moe.files.check_intact`), or not a
                safetensors file; the message names it.
            ValueError: wrong format, a module missing / extra (``strict``), or an ``r`` mismatch.
        """
        from safetensors.torch import load_file

        check_intact(path)
        meta = self.read_metadata(path)
        if meta.get("format") != ADAPTER_FORMAT:
            raise ValueError(f"{path}: not an evil_moe SVD adapter (format={meta.get('format')!r})")
        saved_r = meta["r"]
        mine = self.r
        if strict and set(saved_r) != set(mine):
            raise ValueError(f"{path}: module sets differ: missing {sorted(set(mine) - set(saved_r))[:5]}"
                             f", extra {sorted(set(saved_r) - set(mine))[:5]}")
        tensors = load_file(str(path))
        with torch.no_grad():
            for n, knob in self.modules_.items():
                if n not in saved_r:
                    continue
                if saved_r[n] != knob.r:
                    raise ValueError(f"{path}: r mismatch for {n}: saved {saved_r[n]}, model {knob.r}")
                knob.delta_s.copy_(tensors[f"{n}.delta_s"].to(knob.delta_s.dtype))
                knob.delta_s_hack.copy_(tensors[f"{n}.delta_s_hack"].to(knob.delta_s.dtype))
        return meta

    def extra_repr(self) -> str:
        return f"modules={len(self._names)}, params={sum(k.r for k in self.modules_.values())}×2"
