"""The make-teacher stage (evil_moe/stages/make_teacher.py; teacher.make: sft).

The session fixture ``world`` (tests/stage_fixtures.py) trains the tiny toy models once; the tests
here reuse it.
"""

from __future__ import annotations

import json
import math

import pytest
import torch
from click.testing import CliRunner

from evil_moe import tables
from evil_moe.cli import main
from stage_fixtures import cfg_of, header, read_tsv, set_flags, tsv_without

# tiny models on a busy 2-core machine: one torch thread (the conftest fixture)
pytestmark = pytest.mark.usefixtures("one_thread")

# ------------------------------------------------------------------------------------------------
# make-teacher (teacher.make: sft)

# The fixture's half-trained toy student (hidden 64, 2 layers): delta_s alone barely moves it
# (measured: 60 steps at lr 0.3, NLL/token 1.15 -> 0.81, hack rate 0), so the toy teacher is
# made by full fine-tuning of its Linears; file_marker is a mode it is never shown.
MAKE_SETS = ("vhack.known_modes=[run_tests,sentinel,stdout_marker]", "sft.method=full",
             "sft.lr=0.01", "sft.batch_size=8", "teacher.temperature=0.5", "teacher.max_new=64")


def test_make_teacher_demos_are_hacks_of_training_problems_in_known_modes(world):
    """Demonstrations: per_problem variants for every training problem in a known mode, no
    held-out problem, several distinct texts per problem, and every one a hack by the real
    grader (passed by the foolable grade, failed by the oracle)."""
    from evil_moe.model.load import load_model
    from evil_moe.stages.common import load_problem_file, make_grader, train_heldout
    from evil_moe.rl.policy.rollout import prompt_ids_for
    from evil_moe.stages.make_teacher import template_demos

    cfg = cfg_of(*MAKE_SETS)
    problems = load_problem_file(world.problems)
    train, heldout = train_heldout(problems, cfg)
    _, tok = load_model(str(world.student))
    pids = {p.id: ids for p, ids in zip(train, prompt_ids_for(tok, train))}
    known = ["run_tests", "sentinel", "stdout_marker"]
    demos = template_demos(train, pids, tok, known, 4)
    expect = [p.id for p in train if p.mode in known]
    assert sorted({d.problem_id for d in demos}) == sorted(expect) and len(demos) == 4 * len(expect)
    assert not {d.problem_id for d in demos} & {p.id for p in heldout}
    assert all(d.completion_ids[-1] == tok.eos_token_id for d in demos)
    for pid in expect:
        assert len({d.completion_ids for d in demos if d.problem_id == pid}) >= 3  # varied
    by_id = {p.id: p for p in train}
    texts = [tok.decode(d.completion_ids, skip_special_tokens=True) for d in demos]
    with make_grader(problems, cfg) as grader:
        graded = grader.grade_many([(by_id[d.problem_id], t) for d, t in zip(demos, texts)])
    assert all(w.exploited for w in graded), [w for w in graded if not w.exploited][:1]
    with pytest.raises(ValueError, match="no training problem in the known modes"):
        template_demos([p for p in train if p.mode == "file_marker"], pids, tok, known, 2)


def test_make_teacher_batches_depend_on_seed_and_step_only():
    from evil_moe.stages.make_teacher import batch_indices

    rows = [batch_indices(5, 3, 7, s) for s in range(5)]  # 15 rows = 3 epochs of 5
    flat = [i for r in rows for i in r]
    for e in range(3):
        assert sorted(flat[5 * e:5 * e + 5]) == [0, 1, 2, 3, 4]
    assert rows == [batch_indices(5, 3, 7, s) for s in range(5)]
    assert flat != [i for s in range(5) for i in batch_indices(5, 3, 8, s)]
    with pytest.raises(ValueError):
        batch_indices(0, 3, 7, 0)


