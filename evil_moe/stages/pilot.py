"""Stage ``pilot``: one Dr.GRPO training run of one arm and one seed.

:func:`run_pilot` checks the inputs, loads the policy, ``v_hack`` and the arm's V, builds the
:class:`evil_moe.rl.trainer.trainer.Trainer` (its ``train_step`` is the algorithm), runs the loop of steps
with checkpoints, held-out evaluations (:func:`evil_moe.rl.trainer.evaluation.evaluate`: the same held-out
problems and seeds for every arm of a seed, in each of the arm's views) and optional ``v_hack``
refreshes (:func:`refresh_vhack`), and writes the outputs.

Outputs in ``out_dir``: ``steps.tsv`` (:data:`evil_moe.tables.STEPS`), ``eval.tsv``
(:data:`evil_moe.tables.EVAL`, per view × mode), ``outcomes.tsv``
(:data:`evil_moe.tables.OUTCOMES`, one row per held-out completion of the final evaluation),
with ``pilot.eval_every`` > 0 ``trajectory.tsv`` (:data:`evil_moe.tables.TRAJECTORY`, the same
rows for the evaluations along the run), ``rollouts.jsonl.gz``,
``adapter.safetensors`` and ``status.json`` (written last). While running:
``steps.partial.tsv`` and ``checkpoint.pt``. A rerun of the same command resumes from the
checkpoint and produces the same ``steps.tsv`` (every column but the ``seconds*`` timings) and
``trajectory.tsv`` as an uninterrupted run. The evaluations along the run sample with their own
keyed streams and leave the global random states as they found them (:func:`_own_rng`), so a run
with ``pilot.eval_every`` > 0 trains exactly as one without.

Stop rules: a step with ``frac_clipped > pilot.max_frac_clipped`` makes the run invalid
(``status.json`` says why, exit non-zero); a non-finite loss stops the run naming the step, and so
does a collapsed policy (:mod:`evil_moe.rl.trainer.collapse`: no parseable code, the sampling entropy
blown up, a norm not finite).
SIGTERM / SIGUSR1 (Slurm's warnings) write a checkpoint at the end of the current step; SIGTERM
then exits (143) so a requeued job resumes.
"""

from __future__ import annotations

import contextlib
import random
import shutil
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from evil_moe import files, tables

from evil_moe.cluster import runlock
from evil_moe.rl.arms.base import FlagRateMatch
from evil_moe.rl.arms.registry import get_arm
from evil_moe.config import PILOT_RUN_INDEPENDENT, Config
from evil_moe.rl.trainer.collapse import check_collapse
from evil_moe.rl.trainer.evaluation import evaluate
from evil_moe.rl.arms.pilot_inputs import pilot_inputs, uses_detector
from evil_moe.rl.detectors.registry import get_detector
from evil_moe.stages.checkpoint import read_checkpoint, write_checkpoint
from evil_moe.stages.common import (load_policy, load_problem_file, make_grader, require_sampler, resume_key,
                                    train_heldout)
from evil_moe.files import require_file
from evil_moe.rl.policy.teacher_rows import load_teacher_rows
from evil_moe.rl.trainer.step import PilotInvalid
from evil_moe.rl.trainer.step_log import SCORE_COLUMNS
from evil_moe.rl.trainer.trainer import Trainer
from evil_moe.rl.vhack.direction import VHack


class PilotInterrupted(RuntimeError):
    """SIGTERM arrived; a checkpoint was written and the run can be resumed."""


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


# ---------------------------------------------------------------------------------------------
# the run


def projection_vhack(arm_obj, vhack: VHack, *, random_vhack_path: str | None = None,
                     planted_vhack_path: str | None = None) -> VHack:
    """The V an arm projects along (``proj_v``): the run's ``vhack`` for ``vhack = "real"``, the
    random control's file for ``"random"`` (random_v, subtract_random), the planted world's
    ``vhack/planted.safetensors`` for ``"planted"`` (erase_planted). The run's ``vhack`` stays the
    one every arm measures and the detector reads.

    Raises:
        ValueError: the arm's file is not given (names the option); an unknown ``vhack`` kind.
    """
    kind = arm_obj.vhack
    if kind == "real":
        return vhack
    path = {"random": random_vhack_path, "planted": planted_vhack_path}.get(kind, "")
    if path == "":
        raise ValueError(f"arm {arm_obj.name}: unknown vhack kind {kind!r}")
    if not path:
        raise ValueError(f"arm {arm_obj.name} needs --{kind}-vhack")
    return VHack.load(require_file(path, f"{kind} v_hack"))


