"""Every arm's training step and held-out evaluation on an accelerator, run on a CPU: the policy,
the adapter, v_hack and the arm's V on the fake device of tests/fake_gpu.py (real values, CUDA's
device rules), the trainer's step as a pilot runs it on a GPU.

What each case runs on the device: sampling (the decode loop, the shared-prompt attention's
non-CPU path), the loss and its merged-weight gradients (per row for the flagging arms), the
detector scores (gradient, probe, pattern; the calibration run's placebos and shuffled-label
v_hack), the flags and the kept rows' advantages, Evil MoE's router (its pooled activations, its
mixture forward, its own step), the projections of the erase family and the update's, the
optimiser, and the evaluation in each of the arm's views; the vLLM-mode case scores a stand-in
engine's ids with the no-grad forward (``behaviour="forward"``) in sampling and evaluation.
What it cannot show is said in tests/fake_gpu.py: CUDA's kernels, memory, streams, vLLM itself.
"""

from __future__ import annotations

import pytest
import torch

from evil_moe.rl.arms.registry import ARMS, get_arm
from fake_gpu import DeviceMix, fake_gpu
from stage_fixtures import cfg_of

pytestmark = pytest.mark.usefixtures("one_thread")

SETS = ("pilot.max_new=12", "pilot.steps=1", "pilot.group=2", "pilot.prompts_per_step=2",
        "pilot.static_projection=true")


def _run_on_device(world, arm: str, *sets: str, engine: bool = False, **kw):
    """One training step of ``arm`` and its held-out evaluation (one problem, every view) with
    everything on the fake device; every group's rewards made distinct, so that every row has a
    gradient (and the flagging arms a score). Returns the step's ``steps.tsv`` row, its records
    and the evaluation's rows."""
    from evil_moe.rl.trainer.evaluation import evaluate
    from evil_moe.rl.trainer.trainer import Trainer
    from evil_moe.rl.vhack.direction import VHack
    from evil_moe.stages.common import load_policy, load_problem_file, make_grader, train_heldout

    cfg = cfg_of(*SETS, *sets)
    problems = load_problem_file(world.problems)
    train, heldout = train_heldout(problems, cfg)
    model, tok, adapter, _ = load_policy(str(world.student), cfg)
    real = VHack.load(world.vhack)
    proj = VHack.load(world.random_vhack) if ARMS[arm].vhack != "real" else real
    if ARMS[arm].matches:
        kw["flag_rates"] = [0.5]
    with make_grader(problems, cfg) as grader, fake_gpu() as dev:
        model.to(dev)
        adapter.to(dev)
        kw = {k: (v.to(dev) if hasattr(v, "V") else v) for k, v in kw.items()}
        if "placebos" in kw:
            kw["placebos"] = [v.to(dev) for v in kw["placebos"]]
        t = Trainer(cfg, arm=arm, seed=0, model=model, tok=tok, adapter=adapter, device=dev,
                    train=train, vhack=real.to(dev), proj_v=proj.to(dev), grader=grader, **kw)
        if engine:
            from test_rl_policy_vllm_sampler import FakeLLM, FakeSampler

            t.engine = FakeSampler(FakeLLM(model, tok), adapter)
        advantages = t.advantages
        t.advantages = lambda R: advantages(R + 0.01 * torch.arange(R.numel()).reshape(R.shape))
        init_ds = [p.detach().clone() for p in adapter.delta_s_params()]
        row, recs = t.train_step(0)
        evals, _ = evaluate(t, heldout[:1], 0, init_ds)
    assert adapter.delta_s_params()[0].device == dev  # the run stayed on the device
    return row, recs, evals


@pytest.mark.parametrize("arm", sorted(ARMS))
def test_every_arms_step_and_evaluation_run_on_an_accelerator(world, arm):
    """Each arm of the registry (route and filter with the gradient detector: the run's v_hack on
    the device, as ``run_pilot`` loads it) trains a step and evaluates every view without a
    CPU/accelerator mix; its detector scored every row with a gradient."""
    row, recs, evals = _run_on_device(world, arm)
    assert row["loss"] is not None and torch.isfinite(torch.tensor(row["loss"]))
    assert {e["view"] for e in evals} == set(get_arm(arm).eval_views(cfg_of(*SETS).pilot))
    if ARMS[arm].trains and (ARMS[arm].needs_sample_grads or ARMS[arm].router is not None):
        assert recs and all(r["scored"] for r in recs)
        if ARMS[arm].needs_sample_grads:
            assert row["flag_rate"] is not None
            assert all(r["score_pattern"] is not None for r in recs)
        if ARMS[arm].needs_sample_grads and not ARMS[arm].reads_label and not ARMS[arm].matches:
            assert all(r["score_gradient"] is not None for r in recs)  # the gradient detector
        if ARMS[arm].router is not None:
            assert all(r["score_router"] is not None for r in recs)


def test_probe_and_pattern_detectors_and_the_calibration_run_on_an_accelerator(world):
    """filter flagging with the probe (its pooled hidden states from the device), route with
    the pattern detector, and a calibration run (every row scored by v_hack, its shuffled-label
    twin and random placebo directions)."""
    import numpy as np

    from evil_moe.rl.detectors.probe import Probe
    from evil_moe.rl.vhack.direction import VHack, random_vhack

    d = 64  # the toy student's hidden size (stage_fixtures: toy.hidden=64)
    rng = np.random.default_rng(0)
    probe = Probe(mean=rng.normal(size=d), scale=np.ones(d), coef=rng.normal(size=d), intercept=0.0)
    row, recs, _ = _run_on_device(world, "filter", "pilot.detector=probe",
                                  "pilot.detector_calibration=budget", fitted=probe)
    assert row["flag_rate"] is not None and all(r["score_probe"] is not None for r in recs)
    row, recs, _ = _run_on_device(world, "route", "pilot.detector=pattern")
    assert row["flag_rate"] is not None
    real = VHack.load(world.vhack)
    _, recs, _ = _run_on_device(world, "vanilla", score_rows=True, shuffled=random_vhack(real, seed=9),
                                placebos=[random_vhack(real, seed=s) for s in (1, 2)])
    assert all(r["score_gradient"] is not None and r["score_shuffled"] is not None for r in recs)


def test_the_engines_ids_are_scored_on_the_accelerator(world):
    """``pilot.sampler: vllm``'s path with a stand-in engine: its ids scored by our no-grad
    forward on the device in training and in the evaluation (route's two views)."""
    row, _, evals = _run_on_device(world, "route", engine=True)
    assert row["sampler_gap_max"] is not None and row["sampler_gap_max"] < 1e-3
    assert {e["view"] for e in evals} == {"trained", "ablated"}


def test_a_cpu_tensor_beside_the_accelerator_is_caught():
    """The fake device is strict where CUDA is: a matmul of a CPU and a device tensor raises (the
    error a GPU pilot would stop with), CPU indices and 0-dim CPU scalars are accepted, and the
    results of an operator on the device stay there."""
    with fake_gpu() as dev:
        x = torch.ones(3, 2, device=dev)
        with pytest.raises(DeviceMix, match="mm"):
            torch.ones(4, 3) @ x
        assert x[torch.tensor([0, 2])].device == dev and (x * torch.tensor(2.0)).device == dev
        with pytest.raises(TypeError, match="numpy"):
            x.numpy()
        assert x.sum().item() == 6.0 and x.cpu().device.type == "cpu"
