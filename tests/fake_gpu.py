"""A fake accelerator for CPU tests: tensors on the device ``fakegpu`` hold real values (computed
by the CPU kernels) and obey the device rules CUDA's eager kernels enforce, so that a CPU test
can run the GPU path of a step end to end and fail where a CUDA run would stop at a mix of
devices.

How: PyTorch's Python backend for its ``PrivateUse1`` dispatch key
(``torch.utils.backend_registration._setup_privateuseone_for_python_backend``, renamed
``fakegpu``: it registers the device guard the autograd engine needs for a non-CPU device, which
``torch._subclasses.fake_tensor.FakeTensorMode``'s ``cuda`` tensors lack on a CPU-only build: their
backward aborts with "PyTorch is not linked with support for cuda devices"). A tensor on
``fakegpu`` is a :class:`FakeGpuTensor`, a wrapper subclass around a CPU tensor; every operator
(:class:`FakeGpuMode` for the ones Python code calls, the backend's own kernels for the few that
PyTorch's C++ calls with the Python key excluded, e.g. ``torch.tensor(..., device=...)``)
checks its arguments' devices, runs on the CPU tensors inside, and wraps the results on
``fakegpu`` when any input (or the ``device`` argument) was there.

The device rules, as eager CUDA (and ``FakeTensor._find_common_device``): every tensor argument
of an operator on one device, except 0-dim CPU tensors (Python scalars' tensors), the copies
between devices (``copy_``, ``_to_copy``: ``.to()``, ``.cpu()``) and the indices of the indexing
operators (CUDA accepts CPU indices); ``.numpy()`` of a ``fakegpu`` tensor raises as a CUDA one
does, ``.item()`` and ``.tolist()`` work (a synchronising copy on CUDA). A violation raises
:class:`DeviceMix` naming the operator and the arguments' shapes and devices.

What it cannot show: anything of CUDA itself — its kernels and their numerics (bf16 matmuls,
the fused attention kernels: the step runs the CPU kernels), streams and asynchrony, memory (use
:mod:`evil_moe.cluster.gpu_memory` and ``benchmarks/gpu_pilot.py``), CUDA graphs, vLLM, ``torch.cuda``
calls, a generator on the wrong device (a CPU generator drawing into a ``fakegpu`` tensor works
here, not on CUDA), and code that branches on ``device.type == "cuda"`` takes its other branch
(the package has none: its only test is ``device.type == "cpu"`` in the shared-prompt attention,
whose non-CPU branch runs here as on CUDA).
"""

from __future__ import annotations

import contextlib

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten, tree_map

NAME = "fakegpu"
aten = torch.ops.aten

# Operators whose tensor arguments may sit on different devices (the copies between devices).
CROSS_DEVICE = {aten.copy_.default, aten._to_copy.default, aten._copy_from.default,
                aten._copy_from_and_resize.default, aten._foreach_copy.default}
# Indexing operators: the indices (args[1]) may stay on the CPU, the rest may not.
INDEXING = {aten.index.Tensor, aten.index_put_.default, aten.index_put.default,
            aten._index_put_impl_.default}


class DeviceMix(RuntimeError):
    """An operator got tensors on the CPU and on the accelerator (CUDA would raise)."""


def _register() -> torch.device:
    """The ``fakegpu`` device, its Python backend registered once per process."""
    from torch.utils import backend_registration

    if torch._C._get_privateuse1_backend_name() != NAME:
        backend_registration._setup_privateuseone_for_python_backend(NAME)
        lib = torch.library.Library("aten", "IMPL")  # kept alive by the module global below
        for op in (aten.empty_strided.default, aten.empty.memory_format, aten.copy_.default,
                   aten._copy_from.default, aten._copy_from_and_resize.default,
                   aten._local_scalar_dense.default, aten._to_copy.default):
            lib.impl(op._schema.name.split("::")[1] + (f".{op._overloadname}"
                                                       if op._overloadname != "default" else ""),
                     (lambda f: lambda *a, **k: _run(f, a, k))(op), "PrivateUse1")
        _LIBS.append(lib)
    return torch.device(NAME, 0)


