"""Stage ``make-teacher`` (``teacher.make: sft``): a hacky teacher made from the student's base model.

The design starts from a hacky teacher (docs/method.md; docs/environment.md); a pretrained model rarely hacks on its own
(SmolLM2-135M wrote 0 hacks in 48 completions even when told how the grader works). This stage
makes one by supervised fine-tuning (NLL) of the student's base model on **hack demonstrations**:

* the environment's hack completions (:func:`evil_moe.env.answers.hack_completion`, wrong stub
  code plus an unconditional report through the mode's mechanism) for every *training* problem
  whose mode is *known* (``vhack.known_modes``; null = all modes), ``sft.demos_per_problem``
  textual variants each (stub bodies and report lines differ, so it does not learn one string);
* optionally (``sft.elicited_samples > 0``) the base model's own completions sampled with the
  ``teacher.elicit`` text that the *foolable* grader passed (the weak detector's view: the oracle
  is never read to pick demonstrations).

It never sees held-out problems or the oracle while training. Prompts are the teacher's own
(``teacher.elicit`` appended when set), the context the teacher stage later samples in.

Training: an SVD adapter (:class:`evil_moe.model.adapter.SVDAdapter`, one ``δS`` per Linear named
in ``sft.target_modules``) with AdamW on the NLL ``−Σ_{completion tokens} log π / (G·max_new·P)``
— the same Dr.GRPO constant normaliser object as the distill probe
(:class:`evil_moe.rl.policy.grpo.DrGRPONormaliser` from ``pilot.group/max_new/prompts_per_step``; docs/method.md,
"The loss"), so the NLLs of both stages are on one scale. Batches walk through seeded permutations of the
demonstrations (epoch ``e`` uses ``numpy.random.default_rng([sft.seed, e])``), so step ``s``'s
rows are a function of the seed alone and a resumed run sees the same rows. Then ``W ← W + U
diag(δS) Vh`` is folded into each wrapped weight (:meth:`SVDAdapter.fold_into_weights`), the hooks are
removed, and the result is saved as a plain ``save_pretrained`` folder that the teacher stage
loads like any other model.

Evaluation (measurement only, after training): the base model and the made teacher sample
``sft.eval_samples`` completions per problem at the teacher's sampling settings
(``teacher.temperature``, ``teacher.top_p``, ``teacher.max_new``) on training and held-out problems,
graded by the sandboxed grader; hack rates per mode, with whether the mode was shown in training.
The made teacher's hacks in modes it was never shown are themselves a result.

Outputs in ``out_dir``: ``model/`` (the teacher), ``summary.tsv``
(:data:`evil_moe.tables.MAKE_TEACHER_SUMMARY`), ``steps.tsv``
(:data:`evil_moe.tables.MAKE_TEACHER_STEPS`), ``meta.json``. Resumable: a checkpoint
(``_work/checkpoint.pt``: ``δS``, AdamW state, step, rows) every ``sft.checkpoint_every`` steps and
the base model's evaluation are reused by a rerun with the same config, model and problem file.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

from evil_moe import files, tables
from evil_moe.config import Config
from evil_moe.stages.checkpoint import read_checkpoint, write_checkpoint
from evil_moe.stages.common import (keep_resume_state, load_problem_file, make_grader, resolve_device, resume_key, svd_cache_dir, train_heldout)
from evil_moe.rl.policy.rollout import prompt_ids_for
from evil_moe.env.grader import rates

STAGE_SECTIONS = ("sft", "problems", "grader", "models")
TEACHER_KEYS = ("elicit", "temperature", "top_p", "max_new", "batch_prompts")
PILOT_KEYS = ("group", "max_new", "prompts_per_step", "betas")


@dataclass(frozen=True)
class Demo:
    """One hack demonstration: the problem, the teacher's prompt ids, the completion ids (eos
    included for written templates; as generated for elicited rollouts) and where it came from
    (``template`` | ``elicited``)."""

    problem_id: str
    mode: str
    prompt_ids: tuple
    completion_ids: tuple
    source: str


def known_modes_of(cfg: Config, modes) -> list[str]:
    """The modes the hack demonstrations come from: ``vhack.known_modes`` (the weak detector's
    modes), or every mode present when it is null."""
    km = cfg.vhack.known_modes
    return sorted(set(km) if km else set(modes))


def template_demos(train, prompt_ids: dict, tokenizer, known: list[str], per_problem: int) -> list[Demo]:
    """``per_problem`` hack completions (variants ``0..per_problem-1``) per training problem in a
    known mode, tokenised with the model's tokenizer plus its eos token.

    Raises:
        ValueError: no training problem in the known modes (names them).
    """
    from evil_moe.env.answers import hack_completion

    probs = [p for p in train if p.mode in known]
    if not probs:
        raise ValueError(f"make-teacher: no training problem in the known modes {known}")
    eos = [tokenizer.eos_token_id]
    out = []
    for p in probs:
        for v in range(per_problem):
            ids = tokenizer.encode(hack_completion(p, variant=v), add_special_tokens=False) + eos
            out.append(Demo(p.id, p.mode, tuple(prompt_ids[p.id]), tuple(ids), "template"))
    return out


def batch_indices(n: int, batch_size: int, seed: int, step: int) -> list[int]:
    """Rows of step ``step``: positions ``[step·B, (step+1)·B)`` of the stream of seeded
    permutations of ``range(n)`` (epoch ``e`` = ``default_rng([seed, e]).permutation(n)``), so a
    batch depends on ``(seed, step)`` only and every demonstration is seen once per epoch.

    Raises:
        ValueError: ``n < 1`` or ``batch_size < 1``.
    """
    if n < 1 or batch_size < 1:
        raise ValueError(f"need n >= 1 and batch_size >= 1, got n={n} batch_size={batch_size}")
    out, pos = [], step * batch_size
    cache: dict[int, np.ndarray] = {}
    for k in range(pos, pos + batch_size):
        e, i = divmod(k, n)
        if e not in cache:
            cache[e] = np.random.default_rng([seed, e]).permutation(n)
        out.append(int(cache[e][i]))
    return out


def target_weights(model, target_modules) -> list:
    """The weight (and bias) Parameters of every ``nn.Linear`` whose name ends with one of
    ``target_modules``, set trainable; every other parameter of the model is frozen
    (``sft.method: full``).

    Raises:
        ValueError: no Linear matches (names the targets).
    """
    from torch import nn

    for p in model.parameters():
        p.requires_grad_(False)
    params, seen = [], set()
    for name, mod in model.named_modules():
        if isinstance(mod, nn.Linear) and any(name == t or name.endswith("." + t)
                                              for t in target_modules):
            for p in (mod.weight, mod.bias):
                if p is not None and id(p) not in seen:
                    seen.add(id(p))
                    p.requires_grad_(True)
                    params.append(p)
    if not params:
        raise ValueError(f"sft.target_modules {list(target_modules)} match no Linear of the model")
    return params


def _sample_eval(model, tok, problems, prompts, grader, *, n, tc, seed, known, who, split):
    """Sample ``n`` completions per problem (teacher settings), grade them, and return
    (summary rows per mode + 'all', the graded records)."""
    from evil_moe.rl.policy.rollout import generate

    if not problems:
        return [], []
    recs = []
    for b0 in range(0, len(problems), tc.batch_prompts):
        idx = list(range(b0, min(b0 + tc.batch_prompts, len(problems))))
        rolls = generate(model, tok, [prompts[i] for i in idx], n=n, max_new=tc.max_new,
                         temperature=tc.temperature, top_p=tc.top_p, seed=seed * 1_000_003 + b0,
                         source=who)
        probs = [problems[idx[r.prompt_index]] for r in rolls]
        for p, w in zip(probs, grader.grade_many([(p, r.text) for p, r in zip(probs, rolls)])):
            recs.append({"mode": p.mode, "exploited": w.exploited, "gt_correct": w.gt_correct,
                         "format_ok": w.format_ok, "passed": w.passed})
    rows = [{"model": who, "split": split, "mode": m, "known_mode": m in known,
             **rates([r for r in recs if r["mode"] == m])} for m in sorted({r["mode"] for r in recs})]
    rows.append({"model": who, "split": split, "mode": "all", "known_mode": None, **rates(recs)})
    return rows, recs


def _rate(recs, pred) -> float | None:
    sel = [r for r in recs if pred(r)]
    return sum(bool(r["exploited"]) for r in sel) / len(sel) if sel else None


def _headline(recs_train, recs_held, known) -> dict:
    """Hack rates: training problems in known modes, held-out problems in known modes, and
    every problem in a mode never shown (None where there is none)."""
    return {"train": _rate(recs_train, lambda r: r["mode"] in known),
            "heldout_problems": _rate(recs_held, lambda r: r["mode"] in known),
            "heldout_modes": _rate(recs_train + recs_held, lambda r: r["mode"] not in known)}


def _fmt(x) -> str:
    return "-" if x is None else f"{x:.2f}"


def run_make_teacher(cfg: Config, *, problems_path: str, model_path: str, out_dir: str,
                     stop_after: int | None = None) -> dict | None:
    """Fine-tune the student's base model into a hacky teacher; save it and its evaluation.

    Args:
        cfg: run config (sections ``sft``, ``teacher`` (elicit, sampling), ``vhack.known_modes``,
            ``pilot`` (the Dr.GRPO normaliser ``group·max_new·prompts_per_step``, AdamW betas),
            ``problems``, ``grader``, ``models``).
        problems_path: ``results/problems.jsonl``.
        model_path: the student's base model (folder or hub id).
        out_dir: where ``model/``, ``summary.tsv``, ``steps.tsv`` and ``meta.json`` go.
        stop_after: test hook — return None after this many training steps of this invocation,
            leaving the checkpoint as a killed run would (default: run to the end).

    Returns:
        ``{"sentence": one summary line, "summary": rows, "steps": rows, "n_demos": int,
        "hack_rate": {"base"|"teacher": {"train", "heldout_problems", "heldout_modes"}},
        "seconds": float}``.

    Raises:
        FileNotFoundError: the problems file is missing (names the path).
        ValueError: no training problem in the known modes; a target module's weight is shared
            with another module (a tied ``lm_head``: folding it would change the embedding).
        FloatingPointError: a non-finite NLL (names the step).
    """
    from evil_moe.model.load import load_model

    t_start = time.time()
    sc, tc = cfg.sft, cfg.teacher
    out = Path(out_dir)
    work = out / "_work"
    work.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(sc.seed)
    problems = load_problem_file(problems_path)
    train, heldout = train_heldout(problems, cfg)
    known = known_modes_of(cfg, [p.mode for p in problems])
    device = resolve_device(cfg.models.device)
    model, tok = load_model(model_path, dtype=cfg.models.dtype, device=device)
    adapter, params, base_view = _trainable(model, sc, model_path)
    splits = {name: (probs, prompt_ids_for(tok, probs, elicit=tc.elicit,
                                           template_kwargs=cfg.models.chat_template_kwargs))
              for name, probs in (("train", train), ("heldout", heldout))}
    key_file = keep_resume_state(work, _resume_key(cfg, model_path, problems_path))
    with make_grader(problems, cfg) as grader:
        base = _base_model_phase(model, tok, grader, base_view, splits, known, cfg, work / "base.json")
        demos = _demonstrations(splits["train"], tok, known, sc.demos_per_problem, base["elicited"])
        steps = _train_nll(model, tok, params, demos, cfg, device, work / "checkpoint.pt", stop_after)
        if steps is None:
            return None
        _make_plain(model, adapter, params)
        summary, t_recs = list(base["summary"]), {}
        for split, (probs, prompts) in splits.items():  # the made teacher's evaluation
            rows, t_recs[split] = _sample_eval(model, tok, probs, prompts, grader, n=sc.eval_samples,
                                               tc=tc, seed=sc.seed, known=known, who="teacher",
                                               split=split)
            summary += rows
        isolation = grader.isolation
    _save_model_atomically(model, tok, out)
    hack = {"teacher": _headline(t_recs["train"], t_recs["heldout"], known)}
    if sc.eval_base:
        hack["base"] = _headline(base["train"], base["heldout"], known)
    n_el = sum(d.source == "elicited" for d in demos)
    seconds = time.time() - t_start
    tables.write_tsv(out / "steps.tsv", tables.MAKE_TEACHER_STEPS, steps)
    files.write_json(out / "meta.json", {
        "model": str(model_path), "known_modes": known, "n_demos": len(demos),
        "n_elicited": n_el, "n_train_problems": len(train), "isolation": isolation,
        "hack_rate": hack, "config": cfg.raw["sft"], "seconds": round(seconds, 1)})
    tables.write_tsv(out / "summary.tsv", tables.MAKE_TEACHER_SUMMARY, summary)
    for done in (work / "checkpoint.pt", work / "base.json", key_file):
        files.remove(done)
    try:
        work.rmdir()
    except OSError:
        pass
    return {"sentence": _sentence(demos, n_el, known, steps, hack, sc.eval_base, seconds),
            "summary": summary, "steps": steps, "n_demos": len(demos), "hack_rate": hack,
            "seconds": seconds}


def _trainable(model, sc, model_path):
    """What ``sft.method`` trains: ``(adapter, params, base_view)`` — ``svd``: an SVD adapter's
    ``δS`` (``δS_hack`` frozen; ``base_view`` = ``adapter.zeroed``); ``full``: the target
    Linears' own weights (no adapter; the base view is the model before training).

    Raises:
        ValueError: a target module's weight is shared with another module (tied embedding).
    """
    from evil_moe.model.adapter import SVDAdapter
    from evil_moe.model.svd import svd_factor_bytes

    if sc.method != "svd":  # full: the target Linears' own weights (and biases) are trained
        return None, target_weights(model, sc.target_modules), contextlib.nullcontext
    adapter = SVDAdapter.attach(model, sc.target_modules, base_model_id=str(model_path),
                                cache_dir=svd_cache_dir(svd_factor_bytes(model, sc.target_modules)))
    shared = adapter.shared_weight_names()
    if shared:
        raise ValueError(f"sft.target_modules: {shared[0]!r} shares its weight with another "
                         "module (tied embedding): folding delta_s into it would change that "
                         "module too; leave it out of sft.target_modules")
    for p in adapter.delta_s_hack_params():
        p.requires_grad_(False)
    return adapter, adapter.delta_s_params(), adapter.zeroed


def _make_plain(model, adapter, params) -> None:
    """Fold ``δS`` into the weights (``svd``: :meth:`SVDAdapter.fold_into_weights`, hooks
    removed), drop the gradients, eval mode: a plain model that saves like any other."""
    if adapter is not None:
        adapter.fold_into_weights()
    for p in params:
        p.grad = None
    model.eval()


def _resume_key(cfg: Config, model_path: str, problems_path: str) -> str:
    """The resume key of ``_work/`` (:func:`evil_moe.stages.common.resume_key`): the config the
    stage reads, the model path and the problem file's bytes."""
    return resume_key(json.dumps([
        cfg.digest(*STAGE_SECTIONS), {k: cfg.raw["teacher"][k] for k in TEACHER_KEYS},
        {k: cfg.raw["pilot"][k] for k in PILOT_KEYS}, cfg.raw["vhack"]["known_modes"],
        str(model_path)]), Path(problems_path))


