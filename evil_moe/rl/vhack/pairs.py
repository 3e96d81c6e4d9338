"""The (prompt, hack, clean) pairs ``v_hack`` is extracted from (docs/method.md, "The hack
direction"; docs/vhack.md), by source (``vhack.source``):

- ``teacher``: :func:`build_pairs` takes, per training problem whose mode the weak detector knows,
  a teacher hack and a teacher clean completion of the same prompt, round-robin over problems;
  :func:`same_kind_pairs` gives the clean−clean (and hack−hack) pairs of the empirical null;
- ``templates``: :func:`template_pairs` uses the environment's hack and clean answer templates
  (:func:`template_null_pairs` their same-kind pairs);
- ``authored``: :func:`authored_pairs` reads the hand-written pairs shipped in ``evil_moe/data``.

:func:`split_problems` splits the problems into the extraction and the held-out half.
"""

from __future__ import annotations

from evil_moe.config import Config
from evil_moe.rl.vhack.direction import Pair


def same_kind_pairs(records: list[dict], prompt_ids: dict, known_modes, kind: str,
                    max_pairs: int) -> list:
    """Pairs of two *different* completions of the same kind on the same problem (the empirical
    null of docs/method.md, "Projection"): ``kind`` ``hack`` (exploited) or ``clean`` (not a hack; the
    oracle-correct ones first, as :func:`build_pairs` picks its clean side).

    Stored as :class:`~evil_moe.rl.vhack.direction.Pair` with the first completion in ``hack_ids`` and the
    second in ``clean_ids`` (the names are positional here). Round-robin over problems in sorted
    id order, consecutive completions paired (1-2, 3-4, ...), at most ``max_pairs``. Returns
    ``[]`` when no problem has two completions of that kind.
    """

    by: dict[str, list[dict]] = {}
    for rec in _usable(records, prompt_ids, known_modes):
        if bool(rec["exploited"]) == (kind == "hack"):
            by.setdefault(rec["problem_id"], []).append(rec)
    if kind == "clean":  # correct ones first (stable)
        by = {pid: sorted(recs, key=lambda r: not r["gt_correct"]) for pid, recs in by.items()}
    queues = {pid: [Pair(list(prompt_ids[pid]), list(a["completion_ids"]), list(b["completion_ids"]),
                         mode=a["mode"], problem_id=pid)
                    for a, b in zip(recs[0::2], recs[1::2])
                    if list(a["completion_ids"]) != list(b["completion_ids"])]
              for pid, recs in sorted(by.items())}
    return _round_robin(queues, max_pairs)


def _usable(records, prompt_ids: dict, known_modes):
    """Records of the given problems and known modes with a non-empty completion."""
    for rec in records:
        if rec["problem_id"] in prompt_ids and rec["completion_ids"] and \
                (not known_modes or rec["mode"] in known_modes):
            yield rec


def _round_robin(queues: dict, max_pairs: int) -> list:
    pairs = []
    while len(pairs) < max_pairs and any(queues.values()):
        for pid in list(queues):
            if queues[pid] and len(pairs) < max_pairs:
                pairs.append(queues[pid].pop(0))
    return pairs


def build_pairs(records: list[dict], prompt_ids: dict, known_modes, max_pairs: int) -> list:
    """(hack, clean) :class:`~evil_moe.rl.vhack.direction.Pair` list from graded teacher records.

    Args:
        records: teacher rollout records (``problem_id, mode, completion_ids, exploited,
            gt_correct``).
        prompt_ids: ``{problem_id: student prompt ids}``; records of other problems are skipped.
        known_modes: modes to use (``None`` = all).
        max_pairs: cap on the number of pairs.

    Returns:
        pairs, round-robin over problems in sorted id order.

    Raises:
        ValueError: no pair can be formed (names the modes).
    """

    by: dict[str, dict[str, list]] = {}
    for rec in _usable(records, prompt_ids, known_modes):
        slot = by.setdefault(rec["problem_id"], {"mode": rec["mode"], "hack": [], "correct": [], "other": []})
        if rec["exploited"]:
            slot["hack"].append(rec)
        elif rec["gt_correct"]:
            slot["correct"].append(rec)
        else:
            slot["other"].append(rec)
    queues = {}
    for pid in sorted(by):
        s = by[pid]
        cleans = s["correct"] or s["other"]
        queues[pid] = [Pair(list(prompt_ids[pid]), list(h["completion_ids"]), list(c["completion_ids"]),
                            mode=s["mode"], problem_id=pid) for h, c in zip(s["hack"], cleans)]
    pairs = _round_robin(queues, max_pairs)
    if not pairs:
        raise ValueError(f"no (hack, clean) pair in the teacher rollouts for modes "
                         f"{known_modes or 'all'}: the teacher must produce both on some problem")
    return pairs