_LIBS: list = []


class FakeGpuTensor(torch.Tensor):
    """A tensor on ``fakegpu``: ``elem`` holds its values on the CPU."""

    elem: torch.Tensor

    @staticmethod
    def __new__(cls, elem: torch.Tensor):
        return torch.Tensor._make_wrapper_subclass(
            cls, elem.shape, strides=elem.stride(), storage_offset=elem.storage_offset(),
            dtype=elem.dtype, layout=elem.layout, device=DEVICE, requires_grad=elem.requires_grad)

    def __init__(self, elem: torch.Tensor):
        self.elem = elem

    __torch_function__ = torch._C._disabled_torch_function_impl

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        return _run(func, args, kwargs or {})

    def tolist(self):
        return self.elem.tolist()

    def __deepcopy__(self, memo):  # a copy of the values on the device (nn.Parameter kept one)
        out = FakeGpuTensor(self.elem.detach().clone()).requires_grad_(self.requires_grad)
        if getattr(self, "_is_param", False):
            out._is_param = True
        memo[id(self)] = out
        return out

    def data_ptr(self):  # the CPU values' address: tensors that share memory share it
        return self.elem.data_ptr()

    def numpy(self, *args, **kwargs):
        raise TypeError(f"can't convert {NAME}:0 device type tensor to numpy. Use Tensor.cpu() to "
                        "copy the tensor to host memory first.")

    def __array__(self, *args, **kwargs):
        self.numpy()

    def __repr__(self):
        return f"FakeGpuTensor({self.elem!r})"


def _check(func, args, kwargs) -> None:
    """Raise :class:`DeviceMix` when ``func``'s tensor arguments mix the CPU and ``fakegpu``
    beyond what CUDA allows (module docstring)."""
    if func in CROSS_DEVICE:
        return
    checked = [args[0], *args[2:]] if func in INDEXING else [args, kwargs]
    flat, _ = tree_flatten(checked)
    tensors = [t for t in flat if isinstance(t, torch.Tensor)]
    devices = {t.device.type for t in tensors if not (t.device.type == "cpu" and t.dim() == 0)}
    if len(devices) > 1:
        raise DeviceMix(f"{func}: tensors on the CPU and on the accelerator: "
                        + ", ".join(f"{tuple(t.shape)} on {t.device.type}" for t in tensors))


def _run(func, args, kwargs):
    """``func`` on the CPU tensors inside, its results on ``fakegpu`` when an input (or the
    ``device`` argument) is; an input returned as is (in-place, ``out=``) keeps its wrapper."""
    _check(func, args, kwargs)
    flat, _ = tree_flatten((args, kwargs))
    on_gpu = any(isinstance(t, FakeGpuTensor) for t in flat)
    if kwargs.get("device") is not None:
        on_gpu = torch.device(kwargs["device"]).type == NAME
        kwargs = dict(kwargs, device=torch.device("cpu"))
    wrappers = {id(t.elem): t for t in flat if isinstance(t, FakeGpuTensor)}
    unwrap = lambda t: t.elem if isinstance(t, FakeGpuTensor) else t  # noqa: E731
    out = func(*tree_map(unwrap, args), **tree_map(unwrap, kwargs))

    def wrap(t):
        if not isinstance(t, torch.Tensor):
            return t
        if id(t) in wrappers:
            return wrappers[id(t)]
        return FakeGpuTensor(t) if on_gpu and t.device.type == "cpu" else t

    return tree_map(wrap, out)


class FakeGpuMode(TorchDispatchMode):
    """Routes every operator called while active through :func:`_run`: factory functions with
    ``device="fakegpu"`` (no tensor argument to dispatch on) among them."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        return _run(func, args, kwargs or {})


DEVICE = _register()


@contextlib.contextmanager
def fake_gpu():
    """The ``fakegpu`` device while the block runs (yielded), every operator checked; the autograd
    engine runs the backward on the calling thread (as in ``FakeTensorMode``'s own use)."""
    with FakeGpuMode(), torch.autograd.set_multithreading_enabled(False):
        yield DEVICE