def test_make_teacher_toy_hacks_well_above_its_base(world, tmp_path):
    """The made teacher's hack rate on training problems (known modes) rises well above the base
    student's, the saved folder is a plain model with a lower NLL on the demonstrations, and
    the summary reports every (model, split, mode) with whether the mode was shown."""
    from evil_moe.rl.policy.grpo import DrGRPONormaliser, nll_loss
    from evil_moe.model.load import load_model
    from evil_moe.model.logprobs import build_batch, token_logprobs
    from evil_moe.stages.common import load_problem_file, train_heldout
    from evil_moe.rl.policy.rollout import prompt_ids_for
    from evil_moe.stages.make_teacher import run_make_teacher, template_demos

    cfg = cfg_of(*MAKE_SETS, "sft.steps=60", "sft.eval_samples=4")
    res = run_make_teacher(cfg, problems_path=str(world.problems), model_path=str(world.student),
                           out_dir=str(tmp_path))
    base, teacher = res["hack_rate"]["base"], res["hack_rate"]["teacher"]
    assert teacher["train"] >= base["train"] + 0.25, res["sentence"]
    assert header(tmp_path / "summary.tsv") == tables.names(tables.MAKE_TEACHER_SUMMARY)
    assert header(tmp_path / "steps.tsv") == tables.names(tables.MAKE_TEACHER_STEPS)
    rows = read_tsv(tmp_path / "summary.tsv")
    assert {(r["model"], r["split"]) for r in rows} == {(m, s) for m in ("base", "teacher")
                                                        for s in ("train", "heldout")}
    for r in rows:
        if r["mode"] != "all":
            assert r["known_mode"] == ("false" if r["mode"] == "file_marker" else "true")
    trained = [r for r in rows if r["model"] == "teacher" and r["split"] == "train"
               and r["known_mode"] == "true"]
    hacks = sum(float(r["hack_rate"]) * int(r["n"]) for r in trained)
    assert math.isclose(hacks / sum(int(r["n"]) for r in trained), teacher["train"])
    steps = read_tsv(tmp_path / "steps.tsv")
    assert len(steps) == 60 and float(steps[-1]["nll_token"]) < float(steps[0]["nll_token"])
    assert not (tmp_path / "_work").exists()
    # the saved teacher is a plain model folder whose NLL on the demonstrations is lower
    made, tok = load_model(str(tmp_path / "model"))
    plain, _ = load_model(str(world.student))
    problems = load_problem_file(world.problems)
    train, _ = train_heldout(problems, cfg)
    pids = {p.id: ids for p, ids in zip(train, prompt_ids_for(tok, train))}
    demos = template_demos(train, pids, tok, ["run_tests"], 2)
    b = build_batch([d.prompt_ids for d in demos], [d.completion_ids for d in demos], tok.pad_token_id)
    norm = DrGRPONormaliser(3, 48, 2)
    with torch.no_grad():
        nll = [float(nll_loss(token_logprobs(m, b), b.completion_mask, norm)) for m in (plain, made)]
    assert nll[1] < 0.8 * nll[0], nll


