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

from evil_moe import files, tables
from evil_moe.cli import main
from evil_moe.config import load_config
from evil_moe.gate.figures import FIGURES
from evil_moe.gate.simulate import Planted, simulate_outcomes
from evil_moe.pilots import PilotRun
from evil_moe.stages.compare import run_compare

STEPS_N = 4
BASE_ARMS = ("vanilla", "untrained", "erase", "random_v", "oracle_reward")


def cfg_for(seeds=(0, 1, 2), arms=BASE_ARMS, **compare):
    # the relative pass margin is off unless a test sets it (its own tests below)
    sets = [f"compare.{k}={v}" for k, v in {"last_k": 2, "min_drop": 0.05, "pass_margin": 0.10,
                                             "pass_margin_rel": "null", "n_boot": 400, "seed": 0,
                                             **compare}.items()]
    pc = [] if "oracle_reward" in arms or "positive_control" in compare else ["compare.positive_control=null"]
    return load_config(data={"pilot": {"arms": list(arms), "seeds": list(seeds)}}, overrides=sets + pc)


def views_of(arm: str) -> tuple[str, ...]:
    from evil_moe.rl.arms.registry import ARMS

    return ARMS[arm].views


def write_pilots(root: Path, outcomes: pd.DataFrame, *, frac_clipped: dict | None = None,
                 status: dict | None = None, removed: dict | None = None, gap: dict | None = None) -> Path:
    """One pilot folder per (arm, seed) of ``outcomes``: its outcomes.tsv, an eval.tsv summary,
    a small steps.tsv (none for the untrained student, which takes no step) and status.json."""
    from evil_moe.rl.arms.registry import ARMS

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
                 "seconds": 1.0} for i in range(STEPS_N if ARMS[arm].trains else 0)]
        tables.write_tsv(d / "steps.tsv", tables.STEPS, rows)
        st = (status or {}).get((arm, seed), "ok")
        files.write_json(d / "status.json", {"status": st, "reason": None if st == "ok" else "test",
                                              "isolation": "bwrap"})
    return root


def simulate(plants: dict, arms=BASE_ARMS, *, n_seeds=3, n_samples=64, rng=0, **kw) -> pd.DataFrame:
    """Every view of every arm, with the planted effects of ``plants[(arm, view)]``."""
    cells = {(a, v): plants.get((a, v), Planted()) for a in arms for v in views_of(a)}
    return simulate_outcomes(cells, n_seeds=n_seeds, n_samples=n_samples, rng=rng, step=STEPS_N - 1, **kw)


def crit(gate, name, arm):
    (c,) = [c for c in gate["criteria"] if c["name"] == name and c["arm"] == arm]
    return c


# the positive control hacks 0.35 less than vanilla; the untrained student hacks like vanilla and
# passes 0.09 less than every trained arm (0.01 against 0.10 under QUIET), so the criteria against it
# pass unless a test says otherwise
UNTRAINED = ("untrained", "trained")
POSITIVE = {("oracle_reward", "trained"): Planted(hack_drop=0.35), UNTRAINED: Planted(pass_drop=0.09)}
# little run-to-run noise, alike problems and a low pass rate: large effects decide at once at 3
# seeds, the pass rate's non-inferiority to vanilla's and its superiority to the untrained student's too
QUIET = dict(run_sd=0.05, seed_sd=0.05, arm_problem_sd=0.05, run_problem_sd=0.05, problem_sd=0.3, pass_rate=0.1)
# the samples per problem at which a planted arm separates at 3 seeds: the two pass-rate criteria
# (within 0.10 of vanilla, above the untrained student) need intervals narrower than 64 samples give
DECIDE = 256


