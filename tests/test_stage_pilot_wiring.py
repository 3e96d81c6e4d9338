"""Wiring of the pilot's arms, V files and held-out evaluation (behaviours no
test failed on before). Each test fails when the behaviour it names is broken:

* random_v removes only along the random V, under the default ``pilot.projection:
  preconditioned`` (and ``gradient``; ``update`` is tested in test_rl_arms.py) — fed the real V it
  would remove along v_hack;
* ``run_pilot`` hands random_v the file at ``random_vhack_path`` as the V it acts along, while
  ``cin`` and the other logged energies are still measured against the real ``v_hack``;
* held-out sampling is paired: every arm of a seed samples with the same seeds per chunk, so two
  arms with identical knobs get identical held-out outcomes;
* the held-out ``truncated`` outcome is 1 exactly for completions that hit ``max_new`` without
  an eos token.

All run on the session's tiny toy world (tests/stage_fixtures.py), in process, in seconds.
"""

from __future__ import annotations

import pytest
import torch

from stage_fixtures import cfg_of, pilot_kwargs, read_tsv

pytestmark = pytest.mark.usefixtures("one_thread")


def _policy(world, cfg):
    """``(train, heldout, model, tok, adapter, device)`` of the world's student at δS = 0."""
    from evil_moe.stages.common import load_policy, load_problem_file, train_heldout

    train, held = train_heldout(load_problem_file(world.problems), cfg)
    return (train, held, *load_policy(str(world.student), cfg))


def _trainer(cfg, arm, policy, grader, *, vhack, proj_v, seed=0):
    from evil_moe.rl.trainer.trainer import Trainer

    train, _, model, tok, adapter, device = policy
    return Trainer(cfg, arm=arm, seed=seed, model=model, tok=tok, adapter=adapter, device=device,
                   train=train, vhack=vhack, proj_v=proj_v, grader=grader)


def _outside_span(x: torch.Tensor, rows: torch.Tensor) -> float:
    """``‖x − Π x‖²`` with ``Π`` the orthogonal projector onto the row span of ``rows (k, r)``
    (fp64)."""
    Q = torch.linalg.qr(rows.double().T).Q  # (r, k), orthonormal columns spanning the rows
    x = x.double()
    return float((x - Q @ (Q.T @ x)).norm() ** 2)


# ------------------------------------------------------------------------------------------------
# 1. random_v acts along the random V in every projection mode


@pytest.mark.parametrize("projection", ["preconditioned", "gradient"])
def test_random_v_removes_only_along_the_random_v(world, projection):
    """Over a few steps of a random_v trainer, the part its hook takes out of the summed gradient
    (``grads.total − δS.grad``) lies, per module, in the span of the random V — weighted by
    AdamW's current preconditioner ``p = 1/(sqrt(v̂)+ε)`` under ``preconditioned`` (rows
    ``v_i ⊙ p``, docs/method.md, "Routing and filtering by data"), unweighted under ``gradient`` — and mostly outside v_hack's
    (so random_v fed the real V fails the first check)."""
    from evil_moe.rl.vhack.projection import adam_preconditioner
    from evil_moe.stages.common import load_problem_file, make_grader
    from evil_moe.rl.vhack.direction import VHack

    cfg = cfg_of() if projection == "preconditioned" else cfg_of(f"pilot.projection={projection}")
    assert cfg.pilot.projection == projection  # the schema's default is the preconditioned one
    real, rnd = VHack.load(world.vhack), VHack.load(world.random_vhack)
    removed2 = in_rnd = in_real = 0.0
    weighted = False
    with make_grader(load_problem_file(world.problems), cfg) as grader:
        t = _trainer(cfg, "random_v", _policy(world, cfg), grader, vhack=real, proj_v=rnd)
        for step in range(4):
            batch = t.sample(step)
            grades, R = t.grade(batch)
            adv, rows = t.advantages(R)
            grads = t.gradients(batch, adv, rows, step)
            pre = [adam_preconditioner(t.opt, p).double() if projection == "preconditioned"
                   else torch.ones_like(p, dtype=torch.float64) for p in t.ds]
            weighted |= any(float(p.max() - p.min()) > 1e-6 * float(p.max()) for p in pre)
            t.apply_arm(batch, grades, adv, grads, step)
            for name, g, p, w in zip(t.adapter.names, grads.total, t.ds, pre):
                removed = g.double() - p.grad.double()
                removed2 += float(removed.norm() ** 2)
                in_rnd += _outside_span(removed, rnd.V[name].double() * w[None, :])
                in_real += _outside_span(removed, real.V[name].double() * w[None, :])
            t.optimiser_step(grads, step)
    assert removed2 > 0, "no step removed anything: the check below would be vacuous"
    assert in_rnd <= 1e-8 * removed2, f"{in_rnd / removed2:.3g} of the removed energy is outside the random V"
    assert in_real >= 0.5 * removed2  # along v_hack instead, the first check would fail
    if projection == "preconditioned":
        assert weighted  # a later step ran with a non-uniform preconditioner (not just P = I)


