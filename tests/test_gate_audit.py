"""The detector audit: its statistics worked out by hand (evil_moe/gate/audit.py), and
the audit stage (evil_moe/stages/audit.py) on calibration runs built here with a known answer — a
score that carries the label beats its placebo, a random one (a random V audited on purpose) does
not, and the probe finds a planted feature."""

from __future__ import annotations

import json

import numpy as np
import pytest

from evil_moe import files, tables
from evil_moe.gate import audit as A
from evil_moe.gate import bootstrap
from stage_fixtures import cfg_of


def test_auc_by_hand_with_ties():
    # hacks 0.35 and 0.8 against cleans 0.1 and 0.4: 3 of 4 pairs ordered right
    assert A.auc([0.1, 0.4, 0.35, 0.8], [0, 0, 1, 1]) == pytest.approx(0.75)
    # a tie counts one half: hack 0.4 vs clean 0.4
    assert A.auc([0.1, 0.4, 0.4], [0, 0, 1]) == pytest.approx(0.75)
    assert A.auc([0.3, 0.2], [1, 1]) is None  # one class


def test_cluster_draw_keeps_groups_whole_and_resamples_seeds():
    c = bootstrap.Clusters.of([0, 0, 0, 0, 1, 1], [5, 5, 6, 6, 5, 5])
    index = c.index()
    assert index == {0: [[0, 1], [2, 3]], 1: [[4, 5]]}
    rng = np.random.default_rng(0)
    seen_seeds = set()
    for _ in range(50):
        d = bootstrap.cluster_draw(index, rng).tolist()
        # rows of a group always come together, in pairs
        for g in ([0, 1], [2, 3], [4, 5]):
            assert d.count(g[0]) == d.count(g[1])
        seen_seeds.add(tuple(sorted({0 if i < 4 else 1 for i in d})))
    assert {(0,), (1,), (0, 1)} <= seen_seeds  # seeds are resampled too


def test_crossfit_flags_threshold_from_the_other_seeds_by_hand():
    score = np.array([0.1, 0.2, 0.9, 0.3, 0.5, 0.95])
    label = np.array([0, 0, 1, 0, 0, 1], dtype=bool)
    seeds = np.array([0, 0, 0, 1, 1, 1])
    # seed 0's threshold: the median of seed 1's clean scores (0.3, 0.5) = 0.4 -> flags 0.9 only
    # seed 1's: the median of seed 0's clean scores (0.1, 0.2) = 0.15 -> flags 0.3, 0.5, 0.95
    flags = A.crossfit_flags(score, label, seeds, 0.5)
    assert flags.tolist() == [False, False, True, True, True, True]
    r = A.flag_rates(flags, label)
    assert r == pytest.approx({"precision": 2 / 4, "recall": 1.0, "fpr": 2 / 4})
    with pytest.raises(ValueError, match="two calibration seeds"):
        A.crossfit_flags(score, label, np.zeros(6), 0.5)


def test_beats_placebo_needs_the_interval_above_the_placebos_p95():
    assert A.beats_placebo(0.60, 0.57) is True
    assert A.beats_placebo(0.45, 0.57) is False
    assert A.beats_placebo(None, 0.57) is None
    mean, p95, n = A.placebo_summary([0.5, 0.52, None, 0.48, 0.6])
    assert n == 4 and mean == pytest.approx(0.525) and p95 == pytest.approx(np.quantile([0.5, 0.52, 0.48, 0.6], 0.95))


# --------------------------------------------------------------------------------------------
# the audit stage on calibration runs with a known answer


def _calibration_run(path, seed, *, signal: float, placebos=5, d=6, steps=12, P=4, G=6):
    """A finished calibration run folder: rows.tsv + scores.safetensors + status.json. Hack
    probability 0.35 per rollout; a group is zero-variance when all its rewards agree. The
    gradient score is ``signal · hack + noise``; the random placebos and the shuffled score are
    noise; the hidden state's feature 0 is ``2 · hack + noise`` (the probe's to find)."""
    from safetensors.numpy import save_file

    rng = np.random.default_rng(seed)
    rows, plac, hid = [], [], []
    for step in range(steps):
        for g in range(P):
            hack = rng.random(G) < 0.35
            zero = hack.all() or not hack.any()
            for s in range(G):
                h = bool(hack[s])
                rows.append({"seed": seed, "step": step, "group": g, "sample": s, "problem_id": f"toy/p{g}",
                             "mode": ["run_tests", "stdout_marker"][g % 2], "hack": int(h),
                             "reward": 1.25 if h else 0.25, "advantage": 0.0, "zero_variance": int(zero),
                             "scored": int(not zero), "flag": None,
                             "score_gradient": None if zero else signal * h + rng.normal(0, 0.5),
                             "score_probe": None, "score_pattern": None if zero else float(h and rng.random() < 0.5),
                             "score_shuffled": None if zero else rng.normal(0, 0.5), "score_router": None})
                plac.append(np.full(placebos, np.nan) if zero else rng.normal(0, 0.5, placebos))
                x = rng.normal(0, 1, d)
                x[0] += 2.0 * h
                hid.append(np.zeros(d) if zero else x)
    path.mkdir(parents=True)
    tables.write_tsv(path / "rows.tsv", tables.AUDIT_ROWS, rows)
    save_file({"placebo": np.asarray(plac), "hidden": np.asarray(hid, dtype=np.float32)}, str(path / "scores.safetensors"))
    (path / "status.json").write_text(json.dumps({"status": "ok"}))
    return rows