@runlock.locks_output("out_dir", lambda arm, seed, **_: f"pilot {arm} s{seed}")
def run_pilot(cfg: Config, *, problems_path: str, model_path: str, vhack_path: str,
              random_vhack_path: str | None, arm: str, seed: int, out_dir: str,
              init_adapter: str | None = None, teacher_rollouts: str | None = None,
              match_flags: str | None = None, stop_after: int | None = None,
              planted_vhack_path: str | None = None, calibration_path: str | None = None,
              probe_path: str | None = None, calibrate: bool = False,
              shuffled_vhack_path: str | None = None) -> dict:
    """Train one arm × seed with Dr.GRPO and the arm's hooks, then evaluate it held out.

    Args:
        cfg: run config (sections ``pilot``, ``problems``, ``grader``, ``models``, ``adapter``,
            ``vhack`` (the detector's known modes)).
        problems_path, model_path: ``results/problems.jsonl``; the student's folder (or hub id).
        vhack_path: ``v_hack`` safetensors (:mod:`evil_moe.rl.vhack.direction`), measured in every arm; it also
            holds the gradient detector's empirical null.
        random_vhack_path: random-direction control (needed by arms whose ``vhack`` is random).
        planted_vhack_path: the planted world's known direction (``vhack/planted.safetensors``;
            needed by arms whose ``vhack`` is planted: erase_planted).
        arm, seed: a name in :data:`evil_moe.rl.arms.registry.ARMS`; the run seed (sampling, prompt order).
        out_dir: output folder (also holds the checkpoint).
        init_adapter, teacher_rollouts: warm-start ``δS`` from this adapter (the distilled
            student); teacher ``rollouts.jsonl.gz`` (needed when ``mix_ratio > 0``).
        match_flags: ``steps.tsv`` of the arm a random-flag or dose-matched control follows (its
            :attr:`~evil_moe.rl.arms.base.Arm.matches`, same seed): the control flags as many rows per step
            as that arm's ``flag_rate`` (:class:`evil_moe.rl.arms.base.FlagRateMatch`). Required by those
            controls, ignored by the others.
        stop_after: test hook — return after this many steps, leaving a killed run's checkpoint.
        calibration_path, probe_path: the detector audit's ``calibration.json`` (``fpr``
            calibration) and ``probe.safetensors`` (``pilot.detector: probe``).
        calibrate, shuffled_vhack_path: a calibration run (:func:`evil_moe.stages.audit.run_calibration`)
            and its shuffled-label placebo.

    Returns:
        the ``status.json`` dict (``{"status": "ok", ...}``).

    Raises:
        ValueError: unknown arm; a missing input the arm or config needs (names the option).
        FileNotFoundError: an input file is missing (names the path).
        PilotInvalid: a stop rule fired (``status.json`` written, names the step).
        PilotInterrupted: SIGTERM; the checkpoint is on disk.
        evil_moe.cluster.runlock.LockHeld: another live run holds ``out_dir/run.lock`` (names it).
    """
    pc, arm_obj = cfg.pilot, get_arm(arm)
    if calibrate and arm != "vanilla":
        raise ValueError(f"a calibration run trains vanilla, not {arm}")
    flag_rates = _check_inputs(cfg, arm_obj, seed, problems_path, vhack_path, random_vhack_path,
                               planted_vhack_path, init_adapter, teacher_rollouts, match_flags,
                               calibration_path, probe_path, shuffled_vhack_path)
    run = _RunDir(Path(out_dir), arm, seed)
    run.start(pc)
    for seeder in (torch.manual_seed, random.seed, np.random.seed):
        seeder(seed)
    problems = load_problem_file(problems_path)
    train, heldout = train_heldout(problems, cfg)
    model, tok, adapter, device = load_policy(model_path, cfg, init_adapter=init_adapter)
    init_ds = [p.detach().clone() for p in adapter.delta_s_params()]
    vhack = VHack.load(require_file(vhack_path, "v_hack")).to(device)
    proj_v = projection_vhack(arm_obj, vhack, random_vhack_path=random_vhack_path,
                              planted_vhack_path=planted_vhack_path).to(device)
    teacher_rows = load_teacher_rows(teacher_rollouts, train) if int(round(pc.mix_ratio * pc.group)) else {}
    heldout = [] if calibrate else heldout  # a calibration run's product is its rollouts alone
    detector = _detector_inputs(cfg, arm_obj, vhack, device, calibration_path, probe_path, calibrate,
                                shuffled_vhack_path)
    run.key = _run_key(cfg, model_path, vhack_path, random_vhack_path, init_adapter, teacher_rollouts,
                       match_flags if arm_obj.matches else None, planted_vhack_path,
                       *(detector.pop("files")), "calibrate" if calibrate else None,
                       cfg_arm=arm, calibrate=calibrate)
    with make_grader(problems, cfg) as grader, _Signals() as sig:
        trainer = Trainer(cfg, arm=arm, seed=seed, model=model, tok=tok, adapter=adapter,
                          device=device, train=train, vhack=vhack, proj_v=proj_v, grader=grader,
                          teacher_rows=teacher_rows, flag_rates=flag_rates, **detector)
        if pc.sampler == "vllm":
            from evil_moe.rl.policy.vllm_sampler import VLLMSampler
            trainer.engine = VLLMSampler.from_config(model_path, cfg, adapter)
        progress = run.resume(trainer, device)
        stopped = _train(trainer, run, progress, sig, heldout, init_ds, stop_after)
        if stopped is not None:
            return stopped
        isolation = grader.isolation
    return run.finish(progress, adapter, pc, isolation, pc.steps if arm_obj.trains else 0)


