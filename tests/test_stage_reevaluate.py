"""The re-evaluation stage (evil_moe/stages/reevaluate.py): a tiny route pilot (two views) of the
session's toy world, evaluated again from its saved adapter.

The reference for the reproduction test is the pilot's own held-out evaluation, run in the
pilot's process from the in-memory trained knobs; the re-evaluation loads the saved adapter into
a freshly loaded student.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from click.testing import CliRunner

from stage_fixtures import cfg_of, pilot_kwargs, read_tsv, set_flags

SAMPLES = 2  # pilot.heldout_samples of the fixture pilot
N_HELD = 4  # held-out problems with problems.limit=12 (heldout_frac 0.25)


EVAL_SEED = 7_000_003 * 1 + 999_983  # the pilot's held-out seed for run seed 1, chunk 0


@pytest.fixture(scope="module")
def route_pilot(world, tmp_path_factory) -> tuple[Path, list[str]]:
    """A finished route pilot (seed 1: a seed other than 0, so the seed term of the sampling
    seeds is exercised), held-out views trained and ablated; and the completion texts of its
    own held-out evaluation (both views, in order), recorded while it ran."""
    from evil_moe.stages.pilot import run_pilot

    out = tmp_path_factory.mktemp("pilots") / "route" / "s1"
    with pytest.MonkeyPatch.context() as mp:
        calls = _spy_generate(mp)
        status = run_pilot(cfg_of(f"pilot.heldout_samples={SAMPLES}"),
                           **pilot_kwargs(world, out, arm="route", seed=1))
    assert status["status"] == "ok"
    texts = [t for seed, ts in calls if seed == EVAL_SEED for t in ts]
    assert len(texts) == 2 * N_HELD * SAMPLES
    return out, texts


@pytest.fixture
def route_run(route_pilot) -> Path:
    """The route pilot's folder."""
    return route_pilot[0]


def _spy_generate(monkeypatch) -> list[tuple[int, list[str]]]:
    """Record each held-out generate call's seed and completion texts (the pilot's evaluate calls
    ``generate`` from evil_moe.rl.trainer.evaluation's namespace)."""
    import evil_moe.rl.trainer.evaluation as pilot_mod

    calls = []
    real = pilot_mod.generate

    def spy(*args, **kw):
        rolls = real(*args, **kw)
        calls.append((kw["seed"], [r.text for r in rolls]))
        return rolls

    monkeypatch.setattr(pilot_mod, "generate", spy)
    return calls


def _reeval(world, route_run, out, **kw):
    from evil_moe.stages.reevaluate import reevaluate_pilot

    args = dict(pilot_dir=str(route_run), problems_path=str(world.problems),
                model_path=str(world.student), out_dir=str(out), samples=SAMPLES)
    args.update(kw)
    return reevaluate_pilot(cfg_of(f"pilot.heldout_samples={SAMPLES}"), **args)


def test_own_seeds_and_samples_reproduce_the_pilots_outcomes(world, route_pilot, tmp_path, monkeypatch):
    route_run, pilot_texts = route_pilot
    calls = _spy_generate(monkeypatch)
    status = _reeval(world, route_run, tmp_path, seed_offset=0)
    # the pilot's own sampling seeds, 7_000_003 s + 999_983 + c0 (eval_chunk 16 > 4 problems:
    # one chunk, c0 = 0), once per view; the same completions as the pilot's own evaluation
    assert [s for s, _ in calls] == [EVAL_SEED] * 2
    assert [t for _, ts in calls for t in ts] == pilot_texts
    for name in ("outcomes.tsv", "eval.tsv", "steps.tsv"):
        assert (tmp_path / name).read_bytes() == (route_run / name).read_bytes(), name
    rows = read_tsv(tmp_path / "outcomes.tsv")
    assert len(rows) == 2 * N_HELD * SAMPLES  # trained and ablated
    pilot_status = json.loads((route_run / "status.json").read_text())
    assert status == json.loads((tmp_path / "status.json").read_text())
    assert {k: v for k, v in status.items() if k != "reevaluate"} == pilot_status
    assert status["reevaluate"]["samples"] == SAMPLES and status["reevaluate"]["seed_offset"] == 0


def test_another_seed_offset_draws_other_samples(world, route_run, tmp_path, monkeypatch):
    from evil_moe.stages.reevaluate import SEED_OFFSET

    calls = _spy_generate(monkeypatch)
    _reeval(world, route_run, tmp_path / "own", seed_offset=0, samples=3)
    own = list(calls)
    calls.clear()
    _reeval(world, route_run, tmp_path / "fresh", samples=3)  # the default offset
    fresh = list(calls)
    assert [s for s, _ in fresh] == [EVAL_SEED + 3_500_001] * 2 == [s + SEED_OFFSET for s, _ in own]
    texts_own = [t for _, ts in own for t in ts]
    texts_fresh = [t for _, ts in fresh for t in ts]
    assert len(texts_own) == len(texts_fresh) == 2 * N_HELD * 3
    assert sum(a != b for a, b in zip(texts_own, texts_fresh)) > len(texts_own) // 2
    rows = read_tsv(tmp_path / "fresh" / "outcomes.tsv")
    # every (view, problem) has samples 0..2, at the pilot's seed and final step
    keys = sorted((r["view"], r["problem_id"], int(r["sample"])) for r in rows)
    views = ("ablated", "trained")
    held = sorted({r["problem_id"] for r in read_tsv(route_run / "outcomes.tsv")})
    assert keys == sorted((v, p, k) for v in views for p in held for k in range(3))
    assert {(r["arm"], r["seed"], r["step"]) for r in rows} == {("route", "1", "1")}


