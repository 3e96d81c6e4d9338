"""Stage ``distill``: the distill probe — student NLL on teacher rows, watched by ``v_hack``.

The student's ``δS`` is NLL-trained on teacher completions (``distill.rows``: all rows, or hack
rows only) for ``distill.steps`` AdamW steps, scored in the student's own prompt context, with the
**same Dr.GRPO normaliser object as the pilot's loss** (constant ``G·max_new·P``;
docs/method.md, "The loss") so the numbers are comparable across stages. Each step logs the NLL, the gradient norm,
and the distill gradient's ``cin`` against ``v_hack`` next to its null baseline, ``frac_fired``
(R3) and ``coverage`` (R2): does imitating a hacky teacher push the student along ``v_hack``?

The replay analyser (``samples.tsv``): for every teacher row, the cosine of that row's own NLL
gradient (at ``δS = 0``) with ``v_hack`` — ``cos_contrib`` = mean over modules of
``Σᵢ (V g)ᵢ / ‖g‖`` (signed; ``> 0`` pushes hack-ward, as ``v_hack`` is oriented so that a loss
gradient along it favours hacking when descended). It answers "does v_hack light up on hacks more
than on clean rows?".

Outputs: ``steps.tsv`` (:data:`evil_moe.tables.DISTILL_STEPS`), ``samples.tsv``
(:data:`evil_moe.tables.DISTILL_SAMPLES`), ``student_adapter.safetensors`` (the distilled
student; pilots may warm-start from it with ``pilot.init: distill``).
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import torch

from evil_moe import files, tables
from evil_moe.config import Config
from evil_moe.stages.common import load_policy, load_problem_file, train_heldout
from evil_moe.rl.policy.rollout import prompt_ids_for
from evil_moe.files import require_file


def _signed_cos(vhack, names, grads) -> float:
    vals = []
    for n, g in zip(names, grads):
        V = vhack.V.get(n)
        if V is None or V.shape[0] == 0:
            continue
        gn = float(g.norm())
        if gn > 0:
            vals.append(float((V.to(g.dtype) @ g).sum()) / gn)
    return sum(vals) / len(vals) if vals else 0.0


def run_distill(cfg: Config, *, problems_path: str, rollouts_path: str, model_path: str,
                vhack_path: str, out_dir: str) -> dict:
    """Run the distill probe and write its tables and the distilled adapter.

    Args:
        cfg: run config (sections ``distill``, ``pilot`` (normaliser, temperature), ``adapter``,
            ``models``, ``problems``).
        problems_path, rollouts_path, model_path, vhack_path: inputs (student model, v_hack).
        out_dir: output folder.

    Returns:
        ``{"sentence": one-line summary, "steps": rows, "n_rows": ...}``.

    Raises:
        FileNotFoundError: a missing input (names the path).
        ValueError: no teacher row to train on (e.g. ``rows: hack`` and the teacher never hacked).
        FloatingPointError: a non-finite NLL (names the step).
    """
    from evil_moe.rl.policy.grpo import DrGRPONormaliser
    from evil_moe.model.logprobs import build_batch
    from evil_moe.rl.vhack.direction import VHack

    dc, pc = cfg.distill, cfg.pilot
    torch.manual_seed(dc.seed)
    problems = load_problem_file(problems_path)
    train, _ = train_heldout(problems, cfg)
    model, tok, adapter, device = load_policy(model_path, cfg)
    vhack = VHack.load(require_file(vhack_path, "v_hack")).to(device)
    prompts = prompt_ids_for(tok, train, template_kwargs=cfg.models.chat_template_kwargs)
    pids = {p.id: ids for p, ids in zip(train, prompts)}
    records = [r for r in files.read_jsonl(rollouts_path)
               if r["problem_id"] in pids and r["completion_ids"]]
    normaliser = DrGRPONormaliser(pc.group, pc.max_new, pc.prompts_per_step)

    def batch_of(rows):
        return build_batch([pids[r["problem_id"]] for r in rows], [r["completion_ids"] for r in rows],
                           tok.pad_token_id, device=device)

    samples = replay_samples(model, adapter, vhack, records, batch_of, normaliser, pc.temperature)
    out = Path(out_dir)
    tables.write_tsv(out / "samples.tsv", tables.DISTILL_SAMPLES, samples)
    train_rows = [r for r in records if r["exploited"]] if dc.rows == "hack" else records
    if not train_rows:
        raise ValueError(f"no teacher rows to distill on (distill.rows={dc.rows})")
    steps = _distill_steps(model, adapter, vhack, train_rows, batch_of, normaliser, cfg)
    tables.write_tsv(out / "steps.tsv", tables.DISTILL_STEPS, steps)
    adapter.save(out / "student_adapter.safetensors",
                 metadata={"stage": "distill", "rows": dc.rows, "steps": dc.steps})

    def mean(xs):
        return sum(xs) / len(xs) if xs else float("nan")

    hack_c = mean([s["cos_contrib"] for s in samples if s["exploited"]])
    clean_c = mean([s["cos_contrib"] for s in samples if not s["exploited"]])
    sentence = (f"distill: cin {mean([s['cin'] for s in steps]):.3f} (null "
                f"{mean([s['null_cin'] for s in steps]):.3f}), coverage "
                f"{mean([s['coverage'] for s in steps]):.2f}; cos_contrib hack {hack_c:+.3f} vs "
                f"clean {clean_c:+.3f} over {len(samples)} teacher rows")
    return {"sentence": sentence, "steps": steps, "n_rows": len(samples)}


def replay_samples(model, adapter, vhack, records: list[dict], batch_of, normaliser,
                   temperature: float) -> list[dict]:
    """The replay analyser at the adapter's current ``δS``: per teacher row, the signed cosine
    (``cos_contrib``, mean over modules) of that row's own NLL gradient with ``v_hack``
    (:data:`evil_moe.tables.DISTILL_SAMPLES` rows). ``batch_of(rows)`` builds the rows' batch."""
    from evil_moe.rl.policy.grpo import nll_loss
    from evil_moe.model.logprobs import token_logprobs

    from evil_moe.progress import bar

    names, params = adapter.names, adapter.delta_s_params()
    samples = []
    with bar(len(records), "distill: replay (cos_contrib per teacher row)", "row") as progress:
        for i, rec in enumerate(records):
            b = batch_of([rec])
            loss = nll_loss(token_logprobs(model, b, temperature), b.completion_mask, normaliser)
            grads = torch.autograd.grad(loss, params, allow_unused=True)
            grads = [torch.zeros_like(p) if g is None else g for p, g in zip(params, grads)]
            samples.append({"row": i, "problem_id": rec["problem_id"], "mode": rec["mode"],
                            "exploited": bool(rec["exploited"]), "gt_correct": bool(rec["gt_correct"]),
                            "cos_contrib": _signed_cos(vhack, names, grads)})
            progress.update(1)
    return samples