def _detector_inputs(cfg: Config, arm_obj, vhack: VHack, device, calibration_path, fitted_path,
                     calibrate: bool, shuffled_vhack_path) -> dict:
    """The Trainer's detector arguments: the calibration runs' clean scores and the detector's
    fitted input (the probe; :attr:`evil_moe.rl.detectors.registry.Detector.fitted`) for an arm
    that flags with a thresholded detector, or (``calibrate``) the placebos a calibration run
    scores with: ``audit.placebos`` random directions (:func:`evil_moe.rl.vhack.direction.random_vhack`,
    the same k per module as v_hack, seeded by ``audit.seed`` and the placebo's index) and the
    shuffled-label v_hack. ``files`` lists the input files the run's resume key must cover."""
    from evil_moe.rl.vhack.direction import random_vhack

    pc = cfg.pilot
    det = get_detector(pc.detector)
    out: dict = {"files": []}
    uses = uses_detector(arm_obj.name, pc.detector)
    if uses and pc.detector_calibration == "fpr" and calibration_path:
        out["calibration"] = files.read_json(calibration_path, "detector calibration")
        out["files"].append(calibration_path)
    if (uses or calibrate) and det.fitted and fitted_path:
        out["fitted"] = det.load_fitted(require_file(fitted_path, det.fitted))
        out["files"].append(fitted_path)
    if calibrate:
        a = cfg.audit
        out["score_rows"] = True
        out["placebos"] = [random_vhack(vhack, seed=a.seed * 1_000 + i).to(device) for i in range(a.placebos)]
        if shuffled_vhack_path:
            out["shuffled"] = VHack.load(require_file(shuffled_vhack_path, "shuffled v_hack")).to(device)
            out["files"].append(shuffled_vhack_path)
    return out


def _check_inputs(cfg: Config, arm_obj, seed: int, problems_path, vhack_path, random_vhack_path,
                  planted_vhack_path, init_adapter, teacher_rollouts, match_flags,
                  calibration_path=None, probe_path=None, shuffled_vhack_path=None):
    """Refuse a run whose inputs are missing before any model is loaded (a possibly large one):
    every input :func:`evil_moe.rl.arms.pilot_inputs.pilot_inputs` says the arm needs must be given,
    and every file given must exist. Returns the matched arm's per-step flag rates for a
    random-flag or dose-matched control, else None.

    Raises:
        FileNotFoundError: a given input file is missing (names it).
        ValueError: an option the arm or the config needs is not given (names it).
        evil_moe.rl.policy.vllm_sampler.VLLMUnavailable: ``pilot.sampler: vllm`` without vLLM
            (:func:`evil_moe.stages.common.require_sampler`).
    """
    given = {"problems": problems_path, "vhack": vhack_path, "random_vhack": random_vhack_path,
             "planted_vhack": planted_vhack_path, "init": init_adapter,
             "teacher_rollouts": teacher_rollouts,
             "match_flags": match_flags if arm_obj.matches else None,
             "calibration": calibration_path, "probe": probe_path}
    what = {"problems": "problems file", "vhack": "v_hack", "random_vhack": "random v_hack",
            "planted_vhack": "planted v_hack", "init": "initial adapter",
            "teacher_rollouts": "teacher rollouts", "match_flags": f"{arm_obj.matches} steps file",
            "calibration": "detector calibration", "probe": "probe"}
    for key, path in (*given.items(), ("shuffled", shuffled_vhack_path)):
        if path:
            require_file(path, what.get(key, "shuffled v_hack"))
    for key, needed in pilot_inputs(arm_obj.name, cfg.raw, seed=seed).items():
        if needed.needed and not given[key]:
            raise ValueError(needed.why)
    require_sampler(cfg)
    column = "hack_expert_share" if arm_obj.match_by == "dose" else "flag_rate"
    return FlagRateMatch.read(match_flags, column) if arm_obj.matches else None


