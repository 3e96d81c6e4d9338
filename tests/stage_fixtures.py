"""Shared inputs for the stage tests (tests/test_stage_*.py): one tiny trained toy world per session.

``toy_world`` builds, once per test session under a session tmp dir, with the real stage code:
the problem set (12 toy problems, 9 training + 3 held out), a tiny trained student and hacky
teacher (``train_toy_models`` at hidden 64 / 2 layers / vocab 400, 80 NLL steps each: both
are half-trained, so the student's rewards vary within a group (fenced block or not) and GRPO
gradients are non-zero), a *synthetic* teacher rollouts file and
``v_hack`` extracted from it.

The synthetic rollouts (two hack and two clean completions per training problem, from the
env's answer templates, token ids encoded once, behaviour log-probs from a forward pass of the
real teacher, grades from the real Grader) are legitimate inputs for extract / distill / pilot
since those stages read files only; they guarantee (hack, clean) pairs on every problem whatever
the floating-point details of toy training on the machine at hand. The real teacher stage is
tested on its own in test_stage_teacher.py.
"""

from __future__ import annotations

import os
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

# Tiny sizes for every stage (schema defaults otherwise; no config file, so that edits of
# config/config.yaml by others do not change these tests).
BASE_SETS: tuple[str, ...] = (
    "problems.limit=12",
    "models.device=cpu",
    "grader.workers=2",
    "toy.hidden=64", "toy.layers=2", "toy.intermediate=128", "toy.vocab_size=400",
    "toy.train_steps=80", "toy.lr=0.02", "toy.batch_size=8", "toy.n_examples=120",
    "toy.teacher_hack_frac=0.8", "toy.eval_samples=4",
    "teacher.n=4", "teacher.max_new=64",
    "vhack.max_pairs=8", "vhack.bootstrap=20",
    "distill.steps=2", "distill.batch_size=4",
    "pilot.max_new=48", "pilot.group=3", "pilot.prompts_per_step=2", "pilot.steps=2",
    "pilot.checkpoint_every=1", "pilot.heldout_samples=1", "pilot.seeds=[0]",
    # route/filter thresholded as before the audit (the extract stage's teacher null) unless a
    # test asks for the calibration runs' threshold (tests/test_audit.py)
    "pilot.detector_calibration=teacher",
    "compare.last_k=2", "compare.n_boot=100",
)


def sets(*extra: str) -> list[str]:
    """The base overrides plus ``extra`` (later wins)."""
    return list(BASE_SETS) + list(extra)


def cfg_of(*extra: str):
    """A validated :class:`~evil_moe.config.Config` of the base overrides plus ``extra``."""
    from evil_moe.config import load_config

    return load_config((), sets(*extra))


def set_flags(*extra: str) -> list[str]:
    """``--set a=b`` flags for the CLI (same values as :func:`cfg_of`)."""
    out = []
    for s in sets(*extra):
        out += ["--set", s]
    return out


def evil_moe_cmd() -> list[str]:
    """The ``evil-moe`` console script of this interpreter's environment."""
    exe = Path(sys.executable).parent / "evil-moe"
    if exe.exists():
        return [str(exe)]
    found = shutil.which("evil-moe")
    return [found] if found else [sys.executable, "-m", "evil_moe.cli"]


def subprocess_env() -> dict:
    env = dict(os.environ)
    env.setdefault("HF_HUB_OFFLINE", "1")
    env["TQDM_DISABLE"] = "1"
    env["PYTHONUNBUFFERED"] = "1"
    env["OMP_NUM_THREADS"] = "1"  # tiny models: extra threads only contend on a busy machine
    return env


@dataclass(frozen=True)
class World:
    root: Path
    problems: Path
    student: Path
    teacher: Path
    rollouts: Path       # synthetic teacher rollouts (see module docstring)
    vhack: Path          # main_hack.safetensors
    random_vhack: Path   # main_random.safetensors
    vhack_dir: Path
    extract: dict        # run_extract's return value
    toy_summary: list    # train_toy_models's return value