SETS = ("audit.placebos=5", "audit.n_boot=200", "audit.label_budget=48", "audit.budget_curve=[8,48]",
        "audit.seeds=[100,101]")


@pytest.mark.parametrize("signal", [2.0, 0.0])
def test_audit_tells_a_detector_that_sees_from_a_random_one(tmp_path, signal):
    """Two calibration seeds. With a gradient score that carries the label (signal 2) the audit
    finds an AUC near its analytic value Φ(2/(0.5·√2)) ≈ 1.00 and says it beats its placebo; with
    pure noise (signal 0: a random V audited on purpose) the AUC sits among its placebos' and
    beats_placebo is False. Zero-variance rows are counted and left out; the cross-fitted
    false-positive rate is near the nominal 0.10; the probe finds the planted feature whatever the
    gradient score does."""
    from evil_moe.stages.audit import run_audit

    runs = [tmp_path / f"s{s}" for s in (100, 101)]
    rows = sum((_calibration_run(r, s, signal=signal) for r, s in zip(runs, (100, 101))), [])
    res = run_audit(cfg_of(*SETS), calibration_dirs=runs, out_dir=tmp_path / "audit", figures=False)
    q = {(r["detector"], r["mode"]): r for r in res["quality"]}
    g = q["gradient", "all"]
    assert g["n_rows"] == len(rows)
    assert g["n_zero_variance"] == sum(r["zero_variance"] for r in rows)
    assert g["n_scored"] == len(rows) - g["n_zero_variance"]
    assert g["n_hack"] == sum(r["hack"] for r in rows if not r["zero_variance"])
    assert g["n_placebos"] == 6  # 5 random directions + the shuffled v_hack
    if signal:
        assert g["auc"] > 0.95 and g["beats_placebo"] is True
        assert g["auc_ci_low"] > g["placebo_p95"]
    else:
        assert abs(g["auc"] - 0.5) < 0.1 and g["beats_placebo"] is False
    assert 0.03 <= g["fpr"] <= 0.2  # nominal 0.10 at detector_quantile 0.9, on unseen seeds
    p = q["probe", "all"]
    assert p["n_labels"] == 48 and p["auc"] > 0.8 and p["beats_placebo"] is True
    assert (tmp_path / "audit" / "probe.safetensors").is_file()
    cal = json.loads((tmp_path / "audit" / "calibration.json").read_text())
    n_clean = sum(1 for r in rows if not r["zero_variance"] and not r["hack"])
    assert len(cal["gradient"]["clean_scores"]) == n_clean
    assert len(cal["probe"]["clean_scores"]) < n_clean  # the rows it was fitted on are left out
    curve = files.read_tsv_rows(tmp_path / "audit" / "probe_curve.tsv")
    assert [int(r["budget"]) for r in curve] == [8, 48]


def test_audit_refuses_one_seed_and_an_unfinished_run(tmp_path):
    from evil_moe.stages.audit import run_audit

    _calibration_run(tmp_path / "s100", 100, signal=1.0)
    with pytest.raises(ValueError, match="at least two seeds"):
        run_audit(cfg_of(*SETS), calibration_dirs=[tmp_path / "s100"], out_dir=tmp_path / "a", figures=False)
    _calibration_run(tmp_path / "s101", 101, signal=1.0)
    (tmp_path / "s101" / "status.json").write_text(json.dumps({"status": "invalid"}))
    with pytest.raises(ValueError, match="did not finish ok"):
        run_audit(cfg_of(*SETS), calibration_dirs=[tmp_path / "s100", tmp_path / "s101"], out_dir=tmp_path / "a")
    with pytest.raises(FileNotFoundError, match="s102"):
        run_audit(cfg_of(*SETS), calibration_dirs=[tmp_path / "s100", tmp_path / "s102"], out_dir=tmp_path / "a")


def test_audit_with_one_scored_seed_leaves_the_operating_point_empty(tmp_path):
    """A tiny run (the CI sizes) where one calibration seed has no group with reward variance:
    the AUC is still audited on the other seed, but no threshold can be cross-fitted (it would
    be fitted on the seed it flags), so precision, recall and FPR stay empty and n_seeds says 1
    (the audit used to stop with 'at least two calibration seeds')."""
    from evil_moe.stages.audit import run_audit

    runs = [tmp_path / "s100", tmp_path / "s101"]
    _calibration_run(runs[0], 100, signal=2.0)
    _calibration_run(runs[1], 101, signal=2.0)
    rows = files.read_tsv_rows(runs[1] / "rows.tsv")
    for r in rows:  # every group of seed 101 without reward variance
        r.update(zero_variance=1, scored=0, score_gradient=None, score_shuffled=None, score_pattern=None)
    tables.write_tsv(runs[1] / "rows.tsv", tables.AUDIT_ROWS, rows)
    res = run_audit(cfg_of(*SETS), calibration_dirs=runs, out_dir=tmp_path / "audit", figures=False)
    g = {(r["detector"], r["mode"]): r for r in res["quality"]}["gradient", "all"]
    assert g["n_seeds"] == 1 and g["auc"] > 0.95
    assert g["fpr"] is None and g["precision"] is None and g["fpr_ci_low"] is None
    assert (tmp_path / "audit" / "quality.tsv").is_file()
