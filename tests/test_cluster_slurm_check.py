"""The Slurm preflight (evil_moe/cluster/slurm_check.py, `evil-moe slurm-check`): parsing Slurm's
answers, the planned requests with the profile's precedence, every mismatch on one line. On the CI
cluster (tests/slurm/start.sh), where the shipped profile is caught and the filled one passes:
tests/test_workflow_slurm.py, first, while the node is idle (the Slurm workflow there fills it)."""

from __future__ import annotations

import subprocess

import pytest
import yaml

from evil_moe.cluster.slurm_check import (CheckError, check, check_bwrap, parse_cluster, parse_minutes,
                                          planned_requests, read_cluster, run_check)
from evil_moe.cluster.plan import planned_jobs
from workflow_util import REPO, raw_config

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


def site_profile(**top):
    prof = {"executor": "slurm", "set-resources": {
        **{r: {"slurm_partition": "cpu"} for r in ("problems", "toy_model", "compare",
                                                    "sweep_compare", "fold_compare", "audit",
                                                    "reeval_compare")},
        **{r: {"slurm_partition": "gpu"} for r in ("make_teacher", "teacher", "extract", "distill", "pilot",
                                                    "fold_pilot", "calibrate", "reevaluate")}}}
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
    cfg = raw_config(REPO / "config" / "pilot.yaml")
    prof = site_profile()
    reqs = planned_requests(cfg, prof)
    # the run with its calibration runs and detector audit, the sweep behind the gate and the
    # optional re-evaluation (job counts: test_planned_jobs_of_the_real_pilot)
    assert {r.rule for r in reqs} == {"problems", "make_teacher", "teacher", "extract", "distill",
                                      "pilot", "compare", "sweep_compare", "fold_pilot",
                                      "fold_compare", "calibrate", "audit", "reevaluate",
                                      "reeval_compare"}
    pilot = next(r for r in reqs if r.rule == "pilot")
    assert (pilot.partition, pilot.threads, pilot.gpu) == ("gpu", 8, 1)
    assert check(cluster(), reqs, prof, cfg) == []


def test_planned_jobs_of_the_real_pilot():
    """config/pilot.yaml's jobs, worked out from the config: 21 arms x 3 seeds = 63 pilots, and
    with the sweep's 5 extra seeds 21 x 8 = 168; 4 loophole modes -> 4 leave-one-mode-out folds,
    each 21 x 3 fold pilots (252), its own v_hack (extract: main + 4) and comparison; 2
    calibration runs (audit.seeds) and one detector audit; the re-evaluation of the 63 pilots."""
    cfg = raw_config(REPO / "config" / "pilot.yaml")
    assert (len(cfg["pilot"]["arms"]), len(cfg["pilot"]["seeds"]), len(cfg["sweep"]["seeds"]),
            len(cfg["problems"]["modes"]), len(cfg["audit"]["seeds"])) == (21, 3, 5, 4, 2)
    assert planned_jobs(cfg) == {
        "problems": 1, "make_teacher": 1, "teacher": 1, "extract": 5, "distill": 1, "pilot": 168,
        "fold_pilot": 252, "reevaluate": 63, "compare": 1, "sweep_compare": 1, "fold_compare": 4,
        "reeval_compare": 1, "calibrate": 2, "audit": 1}


def test_every_mismatch_on_one_line():
    cfg = raw_config(REPO / "config" / "pilot.yaml", sets=["pilot.threads=32"])
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
    # also fold_pilot's, reevaluate's and calibrate's 32 CPUs: they too take pilot.threads
    assert len(lines) == 10, text


def test_squeue_needs_min_job_age_and_cpus_per_task_is_refused():
    cfg = raw_config()
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

    cfg = raw_config()
    prof = site_profile()
    prof["set-resources"]["pilot"]["slurm_account"] = "lab_b"
    c = cluster()
    c = Cluster(c.partitions, True, "", 300, accounts=("lab_a",))
    lines = check(c, planned_requests(cfg, prof), prof, cfg)
    assert lines == ["account 'lab_b' is not one of yours (sacctmgr: lab_a), asked by rule(s) "
                     "pilot: set slurm_account in the profile (EDIT)"]


