"""The Slurm preflight's GPU checks (:mod:`evil_moe.cluster.slurm_check` calls them): which GPUs a
partition's nodes hold and how much memory each has, against ``models.gpu_mem_gb`` and the GPU
type or constraint the profile asks for, and whether vLLM imports in the Python the jobs run
when ``pilot.sampler`` is ``vllm``.

GPU memory comes from what Slurm shows of a node (``scontrol show node``, the same as
``sinfo -o "%P %G %f"``): a GRES type or a node feature that names it (``a100_80gb``,
``gpu80gb``), else the type's memory in :data:`GPU_MEMORY_GB` (``h100`` 80 GB; ``a100`` 40 or
80 GB). A type whose memory neither gives (``gpu:4`` without a type, an unknown name) is
reported as unknown, never guessed; only a GPU certainly smaller than ``models.gpu_mem_gb`` is a
mismatch (an ``a100`` that may be the 40 GB one is reported as "40 or 80 GB").
"""

from __future__ import annotations

import re
import subprocess
import sys
from dataclasses import dataclass
from typing import Callable, Mapping, Sequence

# Memory (GB) of common data-centre GPUs, by the GRES type or feature names sites give them:
# (low, high), two sizes where one name covers both (A100 40/80 GB, V100 16/32 GB).
GPU_MEMORY_GB: dict[str, tuple[int, int]] = {
    "h200": (141, 141), "h100": (80, 80), "gh200": (96, 96), "b200": (180, 180),
    "a100": (40, 80), "a40": (48, 48), "a6000": (48, 48), "l40s": (48, 48), "l40": (48, 48),
    "a10": (24, 24), "a10g": (24, 24), "l4": (24, 24), "v100": (16, 32), "t4": (16, 16),
    "mi300x": (192, 192), "mi250x": (128, 128), "mi250": (128, 128),
}
VLLM_PROBE_TIMEOUT_S = 300  # a first `import vllm` on a network filesystem takes tens of seconds


@dataclass(frozen=True)
class GpuKind:
    """One GPU type of a partition: its name (the GRES type; ``""`` untyped), the features of
    the nodes that hold it, how many nodes, and its memory (GB, ``(low, high)``; None: Slurm
    does not show it)."""

    name: str
    features: tuple[str, ...]
    nodes: int
    memory_gb: tuple[int, int] | None

    def describe(self) -> str:
        mem = self.memory_gb
        size = ("memory not shown" if mem is None else f"{mem[0]} GB" if mem[0] == mem[1]
                else f"{mem[0]} or {mem[1]} GB")
        return f"{self.name or 'untyped'} ({size}) on {self.nodes} node(s)"


def memory_gb(*names: str) -> tuple[int, int] | None:
    """The memory a GRES type or feature names: ``<n>gb`` / ``<n>g`` in it (``a100_80gb``,
    ``gpu80gb``, ``80g``), else :data:`GPU_MEMORY_GB`'s figures for a known type; None."""
    for name in names:
        m = re.search(r"(\d{2,3})\s*g(?:b|ib)?(?:$|[^a-z])", name.lower())
        if m:
            return int(m.group(1)), int(m.group(1))
    for name in names:
        key = re.sub(r"[^a-z0-9]", "", name.lower().removeprefix("nvidia").removeprefix("tesla"))
        if key in GPU_MEMORY_GB:
            return GPU_MEMORY_GB[key]
    return None


def gpu_kinds(nodes: Sequence[Mapping[str, str]]) -> tuple[GpuKind, ...]:
    """The GPU types of ``nodes`` (``scontrol show node -o`` fields: ``Gres``,
    ``AvailableFeatures``), one :class:`GpuKind` per type and feature set."""
    found: dict[tuple[str, tuple[str, ...]], int] = {}
    for node in nodes:
        feats = tuple(sorted(f for f in node.get("AvailableFeatures", "").split(",")
                             if f and f != "(null)"))
        for item in node.get("Gres", "").split(","):
            parts = re.sub(r"\(.*?\)", "", item).split(":")
            if parts[0] != "gpu" or not parts[-1].isdigit() or int(parts[-1]) == 0:
                continue
            kind = parts[1] if len(parts) == 3 else ""
            found[(kind, feats)] = found.get((kind, feats), 0) + 1
    return tuple(GpuKind(kind, feats, n, memory_gb(kind, *feats) if kind or feats else None)
                 for (kind, feats), n in sorted(found.items()))