# ------------------------------------------------------------------------------------------------
# 2. run_pilot: random_v acts along random_vhack_path's V and measures against v_hack


STEP_COLS = ("cin", "cout", "removed_frac", "grad_span_frac", "update_span_frac", "cout_update",
             "delta_s_norm")


def test_run_pilot_gives_random_v_the_random_v_and_measures_against_the_real_v(world, tmp_path):
    """run_pilot(random_v)'s steps.tsv and final δS equal those of a trainer given
    ``vhack = v_hack`` and ``proj_v = the random V`` by hand; a trainer given the real V to act
    along (random_v == erase) or the random V to measure against differs in those columns."""
    from safetensors.torch import load_file

    from evil_moe.stages.common import load_problem_file, make_grader
    from evil_moe.stages.pilot import run_pilot
    from evil_moe.rl.vhack.direction import VHack

    cfg = cfg_of()
    assert run_pilot(cfg, **pilot_kwargs(world, tmp_path, arm="random_v"))["status"] == "ok"
    got = read_tsv(tmp_path / "steps.tsv")
    final = {k[:-len(".delta_s")]: t for k, t in load_file(tmp_path / "adapter.safetensors").items()
             if k.endswith(".delta_s")}
    real, rnd = VHack.load(world.vhack), VHack.load(world.random_vhack)
    ref, ds = {}, {}
    with make_grader(load_problem_file(world.problems), cfg) as grader:
        for case, (vh, pv) in {"right": (real, rnd), "acts_real": (real, real),
                               "measures_random": (rnd, rnd)}.items():
            t = _trainer(cfg, "random_v", _policy(world, cfg), grader, vhack=vh, proj_v=pv)
            ref[case] = [t.train_step(s)[0] for s in range(cfg.pilot.steps)]
            ds[case] = {n: p.detach().clone() for n, p in zip(t.adapter.names, t.ds)}
    assert len(got) == cfg.pilot.steps
    assert any(float(r["removed_frac"]) > 0 for r in got), "random_v removed nothing: vacuous"
    # Adam divides by sqrt(v): a last-bit difference in a reduction's order (another machine's
    # kernels) grows to ~1e-5 relative over the steps; the wrong wirings differ by over 1e-3
    for g, want in zip(got, ref["right"]):
        for col in STEP_COLS:
            assert float(g[col]) == pytest.approx(want[col], rel=1e-4, abs=1e-6), (g["step"], col)
    for name, want in ds["right"].items():
        torch.testing.assert_close(final[name], want, rtol=1e-4, atol=1e-6)
    # the wrong wirings are distinguishable in these columns (else this test could not fail)
    for case, cols in (("acts_real", ("removed_frac", "cout")), ("measures_random", ("cin",))):
        assert any(want[col] != pytest.approx(other[col], rel=1e-3, abs=1e-6)
                   for want, other in zip(ref["right"], ref[case]) for col in cols), case
    assert any(not torch.allclose(ds["right"][n], ds["acts_real"][n], rtol=1e-3, atol=1e-7) for n in final)


# ------------------------------------------------------------------------------------------------
# 3. held-out sampling is paired across the arms of a seed


def _recording_generate(monkeypatch):
    """Wrap the held-out evaluation's ``generate``; returns the list it appends ``(prompts, n,
    seed, rollouts)`` of every call to."""
    import evil_moe.rl.trainer.evaluation as evaluation_mod

    calls, real = [], evaluation_mod.generate

    def wrapped(model, tok, prompts, **kw):
        rolls = real(model, tok, prompts, **kw)
        calls.append((tuple(tuple(p) for p in prompts), kw["n"], kw["seed"], rolls))
        return rolls

    monkeypatch.setattr(evaluation_mod, "generate", wrapped)
    return calls


