"""Benchmark: our Dr.GRPO pilot step against TRL's ``GRPOTrainer`` on the same toy student (CPU).

Both sides get the same student (a toy Qwen3 from :func:`evil_moe.stages.toy.train_toy_models`,
or ``--model DIR``), the same SVD adapter (trainable ``delta_s`` only, base frozen, the same AdamW
settings), the same prompts in the same order (our paired prompt schedule for seed 0, fed to TRL
as an unshuffled dataset), ``group 6``, ``prompts_per_step 4``, the same ``max_new`` /
temperature / top_p / clip, Dr.GRPO (``loss_type="dr_grpo"``, ``scale_rewards=False``, beta = 0)
and a reward function that calls our sandboxed :class:`~evil_moe.env.grader.Grader`. TRL trains
through the adapter's forward hooks (it has no merged-weight sampling path for a custom
adapter, as with an unmerged PEFT adapter); we sample with the adapter merged into the weights.

Like for like: TRL trains the adapter it is given. The knobs are registered as a
submodule of the model, so HF Trainer's ``clip_grad_norm_(model.parameters())`` clips every δS
and ``model.zero_grad()`` zeroes them after each step (without it δS were neither clipped nor
zeroed, and their gradients accumulated across steps); δS_hack is frozen (vanilla trains δS
only); the ``lm_head`` knob is a parametrisation of ``lm_head.weight`` (``W + U diag(δS) Vh``, its
forward hook bypassed), so a loss that reads the head's weight instead of calling the module
(TRL's fused LM head, ``trl.trainer.utils.add_fused_lm_head``: ``hidden @ lm_head.weight`` in
tiles) still sees and trains it; during TRL's sampling (``_generate_single_turn``, no gradient)
the head's weight is formed once per call (``parametrize.cached``), not at every decoding step,
so TRL pays no per-token cost for it. A callback checks, at every step, that every δS (the lm_head's
included) has a non-zero gradient before the optimiser step, that the clipped norm is at most
``max_grad_norm``, that every δS moved in the step and that the gradients are zero after it,
and that TRL's advantages are Dr.GRPO's of our grader's rewards; on the first step of each block
(the untimed warm-up step; ``--verify-steps``) the δS gradient TRL clipped and applied must
equal, to a relative error of 1e-3, the one our loss gives on TRL's batch (a second copy of the
student with our adapter's hooks, our log-probs, loss, normaliser and clipping). The benchmark
stops if not. Ours skips the rows of zero-variance groups (zero advantage: exactly
zero gradient at beta = 0) where TRL backpropagates every row; each of our arms is therefore
timed twice, as published (``ours:ARM``) and with every row through the loss
(``ours:ARM+every_row``, the same gradient), and both ratios are printed.

Timing: blocks of ``--steps`` optimiser steps, alternated ours-vanilla, TRL, ours-erase, repeated
``--rounds`` times (A B C A B C). A step's time is the wall clock from the start of one step to
the start of the next (ours: everything in ``run_pilot``'s loop, including grading, the rollout
file, steps.partial.tsv and checkpoints; TRL: ``on_step_begin`` to ``on_step_begin``, the last
step to ``on_step_end``). Model loading, the grader start-up of the first step excepted, and the
final held-out evaluation are outside the timed region. The first step of every block is
dropped (warm-up: the grader's worker pool starts lazily on both sides). Prints the median
wall seconds/step of each, the median CPU seconds/step of this process (all its threads; the
sandboxed grading children excluded — robust to a loaded machine, where wall time mostly
measures waiting for a core), completion tokens/step, and the ratios. Both sides run at the
pilot's thread count (``pilot.threads``, 1; ``--threads N``).

    .venv/bin/python benchmarks/pilot_vs_trl.py [--steps 6] [--rounds 2] [--max-new 200] [--model DIR]
    .venv/bin/python benchmarks/pilot_vs_trl.py --quick      # smoke mode: tiny model, 2 steps, 1 round

Needs ``trl`` (``benchmarks/requirements.txt``).
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TQDM_DISABLE", "1")

# the toy student: the stage tests' toy world (tests/stage_fixtures.py: hidden 64, 2 layers, half
# trained so that rewards vary within a group), built once and cached
TOY_SETS = ["problems.limit=12", "toy.hidden=64", "toy.layers=2", "toy.intermediate=128",
            "toy.vocab_size=400", "toy.train_steps=120", "toy.lr=0.015", "toy.batch_size=8",
            "toy.n_examples=120", "toy.teacher_hack_frac=0.8", "toy.eval_samples=4"]
QUICK_TOY_SETS = ["toy.hidden=64", "toy.layers=2", "toy.intermediate=128", "toy.vocab_size=400",
                  "toy.train_steps=30", "toy.n_examples=60", "toy.eval_samples=2", "problems.limit=12"]


def bench_config(extra: list[str]):
    from evil_moe.config import load_config

    return load_config([REPO / "config" / "config.yaml"],
                       ["models.device=cpu", "grader.workers=2", "pilot.heldout_samples=1",
                        "pilot.eval_every=0", "pilot.group=6", "pilot.prompts_per_step=4",
                        "pilot.beta=0.0", "pilot.scale_std=false"] + extra)


def build_world(cache: Path, cfg, model_dir: str | None) -> dict:
    """problems.jsonl, the student (trained once, cached by config digest) and a v_hack file."""
    import torch

    from evil_moe.stages.common import load_policy
    from evil_moe.stages.problems import write_problem_set
    from evil_moe.rl.vhack.direction import random_vhack

    key = cfg.digest("toy", "problems")
    root = cache / f"world_{key}"
    root.mkdir(parents=True, exist_ok=True)
    problems = root / "problems.jsonl"
    if not problems.exists():
        write_problem_set(cfg, str(problems))
    if model_dir is None:
        model_dir = str(root / "models" / "student")
        if not (Path(model_dir) / "config.json").exists():
            from evil_moe.stages.toy import train_toy_models

            t0 = time.time()
            print(f"building the toy student into {root / 'models'} ...", flush=True)
            train_toy_models(cfg, problems_path=str(problems), out_dir=str(root / "models"))
            print(f"  built in {time.time() - t0:.0f} s", flush=True)
    vh = root / f"vhack_{Path(model_dir).name}.safetensors"
    if not vh.exists():
        # the erase arm's cost does not depend on which directions V holds: a seeded random V
        # with the config's k stands in for an extracted v_hack
        _, _, adapter, _ = load_policy(model_dir, cfg)
        random_vhack(adapter.r, k=cfg.vhack.k, seed=0).save(vh)
        del adapter
    torch.set_num_threads(torch.get_num_threads())
    return {"problems": str(problems), "model": model_dir, "vhack": str(vh)}


# ------------------------------------------------------------------------------------------
def run_ours(cfg, world: dict, arm: str, out_dir: Path, every_row: bool = False) -> dict:
    """One ``run_pilot`` block; per-step wall times from stamps at the top of each step.
    ``every_row``: push every row through the loss, as TRL does (rows of zero-variance groups
    have zero advantage, so the gradient is the same; only the time changes)."""
    from evil_moe.rl.trainer import trainer
    from evil_moe.stages import pilot

    stamps: list[float] = []
    orig_sched, orig_eval = trainer.prompt_schedule, pilot.evaluate
    orig_adv = trainer.Trainer.advantages

    def all_rows(self, R):
        adv, _ = orig_adv(self, R)
        return adv, list(range(R.numel()))

    if every_row:
        trainer.Trainer.advantages = all_rows

    def sched(*a, **k):
        stamps.append((time.perf_counter(), time.process_time()))
        return orig_sched(*a, **k)

    def ev(*a, **k):
        stamps.append((time.perf_counter(), time.process_time()))
        return orig_eval(*a, **k)

    trainer.prompt_schedule, pilot.evaluate = sched, ev
    try:
        pilot.run_pilot(cfg, problems_path=world["problems"], model_path=world["model"],
                        vhack_path=world["vhack"], random_vhack_path=world["vhack"], arm=arm,
                        seed=0, out_dir=str(out_dir))
    finally:
        trainer.prompt_schedule, pilot.evaluate = orig_sched, orig_eval
        trainer.Trainer.advantages = orig_adv
    with open(out_dir / "steps.tsv") as f:
        rows = list(csv.DictReader(f, delimiter="\t"))
    return {"step_s": [b[0] - a[0] for a, b in zip(stamps, stamps[1:])],
            "cpu_s": [b[1] - a[1] for a, b in zip(stamps, stamps[1:])],
            "tokens": [int(r["tokens"]) for r in rows],
            "reward": [float(r["reward_mean"]) for r in rows]}


def run_trl(cfg, world: dict, out_dir: Path, verify_steps: int = 1) -> dict:
    """One TRL ``GRPOTrainer`` block of ``pilot.steps`` steps on the same student, adapter, prompts.

    Every step is checked (:class:`TrlChecks`): each δS has a gradient (the lm_head's included),
    the joint norm is clipped, every δS moved in the optimiser step, the gradients are zeroed
    after it. The first ``verify_steps`` steps (the first is the block's warm-up step, dropped from
    the timings) are also checked against our own loss: the δS gradient TRL clipped and applied
    equals the one our trainer computes on TRL's batch (:class:`OurGradients`).
    """
    import torch
    from datasets import Dataset
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from evil_moe.env.problems import build_messages
    from evil_moe.stages.common import load_policy, load_problem_file, make_grader, train_heldout
    from evil_moe.rl.trainer.trainer import prompt_schedule

    pc = cfg.pilot
    torch.manual_seed(0)
    problems = load_problem_file(world["problems"])
    train, _ = train_heldout(problems, cfg)
    model, tok, adapter, _ = load_policy(world["model"], cfg)
    knobs = give_trl_the_adapter(model, adapter)
    ours = None
    if verify_steps:
        ref_model, ref_tok, ref_adapter, _ = load_policy(world["model"], cfg)
        ours = OurGradients(ref_model, ref_tok, ref_adapter, pc)
    order = [i for s in range(pc.steps) for i in prompt_schedule(len(train), pc.prompts_per_step, 0, s)]
    data = Dataset.from_list([{"prompt": build_messages(train[i]), "problem_id": train[i].id}
                              for i in order])
    grader = make_grader(problems, cfg)  # the grader our pilot builds (same settings)
    tokens: list[int] = []
    rewards: list[list[float]] = []

    def reward_fn(prompts, completions, problem_id, completion_ids=None, **_kw):
        texts = [c[-1]["content"] if isinstance(c, list) else c for c in completions]
        if completion_ids is not None:
            tokens.append(sum(len(c) for c in completion_ids))
        out = [w.reward for w in grader.grade_many(list(zip(problem_id, texts)))]
        rewards.append(out)
        return out

    reward_fn.__name__ = "evil_moe_grader"
    stamps: list[tuple[float, float]] = []
    checks = TrlChecks(knobs, pc, ours, verify_steps, rewards)

    class Clock(TrainerCallback):
        def on_step_begin(self, args, state, control, **kw):
            stamps.append((time.perf_counter(), time.process_time()))

        def on_pre_optimizer_step(self, args, state, control, **kw):
            checks.before_step(state.global_step)

        def on_optimizer_step(self, args, state, control, **kw):
            checks.after_step(state.global_step)

        def on_step_end(self, args, state, control, **kw):
            checks.zeroed(state.global_step)
            if state.global_step >= pc.steps:
                stamps.append((time.perf_counter(), time.process_time()))

    G, P = pc.group, pc.prompts_per_step
    args = GRPOConfig(
        output_dir=str(out_dir), max_steps=pc.steps, per_device_train_batch_size=G * P,
        gradient_accumulation_steps=1, num_generations=G, steps_per_generation=1,
        num_iterations=1, max_completion_length=pc.max_new, temperature=pc.temperature,
        top_p=pc.top_p, top_k=0, loss_type="dr_grpo", scale_rewards=False, beta=0.0,
        epsilon=pc.clip_eps, learning_rate=pc.lr, lr_scheduler_type="constant", warmup_steps=0,
        max_grad_norm=pc.max_grad_norm, weight_decay=pc.weight_decay, shuffle_dataset=False,
        gradient_checkpointing=False, bf16=False, fp16=False, use_cpu=True, seed=0,
        logging_steps=1, save_strategy="no", report_to="none", disable_tqdm=True,
        dataloader_num_workers=0,
    )
    opt = torch.optim.AdamW(adapter.delta_s_params(), lr=pc.lr, betas=tuple(pc.betas),
                            weight_decay=pc.weight_decay)
    trainer = GRPOTrainer(model=model, reward_funcs=[reward_fn], args=args, train_dataset=data,
                          processing_class=tok, callbacks=[Clock()], optimizers=(opt, None))
    compute_loss = trainer.compute_loss

    def seen_compute_loss(model, inputs, *a, **k):  # the batch TRL's loss sees (for OurGradients)
        checks.inputs = inputs
        return compute_loss(model, inputs, *a, **k)

    trainer.compute_loss = seen_compute_loss
    generate_single_turn = trainer._generate_single_turn

    def cached_generate(*a, **k):  # the lm_head's W + U diag(δS) Vh formed once per generation
        from torch.nn.utils import parametrize

        with parametrize.cached():
            return generate_single_turn(*a, **k)

    trainer._generate_single_turn = cached_generate
    try:
        trainer.train()
    finally:
        grader.close()
    if len(checks.steps) != pc.steps:
        raise RuntimeError(f"TRL ran {len(checks.steps)} checked steps, expected {pc.steps}")
    logs = [x for x in trainer.state.log_history if "reward" in x]
    return {"step_s": [b[0] - a[0] for a, b in zip(stamps, stamps[1:])],
            "cpu_s": [b[1] - a[1] for a, b in zip(stamps, stamps[1:])], "tokens": tokens,
            "reward": [float(x["reward"]) for x in logs],
            "grad_norm": [float(x.get("grad_norm", float("nan"))) for x in logs],
            "checks": checks.steps}


class OurGradients:
    """Our trainer's clipped δS gradient of a batch TRL trained on (the reference TRL's must equal).

    A second copy of the student with our adapter (its forward hooks, the lm_head's included, as
    our pilot trains it), its δS and δS_hack set to TRL's before the step; the loss is ours
    (:func:`evil_moe.model.logprobs.token_logprobs`, :func:`evil_moe.rl.policy.grpo.dr_grpo_loss` with the
    on-policy behaviour log-probs and the ``G · max_new · P`` normaliser) on TRL's prompt and
    completion tokens and advantages, and the gradient is clipped to ``pilot.max_grad_norm`` as in
    ``Trainer.optimiser_step`` (one joint norm over the trained δS)."""

    def __init__(self, model, tok, adapter, pc):
        """``model`` with our ``adapter`` attached (hooks on every module, none bypassed), its
        tokenizer ``tok`` (``pad_token_id``) and the run's ``pilot`` config section ``pc``."""
        from evil_moe.rl.policy.grpo import DrGRPONormaliser

        self.model, self.tok, self.adapter, self.pc = model, tok, adapter, pc
        self.norm = DrGRPONormaliser(pc.group, pc.max_new, pc.prompts_per_step)

    def __call__(self, trl_adapter_knobs: dict, inputs: dict) -> dict:
        """``{module name: (r,) clipped gradient}`` for TRL's batch ``inputs`` (``prompt_ids``,
        ``prompt_mask`` left-padded ``(B, Tp)``; ``completion_ids``, ``completion_mask``
        ``(B, Tc)``; ``advantages (B,)``) at the δS values of ``trl_adapter_knobs`` (name ->
        SVDKnob of the adapter TRL trains)."""
        import torch

        from evil_moe.rl.policy.grpo import dr_grpo_loss, on_policy_behaviour
        from evil_moe.model.logprobs import build_batch, token_logprobs

        mods = self.adapter.modules_
        with torch.no_grad():
            for name, knob in trl_adapter_knobs.items():
                mods[name].delta_s.copy_(knob.delta_s)
                mods[name].delta_s_hack.copy_(knob.delta_s_hack)
        rows = lambda ids, m: [x[k.bool()].tolist() for x, k in zip(ids.cpu(), m.cpu())]  # noqa: E731
        prompts = rows(inputs["prompt_ids"], inputs["prompt_mask"])
        comps = rows(inputs["completion_ids"], inputs["completion_mask"])
        batch = build_batch(prompts, comps, self.tok.pad_token_id)
        # TRL's completion mask is a prefix of each completion (up to its EOS), as ours
        if int(batch.completion_mask.sum()) != int(inputs["completion_mask"].sum()):
            raise RuntimeError("TRL's completion mask is not a prefix of each completion")
        logp = token_logprobs(self.model, batch, temperature=self.pc.temperature)
        loss, _ = dr_grpo_loss(logp, on_policy_behaviour(logp), inputs["advantages"].float().cpu(),
                               batch.completion_mask, self.norm, clip_eps=self.pc.clip_eps)
        ds = [mods[n].delta_s for n in trl_adapter_knobs]
        grads = torch.autograd.grad(loss, ds, allow_unused=True)
        for p, g in zip(ds, grads):
            p.grad = torch.zeros_like(p) if g is None else g.detach()
        torch.nn.utils.clip_grad_norm_(ds, self.pc.max_grad_norm)  # as Trainer.optimiser_step
        out = {n: p.grad.clone() for n, p in zip(trl_adapter_knobs, ds)}
        for p in ds:
            p.grad = None
        return out


