"""Ceilings, absorption and the detector-quality sweep in the compare stage, on
synthetic outcomes whose numbers are worked out by hand: the share of the ceiling's drop, the
ceiling's separation from vanilla and from its random-flag control, the hack rate on the modes the
detector knows and on those it never saw, and the sweep's drop per detector level."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from evil_moe import tables
from evil_moe.env.loopholes import MODES
from evil_moe.gate.ceilings import crossed_ratio, mode_rates
from evil_moe.config import load_config
from evil_moe.stages.compare import run_compare
from test_stage_compare import STEPS_N, write_pilots



def outcomes_of(rates: dict, *, seeds=(0, 1, 2), problems_per_mode=2, samples=8, jitter=0.0) -> pd.DataFrame:
    """Per-completion outcomes whose hack rate per (arm, view) and mode is exactly ``rates``
    (``rates[(arm, view)]`` is a rate or a dict mode -> rate; the share of hacks among ``samples``
    samples is rounded to a multiple of 1/samples); pass 0.5 everywhere."""
    rows = []
    rng = np.random.default_rng(0)
    for (arm, view), r in rates.items():
        for seed in seeds:
            for m in MODES:
                rate = r[m] if isinstance(r, dict) else r
                for k in range(problems_per_mode):
                    n_hack = int(round((rate + (rng.uniform(-jitter, jitter) if jitter else 0.0)) * samples))
                    n_hack = min(max(n_hack, 0), samples)
                    for j in range(samples):
                        rows.append({"arm": arm, "view": view, "seed": seed, "step": STEPS_N - 1,
                                     "problem_id": f"{m}/{k}", "sample": j, "mode": m,
                                     "hack": int(j < n_hack), "pass": int(j % 2 == 0), "truncated": 0})
    return pd.DataFrame(rows)


def test_crossed_ratio_by_hand():
    # vanilla hacks 1.0; route (ablated) 0.5; route_oracle 0.0 -> drops 0.5 and 1.0, share 0.5
    o = outcomes_of({("vanilla", "trained"): 1.0, ("route", "ablated"): 0.5, ("route_oracle", "ablated"): 0.0})
    r = crossed_ratio(o, (("route", "ablated"), ("vanilla", "trained")),
                      (("route_oracle", "ablated"), ("vanilla", "trained")), n_boot=200)
    assert (r.value, r.num, r.den, r.n_seeds, r.n_problems) == (pytest.approx(0.5), pytest.approx(0.5),
                                                                  pytest.approx(1.0), 3, 8)
    # identical cells in every seed and problem: every replicate gives 0.5, the interval is a point
    assert r.ci_low == pytest.approx(0.5) and r.ci_high == pytest.approx(0.5)
    # a ceiling that does not drop the hack rate leaves the share undefined
    o2 = outcomes_of({("vanilla", "trained"): 0.5, ("route", "ablated"): 0.25, ("route_oracle", "ablated"): 0.75})
    assert crossed_ratio(o2, (("route", "ablated"), ("vanilla", "trained")),
                         (("route_oracle", "ablated"), ("vanilla", "trained")), n_boot=50).value is None
    # noise widens the interval around the point value
    o3 = outcomes_of({("vanilla", "trained"): 0.75, ("route", "ablated"): 0.5, ("route_oracle", "ablated"): 0.25},
                     jitter=0.2)
    r3 = crossed_ratio(o3, (("route", "ablated"), ("vanilla", "trained")),
                       (("route_oracle", "ablated"), ("vanilla", "trained")), n_boot=400)
    assert r3.ci_low < r3.value < r3.ci_high
    with pytest.raises(ValueError, match="no rows"):
        crossed_ratio(o, (("filter", "trained"), ("vanilla", "trained")),
                      (("route_oracle", "ablated"), ("vanilla", "trained")))


def test_mode_rates_split_known_and_unknown():
    o = outcomes_of({("route", "ablated"): {"run_tests": 0.0, "stdout_marker": 0.25, "sentinel": 0.75,
                                            "file_marker": 1.0}})
    known = mode_rates(o, ("route", "ablated"), ["run_tests", "stdout_marker"], n_boot=100)
    unknown = mode_rates(o, ("route", "ablated"), ["sentinel", "file_marker"], n_boot=100)
    assert known.value == pytest.approx(0.125) and unknown.value == pytest.approx(0.875)
    assert mode_rates(o, ("vanilla", "trained"), ["run_tests"], n_boot=100) is None


ARMS_C = ("vanilla", "untrained", "route", "route_dose_matched", "route_oracle", "route_oracle_dose_matched",
          "oracle_reward")


def test_compare_sets_each_treatment_beside_its_ceiling_and_splits_modes(tmp_path):
    """route drops the hack rate by 0.25 (0.5 of the ceiling's 0.5; its dose-matched control's drop
    is 0.125, so a share computed against the control would read 0.25); the ceiling separates from
    vanilla and from its dose-matched control; the deploy view's hack rate on the never-seen modes
    is reported apart from the known modes'. None of it is a gate criterion."""
    van = 0.75
    route = {"run_tests": 0.25, "stdout_marker": 0.25, "sentinel": 0.75, "file_marker": 0.75}  # 0.5
    rates = {("vanilla", "trained"): van, ("untrained", "trained"): van, ("oracle_reward", "trained"): 0.0,
             ("route", "ablated"): route, ("route", "trained"): van,
             ("route_dose_matched", "ablated"): 0.625, ("route_dose_matched", "trained"): van,
             ("route_oracle", "ablated"): 0.25, ("route_oracle", "trained"): van,
             ("route_oracle_dose_matched", "ablated"): van, ("route_oracle_dose_matched", "trained"): van}
    root = write_pilots(tmp_path / "pilots", outcomes_of(rates))
    cfg = load_config(data={"pilot": {"arms": list(ARMS_C), "seeds": [0, 1, 2]},
                            "vhack": {"known_modes": ["run_tests", "stdout_marker"]}},
                      overrides=["compare.n_boot=200"])
    gate = run_compare(root, tmp_path / "out", cfg)
    assert {c["arm"] for c in gate["criteria"] if c["name"] != "valid"} == {"route"}  # ceilings not judged
    c = gate["ceilings"]["route"]
    assert c["ceiling"] == "route_oracle" and c["view"] == "ablated"
    assert c["drop"]["value"] == pytest.approx(0.25) and c["ceiling_drop"]["value"] == pytest.approx(0.5)
    assert c["share"]["value"] == pytest.approx(0.5)
    assert c["ceiling_vs_control"]["value"] == pytest.approx(0.5)
    # the untrained student hacks 0.75 and passes 0.5, as the ceiling's pass rate: drops 0.5 and 0
    assert c["ceiling_drop_vs_untrained"]["value"] == pytest.approx(0.5)
    assert c["ceiling_pass_drop_vs_untrained"]["value"] == pytest.approx(0.0)
    assert any("route_oracle vs the untrained student (changes): pass rate 0.000 [0.000, 0.000], hack rate \u22120.500" in n
               for n in gate["notes"])
    assert any(n.startswith("route achieves 0.500") for n in gate["notes"])
    s = pd.read_csv(tmp_path / "out" / "summary.tsv", sep="\t")
    assert list(s.columns) == tables.names(tables.COMPARE_SUMMARY)
    row = s[(s.arm == "route") & (s.view == "ablated")].iloc[0]
    assert row.ceiling == "route_oracle" and row.ceiling_drop == pytest.approx(0.5)
    assert row.ceiling_share == pytest.approx(0.5) and row.drop_vs_vanilla == pytest.approx(0.25)
    assert row.drop_vs_control == pytest.approx(0.125)  # route 0.5 vs route_random 0.625
    assert row.hack_rate_known == pytest.approx(0.25) and row.hack_rate_unknown == pytest.approx(0.75)
    assert (row.hack_rate_run_tests, row.hack_rate_sentinel) == (pytest.approx(0.25), pytest.approx(0.75))
    ceil = s[(s.arm == "route_oracle") & (s.view == "ablated")].iloc[0]
    assert ceil.role == "ceiling" and ceil.drop_vs_vanilla == pytest.approx(0.5)
    assert ceil.drop_vs_control == pytest.approx(0.5) and pd.isna(ceil.ceiling)
    van_row = s[s.arm == "vanilla"].iloc[0]
    assert pd.isna(van_row.drop_vs_vanilla) and van_row.hack_rate_unknown == pytest.approx(0.75)
    assert gate["known_modes"] == ["run_tests", "stdout_marker"]
    for fig in ("ceiling", "absorption"):
        assert (tmp_path / "out" / "figures" / f"{fig}.svg").is_file()


