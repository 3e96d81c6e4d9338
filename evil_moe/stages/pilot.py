"""Stage ``pilot``: one Dr.GRPO training run of one arm and one seed.

Each step, top to bottom (the formulas are in :mod:`evil_moe.grpo` and :mod:`evil_moe.projection`):

1. **prompts** — ``prompts_per_step`` training problems from the prompt sampler, which depends on
   ``(seed, step)`` only (its own RNG, independent of model sampling), so for a given seed every
   arm sees the same prompts in the same order (paired design);
2. **rollouts** — ``group`` student completions per prompt in ONE batched ``generate`` with the
   adapter merged into the weights (plus, when ``mix_ratio > 0``, teacher rows of the same
   problems, carrying the teacher's recorded log-probs as their behaviour policy);
3. **grade** — all completions in parallel in the sandbox; reward = foolable grade (the oracle is
   logged, never used);
4. **advantages** — ``A = R − mean(R)`` per group; zero-variance groups are counted and skipped
   (no forward for them);
5. **loss** — Dr.GRPO (constant normaliser ``G·max_new·P``), one forward + backward;
6. **project** — per arm: ``vanilla`` measures only; ``erase`` removes the hack-ward gradient along
   ``v_hack``; ``route`` moves it into ``δS_hack``; ``random_v`` erases along a random V (control).
   ``cin`` is always measured against the real ``v_hack``. With ``pilot.project_update`` the
   projection applies to the AdamW update after the step instead (route: ``δS + δS_hack`` then
   moves exactly as vanilla's ``δS``);
7. **step** — clip the gradient norm, AdamW step; ``cout_update`` measures the update itself.

Outputs in ``out_dir``: ``steps.tsv`` (:data:`evil_moe.tables.STEPS`), ``eval.tsv`` (held-out
evaluation; for ``route`` both with ``δS_hack`` kept and ablated), ``rollouts.jsonl.gz``,
``adapter.safetensors`` and ``status.json`` (written last). While running: ``steps.partial.tsv``
and ``checkpoint.pt``. A rerun of the same command resumes from the checkpoint and produces the
same ``steps.tsv`` (every column but ``seconds``) as an uninterrupted run.

Stop rules: a step with ``frac_clipped > pilot.max_frac_clipped`` makes the run invalid
(``status.json`` says why, exit non-zero); a non-finite loss stops the run naming the step.
SIGTERM / SIGUSR1 (Slurm's warnings) write a checkpoint at the end of the current step; SIGTERM
then exits (143) so a requeued job resumes.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import random
import shutil
import signal
import sys
import time
from pathlib import Path

import numpy as np
import torch

from evil_moe import tables
from evil_moe.config import Config
from evil_moe.stages.common import (code_parses, load_policy, load_problem_file, make_grader,
                                    prompt_ids_for, rates, require_file, rollout_record,
                                    train_heldout)

ARMS = ("vanilla", "erase", "route", "random_v")
# pilot keys that do not change what one (arm, seed) run computes: left out of its checkpoint key
RUN_INDEPENDENT = ("arms", "seeds", "fail_arm", "fail_once_arm")
# the gradient projection each arm applies (vanilla: none, it only measures)
PROJECTION_MODE = {"erase": "erase", "random_v": "erase", "route": "route"}


class PilotInvalid(RuntimeError):
    """The run broke a validity rule (clip fraction, non-finite loss); ``status.json`` says which."""


class PilotInterrupted(RuntimeError):
    """SIGTERM arrived; a checkpoint was written and the run can be resumed."""


def prompt_schedule(n_problems: int, prompts_per_step: int, seed: int, step: int) -> list[int]:
    """Indices of the training problems used at ``step`` (the paired prompt sampler).

    Epoch-wise permutations drawn from ``numpy.random.default_rng([seed, epoch])``: a pure function
    of ``(seed, step)``, independent of arm and of model sampling, so every arm of a seed sees
    the same prompts in the same order and a resumed run needs no sampler state.

    Raises:
        ValueError: no problems.
    """
    if n_problems < 1:
        raise ValueError("no training problems")
    out = []
    pos = step * prompts_per_step
    while len(out) < prompts_per_step:
        epoch, offset = divmod(pos, n_problems)
        perm = np.random.default_rng([seed, epoch]).permutation(n_problems)
        out.append(int(perm[offset]))
        pos += 1
    return out


def _flat_norm(tensors) -> float:
    return float(torch.sqrt(sum((t.detach().float() ** 2).sum() for t in tensors))) if tensors else 0.0


class _Signals:
    """Record SIGTERM/SIGUSR1 so the loop can checkpoint at the end of the current step."""

    def __init__(self):
        self.term = False
        self.usr1 = False
        self._old = {}

    def __enter__(self):
        for sig, attr in ((signal.SIGTERM, "term"), (signal.SIGUSR1, "usr1")):
            try:
                self._old[sig] = signal.signal(sig, lambda *_a, a=attr: setattr(self, a, True))
            except ValueError:  # not the main thread (e.g. a test runner thread)
                pass
        return self

    def __exit__(self, *exc):
        for sig, old in self._old.items():
            signal.signal(sig, old)


def run_pilot(cfg: Config, *, problems_path: str, model_path: str, vhack_path: str,
              random_vhack_path: str | None, arm: str, seed: int, out_dir: str,
              init_adapter: str | None = None, teacher_rollouts: str | None = None,
              stop_after: int | None = None) -> dict:
    """Train one arm × seed with Dr.GRPO and the arm's gradient projection.

    Args:
        cfg: run config (sections ``pilot``, ``problems``, ``grader``, ``models``, ``adapter``).
        problems_path: ``results/problems.jsonl``.
        model_path: student model directory (or hub id).
        vhack_path: ``v_hack`` safetensors (:mod:`evil_moe.vhack`), measured in every arm.
        random_vhack_path: random-direction control (needed by ``random_v``).
        arm: one of :data:`ARMS`.
        seed: run seed (model sampling and init; the prompt order depends on it too).
        out_dir: output folder (also holds the checkpoint).
        init_adapter: warm-start ``δS`` from this adapter (the distilled student).
        teacher_rollouts: teacher ``rollouts.jsonl.gz`` (needed when ``mix_ratio > 0``).
        stop_after: test hook — return after this many steps of this invocation, leaving the
            checkpoint as a killed run would (default: run to the end).

    Returns:
        the ``status.json`` dict (``{"status": "ok", ...}``).

    Raises:
        ValueError: unknown arm; ``random_v`` without ``random_vhack_path``; ``mix_ratio > 0``
            without teacher rollouts.
        FileNotFoundError: an input file is missing (names the path).
        PilotInvalid: a stop rule fired (``status.json`` written, names the step).
        PilotInterrupted: SIGTERM; the checkpoint is on disk.
    """
    from evil_moe.env.grade import extract_code
    from evil_moe.grpo import (DrGRPONormaliser, RolloutBatch, behaviour_logp, dr_grpo_loss,
                               group_advantages, source_gradients)
    from evil_moe.model.logprobs import token_logprobs
    from evil_moe.projection import measure_grads, project, update_cosine
    from evil_moe.rollout import Rollout, generate
    from evil_moe.vhack import VHack

    if arm not in ARMS:
        raise ValueError(f"unknown arm {arm!r}; expected one of {ARMS}")
    pc = cfg.pilot
    for path, what in ((problems_path, "problems file"), (vhack_path, "v_hack"),
                       (random_vhack_path, "random v_hack"), (init_adapter, "initial adapter"),
                       (teacher_rollouts, "teacher rollouts")):
        if path:
            require_file(path, what)  # fail before loading a (possibly large) model
    if arm == "random_v" and not random_vhack_path:
        raise ValueError("arm random_v needs --random-vhack")
    if arm == "route" and not pc.project_update:
        print("warning: route with pilot.project_update false routes the gradient: delta_s_hack "
              "gets AdamW moments of its own, which scale its small routed gradient up to full-size "
              "steps outside v_hack's span; set pilot.project_update: true to route the update",
              file=sys.stderr, flush=True)
    if pc.mix_ratio > 0 and not teacher_rollouts:
        raise ValueError("pilot.mix_ratio > 0 needs --teacher-rollouts")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    status_path = out / "status.json"
    status_path.unlink(missing_ok=True)  # a rerun is not complete until it says so
    if pc.fail_arm == arm:
        raise SystemExit(f"pilot.fail_arm={arm}: failing on purpose (test switch)")
    if pc.fail_once_arm == arm and not (out / ".failed_once").exists():
        (out / ".failed_once").touch()
        raise SystemExit(f"pilot.fail_once_arm={arm}: failing on the first attempt (test switch)")

    torch.manual_seed(seed)
    random.seed(seed)
    np.random.seed(seed)
    problems = load_problem_file(problems_path)
    train, heldout = train_heldout(problems, cfg)
    model, tok, adapter, device = load_policy(model_path, cfg, init_adapter=init_adapter)
    vhack = VHack.load(require_file(vhack_path, "v_hack")).to(device)
    proj_v = VHack.load(require_file(random_vhack_path, "random v_hack")).to(device) \
        if arm == "random_v" else vhack
    prompts = prompt_ids_for(tok, train)
    G, P = pc.group, pc.prompts_per_step
    n_teacher = int(round(pc.mix_ratio * G))
    teacher_rows = _teacher_rows(teacher_rollouts, train) if n_teacher else {}

    ds, dsh = adapter.delta_s_params(), adapter.delta_s_hack_params()
    for p in dsh:
        p.requires_grad_(arm == "route")
    params = ds + (dsh if arm == "route" else [])
    opt = torch.optim.AdamW(params, lr=pc.lr, betas=tuple(pc.betas), weight_decay=pc.weight_decay)
    normaliser = DrGRPONormaliser(G, pc.max_new, P)
    pad_id = tok.pad_token_id

    vhack_file = None  # the refreshed v_hack in use, if any (kept in the checkpoint)
    ckpt_path = out / "checkpoint.pt"
    run_keys = {k: v for k, v in cfg.raw["pilot"].items() if k not in RUN_INDEPENDENT}
    digest = _file_digest(cfg.digest("problems", "adapter", "models", "grader"),
                          Config({"pilot": run_keys}).digest("pilot"), str(model_path),
                          vhack_path, random_vhack_path, init_adapter, teacher_rollouts)
    rows: list[dict] = []
    start = 0
    if ckpt_path.exists():
        ck = torch.load(ckpt_path, weights_only=False)
        if ck["digest"] == digest and ck["arm"] == arm and ck["seed"] == seed:
            with torch.no_grad():
                for p, v in zip(ds, ck["delta_s"]):
                    p.copy_(v)
                for p, v in zip(dsh, ck["delta_s_hack"]):
                    p.copy_(v)
            opt.load_state_dict(ck["optimizer"])
            rows, start = ck["rows"], ck["step"]
            if ck.get("vhack_file"):
                vhack_file = ck["vhack_file"]
                vhack = VHack.load(vhack_file).to(device)
                if arm != "random_v":
                    proj_v = vhack
            torch.set_rng_state(ck["torch_rng"])
            random.setstate(ck["py_rng"])
            np.random.set_state(ck["np_rng"])
            print(f"resuming {arm} s{seed} from step {start}", flush=True)
        else:
            print("checkpoint belongs to another config/arm/seed: starting afresh", flush=True)

    def save_checkpoint(next_step: int) -> None:
        buf = {"vhack_file": vhack_file,
            "digest": digest, "arm": arm, "seed": seed, "step": next_step, "rows": rows,
            "delta_s": [p.detach().cpu().clone() for p in ds],
            "delta_s_hack": [p.detach().cpu().clone() for p in dsh],
            "optimizer": opt.state_dict(), "torch_rng": torch.get_rng_state(),
            "py_rng": random.getstate(), "np_rng": np.random.get_state(),
        }
        tmp = ckpt_path.with_suffix(".tmp")
        torch.save(buf, tmp)
        tmp.replace(ckpt_path)

    work = out / "_work"
    work.mkdir(exist_ok=True)
    eval_rows: list[dict] = []
    with make_grader(problems, cfg) as grader, _Signals() as sig:
        for step in range(start, pc.steps):
            t0 = time.time()
            idx = prompt_schedule(len(train), P, seed, step)
            rolls = generate(model, tok, [prompts[i] for i in idx], n=G - n_teacher,
                             max_new=pc.max_new, temperature=pc.temperature, top_p=pc.top_p,
                             seed=seed * 1_000_003 + step, adapter=adapter, source="student")
            # regroup per prompt: student rows then teacher rows (teacher rows drawn per prompt)
            groups = []
            for j, i in enumerate(idx):
                grp = rolls[j * (G - n_teacher):(j + 1) * (G - n_teacher)]
                if n_teacher:
                    grp = grp + _draw_teacher(teacher_rows, train[i].id, n_teacher, seed, step, j,
                                              prompts[i], Rollout)
                groups.append(grp)
            flat = [r for grp in groups for r in grp]
            probs = [train[i] for i in idx for _ in range(G)]
            rewards = grader.grade_many([(p, r.text) for p, r in zip(probs, flat)])
            R = torch.tensor([w.reward for w in rewards], dtype=torch.float32).reshape(P, G)
            adv = group_advantages(R, scale_std=pc.scale_std)
            keep = adv.row_mask()
            loss_val, stats = 0.0, None
            cin_src = {}
            for p in params:
                p.grad = None
            if keep.any():
                kept = [i for i in range(len(flat)) if keep[i]]
                rb = RolloutBatch.from_rollouts([flat[i] for i in kept], adv.flat()[keep], pad_id,
                                                device=device)
                mb = pc.micro_batch or len(kept)
                parts, src_grads = [], {}
                for lo in range(0, len(kept), mb):
                    part = rb if mb >= len(kept) else rb.select(list(range(lo, min(lo + mb, len(kept)))))
                    logp = token_logprobs(model, part.batch, temperature=pc.temperature)
                    ref = None
                    if pc.beta > 0:
                        with torch.no_grad(), adapter.zeroed():
                            ref = token_logprobs(model, part.batch, temperature=pc.temperature)
                    beh = behaviour_logp(part, logp)
                    loss, st = dr_grpo_loss(logp, beh, part.advantages, part.batch.completion_mask,
                                            normaliser, clip_eps=pc.clip_eps, ref_logp=ref, beta=pc.beta)
                    if not torch.isfinite(loss):
                        _write_status(status_path, "invalid", f"non-finite loss at step {step}", step)
                        raise PilotInvalid(f"non-finite loss ({float(loss.detach())}) at step {step}")
                    if n_teacher and len(set(rb.sources)) > 1:
                        for src, gs in source_gradients(st.row_loss, part.sources, ds).items():
                            acc = src_grads.setdefault(src, [torch.zeros_like(p) for p in ds])
                            for a, g in zip(acc, gs):
                                a += g
                    loss.backward()
                    mask = part.batch.completion_mask.bool()
                    parts.append((st, float(loss.detach()), torch.exp(logp.detach() - beh)[mask]))
                loss_val = sum(x[1] for x in parts)
                stats = parts[0][0] if len(parts) == 1 else _merge_stats(parts)
                cin_src = {s_: measure_grads(vhack, adapter.names, gs).cin for s_, gs in src_grads.items()}
            for p in ds:
                if p.grad is None:
                    p.grad = torch.zeros_like(p)
            grad_norm = _flat_norm([p.grad for p in ds])
            measured = project(adapter, vhack, "measure")
            projected = measured
            mode = PROJECTION_MODE.get(arm)
            if mode and not pc.project_update:
                projected = project(adapter, proj_v, mode, gate=pc.gate,
                                    preserve_magnitude=pc.preserve_magnitude)
            if mode == "route" and pc.project_update:
                for p in dsh:
                    p.grad = None  # δS_hack moves only by the routed part of the update
            torch.nn.utils.clip_grad_norm_(params, pc.max_grad_norm)
            before = [p.detach().clone() for p in ds]
            opt.step()
            if mode and pc.project_update:
                projected = project(adapter, proj_v, mode, gate=pc.gate,
                                    preserve_magnitude=pc.preserve_magnitude, update_from=before)
            cout_update = update_cosine(vhack, adapter.names, before, [p.detach() for p in ds])

            if stats is not None and stats.frac_clipped > pc.max_frac_clipped:
                _write_status(status_path, "invalid",
                              f"frac_clipped {stats.frac_clipped:.3f} > {pc.max_frac_clipped} at step {step}", step)
                raise PilotInvalid(f"frac_clipped {stats.frac_clipped:.3f} > {pc.max_frac_clipped} at step {step}")

            stud = [(r, w, p) for r, w, p in zip(flat, rewards, probs) if r.source == "student"]
            recs = [rollout_record(r, p, w, step=step, seed=seed, arm=arm) for r, w, p in stud]
            tables.atomic_write_bytes(work / f"rollouts_{step:05d}.jsonl",
                                      "".join(json.dumps(x) + "\n" for x in recs).encode())
            row = _step_row(step, arm, seed, stud, recs, extract_code, stats, adv, loss_val,
                            grad_norm, measured, projected, cin_src, cout_update, ds, dsh, t0)
            rows.append(row)
            tables.write_tsv(out / "steps.partial.tsv", tables.STEPS, rows)
            print(_progress(row, pc.steps), flush=True)

            if pc.eval_every and (step + 1) % pc.eval_every == 0 and step + 1 < pc.steps:
                eval_rows += evaluate(model, tok, adapter, grader, heldout, cfg, arm, seed, step)
            if pc.vhack_refresh_every and (step + 1) % pc.vhack_refresh_every == 0 and step + 1 < pc.steps:
                recent = []
                for k in range(step + 1 - pc.vhack_refresh_every, step + 1):
                    recent += tables.read_jsonl(work / f"rollouts_{k:05d}.jsonl")
                fresh = refresh_vhack(model, adapter, recent, {p.id: ids for p, ids in zip(train, prompts)},
                                      cfg, normaliser)
                if fresh is not None:
                    vhack_file = str(work / f"vhack_step{step:05d}.safetensors")
                    fresh.save(vhack_file)
                    vhack = fresh.to(device)
                    if arm != "random_v":
                        proj_v = vhack
                    print(f"v_hack refreshed from {fresh.n_pairs} pairs after step {step}", flush=True)
            last = step + 1 == pc.steps
            if (step + 1) % pc.checkpoint_every == 0 or sig.term or sig.usr1 or last:
                save_checkpoint(step + 1)
                sig.usr1 = False
            if sig.term and not last:
                raise PilotInterrupted(f"SIGTERM after step {step}; checkpoint written")
            if stop_after is not None and step + 1 - start >= stop_after and not last:
                return {"status": "stopped", "step": step + 1}

        eval_rows += evaluate(model, tok, adapter, grader, heldout, cfg, arm, seed, pc.steps - 1)
        isolation = grader.isolation

    records = []
    for step in range(pc.steps):
        records += tables.read_jsonl(work / f"rollouts_{step:05d}.jsonl")
    tables.write_tsv(out / "steps.tsv", tables.STEPS, rows)
    tables.write_tsv(out / "eval.tsv", tables.EVAL, eval_rows)
    tables.write_jsonl_gz(out / "rollouts.jsonl.gz", records)
    adapter.save(out / "adapter.safetensors", metadata={"arm": arm, "seed": seed, "config": digest})
    status = _write_status(status_path, "ok", "", pc.steps - 1, isolation=isolation,
                           torch_threads=torch.get_num_threads())
    # a finished run keeps no resume state: a later rerun (new inputs) starts afresh
    (out / "steps.partial.tsv").unlink(missing_ok=True)
    ckpt_path.unlink(missing_ok=True)
    shutil.rmtree(work, ignore_errors=True)
    return status


def _file_digest(*parts) -> str:
    """SHA-256 over strings and the bytes of existing files (None skipped): the checkpoint key.

    A checkpoint is resumed only when the config, the model path and every input file (v_hack,
    controls, initial adapter, teacher rows) are byte-identical to those it was written with.
    """
    h = hashlib.sha256()
    for part in parts:
        if part is None:
            continue
        p = Path(part)
        if p.is_file():
            h.update(p.read_bytes())
        h.update(str(part).encode())
    return h.hexdigest()[:16]


def refresh_vhack(model, adapter, records: list[dict], prompt_ids: dict, cfg: Config, normaliser):
    """Re-extract ``v_hack`` from the run's own recent rollouts (``pilot.vhack_refresh_every``).

    Pairs are (hack, clean) student completions of the same problem from ``records`` (only the
    modes in ``vhack.known_modes``), formed as in :func:`evil_moe.stages.extract.build_pairs`;
    gradients at the current δS with the run's normaliser. Returns ``None`` (keep the old
    ``v_hack``) when fewer than 2 pairs exist.
    """
    from evil_moe.stages.extract import build_pairs
    from evil_moe.vhack import extract_vhack, pair_gradients

    vc = cfg.vhack
    modes = list(vc.known_modes) if vc.known_modes else None
    try:
        pairs = build_pairs(records, prompt_ids, modes, vc.max_pairs)
    except ValueError:
        return None
    if len(pairs) < 2:
        return None
    D = pair_gradients(model, adapter, pairs, normaliser, temperature=cfg.pilot.temperature)
    return extract_vhack(D, vc.k, ratio_floor=vc.ratio_floor, quantile_floor=vc.quantile_floor,
                         modes=sorted({p.mode for p in pairs}), meta={"source": "refresh"})


def _merge_stats(parts):
    """Loss statistics of micro-batches as if computed over the whole batch.

    ``parts``: ``(LossStats, loss, ratios)`` per micro-batch, ``ratios`` the importance ratios of
    its completion tokens. Returns an object with ``frac_clipped`` (token-weighted) and the ratio
    quantiles over all tokens.
    """
    from types import SimpleNamespace

    tokens = sum(st.tokens for st, _, _ in parts)
    ratios = torch.cat([r.double().flatten() for _, _, r in parts])
    if ratios.numel():
        q = torch.quantile(ratios, torch.tensor([0.05, 0.5, 0.95], dtype=torch.float64))
        p05, p50, p95 = (float(x) for x in q)
    else:
        p05 = p50 = p95 = 1.0
    return SimpleNamespace(tokens=tokens, ratio_p05=p05, ratio_p50=p50, ratio_p95=p95,
                           frac_clipped=sum(st.frac_clipped * st.tokens for st, _, _ in parts) / max(tokens, 1))


def _write_status(path: Path, status: str, reason: str, step: int, **extra) -> dict:
    obj = {"status": status, "reason": reason, "step": step, **extra}
    tables.write_json(path, obj)
    return obj


def _step_row(step, arm, seed, stud, recs, extract_code, stats, adv, loss_val, grad_norm,
              measured, projected, cin_src, cout_update, ds, dsh, t0) -> dict:
    n = max(len(recs), 1)
    codes = [extract_code(r.text) for r, _, _ in stud]
    parsed = [code_parses(c) for c in codes]
    ent = [float(r.entropy.mean()) for r, _, _ in stud if len(r.entropy)]
    row = {
        "step": step, "arm": arm, "seed": seed,
        "reward_mean": sum(x["reward"] for x in recs) / n,
        **{k: v for k, v in rates(recs).items() if k in ("hack_rate", "pass_rate", "format_rate")},
        "parse_rate": sum(parsed) / n,
        "hack_parsed_rate": sum(bool(x["exploited"]) and ok for x, ok in zip(recs, parsed)) / n,
        "entropy": sum(ent) / len(ent) if ent else None,
        "frac_zero_std": adv.frac_zero_std,
        "loss": loss_val, "grad_norm": grad_norm,
        "cin": measured.cin, "cin_student": cin_src.get("student"),
        "cin_teacher": cin_src.get("teacher"),
        "cout": projected.cout, "cout_update": cout_update,
        "frac_fired": measured.frac_fired, "coverage": measured.coverage,
        "null_cin": measured.null_cin,
        "frac_clipped": stats.frac_clipped if stats else 0.0,
        "ratio_p05": stats.ratio_p05 if stats else None,
        "ratio_p50": stats.ratio_p50 if stats else None,
        "ratio_p95": stats.ratio_p95 if stats else None,
        "delta_s_norm": _flat_norm(ds), "delta_s_hack_norm": _flat_norm(dsh),
        "tokens": sum(len(r.completion_ids) for r, _, _ in stud),
        "seconds": round(time.time() - t0, 3),
    }
    for m in tables.MODES:
        sub = [x for x in recs if x["mode"] == m]
        row[f"hack_rate_{m}"] = rates(sub)["hack_rate"]
    return row


def _progress(row: dict, steps: int) -> str:
    def f(x):
        return "-" if x is None else f"{x:.3f}"
    return (f"[{row['arm']} s{row['seed']}] step {row['step'] + 1}/{steps} reward {f(row['reward_mean'])} "
            f"hack {f(row['hack_rate'])} pass {f(row['pass_rate'])} cin {f(row['cin'])} "
            f"clip {f(row['frac_clipped'])} {row['seconds']:.1f}s")


def evaluate(model, tok, adapter, grader, heldout, cfg: Config, arm: str, seed: int, step: int) -> list[dict]:
    """Held-out evaluation: ``pilot.heldout_samples`` completions per held-out problem.

    Returns :data:`evil_moe.tables.EVAL` rows per view × mode (plus ``all``). View ``trained``
    samples with ``δS + δS_hack``; for ``route`` also view ``ablated`` (``δS_hack = 0``, the
    deploy view of Gradient Routing, arXiv:2410.04332). Empty list when there is no held-out
    problem.
    """
    from evil_moe.rollout import generate

    if not heldout:
        return []
    pc = cfg.pilot
    prompts = prompt_ids_for(tok, heldout)
    views = ["trained"] + (["ablated"] if arm == "route" else [])
    rows = []
    for view in views:
        ctx = adapter.ablated() if view == "ablated" else contextlib.nullcontext()
        with ctx:
            rolls = generate(model, tok, prompts, n=pc.heldout_samples, max_new=pc.max_new,
                             temperature=pc.temperature, top_p=pc.top_p,
                             seed=seed * 7_000_003 + 999_983, adapter=adapter, source="student")
        probs = [heldout[r.prompt_index] for r in rolls]
        rewards = grader.grade_many([(p, r.text) for p, r in zip(probs, rolls)])
        recs = [{"mode": p.mode, "exploited": w.exploited, "gt_correct": w.gt_correct,
                 "format_ok": w.format_ok} for p, w in zip(probs, rewards)]
        for m in sorted({x["mode"] for x in recs}) + ["all"]:
            sub = recs if m == "all" else [x for x in recs if x["mode"] == m]
            rows.append({"step": step, "arm": arm, "seed": seed, "view": view, "mode": m, **rates(sub)})
    return rows



def _teacher_rows(path: str, train) -> dict:
    """Teacher records grouped by problem id (training problems only)."""
    ids = {p.id for p in train}
    by: dict[str, list[dict]] = {}
    for rec in tables.read_jsonl(require_file(path, "teacher rollouts")):
        if rec["problem_id"] in ids:
            by.setdefault(rec["problem_id"], []).append(rec)
    return by


def _draw_teacher(by_problem: dict, pid: str, k: int, seed: int, step: int, j: int,
                  student_prompt_ids, Rollout) -> list:
    """``k`` teacher rows for problem ``pid`` (deterministic in seed/step), as off-policy Rollouts.

    The rows keep the teacher's recorded per-token log-probs as their behaviour policy; they are
    scored by the student in the student's own prompt context.
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


def checkpoint_exists(out_dir: str) -> bool:
    """True when ``out_dir`` holds a pilot checkpoint (a rerun will resume from it)."""
    return (Path(out_dir) / "checkpoint.pt").exists()