class TrlChecks:
    """The per-step checks of the TRL side (raise RuntimeError naming the step and the knob).

    Before the optimiser step (HF Trainer has clipped): every δS has a non-zero gradient (the
    lm_head's included) unless every advantage of the batch is zero (then all are zero), the joint
    norm is at most ``max_grad_norm``, TRL's advantages equal Dr.GRPO's of the rewards our grader
    gave (as multisets: TRL shuffles the rows), and for the first ``verify_steps`` steps the
    gradients equal :class:`OurGradients`' (relative error of the joint vector <= 1e-3). After the
    optimiser step: every δS with a gradient moved; at the step's end: the gradients are zeroed.
    """

    def __init__(self, knobs: dict, pc, ours: OurGradients | None, verify_steps: int,
                 rewards: list[list[float]]):
        self.knobs, self.pc, self.ours, self.verify_steps = knobs, pc, ours, verify_steps
        self.rewards = rewards
        self.inputs: dict | None = None
        self.steps: list[dict] = []
        self._before: list | None = None

    def before_step(self, step: int) -> None:
        import torch

        from evil_moe.rl.policy.grpo import group_advantages

        if self.inputs is None:
            raise RuntimeError(f"TRL step {step}: no batch seen by compute_loss")
        adv = self.inputs["advantages"].detach().float().cpu().flatten()
        pc = self.pc
        ours_adv = group_advantages(torch.tensor(self.rewards[-1]).reshape(pc.prompts_per_step, pc.group),
                                    scale_std=False).flat()
        if not torch.allclose(adv.sort().values, ours_adv.float().sort().values, atol=1e-6):
            raise RuntimeError(f"TRL step {step}: advantages differ from Dr.GRPO's of the rewards")
        live = bool(ours_adv.any())  # TRL's zero-variance rows may carry rounding crumbs
        params = {n: k.delta_s for n, k in self.knobs.items()}
        stats = check_gradients(params, pc.max_grad_norm, expect_zero=not live)
        stats.update(step=step, live=live, rel_err=None)
        if self.ours is not None and step < self.verify_steps:
            ref = self.ours(self.knobs, self.inputs)
            trl = torch.cat([p.grad.detach().flatten() if p.grad is not None
                             else torch.zeros_like(p).flatten() for p in params.values()])
            want = torch.cat([ref[n].flatten() for n in params])
            stats["rel_err"] = float((trl - want).norm() / want.norm().clamp_min(1e-30))
            stats["ours_norm"] = float(want.norm())
            if stats["rel_err"] > 1e-3:
                raise RuntimeError(f"TRL step {step}: δS gradient differs from ours (relative "
                                   f"error {stats['rel_err']:.2e}, norms {stats['norm']:.4g} vs "
                                   f"{stats['ours_norm']:.4g})")
        self._before = [p.detach().clone() for p in params.values()]
        self.steps.append(stats)
        self.inputs = None

    def after_step(self, step: int) -> None:
        stats = self.steps[-1]
        if not stats["live"]:
            return
        still = [n for (n, k), b in zip(self.knobs.items(), self._before) if k.delta_s.equal(b)]
        if still:
            raise RuntimeError(f"TRL step {step}: δS of {still[:3]} did not move in the optimiser "
                               f"step ({len(still)} of {len(self.knobs)} knobs)")
        stats["moved"] = True

    def zeroed(self, step: int) -> None:
        if not self.steps:
            raise RuntimeError(f"TRL step {step}: δS gradients never seen")
        if not all(k.delta_s.grad is None or not k.delta_s.grad.any() for k in self.knobs.values()):
            raise RuntimeError(f"TRL step {step}: δS gradients not zeroed after the step")