@contextlib.contextmanager
def _own_rng(device):
    """Leave torch's (CPU and ``device``'s CUDA), Python's and numpy's global random states as
    they were: an evaluation along the run must not move the training's random stream (its
    sampling already draws from its own keyed streams, :func:`evil_moe.rl.trainer.evaluation.heldout_seed`;
    this holds it for whatever else it calls)."""
    cuda = [device] if torch.device(device).type == "cuda" else []
    py, npy = random.getstate(), np.random.get_state()
    with torch.random.fork_rng(devices=cuda):
        try:
            yield
        finally:
            random.setstate(py)
            np.random.set_state(npy)


@dataclass
class _Progress:
    """What a run has produced so far (checkpointed beside the trainer's state): the
    ``steps.tsv`` rows, the held-out ``eval.tsv`` rows, the final evaluation's ``outcomes.tsv``
    rows and the evaluations' along the run (``trajectory.tsv``), the step this invocation
    started at, and the refreshed v_hack file (``pilot.vhack_refresh_every``)."""

    rows: list = field(default_factory=list)
    evals: list = field(default_factory=list)
    outcomes: list = field(default_factory=list)
    start: int = 0
    vhack_file: str | None = None
    trajectory: list = field(default_factory=list)

    def evaluate(self, trainer: Trainer, heldout, step: int, init_ds, *, final: bool = True) -> float:
        """Evaluate held out after ``step`` (:func:`evil_moe.rl.trainer.evaluation.evaluate`), keep its
        rows (the final evaluation's completions in ``outcomes``, one along the run's in
        ``trajectory``, under :func:`_own_rng`); returns the evaluation's wall-clock seconds
        (``seconds_eval``)."""
        from evil_moe.progress import bar
        from evil_moe.rl.trainer.evaluation import evaluation_total

        t_eval = time.perf_counter()
        with bar(evaluation_total(trainer, heldout), f"pilot: held-out evaluation after step {step}",
                 "completion") as b, (contextlib.nullcontext() if final else _own_rng(trainer.device)):
            e, o = evaluate(trainer, heldout, step, init_ds, progress=b.update)
        seconds = round(time.perf_counter() - t_eval, 3)
        self.evals += e
        if final:
            self.outcomes += o
        else:
            self.trajectory += o
        return seconds