def test_seed_offset_check():
    from evil_moe.stages.reevaluate import SEED_OFFSET, check_seed_offset

    check_seed_offset(0, 16)
    check_seed_offset(SEED_OFFSET, 16)
    check_seed_offset(16, 16)  # chunk starts 0..15 against 16..31: disjoint
    check_seed_offset(7_000_003 - 16, 16)
    for bad in (15, 7_000_003, 7_000_003 - 15, 2 * 7_000_003 + 3, -SEED_OFFSET):
        with pytest.raises(ValueError, match=f"seed_offset {bad}"):
            check_seed_offset(bad, 16)


def test_missing_pilot_folder_or_adapter_fails_naming_the_path(world, route_run, tmp_path):
    missing = tmp_path / "pilots" / "route" / "s7"
    with pytest.raises(FileNotFoundError, match=re.escape(f"pilot folder not found: {missing}")):
        _reeval(world, route_run, tmp_path / "out", pilot_dir=str(missing))
    copy = tmp_path / "copy" / "route" / "s1"
    copy.mkdir(parents=True)
    for name in ("status.json", "steps.tsv", "outcomes.tsv"):
        (copy / name).write_bytes((route_run / name).read_bytes())
    with pytest.raises(FileNotFoundError, match=re.escape(f"pilot adapter not found: {copy / 'adapter.safetensors'}")):
        _reeval(world, route_run, tmp_path / "out", pilot_dir=str(copy))
    assert not (tmp_path / "out").exists()  # nothing written
    # the CLI: one error line naming the path, exit 1
    from evil_moe.cli import main

    res = CliRunner().invoke(main, ["reevaluate", *set_flags(), "--pilots-dir", str(copy.parent.parent),
                                    "--arms", "route", "--seeds", "1", "--problems", str(world.problems),
                                    "--model", str(world.student), "--out-dir", str(tmp_path / "out")])
    assert res.exit_code == 1 and f"pilot adapter not found: {copy / 'adapter.safetensors'}" in res.output


def test_another_config_is_refused_naming_the_pilots_outcomes(world, route_run, tmp_path):
    from evil_moe.stages.reevaluate import reevaluate_pilot

    common = dict(pilot_dir=str(route_run), problems_path=str(world.problems),
                  model_path=str(world.student), out_dir=str(tmp_path), samples=4)
    with pytest.raises(ValueError, match="held-out problems differ"):
        reevaluate_pilot(cfg_of("problems.heldout_frac=0.5"), **common)
    with pytest.raises(ValueError, match="no outcomes at step 2"):
        reevaluate_pilot(cfg_of("pilot.steps=3"), **common)
    # a folder whose steps.tsv names another arm than the adapter's metadata
    bad = tmp_path / "vanilla" / "s1"
    bad.mkdir(parents=True)
    for name in ("status.json", "outcomes.tsv", "adapter.safetensors"):
        (bad / name).write_bytes((route_run / name).read_bytes())
    (bad / "steps.tsv").write_text((route_run / "steps.tsv").read_text().replace("\troute\t", "\tvanilla\t"))
    with pytest.raises(ValueError, match="adapter of route s1, its steps.tsv says vanilla s1"):
        reevaluate_pilot(cfg_of(), **{**common, "pilot_dir": str(bad)})


def test_a_damaged_adapter_is_refused_naming_it(world, route_run, tmp_path):
    """One changed byte in a value of the pilot's adapter.safetensors (still a
    safetensors file, other knobs) is noticed by its SHA-256, recorded beside it when the pilot
    wrote it: the re-evaluation stops before loading any model, naming the file and the cause,
    and writes nothing. On 09ede95 it exited 0 with other outcomes."""
    import shutil

    from evil_moe.cli import main

    copy = tmp_path / "pilots" / "route" / "s1"
    shutil.copytree(route_run, copy)
    adapter = copy / "adapter.safetensors"
    data = bytearray(adapter.read_bytes())
    data[-2] ^= 0x40
    adapter.write_bytes(bytes(data))
    res = CliRunner().invoke(main, ["reevaluate", *set_flags(f"pilot.heldout_samples={SAMPLES}"),
                                    "--pilots-dir", str(tmp_path / "pilots"), "--arms", "route", "--seeds", "1",
                                    "--problems", str(world.problems), "--model", str(world.student),
                                    "--samples", str(SAMPLES), "--out-dir", str(tmp_path / "out")])
    assert res.exit_code == 1, res.output
    error = [line for line in res.output.splitlines() if line.startswith("Error:")]
    assert len(error) == 1 and f"{adapter} is damaged: its SHA-256" in error[0], res.output
    assert not list((tmp_path / "out").rglob("*.tsv"))