def test_set_threads_and_partition_defaults():
    cfg = raw_config()
    prof = {"set-threads": {"pilot": 7}}
    reqs = {r.rule: r for r in planned_requests(cfg, prof)}
    assert reqs["pilot"].threads == 7 and reqs["pilot"].source["threads"] == "set-threads pilot"
    assert reqs["teacher"].partition is None  # the cluster's default partition
    # the embedded default: 9 arms x 6 seeds, no sweep; 2 calibration runs, the audit
    assert planned_jobs(cfg) == {"problems": 1, "toy_model": 2, "teacher": 1, "extract": 1,
                                 "distill": 1, "pilot": 54, "reevaluate": 54, "compare": 1,
                                 "reeval_compare": 1, "calibrate": 2, "audit": 1}
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
    assert "GPUs (GRES types and node features): gpu: a100 (40 or 80 GB) on 1 node(s)" in report
    # The shipped profile's partitions are named cpu and gpu: only the status command is wrong.
    assert len(lines) == 1 and "slurm-status-command is sacct" in lines[0]


def test_bwrap_probe_per_grading_partition():
    cfg = raw_config(REPO / "config" / "pilot.yaml")
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
    # pilot.yaml grades in make_teacher, teacher, pilot, fold_pilot, reevaluate, calibrate
    # (gpu); no CPU rule grades
    assert [c[1] for c in calls] == ["--partition=gpu"]
    assert all("--immediate=45" in c for c in calls)
    assert lines == ["partition 'gpu' (rule(s) make_teacher, teacher, pilot, fold_pilot, "
                     "reevaluate, calibrate): the "
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
    rl = raw_config(REPO / "config" / "pilot.yaml", sets=["grader.isolation=rlimit-only"])
    assert check_bwrap(cluster(), planned_requests(rl, prof), rl, fake) == ([], []) and not calls


def test_an_override_below_the_job_size_model_is_refused():
    """A profile's set-resources below what the job-size model says the job needs (its peak
    memory; its wall time on an idle node) would be killed: one line each, naming the override."""
    import math

    from evil_moe.cluster.resources import job_size

    cfg = raw_config(REPO / "config" / "pilot.yaml")
    need = job_size(cfg, "extract")
    prof = site_profile()
    prof["set-resources"]["extract"] = {"slurm_partition": "gpu", "mem_mb": need.mem_mb - 1000,
                                        "runtime": 1}
    lines = check(cluster(), planned_requests(cfg, prof), prof, cfg)
    minutes = math.ceil(need.seconds / 60)
    assert lines == [
        f"rule extract: asks {need.mem_mb - 1000} MB memory (set-resources extract mem_mb in the "
        f"profile) but the job-size model expects a peak of {need.mem_mb} MB (docs/job-sizes.md): "
        "the job would be killed for memory; raise or remove the override",
        f"rule extract: asks 1 min (set-resources extract runtime in the profile) but the job-size "
        f"model expects {minutes} min on an idle node (docs/job-sizes.md): the job would be killed "
        "for time; raise or remove the override"], lines
    # at the model's own figures the overrides pass
    prof["set-resources"]["extract"].update(mem_mb=need.mem_mb, runtime=minutes)
    assert check(cluster(), planned_requests(cfg, prof), prof, cfg) == []


def test_auto_device_asks_a_gpu_where_the_model_rules_find_one():
    """models.device auto (the toy default): the model rules ask for a GPU when the partition
    they go to has one, and none when it has none (the same decision as the workflow's)."""
    from evil_moe.cluster.slurm_check import sized_for_cluster

    cfg = raw_config()
    model_rules = ("make_teacher", "teacher", "extract", "distill", "pilot", "fold_pilot",
                   "calibrate", "reevaluate")
    sized, lines = sized_for_cluster(cfg, site_profile(), cluster())
    assert sized["models"]["device"] == "cuda" and lines == []
    reqs = {r.rule: r for r in planned_requests(sized, site_profile())}
    assert [reqs[r].gpu for r in ("teacher", "extract", "distill", "pilot")] == [1, 1, 1, 1]
    assert reqs["problems"].gpu == reqs["compare"].gpu == 0
    assert check(cluster(), list(reqs.values()), site_profile(), sized) == []
    cpu_site = site_profile()
    for rule in model_rules:
        cpu_site["set-resources"][rule] = {"slurm_partition": "cpu"}
    sized, _ = sized_for_cluster(cfg, cpu_site, cluster())
    assert sized["models"]["device"] == "cpu"
    assert all(r.gpu == 0 for r in planned_requests(sized, cpu_site))
    # no partition named: the cluster's default one (cpu) decides
    assert sized_for_cluster(cfg, {"executor": "slurm"}, cluster())[0]["models"]["device"] == "cpu"
    # a device named in the config is never changed
    cpu_cfg = raw_config(sets=["models.device=cpu"])
    assert sized_for_cluster(cpu_cfg, site_profile(), cluster())[0]["models"]["device"] == "cpu"


# What Debian's scontrol prints with no slurm.conf and no DNS SRV record (measured here).
NO_CONTROLLER = ("scontrol: error: resolve_ctls_from_dns_srv: res_nsearch error: Unknown host\n"
                 "scontrol: error: fetch_config: DNS SRV lookup failed\n"
                 "scontrol: error: _establish_config_source: failed to fetch config\n"
                 "scontrol: fatal: Could not establish a configuration source\n")


def test_no_reachable_controller_is_one_clear_line(tmp_path, monkeypatch):
    """Slurm's clients installed but no controller answers (a laptop, CI without the test
    cluster): `evil-moe slurm-check` exits non-zero with one line naming the failed command, its
    first stderr line and where to run it, not scontrol's raw error."""
    from click.testing import CliRunner

    from evil_moe.cli import main

    for name in ("scontrol", "sinfo", "sacct", "srun"):
        exe = tmp_path / name
        exe.write_text(f"#!/bin/sh\nprintf '%s' '{NO_CONTROLLER}' >&2\nexit 1\n")
        exe.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:{__import__('os').environ['PATH']}")
    res = CliRunner().invoke(main, ["slurm-check", "--profile", str(REPO / "profiles" / "slurm")])
    assert res.exit_code == 1, res.output
    out = res.output.strip()
    assert out == ("Error: no Slurm controller is reachable from here: `scontrol show partition -o` "
                   "failed (scontrol: error: resolve_ctls_from_dns_srv: res_nsearch error: Unknown "
                   "host): run slurm-check on the cluster's login node, or start the local test "
                   "cluster (tests/slurm/start.sh, as root)"), out


def test_a_controller_that_does_not_answer_in_time_is_the_same_line():
    def slow(cmd):
        raise subprocess.TimeoutExpired(cmd, 60)

    with pytest.raises(CheckError, match=r"^no Slurm controller is reachable from here: `scontrol "
                       r"show partition -o` failed \(no answer within 60 s\): run slurm-check"):
        read_cluster(slow)
    # a later command failing (the controller answered the first) keeps its own message
    answers = iter([subprocess.CompletedProcess([], 0, PARTITIONS, ""),
                    subprocess.CompletedProcess([], 1, "", "scontrol: error: Access denied\nmore\n")])
    with pytest.raises(CheckError, match=r"^`scontrol show node -o` failed: scontrol: error: "
                       r"Access denied$"):
        read_cluster(lambda cmd: next(answers))


MIXED_NODES = NODES + (
    "NodeName=g02 Arch=x86_64 CPUTot=64 Gres=gpu:h100:8(S:0-1) AvailableFeatures=h100,nvlink "
    "RealMemory=512000 State=IDLE Partitions=gpu\n"
    "NodeName=g03 Arch=x86_64 CPUTot=32 Gres=gpu:a10:2 AvailableFeatures=a10 RealMemory=256000 "
    "State=IDLE Partitions=gpu\n"
    "NodeName=g04 Arch=x86_64 CPUTot=32 Gres=gpu:a100_80gb:4 AvailableFeatures=(null) "
    "RealMemory=256000 State=IDLE Partitions=gpu\n")


def test_gpu_types_and_their_memory_from_what_slurm_shows():
    """Each partition's GPU types with the memory Slurm shows: a size in the type or a feature
    (a100_80gb), a known type (h100 80 GB, a10 24 GB; a100 40 or 80 GB), or unknown."""
    from evil_moe.cluster.slurm_gpu import memory_gb

    gpu = parse_cluster(PARTITIONS, MIXED_NODES, "", SACCT_OK).partitions["gpu"]
    assert [k.describe() for k in gpu.gpu_kinds] == [
        "a10 (24 GB) on 1 node(s)", "a100 (40 or 80 GB) on 1 node(s)",
        "a100_80gb (80 GB) on 1 node(s)", "h100 (80 GB) on 1 node(s)"]
    assert memory_gb("exotic") is None and memory_gb("", "gpu80gb") == (80, 80)
    assert parse_cluster(PARTITIONS, MIXED_NODES, "", SACCT_OK).partitions["cpu"].gpu_kinds == ()


def test_a_mixed_gpu_partition_needs_a_gpu_type_or_constraint():
    """A pilot planned for 80 GB (config/pilot.yaml) sent to a partition with 24 GB a10s among
    its H100s could get one: a mismatch naming the type, its memory and the profile keys; the
    profile's gpu_model h100 (or constraint h100) narrows the jobs to the H100s; a gpu_model the
    partition lacks is named with the partition's types."""
    c = parse_cluster(PARTITIONS, MIXED_NODES, "", SACCT_OK)
    cfg = raw_config(REPO / "config" / "pilot.yaml")
    prof = site_profile()
    lines = check(c, planned_requests(cfg, prof), prof, cfg)
    assert len(lines) == 1 and lines[0].startswith(
        "partition 'gpu' (rule(s) make_teacher, teacher, extract, distill, pilot, fold_pilot, "
        "reevaluate, calibrate): a job can get a10 (24 GB) on 1 node(s), less than "
        "models.gpu_mem_gb 80 GB") and "gpu_model (EDIT" in lines[0], lines
    for key, value in (("gpu_model", "h100"), ("constraint", "h100|nvlink")):
        narrowed = site_profile()
        for rule in ("make_teacher", "teacher", "extract", "distill", "pilot", "fold_pilot",
                     "reevaluate", "calibrate"):
            narrowed["set-resources"][rule][key] = value
        assert check(c, planned_requests(cfg, narrowed), narrowed, cfg) == []
    narrowed["set-resources"]["pilot"] = {"slurm_partition": "gpu", "gpu_model": "a40"}
    lines = check(c, planned_requests(cfg, narrowed), narrowed, cfg)
    assert lines == ["partition 'gpu' (rule(s) pilot): the profile's gpu_model 'a40' is not a GPU "
                     "type there (its types: a10, a100, a100_80gb, h100; sinfo -o \"%P %G\"): set "
                     "gpu_model (EDIT) to one of them"]
    # the toy default asks no GPU: nothing to check
    assert check(c, planned_requests(raw_config(), prof), prof, raw_config()) == []


def test_a_vllm_run_is_refused_where_vllm_does_not_import_in_the_jobs_python():
    """pilot.sampler vllm and a Python where `import vllm` fails: one mismatch naming that
    Python, the import error and `make gpu-env`; nothing when it imports, nothing for the HF
    sampler (no probe run) or a run without pilots."""
    from evil_moe.cluster.slurm_gpu import check_vllm

    calls = []

    def probe(rc, err=""):
        def run(cmd, **kw):
            calls.append(cmd)
            return subprocess.CompletedProcess(cmd, rc, "", err)
        return run

    cfg = raw_config(REPO / "config" / "pilot.yaml")
    lines = check_vllm(cfg, ["pilot", "calibrate"], "/site/.venv/bin/python",
                       probe(1, "Traceback ...\nModuleNotFoundError: No module named 'vllm'\n"))
    assert lines == ["pilot.sampler is vllm but vLLM does not import in the jobs' Python "
                     "(/site/.venv/bin/python: ModuleNotFoundError: No module named 'vllm'), so "
                     "rule(s) pilot, calibrate would stop at their start: build the GPU "
                     "environment with `make gpu-env` and run slurm-check and snakemake from it "
                     "(source .venv-gpu/bin/activate; docs/gpu.md), or set pilot.sampler: hf"]
    assert calls == [["/site/.venv/bin/python", "-c", "import vllm"]]
    assert check_vllm(cfg, ["pilot"], "p", probe(0)) == []
    hf = raw_config(REPO / "config" / "pilot.yaml", sets=["pilot.sampler=hf"])
    assert check_vllm(hf, ["pilot"], "p", probe(1)) == [] and check_vllm(cfg, [], "p", probe(1)) == []
    assert len(calls) == 2