def _satisfies(features: Sequence[str], constraint: str) -> bool | None:
    """Whether a node with ``features`` meets a Slurm constraint of ``|`` (or) and ``&`` (and)
    terms; None for a form this does not read (brackets, counts, parentheses)."""
    if re.search(r"[\[\]()*,]", constraint):
        return None
    have = set(features)
    return any(all(t.strip() in have for t in alt.split("&")) for alt in constraint.split("|"))


def check_gpu_memory(partition: str, kinds: Sequence[GpuKind], rules: Sequence[str],
                     cfg: Mapping, gpu_model: str | None, constraint: str | None) -> list[str]:
    """Mismatch lines for the GPU rules (``rules``) sent to ``partition``: a GPU type the jobs
    can land on whose memory is certainly below ``models.gpu_mem_gb`` (the memory model's; a
    mixed partition hands a job any of its types unless the profile's ``gpu_model`` or
    ``constraint`` narrows it), and a ``gpu_model`` the partition does not have."""
    want = float(cfg["models"]["gpu_mem_gb"])
    who = f"rule(s) {', '.join(rules)}"
    if gpu_model:
        chosen = [k for k in kinds if k.name == gpu_model]
        if not chosen:
            types = ", ".join(sorted({k.name for k in kinds if k.name})) or "none typed"
            return [f"partition '{partition}' ({who}): the profile's gpu_model '{gpu_model}' is not "
                    f"a GPU type there (its types: {types}; sinfo -o \"%P %G\"): set gpu_model "
                    "(EDIT) to one of them"]
    elif constraint:
        chosen = [k for k in kinds if _satisfies(k.features, constraint) is not False]
    else:
        chosen = list(kinds)
    small = [k for k in chosen if k.memory_gb is not None and k.memory_gb[1] < want]
    if not small:
        return []
    narrow = ("a GPU type of at least that size in the profile's gpu_model (EDIT; "
              "--gpus=<type>:1) or constraint (EDIT; node features)")
    return [f"partition '{partition}' ({who}): a job can get {k.describe()}, less than "
            f"models.gpu_mem_gb {cfg['models']['gpu_mem_gb']} GB, which the memory model plans "
            f"for: set {narrow}, or lower models.gpu_mem_gb (the config check then names the "
            "key to lower)" for k in small]


def vllm_import_failure(python: str = sys.executable,
                        run: Callable[..., subprocess.CompletedProcess] = subprocess.run) -> str | None:
    """None when ``import vllm`` works in ``python`` (a child process: importing it here would
    take the preflight's memory and seconds), else its last line of error."""
    try:
        proc = run([python, "-c", "import vllm"], capture_output=True, text=True,
                   timeout=VLLM_PROBE_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return f"no answer within {VLLM_PROBE_TIMEOUT_S} s"
    if proc.returncode == 0:
        return None
    lines = [ln.strip() for ln in (proc.stderr or proc.stdout or "").splitlines() if ln.strip()]
    return lines[-1] if lines else f"exit {proc.returncode}"


def check_vllm(cfg: Mapping, rules: Sequence[str], python: str = sys.executable,
               run: Callable[..., subprocess.CompletedProcess] = subprocess.run) -> list[str]:
    """A mismatch line when ``pilot.sampler`` is ``vllm``, the run plans jobs that sample
    (``rules``: pilots, calibration runs, re-evaluations) and vLLM does not import in the Python
    the jobs run (this one: Snakemake's jobs call the ``evil-moe`` beside it), naming the command
    that builds the GPU environment."""
    from evil_moe.rl.policy.vllm_sampler import GPU_ENV_COMMAND

    if cfg["pilot"]["sampler"] != "vllm" or not rules:
        return []
    why = vllm_import_failure(python, run)
    if why is None:
        return []
    return [f"pilot.sampler is vllm but vLLM does not import in the jobs' Python ({python}: {why}),"
            f" so rule(s) {', '.join(rules)} would stop at their start: build the GPU environment "
            f"with `{GPU_ENV_COMMAND}` and run slurm-check and snakemake from it (source "
            ".venv-gpu/bin/activate; docs/gpu.md), or set pilot.sampler: hf"]