def synthetic_rollouts(cfg, problems_path: Path, teacher_path: Path, out: Path) -> list[dict]:
    """Write teacher-like ``rollouts.jsonl.gz`` from answer templates; returns the records.

    Per training problem: hack variants 0 and 1 and the clean answer with and without its own
    tests; ids encoded once (+ eos), behaviour log-probs from the teacher's no_grad forward at
    ``teacher.temperature``, the full grade from the real Grader. Same fields as
    :func:`evil_moe.rl.policy.rollout.rollout_record`.
    """
    import torch

    from evil_moe import files
    from evil_moe.env.grader import Grader
    from evil_moe.env.answers import clean_completion, hack_completion
    from evil_moe.model.load import load_model
    from evil_moe.model.logprobs import build_batch, token_logprobs
    from evil_moe.stages.common import load_problem_file, train_heldout
    from evil_moe.rl.policy.rollout import prompt_ids_for

    problems = load_problem_file(problems_path)
    train, _ = train_heldout(problems, cfg)
    model, tok = load_model(str(teacher_path), device="cpu")
    prompts = prompt_ids_for(tok, train)
    rows = []
    for p, pids in zip(train, prompts):
        for text in (hack_completion(p, variant=0), hack_completion(p, variant=1),
                     clean_completion(p), clean_completion(p, with_tests=False)):
            rows.append((p, pids, text, tok.encode(text, add_special_tokens=False) + [tok.eos_token_id]))
    batch = build_batch([r[1] for r in rows], [r[3] for r in rows], tok.pad_token_id)
    with torch.no_grad():
        logp = token_logprobs(model, batch, cfg.teacher.temperature)
    g = cfg.grader
    with Grader(problems, format_bonus=g.format_bonus, pass_reward=g.pass_reward, timeout=g.timeout,
                memory_mb=g.memory_mb, workers=g.workers) as grader:
        rewards = grader.grade_many([(p, text) for p, _, text, _ in rows])
    recs = []
    for b, ((p, pids, text, ids), w) in enumerate(zip(rows, rewards)):
        start = int(batch.prompt_lens[b])
        lp = logp[b, start:start + len(ids)]
        recs.append({"problem_id": p.id, "mode": p.mode, "completion": text, "prompt_ids": list(pids),
                     "completion_ids": list(ids), "behaviour_logp": [round(float(x), 6) for x in lp],
                     "truncated": False, "source": "teacher", "reward": w.reward, "passed": w.passed,
                     "gt_correct": w.gt_correct, "exploited": w.exploited, "format_ok": w.format_ok,
                     "error": w.error, "step": -1, "seed": 0, "arm": "teacher"})
    files.write_jsonl_gz(out, recs)
    return recs


def build_world(root: Path) -> World:
    """Run problems → toy-models → synthetic teacher rows → extract under ``root``."""
    import torch

    from evil_moe.stages.extract import run_extract
    from evil_moe.stages.problems import write_problem_set
    from evil_moe.stages.toy import train_toy_models

    cfg = cfg_of()
    root.mkdir(parents=True, exist_ok=True)
    problems = root / "problems.jsonl"
    write_problem_set(cfg, str(problems))
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the same arithmetic as the --threads 1 subprocesses
    try:
        summary = train_toy_models(cfg, problems_path=str(problems), out_dir=str(root / "models"))
    finally:
        torch.set_num_threads(threads)
    rollouts = root / "teacher_rows" / "rollouts.jsonl.gz"
    synthetic_rollouts(cfg, problems, root / "models" / "teacher", rollouts)
    vdir = root / "vhack"
    res = run_extract(cfg, problems_path=str(problems), rollouts_path=str(rollouts),
                      model_path=str(root / "models" / "student"), out_dir=str(vdir))
    return _world_at(root, res, summary)