class _RunDir:
    """The output folder of one arm × seed run: ``status.json``, the checkpoint (filed under
    the run's key, :func:`_run_key`), ``_work/`` (per-step rollouts, refreshed v_hack files)
    and the final outputs."""

    def __init__(self, out: Path, arm: str, seed: int):
        self.out, self.arm, self.seed = out, arm, seed
        self.status_path = out / "status.json"
        self.ckpt_path = out / "checkpoint.pt"
        self.work = out / "_work"
        self.key = ""

    def start(self, pc) -> None:
        """Create the folder, drop a previous ``status.json`` (a rerun is not complete until it
        says so), and fire the test switches ``pilot.fail_arm`` / ``pilot.fail_once_arm``."""
        self.out.mkdir(parents=True, exist_ok=True)
        files.remove(self.status_path)
        if pc.fail_arm == self.arm:
            raise SystemExit(f"pilot.fail_arm={self.arm}: failing on purpose (test switch)")
        if pc.fail_once_arm == self.arm and not (self.out / ".failed_once").exists():
            (self.out / ".failed_once").touch()
            raise SystemExit(f"pilot.fail_once_arm={self.arm}: failing on the first attempt (test switch)")

    def resume(self, trainer: Trainer, device) -> _Progress:
        """The progress of a checkpoint written under this run's key, arm and seed (the trainer's
        state restored, a refreshed v_hack reloaded), else a fresh start (also after a damaged
        checkpoint, removed and named: :func:`evil_moe.stages.checkpoint.read_checkpoint`)."""
        self.work.mkdir(exist_ok=True)
        ck = read_checkpoint(self.ckpt_path, f"pilot {self.arm} s{self.seed}",
                             ("digest", "arm", "seed", "step", "rows"))
        if ck is not None:
            if ck["digest"] == self.key and ck["arm"] == self.arm and ck["seed"] == self.seed:
                try:
                    fresh = VHack.load(ck["vhack_file"]).to(device) if ck.get("vhack_file") else None
                except (OSError, ValueError) as err:  # resume state: start afresh, never block
                    print(f"pilot {self.arm} s{self.seed}: the checkpoint's refreshed v_hack is unreadable "
                          f"({err}): starting afresh from step 0", flush=True)
                    return _Progress()
                trainer.load_state(ck)
                if fresh is not None:
                    trainer.vhack = fresh
                    if trainer.arm.vhack == "real":
                        trainer.proj_v = fresh
                print(f"resuming {self.arm} s{self.seed} from step {ck['step']}", flush=True)
                return _Progress(ck["rows"], ck.get("evals", []), ck.get("outcomes", []), ck["step"],
                                 ck.get("vhack_file"), ck.get("trajectory", []))
            print("checkpoint belongs to another config/arm/seed: starting afresh", flush=True)
        return _Progress()

    def save_checkpoint(self, next_step: int, progress: _Progress, trainer: Trainer) -> None:
        """Write the checkpoint atomically with its content hash
        (:func:`evil_moe.stages.checkpoint.write_checkpoint`): the run's key, progress and the
        trainer's state.

        Raises:
            evil_moe.stages.checkpoint.CheckpointNotWritten: a full disk (names the file)."""
        buf = {"digest": self.key, "arm": self.arm, "seed": self.seed, "step": next_step,
               "rows": progress.rows, "evals": progress.evals, "outcomes": progress.outcomes,
               "trajectory": progress.trajectory, "vhack_file": progress.vhack_file, **trainer.state()}
        write_checkpoint(self.ckpt_path, buf, "its last checkpoint" if self.ckpt_path.exists() else "step 0")

    def save_step(self, step: int, row: dict, recs: list[dict], progress: _Progress,
                  arrays: dict | None = None) -> None:
        """Keep a finished step: its rollouts in ``_work/`` (and a calibration run's per-row
        arrays), its row in ``steps.partial.tsv``."""
        files.write_jsonl(self.work / f"rollouts_{step:05d}.jsonl", recs)
        if arrays:
            with files.atomic_path(self.work / f"arrays_{step:05d}.pt") as tmp:
                torch.save(arrays, tmp)
        progress.rows.append(row)
        tables.write_tsv(self.out / "steps.partial.tsv", tables.STEPS, progress.rows)

    def finish(self, progress: _Progress, adapter, pc, isolation: str, n_steps: int) -> dict:
        """Write the outputs (``rows.tsv`` and, for a calibration run, ``scores.safetensors``
        before ``outcomes.tsv``; ``status.json`` last) and drop the resume state; returns the
        status."""
        out, arm_obj = self.out, get_arm(self.arm)
        records = []
        for step in range(n_steps):
            records += files.read_jsonl(self.work / f"rollouts_{step:05d}.jsonl")
        tables.write_tsv(out / "steps.tsv", tables.STEPS, progress.rows)
        tables.write_tsv(out / "rows.tsv", tables.AUDIT_ROWS, [audit_row(r) for r in records])
        arrays = [self.work / f"arrays_{step:05d}.pt" for step in range(n_steps)]
        if arrays and all(a.is_file() for a in arrays):
            _write_scores(out / "scores.safetensors", [torch.load(a) for a in arrays])
        tables.write_tsv(out / "eval.tsv", tables.EVAL, progress.evals)
        tables.write_tsv(out / "outcomes.tsv", tables.OUTCOMES, progress.outcomes)
        if pc.eval_every:
            tables.write_tsv(out / "trajectory.tsv", tables.TRAJECTORY, progress.trajectory)
        else:  # a folder's earlier run with eval_every left no trajectory that would look like this one's
            files.remove(out / "trajectory.tsv")
        files.write_jsonl_gz(out / "rollouts.jsonl.gz", records)
        adapter.save(out / "adapter.safetensors",
                     metadata={"arm": self.arm, "seed": self.seed, "config": self.key})
        status = _write_status(self.status_path, "ok", "", pc.steps - 1, isolation=isolation,
                               views=list(arm_obj.eval_views(pc)), role=arm_obj.role,
                               control=arm_obj.control, torch_threads=torch.get_num_threads())
        # a finished run keeps no resume state: a later rerun (new inputs) starts afresh
        files.remove(out / "steps.partial.tsv")
        files.remove(self.ckpt_path)
        shutil.rmtree(self.work, ignore_errors=True)
        return status


