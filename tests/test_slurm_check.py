"""The Slurm preflight (evil_moe/cluster/slurm_check.py, `evil-moe slurm-check`): parsing Slurm's
answers, the planned requests with the profile's precedence, every mismatch on one line; and on
the CI cluster (tests/slurm/start.sh) the shipped profile is caught and the filled one passes."""

from __future__ import annotations

import subprocess

import pytest
import yaml

from evil_moe.config import load_config
from evil_moe.cluster.slurm_check import (check, check_bwrap, load_profile, parse_cluster, parse_minutes,
                                  planned_requests, planned_rules, run_check)
from workflow_util import BIN, REPO, env, fill_edit_values, no_slurm

# A two-partition site, as `scontrol show partition -o` / `scontrol show node -o` print it.
PARTITIONS = """\
PartitionName=cpu AllowGroups=ALL Default=YES MaxNodes=UNLIMITED MaxTime=2-00:00:00 MaxCPUsPerNode=UNLIMITED Nodes=c[01-02] State=UP TotalCPUs=128 DefMemPerNode=UNLIMITED MaxMemPerNode=UNLIMITED
PartitionName=gpu AllowGroups=ALL Default=NO MaxTime=12:00:00 MaxCPUsPerNode=16 Nodes=g01 State=UP TotalCPUs=64 MaxMemPerNode=200000
"""
NODES = """\
NodeName=c01 Arch=x86_64 CPUTot=64 Gres=(null) RealMemory=256000 State=IDLE Partitions=cpu
NodeName=c02 Arch=x86_64 CPUTot=64 Gres=(null) RealMemory=256000 State=IDLE Partitions=cpu
NodeName=g01 Arch=x86_64 CPUTot=64 Gres=gpu:a100:4(S:0-1) RealMemory=512000 State=IDLE Partitions=gpu
"""
NO_SACCT = subprocess.CompletedProcess([], 1, "", "Slurm accounting storage is disabled\n")
SACCT_OK = subprocess.CompletedProcess([], 0, "", "")


def cluster(sacct=SACCT_OK, min_job_age=300):
    return parse_cluster(PARTITIONS, NODES, f"MinJobAge               = {min_job_age} sec\n", sacct)


def cfg_of(*files, sets=()):
    return load_config([REPO / "config" / "config.yaml", *files], list(sets)).raw


def site_profile(**top):
    prof = {"executor": "slurm", "set-resources": {
        **{r: {"slurm_partition": "cpu"} for r in ("problems", "toy_model", "compare",
                                                    "sweep_compare", "fold_compare")},
        **{r: {"slurm_partition": "gpu"} for r in ("make_teacher", "teacher", "extract", "distill", "pilot",
                                                    "fold_pilot")}}}
    prof.update(top)
    return prof


@pytest.mark.parametrize("text, minutes", [
    ("UNLIMITED", None), ("30", 30), ("1:30:00", 90), ("2-00:00:00", 2880), ("1-12", 2160),
    ("10:30", 11), ("0:00:30", 1)])
def test_parse_minutes(text, minutes):
    assert parse_minutes(text) == minutes


def test_parse_cluster():
    c = cluster(NO_SACCT)
    cpu, gpu = c.partitions["cpu"], c.partitions["gpu"]
    assert (cpu.default, cpu.cpus, cpu.mem_mb, cpu.gpus, cpu.max_time) == (True, 64, 256000, 0, 2880)
    assert (gpu.default, gpu.cpus, gpu.gpus, gpu.max_time, gpu.max_mem_mb, gpu.max_cpus) == \
        (False, 64, 4, 720, 200000, 16)
    assert not c.sacct_ok and c.sacct_message == "Slurm accounting storage is disabled"
    assert c.min_job_age == 300


def test_real_pilot_on_a_right_profile_passes():
    cfg = cfg_of(REPO / "config" / "pilot.yaml")
    prof = site_profile()
    reqs = planned_requests(cfg, prof)
    assert {r.rule for r in reqs} == {"problems", "make_teacher", "teacher", "extract", "distill",
                                      "pilot", "compare", "sweep_compare", "fold_pilot",
                                      "fold_compare"}
    pilot = next(r for r in reqs if r.rule == "pilot")
    assert (pilot.partition, pilot.threads, pilot.gpu) == ("gpu", 8, 1)
    assert check(cluster(), reqs, prof, cfg) == []