def test_heldout_sampling_is_paired_across_arms(world, monkeypatch):
    """Four arms of seed 0 sharing one adapter (identical δS, δS_hack = 0) evaluate held out:
    every view of every arm makes the same generate calls (same chunk of prompts, same seed) as
    vanilla, gets the same completions and writes the same outcomes. Seed 1 gets other
    completions, so the comparison can fail."""
    from evil_moe.rl.trainer.evaluation import evaluate
    from evil_moe.stages.common import load_problem_file, make_grader
    from evil_moe.rl.vhack.direction import VHack

    cfg = cfg_of("pilot.heldout_samples=2", "pilot.eval_chunk=2")
    real, rnd = VHack.load(world.vhack), VHack.load(world.random_vhack)
    policy = _policy(world, cfg)
    held, adapter = policy[1], policy[4]
    assert len(held) > cfg.pilot.eval_chunk  # more than one chunk
    init = [p.detach().clone() for p in adapter.delta_s_params()]
    calls = _recording_generate(monkeypatch)
    per_view = {}  # (arm, view) -> (calls, outcomes without the arm)
    with make_grader(load_problem_file(world.problems), cfg) as grader:
        for arm, seed in (("vanilla", 0), ("erase", 0), ("random_v", 0), ("route", 0), ("vanilla", 1)):
            t = _trainer(cfg, arm, policy, grader, vhack=real,
                         proj_v=rnd if arm == "random_v" else real, seed=seed)
            calls.clear()
            _, out = evaluate(t, held, 0, init)
            n_chunks = -(-len(held) // cfg.pilot.eval_chunk)
            views = sorted({o["view"] for o in out})
            assert len(calls) == n_chunks * len(views)
            for v_i, view in enumerate(t.arm.views):
                mine = calls[v_i * n_chunks:(v_i + 1) * n_chunks]
                per_view[(arm, seed, view)] = (
                    [c[2] for c in mine], [(c[0], c[1]) for c in mine],
                    [[r.completion_ids for r in c[3]] for c in mine],
                    [{k: v for k, v in o.items() if k not in ("arm", "view")} for o in out if o["view"] == view])
    assert {k[2] for k in per_view} == {"trained", "ablated"}
    base_seeds, base_chunks, base_comps, base_out = per_view[("vanilla", 0, "trained")]
    assert len(set(base_seeds)) == len(base_seeds)  # one seed per chunk
    for key, (seeds, chunks, comps, outcomes) in per_view.items():
        if key[1] != 0:
            continue
        assert chunks == base_chunks, key
        assert seeds == base_seeds, key
        assert comps == base_comps, key
        assert outcomes == base_out, key
    assert per_view[("vanilla", 1, "trained")][2] != base_comps  # completions depend on the seed


# ------------------------------------------------------------------------------------------------
# 4. held-out truncation


def test_heldout_truncated_marks_completions_that_hit_max_new(world, monkeypatch):
    """Each held-out outcome's ``truncated`` is 1 exactly when its completion has ``max_new``
    tokens and no eos (worked out from the sampled token ids), and eval.tsv's
    ``truncated_rate`` is its mean per mode. At ``max_new`` 48 the toy student ends some
    completions and runs others to the limit, so both values occur."""
    from evil_moe.rl.trainer.evaluation import evaluate
    from evil_moe.stages.common import load_problem_file, make_grader
    from evil_moe.rl.vhack.direction import VHack

    cfg = cfg_of("pilot.heldout_samples=4", "pilot.max_new=48")
    v = VHack.load(world.vhack)
    policy = _policy(world, cfg)
    held, tok, adapter = policy[1], policy[3], policy[4]
    calls = _recording_generate(monkeypatch)
    with make_grader(load_problem_file(world.problems), cfg) as grader:
        t = _trainer(cfg, "vanilla", policy, grader, vhack=v, proj_v=v)
        rows, out = evaluate(t, held, 0, [p.detach().clone() for p in adapter.delta_s_params()])
    comps = [r.completion_ids for c in calls for r in c[3]]
    assert len(comps) == len(out) == len(held) * 4
    eos = tok.eos_token_id
    expected = [int(len(ids) == 48 and eos not in ids) for ids in comps]
    assert [o["truncated"] for o in out] == expected
    assert 0 < sum(expected) < len(expected)  # both outcomes occur
    for row in rows:
        sub = [e for e, o in zip(expected, out) if row["mode"] in ("all", o["mode"])]
        assert row["truncated_rate"] == pytest.approx(sum(sub) / len(sub)), row["mode"]