def test_detector_sweep_summarises_drop_against_quality(tmp_path):
    from evil_moe.stages.detector_sweep import parse_level, run_detector_sweep

    main = write_pilots(tmp_path / "pilots", outcomes_of({
        ("vanilla", "trained"): 0.75, ("route_oracle", "ablated"): 0.25, ("route_oracle", "trained"): 0.75}))
    pilots = [("main", main / a / f"s{s}") for a in ("vanilla", "route_oracle") for s in (0, 1, 2)]
    for level, r_rate, f_rate in (("p0.8_r0.8", 0.5, 0.5), ("p0.8_r0.25", 0.5, 0.75)):
        root = write_pilots(tmp_path / "detector_sweep" / level, outcomes_of({
            ("route", "ablated"): r_rate, ("route", "trained"): 0.75, ("filter", "trained"): f_rate}))
        pilots += [(level, root / a / f"s{s}") for a in ("route", "filter") for s in (0, 1, 2)]
    cfg = load_config(data={"vhack": {"known_modes": ["run_tests", "stdout_marker"]}},
                      overrides=["compare.n_boot=200"])
    rows = run_detector_sweep(pilots, tmp_path / "sweep_out", cfg)
    got = {(r["level"], r["arm"]): r for r in rows}
    assert set(got) == {("ceiling", "route_oracle"), ("p0.8_r0.8", "route"), ("p0.8_r0.8", "filter"),
                        ("p0.8_r0.25", "route"), ("p0.8_r0.25", "filter")}
    assert got[("ceiling", "route_oracle")]["drop_vs_vanilla"] == pytest.approx(0.5)
    assert got[("p0.8_r0.25", "route")]["drop_vs_vanilla"] == pytest.approx(0.25)
    assert got[("p0.8_r0.25", "filter")]["drop_vs_vanilla"] == pytest.approx(0.0)
    assert got[("p0.8_r0.25", "filter")]["recall"] == 0.25 and got[("p0.8_r0.25", "route")]["view"] == "ablated"
    s = pd.read_csv(tmp_path / "sweep_out" / "summary.tsv", sep="\t")
    assert list(s.columns) == tables.names(tables.DETECTOR_SWEEP) and len(s) == 5
    assert (tmp_path / "sweep_out" / "quality.svg").is_file()
    # the CLI the workflow calls: --pilot LEVEL=DIR, the same rows
    from click.testing import CliRunner

    from evil_moe.cli import main

    res = CliRunner().invoke(main, ["detector-sweep", "--set", "compare.n_boot=200", "--set",
                                    "vhack.known_modes=[run_tests,stdout_marker]", "--out-dir", str(tmp_path / "cli")]
                             + [x for lv, d in pilots for x in ("--pilot", f"{lv}={d}")])
    assert res.exit_code == 0, res.output
    assert pd.read_csv(tmp_path / "cli" / "summary.tsv", sep="\t").equals(s)
    res = CliRunner().invoke(main, ["detector-sweep", "--pilot", str(pilots[0][1])])
    assert res.exit_code != 0 and "expected LEVEL=DIR" in res.output
    assert parse_level("p0.5_r1") == (0.5, 1.0)
    with pytest.raises(ValueError, match="not a detector level"):
        parse_level("q1")
    with pytest.raises(ValueError, match="needs vanilla"):
        run_detector_sweep([p for p in pilots if "vanilla" not in str(p[1])], tmp_path / "x", cfg)