class _HeadDelta(torch.nn.Module):
    """Parametrisation of a wrapped Linear's weight: ``W + U diag(δS + δS_hack) Vh`` (model dtype;
    the sum the adapter's hook adds in its default mode), so any code that reads
    ``lm_head.weight`` sees the adapter (torch.nn.utils.parametrize)."""

    def __init__(self, knob):
        super().__init__()
        object.__setattr__(self, "knob", knob)  # not a submodule: no second copy of δS

    def forward(self, W):
        k = self.knob
        return W + ((k.U.float() * (k.delta_s + k.delta_s_hack)) @ k.Vh.float()).to(W.dtype)


def give_trl_the_adapter(model, adapter) -> dict:
    """Make HF Trainer / TRL train the adapter as ours does (see the module docstring): the knobs
    become a submodule of the model (clipped and zeroed with the model's parameters), δS_hack is
    frozen, and the ``lm_head`` knob becomes a parametrisation of the head's weight.

    Returns:
        ``{module name: SVDKnob}`` of every knob (its ``delta_s`` is what TRL trains).
    """
    from torch.nn.utils import parametrize

    for p in adapter.delta_s_hack_params():
        p.requires_grad_(False)
    model.add_module("evil_moe_knobs", adapter.knobs)
    for name, knob in adapter.modules_.items():
        if name.split(".")[-1] == "lm_head":
            head = model.get_submodule(name)
            parametrize.register_parametrization(head, "weight", _HeadDelta(knob), unsafe=True)
            adapter._bypass.add(name)  # the hook would add the delta a second time
    return dict(adapter.modules_)