def test_every_mismatch_on_one_line():
    cfg = cfg_of(REPO / "config" / "pilot.yaml", sets=["pilot.threads=32"])
    prof = site_profile()
    prof["set-resources"]["teacher"] = {"slurm_partition": "cpu"}  # no GPU there
    prof["set-resources"]["make_teacher"] = {"slurm_partition": "cpu"}  # nor for this one
    prof["set-resources"]["extract"] = {"slurm_partition": "gpus"}  # a typo
    prof["set-resources"]["distill"] = {"slurm_partition": "gpu", "mem_mb": "300G",
                                        "runtime": 1000}
    lines = check(cluster(NO_SACCT), planned_requests(cfg, prof), prof, cfg)
    text = "\n".join(lines)
    assert "partition 'gpus' does not exist (this cluster has: cpu*, gpu), asked by rule(s) " \
           "extract" in text
    assert "rule teacher: asks 1 GPU(s) (models.device) but partition 'cpu' has no GPUs" in text
    assert "rule make_teacher: asks 1 GPU(s) (models.device) but partition 'cpu' has no GPUs" in text
    assert "rule pilot: asks 32 CPUs (pilot.threads) but partition 'gpu' gives at most 16" in text
    assert "rule distill: asks 307200 MB memory (set-resources distill mem_mb in the profile) " \
           "but partition 'gpu' gives at most 200000 MB" in text
    assert "rule distill: asks 1000 min (set-resources distill runtime in the profile) but " \
           "partition 'gpu' allows at most 720 min" in text
    assert "slurm-status-command is sacct (EDIT) but sacct does not work here (Slurm accounting " \
           "storage is disabled)" in text
    assert all("\n" not in line for line in lines)
    assert len(lines) == 8, text  # also fold_pilot's 32 CPUs


def test_squeue_needs_min_job_age_and_cpus_per_task_is_refused():
    cfg = cfg_of()
    prof = site_profile(**{"slurm-status-command": "squeue",
                           "slurm-init-seconds-before-status-checks": 40,
                           "default-resources": {"cpus_per_task": 4}})
    reqs = planned_requests(cfg, prof)
    assert {r.threads for r in reqs} == {4}  # the plugin's cpus_per_task beats every rule
    lines = check(cluster(NO_SACCT, min_job_age=60), reqs, prof, cfg)
    assert any("MinJobAge >= 3 x slurm-init-seconds-before-status-checks (120 s), it is 60 s"
               in line for line in lines)
    assert any("default-resources sets cpus_per_task" in line for line in lines)
    prof["slurm-init-seconds-before-status-checks"] = 10
    del prof["default-resources"]
    assert check(cluster(NO_SACCT, min_job_age=60), planned_requests(cfg, prof), prof, cfg) == []


def test_unknown_account():
    from evil_moe.cluster.slurm_check import Cluster

    cfg = cfg_of()
    prof = site_profile()
    prof["set-resources"]["pilot"]["slurm_account"] = "lab_b"
    c = cluster()
    c = Cluster(c.partitions, True, "", 300, accounts=("lab_a",))
    lines = check(c, planned_requests(cfg, prof), prof, cfg)
    assert lines == ["account 'lab_b' is not one of yours (sacctmgr: lab_a), asked by rule(s) "
                     "pilot: set slurm_account in the profile (EDIT)"]


def test_set_threads_and_partition_defaults():
    cfg = cfg_of()
    prof = {"set-threads": {"pilot": 7}}
    reqs = {r.rule: r for r in planned_requests(cfg, prof)}
    assert reqs["pilot"].threads == 7 and reqs["pilot"].source["threads"] == "set-threads pilot"
    assert reqs["teacher"].partition is None  # the cluster's default partition
    assert planned_rules(cfg) == ["problems", "toy_model", "teacher", "extract", "distill",
                                  "pilot", "compare"]
    assert check(cluster(), list(reqs.values()), prof, cfg) == []


def test_run_check_offline_with_the_shipped_profile():
    answers = {"partition": PARTITIONS, "node": NODES, "config": "MinJobAge = 300 sec\n"}

    def fake(cmd):
        if cmd[0] == "sacct":
            return NO_SACCT
        if cmd[0] == "srun":
            return subprocess.CompletedProcess(cmd, 0, "BWRAP c01 ok\n", "")
        return subprocess.CompletedProcess(cmd, 0, answers[cmd[2]], "")

    lines, report = run_check(REPO / "profiles" / "slurm", [], run=fake)
    assert "planned jobs" in report and "toy_model" in report
    assert "grader sandbox (bubblewrap) probed on a node of: cpu, gpu" in report
    # The shipped profile's partitions are named cpu and gpu: only the status command is wrong.
    assert len(lines) == 1 and "slurm-status-command is sacct" in lines[0]


