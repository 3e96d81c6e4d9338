"""Stage ``extract``: the hack direction ``v_hack`` and its two controls.

Pairs (science.md §3): for each training problem whose mode the weak detector knows
(``vhack.known_modes``, or ``--known-modes`` for a leave-one-mode-out fold), a teacher hack
(``exploited``) and a teacher clean completion (oracle-correct and not a hack; falling back to
any non-hack when the problem has no correct one) of the same prompt. Pairs are taken
round-robin over problems (so no problem dominates), up to ``vhack.max_pairs``. Completions keep
their generated token ids; they are scored in the *student's* prompt context (the teacher's
``elicit`` text is not part of it).

With ``vhack.source: templates`` the pairs are instead the environment's hack and clean answer
templates for each training problem (:func:`template_pairs`).

Per module, ``D = ∇NLL(hack) − ∇NLL(clean)`` on the student (δS = 0) with the pilot's Dr.GRPO
normaliser, top-k right singular vectors, majority-vote orientation (:mod:`evil_moe.vhack`).

Outputs in ``out_dir``: ``{name}_hack.safetensors`` (v_hack), ``{name}_random.safetensors``
(random orthonormal V, same k per module), ``{name}_shuffled.safetensors`` (labels swapped per
pair at random) and ``{name}.tsv`` (:data:`evil_moe.tables.VHACK`).
"""

from __future__ import annotations

from pathlib import Path

from evil_moe import tables
from evil_moe.config import Config
from evil_moe.stages.common import load_policy, load_problem_file, prompt_ids_for, train_heldout


def build_pairs(records: list[dict], prompt_ids: dict, known_modes, max_pairs: int) -> list:
    """(hack, clean) :class:`~evil_moe.vhack.Pair` list from graded teacher records.

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
    from evil_moe.vhack import Pair

    by: dict[str, dict[str, list]] = {}
    for rec in records:
        pid = rec["problem_id"]
        if pid not in prompt_ids or (known_modes and rec["mode"] not in known_modes):
            continue
        if not rec["completion_ids"]:
            continue
        slot = by.setdefault(pid, {"mode": rec["mode"], "hack": [], "correct": [], "other": []})
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
    pairs = []
    while len(pairs) < max_pairs and any(queues.values()):
        for pid in list(queues):
            if queues[pid] and len(pairs) < max_pairs:
                pairs.append(queues[pid].pop(0))
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
    from evil_moe.env.loopholes import clean_completion, hack_completion
    from evil_moe.vhack import Pair

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


def run_extract(cfg: Config, *, problems_path: str, rollouts_path: str, model_path: str,
                out_dir: str, name: str = "main", known_modes=None) -> dict:
    """Extract ``v_hack`` and the ``random`` / ``shuffled`` controls; write them and a TSV.

    Args:
        cfg: run config (sections ``vhack``, ``pilot`` (normaliser, temperature), ``adapter``,
            ``models``, ``problems``).
        problems_path, rollouts_path, model_path: inputs (student model).
        out_dir, name: outputs ``{out_dir}/{name}_{hack,random,shuffled}.safetensors`` and
            ``{out_dir}/{name}.tsv``.
        known_modes: overrides ``vhack.known_modes`` (leave-one-mode-out folds).

    Returns:
        ``{"n_pairs", "modes", "files"}``.

    Raises:
        FileNotFoundError: a missing input (names the path). ValueError: no pair.
    """
    from evil_moe.grpo import DrGRPONormaliser
    from evil_moe.projection import null_cin
    from evil_moe.vhack import extract_vhack, pair_gradients, random_vhack

    vc, pc = cfg.vhack, cfg.pilot
    modes = list(known_modes) if known_modes else (list(vc.known_modes) if vc.known_modes else None)
    problems = load_problem_file(problems_path)
    train, _ = train_heldout(problems, cfg)
    model, tok, adapter, _ = load_policy(model_path, cfg)
    pids = {p.id: ids for p, ids in zip(train, prompt_ids_for(tok, train))}
    if vc.source == "templates":
        pairs = template_pairs(train, pids, tok, modes, vc.max_pairs)
    else:
        pairs = build_pairs(tables.read_jsonl(rollouts_path), pids, modes, vc.max_pairs)
    normaliser = DrGRPONormaliser(pc.group, pc.max_new, pc.prompts_per_step)
    D = pair_gradients(model, adapter, pairs, normaliser, temperature=pc.temperature)
    used = sorted({p.mode for p in pairs})
    meta = {"model": str(model_path), "config": cfg.digest("vhack", "pilot", "adapter"),
            "source": vc.source}
    v = extract_vhack(D, vc.k, ratio_floor=vc.ratio_floor, quantile_floor=vc.quantile_floor,
                      modes=used, meta=meta)
    out = Path(out_dir)
    files = {
        "hack": v,
        "random": random_vhack(v, seed=vc.seed),
        "shuffled": extract_vhack(D, vc.k, ratio_floor=vc.ratio_floor,
                                  quantile_floor=vc.quantile_floor, control="shuffled",
                                  seed=vc.seed, modes=used, meta=meta),
    }
    written = []
    for kind, vh in files.items():
        path = out / f"{name}_{kind}.safetensors"
        vh.save(path)
        written.append(str(path))
    rows = []
    for mod in v.names:
        s = v.singular_values[mod].tolist()
        k = int(v.V[mod].shape[0])
        rows.append({"module": mod, "k": k, "r": v.r[mod], "sigma_1": s[0] if s else None,
                     "sigma_2": s[1] if len(s) > 1 else None, "null_cin": null_cin(k, v.r[mod]) if k else None})
    tables.write_tsv(out / f"{name}.tsv", tables.VHACK, rows)
    return {"n_pairs": len(pairs), "modes": used, "files": written}