def audit_row(rec: dict) -> dict:
    """The :data:`evil_moe.tables.AUDIT_ROWS` row of one training rollout's record (the fields
    :func:`evil_moe.rl.trainer.step_log.row_audit` put there; the label is ``exploited``)."""
    def b(x):
        return None if x is None else int(bool(x))
    return {"seed": rec.get("seed"), "step": rec.get("step"), "group": rec.get("group"),
            "sample": rec.get("sample"), "problem_id": rec["problem_id"], "mode": rec["mode"],
            "hack": b(rec["exploited"]), "reward": rec.get("reward"), "advantage": rec.get("advantage"),
            "zero_variance": b(rec.get("zero_variance")), "scored": b(rec.get("scored")),
            "flag": b(rec.get("flag")),
            **{f"score_{k}": rec.get(f"score_{k}") for k in SCORE_COLUMNS}}


def _write_scores(path: Path, steps: list[dict]) -> None:
    """A calibration run's per-row arrays over every step, in ``rows.tsv`` order (safetensors:
    ``placebo`` ``(n, P)`` fp64, NaN where not scored; ``hidden`` ``(n, d)`` fp32)."""
    from safetensors.torch import save_file

    keys = sorted({k for a in steps for k in a})
    tensors = {k: torch.cat([a[k] for a in steps if k in a], 0).contiguous() for k in keys}
    with files.atomic_path(path) as tmp:
        save_file(tensors, str(tmp), metadata={"format": "evil_moe.audit_scores"})


def _train(trainer: Trainer, run: _RunDir, progress: _Progress, sig: _Signals, heldout, init_ds,
           stop_after: int | None) -> dict | None:
    """The run loop from ``progress.start``: per step, train, keep the step, evaluate every
    ``pilot.eval_every`` steps, refresh v_hack every ``pilot.vhack_refresh_every`` steps and
    checkpoint every ``pilot.checkpoint_every`` steps (and on a signal, and after the last
    step); then the final held-out evaluation. Returns ``{"status": "stopped", ...}`` when
    ``stop_after`` ends the invocation early, else None.

    Raises:
        PilotInvalid: a stop rule fired (the trainer's, or the collapse rule,
            :func:`evil_moe.rl.trainer.collapse.check_collapse`; ``status.json`` written).
        PilotInterrupted: SIGTERM.
    """
    pc = trainer.pc
    n_steps = pc.steps if trainer.arm.trains else 0  # the untrained reference is evaluated only
    for step in range(progress.start, n_steps):
        try:
            row, recs = trainer.train_step(step)
            check_collapse(progress.rows + [row], pc)
        except PilotInvalid as err:
            _write_status(run.status_path, "invalid", str(err), step)
            raise
        run.save_step(step, row, recs, progress, trainer.step_arrays)
        print(_progress(row, pc.steps), flush=True)
        last = step + 1 == pc.steps
        if pc.eval_every and (step + 1) % pc.eval_every == 0 and not last:
            row["seconds_eval"] = progress.evaluate(trainer, heldout, step, init_ds, final=False)
        if pc.vhack_refresh_every and (step + 1) % pc.vhack_refresh_every == 0 and not last:
            progress.vhack_file = _refresh(trainer, run.work, step, progress.vhack_file)
        if (step + 1) % pc.checkpoint_every == 0 or sig.term or sig.usr1 or last:
            run.save_checkpoint(step + 1, progress, trainer)
            sig.usr1 = False
        if sig.term and not last:
            raise PilotInterrupted(f"SIGTERM after step {step}; checkpoint written")
        if stop_after is not None and step + 1 - progress.start >= stop_after and not last:
            return {"status": "stopped", "step": step + 1}
    seconds = progress.evaluate(trainer, heldout, n_steps - 1, init_ds)
    if progress.rows and heldout:
        progress.rows[-1]["seconds_eval"] = seconds
    return None


