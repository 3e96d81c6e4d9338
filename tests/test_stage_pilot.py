"""The pilot stage (evil_moe/stages/pilot.py): outputs, resume in process and after SIGKILL, stop
rules, the paired design, v_hack refresh, projections, micro-batches.

The session fixture ``world`` (tests/stage_fixtures.py) trains the tiny toy models once; the tests
here reuse it.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

from evil_moe import files, tables
from evil_moe.cli import main
from stage_fixtures import (cfg_of, evil_moe_cmd, header, pilot_kwargs, read_tsv, set_flags, subprocess_env, tsv_without)

# tiny models on a busy 2-core machine: one torch thread (the conftest fixture)
pytestmark = pytest.mark.usefixtures("one_thread")

# ------------------------------------------------------------------------------------------------
# pilot, in process


@pytest.fixture(autouse=True)
def _one_thread_each():
    """A pilot's numbers depend on torch's thread count (float reduction order: the sampler gap
    and an erase's cout differ in their last digits at 2 threads); an in-process CLI test
    elsewhere in the session may have changed it, so every test here runs at one thread."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="session")
def erase_run(world, tmp_path_factory) -> Path:
    """An uninterrupted erase pilot (3 steps, seed 0), run in process at one thread (session
    fixtures are set up before the function-scoped thread fixture)."""
    import torch

    from evil_moe.stages.pilot import run_pilot

    out = tmp_path_factory.mktemp("erase_ref")
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        status = run_pilot(cfg_of(), **pilot_kwargs(world, out))
    finally:
        torch.set_num_threads(before)
    assert status["status"] == "ok"
    return out


N_STEPS = 2  # pilot.steps in stage_fixtures.BASE_SETS


def test_pilot_outputs(world, erase_run):
    from evil_moe.rl.trainer.trainer import prompt_schedule

    assert header(erase_run / "steps.tsv") == tables.names(tables.STEPS)
    rows = read_tsv(erase_run / "steps.tsv")
    assert [int(r["step"]) for r in rows] == list(range(N_STEPS))
    assert any(float(r["grad_norm"]) > 0 for r in rows)  # the fixture gives reward variance
    assert all(float(r["frac_clipped"]) == 0.0 for r in rows)  # pure on-policy: ρ ≡ 1
    assert all(float(r["delta_s_hack_norm"]) == 0.0 for r in rows)
    # per-phase seconds: each phase is part of the step's seconds; held-out evaluation only
    # after the last step (it ran once, at the end), and not part of that step's seconds
    phases = ("sample", "grade", "loss", "arm", "optimiser")
    for r in rows:
        parts = [float(r[f"seconds_{p}"]) for p in phases]
        assert all(x >= 0 for x in parts) and parts[0] > 0
        assert sum(parts) <= float(r["seconds"]) + 0.01
    assert [r["seconds_eval"] == "" for r in rows] == [True] * (N_STEPS - 1) + [False]
    assert float(rows[-1]["seconds_eval"]) > 0
    assert json.loads((erase_run / "status.json").read_text())["status"] == "ok"
    assert not (erase_run / "steps.partial.tsv").exists()
    assert (erase_run / "adapter.safetensors").is_file()
    ev = read_tsv(erase_run / "eval.tsv")
    assert header(erase_run / "eval.tsv") == tables.names(tables.EVAL)
    assert {r["view"] for r in ev} == {"trained"} and "all" in {r["mode"] for r in ev}
    recs = files.read_jsonl(erase_run / "rollouts.jsonl.gz")
    assert len(recs) == N_STEPS * 3 * 2 and {r["source"] for r in recs} == {"student"}
    # the prompts are the paired sampler's, in order
    from evil_moe.stages.common import load_problem_file, train_heldout

    train, held = train_heldout(load_problem_file(world.problems), cfg_of())
    for step in range(N_STEPS):
        ids = [r["problem_id"] for r in recs if r["step"] == step][::3]
        assert ids == [train[i].id for i in prompt_schedule(len(train), 2, 0, step)]
    assert not {r["problem_id"] for r in recs} & {p.id for p in held}  # held-out never trained on


def test_prompt_schedule_is_epochwise_and_seeded():
    from evil_moe.rl.trainer.trainer import prompt_schedule

    seq = [i for s in range(9) for i in prompt_schedule(9, 2, 0, s)]
    assert sorted(seq[:9]) == list(range(9)) and sorted(seq[9:18]) == list(range(9))
    assert seq[:6] != [i for s in range(3) for i in prompt_schedule(9, 2, 1, s)]
    with pytest.raises(ValueError):
        prompt_schedule(0, 2, 0, 0)


def test_pilot_stop_after_then_resume_in_process(world, erase_run, tmp_path):
    from evil_moe.stages.pilot import run_pilot

    cfg = cfg_of()
    first = run_pilot(cfg, **pilot_kwargs(world, tmp_path), stop_after=1)
    assert first["status"] == "stopped" and (tmp_path / "checkpoint.pt").exists()
    assert not (tmp_path / "steps.tsv").exists()
    assert run_pilot(cfg, **pilot_kwargs(world, tmp_path))["status"] == "ok"
    assert tsv_without(tmp_path / "steps.tsv") == tsv_without(erase_run / "steps.tsv")
    assert (files.read_jsonl(tmp_path / "rollouts.jsonl.gz")
            == files.read_jsonl(erase_run / "rollouts.jsonl.gz"))


@pytest.mark.parametrize("damage", ["cut", "flipped"])
def test_a_damaged_checkpoint_is_named_and_the_pilot_starts_afresh(world, erase_run, tmp_path, capsys, damage):
    """A checkpoint cut short (torch cannot read it) or with one changed byte
    (torch reads other numbers; its SHA-256, recorded beside it, is not the one written) never
    blocks the pilot: the rerun says in one line which file is damaged and why, removes it,
    starts afresh from step 0 and ends with the uninterrupted run's steps. On 09ede95 the cut
    checkpoint stopped every rerun with a torch error."""
    from evil_moe.stages.pilot import run_pilot

    cfg = cfg_of()
    assert run_pilot(cfg, **pilot_kwargs(world, tmp_path), stop_after=1)["status"] == "stopped"
    ckpt = tmp_path / "checkpoint.pt"
    data = bytearray(ckpt.read_bytes())
    if damage == "cut":
        data = data[: len(data) // 2]
    else:
        data[len(data) // 2] ^= 0x01
    ckpt.write_bytes(bytes(data))
    capsys.readouterr()
    assert run_pilot(cfg, **pilot_kwargs(world, tmp_path))["status"] == "ok"
    said = [line for line in capsys.readouterr().out.splitlines() if "damaged" in line]
    assert len(said) == 1 and said[0].startswith(f"pilot erase s0: checkpoint {ckpt} is damaged (")
    assert said[0].endswith("): removed it, starting afresh from step 0")
    assert tsv_without(tmp_path / "steps.tsv") == tsv_without(erase_run / "steps.tsv")


DISK_FULL_CHECKPOINT = """
import sys
from pathlib import Path
import torch
from evil_moe.stages.pilot import _Progress, _RunDir

class Trainer:
    def __init__(self, n):
        self.n = n
    def state(self):
        return {"delta_s": [torch.ones(self.n)]}

run = _RunDir(Path(sys.argv[1]), "erase", 0)
run.key = "k"
run.save_checkpoint(1, _Progress(), Trainer(10))
try:
    run.save_checkpoint(2, _Progress(), Trainer(100_000))
except Exception as err:
    print("ERR", type(err).__name__, err)
print("KEPT", torch.load(run.ckpt_path, weights_only=False)["step"])
print("LEFT", sorted(p.name for p in run.out.iterdir()))
"""


def test_a_full_disk_while_checkpointing_is_one_line(tmp_path):
    """The disk fills while the pilot writes its checkpoint (a 64 KiB tmpfs):
    one OSError naming the checkpoint, the cause and where a rerun resumes, not torch's internal
    error (09ede95: RuntimeError "[enforce fail at inline_container.cc] unexpected pos"); the
    previous checkpoint is intact and no temporary file is left."""
    from test_files import in_small_tmpfs

    proc = in_small_tmpfs(DISK_FULL_CHECKPOINT)
    assert proc.returncode == 0, proc.stderr
    out = dict(line.split(" ", 1) for line in proc.stdout.splitlines())
    assert out["ERR"].startswith("CheckpointNotWritten [Errno 28] cannot write "), out["ERR"]
    assert "checkpoint.pt: No space left on device; the run stopped: make room and run it again, it " \
           "resumes from its last checkpoint" in out["ERR"]
    assert out["KEPT"] == "1" and out["LEFT"] == str([".checkpoint.pt.sha256", "checkpoint.pt"])


def test_pilot_paired_design(world, erase_run, tmp_path):
    from evil_moe.stages.pilot import run_pilot

    cfg = cfg_of()
    run_pilot(cfg, **pilot_kwargs(world, tmp_path / "vanilla", arm="vanilla"))
    run_pilot(cfg, **pilot_kwargs(world, tmp_path / "subtract", arm="subtract", seed=0))
    base = files.read_jsonl(erase_run / "rollouts.jsonl.gz")
    for arm in ("vanilla", "subtract"):
        other = files.read_jsonl(tmp_path / arm / "rollouts.jsonl.gz")
        for step in range(N_STEPS):
            assert ([r["problem_id"] for r in other if r["step"] == step]
                    == [r["problem_id"] for r in base if r["step"] == step])
        # same δS = 0 start and sampling seed: identical step-0 completions
        assert ([(r["completion_ids"], r["completion"]) for r in other if r["step"] == 0]
                == [(r["completion_ids"], r["completion"]) for r in base if r["step"] == 0])
    rows = {a: read_tsv(tmp_path / a / "steps.tsv") for a in ("vanilla", "subtract")}
    assert all(r["cout"] == r["cin"] for r in rows["vanilla"])  # vanilla measures only
    assert all(float(r["removed_frac"]) == 0 for r in rows["vanilla"])
    ev = read_tsv(tmp_path / "subtract" / "eval.tsv")
    assert {r["view"] for r in ev} == {"trained", "ablated"}
    fired = [float(r["frac_fired"]) for r in rows["subtract"]]
    if any(f > 0 for f in fired) and any(float(r["grad_norm"]) > 0 for r in rows["subtract"]):
        assert float(rows["subtract"][-1]["delta_s_hack_norm"]) > 0  # subtract trains δS_hack


def test_pilot_eval_every_route_views(world, tmp_path):
    """eval_every 1 evaluates after step 0 too, in both of route's views: its rates in eval.tsv,
    its completions in trajectory.tsv; outcomes.tsv keeps the final evaluation alone."""
    from evil_moe.stages.pilot import run_pilot

    run_pilot(cfg_of("pilot.eval_every=1"), **pilot_kwargs(world, tmp_path, arm="route"))
    ev = read_tsv(tmp_path / "eval.tsv")
    assert sorted({(int(r["step"]), r["view"]) for r in ev}) == [
        (0, "ablated"), (0, "trained"), (1, "ablated"), (1, "trained")]
    n_held = 4  # one per mode with problems.limit=12, heldout_frac 0.25
    assert all(int(r["n"]) == n_held for r in ev if r["mode"] == "all")
    assert header(tmp_path / "trajectory.tsv") == tables.names(tables.TRAJECTORY)
    traj, out = read_tsv(tmp_path / "trajectory.tsv"), read_tsv(tmp_path / "outcomes.tsv")
    assert sorted({(int(r["step"]), r["view"]) for r in traj}) == [(0, "ablated"), (0, "trained")]
    assert sorted({(int(r["step"]), r["view"]) for r in out}) == [(1, "ablated"), (1, "trained")]
    # the same problems and samples at every evaluation
    assert (sorted((r["view"], r["problem_id"], r["sample"]) for r in traj)
            == sorted((r["view"], r["problem_id"], r["sample"]) for r in out))


def _drawing_evaluate(monkeypatch):
    """The pilot's evaluate, drawing from every global random stream first (as a sampler or
    grader that used them would)."""
    import random

    import numpy as np

    import evil_moe.stages.pilot as pilot_mod

    real = pilot_mod.evaluate

    def evaluate(*a, **kw):
        torch.rand(3), random.random(), np.random.random()
        return real(*a, **kw)

    monkeypatch.setattr(pilot_mod, "evaluate", evaluate)


def test_pilot_evaluations_along_the_run_leave_the_training_alone(world, tmp_path, monkeypatch):
    """A pilot with eval_every > 0 trains exactly as one without: the same steps.tsv (less
    seconds), rollouts and final outcomes, and the same global random states in its checkpoint,
    even when the evaluation draws from the global streams; only the one with eval_every writes a
    trajectory.tsv. Without the evaluation's own random state (pilot._own_rng) the checkpoints'
    states differ."""
    from evil_moe.stages.pilot import run_pilot

    _drawing_evaluate(monkeypatch)
    runs = {}
    for every in (0, 2):
        cfg = cfg_of("pilot.steps=4", f"pilot.eval_every={every}")
        d = tmp_path / f"every{every}"
        assert run_pilot(cfg, **pilot_kwargs(world, d), stop_after=3)["status"] == "stopped"
        runs[every] = torch.load(d / "checkpoint.pt", weights_only=False)
        assert run_pilot(cfg, **pilot_kwargs(world, d))["status"] == "ok"
    for key in ("torch_rng", "py_rng", "np_rng"):
        a, b = runs[0][key], runs[2][key]
        assert (torch.equal(a, b) if key == "torch_rng" else str(a) == str(b)), key
    a, b = tmp_path / "every0", tmp_path / "every2"
    assert tsv_without(a / "steps.tsv") == tsv_without(b / "steps.tsv")
    assert files.read_jsonl(a / "rollouts.jsonl.gz") == files.read_jsonl(b / "rollouts.jsonl.gz")
    assert (a / "outcomes.tsv").read_bytes() == (b / "outcomes.tsv").read_bytes()
    assert not (a / "trajectory.tsv").exists()
    assert {int(r["step"]) for r in read_tsv(b / "trajectory.tsv")} == {1}
    assert [r["seconds_eval"] != "" for r in read_tsv(b / "steps.tsv")] == [False, True, False, True]


def test_pilot_trajectory_resumes_without_loss_or_duplicate(world, tmp_path):
    """A pilot stopped after an evaluation along the run and resumed from its checkpoint writes
    the uninterrupted run's trajectory.tsv: the evaluation before the stop is kept once, the one
    after it is added; a rerun of the finished folder with eval_every 0 removes it."""
    from evil_moe.stages.pilot import run_pilot

    cfg = cfg_of("pilot.steps=3", "pilot.eval_every=1")
    run_pilot(cfg, **pilot_kwargs(world, tmp_path / "whole"))
    cut = tmp_path / "cut"
    assert run_pilot(cfg, **pilot_kwargs(world, cut), stop_after=1)["status"] == "stopped"
    assert run_pilot(cfg, **pilot_kwargs(world, cut))["status"] == "ok"
    whole = (tmp_path / "whole" / "trajectory.tsv").read_bytes()
    assert (cut / "trajectory.tsv").read_bytes() == whole
    rows = read_tsv(cut / "trajectory.tsv")
    assert sorted(int(r["step"]) for r in rows) == [0] * (len(rows) // 2) + [1] * (len(rows) // 2)
    assert len({(r["step"], r["view"], r["problem_id"], r["sample"]) for r in rows}) == len(rows)
    run_pilot(cfg_of("pilot.steps=3"), **pilot_kwargs(world, cut))
    assert not (cut / "trajectory.tsv").exists() and not files.hash_record(cut / "trajectory.tsv").exists()


def _first_step_with_gradient(erase_run) -> int:
    rows = read_tsv(erase_run / "steps.tsv")
    steps = [int(r["step"]) for r in rows if float(r["frac_zero_std"]) < 1.0]
    assert steps, "fixture problem: no step with reward variance"
    return steps[0]


def test_pilot_stops_on_clip_fraction(world, erase_run, tmp_path, monkeypatch):
    import evil_moe.rl.policy.grpo
    from evil_moe.stages.pilot import run_pilot
    from evil_moe.rl.trainer.step import PilotInvalid

    real = evil_moe.rl.policy.grpo.dr_grpo_loss

    def clipped(*a, **k):
        loss, stats = real(*a, **k)
        return loss, dataclasses.replace(stats, frac_clipped=0.9)

    monkeypatch.setattr(evil_moe.rl.policy.grpo, "dr_grpo_loss", clipped)
    step = _first_step_with_gradient(erase_run)
    with pytest.raises(PilotInvalid, match=f"at step {step}"):
        run_pilot(cfg_of(), **pilot_kwargs(world, tmp_path))
    st = json.loads((tmp_path / "status.json").read_text())
    assert st["status"] == "invalid" and st["step"] == step and "frac_clipped" in st["reason"]
    assert not (tmp_path / "steps.tsv").exists()


def test_pilot_stops_on_real_clipping_with_teacher_rows(world, tmp_path):
    """Teacher rows (mix_ratio > 0) carry the teacher's log-probs: ρ ≠ 1 and the clip engages."""
    from evil_moe.stages.pilot import run_pilot
    from evil_moe.rl.trainer.step import PilotInvalid

    cfg = cfg_of("pilot.mix_ratio=0.34", "pilot.max_frac_clipped=0.0")
    with pytest.raises(PilotInvalid, match="frac_clipped"):
        run_pilot(cfg, **pilot_kwargs(world, tmp_path), teacher_rollouts=str(world.rollouts))
    assert json.loads((tmp_path / "status.json").read_text())["status"] == "invalid"
    with pytest.raises(ValueError, match="teacher-rollouts"):
        run_pilot(cfg, **pilot_kwargs(world, tmp_path / "x"))


def test_pilot_stops_on_non_finite_loss(world, erase_run, tmp_path, monkeypatch):
    import evil_moe.rl.policy.grpo
    from evil_moe.stages.pilot import run_pilot
    from evil_moe.rl.trainer.step import PilotInvalid

    real = evil_moe.rl.policy.grpo.dr_grpo_loss

    def nan_loss(*a, **k):
        loss, stats = real(*a, **k)
        return loss * float("nan"), stats

    monkeypatch.setattr(evil_moe.rl.policy.grpo, "dr_grpo_loss", nan_loss)
    step = _first_step_with_gradient(erase_run)
    with pytest.raises(PilotInvalid, match=f"non-finite loss .* at step {step}"):
        run_pilot(cfg_of(), **pilot_kwargs(world, tmp_path))
    st = json.loads((tmp_path / "status.json").read_text())
    assert st["status"] == "invalid" and st["step"] == step and "non-finite" in st["reason"]


def test_a_collapsed_pilot_stops_naming_the_step(world, tmp_path):
    """pilot.lr 100 wrecks the student at its first update (on the embedded
    default: no parseable code from step 1 on; here the tests' toy samples noise, its entropy 4x
    step 0's and more). The pilot stops as on a non-finite loss: PilotInvalid naming the step and
    the cause, status.json invalid with them (the gate refuses an invalid status:
    test_stage_compare.py). On 09ede95 it ran all its steps and wrote status ok."""
    from evil_moe.stages.pilot import run_pilot
    from evil_moe.rl.trainer.step import PilotInvalid

    cfg = cfg_of("pilot.lr=100", "pilot.steps=6", "pilot.checkpoint_every=10")
    with pytest.raises(PilotInvalid, match=r"^collapsed at step (\d+): ") as err:
        run_pilot(cfg, **pilot_kwargs(world, tmp_path / "vanilla" / "s0", arm="vanilla"))
    st = json.loads((tmp_path / "vanilla" / "s0" / "status.json").read_text())
    step = int(re.match(r"collapsed at step (\d+)", str(err.value)).group(1))
    assert st["status"] == "invalid" and st["reason"] == str(err.value) and st["step"] == step
    rows = read_tsv(tmp_path / "vanilla" / "s0" / "steps.partial.tsv")  # the steps before it
    from evil_moe.rl.trainer.collapse import collapsed

    assert len(rows) == step and collapsed(rows, cfg.pilot) is None
    assert not (tmp_path / "vanilla" / "s0" / "steps.tsv").exists()  # never looks complete


def _pilot_args(world, out, arm="erase", *extra_sets):
    return ["pilot", *set_flags(*extra_sets), "--problems", str(world.problems), "--model",
            str(world.student), "--vhack", str(world.vhack), "--random-vhack", str(world.random_vhack),
            "--arm", arm, "--seed", "0", "--out-dir", str(out)]


def test_pilot_fail_switches(world, tmp_path):
    runner = CliRunner()
    res = runner.invoke(main, _pilot_args(world, tmp_path / "a", "erase", "pilot.fail_arm=erase"))
    assert res.exit_code != 0 and "fail_arm" in res.output
    once = _pilot_args(world, tmp_path / "b", "erase", "pilot.fail_once_arm=erase", "pilot.steps=1")
    res = runner.invoke(main, once)
    assert res.exit_code != 0 and "fail_once_arm" in res.output
    res = runner.invoke(main, once)
    assert res.exit_code == 0, res.output
    assert json.loads((tmp_path / "b" / "status.json").read_text())["status"] == "ok"


def test_pilot_without_vllm_stops_before_loading_the_model(world, tmp_path, monkeypatch):
    """pilot.sampler vllm where vLLM does not import: the pilot stops with one line naming this
    Python and `make gpu-env` before it loads the model (on 09ede95 it loaded the model, took
    the SVDs and built the trainer first: ~60 GPU jobs of 8 GB each for nothing)."""
    from evil_moe.rl.policy.vllm_sampler import VLLMUnavailable, vllm_import_error
    from evil_moe.stages import pilot as pilot_stage

    if vllm_import_error() is None:
        pytest.skip("vLLM imports here")

    def never(*a, **k):
        raise AssertionError("the model was loaded")

    monkeypatch.setattr(pilot_stage, "load_policy", never)
    with pytest.raises(VLLMUnavailable, match=r"does not import .*`make gpu-env`"):
        pilot_stage.run_pilot(cfg_of("pilot.sampler=vllm"), **pilot_kwargs(world, tmp_path / "v"))


# ------------------------------------------------------------------------------------------------
# the resume test: a real `evil-moe pilot` process killed with SIGKILL, then rerun


def _n_rows(path: Path) -> int:
    try:
        return max(0, len(path.read_text().splitlines()) - 1)
    except FileNotFoundError:
        return 0


def _start(args, out: Path, log: str) -> subprocess.Popen:
    out.mkdir(parents=True, exist_ok=True)
    fh = open(out.parent / f"{out.name}.{log}.log", "w")
    return subprocess.Popen([*evil_moe_cmd(), *args], stdout=fh, stderr=subprocess.STDOUT,
                            env=subprocess_env(), cwd=str(out.parent))


def _kill_when(proc: subprocess.Popen, ready, timeout: float = 240.0) -> None:
    t0 = time.time()
    while not ready():
        assert proc.poll() is None, f"pilot ended (rc {proc.returncode}) before the kill point"
        assert time.time() - t0 < timeout, "kill point never reached"
        time.sleep(0.01)
    proc.send_signal(signal.SIGKILL)
    assert proc.wait(60) == -signal.SIGKILL


def _log(out: Path, log: str) -> str:
    return (out.parent / f"{out.name}.{log}.log").read_text()


def test_pilot_resume_after_sigkill_matches_uninterrupted(world, tmp_path):
    steps = "pilot.steps=4"
    ref_dir, a_dir, b_dir = tmp_path / "ref", tmp_path / "a", tmp_path / "b"
    args = lambda out, *x: [*_pilot_args(world, out, "erase", steps, *x), "--threads", "1"]  # noqa: E731
    ref = _start(args(ref_dir), ref_dir, "run")  # uninterrupted, in the background

    # C: SIGTERM (Slurm's warning) after the first step: checkpoint at the end of the step, exit 143
    c_dir = tmp_path / "c"
    c = _start(args(c_dir, "pilot.checkpoint_every=3"), c_dir, "killed")
    t0 = time.time()
    while _n_rows(c_dir / "steps.partial.tsv") < 1:
        assert c.poll() is None and time.time() - t0 < 240
        time.sleep(0.01)
    c.send_signal(signal.SIGTERM)
    assert c.wait(120) == 143, _log(c_dir, "killed")
    assert (c_dir / "checkpoint.pt").exists() and not (c_dir / "steps.tsv").exists()
    rc = _start(args(c_dir, "pilot.checkpoint_every=3"), c_dir, "resumed")

    # A: checkpoint every step; SIGKILL right after the checkpoint after step index 1 appears
    a = _start(args(a_dir), a_dir, "killed")
    _kill_when(a, lambda: (a_dir / "checkpoint.pt").exists() and _n_rows(a_dir / "steps.partial.tsv") >= 2)
    # B: checkpoint every 2 steps; SIGKILL once step 2's row is written but its checkpoint is not
    # (the run is then ahead of its checkpoint: step 2 is redone on resume)
    b = _start(args(b_dir, "pilot.checkpoint_every=2"), b_dir, "killed")
    _kill_when(b, lambda: _n_rows(b_dir / "steps.partial.tsv") >= 3)
    assert not (b_dir / "steps.tsv").exists()

    ra = _start(args(a_dir), a_dir, "resumed")
    rb = _start(args(b_dir, "pilot.checkpoint_every=2"), b_dir, "resumed")
    for p in (ref, ra, rb, rc):
        assert p.wait(300) == 0
    for d in (a_dir, b_dir, c_dir):
        log = _log(d, "resumed")
        assert "resuming erase s0 from step" in log, log
        k = int(log.split("resuming erase s0 from step")[1].split()[0])
        assert 0 < k < 4
        if d == b_dir:
            assert k % 2 == 0
        if d == c_dir:
            assert k < 3  # the SIGTERM checkpoint, not the every-3-steps one
        assert tsv_without(d / "steps.tsv") == tsv_without(ref_dir / "steps.tsv")
        assert (files.read_jsonl(d / "rollouts.jsonl.gz")
                == files.read_jsonl(ref_dir / "rollouts.jsonl.gz"))
        # the same seed in another process: the held-out outcomes byte for byte (the sampler's per-row streams)
        assert (d / "outcomes.tsv").read_bytes() == (ref_dir / "outcomes.tsv").read_bytes()
        assert json.loads((d / "status.json").read_text())["status"] == "ok"
    rows = read_tsv(ref_dir / "steps.tsv")
    assert len(rows) == 4 and any(float(r["grad_norm"]) > 0 for r in rows)
    assert any(float(r["delta_s_norm"]) > 0 for r in rows)  # projection state really evolved


def test_refresh_vhack_from_own_rollouts(world):
    """vhack_refresh_every: re-extraction from (hack, clean) rows of the same problem equals the
    extract stage's math on the same pairs; too few pairs keep the old v_hack (None)."""
    from evil_moe.rl.policy.grpo import DrGRPONormaliser
    from evil_moe.stages.common import load_policy, load_problem_file, train_heldout
    from evil_moe.rl.policy.rollout import prompt_ids_for
    from evil_moe.rl.vhack.pairs import build_pairs
    from evil_moe.stages.pilot import refresh_vhack
    from evil_moe.rl.vhack.direction import extract_vhack, pair_gradients

    cfg = cfg_of()
    train, _ = train_heldout(load_problem_file(world.problems), cfg)
    model, tok, adapter, _ = load_policy(str(world.student), cfg)
    pids = {p.id: ids for p, ids in zip(train, prompt_ids_for(tok, train))}
    recs = files.read_jsonl(world.rollouts)  # graded rows with hacks and clean ones per problem
    norm = DrGRPONormaliser(3, 48, 2)
    fresh = refresh_vhack(model, adapter, recs, pids, cfg, norm)
    pairs = build_pairs(recs, pids, None, cfg.vhack.max_pairs)
    ref = extract_vhack(pair_gradients(model, adapter, pairs, norm), cfg.vhack.k)
    assert fresh is not None and fresh.n_pairs == len(pairs) >= 2
    for name in ref.V:
        assert torch.allclose(fresh.V[name], ref.V[name], atol=1e-6)
    only_hacks = [r for r in recs if r["exploited"]]
    assert refresh_vhack(model, adapter, only_hacks, pids, cfg, norm) is None


def test_pilot_vhack_refresh_resumes_identically(world, tmp_path, monkeypatch, capsys):
    """A refreshing run stopped after a refresh resumes with the refreshed v_hack (same TSV).

    The half-trained fixture student rarely hacks, so the refresh is fed the graded teacher
    rows (hacks and clean ones on every problem) instead of the run's own rows."""
    import evil_moe.stages.pilot as pilot_mod

    real = pilot_mod.refresh_vhack
    teacher_rows = files.read_jsonl(world.rollouts)
    monkeypatch.setattr(pilot_mod, "refresh_vhack",
                        lambda model, adapter, records, *a: real(model, adapter, teacher_rows, *a))
    cfg = cfg_of("pilot.vhack_refresh_every=1", "pilot.steps=3")
    assert pilot_mod.run_pilot(cfg, **pilot_kwargs(world, tmp_path / "ref"))["status"] == "ok"
    assert capsys.readouterr().out.count("v_hack refreshed") == 2  # after steps 0 and 1
    pilot_mod.run_pilot(cfg, **pilot_kwargs(world, tmp_path / "cut"), stop_after=2)
    assert pilot_mod.run_pilot(cfg, **pilot_kwargs(world, tmp_path / "cut"))["status"] == "ok"
    assert tsv_without(tmp_path / "cut" / "steps.tsv") == tsv_without(tmp_path / "ref" / "steps.tsv")


def test_pilot_update_projection_erases_the_update(world, tmp_path):
    """projection update: the optimiser's actual update has no hack-ward part (cout_update ~ 0)."""
    from evil_moe.stages.pilot import run_pilot

    cfg = cfg_of("pilot.projection=update")
    assert run_pilot(cfg, **pilot_kwargs(world, tmp_path))["status"] == "ok"
    rows = [r for r in read_tsv(tmp_path / "steps.tsv") if float(r["grad_norm"]) > 0]
    assert rows and all(float(r["cout_update"]) < 1e-5 for r in rows)


def test_subtract_trains_like_vanilla(world, tmp_path):
    """subtract on the update: δS + δS_hack takes exactly vanilla's AdamW update each step (the
    forward sees the sum, whose gradient equals δS's), so with the same seed the training rollouts
    equal vanilla's; δS_hack holds only hack-ward parts of updates, so it lies in the span of
    v_hack's rows — subtract is vanilla plus a post-hoc subtraction (docs/method.md, "Projection")."""
    from safetensors.torch import load_file

    from evil_moe.stages.pilot import run_pilot
    from evil_moe.rl.vhack.direction import VHack

    for arm in ("vanilla", "subtract"):  # default pilot.projection (preconditioned): subtract
        # always splits the update, whatever the knob erase uses
        assert run_pilot(cfg_of(), **pilot_kwargs(world, tmp_path / arm, arm=arm))["status"] == "ok"
    van, rou = read_tsv(tmp_path / "vanilla" / "steps.tsv"), read_tsv(tmp_path / "subtract" / "steps.tsv")
    assert [r["hack_rate"] for r in rou] == [r["hack_rate"] for r in van]
    assert [r["reward_mean"] for r in rou] == [r["reward_mean"] for r in van]
    a_van = load_file(tmp_path / "vanilla" / "adapter.safetensors")
    a_rou = load_file(tmp_path / "subtract" / "adapter.safetensors")
    v = VHack.load(world.vhack)
    ds_keys = [k for k in a_rou if k.endswith("delta_s")]
    assert ds_keys
    moved = 0.0
    for k in ds_keys:
        hk = k[: -len("delta_s")] + "delta_s_hack"
        torch.testing.assert_close(a_rou[k] + a_rou[hk], a_van[k], rtol=1e-4, atol=1e-6)
        name = k[: -len(".delta_s")]
        h = a_rou[hk].double()
        moved += float(h.norm())
        if name in v.V and v.V[name].shape[0]:
            V = v.V[name].double()
            assert float((h - V.T @ (V @ h)).norm()) <= 1e-5 * (1 + float(h.norm())), name
    assert moved > 0  # the evil expert did learn something


def test_pilot_micro_batch_matches_whole_batch(world, erase_run, tmp_path):
    """pilot.micro_batch=1: the constant Dr.GRPO normaliser makes micro-batch gradients sum to the
    whole-batch gradient, so the run matches the whole-batch one up to float summation order."""
    from evil_moe.stages.pilot import run_pilot

    assert run_pilot(cfg_of("pilot.micro_batch=1"), **pilot_kwargs(world, tmp_path))["status"] == "ok"
    a, b = read_tsv(erase_run / "steps.tsv"), read_tsv(tmp_path / "steps.tsv")
    for ra, rb in zip(a, b):
        assert ra["step"] == rb["step"]
        for col in ("loss", "grad_norm", "cin", "delta_s_norm", "frac_clipped", "ratio_p50"):
            if ra[col] == "" or rb[col] == "":
                assert ra[col] == rb[col], col  # both empty: a step without gradient
                continue
            assert math.isclose(float(ra[col]), float(rb[col]), rel_tol=1e-4, abs_tol=1e-7), col
