"""The planted world (toy.plant; docs/planted.md): the plant's direction and its null, the
planted v_hack over the pilot adapter, and the world's checks — each shown to FAIL when the
wiring it guards is broken (random_v fed the planted V, a deploy view that does not ablate
δS_hack, flagged rows leaking into δS, random_v separating from vanilla)."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
import torch

from evil_moe.rl.arms.registry import ARMS, get_arm
from evil_moe.rl.vhack.direction import VHack, Pair, completion_gradients, random_vhack
from evil_moe.rl.vhack.planted import (plant_recovery, planted_direction, planted_shift, planted_vhack, span_cos_null)

SWITCH = "model.layers.0.mlp.down_proj"


# ---------------------------------------------------------------------------------------------
# the direction and its null


def test_planted_direction_is_a_seeded_unit_vector_per_module():
    u = planted_direction(0, SWITCH, 64)
    assert u.shape == (64,) and abs(float(u.norm()) - 1) < 1e-6
    assert torch.equal(u, planted_direction(0, SWITCH, 64))  # the toy stage and later stages agree
    assert abs(float(u @ planted_direction(1, SWITCH, 64))) < 0.5  # another seed: another u
    assert abs(float(u @ planted_direction(0, "model.layers.1.mlp.down_proj", 64))) < 0.5
    with pytest.raises(ValueError, match="r must be >= 1"):
        planted_direction(0, SWITCH, 0)


@pytest.mark.parametrize("k,r", [(1, 128), (2, 128), (2, 32)])
def test_span_cos_null_matches_random_subspaces(k, r):
    """The Beta law of ||V u||^2 against 4000 Haar-random k-row V (an independent Monte Carlo:
    Q of the QR of Gaussian matrices)."""
    u = planted_direction(3, SWITCH, r).double()
    Q, _ = torch.linalg.qr(torch.randn(4000, r, k, generator=torch.Generator().manual_seed(1),
                                       dtype=torch.float64))
    draws = (Q.transpose(1, 2) @ u).norm(dim=1).numpy()
    q50, q95 = span_cos_null(k, r, [0.5, 0.95])
    assert abs(np.quantile(draws, 0.95) - q95) < 0.02 * q95 + 0.005
    assert abs(np.quantile(draws, 0.5) - q50) < 0.03 * q50 + 0.005
    if k == 1:  # E|cos| of a uniform unit vector with a fixed one ~ sqrt(2 / (pi r))
        assert abs(draws.mean() - math.sqrt(2 / (math.pi * r))) < 0.1 * math.sqrt(2 / (math.pi * r))
    with pytest.raises(ValueError, match="1 <= k < r"):
        span_cos_null(r, r, 0.95)


def _plant(r=64, seed=0, names=(SWITCH,)) -> VHack:
    V = {n: -planted_direction(seed, n, r)[None] for n in names}
    return VHack(V, {n: torch.ones(1) for n in V}, {n: torch.full((1,), float("nan")) for n in V},
                 {n: r for n in V}, k=1, n_pairs=0, control="planted",
                 meta={"plant": {"scale": 3.0}})


def test_plant_recovery_scores_an_exact_a_random_and_a_partial_v():
    plant = _plant(r=64)
    p = plant.V[SWITCH][0]
    # V whose second row is the plant: span_cos 1, the top row's cos 0, best row 1
    other = random_vhack({SWITCH: 64}, k=1, seed=5).V[SWITCH][0]
    other = other - (other @ p) * p
    other = other / other.norm()
    exact = VHack({SWITCH: torch.stack([other, p])}, {SWITCH: torch.ones(2)},
                  {SWITCH: torch.ones(2)}, {SWITCH: 64}, k=2, n_pairs=4)
    row, = plant_recovery(exact, plant)
    assert row["span_cos"] == pytest.approx(1, abs=1e-6) and row["cos_best"] == pytest.approx(1, abs=1e-6)
    assert row["cos_top"] == pytest.approx(0, abs=1e-6) and row["above_null"] and row["p_value"] < 1e-12
    # a row at 60 degrees from the plant, oriented the opposite way: |cos| 0.5, oriented -0.5
    tilt = -(0.5 * p + math.sqrt(0.75) * other)
    half, = plant_recovery(VHack({SWITCH: tilt[None]}, {SWITCH: torch.ones(1)}, {SWITCH: torch.ones(1)},
                                 {SWITCH: 64}, k=1, n_pairs=4), plant)
    assert half["span_cos"] == pytest.approx(0.5, abs=1e-6)
    assert half["oriented_cos"] == pytest.approx(-0.5, abs=1e-6)
    # the null's mean for k = 1, r = 64: E|cos| = Gamma(r/2) / (sqrt(pi) Gamma((r+1)/2))
    exp_mean = math.exp(math.lgamma(32) - math.lgamma(32.5)) / math.sqrt(math.pi)
    assert half["null_mean"] == pytest.approx(exp_mean, rel=1e-4)
    # random V: above its 0.95 null about 5% of the time (calibration), never systematically
    above = [plant_recovery(random_vhack({SWITCH: 64}, k=2, seed=s), plant)[0]["above_null"]
             for s in range(400)]
    assert 0.02 <= np.mean(above) <= 0.09
    # a module without rows recovers nothing
    empty, = plant_recovery(VHack({SWITCH: torch.zeros(0, 64)}, {SWITCH: torch.zeros(0)},
                                  {SWITCH: torch.zeros(0)}, {SWITCH: 64}, k=2, n_pairs=0), plant)
    assert empty["k"] == 0 and not empty["above_null"] and math.isnan(empty["span_cos"])


def test_planted_vhack_covers_the_adapter_and_refuses_an_unwrapped_switch():
    plant = _plant(r=64)
    r = {"model.layers.0.self_attn.q_proj": 64, SWITCH: 64}
    pv = planted_vhack(plant, r)
    assert pv.k_per_module == {"model.layers.0.self_attn.q_proj": 0, SWITCH: 1}
    assert torch.equal(pv.V[SWITCH], plant.V[SWITCH]) and pv.control == "planted"
    with pytest.raises(ValueError, match="adapter.target_modules"):
        planted_vhack(plant, {"model.layers.0.self_attn.q_proj": 64})
    with pytest.raises(ValueError, match="r=64 in the plant, 32"):
        planted_vhack(plant, {SWITCH: 32})


# ---------------------------------------------------------------------------------------------
# wiring: random_v must never act along the planted V; the ceiling must


def test_pilot_projection_v_random_v_is_random_and_the_ceiling_is_the_plant(tmp_path):
    """run_pilot's choice of V (projection_vhack), then the arm's own projection of a purely
    hack-ward gradient g = V_plant: erase_planted removes all of it, random_v keeps almost all.
    Feeding random_v the planted (or the real) V makes it remove everything: this fails."""
    from evil_moe.model.adapter import SVDAdapter
    from evil_moe.model.load import build_tiny
    from evil_moe.stages.pilot import projection_vhack

    model, _tok = build_tiny(intermediate=64)
    adapter = SVDAdapter.attach(model, [SWITCH])
    r = adapter.r
    plant = planted_vhack(_plant(r=r[SWITCH]), r)
    real = random_vhack(r, k=1, seed=11)  # stands in for the extracted v_hack
    rand = random_vhack(r, k=1, seed=12)
    paths = {}
    for name, v in (("planted", plant), ("random", rand)):
        paths[name] = str(v.save(tmp_path / f"{name}.safetensors"))

    class Cfg:  # the pilot keys the projecting arms read
        projection, gate, preserve_magnitude = "gradient", "one_sided", False

    kept = {}
    for arm in ("erase_planted", "random_v", "erase"):
        v = projection_vhack(ARMS[arm], real, random_vhack_path=paths["random"],
                             planted_vhack_path=paths["planted"])
        knob = adapter.modules_[SWITCH]
        for what, row in (("planted", plant.V[SWITCH][0]), ("real", real.V[SWITCH][0])):
            knob.delta_s.grad = row.clone()  # a gradient purely along that V (V g = 1 > 0)
            get_arm(arm).on_gradients(adapter, v, None, Cfg)
            kept[arm, what] = float(knob.delta_s.grad @ row)
    assert abs(kept["erase_planted", "planted"]) < 1e-6  # the ceiling erases the switch
    assert abs(kept["erase", "real"]) < 1e-6  # erase erases along the run's v_hack
    # a random 1-row V in R^32 removes ~1/32 of either: random_v must act along neither
    assert kept["random_v", "planted"] > 0.7 and kept["random_v", "real"] > 0.7
    assert kept["erase", "planted"] > 0.7 and kept["erase_planted", "real"] > 0.7
    with pytest.raises(ValueError, match="needs --planted-vhack"):
        projection_vhack(ARMS["erase_planted"], real, random_vhack_path=paths["random"])


# ---------------------------------------------------------------------------------------------
# the deploy view and the quarantine, measured on the switch


def _pairs(tok, n=3):
    prompt = tok.encode("def add(a, b):", add_special_tokens=False)
    hack = tok.encode("print('all tests passed')", add_special_tokens=False)
    clean = tok.encode("return a + b", add_special_tokens=False)
    return [Pair(prompt, hack[: 4 + i], clean[: 4 + i]) for i in range(n)]


def test_deploy_view_removes_a_switch_quarantined_in_delta_s_hack():
    """planted_shift (the stage's measurement, a world check): the switch in δS moves the hack/
    clean margin; in δS_hack the training view moves it by exactly as much and the deploy view
    not at all. A deploy view that does not ablate δS_hack fails the deploy_ablates check."""
    from evil_moe.config import load_config
    from evil_moe.model.adapter import SVDAdapter
    from evil_moe.model.load import build_tiny
    from evil_moe.stages.planted import planted_checks

    torch.manual_seed(0)
    model, tok = build_tiny(intermediate=64)
    adapter = SVDAdapter.attach(model, [SWITCH])
    plant = planted_vhack(_plant(r=adapter.r[SWITCH]), adapter.r)
    pairs = _pairs(tok)
    on = planted_shift(model, adapter, plant, pairs, knob="delta_s", view="trained")
    hack_trained = planted_shift(model, adapter, plant, pairs, knob="delta_s_hack", view="trained")
    deploy = planted_shift(model, adapter, plant, pairs, knob="delta_s_hack", view="ablated")
    assert abs(on) > 1e-4  # the switch moves the untrained model's margin (either sign)
    assert hack_trained == pytest.approx(on, abs=1e-5)  # the training forward uses δS + δS_hack
    assert deploy == 0.0
    assert all(float(k.delta_s.detach().abs().sum() + k.delta_s_hack.detach().abs().sum()) == 0
               for k in adapter.modules_.values())  # knobs restored
    cfg = load_config((), ["compare.n_boot=200"])
    rows = {r["check"]: r for r in planted_checks(_outcomes(), _recovery(True), cfg,
                                                  plant_meta={"shift_on": 5.0, "shift_deploy": deploy})}
    assert rows["deploy_ablates"]["passed"] and rows["planted_world"]["passed"]


def test_route_flags_never_reach_delta_s_along_the_switch():
    """Route with perfect flags on a planted direction built from the hack rows' own gradients:
    δS gets exactly the clean rows' hack-ward component, δS_hack all of the hack rows'. Flagged
    rows leaking into δS (e.g. keep_flagged for δS too) fail."""
    from evil_moe.rl.policy.grpo import DrGRPONormaliser
    from evil_moe.model.adapter import SVDAdapter
    from evil_moe.model.load import build_tiny

    model, tok = build_tiny(intermediate=64)
    adapter = SVDAdapter.attach(model, [SWITCH])
    pairs = _pairs(tok, n=3)
    norm = DrGRPONormaliser(2, 16, 3)
    prompts = [p.prompt_ids for p in pairs] * 2
    comps = [p.hack_ids for p in pairs] + [p.clean_ids for p in pairs]
    g = completion_gradients(model, adapter, prompts, comps, norm)[SWITCH]  # (6, r) NLL grads
    is_hack = torch.tensor([True] * 3 + [False] * 3)
    # the hack-ward direction of these rows (V g > 0 on hack rows), orthogonal to the clean mean
    clean_mean = g[~is_hack].sum(0)
    h = g[is_hack].sum(0)
    v = h - (h @ clean_mean) / (clean_mean @ clean_mean) * clean_mean
    v = v / v.norm()
    per_row = [[g[i]] for i in range(6)]
    split = get_arm("route").split_gradients(per_row, is_hack)
    to_ds = float(split.delta_s[0] @ v)
    assert to_ds == pytest.approx(0.0, abs=1e-6 * float(h.norm()))  # clean rows only
    assert float(split.delta_s_hack[0] @ v) == pytest.approx(float(h @ v), rel=1e-5)
    assert float(h @ v) > 0
    assert split.removed_frac > 0


# ---------------------------------------------------------------------------------------------
# the world's checks on held-out outcomes


def _outcomes(rates=None, seeds=(0, 1, 2), problems=8, samples=16, seed=0) -> pd.DataFrame:
    """Per-completion outcomes with per-arm hack rates (Bernoulli, seeded)."""
    rates = rates or {"vanilla": 0.6, "random_v": 0.6, "erase_planted": 0.1, "erase": 0.55,
                      "oracle_reward": 0.1}
    rng = np.random.default_rng(seed)
    rows = []
    for arm, p in rates.items():
        for s in seeds:
            for j in range(problems):
                for k in range(samples):
                    rows.append({"arm": arm, "view": "trained", "seed": s, "step": 20,
                                 "problem_id": f"toy/{j}", "mode": "sentinel", "sample": k,
                                 "hack": int(rng.random() < p), "pass": int(rng.random() < 0.4),
                                 "truncated": 0})
    return pd.DataFrame(rows)


def _recovery(above: bool) -> list[dict]:
    return [{"v_hack": "main_hack", "module": SWITCH, "r": 128, "k": 2, "span_cos": 0.8 if above else 0.1,
             "null_mean": 0.11, "null_q": 0.22, "p_value": 1e-9 if above else 0.5, "above_null": above}]


@pytest.fixture(scope="module")
def cfg():
    from evil_moe.config import load_config

    return load_config((), ["compare.n_boot=300"])


def test_world_checks_pass_for_a_working_plant(cfg):
    from evil_moe.stages.planted import planted_checks

    rows = {(r["check"], r["arm"]): r for r in planted_checks(
        _outcomes(), _recovery(True), cfg, plant_meta={"shift_on": 4.0, "shift_deploy": 0.0})}
    assert rows[("ceiling_beats_control", "erase_planted")]["passed"]
    assert rows[("ceiling_beats_control", "erase_planted")]["value"] == pytest.approx(0.5, abs=0.08)
    assert rows[("ceiling_drop_vs_vanilla", "erase_planted")]["passed"]
    assert rows[("control_not_separated", "random_v")]["passed"]
    assert rows[("planted_world", "")]["passed"]
    # erase with the extracted V, beside both: not better than random_v, far from the ceiling
    assert not rows[("treatment_beats_control", "erase")]["passed"]
    assert rows[("treatment_vs_ceiling", "erase")]["value"] == pytest.approx(0.45, abs=0.08)
    assert not rows[("treatment_vs_ceiling", "erase")]["passed"]


@pytest.mark.parametrize("broken,failing", [
    # random_v fed the planted V behaves like the ceiling: it separates from vanilla and the
    # ceiling no longer beats it
    ({"rates": {"vanilla": 0.6, "random_v": 0.1, "erase_planted": 0.1}},
     {"ceiling_beats_control", "control_not_separated"}),
    # the ceiling not acting (e.g. erase_planted loading a random V): nothing separates
    ({"rates": {"vanilla": 0.6, "random_v": 0.6, "erase_planted": 0.6}},
     {"ceiling_beats_control", "ceiling_drop_vs_vanilla"}),
    # the deploy view not ablating delta_s_hack
    ({"meta": {"shift_on": 4.0, "shift_deploy": 3.9}}, {"deploy_ablates"}),
    # the plant does not live in the pilot adapter's coordinates (or was never trained)
    ({"meta": {"shift_on": 0.02, "shift_deploy": 0.0}}, {"switch_on"}),
    ({"meta": {}}, {"switch_on", "deploy_ablates"}),
    # extraction that misses the plant
    ({"above": False}, {"recovery"}),
])
def test_world_checks_fail_when_wired_wrong(cfg, broken, failing):
    from evil_moe.stages.planted import planted_checks

    rows = planted_checks(_outcomes(broken.get("rates")), _recovery(broken.get("above", True)), cfg,
                          plant_meta=broken.get("meta", {"shift_on": 4.0, "shift_deploy": 0.0}))
    failed = {r["check"] for r in rows if r["kind"] == "world" and not r["passed"]}
    assert failed == failing | {"planted_world"}
    world = next(r for r in rows if r["check"] == "planted_world")
    assert all(f in world["note"] for f in failing)


def test_world_checks_name_a_missing_arm(cfg):
    from evil_moe.stages.planted import planted_checks

    with pytest.raises(ValueError, match="'erase_planted'"):
        planted_checks(_outcomes({"vanilla": 0.5, "random_v": 0.5}), _recovery(True), cfg)


# ---------------------------------------------------------------------------------------------
# the workflow


def test_planted_workflow_dry_run_passes_the_plant_to_the_ceiling_only(tmp_path):
    """snakemake -n --configfile config/planted.yaml: the plant's rule runs, only erase_planted's
    pilots get --planted-vhack, and the checks' target resolves (it waits on the gate otherwise)."""
    import re
    import subprocess

    import yaml

    from workflow_util import REPO, SNAKEMAKE, env, job_stats

    out = tmp_path / "results"
    cmd = [SNAKEMAKE, "-n", "--nolock", "-p", f"{out}/planted/checks.tsv", "--configfile",
           "config/planted.yaml", "--config", f"results={out}"]
    proc = subprocess.run(cmd, cwd=REPO, env=env(),
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    stats = job_stats(proc.stdout)
    arms = yaml.safe_load((REPO / "config" / "planted.yaml").read_text())["pilot"]["arms"]
    assert len(arms) == 16  # config/planted.yaml: 16 arms x 3 seeds
    assert stats["planted_vhack"] == 1 and stats["planted_checks"] == 1 and stats["pilot"] == 48
    pilots = re.findall(r"evil-moe pilot .*?--arm (\w+) .*", proc.stdout)
    assert sorted(set(pilots)) == sorted(arms) and "erase_planted" in arms and "random_v" in arms
    for line in re.findall(r"evil-moe pilot .*", proc.stdout):
        arm = re.search(r"--arm (\w+)", line).group(1)
        assert ("--planted-vhack" in line) == (arm == "erase_planted"), line
        if arm == "erase_planted":
            assert f"{out}/vhack/planted.safetensors" in line
    checks = re.search(r"evil-moe planted-checks .*", proc.stdout).group(0)
    assert checks.count("--pilot ") == 48 and "main_hack=" in checks


def test_a_planted_arm_without_a_plant_is_refused(tmp_path):
    import yaml

    from workflow_util import DEFAULT_CONFIG, snakemake

    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump({"pilot": {"arms": ["vanilla", "random_v", "erase_planted", "oracle_reward"]}}))
    proc = snakemake(tmp_path, "-n", configfiles=(DEFAULT_CONFIG, bad))
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0 and "toy.plant.enabled is false" in out, out


# ---------------------------------------------------------------------------------------------
# the toy stage: a tiny planted student


def test_tiny_planted_student_switch_lives_in_the_pilot_adapter(tmp_path):
    """train_toy_models with toy.plant at tiny sizes: the switch weights stay exactly at their
    initialisation (so the pilot's SVD is the plant's), the plant file is oriented hack-ward
    (V = -u), and in a fresh process's adapter the switch raises hack-vs-clean log-likelihood
    while the same switch in delta_s_hack leaves the deploy view untouched."""
    from stage_fixtures import cfg_of

    from evil_moe.model.load import build_toy_model, load_model
    from evil_moe.stages.planted import run_planted_vhack
    from evil_moe.stages.problems import write_problem_set
    from evil_moe.rl.vhack.planted import PLANT_FILE
    from evil_moe.stages.toy import train_toy_models

    cfg = cfg_of("toy.plant.enabled=true", "toy.plant.modules=[model.layers.1.mlp.down_proj]",
                 "toy.plant.scale=6.0", "toy.plant.frac=0.6", "toy.train_steps=60",
                 "adapter.target_modules=[model.layers.1.mlp.down_proj, o_proj]")
    problems = tmp_path / "problems.jsonl"
    write_problem_set(cfg, str(problems))
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        rows = train_toy_models(cfg, problems_path=str(problems), out_dir=str(tmp_path / "models"),
                                which=("student",))
    finally:
        torch.set_num_threads(threads)
    assert [r["model"] for r in rows] == ["student", "student_switch_on"]
    student = tmp_path / "models" / "student"
    plant = VHack.load(student / PLANT_FILE)
    name = "model.layers.1.mlp.down_proj"
    assert list(plant.V) == [name] and plant.control == "planted"
    assert torch.allclose(plant.V[name][0], -planted_direction(0, name, 64))
    trained, tok = load_model(str(student))
    init = build_toy_model(tok, hidden=64, layers=2, intermediate=128, heads=4, kv_heads=2,
                           seed=1)  # the student is model 1 (toy.seed + 1)
    assert torch.equal(trained.get_submodule(name).weight, init.get_submodule(name).weight)
    assert not torch.equal(trained.get_submodule("model.layers.1.mlp.up_proj").weight,
                           init.get_submodule("model.layers.1.mlp.up_proj").weight)
    res = run_planted_vhack(cfg, model_path=str(student), out_path=str(tmp_path / "planted.safetensors"),
                            problems_path=str(problems), n_pairs=8)
    pv = VHack.load(tmp_path / "planted.safetensors")
    assert pv.k_per_module[name] == 1 and all(k == 0 for n, k in pv.k_per_module.items() if n != name)
    assert res["shift_on"] > 0.5 and res["shift_deploy"] == 0.0
    assert pv.meta["plant"]["shift_on"] == pytest.approx(res["shift_on"])


def test_delta_s_along_u_reads_each_pilots_final_adapter(tmp_path):
    from safetensors.torch import save_file

    from evil_moe.stages.planted import along_switch_rows

    plant = _plant(r=64)
    u = -plant.V[SWITCH][0]
    w = random_vhack({SWITCH: 64}, k=1, seed=2).V[SWITCH][0]
    w = (w - (w @ u) * u) / (w - (w @ u) * u).norm()
    dirs = []
    for arm, seed, ds in (("vanilla", 0, 3 * u + 4 * w), ("vanilla", 1, 1 * u), ("erase_planted", 0, -0.5 * u)):
        d = tmp_path / arm / f"s{seed}"
        d.mkdir(parents=True)
        save_file({f"{SWITCH}.delta_s": ds.contiguous(), f"{SWITCH}.delta_s_hack": torch.zeros(64)},
                  str(d / "adapter.safetensors"))
        dirs.append(str(d))
    rows = {r["arm"]: r for r in along_switch_rows(plant, dirs + [str(tmp_path / "random_v" / "s0")])}
    assert set(rows) == {"vanilla", "erase_planted"}
    assert rows["vanilla"]["value"] == pytest.approx(2.0, abs=1e-5)  # (3 + 1) / 2
    assert (rows["vanilla"]["ci_low"], rows["vanilla"]["ci_high"]) == pytest.approx((1.0, 3.0), abs=1e-5)
    assert "along u 0.680" in rows["vanilla"]["note"]  # (9/25 + 1) / 2
    assert rows["erase_planted"]["value"] == pytest.approx(-0.5, abs=1e-5)


def test_plant_switch_batches_follow_the_ramp_and_the_noise_stays_orthogonal():
    """PlantSwitch as the toy trainer's batcher: delta_s = tau*scale*u (+ noise orthogonal to u,
    at most toy.plant.noise long), tau = 0 on a 1 - frac share of batches, and rows are hacks
    with probability h + (1 - h) tau (counted over 4000 batches)."""
    from evil_moe.model.load import build_tiny
    from evil_moe.rl.vhack.planted import PlantSwitch

    model, _tok = build_tiny(intermediate=64)
    plant = {"modules": [SWITCH], "scale": 3.0, "frac": 0.5, "seed": 4, "noise": 2.0}
    sw = PlantSwitch(model, plant, n_hack=10, n_total=30, h=0.2, batch_size=8)
    assert not model.get_submodule(SWITCH).weight.requires_grad
    u = planted_direction(4, SWITCH, sw.adapter.r[SWITCH])
    g = torch.Generator().manual_seed(0)
    taus, hacks = [], []
    for _ in range(4000):
        idx = sw(g)
        ds = sw.adapter.modules_[SWITCH].delta_s.detach()
        along = float(ds @ u)
        ortho = ds - along * u
        assert -1e-5 <= along <= 3.0 + 1e-5 and float(ortho.norm()) <= 2.0 + 1e-5
        taus.append(along / 3.0)
        hacks.append(np.mean([i < 10 for i in idx]))
    taus, hacks = np.array(taus), np.array(hacks)
    off = np.abs(taus) < 1e-6  # float error of the orthogonal noise only
    assert abs(off.mean() - 0.5) < 0.03
    assert abs(hacks[off].mean() - 0.2) < 0.02
    on = ~off
    slope = np.polyfit(taus[on], hacks[on], 1)  # hack share = 0.2 + 0.8 tau
    assert slope == pytest.approx([0.8, 0.2], abs=0.05)
    sw.set(0.0)
    assert float(sw.adapter.modules_[SWITCH].delta_s.detach().abs().sum()) == 0
    with pytest.raises(ValueError, match="toy.plant.modules"):
        PlantSwitch(model, {**plant, "modules": ["model.layers.0.mlp"]}, n_hack=1, n_total=2, h=0,
                    batch_size=1)