def template_pairs(problems, prompt_ids: dict, tokenizer, known_modes, max_pairs: int) -> list:
    """(hack, clean) pairs from the environment's answer templates (``vhack.source: templates``).

    For each problem (round-robin, known modes only): ``hack_completion(p, variant=i)`` vs
    ``clean_completion(p)``, tokenised with the student's tokenizer plus its eos token (these are
    written texts, not rollouts, so tokenising them is the only way to get ids).

    Raises:
        ValueError: no problem in the known modes.
    """
    from evil_moe.env.answers import clean_completion, hack_completion

    eos = [tokenizer.eos_token_id]
    probs = [p for p in problems if p.id in prompt_ids and (not known_modes or p.mode in known_modes)]
    if not probs:
        raise ValueError(f"no training problem in modes {known_modes}")
    pairs = []
    for i in range(max_pairs):
        p = probs[i % len(probs)]
        hack = tokenizer.encode(hack_completion(p, variant=i // len(probs)), add_special_tokens=False) + eos
        clean = tokenizer.encode(clean_completion(p), add_special_tokens=False) + eos
        pairs.append(Pair(list(prompt_ids[p.id]), hack, clean, mode=p.mode, problem_id=p.id))
    return pairs


def template_null_pairs(problems, prompt_ids: dict, tokenizer, known_modes, kind: str,
                        max_pairs: int) -> list:
    """Same-kind template pairs for the empirical null: ``clean`` = the clean answer with vs
    without its honest report; ``hack`` = hack variants ``i`` vs ``i + 1``. Round-robin over the
    problems in the known modes (positional ``hack_ids``/``clean_ids`` as in :func:`same_kind_pairs`).
    """
    from evil_moe.env.answers import clean_completion, hack_completion

    eos = [tokenizer.eos_token_id]
    probs = [p for p in problems if p.id in prompt_ids and (not known_modes or p.mode in known_modes)]
    enc = lambda text: tokenizer.encode(text, add_special_tokens=False) + eos  # noqa: E731
    pairs = []
    for i in range(min(max_pairs, len(probs) * (1 if kind == "clean" else 3))):
        p = probs[i % len(probs)]
        if kind == "clean":
            a, b = enc(clean_completion(p)), enc(clean_completion(p, with_tests=False))
        else:
            v = i // len(probs)
            a, b = enc(hack_completion(p, variant=v)), enc(hack_completion(p, variant=v + 1))
        if a != b:
            pairs.append(Pair(list(prompt_ids[p.id]), a, b, mode=p.mode, problem_id=p.id))
    return pairs


def authored_pairs(cfg: Config, tokenizer, known_modes) -> tuple[list, dict, dict]:
    """(hack, clean) pairs from the hand-authored pairs (``vhack.source: authored``;
    :mod:`evil_moe.env.authored`, the file ``moe.pairs``), in the run's prompt format (toy, or
    leetcode for LeetCode and HumanEval runs) and known modes: each problem's i-th hack against
    its i-th clean completion, and for the empirical null its two clean (and two hack)
    completions against each other. Tokenised with the student's tokenizer plus eos (written
    texts, not rollouts). Returns ``(pairs, null_pairs, prompt_ids)`` (``prompt_ids`` by the
    authored problems' ids, which no problem set shares).

    Raises:
        ValueError: no authored problem in the known modes and format.
    """
    from evil_moe.env.authored import load_authored
    from evil_moe.env.problems import build_messages
    from evil_moe.rl.policy.rollout import chat_prompt_ids

    fmt = "toy" if cfg.problems.source == "toy" else "leetcode"
    authored = load_authored(cfg.moe.pairs, fmt=fmt, modes=known_modes or None)
    if not authored:
        raise ValueError(f"no authored pair in format {fmt} and modes {known_modes}")
    enc = lambda text: tokenizer.encode(text, add_special_tokens=False) + [tokenizer.eos_token_id]  # noqa: E731
    pairs, nulls, pids = [], {"clean": [], "hack": []}, {}
    for a in authored:
        p = a.problem
        pids[p.id] = chat_prompt_ids(tokenizer, build_messages(p), cfg.models.chat_template_kwargs)
        pairs += [Pair(pids[p.id], enc(h), enc(c), mode=p.mode, problem_id=p.id) for h, c in a.pairs()]
        for kind, texts in (("clean", a.cleans), ("hack", a.hacks)):
            nulls[kind] += [Pair(pids[p.id], enc(x), enc(y), mode=p.mode, problem_id=p.id)
                            for x, y in zip(texts[0::2], texts[1::2])]
    return pairs[:cfg.vhack.max_pairs], nulls, pids


def split_problems(ids, heldout_frac: float, seed: int) -> tuple[set, set]:
    """Seeded split of problem ids into (extraction, held-out) sets; ``heldout_frac`` of them
    (rounded, at least one when ``heldout_frac > 0`` and there are two or more ids) are held out."""
    import numpy as np

    ids = sorted(set(ids), key=str)
    n_held = int(round(heldout_frac * len(ids)))
    if heldout_frac > 0 and len(ids) >= 2:
        n_held = min(max(n_held, 1), len(ids) - 1)
    order = np.random.default_rng([seed, 17]).permutation(len(ids))
    held = {ids[i] for i in order[:n_held]}
    return set(ids) - held, held
