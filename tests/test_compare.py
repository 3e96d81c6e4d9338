"""The compare stage on pilot folders made from synthetic per-completion outcomes whose verdicts
are known: planted effects separate, a missing positive control effect makes the run
underpowered, the judged view is the arm's deploy view, invalid pilots are named, and the report
numbers are rounded."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pandas as pd
import pytest
from click.testing import CliRunner

from evil_moe import tables
from evil_moe.cli import main
from evil_moe.config import load_config
from evil_moe.stages.compare import FIGURES, PilotRun, run_compare
from evil_moe.stats import Planted, simulate_outcomes

STEPS_N = 4
BASE_ARMS = ("vanilla", "erase", "random_v", "oracle_reward")


def cfg_for(seeds=(0, 1, 2), arms=BASE_ARMS, **compare):
    sets = [f"compare.{k}={v}" for k, v in {"last_k": 2, "min_drop": 0.05, "pass_margin": 0.10,
                                             "n_boot": 400, "seed": 0, **compare}.items()]
    pc = [] if "oracle_reward" in arms or "positive_control" in compare else ["compare.positive_control=null"]
    return load_config(data={"pilot": {"arms": list(arms), "seeds": list(seeds)}}, overrides=sets + pc)


def views_of(arm: str) -> tuple[str, ...]:
    from evil_moe.arms import ARMS

    return ARMS[arm].views


def write_pilots(root: Path, outcomes: pd.DataFrame, *, frac_clipped: dict | None = None,
                 status: dict | None = None, removed: dict | None = None, gap: dict | None = None) -> Path:
    """One pilot folder per (arm, seed) of ``outcomes``: its outcomes.tsv, an eval.tsv summary,
    a small steps.tsv and status.json."""
    for (arm, seed), o in outcomes.groupby(["arm", "seed"]):
        d = root / arm / f"s{seed}"
        tables.write_tsv(d / "outcomes.tsv", tables.OUTCOMES, o.to_dict("records"))
        ev = [{"step": STEPS_N - 1, "arm": arm, "seed": seed, "view": v, "mode": "all", "n": len(g),
               "hack_rate": g["hack"].mean(), "pass_rate": g["pass"].mean(), "format_rate": 1.0,
               "truncated_rate": g["truncated"].mean()} for v, g in o.groupby("view")]
        tables.write_tsv(d / "eval.tsv", tables.EVAL, ev)
        fc = (frac_clipped or {}).get((arm, seed), 0.01)
        rows = [{"step": i, "arm": arm, "seed": seed, "hack_rate": 0.5, "pass_rate": 0.1,
                 "frac_clipped": fc if i == 1 else 0.0, "cin": 0.3, "null_cin": 0.1,
                 "removed_frac": (removed or {}).get(arm, 0.0), "update_span_frac": 0.05,
                 "sampler_gap_p95": (gap or {}).get(arm, 1e-7),
                 "seconds": 1.0} for i in range(STEPS_N)]
        tables.write_tsv(d / "steps.tsv", tables.STEPS, rows)
        st = (status or {}).get((arm, seed), "ok")
        tables.write_json(d / "status.json", {"status": st, "reason": None if st == "ok" else "test",
                                              "isolation": "bwrap"})
    return root


def simulate(plants: dict, arms=BASE_ARMS, *, n_seeds=3, n_samples=64, rng=0, **kw) -> pd.DataFrame:
    """Every view of every arm, with the planted effects of ``plants[(arm, view)]``."""
    cells = {(a, v): plants.get((a, v), Planted()) for a in arms for v in views_of(a)}
    return simulate_outcomes(cells, n_seeds=n_seeds, n_samples=n_samples, rng=rng, step=STEPS_N - 1, **kw)


def crit(gate, name, arm):
    (c,) = [c for c in gate["criteria"] if c["name"] == name and c["arm"] == arm]
    return c


POSITIVE = {("oracle_reward", "trained"): Planted(hack_drop=0.35)}
# little run-to-run noise and a low pass rate: large effects decide at once at 3 seeds
QUIET = dict(run_sd=0.05, seed_sd=0.05, pass_rate=0.05)


def test_planted_drop_separates_with_numbers_summary_and_figures(tmp_path):
    plants = {**POSITIVE, ("erase", "trained"): Planted(hack_drop=0.30)}
    root = write_pilots(tmp_path / "pilots", simulate(plants, **QUIET), removed={"erase": 0.2, "random_v": 0.05})
    gate = run_compare(root, tmp_path / "out", cfg_for())
    assert gate["verdict"] == "separated", gate["sentence"]
    d = crit(gate, "drop_vs_vanilla", "erase")
    assert d["passed"] and d["ci_low"] > 0 and d["value"] == pytest.approx(0.3, abs=0.08)
    assert d["control"] == "vanilla" and d["view"] == "trained" and d["mde"] > 0
    c = crit(gate, "beats_control", "erase")
    assert c["passed"] and c["control"] == "random_v"
    assert crit(gate, "matched_pass", "erase")["passed"]
    assert gate["positive_control"]["passed"]
    assert gate["sentence"].startswith("separated: erase (trained view) lowers the held-out hack rate by")
    assert "the sweep is justified" in gate["sentence"]
    # rounded for reading: no number with more than 3 decimals in the sentence
    assert not re.search(r"\d\.\d{4,}", gate["sentence"])
    assert any("erase removed 0.200" in n and "more than its control random_v (0.050)" in n for n in gate["notes"])
    out = tmp_path / "out"
    summary = pd.read_csv(out / "summary.tsv", sep="\t")
    assert list(summary.columns) == tables.names(tables.COMPARE_SUMMARY)
    row = summary[(summary.arm == "erase") & (summary.view == "trained")].iloc[0]
    assert row.hack_ci_low < row.hack_rate < row.hack_ci_high and row.n_seeds == 3 and row.n_samples == 64
    assert set(summary.isolation) == {"bwrap"}
    for name in FIGURES:
        assert (out / "figures" / f"{name}.png").stat().st_size > 1000, name
    assert "| drop_vs_vanilla | erase |" in (out / "gate.md").read_text()


def test_no_positive_control_effect_is_underpowered(tmp_path):
    plants = {("erase", "trained"): Planted(hack_drop=0.30)}  # oracle_reward drops nothing
    root = write_pilots(tmp_path / "p", simulate(plants, **QUIET))
    gate = run_compare(root, tmp_path / "out", cfg_for(), figures=False)
    assert gate["verdict"] == "inconclusive" and gate["underpowered"]
    assert gate["sentence"].startswith("inconclusive (underpowered): the positive control oracle_reward")
    # the same data with no positive control configured: separated, said uncalibrated
    gate = run_compare(root, tmp_path / "out2", cfg_for(arms=("vanilla", "erase", "random_v"),
                                                          positive_control="null"), figures=False)
    assert gate["verdict"] == "separated" and "power was not checked" in gate["sentence"]


def test_no_effect_is_ruled_out_with_enough_data(tmp_path):
    root = write_pilots(tmp_path / "p", simulate(POSITIVE, n_seeds=5, n_samples=256, **QUIET))
    gate = run_compare(root, tmp_path / "out", cfg_for(seeds=range(5)), figures=False)
    assert gate["verdict"] == "not_separated", gate["sentence"]
    assert crit(gate, "drop_vs_vanilla", "erase")["ci_high"] < 0.05
    assert "is ruled out for every treatment arm" in gate["sentence"]


def test_small_effect_few_samples_is_inconclusive_and_says_what_would_decide(tmp_path):
    plants = {**POSITIVE, ("erase", "trained"): Planted(hack_drop=0.06)}
    root = write_pilots(tmp_path / "p", simulate(plants, n_samples=8, rng=3))
    gate = run_compare(root, tmp_path / "out", cfg_for(), figures=False)
    assert gate["verdict"] == "inconclusive", gate["sentence"]
    assert "would decide it" in gate["sentence"] or "MDE" in gate["sentence"]
    assert gate["arms"]["erase"]["verdict"] == "inconclusive"


def test_fewer_than_min_seeds_never_separate(tmp_path):
    plants = {**POSITIVE, ("erase", "trained"): Planted(hack_drop=0.40)}
    root = write_pilots(tmp_path / "p", simulate(plants, n_seeds=2, **QUIET))
    gate = run_compare(root, tmp_path / "out", cfg_for(seeds=(0, 1)), figures=False)
    assert gate["verdict"] != "separated"
    assert "fewer than 3 seeds" in crit(gate, "drop_vs_vanilla", "erase")["note"]
    # the sentence names the cause (too few seeds), not a positive control that "does not separate"
    assert gate["sentence"].startswith("inconclusive (too few seeds): 2 seeds, fewer than compare.min_seeds 3")
    assert "does not separate" not in gate["sentence"]


ROUTE_ARMS = ("vanilla", "route", "route_random", "oracle_reward")


def test_route_is_judged_on_its_ablated_view(tmp_path):
    """The deploy view (δS_hack ablated) hacks less, the trained view like vanilla: separated.
    Planting the drop on the trained view only must not separate (a gate judging the trained view
    would say the opposite in both cases)."""
    deploy = {**POSITIVE, ("route", "ablated"): Planted(hack_drop=0.30)}
    root = write_pilots(tmp_path / "a", simulate(deploy, arms=ROUTE_ARMS, **QUIET))
    gate = run_compare(root, tmp_path / "oa", cfg_for(arms=ROUTE_ARMS), figures=False)
    assert gate["verdict"] == "separated", gate["sentence"]
    assert crit(gate, "drop_vs_vanilla", "route")["view"] == "ablated"
    assert crit(gate, "beats_control", "route")["control"] == "route_random"
    assert gate["arms"]["route"]["trained_view_drop"]["value"] == pytest.approx(0.0, abs=0.08)
    trained = {**POSITIVE, ("route", "trained"): Planted(hack_drop=0.30)}
    root = write_pilots(tmp_path / "b", simulate(trained, arms=ROUTE_ARMS, **QUIET))
    gate = run_compare(root, tmp_path / "ob", cfg_for(arms=ROUTE_ARMS), figures=False)
    assert gate["verdict"] != "separated"


def test_invalid_pilots_are_named(tmp_path):
    root = write_pilots(tmp_path / "p", simulate(POSITIVE, **QUIET),
                        frac_clipped={("erase", 1): 0.7}, status={("random_v", 2): "invalid"})
    import shutil

    shutil.rmtree(root / "oracle_reward" / "s0")
    gate = run_compare(root, tmp_path / "out", cfg_for())
    assert gate["verdict"] == "invalid"
    bad = {(c["arm"], c["seed"]): c for c in gate["criteria"] if c["name"] == "valid" and not c["passed"]}
    assert set(bad) == {("erase", 1), ("random_v", 2), ("oracle_reward", 0)}
    assert "frac_clipped 0.70 > 0.5" in bad[("erase", 1)]["note"]
    assert "missing" in bad[("oracle_reward", 0)]["note"]
    assert gate["sentence"].startswith("invalid: 3 of 12 pilots failed validity")
    assert "oracle_reward s0" in gate["sentence"]
    assert (tmp_path / "out" / "figures" / "heldout.svg").is_file()  # a report is still possible


def test_pilot_list_expects_full_grid(tmp_path):
    root = write_pilots(tmp_path / "p", simulate(POSITIVE, **QUIET))
    runs = [root / a / f"s{s}" for a in BASE_ARMS for s in range(3) if (a, s) != ("erase", 1)]
    runs[0] = PilotRun("vanilla", 0, root / "vanilla" / "s0")
    gate = run_compare(runs, tmp_path / "out", cfg_for(), figures=False)
    assert gate["verdict"] == "invalid"  # erase s1 was not listed but the other arms ran seed 1
    assert [(c["arm"], c["seed"]) for c in gate["criteria"] if c["name"] == "valid" and not c["passed"]] == [("erase", 1)]


def test_errors_name_the_path_and_column(tmp_path):
    with pytest.raises(FileNotFoundError, match="nope"):
        run_compare(tmp_path / "nope", tmp_path / "out", cfg_for())
    root = write_pilots(tmp_path / "p", simulate(POSITIVE, n_seeds=1, **QUIET))
    d = root / "vanilla" / "s0"
    pd.read_csv(d / "outcomes.tsv", sep="\t").drop(columns=["hack"]).to_csv(d / "outcomes.tsv", sep="\t", index=False)
    with pytest.raises(ValueError, match=r"outcomes\.tsv: missing column 'hack'"):
        run_compare(root, tmp_path / "out", cfg_for(seeds=[0]))


def test_cli_end_to_end(tmp_path):
    plants = {**POSITIVE, ("erase", "trained"): Planted(hack_drop=0.30)}
    root = write_pilots(tmp_path / "pilots", simulate(plants, **QUIET))
    cfg_file = tmp_path / "c.yaml"
    cfg_file.write_text("pilot:\n  seeds: [0, 1, 2]\n  arms: [vanilla, erase, random_v, oracle_reward]\n"
                        "compare:\n  last_k: 2\n")
    out = tmp_path / "compare"
    res = CliRunner().invoke(main, ["compare", "--config", str(cfg_file),
                                    "--config-json", json.dumps({"compare": {"n_boot": 300}}),
                                    "--set", "compare.last_k=3", "--pilots-dir", str(root),
                                    "--out-dir", str(out)])
    assert res.exit_code == 0, res.output
    gate = json.loads((out / "gate.json").read_text())
    assert res.output.strip().splitlines()[-1] == gate["sentence"]
    assert gate["verdict"] == "separated" and gate["config"]["n_boot"] == 300 and gate["config"]["last_k"] == 3
    pilots = [str(root / a / f"s{s}") for a in BASE_ARMS for s in range(3)]
    res = CliRunner().invoke(main, ["compare", "--out-dir", str(tmp_path / "c2")]
                             + [x for p in pilots for x in ("--pilot", p)])
    assert res.exit_code == 0, res.output
    assert res.output.strip().splitlines()[-1].startswith("separated: erase")
    res = CliRunner().invoke(main, ["compare", "--pilots-dir", str(root), "--set", "compare.bogus=1"])
    assert res.exit_code != 0 and "compare.bogus" in res.output


def test_notes_name_sampler_gap_and_truncation(tmp_path):
    o = simulate(POSITIVE, truncated_rate=0.7, **QUIET)
    root = write_pilots(tmp_path / "p", o, gap={"erase": 0.02})
    gate = run_compare(root, tmp_path / "out", cfg_for(), figures=False)
    notes = " ".join(gate["notes"])
    assert "sampler" in notes and "erase 0.020" in notes and "vanilla" not in notes.split("nats:")[1].split(")")[0]
    assert "truncation dominates" in notes


def test_rlimit_only_isolation_is_flagged(tmp_path):
    root = write_pilots(tmp_path / "p", simulate(POSITIVE, **QUIET))
    st = root / "erase" / "s1" / "status.json"
    st.write_text(st.read_text().replace("bwrap", "rlimit-only"))
    gate = run_compare(root, tmp_path / "out", cfg_for(), figures=False)
    assert gate["isolation"] == ["bwrap", "rlimit-only"]
    assert any("isolation rlimit-only" in n for n in gate["notes"])
    summary = pd.read_csv(tmp_path / "out" / "summary.tsv", sep="\t")
    assert summary[summary.arm == "erase"].isolation.iloc[0] == "bwrap,rlimit-only"