def _world_at(root: Path, extract: dict, toy_summary: list) -> World:
    vdir = root / "vhack"
    return World(root=root, problems=root / "problems.jsonl", student=root / "models" / "student",
                 teacher=root / "models" / "teacher",
                 rollouts=root / "teacher_rows" / "rollouts.jsonl.gz",
                 vhack=vdir / "main_hack.safetensors", random_vhack=vdir / "main_random.safetensors",
                 vhack_dir=vdir, extract=extract, toy_summary=toy_summary)


def shared_world(root: Path) -> World:
    """:func:`build_world` under ``root`` at most once however many processes ask (the xdist
    workers of one session): the first takes an exclusive lock on ``root``.lock and builds it,
    recording the stages' return values in ``root``.pickle; the others wait on the lock and read
    the record. Tests only read the world."""
    import fcntl
    import pickle

    record = root.parent / (root.name + ".pickle")
    root.parent.mkdir(parents=True, exist_ok=True)
    with open(root.parent / (root.name + ".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not record.is_file():
            shutil.rmtree(root, ignore_errors=True)
            w = build_world(root)
            record.write_bytes(pickle.dumps((w.extract, w.toy_summary)))
        extract, summary = pickle.loads(record.read_bytes())
    return _world_at(root, extract, summary)


def read_tsv(path) -> list[dict]:
    """Rows of a TSV as dicts of strings."""
    import csv

    with open(path, newline="") as fh:
        return list(csv.DictReader(fh, delimiter="\t"))


def header(path) -> list[str]:
    """The header cells of a TSV."""
    return Path(path).read_text().splitlines()[0].split("\t")


def tsv_without(path, column: str = "seconds") -> list[list[str]]:
    """TSV cells (header included) without the wall-clock columns (``column`` and every
    ``<column>_<phase>``): the resume comparison."""
    lines = [ln.split("\t") for ln in Path(path).read_text().splitlines()]
    keep = [j for j, c in enumerate(lines[0]) if c != column and not c.startswith(column + "_")]
    return [[row[j] for j in keep] for row in lines]


def trainer(world: World, arm: str, cfg, grader, **kw):
    """A :class:`~evil_moe.rl.trainer.trainer.Trainer` of ``arm`` (seed 0) on the world's student at
    δS = 0 and its training problems: v_hack as the arm's V, projected along the random control
    V where the arm's registry entry says ``vhack == "random"``; ``kw`` goes to the Trainer."""
    from evil_moe.rl.arms.registry import ARMS
    from evil_moe.rl.trainer.trainer import Trainer
    from evil_moe.rl.vhack.direction import VHack
    from evil_moe.stages.common import load_policy, load_problem_file, train_heldout

    train, _ = train_heldout(load_problem_file(world.problems), cfg)
    model, tok, adapter, device = load_policy(str(world.student), cfg)
    real = VHack.load(world.vhack)
    proj = VHack.load(world.random_vhack) if ARMS[arm].vhack == "random" else real
    return Trainer(cfg, arm=arm, seed=0, model=model, tok=tok, adapter=adapter, device=device,
                   train=train, vhack=real, proj_v=proj, grader=grader, **kw)


def pilot_kwargs(world: World, out: Path, arm: str = "erase", seed: int = 0, **kw) -> dict:
    """``run_pilot`` arguments for the world's student, v_hack and random control."""
    return dict(problems_path=str(world.problems), model_path=str(world.student),
                vhack_path=str(world.vhack), random_vhack_path=str(world.random_vhack), arm=arm,
                seed=seed, out_dir=str(out), **kw)


def step_with_rows(t, start: int = 0, tries: int = 12, ok=None):
    """The first step from ``start`` (within ``tries``) whose rollouts pass ``ok(adv, rows)``
    (default: some row has reward variance), as the trainer's sample, grade and advantages give
    it: ``(batch, grades, R, adv, rows, step)``."""
    ok = ok or (lambda adv, rows: bool(rows))
    for step in range(start, start + tries):
        batch = t.sample(step)
        grades, R = t.grade(batch)
        adv, rows = t.advantages(R)
        if ok(adv, rows):
            return batch, grades, R, adv, rows, step
    raise AssertionError("no step with reward variance in the fixture")
