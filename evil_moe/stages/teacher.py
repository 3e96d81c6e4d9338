"""Stage ``teacher``: pregenerate graded rollouts from a hacky teacher (the behaviour policy).

For each training problem (the held-out split is never touched), ``teacher.n`` completions are
sampled in batched ``generate`` calls (``teacher.batch_prompts`` problems per call). Every
completion is stored with its generated token ids and **the teacher's per-token log-probs of those
exact ids under the context it was sampled from** (the behaviour policy for any later use of the
row; docs/method.md, "The loss"), its text and its full grade.

Outputs (``out_dir``): ``rollouts.jsonl.gz`` (one record per completion, :func:`evil_moe.rl.policy.rollout.rollout_record`'s fields plus
``prompt_ids``, the *teacher's* prompt — it contains the ``elicit`` text when set) and
``summary.tsv`` (:data:`evil_moe.tables.TEACHER_SUMMARY`). Resumable: each batch is written to
``out_dir/_work/`` and skipped when the stage is rerun with the same config, model path and
problem file (a different one drops the stale parts); final files are written atomically last.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from tqdm import tqdm

from evil_moe import files, tables
from evil_moe.config import Config
from evil_moe.stages.common import (keep_resume_state, load_problem_file, make_grader, resolve_device, resume_key, train_heldout)
from evil_moe.rl.policy.rollout import prompt_ids_for, rollout_record
from evil_moe.env.grader import rates


def run_teacher(cfg: Config, *, problems_path: str, model_path: str, out_dir: str) -> dict:
    """Sample, grade and record teacher rollouts for every training problem.

    Args:
        cfg: run config (sections ``teacher``, ``problems``, ``grader``, ``models``).
        problems_path: ``results/problems.jsonl``.
        model_path: the teacher model directory (or hub id).
        out_dir: where ``rollouts.jsonl.gz`` and ``summary.tsv`` go.

    Returns:
        ``{"n": ..., "summary": [rows of summary.tsv], "seconds": ...}``.

    Raises:
        FileNotFoundError: the problems file is missing (names the path).
    """
    from evil_moe.model.load import load_model
    from evil_moe.rl.policy.rollout import generate

    t0 = time.time()
    tc = cfg.teacher
    out = Path(out_dir)
    work = out / "_work"
    work.mkdir(parents=True, exist_ok=True)
    problems = load_problem_file(problems_path)
    train, _ = train_heldout(problems, cfg)
    device = resolve_device(cfg.models.device)
    model, tok = load_model(model_path, dtype=cfg.models.dtype, device=device)
    prompts = prompt_ids_for(tok, train, elicit=tc.elicit,
                             template_kwargs=cfg.models.chat_template_kwargs)
    batches = [list(range(i, min(i + tc.batch_prompts, len(train))))
               for i in range(0, len(train), tc.batch_prompts)]
    # parts are reused only by a rerun with the same config, model path and problem file
    key = resume_key(json.dumps([cfg.digest("teacher", "problems", "grader", "models"),
                                 str(model_path)]), Path(problems_path))
    key_file = keep_resume_state(work, key, stale="part_*.jsonl")
    with make_grader(problems, cfg) as grader:
        for b, idx in enumerate(tqdm(batches, desc="teacher", unit="batch", mininterval=10, ascii=True)):
            part = work / f"part_{b:05d}.jsonl"
            if part.exists():
                continue  # resumed: this batch is done
            rolls = generate(model, tok, [prompts[i] for i in idx], n=tc.n, max_new=tc.max_new,
                             temperature=tc.temperature, top_p=tc.top_p,
                             seed=tc.seed * 1_000_003 + b, source="teacher")
            probs = [train[idx[r.prompt_index]] for r in rolls]
            rewards = grader.grade_many(list(zip(probs, [r.text for r in rolls])))
            recs = [rollout_record(r, p, w, step=-1, seed=tc.seed, arm="teacher")
                    for r, p, w in zip(rolls, probs, rewards)]
            files.atomic_write_bytes(part, "".join(json.dumps(x) + "\n" for x in recs).encode())
        isolation = grader.isolation
    records = []
    for b in range(len(batches)):
        records += files.read_jsonl(work / f"part_{b:05d}.jsonl")
    summary = [{"mode": m, **rates([r for r in records if r["mode"] == m])}
               for m in sorted({r["mode"] for r in records})]
    summary.append({"mode": "all", **rates(records)})
    files.write_jsonl_gz(out / "rollouts.jsonl.gz", records)
    tables.write_tsv(out / "summary.tsv", tables.TEACHER_SUMMARY, summary)
    files.write_json(out / "meta.json", {"isolation": isolation, "model": str(model_path),
                                          "n_problems": len(train), "config": cfg.raw["teacher"]})
    for b in range(len(batches)):
        files.remove(work / f"part_{b:05d}.jsonl")
    files.remove(key_file)
    try:
        work.rmdir()  # empty now: a finished stage leaves no resume state
    except OSError:
        pass
    return {"n": len(records), "summary": summary, "seconds": time.time() - t0}