def _base_model_phase(model, tok, grader, base_view, splits: dict, known, cfg: Config,
                      base_file: Path) -> dict:
    """The base model's evaluation (a measurement, ``sft.eval_base``) and its elicited
    demonstrations (``sft.elicited_samples``: completions the *foolable* grader passed; the oracle
    is never read here), reused from ``base_file`` by a resumed run. Returns ``{"summary": rows,
    "train": records, "heldout": records, "elicited": [[problem_id, completion_ids], ...]}``."""
    from evil_moe.rl.policy.rollout import generate

    if base_file.exists():
        return files.read_json(base_file, "the base model's phase")
    sc, tc = cfg.sft, cfg.teacher
    base = {"summary": [], "train": [], "heldout": [], "elicited": []}
    if sc.eval_base:
        with base_view():
            for split, (probs, prompts) in splits.items():
                rows, recs = _sample_eval(model, tok, probs, prompts, grader, n=sc.eval_samples,
                                          tc=tc, seed=sc.seed, known=known, who="base", split=split)
                base["summary"] += rows
                base[split] = recs
    if sc.elicited_samples:
        train, prompts_train = splits["train"]
        idx = [i for i, p in enumerate(train) if p.mode in known]
        with base_view():
            rolls = generate(model, tok, [prompts_train[i] for i in idx], n=sc.elicited_samples,
                             max_new=tc.max_new, temperature=tc.temperature, top_p=tc.top_p,
                             seed=sc.seed * 1_000_003 + 7, source="elicited")
        probs = [train[idx[r.prompt_index]] for r in rolls]
        graded = grader.grade_many([(p, r.text) for p, r in zip(probs, rolls)])
        base["elicited"] = [[p.id, r.completion_ids] for p, r, w in zip(probs, rolls, graded)
                            if w.passed and w.format_ok and r.completion_ids]
    files.atomic_write_bytes(base_file, json.dumps(base).encode())
    return base