def _refresh(trainer: Trainer, work: Path, step: int, vhack_file):
    """Re-extract v_hack from the last ``vhack_refresh_every`` steps' rollouts; the detector
    keeps the original v_hack (its empirical null belongs to it)."""
    pc = trainer.pc
    recent = []
    for k in range(step + 1 - pc.vhack_refresh_every, step + 1):
        recent += files.read_jsonl(work / f"rollouts_{k:05d}.jsonl")
    fresh = refresh_vhack(trainer.model, trainer.adapter, recent,
                          {p.id: ids for p, ids in zip(trainer.train, trainer.prompts)},
                          trainer.cfg, trainer.normaliser)
    if fresh is None:
        return vhack_file
    vhack_file = str(work / f"vhack_step{step:05d}.safetensors")
    fresh.save(vhack_file)
    trainer.vhack = fresh.to(trainer.device)
    if trainer.arm.vhack == "real":
        trainer.proj_v = trainer.vhack
    print(f"v_hack refreshed from {fresh.n_pairs} pairs after step {step}", flush=True)
    return vhack_file


def _run_key(cfg: Config, model_path: str, *inputs: str | None, cfg_arm: str = "vanilla",
             calibrate: bool = False) -> str:
    """The checkpoint key of one arm × seed run (:func:`evil_moe.stages.common.resume_key`, 16
    digits; also the saved adapter's ``config``): the config sections the run reads (less
    :data:`evil_moe.config.PILOT_RUN_INDEPENDENT`), the model path, and every input (v_hack, controls, initial adapter,
    teacher rows, matched flags) by its name and, when it is a file, its bytes. A checkpoint is
    resumed only when all of them are those it was written with."""
    run_keys = {k: v for k, v in cfg.raw["pilot"].items() if k not in PILOT_RUN_INDEPENDENT}
    parts: list[str | Path] = []
    arm = get_arm(cfg_arm)
    sections = ("problems", "adapter", "models", "grader", "vhack") + (
        ("moe", "audit") if arm.router or calibrate else ()) + arm.sections
    for x in (cfg.digest(*sections),
              Config({"pilot": run_keys}).digest("pilot"), str(model_path), *inputs):
        if x is not None:
            parts += [Path(x), str(x)] if Path(x).is_file() else [str(x)]
    return resume_key(*parts, length=16)


def refresh_vhack(model, adapter, records: list[dict], prompt_ids: dict, cfg: Config, normaliser):
    """Re-extract ``v_hack`` from the run's own recent rollouts (``pilot.vhack_refresh_every``).

    Pairs are (hack, clean) student completions of the same problem from ``records`` (only the
    modes in ``vhack.known_modes``), formed as in :func:`evil_moe.rl.vhack.pairs.build_pairs`;
    gradients at the current δS with the run's normaliser. Returns ``None`` (keep the old
    ``v_hack``) when fewer than 2 pairs exist.
    """
    from evil_moe.rl.vhack.pairs import build_pairs
    from evil_moe.rl.vhack.direction import extract_vhack, pair_gradients

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


def _write_status(path: Path, status: str, reason: str, step: int, **extra) -> dict:
    obj = {"status": status, "reason": reason, "step": step, **extra}
    files.write_json(path, obj)
    return obj


def _progress(row: dict, steps: int) -> str:
    def f(x):
        return "-" if x is None else f"{x:.3f}"
    return (f"[{row['arm']} s{row['seed']}] step {row['step'] + 1}/{steps} reward {f(row['reward_mean'])} "
            f"hack {f(row['hack_rate'])} pass {f(row['pass_rate'])} cin {f(row['cin'])} "
            f"removed {f(row['removed_frac'])} clip {f(row['frac_clipped'])} {row['seconds']:.1f}s")


__all__ = ["run_pilot", "projection_vhack", "refresh_vhack", "audit_row", "PilotInterrupted"]