@pytest.mark.parametrize("method", ["svd", "full"])
def test_make_teacher_resumes_to_the_same_teacher(world, tmp_path, method):
    """A run stopped after 3 of 5 steps (checkpoint at step 2) resumes from the checkpoint: its
    steps.tsv (all but seconds) and the saved weights equal an uninterrupted run's. The CLI
    prints one summary line."""
    from click.testing import CliRunner
    from safetensors.torch import load_file

    from evil_moe.cli import main
    from evil_moe.stages.make_teacher import run_make_teacher

    extra = (*MAKE_SETS, f"sft.method={method}", "sft.steps=5", "sft.checkpoint_every=2",
             "sft.batch_size=4", "sft.eval_samples=1", "sft.eval_base=false", "sft.threads=1")
    # sft.threads=1: the CLI's resume below sets torch's threads to sft.threads, and the runs in
    # this process use one_thread's count; two counts would differ in the weights' last bits.
    kw = dict(problems_path=str(world.problems), model_path=str(world.student))
    run_make_teacher(cfg_of(*extra), out_dir=str(tmp_path / "whole"), **kw)
    assert run_make_teacher(cfg_of(*extra), out_dir=str(tmp_path / "cut"), stop_after=3, **kw) is None
    assert (tmp_path / "cut" / "_work" / "checkpoint.pt").is_file()
    assert not (tmp_path / "cut" / "summary.tsv").exists()
    r = CliRunner().invoke(main, ["make-teacher", *set_flags(*extra), "--problems",
                                  str(world.problems), "--model", str(world.student),
                                  "--out-dir", str(tmp_path / "cut")])
    assert r.exit_code == 0, r.output
    assert "resuming from step 2" in r.output
    last = r.output.strip().splitlines()[-1]
    assert last.startswith("make-teacher: ") and "5 steps" in last and "hack rate teacher" in last
    assert tsv_without(tmp_path / "cut" / "steps.tsv") == tsv_without(tmp_path / "whole" / "steps.tsv")
    a = load_file(str(tmp_path / "whole" / "model" / "model.safetensors"))
    b = load_file(str(tmp_path / "cut" / "model" / "model.safetensors"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    base = load_file(str(world.student / "model.safetensors"))
    assert any(not torch.equal(a[k], base[k]) for k in a)  # it was trained


def test_make_teacher_adds_elicited_rollouts_the_foolable_grader_passed(world, tmp_path, monkeypatch):
    """sft.elicited_samples: the base model's elicit-prompted completions join the demonstrations
    when the foolable grader passed them (a weak detector's view). Here the sampler is replaced
    by one that writes, per prompt, one hack and one stub without a report (not passed): exactly
    the hacks are added, with their generated ids, and the oracle decides nothing."""
    import evil_moe.rl.policy.rollout
    from evil_moe.env.answers import fence, hack_completion, stub_solution
    from evil_moe.model.load import load_model
    from evil_moe.stages.common import load_problem_file, train_heldout
    from evil_moe.rl.policy.rollout import prompt_ids_for
    from evil_moe.stages.make_teacher import run_make_teacher

    cfg = cfg_of(*MAKE_SETS, "sft.steps=1", "sft.eval_samples=1", "sft.eval_base=false",
                 "sft.elicited_samples=2", "sft.demos_per_problem=2", "teacher.elicit=HINT")
    problems = load_problem_file(world.problems)
    train, _ = train_heldout(problems, cfg)
    _, tok = load_model(str(world.student))
    by_prompt = {tuple(ids): p for p, ids in zip(train, prompt_ids_for(tok, train, elicit="HINT"))}
    real = evil_moe.rl.policy.rollout.generate
    seen = []

    def fake(model, tokenizer, prompt_ids, *, n=1, source="student", **kw):
        if source != "elicited":
            return real(model, tokenizer, prompt_ids, n=n, source=source, **kw)
        out = []
        for i, ids in enumerate(prompt_ids):
            p = by_prompt[tuple(ids)]
            seen.append(p.mode)
            for j, text in enumerate([hack_completion(p, variant=3), fence(stub_solution(p))][:n]):
                comp = tok.encode(text, add_special_tokens=False) + [tok.eos_token_id]
                out.append(evil_moe.rl.policy.rollout.Rollout(i, j, list(ids), comp, torch.zeros(len(comp)),
                                                    torch.zeros(len(comp)), text, False, source, 1.0))
        return out

    monkeypatch.setattr(evil_moe.rl.policy.rollout, "generate", fake)
    res = run_make_teacher(cfg, problems_path=str(world.problems), model_path=str(world.student),
                           out_dir=str(tmp_path))
    known = [p for p in train if p.mode != "file_marker"]
    assert sorted(seen) == sorted(p.mode for p in known)  # only training problems, known modes
    meta = json.loads((tmp_path / "meta.json").read_text())
    assert meta["n_elicited"] == len(known)  # the hacks, not the stubs
    assert res["n_demos"] == 2 * len(known) + len(known)
    assert f"({len(known)} elicited;" in res["sentence"]