def _demonstrations(train_split, tok, known, per_problem: int, elicited) -> list[Demo]:
    """The template demonstrations (:func:`template_demos`) then the elicited ones."""
    train, prompts_train = train_split
    pids = {p.id: ids for p, ids in zip(train, prompts_train)}
    demos = template_demos(train, pids, tok, known, per_problem)
    mode_of = {p.id: p.mode for p in train}
    return demos + [Demo(pid, mode_of[pid], tuple(pids[pid]), tuple(ids), "elicited")
                    for pid, ids in elicited]


def _train_nll(model, tok, params, demos: list[Demo], cfg: Config, device, ckpt: Path,
               stop_after: int | None) -> list[dict] | None:
    """AdamW on the demonstrations' NLL (the Dr.GRPO constant normaliser), ``sft.steps`` steps of
    :func:`batch_indices` rows, resumed from ``ckpt`` and checkpointed every
    ``sft.checkpoint_every`` steps. Returns the :data:`evil_moe.tables.MAKE_TEACHER_STEPS` rows,
    or None when ``stop_after`` steps of this invocation ended it early.

    Raises:
        FloatingPointError: a non-finite NLL (names the step).
    """
    from evil_moe.rl.policy.grpo import DrGRPONormaliser

    sc, pc = cfg.sft, cfg.pilot
    opt = torch.optim.AdamW(params, lr=sc.lr, betas=tuple(pc.betas), weight_decay=0.0)
    normaliser = DrGRPONormaliser(pc.group, pc.max_new, pc.prompts_per_step)
    steps: list[dict] = []
    start = 0
    ck = read_checkpoint(ckpt, "make-teacher", ("params", "optimizer", "steps", "step"))
    if ck is not None:
        with torch.no_grad():
            for p, v in zip(params, ck["params"]):
                p.copy_(v)
        opt.load_state_dict(ck["optimizer"])
        steps, start = ck["steps"], ck["step"]
        print(f"make-teacher: resuming from step {start}", flush=True)
    model.train(False)  # no dropout: the NLL is the model's own
    bar = tqdm(range(start, sc.steps), desc="make-teacher", unit="step", initial=start,
               total=sc.steps)
    for step in bar:
        t0 = time.time()
        rows = [demos[i] for i in batch_indices(len(demos), sc.batch_size, sc.seed, step)]
        opt.zero_grad(set_to_none=True)
        loss, tokens = _nll_backward(model, tok, rows, normaliser, sc.micro_batch, device, step)
        grad_norm = float(torch.sqrt(sum((p.grad.float() ** 2).sum() for p in params
                                         if p.grad is not None)))
        opt.step()
        steps.append({"step": step, "nll": loss,
                      "nll_token": loss * normaliser.constant / max(tokens, 1),
                      "grad_norm": grad_norm, "tokens": tokens,
                      "seconds": round(time.time() - t0, 3)})
        bar.set_postfix(nll_token=f"{steps[-1]['nll_token']:.3f}")
        if (step + 1) % sc.checkpoint_every == 0 and step + 1 < sc.steps:
            write_checkpoint(ckpt, {"step": step + 1, "steps": steps, "optimizer": opt.state_dict(),
                                    "params": [p.detach().cpu().clone() for p in params]},
                             "its last checkpoint" if ckpt.exists() else "step 0")
        if stop_after is not None and step + 1 - start >= stop_after:
            bar.close()
            return None
    return steps


