"""Pieces every stage shares: device choice, problem files, prompt encoding, policy loading.

Each stage reads and writes files only; nothing here calls another stage.
"""

from __future__ import annotations

import fnmatch
import hashlib
import os
from pathlib import Path

import torch

from evil_moe import files
from evil_moe.files import require_file
from evil_moe.config import Config


def resume_key(*parts: str | Path | None, length: int = 64) -> str:
    """The key a stage files its resume state under: SHA-256 over ``parts`` in order, hex, first
    ``length`` digits. A ``str`` part counts by its UTF-8 bytes, a :class:`~pathlib.Path` part by
    its file's bytes, ``None`` is skipped. Resume state is reused only when the key is the one it
    was written with (the same config, model and input files).

    Raises:
        FileNotFoundError: a ``Path`` part is not a readable file.
    """
    h = hashlib.sha256()
    for part in parts:
        if part is not None:
            h.update(part.read_bytes() if isinstance(part, Path) else part.encode())
    return h.hexdigest()[:length]


def keep_resume_state(work: Path, key: str, stale: str = "*") -> Path:
    """Keep the resume state in ``work`` only when it was written under ``key``
    (:func:`resume_key`): otherwise delete the files of ``work`` whose names match the glob
    ``stale`` and record ``key`` in ``work/key.txt``. Returns the key file (a finished stage
    removes it)."""
    key_file = work / "key.txt"
    if not key_file.exists() or key_file.read_text() != key:
        for old in work.iterdir():
            if old.is_file() and fnmatch.fnmatch(old.name, stale):
                files.remove(old)
        files.atomic_write_bytes(key_file, key.encode())
    return key_file


def resolve_device(name: str) -> torch.device:
    """``"auto"`` → ``cuda`` when available else ``cpu``; otherwise ``torch.device(name)``."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def set_threads(threads: int | None) -> None:
    """Set torch's intra-op thread count to the stage's config key (``pilot.threads``, ...).

    The thread count changes the order of torch's float reductions and so the numbers; taking it
    from the config (not from the executor's cores) makes local and Slurm runs identical.
    ``None``/0 leaves torch's default (all cores)."""
    if threads:
        torch.set_num_threads(max(1, int(threads)))


def use_threads(cfg: Config, section: str, threads: int | None = None) -> Config:
    """Apply a stage's thread count: ``threads`` (a CLI ``--threads``) overrides the config key
    ``{section}.threads`` exactly as ``--set {section}.threads=N`` would; torch is then set to
    the config's value.

    Returns:
        the config (with the override, so what is recorded and hashed is what ran).

    Raises:
        evil_moe.config.ConfigError: ``threads`` < 1.
    """
    from evil_moe.config import validate

    if threads is not None:
        raw = cfg.to_dict()
        raw[section]["threads"] = int(threads)
        cfg = Config(validate(raw))
    set_threads(getattr(cfg, section).threads)
    return cfg


def load_problem_file(path: str | os.PathLike):
    """Read ``results/problems.jsonl`` (written by ``evil-moe problems``) → ``list[Problem]``.

    Raises:
        FileNotFoundError: naming the path.
    """
    from evil_moe.env.problems import read_problems

    return read_problems(require_file(path, "problems file"))


def train_heldout(problems, cfg: Config):
    """Deterministic (train, held-out) split from ``problems.heldout_frac`` and ``problems.seed``."""
    from evil_moe.env.problems import split_heldout

    return split_heldout(problems, cfg.problems.heldout_frac, cfg.problems.seed)


# The largest SVD cache written without being asked for (fp32 U and Vh of the adapter's Linears):
# SmolLM2-135M's is 714 MB and saves ~14 s of SVD per job on 2 CPU cores; a 4B model's (~32 GB)
# is written only to a folder EVIL_MOE_SVD_CACHE names.
SVD_CACHE_DEFAULT_MAX_BYTES = 4 * 2**30


def svd_cache_dir(factor_bytes: int | None = None) -> Path | None:
    """The on-disk SVD cache shared by every job that loads the same base model.

    ``EVIL_MOE_SVD_CACHE`` set: that folder (on a shared filesystem for Slurm), or no disk cache
    when it is empty or ``off``. Unset: ``$XDG_CACHE_HOME/evil_moe/svd`` (``~/.cache/evil_moe/svd``)
    when the adapter's factors (``factor_bytes``, :func:`evil_moe.model.svd.svd_factor_bytes`;
    None = small) are at most :data:`SVD_CACHE_DEFAULT_MAX_BYTES`, else none. Safe by
    construction: entries are keyed by the weight's content hash (``weight_hash``) and written
    atomically, so a cache never changes a result, only the time to the first step.
    """
    env = os.environ.get("EVIL_MOE_SVD_CACHE")
    if env is not None:
        env = env.strip()
        return Path(env).expanduser() if env and env.lower() != "off" else None
    if factor_bytes is not None and factor_bytes > SVD_CACHE_DEFAULT_MAX_BYTES:
        return None
    base = os.environ.get("XDG_CACHE_HOME", "").strip()
    return (Path(base).expanduser() if base else Path.home() / ".cache") / "evil_moe" / "svd"


def load_policy(model_path: str, cfg: Config, *, init_adapter: str | None = None):
    """Load a model + tokenizer and attach the SVD adapter (δS, δS_hack zero or from a file).

    Returns:
        ``(model, tokenizer, adapter, device)``.

    Raises:
        FileNotFoundError: ``init_adapter`` given but missing (names the path).
    """
    from evil_moe.model.adapter import SVDAdapter
    from evil_moe.model.svd import svd_factor_bytes
    from evil_moe.model.load import load_model

    device = resolve_device(cfg.models.device)
    model, tok = load_model(model_path, dtype=cfg.models.dtype, device=device)
    targets = cfg.adapter.target_modules
    adapter = SVDAdapter.attach(model, targets, base_model_id=str(model_path),
                                cache_dir=svd_cache_dir(svd_factor_bytes(model, targets)))
    if init_adapter:
        adapter.load(require_file(init_adapter, "initial adapter"))
    return model, tok, adapter, device


def require_sampler(cfg: Config) -> None:
    """Refuse ``pilot.sampler: vllm`` where vLLM does not import, before a model is loaded
    (8 GB and minutes for nothing): :func:`evil_moe.rl.policy.vllm_sampler.require_vllm`.

    Raises:
        evil_moe.rl.policy.vllm_sampler.VLLMUnavailable: one line naming this Python and ``make gpu-env``.
    """
    if cfg.pilot.sampler == "vllm":
        from evil_moe.rl.policy.vllm_sampler import require_vllm

        require_vllm()


def make_grader(problems, cfg: Config):
    """The sandboxed :class:`~evil_moe.env.grader.Grader` with the run's ``grader`` section."""
    from evil_moe.env.grader import Grader

    g = cfg.grader
    return Grader(problems, format_bonus=g.format_bonus, pass_reward=g.pass_reward,
                  reward_rule=g.reward_rule,
                  timeout=g.timeout, memory_mb=g.memory_mb, workers=g.workers,
                  isolation=g.isolation, wall_timeout=g.wall_timeout)