def check_gradients(knobs: dict, max_norm: float, expect_zero: bool = False) -> dict:
    """Before TRL's optimiser step (``knobs``: module name -> δS Parameter): every δS has a
    non-zero gradient (all of them zero, None or below 1e-6 in norm instead when ``expect_zero``:
    a batch whose every advantage is zero) and their joint norm is at most ``max_norm`` (HF Trainer clipped it).

    Returns:
        ``{"norm": joint gradient norm, "lm_head_grad": the lm_head δS's gradient norm or None}``.

    Raises:
        RuntimeError: naming the first knobs without a gradient (or with one when
        ``expect_zero``), or a norm above ``max_norm``.
    """
    import torch

    if expect_zero:
        extra = [n for n, p in knobs.items() if p.grad is not None and float(p.grad.norm()) > 1e-6]
        if extra:
            raise RuntimeError(f"TRL gave a gradient to δS of {extra[:3]} with every advantage zero")
        return {"norm": 0.0, "lm_head_grad": 0.0 if any(n.endswith("lm_head") for n in knobs) else None}
    missing = [n for n, p in knobs.items() if p.grad is None or not p.grad.any()]
    if missing:
        raise RuntimeError(f"TRL gave no gradient to δS of {missing[:3]} ({len(missing)} of "
                           f"{len(knobs)} knobs)")
    norm = float(torch.linalg.vector_norm(torch.stack([p.grad.norm() for p in knobs.values()])))
    if max_norm and norm > max_norm * (1 + 1e-4):
        raise RuntimeError(f"δS gradient norm {norm:.4g} above max_grad_norm {max_norm}: not clipped")
    heads = [n for n in knobs if n.endswith("lm_head")]
    return {"norm": norm, "lm_head_grad": float(knobs[heads[0]].grad.norm()) if heads else None}