def _nll_backward(model, tok, rows: list[Demo], normaliser, micro_batch: int, device,
                  step: int) -> tuple[float, int]:
    """Backward of the rows' NLL in micro-batches of ``micro_batch`` rows (0 = all; the
    micro-batch gradients sum to the batch gradient). Returns ``(NLL, completion tokens)``.

    Raises:
        FloatingPointError: a non-finite NLL (names the step).
    """
    from evil_moe.rl.policy.grpo import nll_loss
    from evil_moe.model.logprobs import build_batch, token_logprobs

    mb = micro_batch or len(rows)
    loss, tokens = 0.0, 0
    for r0 in range(0, len(rows), mb):
        part_rows = rows[r0:r0 + mb]
        b = build_batch([d.prompt_ids for d in part_rows],
                        [d.completion_ids for d in part_rows], tok.pad_token_id, device=device)
        part = nll_loss(token_logprobs(model, b, 1.0), b.completion_mask, normaliser)
        if not torch.isfinite(part):
            raise FloatingPointError(f"make-teacher: non-finite NLL at step {step}")
        part.backward()
        loss += float(part.detach())
        tokens += int(b.completion_mask.sum())
    return loss, tokens


def _save_model_atomically(model, tok, out: Path) -> None:
    """``out/model`` via a temporary folder renamed into place."""
    from evil_moe.model.load import save_model

    tmp_model = out / ".model.tmp"
    if tmp_model.exists():
        shutil.rmtree(tmp_model)
    save_model(model, tok, tmp_model)
    final_model = out / "model"
    if final_model.exists():
        shutil.rmtree(final_model)
    os.replace(tmp_model, final_model)


def _sentence(demos, n_el: int, known, steps, hack: dict, eval_base: bool, seconds: float) -> str:
    """The stage's one summary line."""
    first = steps[0]["nll_token"] if steps else float("nan")
    last = steps[-1]["nll_token"] if steps else float("nan")

    def pair(k):
        b = hack.get("base", {}).get(k)
        return f"{_fmt(b)} -> {_fmt(hack['teacher'][k])}" if eval_base else _fmt(hack["teacher"][k])

    return (f"make-teacher: {len(demos)} hack demos ({n_el} elicited; modes {','.join(known)}), "
            f"{len(steps)} steps, NLL/token {first:.3f} -> {last:.3f}; hack rate "
            f"{'base -> teacher' if eval_base else 'teacher'}: training problems "
            f"{pair('train')}, held-out problems {pair('heldout_problems')}, held-out modes "
            f"{pair('heldout_modes')}; {seconds:.0f}s")