def test_planted_drop_separates_with_numbers_summary_and_figures(tmp_path):
    plants = {**POSITIVE, ("erase", "trained"): Planted(hack_drop=0.30)}
    root = write_pilots(tmp_path / "pilots", simulate(plants, n_samples=DECIDE, **QUIET),
                        removed={"erase": 0.2, "random_v": 0.05})
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
    assert row.hack_ci_low < row.hack_rate < row.hack_ci_high and row.n_seeds == 3 and row.n_samples == DECIDE
    assert set(summary.isolation) == {"bwrap"}
    for name in FIGURES:
        assert (out / "figures" / f"{name}.png").stat().st_size > 1000, name
    assert "| drop_vs_vanilla | erase |" in (out / "gate.md").read_text()


def test_no_positive_control_effect_is_underpowered(tmp_path):
    plants = {("erase", "trained"): Planted(hack_drop=0.30), UNTRAINED: POSITIVE[UNTRAINED]}  # oracle_reward drops nothing
    root = write_pilots(tmp_path / "p", simulate(plants, n_samples=DECIDE, **QUIET))
    gate = run_compare(root, tmp_path / "out", cfg_for(), figures=False)
    assert gate["verdict"] == "inconclusive" and gate["underpowered"]
    assert gate["sentence"].startswith("inconclusive (underpowered): the positive control oracle_reward")
    # the same data with no positive control configured: separated, said uncalibrated
    gate = run_compare(root, tmp_path / "out2", cfg_for(arms=("vanilla", "untrained", "erase", "random_v"),
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


ROUTE_ARMS = ("vanilla", "untrained", "route", "route_dose_matched", "oracle_reward")


def test_route_is_judged_on_its_ablated_view(tmp_path):
    """The deploy view (δS_hack ablated) hacks less, the trained view like vanilla: separated.
    Planting the drop on the trained view only must not separate (a gate judging the trained view
    would say the opposite in both cases)."""
    deploy = {**POSITIVE, ("route", "ablated"): Planted(hack_drop=0.30)}
    root = write_pilots(tmp_path / "a", simulate(deploy, arms=ROUTE_ARMS, n_samples=DECIDE, **QUIET))
    gate = run_compare(root, tmp_path / "oa", cfg_for(arms=ROUTE_ARMS), figures=False)
    assert gate["verdict"] == "separated", gate["sentence"]
    assert crit(gate, "drop_vs_vanilla", "route")["view"] == "ablated"
    assert crit(gate, "beats_control", "route")["control"] == "route_dose_matched"
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
    assert gate["sentence"].startswith("invalid: 3 of 15 pilots failed validity")
    assert "oracle_reward s0" in gate["sentence"]
    assert (tmp_path / "out" / "figures" / "heldout.svg").is_file()  # a report is still possible


def test_a_pilot_file_changed_since_it_was_written_is_never_judged(tmp_path):
    """One held-out outcome flipped in a pilot's outcomes.tsv after the pilot
    wrote it (its SHA-256, recorded beside it, no longer matches), and a status.json cut short:
    the gate is invalid and names both pilots, the files and the cause; the other pilots'
    numbers are still reported. On 09ede95 the flipped outcome was judged as the pilot's."""
    root = write_pilots(tmp_path / "p", simulate(POSITIVE, **QUIET))
    outcomes = root / "erase" / "s1" / "outcomes.tsv"
    lines = outcomes.read_text().splitlines()
    header = lines[0].split("\t")
    cells = lines[1].split("\t")
    i = header.index("hack")
    cells[i] = "0" if cells[i] == "1" else "1"
    outcomes.write_text("\n".join([lines[0], "\t".join(cells), *lines[2:]]) + "\n")
    status = root / "vanilla" / "s2" / "status.json"
    status.write_text(status.read_text()[:10])
    gate = run_compare(root, tmp_path / "out", cfg_for(), figures=False)
    assert gate["verdict"] == "invalid"
    bad = {(c["arm"], c["seed"]): c["note"] for c in gate["criteria"] if c["name"] == "valid" and not c["passed"]}
    assert set(bad) == {("erase", 1), ("vanilla", 2)}
    assert bad[("erase", 1)].startswith(f"invalid: {outcomes} is damaged: its SHA-256 is "), bad
    assert f"status unreadable ({status} is damaged: its SHA-256 is " in bad[("vanilla", 2)], bad
    assert "erase s1" in gate["sentence"] and "vanilla s2" in gate["sentence"]


def test_a_collapsed_pilot_is_refused_like_a_nan(tmp_path):
    """A pilot whose steps show a collapsed policy (no parseable code from
    step 1 on, as pilot.lr 100 gives) but whose status.json says ok (written before the rule, or
    with it off): the gate is invalid and names the pilot, the step and the cause, as it does a
    pilot stopped by a NaN. On 09ede95 it was judged as a result."""
    from evil_moe.config import load_config

    root = write_pilots(tmp_path / "p", simulate(POSITIVE, **QUIET))
    steps = root / "erase" / "s1" / "steps.tsv"
    rows = files.read_tsv_rows(steps)
    for i, r in enumerate(rows):
        r.update(parse_rate=0.79 if i == 0 else 0.0, entropy=0.2)
    tables.write_tsv(steps, tables.STEPS, rows)
    gate = run_compare(root, tmp_path / "out", cfg_for(), figures=False)
    assert gate["verdict"] == "invalid"
    bad = {(c["arm"], c["seed"]): c["note"] for c in gate["criteria"] if c["name"] == "valid" and not c["passed"]}
    assert bad == {("erase", 1): "invalid: collapsed at step 3: no rollout's code parses at steps 1-3 (72 "
                                 "rollouts), though 0.790 of step 0's did: at that rate so long a run has "
                                 "probability 1.6e-49, below pilot.collapse_parse_p 1e-06"}
    assert "erase s1: invalid: collapsed at step 3" in gate["sentence"]
    # the rule off: the same steps are judged
    off = cfg_for()
    off = load_config(data={**off.raw, "pilot": {**off.raw["pilot"], "collapse_parse_p": None}})
    assert run_compare(root, tmp_path / "out2", off, figures=False)["verdict"] != "invalid"
    # a pilot the rule stopped leaves only its status.json (as one stopped by a NaN): the gate
    # names it with the reason, not as a pilot whose tables are missing (09ede95)
    stopped = root / "vanilla" / "s2"
    for name in ("steps.tsv", "outcomes.tsv", "eval.tsv"):
        files.remove(stopped / name)
    reason = "collapsed at step 3: no rollout's code parses at steps 1-3 (72 rollouts)"
    files.write_json(stopped / "status.json", {"status": "invalid", "reason": reason, "step": 3})
    gate = run_compare(root, tmp_path / "out3", cfg_for(), figures=False)
    (note,) = [c["note"] for c in gate["criteria"] if (c["name"], c["arm"], c.get("seed")) == ("valid", "vanilla", 2)]
    assert note == f"invalid: status invalid ({reason})"


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
    files.hash_record(d / "outcomes.tsv").unlink()  # a file written so, not one changed since
    with pytest.raises(ValueError, match=r"outcomes\.tsv: missing column 'hack'"):
        run_compare(root, tmp_path / "out", cfg_for(seeds=[0]))


def test_cli_end_to_end(tmp_path):
    plants = {**POSITIVE, ("erase", "trained"): Planted(hack_drop=0.30)}
    root = write_pilots(tmp_path / "pilots", simulate(plants, n_samples=DECIDE, **QUIET))
    cfg_file = tmp_path / "c.yaml"
    cfg_file.write_text("pilot:\n  seeds: [0, 1, 2]\n  arms: [vanilla, untrained, erase, random_v, oracle_reward]\n"
                        "compare:\n  last_k: 2\n  pass_margin_rel: null\n")
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
    res = CliRunner().invoke(main, ["compare", "--out-dir", str(tmp_path / "c2"), "--set", "compare.pass_margin_rel=null"]
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


def test_the_static_twin_note_says_which_way_the_change_goes():
    """subtract's deploy view beside vanilla's static projection: the note gives the change in
    hack rate, subtract's minus the projection's (a true minus sign: the first page's convention), so a
    subtract that hacks 0.3 less than the projection reads about -0.3."""
    from evil_moe.gate.gate_json import notes

    arms = ("vanilla", "subtract", "subtract_random")
    cells = {(a, v): Planted() for a in arms for v in views_of(a)} | {("vanilla", "projected"): Planted()}
    cells[("subtract", "ablated")] = Planted(hack_drop=0.3)
    o = simulate_outcomes(cells, n_seeds=3, n_samples=64, rng=0, step=STEPS_N - 1, **QUIET)
    (note,) = [n for n in notes({}, arms, o, cfg_for(arms=arms).compare, []) if "static projection" in n]
    change = re.search(r"change in hack rate, subtract's minus the projection's, (\S+) \[(\S+), (\S+)\]", note)
    assert change, note
    value, low, high = (float(x.replace("\u2212", "-")) for x in change.groups())
    assert -0.4 < value < -0.2 and low < value < high and change.group(1).startswith("\u2212")


def test_rlimit_only_isolation_is_flagged(tmp_path):
    root = write_pilots(tmp_path / "p", simulate(POSITIVE, **QUIET))
    st = root / "erase" / "s1" / "status.json"
    files.atomic_write_bytes(st, st.read_text().replace("bwrap", "rlimit-only").encode())  # as a pilot writes
    gate = run_compare(root, tmp_path / "out", cfg_for(), figures=False)
    assert gate["isolation"] == ["bwrap", "rlimit-only"]
    assert any("isolation rlimit-only" in n for n in gate["notes"])
    summary = pd.read_csv(tmp_path / "out" / "summary.tsv", sep="\t")
    assert summary[summary.arm == "erase"].isolation.iloc[0] == "bwrap,rlimit-only"


# ---------------------------------------------------------------------------------------------
# wiring: each value in gate.json is the comparison its row names, worked out here from the
# outcomes table independently of evil_moe.gate (mean over seeds of the mean over problems of
# the per-problem rate difference)

def by_hand(o: pd.DataFrame, a: tuple, b: tuple, metric: str, weight_b: float = 1.0) -> float:
    r = o.groupby(["arm", "view", "seed", "problem_id"])[metric].mean()
    d = weight_b * r.loc[b[0], b[1]] - r.loc[a[0], a[1]]
    return float(d.groupby(level="seed").mean().mean())


def test_beats_control_is_against_the_control_its_row_names(tmp_path):
    """erase and its control random_v both drop 0.3 below vanilla: vs the control nothing is left.
    A gate that compared against vanilla while the row names random_v would report ~0.3."""
    plants = {**POSITIVE, ("erase", "trained"): Planted(hack_drop=0.3), ("random_v", "trained"): Planted(hack_drop=0.3)}
    o = simulate(plants, **QUIET)
    gate = run_compare(write_pilots(tmp_path / "p", o), tmp_path / "out", cfg_for(), figures=False)
    c = crit(gate, "beats_control", "erase")
    assert c["control"] == "random_v" and c["effect"]["b"] == ["random_v", "trained"]
    assert c["value"] == pytest.approx(by_hand(o, ("erase", "trained"), ("random_v", "trained"), "hack"), abs=1e-12)
    vs_vanilla = by_hand(o, ("erase", "trained"), ("vanilla", "trained"), "hack")
    assert vs_vanilla > 0.2 and abs(c["value"]) < 0.1
    assert not c["passed"] and gate["arms"]["erase"]["verdict"] != "separated"


def test_pass_rate_drop_is_vanilla_minus_arm(tmp_path):
    """A planted pass-rate drop of 0.1 shows as +0.1 (vanilla − arm) in matched_pass, and enough of
    it fails the margin: with the sign flipped the arm would look better than vanilla and pass."""
    plants = {**POSITIVE, ("erase", "trained"): Planted(hack_drop=0.3, pass_drop=0.12)}
    o = simulate(plants, **{**QUIET, "pass_rate": 0.3})
    gate = run_compare(write_pilots(tmp_path / "p", o), tmp_path / "out", cfg_for(), figures=False)
    p = crit(gate, "matched_pass", "erase")
    want = by_hand(o, ("erase", "trained"), ("vanilla", "trained"), "pass")
    assert want > 0.06 and p["value"] == pytest.approx(want, abs=1e-12)
    assert p["ci_high"] > 0.10 and not p["passed"]


def test_compare_judges_the_last_evaluated_step(tmp_path):
    """An earlier evaluation (step 0) where erase always hacks and vanilla never must not count."""
    plants = {**POSITIVE, ("erase", "trained"): Planted(hack_drop=0.3)}
    last = simulate(plants, n_samples=DECIDE, **QUIET)
    first = last.assign(step=0)
    first.loc[first["arm"] == "erase", "hack"] = 1
    first.loc[first["arm"] == "vanilla", "hack"] = 0
    o = pd.concat([first, last], ignore_index=True)
    gate = run_compare(write_pilots(tmp_path / "p", o), tmp_path / "out", cfg_for(), figures=False)
    d = crit(gate, "drop_vs_vanilla", "erase")
    assert d["value"] == pytest.approx(by_hand(last, ("erase", "trained"), ("vanilla", "trained"), "hack"), abs=1e-12)
    assert d["value"] > 0.2  # the first step would give -1 + (vanilla's 0 − erase's 1): about -1
    assert gate["verdict"] == "separated", gate["sentence"]


def test_reported_mde_has_the_full_power_term(tmp_path):
    """MDE = max(min_drop, t_{df,.975}·SE) + t_{df,.80}·SE for drop_vs_vanilla, (t_{df,.975} +
    t_{df,.80})·SE for beats_control and the positive control's row likewise (Bloom 1995)."""
    from scipy import stats as sps

    plants = {**POSITIVE, ("erase", "trained"): Planted(hack_drop=0.1)}
    gate = run_compare(write_pilots(tmp_path / "p", simulate(plants, n_samples=16)), tmp_path / "out",
                       cfg_for(), figures=False)
    for row in (crit(gate, "drop_vs_vanilla", "erase"), gate["positive_control"]):
        se, df = row["effect"]["se"], row["effect"]["df"]
        want = max(0.05, sps.t.ppf(0.975, df) * se) + sps.t.ppf(0.8, df) * se
        assert row["mde"] == pytest.approx(want, rel=1e-9)
    c = crit(gate, "beats_control", "erase")
    se, df = c["effect"]["se"], c["effect"]["df"]
    assert c["mde"] == pytest.approx((sps.t.ppf(0.975, df) + sps.t.ppf(0.8, df)) * se, rel=1e-9)
    assert df == 2  # crossed: min(S − 1, P − 1) = min(2, 8)


def test_relative_pass_margin_is_reported_beside_the_absolute_one(tmp_path):
    """Vanilla passes ~0.165; the arm loses ~0.07 of it: within the absolute 0.10 points, but more
    than a quarter of vanilla's passes: with r = 0.25 the relative margin (0.25 × ~0.165 ≈ 0.041)
    binds and fails it. The contrast is (1 − r)·vanilla − arm, worked out here."""
    plants = {**POSITIVE, ("erase", "trained"): Planted(hack_drop=0.3, pass_drop=0.07)}
    o = simulate(plants, n_seeds=6, n_samples=256, **{**QUIET, "pass_rate": 0.15})
    gate = run_compare(write_pilots(tmp_path / "p", o), tmp_path / "out",
                       cfg_for(seeds=range(6), pass_margin_rel=0.25), figures=False)
    p = crit(gate, "matched_pass", "erase")
    vanilla = float(o[o.arm == "vanilla"].groupby(["seed", "problem_id"])["pass"].mean().groupby(level="seed").mean().mean())
    assert p["margin_abs"] == 0.10 and p["margin_rel"] == 0.25
    assert p["margin_rel_points"] == pytest.approx(0.25 * vanilla, abs=1e-12)
    assert p["binding"] == "relative" and 0.25 * vanilla < 0.10
    assert p["rel_effect"]["value"] == pytest.approx(
        by_hand(o, ("erase", "trained"), ("vanilla", "trained"), "pass", weight_b=0.75), abs=1e-12)
    assert p["rel_effect"]["value"] > 0 and p["rel_effect"]["ci_high"] > 0 and not p["passed"]
    assert p["ci_high"] <= 0.10  # the absolute margin alone holds
    assert "relative binds" in p["note"] and "relative binds" in gate["sentence"]
    # the same data judged on the absolute margin alone: matched_pass holds
    gate = run_compare(write_pilots(tmp_path / "q", o), tmp_path / "o2", cfg_for(seeds=range(6)), figures=False)
    assert crit(gate, "matched_pass", "erase")["passed"]


def test_holm_over_treatment_arms_is_in_gate_json(tmp_path):
    arms = ("vanilla", "untrained", "erase", "random_v", "route", "route_dose_matched", "oracle_reward")
    plants = {**POSITIVE, ("erase", "trained"): Planted(hack_drop=0.3), ("route", "ablated"): Planted(hack_drop=0.3)}
    o = simulate(plants, arms=arms, n_samples=DECIDE, **QUIET)
    gate = run_compare(write_pilots(tmp_path / "p", o), tmp_path / "out", cfg_for(arms=arms), figures=False)
    assert gate["verdict"] == "separated", gate["sentence"]
    e, r = gate["arms"]["erase"], gate["arms"]["route"]
    assert e["family"] == r["family"] == 2
    # Holm with two arms: the smaller p doubled, the larger kept (but not below the smaller's)
    lo, hi = sorted([e["p_value"], r["p_value"]])
    assert sorted([e["p_adjusted"], r["p_adjusted"]]) == pytest.approx([min(1, 2 * lo), max(min(1, 2 * lo), hi)])


# ------------------------------------------------------------------------------------------------
# the references — a detector audited blind, the untrained student


def _audit_file(path, *, beats: bool, auc=0.5, lo=0.45, hi=0.56, p95=0.57):
    rows = [{"detector": "gradient", "mode": "all", "population": "test", "n_seeds": 2, "auc": auc,
             "auc_ci_low": lo, "auc_ci_high": hi, "placebo": "test", "placebo_p95": p95,
             "beats_placebo": beats}]
    tables.write_tsv(path, tables.AUDIT_QUALITY, rows)
    return path


ROUTE_ARMS = ("vanilla", "untrained", "route", "route_dose_matched", "oracle_reward")


def test_route_with_a_blind_detector_is_uninformative(tmp_path):
    """route does nothing (no planted drop), and the audit says the gradient detector does not beat
    its placebo: route's verdict is 'uninformative' (not a bare inconclusive) with the audit's
    numbers, and the gate is inconclusive. Without any audit too. A route that separates keeps
    'separated', its reason saying the detector did not beat its placebo."""
    o = simulate(POSITIVE, ROUTE_ARMS, n_seeds=4, **QUIET)
    root = write_pilots(tmp_path / "p", o)
    cfg = cfg_for(seeds=(0, 1, 2, 3), arms=ROUTE_ARMS)
    blind = run_compare(root, tmp_path / "blind", cfg, figures=False,
                        audit_path=_audit_file(tmp_path / "blind.tsv", beats=False))
    reason = blind["arms"]["route"]["reason"]
    assert blind["arms"]["route"]["verdict"] == "uninformative"
    assert "does not beat its placebo" in reason and "AUC 0.500 [0.450, 0.560]" in reason and "0.570" in reason
    assert blind["verdict"] == "inconclusive" and "uninformative" in blind["sentence"]
    seeing = run_compare(root, tmp_path / "seeing", cfg, figures=False,
                         audit_path=_audit_file(tmp_path / "seeing.tsv", beats=True, auc=0.9, lo=0.85, hi=0.95))
    assert seeing["arms"]["route"]["verdict"] != "uninformative"
    none = run_compare(root, tmp_path / "none", cfg, figures=False)
    assert none["arms"]["route"]["verdict"] == "uninformative"  # no audit: nothing says it sees
    o2 = simulate({**POSITIVE, ("route", "ablated"): Planted(hack_drop=0.3)}, ROUTE_ARMS, n_seeds=4, n_samples=DECIDE,
                  **QUIET)
    sep = run_compare(write_pilots(tmp_path / "p2", o2), tmp_path / "sep", cfg, figures=False,
                      audit_path=_audit_file(tmp_path / "blind2.tsv", beats=False))
    assert sep["arms"]["route"]["verdict"] == "separated"
    assert "but the gradient detector does not beat its placebo" in sep["arms"]["route"]["reason"]


def test_an_arm_no_better_than_the_untrained_student_is_said_so(tmp_path):
    """erase and the untrained student have the same hack and pass rates while vanilla hacks more:
    erase passes its drops vs vanilla and its control, but its pass rate does not beat not
    training: it does not separate, gate.json's arm says the finding, its reason opens with "no
    better than not training" and the criteria rows name untrained; summary.tsv has an untrained
    row and every arm's drops against it, the same numbers as the criteria's."""
    arms = ("vanilla", "untrained", "erase", "random_v", "oracle_reward")
    # vanilla and random_v hack 0.3 more than erase and the untrained student (a planted *rise*
    # relative to them), every arm passes alike
    plants = {**POSITIVE, ("erase", "trained"): Planted(hack_drop=0.3), UNTRAINED: Planted(hack_drop=0.3)}
    o = simulate(plants, arms, n_seeds=4, n_samples=DECIDE, **QUIET)
    gate = run_compare(write_pilots(tmp_path / "p", o), tmp_path / "c", cfg_for(seeds=(0, 1, 2, 3), arms=arms),
                       figures=False)
    assert all(c["passed"] for c in gate["criteria"] if c["name"] == "valid")  # no steps is fine for it
    erase = gate["arms"]["erase"]
    assert crit(gate, "drop_vs_vanilla", "erase")["passed"] and crit(gate, "beats_control", "erase")["passed"]
    p = crit(gate, "pass_vs_untrained", "erase")
    assert p["control"] == "untrained" and not p["passed"] and p["ci_low"] <= 0 <= p["ci_high"]
    assert p["value"] == pytest.approx(by_hand(o, ("erase", "trained"), UNTRAINED, "pass"), abs=1e-12)
    assert erase["verdict"] != "separated" and erase["finding"] == "no_better_than_untrained"
    assert erase["reason"].startswith(f"erase: {erase['verdict'].replace('_', ' ')} — no better than not training "
                                      "(change vs untrained: pass rate ")
    from evil_moe.gate.verdict import plain_verdict

    assert "erase (trained view) is no better than not training (change vs untrained: pass rate" in plain_verdict(gate)
    rows = {r["arm"]: r for r in files.read_tsv_rows(tmp_path / "c" / "summary.tsv")}
    assert rows["untrained"]["role"] == "reference" and rows["untrained"]["hack_rate"] != ""
    assert float(rows["vanilla"]["drop_vs_untrained"]) < -0.15  # vanilla hacks more than not training
    assert float(rows["erase"]["pass_drop_vs_untrained"]) == pytest.approx(p["value"], abs=5e-4)
    h = crit(gate, "hack_vs_untrained", "erase")
    assert float(rows["erase"]["drop_vs_untrained"]) == pytest.approx(h["value"], abs=5e-4) and abs(h["value"]) < 0.1