# ------------------------------------------------------------------------------------------
def med(xs):
    return statistics.median(xs) if xs else float("nan")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=6, help="optimiser steps per block (default 6)")
    ap.add_argument("--rounds", type=int, default=2, help="A B C rounds (default 2)")
    ap.add_argument("--max-new", type=int, default=None, help="max new tokens (default: config, 200)")
    ap.add_argument("--model", default=None, help="student model folder (default: build a toy one)")
    ap.add_argument("--threads", type=int, default=None,
                    help="torch threads of both sides (default: pilot.threads, 1)")
    ap.add_argument("--cache", default=str(HERE / ".cache"), help="where the toy world is cached")
    ap.add_argument("--only", choices=["all", "ours", "trl"], default="all",
                    help="run only one side (e.g. for profiling)")
    ap.add_argument("--arms", default="vanilla,erase", help="our arms to time (default vanilla,erase)")
    ap.add_argument("--quick", action="store_true", help="smoke mode: tiny model, 2 steps, 1 round")
    ap.add_argument("--no-every-row", action="store_true",
                    help="time our arms only as published (skip the every-row variants)")
    ap.add_argument("--verify-steps", type=int, default=1,
                    help="TRL steps per block whose δS gradient is checked against ours on the "
                         "same batch (default 1: the warm-up step, not timed; 0: none)")
    ap.add_argument("--json", default=None, help="also write the figures to this JSON file")
    a = ap.parse_args(argv)

    import torch

    steps, rounds, toy = a.steps, a.rounds, TOY_SETS
    max_new = a.max_new
    if a.quick:
        steps, rounds, toy = 2, 1, QUICK_TOY_SETS
        max_new = max_new or 24
    extra = toy + [f"pilot.steps={steps}", f"pilot.checkpoint_every=5"]
    if max_new:
        extra.append(f"pilot.max_new={max_new}")
    cfg = bench_config(extra)
    world = build_world(Path(a.cache), cfg, a.model)
    # both sides at the pilot's thread count (what a pilot job runs with): at the machine's
    # default of 2 on a loaded 2-core machine, OpenMP's barriers stretched single steps to 20 s
    torch.set_num_threads(a.threads or cfg.pilot.threads)
    arms = [x for x in a.arms.split(",") if x]
    load = os.getloadavg()
    print(f"pilot_vs_trl: model={world['model']} steps/block={steps} rounds={rounds} "
          f"group={cfg.pilot.group} prompts/step={cfg.pilot.prompts_per_step} "
          f"max_new={cfg.pilot.max_new} torch threads={torch.get_num_threads()} "
          f"load(1,5,15 min)={load[0]:.1f},{load[1]:.1f},{load[2]:.1f} cores={os.cpu_count()}", flush=True)

    variants = [""] if a.no_every_row else ["", "+every_row"]
    ours = [f"ours:{arm}{v}" for arm in arms for v in variants] if a.only != "trl" else []
    order = ours[:len(variants)] + (["trl"] if a.only != "ours" else []) + ours[len(variants):]
    res: dict[str, dict] = {k: {"step_s": [], "cpu_s": [], "tokens": [], "reward": []} for k in order}
    with tempfile.TemporaryDirectory(prefix="pilot_vs_trl_") as tmp:
        for r in range(rounds):
            for k in order:
                out = Path(tmp) / f"{k.replace(':', '_')}_r{r}"
                t0 = time.perf_counter()
                if k == "trl":
                    got = run_trl(cfg, world, out, verify_steps=a.verify_steps)
                else:
                    arm, _, variant = k.split(":")[1].partition("+")
                    got = run_ours(cfg, world, arm, out, every_row=variant == "every_row")
                res[k]["step_s"] += got["step_s"][1:]  # drop the warm-up step of the block
                res[k]["cpu_s"] += got["cpu_s"][1:]
                res[k]["tokens"] += got["tokens"][1:]
                res[k]["reward"] += got["reward"]
                if k == "trl":
                    c = got["checks"]
                    live = [x for x in c if x["live"]]
                    errs = [x["rel_err"] for x in c if x["rel_err"] is not None]
                    print(f"  TRL δS checks: {len(c)} steps ({len(live)} with a non-zero advantage): "
                          f"every knob had a gradient (lm_head's norm median "
                          f"{med([x['lm_head_grad'] or 0 for x in live]):.3g}) and moved, clipped "
                          f"norm max {max([x['norm'] for x in c] or [0]):.3g} <= "
                          f"{cfg.pilot.max_grad_norm}, zeroed after each step; advantages = "
                          f"Dr.GRPO's of our grader's rewards; gradient = ours on TRL's batch in "
                          f"{len(errs)} step(s), relative error max "
                          f"{max(errs) if errs else float('nan'):.1e}", flush=True)
                print(f"  round {r} {k:14s} block {time.perf_counter() - t0:6.1f} s  steps "
                      + " ".join(f"{x:.2f}" for x in got["step_s"])
                      + f"  tokens/step {med(got['tokens']):.0f}", flush=True)

    print("\nmedian over steps (first step of each block dropped):")
    fig = {"load": load, "steps": steps, "rounds": rounds, "max_new": cfg.pilot.max_new}
    for k in order:
        s, tk, c = med(res[k]["step_s"]), med(res[k]["tokens"]), med(res[k]["cpu_s"])
        fig[k] = {"s_per_step": s, "cpu_s_per_step": c, "tokens_per_step": tk, "n": len(res[k]["step_s"])}
        print(f"  {k:14s} {s:7.3f} s/step  {c:7.3f} CPU s/step  {tk:6.0f} completion tokens/step  "
              f"{1000 * s / max(tk, 1):6.2f} s per 1k tokens  (n={len(res[k]['step_s'])})")
    if "trl" in res:
        t = fig["trl"]
        for k in order:
            if k == "trl":
                continue
            ratio = fig[k]["s_per_step"] / t["s_per_step"]
            per_tok = (fig[k]["s_per_step"] / max(fig[k]["tokens_per_step"], 1)) / \
                (t["s_per_step"] / max(t["tokens_per_step"], 1))
            target = 0.8 if "vanilla" in k else 1.0
            cpu_ratio = fig[k]["cpu_s_per_step"] / t["cpu_s_per_step"]
            fig[k]["ratio_vs_trl"], fig[k]["ratio_per_token_vs_trl"] = ratio, per_tok
            fig[k]["cpu_ratio_vs_trl"] = cpu_ratio
            basis = "every row through the loss, as TRL" if k.endswith("+every_row") else \
                "published: zero-variance groups skipped"
            print(f"  {k} / trl = {ratio:.2f}x per step (wall), {per_tok:.2f}x per completion token, "
                  f"{cpu_ratio:.2f}x CPU s per step (target <= {target}; {basis})")
    end_load = os.getloadavg()
    fig["load_end"] = end_load
    print(f"load at the end (1,5,15 min) = {end_load[0]:.1f},{end_load[1]:.1f},{end_load[2]:.1f}")
    if a.json:
        Path(a.json).write_text(json.dumps(fig, indent=1))
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(REPO))
    sys.exit(main())
