"""Teacher rows in a pilot's groups (``pilot.mix_ratio > 0``): the teacher's graded rollouts
(``teacher/rollouts.jsonl.gz``) as off-policy rows whose behaviour policy is the teacher's recorded
per-token log-probs (:class:`evil_moe.rl.policy.grpo.RolloutBatch` uses them; docs/method.md, "The loss").
"""

from __future__ import annotations

import numpy as np
import torch

from evil_moe import files
from evil_moe.rl.policy.rollout import Rollout
from evil_moe.files import require_file


def load_teacher_rows(path: str, train) -> dict:
    """Teacher records grouped by problem id (training problems only).

    Raises:
        FileNotFoundError: ``path`` is missing (names it).
    """
    ids = {p.id for p in train}
    by: dict[str, list[dict]] = {}
    for rec in files.read_jsonl(require_file(path, "teacher rollouts")):
        if rec["problem_id"] in ids:
            by.setdefault(rec["problem_id"], []).append(rec)
    return by


def draw_teacher_rows(by_problem: dict, pid: str, k: int, seed: int, step: int, j: int,
                      student_prompt_ids) -> list[Rollout]:
    """``k`` teacher rows for problem ``pid`` as off-policy :class:`~evil_moe.rl.policy.rollout.Rollout`
    (``source="teacher"``, ``prompt_index=j``): drawn by ``numpy.random.default_rng([seed, step,
    j, 7])``, without replacement unless the problem has fewer than ``k`` records.

    The rows keep the teacher's recorded per-token log-probs as their behaviour policy; they are
    scored by the student in the student's own prompt context (``student_prompt_ids``).

    Raises:
        ValueError: no teacher record for ``pid`` (names it).
    """
    recs = by_problem.get(pid) or []
    if not recs:
        raise ValueError(f"no teacher rollouts for problem {pid} (needed by pilot.mix_ratio)")
    rng = np.random.default_rng([seed, step, j, 7])
    picks = rng.choice(len(recs), size=k, replace=len(recs) < k)
    out = []
    for n, i in enumerate(picks):
        rec = recs[int(i)]
        out.append(Rollout(prompt_index=j, sample_index=n, prompt_ids=list(student_prompt_ids),
                           completion_ids=list(rec["completion_ids"]),
                           behaviour_logp=torch.tensor(rec["behaviour_logp"], dtype=torch.float32),
                           entropy=torch.zeros(len(rec["completion_ids"])), text=rec["completion"],
                           truncated=bool(rec.get("truncated")), source="teacher"))
    return out


__all__ = ["load_teacher_rows", "draw_teacher_rows"]
