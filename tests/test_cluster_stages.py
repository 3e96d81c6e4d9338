"""The one table of stages (evil_moe/cluster/stages.py): which rules grade completions in the
sandbox, and the Slurm preflight probing the sandbox where they run."""

from __future__ import annotations

import subprocess

from evil_moe.cluster.slurm_check import Request, bwrap_partitions, check_bwrap, parse_cluster
from evil_moe.cluster.stages import GRADING_RULES, TABLE

PARTITIONS = """\
PartitionName=cpu Default=YES MaxTime=2-00:00:00 Nodes=c01 State=UP TotalCPUs=64
PartitionName=gpu Default=NO MaxTime=12:00:00 Nodes=g01 State=UP TotalCPUs=64 MaxMemPerNode=200000
"""
NODES = """\
NodeName=c01 CPUTot=64 Gres=(null) RealMemory=256000 State=IDLE Partitions=cpu
NodeName=g01 CPUTot=64 Gres=gpu:a100:4 RealMemory=512000 State=IDLE Partitions=gpu
"""


def test_the_stages_that_grade_are_those_that_read_the_grader():
    """A stage's jobs build a grader exactly when they read the ``grader`` config section (its
    params): toy_models, make_teacher, teacher, pilot, reevaluate, and calibrate (a calibration
    run is a vanilla pilot on audit.seeds; it grades every rollout)."""
    reads_grader = {s.name for s in TABLE if s.sections and "grader" in s.sections}
    assert {s.name for s in TABLE if s.grading} == reads_grader
    assert reads_grader == {"toy_models", "make_teacher", "teacher", "pilot", "reevaluate",
                            "calibrate"}
    assert set(GRADING_RULES) == {"toy_model", "make_teacher", "teacher", "pilot", "fold_pilot",
                                  "level_pilot", "reevaluate", "calibrate"}


def test_the_preflight_probes_the_partition_of_the_calibration_runs():
    """calibrate alone on the gpu partition: the bubblewrap probe runs there and names it; the
    extract job (which grades nothing) does not make the cpu partition probed."""
    cluster = parse_cluster(PARTITIONS, NODES, "MinJobAge = 300 sec\n",
                            subprocess.CompletedProcess([], 0, "", ""))
    reqs = [Request(rule="calibrate", threads=4, mem_mb=8000, runtime=60, gpu=1, partition="gpu"),
            Request(rule="extract", threads=4, mem_mb=8000, runtime=60, gpu=0, partition="cpu")]
    assert bwrap_partitions(cluster, reqs) == {"gpu": ["calibrate"]}
    calls = []

    def srun(cmd):
        calls.append(cmd)
        return subprocess.CompletedProcess(cmd, 0, "BWRAP g01 bwrap fails to start here (no "
                                                   "user namespaces)\n", "")

    lines, notes = check_bwrap(cluster, reqs, {"grader": {"isolation": "bwrap"}}, srun)
    assert [c[1] for c in calls] == ["--partition=gpu"] and notes == []
    assert len(lines) == 1 and lines[0].startswith("partition 'gpu' (rule(s) calibrate): the "
                                                   "grader's sandbox does not run on node g01")
