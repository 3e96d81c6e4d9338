"""The collapse rule of a pilot: a run whose policy collapsed is stopped at the step it is seen,
naming the step and the cause, and never judged by the gate.

A policy that collapsed writes no code the grader can run, so every reward is the same (0),
every group has zero variance and no gradient ever moves it back: the run goes on to its last
step with hack, pass and reward rates of 0.000, and a gate that read it as a result would
compare arms against a broken model. The rule reads ``steps.tsv`` (:data:`evil_moe.tables.STEPS`)
and measures each run against its own first step (step 0's rollouts are sampled from the policy
the run starts from, before any update), so that a weak model that seldom writes code, or one
that samples at another temperature, is not read as collapsed:

- **no parseable code**: for ``pilot.collapse_steps`` steps in a row no rollout's code parses
  (``parse_rate`` 0), and at step 0's parse rate ``p0`` so long a run of failures is improbable:
  ``(1 - p0) ** n`` below ``pilot.collapse_parse_p`` for the ``n`` student rollouts of those
  steps;
- **the sampling entropy blew up** (a policy that samples noise): ``entropy`` (nats/token)
  above step 0's times ``pilot.collapse_entropy_rise`` for ``pilot.collapse_steps`` steps in a
  row. A fall of the entropy is no sign of its own: the positive control sharpens as it learns
  (its entropy falls to a quarter of step 0's while its parse rate rises to 0.96), and a policy
  that collapsed onto noise it repeats shows as no parseable code;
- **a loss or a norm that is not finite**: ``loss``, ``grad_norm``, ``delta_s_norm`` or
  ``delta_s_hack_norm`` NaN or infinite, at once (a non-finite loss already stops the gradient
  step, :mod:`evil_moe.rl.trainer.gradient_step`).

The defaults and the measurements they come from are in ``config/schema.yaml`` (the keys'
descriptions) and ``docs/logs/results.md`` (2026-12-07). The pilot stage calls
:func:`check_collapse` after every step (``status.json`` then says ``invalid`` with the reason,
and the job fails as on a NaN); the compare stage applies :func:`collapsed` to every pilot's
``steps.tsv``, so a pilot that collapsed is invalid even where it was not stopped (a run before
the rule).
"""

from __future__ import annotations

import math
from typing import Mapping, Sequence

from evil_moe.rl.trainer.step import PilotInvalid

NON_FINITE = ("loss", "grad_norm", "delta_s_norm", "delta_s_hack_norm")  # steps.tsv columns


def _value(x) -> float | None:
    """A steps.tsv cell as a number: None where there is none (a missing column, an empty cell,
    None in a trainer's row), else ``float`` of it (NaN and infinity kept)."""
    if x is None or x == "":
        return None
    return float(x)


def student_rollouts(pc) -> int:
    """Student rollouts per step: ``(group - teacher rows) * prompts_per_step`` (the trainer's
    ``n_teacher = round(mix_ratio * group)``)."""
    return (pc.group - int(round(pc.mix_ratio * pc.group))) * pc.prompts_per_step


def collapsed(rows: Sequence[Mapping], pc) -> str | None:
    """The first step at which ``rows`` (``steps.tsv`` rows in step order from step 0: the
    trainer's dicts, or the file's cells) show a collapsed policy under the rule of ``pc`` (the
    config's ``pilot`` section; module docstring), as one sentence naming the step, the cause,
    the values and the config key; None when they never do. A column a row lacks is not judged
    (older tables, the compare tests' small ones).

    Example: ``"collapsed at step 3: no rollout's code parses at steps 1-3 (72 rollouts), though
    0.792 of step 0's did: at that rate so long a run has probability 8.9e-50, below
    pilot.collapse_parse_p 1e-06"``.
    """
    n_steps = int(pc.collapse_steps)
    first = rows[0] if rows else {}
    p0, e0 = _value(first.get("parse_rate")), _value(first.get("entropy"))
    for end, row in enumerate(rows):
        step = row.get("step", end)
        for col in NON_FINITE:
            v = _value(row.get(col))
            if v is not None and not math.isfinite(v):
                return f"collapsed at step {step}: {col} is {v} (not finite)"
        if end < n_steps:  # a window of steps after step 0
            continue
        window = rows[end + 1 - n_steps:end + 1]
        since = window[0].get("step", end + 1 - n_steps)
        parse = [_value(r.get("parse_rate")) for r in window]
        limit = pc.collapse_parse_p
        if limit is not None and p0 and all(v == 0 for v in parse):
            n = n_steps * student_rollouts(pc)
            chance = (1 - p0) ** n
            if chance < limit:
                return (f"collapsed at step {step}: no rollout's code parses at steps {since}-{step} ({n} "
                        f"rollouts), though {p0:.3f} of step 0's did: at that rate so long a run has "
                        f"probability {chance:.2g}, below pilot.collapse_parse_p {limit:g}")
        ent = [_value(r.get("entropy")) for r in window]
        rise = pc.collapse_entropy_rise
        if rise is not None and e0 and all(v is not None and v > e0 * rise for v in ent):
            return (f"collapsed at step {step}: the sampling entropy blew up to {min(ent):.3f} nats/token "
                    f"at least at steps {since}-{step}, above step 0's {e0:.3f} x "
                    f"pilot.collapse_entropy_rise {rise:g}")
    return None


def check_collapse(rows: Sequence[Mapping], pc) -> None:
    """Stop a run whose rows so far show a collapse (:func:`collapsed`).

    Raises:
        PilotInvalid: the reason, naming the step and the cause.
    """
    reason = collapsed(rows, pc)
    if reason is not None:
        raise PilotInvalid(reason)


__all__ = ["collapsed", "check_collapse", "student_rollouts", "NON_FINITE"]
