"""Pieces every stage shares: device choice, problem files, prompt encoding, policy loading.

Each stage reads and writes files only; nothing here calls another stage.
"""

from __future__ import annotations

import fnmatch
import hashlib
import os
from pathlib import Path
from typing import Sequence

import torch

from evil_moe import tables
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
                old.unlink()
        tables.atomic_write_bytes(key_file, key.encode())
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


def require_file(path: str | os.PathLike, what: str) -> Path:
    """Return ``Path(path)``; raise ``FileNotFoundError`` naming ``what`` and the path if absent."""
    p = Path(path)
    if not p.exists():
        raise FileNotFoundError(f"{what} not found: {p}")
    return p


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


def prompt_ids_for(tokenizer, problems: Sequence, elicit: str = "") -> list[list[int]]:
    """Chat-template token ids of each problem's prompt (computed once per run, never re-tokenised).

    ``elicit`` (teacher only) is appended to the user message.
    """
    from evil_moe.env.problems import build_messages
    from evil_moe.rl.rollout import chat_prompt_ids

    out = []
    for p in problems:
        messages = build_messages(p)
        if elicit:
            messages = [dict(m) for m in messages]
            messages[-1]["content"] = messages[-1]["content"] + "\n\n" + elicit
        out.append(chat_prompt_ids(tokenizer, messages))
    return out


def svd_cache_dir() -> Path | None:
    """The on-disk SVD cache shared by every job that loads the same base model: the folder in
    the ``EVIL_MOE_SVD_CACHE`` environment variable, or None (no disk cache) when it is unset or
    empty. Opt-in because it is large: fp32 ``U`` and ``Vh`` take about twice the model's
    fp32 size (SmolLM2-135M: 714 MB, saving ~14 s of SVD per job on 2 CPU cores). A cache, not
    an output: entries are keyed by the weight's content hash, so it never changes a result."""
    env = os.environ.get("EVIL_MOE_SVD_CACHE", "")
    return Path(env).expanduser() if env.strip() else None


def load_policy(model_path: str, cfg: Config, *, init_adapter: str | None = None):
    """Load a model + tokenizer and attach the SVD adapter (δS, δS_hack zero or from a file).

    Returns:
        ``(model, tokenizer, adapter, device)``.

    Raises:
        FileNotFoundError: ``init_adapter`` given but missing (names the path).
    """
    from evil_moe.model.adapter import SVDAdapter
    from evil_moe.model.load import load_model

    device = resolve_device(cfg.models.device)
    model, tok = load_model(model_path, dtype=cfg.models.dtype, device=device)
    adapter = SVDAdapter.attach(model, cfg.adapter.target_modules, base_model_id=str(model_path),
                                cache_dir=svd_cache_dir())
    if init_adapter:
        adapter.load(require_file(init_adapter, "initial adapter"))
    return model, tok, adapter, device


def make_grader(problems, cfg: Config):
    """The sandboxed :class:`~evil_moe.env.grader.Grader` with the run's ``grader`` section."""
    from evil_moe.env.grader import Grader

    g = cfg.grader
    return Grader(problems, format_bonus=g.format_bonus, pass_reward=g.pass_reward,
                  timeout=g.timeout, memory_mb=g.memory_mb, workers=g.workers,
                  isolation=g.isolation, wall_timeout=g.wall_timeout)


def code_parses(code: str | None) -> bool:
    """True when ``code`` (extracted from a completion) is non-empty and parses with ``ast``."""
    import ast

    if not code:
        return False
    try:
        ast.parse(code)
        return True
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return False


def rollout_record(rollout, problem, reward, **extra) -> dict:
    """One JSONL record per completion (DESIGN.md): ids, behaviour log-probs (the temperature-scaled
    distribution training uses) and sampler log-probs (the processed distribution the sampler drew
    from; None for rows not sampled here), text, full grade."""
    rec = {
        "problem_id": problem.id,
        "mode": problem.mode,
        "completion": rollout.text,
        "prompt_ids": list(rollout.prompt_ids),
        "completion_ids": list(rollout.completion_ids),
        "behaviour_logp": [round(float(x), 6) for x in rollout.behaviour_logp.tolist()],
        "sampler_logp": None if getattr(rollout, "sampler_logp", None) is None
        else [round(float(x), 6) for x in rollout.sampler_logp.tolist()],
        "truncated": bool(rollout.truncated),
        "source": rollout.source,
        "reward": reward.reward,
        "passed": reward.passed,
        "gt_correct": reward.gt_correct,
        "exploited": reward.exploited,
        "format_ok": reward.format_ok,
        "error": reward.error,
    }
    rec.update(extra)
    return rec


def rates(records: Sequence[dict]) -> dict:
    """hack / pass / format rates (fractions) and n of graded records (dicts with the Reward fields)."""
    n = len(records)
    if n == 0:
        return {"n": 0, "hack_rate": None, "pass_rate": None, "format_rate": None}
    return {
        "n": n,
        "hack_rate": sum(bool(r["exploited"]) for r in records) / n,
        "pass_rate": sum(bool(r["gt_correct"]) for r in records) / n,
        "format_rate": sum(bool(r["format_ok"]) for r in records) / n,
    }
