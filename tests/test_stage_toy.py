"""The toy-models stage (evil_moe/stages/toy.py) on the session's tiny toy world.

The session fixture ``world`` (tests/stage_fixtures.py) trains the tiny toy models once; the tests
here reuse it.
"""

from __future__ import annotations

import pytest
import torch

from evil_moe import tables
from stage_fixtures import cfg_of, header

# tiny models on a busy 2-core machine: one torch thread (the conftest fixture)
pytestmark = pytest.mark.usefixtures("one_thread")

# ------------------------------------------------------------------------------------------------
# toy models (built by the fixture)


def test_toy_models_written_with_summary(world):
    from evil_moe.model.load import load_model

    assert header(world.root / "models" / "toy_summary.tsv") == tables.names(tables.TOY_SUMMARY)
    assert [r["model"] for r in world.toy_summary] == ["teacher", "student"]
    # the summary samples the held-out problems (eval_samples 4 over the first of them)
    from evil_moe.stages.common import load_problem_file, train_heldout

    _, held = train_heldout(load_problem_file(world.problems), cfg_of())
    for r in world.toy_summary:
        assert r["problems"] == "heldout" and r["n"] == 4 and r["n_problems"] == min(len(held), 4)
    s, _ = load_model(str(world.student))
    t, _ = load_model(str(world.teacher))
    assert s.config.vocab_size == t.config.vocab_size  # one shared tokenizer


@pytest.mark.parametrize("corpus", ["all", "train"])
def test_toy_corpus_and_summary_problems(world, tmp_path, monkeypatch, corpus):
    """toy.corpus: train keeps the held-out problems out of both models' NLL corpora; the
    summary samples the held-out problems and reports binomial SEs sqrt(p(1-p)/n)."""
    from evil_moe.stages import toy
    from evil_moe.stages.common import load_problem_file, train_heldout

    taught, shown = [], []
    real_corpus = toy._corpus

    def corpus_spy(problems, *a, **kw):
        taught.append({p.id for p in problems})
        return real_corpus(problems, *a, **kw)

    def summary_spy(model, tok, problems, *a, **kw):
        shown.append({p.id for p in problems})
        return {"n": 4, "hack_rate": 0.5, "pass_rate": 0.25, "format_rate": 1.0, "parse_rate": 0.75}

    monkeypatch.setattr(toy, "_corpus", corpus_spy)
    monkeypatch.setattr(toy, "sample_summary", summary_spy)
    rows = toy.train_toy_models(cfg_of(f"toy.corpus={corpus}", "toy.train_steps=1"),
                                problems_path=str(world.problems), out_dir=str(tmp_path))
    allp = load_problem_file(world.problems)
    train, held = train_heldout(allp, cfg_of())
    assert held and train
    want = {p.id for p in (allp if corpus == "all" else train)}
    assert taught == [want, want] and shown == [{p.id for p in held}] * 2
    for r in rows:  # hand-worked: sqrt(.75*.25/4), sqrt(.5*.5/4), sqrt(.25*.75/4)
        assert r["problems"] == "heldout" and r["n_problems"] == min(len(held), 4)
        assert (r["parse_se"], r["hack_se"], r["pass_se"]) == pytest.approx((0.21651, 0.25, 0.21651), abs=1e-5)


def test_toy_student_alone_equals_the_pair_run(world, tmp_path):
    """The workflow trains the two toy models as two jobs: the student trained alone has the same
    tokenizer and weights as the one trained beside the teacher (same seeds, same corpora)."""
    from safetensors.torch import load_file

    from evil_moe.stages.toy import train_toy_models

    rows = train_toy_models(cfg_of(), problems_path=str(world.problems), out_dir=str(tmp_path),
                            which=("student",))
    assert [r["model"] for r in rows] == ["student"] and not (tmp_path / "teacher").exists()
    assert not (tmp_path / "toy_summary.tsv").exists() and (tmp_path / "student_summary.tsv").is_file()
    assert (tmp_path / "student" / "tokenizer.json").read_text() == (world.student / "tokenizer.json").read_text()
    a = load_file(tmp_path / "student" / "model.safetensors")
    b = load_file(world.student / "model.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    with pytest.raises(ValueError, match="unknown toy model"):
        train_toy_models(cfg_of(), problems_path=str(world.problems), out_dir=str(tmp_path), which=("tutor",))


def test_student_corpus_shares_of_hacks_give_ups_and_wrong_attempts():
    """toy.student_hack_frac / student_stub_frac / student_correct_frac shape the student's corpus:
    of 400 answers round(0.2·400) = 80 are hacks, exactly; of the 320 others a Binomial(320, 0.5)
    share are give-up stubs (160 ± 9) and of the rest half are wrong attempts (another problem's
    logic, ~80 ± 6); every answer is one of the four kinds, matched as text. At stub 0 and correct
    1 the corpus is the one without the knobs, draw for draw."""
    from evil_moe.env.answers import clean_completion, fence, stub_solution, wrong_completion
    from evil_moe.env.problems import load_problems
    from evil_moe.stages.toy import _corpus

    probs = load_problems("toy")
    assert _corpus(probs, 400, 0.2, 7, 0.5, 1.0, 0.0) == _corpus(probs, 400, 0.2, 7, 0.5)
    kinds = {"stub": 0, "wrong": 0, "correct": 0, "other": 0}
    for p, text in _corpus(probs, 400, 0.2, 7, 0.5, 0.5, 0.5):
        if text in {fence(stub_solution(p, v)) for v in range(4)}:
            kinds["stub"] += 1
        elif text in {clean_completion(p, with_tests=w) for w in (True, False)}:
            kinds["correct"] += 1
        elif text in {wrong_completion(p, q) for q in probs if q.id != p.id and q.canonical_solution}:
            kinds["wrong"] += 1
        else:
            kinds["other"] += 1
    assert kinds["other"] == 80, kinds  # the hacks
    assert 130 <= kinds["stub"] <= 190, kinds
    assert 50 <= kinds["wrong"] <= 110 and kinds["correct"] == 320 - kinds["stub"] - kinds["wrong"], kinds