def test_bwrap_probe_per_grading_partition():
    cfg = cfg_of(REPO / "config" / "pilot.yaml")
    prof = site_profile()
    reqs = planned_requests(cfg, prof)
    answers = {"cpu": (0, "BWRAP c01 ok\n", ""),
               "gpu": (0, "BWRAP g01 bwrap fails to start here (bwrap: setting up uid map: "
                          "Permission denied)\n", "")}
    calls = []

    def fake(cmd):
        calls.append(cmd)
        part = cmd[1].split("=", 1)[1]
        return subprocess.CompletedProcess(cmd, *answers[part])

    lines, notes = check_bwrap(cluster(), reqs, cfg, fake)
    # pilot.yaml grades in make_teacher, teacher, pilot, fold_pilot (gpu); no CPU rule grades
    assert [c[1] for c in calls] == ["--partition=gpu"]
    assert all("--immediate=45" in c for c in calls)
    assert lines == ["partition 'gpu' (rule(s) make_teacher, teacher, pilot, fold_pilot): the "
                     "grader's sandbox does not run on node g01: bwrap fails to start here (bwrap: "
                     "setting up uid map: Permission denied): install bubblewrap on its nodes (or "
                     "enable unprivileged user namespaces), send these rules to a partition where "
                     "it runs (slurm_partition, EDIT), or set grader.isolation: rlimit-only (then "
                     "gt_correct is not tamper-proof)"] and notes == []
    # no free node in time: a note, not a mismatch
    answers["gpu"] = (1, "", "srun: error: Unable to allocate resources: Immediate execution "
                             "impossible, insufficient priority\n")
    lines, notes = check_bwrap(cluster(), reqs, cfg, fake)
    assert lines == [] and len(notes) == 1 and notes[0].startswith("partition 'gpu': no node free")
    # the node cannot even run the probe (e.g. the venv is not on a shared filesystem)
    answers["gpu"] = (2, "", "/home/u/evil_moe/.venv/bin/python: No such file or directory\n")
    lines, notes = check_bwrap(cluster(), reqs, cfg, fake)
    assert len(lines) == 1 and "could not run the grader's sandbox probe on a node (srun exit 2: " \
        "/home/u/evil_moe/.venv/bin/python: No such file or directory)" in lines[0]
    # rlimit-only: nothing to probe
    calls.clear()
    rl = cfg_of(REPO / "config" / "pilot.yaml", sets=["grader.isolation=rlimit-only"])
    assert check_bwrap(cluster(), planned_requests(rl, prof), rl, fake) == ([], []) and not calls


# ---- on the CI cluster ------------------------------------------------------------------------
def _cli(profile, *configs):
    cmd = [str(BIN / "evil-moe"), "slurm-check", "--profile", str(profile)]
    for c in configs:
        cmd += ["--configfile", str(c)]
    return subprocess.run(cmd, cwd=REPO, env=env(), capture_output=True, text=True, timeout=120)


@pytest.mark.slurm
def test_preflight_on_the_ci_cluster(tmp_path):
    why = no_slurm()
    if why:
        pytest.skip(why)
    # The shipped profile, unedited: partitions cpu/gpu do not exist, sacct has no accounting.
    proc = _cli(REPO / "profiles" / "slurm")
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, out
    mism = [line for line in proc.stdout.splitlines() if line.startswith("MISMATCH")]
    assert len(mism) == 3, out
    assert any("partition 'cpu' does not exist" in m and "problems, toy_model, compare" in m
               for m in mism)
    assert any("partition 'gpu' does not exist" in m for m in mism)
    assert any("sacct does not work here" in m for m in mism)
    # The EDIT values filled in for this cluster: everything fits.
    right = tmp_path / "right"
    right.mkdir()
    (right / "config.yaml").write_text(fill_edit_values((REPO / "profiles" / "slurm" /
                                                         "config.yaml").read_text()))
    proc = _cli(right)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "slurm-check: OK" in proc.stdout and "MISMATCH" not in proc.stdout
    # A config asking more CPUs than the node has is caught, naming the key.
    big = tmp_path / "big.yaml"
    big.write_text(yaml.safe_dump({"pilot": {"threads": 64}}))
    proc = _cli(right, big)
    assert proc.returncode == 1
    assert "rule pilot: asks 64 CPUs (pilot.threads) but partition" in proc.stdout
    assert load_profile(right / "config.yaml")["slurm-status-command"] == "squeue"
    # A compute node whose bubblewrap cannot start (a failing bwrap first on the jobs' PATH, which
    # srun passes on): one MISMATCH line, from a real srun on the CI node.
    fake = tmp_path / "fakebin"
    fake.mkdir()
    (fake / "bwrap").write_text("#!/bin/sh\necho 'bwrap: No permissions to create new namespace' >&2"
                                "\nexit 1\n")
    (fake / "bwrap").chmod(0o755)
    e = env()
    e["PATH"] = f"{fake}:{e['PATH']}"
    proc = subprocess.run([str(BIN / "evil-moe"), "slurm-check", "--profile", str(right)], cwd=REPO,
                          env=e, capture_output=True, text=True, timeout=120)
    mism = [line for line in proc.stdout.splitlines() if line.startswith("MISMATCH")]
    assert proc.returncode == 1 and len(mism) == 1, proc.stdout + proc.stderr
    assert mism[0].startswith("MISMATCH partition 'debug' (rule(s) toy_model, teacher, pilot): the "
                              "grader's sandbox does not run on node ")
    assert "bwrap fails to start here (bwrap: No permissions to create new namespace)" in mism[0]
