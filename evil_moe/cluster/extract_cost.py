"""What the extract stage does, from the config: its pairs, completions and extractions
(:func:`extract_work`), and the host memory of its stored gradients; the job sizes
(:mod:`evil_moe.cluster.resources`) and the GPU memory model (:mod:`evil_moe.cluster.gpu_memory`)
read it.

**The extract job** is sized from what it does (:func:`extract_work`): the pairs of each kind
(hack-clean, clean-clean, hack-hack; from ``vhack.max_pairs``, the training problems of the known
modes and ``teacher.n``, or the answer templates), two completions each, every completion one
forward and backward of ``prompt + completion`` tokens in micro-batches of ``vhack.micro_batch``
sorted by length; then the checks: ``(1 + vhack.bootstrap)`` replicates, each extracting V once
for the signal, once from the clean-clean pairs, once per left-out mode and once per n-pairs curve
point, every module at once on the stored gradients' coordinates (``2 x pairs`` wide). Its
memory is one micro-batch of the longest rows (the longest prompt of the source plus the longest
completion: autograd's saved bytes per token, :func:`saved_bytes_per_token`, and the fp32 logits
of the completion, times :data:`BACKWARD_PEAK`) plus the stored gradients
(:func:`extract_store_bytes`); none of it grows with the replicates.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Mapping, Sequence

from evil_moe.cluster.shapes import (EXTRACT_TEMPLATE_TOKENS, PROMPT_TOKENS, PROMPT_TOKENS_MAX,
                                     ModelShape, adapter_linears, n_problems, stage_shape)

# The extract stage's checks (evil_moe/stages/extract.py, evil_moe/rl/vhack/stack.py): seconds per
# module per extraction of V in a bootstrap replicate, a fixed part and a part per stored
# coordinate (pairs x width), fitted to the measured runs of docs/job-sizes.md.
EXTRACTION_S_MODULE = 1e-4
EXTRACTION_S_COORD = 2e-8
# evil_moe.rl.vhack.stack.QR_CHUNK_BYTES (not imported: this module stays free of torch, the
# Snakefile imports it); tests/test_cluster_resources.py holds the two equal.
EXTRACT_QR_CHUNK_BYTES = 256 * 2**20
# A backward's peak over the tensors autograd saved for it (the gradients of the activations
# live beside them while they are freed layer by layer); fitted to the measured extract runs.
BACKWARD_PEAK = 1.5


@dataclass(frozen=True)
class ExtractWork:
    """What the extract stage does, from the config (upper bounds where the teacher's rollouts
    decide).

    Attributes:
        pairs: ``(hack-clean, clean-clean, hack-hack)`` pairs: templates give ``max_pairs``
            hack-clean pairs, one clean-clean pair per training problem of a known mode and three
            hack-hack ones (each at most ``max_pairs``); teacher rollouts at most ``n // 2`` per
            problem and kind.
        completions: rows whose NLL gradient is computed (two per pair), one forward and backward
            each in micro-batches of ``vhack.micro_batch``.
        row_tokens: mean tokens of a row (prompt + completion).
        longest_row, longest_completion: tokens of the longest row and completion (memory).
        extraction_pairs: hack-clean pairs on the extraction half of the problems.
        extractions: SVD extractions of V the checks do: ``(1 + vhack.bootstrap) x`` (the
            signal's, the clean-clean one's, one per left-out mode, one per n-pairs curve point).
        width: coordinates per module of the stored gradients (``min(2 x pairs, r)``).
    """

    pairs: tuple[int, int, int]
    completions: int
    row_tokens: float
    longest_row: int
    longest_completion: int
    extraction_pairs: int
    extractions: int
    width: int


def extract_work(cfg: Mapping, shape: ModelShape | None = None) -> ExtractWork:
    """The extract stage's :class:`ExtractWork` from the config (``vhack``, ``problems``,
    ``teacher``, ``adapter``)."""
    v, t, pr = cfg["vhack"], cfg["teacher"], cfg["problems"]
    source = pr["source"]
    modes = [pr["force_mode"]] if pr.get("force_mode") else list(pr["modes"])
    known = [m for m in modes if not v["known_modes"] or m in v["known_modes"]]
    train = n_problems(cfg) * (1 - pr["heldout_frac"])
    known_train = max(1, math.ceil(train * len(known) / max(1, len(modes)))) if known else 0
    cap = int(v["max_pairs"])
    prompt_mean, prompt_max = PROMPT_TOKENS[source], PROMPT_TOKENS_MAX[source]
    if v["source"] == "templates":
        pairs = (cap if known_train else 0, min(cap, known_train), min(cap, 3 * known_train))
        mean_c, long_c = EXTRACT_TEMPLATE_TOKENS[source]
    elif v["source"] == "authored":
        pairs, mean_c, long_c = _authored_pairs(cfg, known)
        fmt = "toy" if source == "toy" else "leetcode"  # the authored prompts' format
        prompt_mean, prompt_max = PROMPT_TOKENS[fmt], PROMPT_TOKENS_MAX[fmt]
    else:
        per = known_train * (int(t["n"]) // 2)
        pairs = (min(cap, per),) * 3
        mean_c = long_c = int(t["max_new"])
    n_pairs = sum(pairs)
    ext = max(1, round(pairs[0] * (1 - v["heldout_frac"])))
    lomo = len(known) if len(known) > 1 else 0
    curve = len({min(int(c), ext) for c in v["curve_pairs"]} | {ext})
    per_replicate = 1 + (1 if pairs[1] else 0) + lomo + curve
    s = shape or stage_shape(cfg, "extract")
    r_max = max((min(o, i) for o, i in adapter_linears(s, cfg["adapter"]["target_modules"])),
                default=s.hidden)
    return ExtractWork(pairs=pairs, completions=2 * n_pairs,
                       row_tokens=prompt_mean + mean_c,
                       longest_row=prompt_max + long_c, longest_completion=long_c,
                       extraction_pairs=ext, extractions=(1 + int(v["bootstrap"])) * per_replicate,
                       width=min(2 * n_pairs, r_max))


def _authored_pairs(cfg: Mapping, known: Sequence[str]) -> tuple[tuple[int, int, int], float, int]:
    """Pairs of each kind in the authored pairs file (``vhack.source: authored``; ``moe.pairs``
    or the bundled one, :func:`evil_moe.env.authored.load_authored`) in the run's format and
    known modes, and the mean and longest completion in tokens (its characters bound them: a
    byte-level BPE token is at least one character; + 1 for eos). Each problem gives its i-th
    hack against its i-th clean, and one clean-clean and one hack-hack pair per two of each."""
    from evil_moe.env.authored import load_authored

    fmt = "toy" if cfg["problems"]["source"] == "toy" else "leetcode"
    rows = load_authored((cfg.get("moe") or {}).get("pairs"), fmt=fmt, modes=list(known) or None)
    cap = int(cfg["vhack"]["max_pairs"])
    hc = min(cap, sum(len(a.pairs()) for a in rows))
    texts = [len(t) + 1 for a in rows for t in (*a.hacks, *a.cleans)] or [1]
    return ((hc, sum(len(a.cleans) // 2 for a in rows), sum(len(a.hacks) // 2 for a in rows)),
            sum(texts) / len(texts), max(texts))


def extract_store_bytes(cfg: Mapping, s: ModelShape, w: ExtractWork, *,
                         gradients_on_host: bool = True) -> float:
    """Host memory of extract's stored gradients: every completion's (fp32, all modules) and the
    pair differences (on the GPU when the model is: ``gradients_on_host`` False), and their
    coordinates stacked over modules (fp64: first, second and difference) with one QR chunk of
    the factorisation (always on the host)."""
    dims = adapter_linears(s, cfg["adapter"]["target_modules"])
    rank = sum(min(o, i) for o, i in dims)
    pairs = sum(w.pairs)
    grads = 4.0 * (w.completions + pairs) * rank if gradients_on_host else 0.0
    chunk = min(EXTRACT_QR_CHUNK_BYTES, 8.0 * 2 * pairs * rank)  # Z (fp64) and its R
    return grads + 8.0 * 3 * len(dims) * pairs * w.width + 2 * chunk