def _distill_steps(model, adapter, vhack, train_rows: list[dict], batch_of, normaliser,
                   cfg: Config) -> list[dict]:
    """``distill.steps`` AdamW steps of the NLL on ``distill.batch_size`` rows drawn without
    replacement per step (``numpy.random.default_rng(distill.seed)``), in micro-batches; each
    step's gradient measured against ``v_hack`` (:data:`evil_moe.tables.DISTILL_STEPS` rows).

    Raises:
        FloatingPointError: a non-finite NLL (names the step).
    """
    from evil_moe.rl.policy.grpo import nll_loss
    from evil_moe.model.logprobs import token_logprobs
    from evil_moe.rl.vhack.projection import project

    dc, pc = cfg.distill, cfg.pilot
    opt = torch.optim.AdamW(adapter.delta_s_params(), lr=dc.lr, betas=tuple(pc.betas), weight_decay=0.0)
    from evil_moe.progress import bar

    rng = np.random.default_rng(dc.seed)
    steps = []
    progress = bar(dc.steps, "distill: NLL steps", "step")
    for step in range(dc.steps):
        t0 = time.time()
        pick = rng.choice(len(train_rows), size=min(dc.batch_size, len(train_rows)), replace=False)
        rows = [train_rows[int(i)] for i in pick]
        opt.zero_grad(set_to_none=True)
        mb = dc.micro_batch or len(rows)
        loss = 0.0
        for r0 in range(0, len(rows), mb):  # micro-batch gradients sum to the batch gradient
            b = batch_of(rows[r0:r0 + mb])
            part = nll_loss(token_logprobs(model, b, pc.temperature), b.completion_mask, normaliser)
            if not torch.isfinite(part):
                raise FloatingPointError(f"distill: non-finite NLL at step {step}")
            part.backward()
            loss += float(part.detach())
        st = project(adapter, vhack, "measure")
        opt.step()
        steps.append({"step": step, "nll": loss, "grad_norm": st.grad_norm, "cin": st.cin,
                      "null_cin": st.null_cin, "frac_fired": st.frac_fired, "coverage": st.coverage,
                      "seconds": round(time.time() - t0, 3)})
        progress.update(1)
    progress.close()
    return steps
