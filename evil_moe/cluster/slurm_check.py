"""Preflight for ``snakemake --profile slurm``: the planned jobs' requests against a cluster.

``evil-moe slurm-check`` (``make slurm-check``) reads

- the cluster: partitions and their limits (``scontrol show partition``), node sizes
  (``scontrol show node``: CPUs, memory, GPUs), whether ``sacct`` works (it needs Slurm
  accounting) and ``MinJobAge`` (``scontrol show config``);
- the planned jobs: the rules a run of the config submits (a dry run of the workflow,
  :mod:`evil_moe.cluster.plan`: ``all``, the sweep the gate may add, the optional re-evaluation),
  each with the threads, ``mem_mb``,
  ``runtime`` and ``gpu`` the rule declares (:mod:`evil_moe.cluster.resources`, the functions the rules
  call), the profile's ``default-resources`` / ``set-resources`` / ``set-threads`` applied with
  Snakemake's precedence (``set-*`` of a rule > the rule's own > ``default-resources``);

and prints every mismatch on one line: a partition that does not exist, more CPUs, memory or time
than the partition's nodes or limits allow, a GPU asked of a partition without one, a GPU type the
jobs could get whose memory is below ``models.gpu_mem_gb`` or a ``gpu_model`` the partition lacks
(:mod:`evil_moe.cluster.slurm_gpu`; the report lists each partition's GPU types and memory),
``pilot.sampler: vllm`` where vLLM does not import in the jobs' Python, ``sacct``
unavailable with the status command left at ``sacct`` (Snakemake would wait for ever), ``squeue``
with ``MinJobAge`` too short, ``cpus_per_task`` overriding every rule's threads. Each line names
the profile key or config key to change.

Unless ``grader.isolation`` is ``rlimit-only``, it also runs the grader's own sandbox probe
(:func:`evil_moe.env.sandbox.probe_bwrap`: a bubblewrap zygote grading one trivial job) on a
compute node of every partition the grading rules go to (``srun``, one CPU, a few seconds), so
that a node without a working bubblewrap shows here and not as a failed pilot hours later.
"""

from __future__ import annotations

import getpass
import math
import os
import re
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping, Sequence

import yaml

from evil_moe.cluster.plan import PlanError, planned_jobs
from evil_moe.cluster.resources import job_size
from evil_moe.cluster.slurm_gpu import check_gpu_memory, check_vllm, gpu_kinds
from evil_moe.cluster.slurm_runs import Runner, run_command
# Rules submitted to the cluster and the stage whose size they take; the rules whose jobs grade
# completions in the sandbox (evil_moe.stages.common.make_grader): the one table of stages.
from evil_moe.cluster.stages import GRADING_RULES, RULE_STAGE

REPO = Path(__file__).resolve().parents[2]
# Run on a compute node by the bubblewrap check: the grader's own probe, one marker line.
BWRAP_PROBE = ("import socket\nfrom evil_moe.env.sandbox import probe_bwrap\n"
               "cause = probe_bwrap()\n"
               "print('BWRAP', socket.gethostname(), 'ok' if cause is None else cause)\n")


class CheckError(RuntimeError):
    """The preflight cannot run (no Slurm commands, an unreadable profile); names what is
    missing."""


@dataclass(frozen=True)
class Partition:
    """One partition: its largest node (``cpus``, ``mem_mb``, ``gpus``), its limits
    (``max_time`` minutes, ``max_mem_mb`` / ``max_cpus`` per node; None = unlimited) and its
    nodes' GPU types (:func:`evil_moe.cluster.slurm_gpu.gpu_kinds`)."""

    name: str
    default: bool
    state: str
    cpus: int
    mem_mb: int
    gpus: int
    max_time: int | None
    max_mem_mb: int | None
    max_cpus: int | None
    gpu_kinds: tuple = ()


@dataclass(frozen=True)
class Cluster:
    """What the preflight knows of the cluster."""

    partitions: dict[str, Partition]
    sacct_ok: bool
    sacct_message: str
    min_job_age: int | None
    sacct_present: bool = True
    accounts: tuple[str, ...] | None = None  # the user's (sacctmgr), None = unknown


@dataclass(frozen=True)
class Request:
    """One planned job's request (first attempt): ``threads`` CPUs, ``mem_mb`` MiB, ``runtime``
    minutes, ``gpu`` count, ``partition`` (None = the cluster's default), and which key set
    each (``source``); ``need_mem_mb`` and ``need_minutes``, the job-size model's peak memory
    and wall time on an idle node (:mod:`evil_moe.cluster.resources`); ``jobs``, how many jobs
    of the rule the run plans (the dry run's count); the profile's ``gpu_model`` and
    ``constraint`` (the GPU type or node features its GPU jobs ask for)."""

    rule: str
    threads: int
    mem_mb: int
    runtime: int
    gpu: int
    partition: str | None
    source: dict = field(default_factory=dict)
    account: str | None = None
    need_mem_mb: int = 0
    need_minutes: float = 0.0
    jobs: int = 1
    gpu_model: str | None = None
    constraint: str | None = None


def _run(cmd: Sequence[str]) -> subprocess.CompletedProcess:
    return run_command(cmd, CheckError, "run slurm-check on a Slurm login node "
                       "(apt-get install slurm-client for the commands)")


def _fields(line: str) -> dict[str, str]:
    return dict(re.findall(r"(\w+)=(\S*)", line))


def parse_minutes(text: str) -> int | None:
    """Slurm time (``UNLIMITED``, ``MM``, ``MM:SS``, ``HH:MM:SS``, ``D-HH[:MM[:SS]]``) in minutes,
    None when unlimited."""
    text = text.strip()
    if not text or text.upper() in {"UNLIMITED", "INFINITE", "NONE"}:
        return None
    days = 0
    if "-" in text:
        d, text = text.split("-", 1)
        days = int(d)
        parts = [int(x) for x in text.split(":")] + [0, 0]
        h, m, s = parts[:3]
    else:
        parts = [int(x) for x in text.split(":")]
        if len(parts) == 1:
            h, m, s = 0, parts[0], 0
        elif len(parts) == 2:
            h, (m, s) = 0, parts
        else:
            h, m, s = parts[:3]
    return days * 1440 + h * 60 + m + (1 if s else 0)


def _limit(text: str | None) -> int | None:
    if text is None or not text.strip() or text.upper() in {"UNLIMITED", "NONE", "0"}:
        return None
    return int(re.match(r"\d+", text).group())


def _gpus(gres: str) -> int:
    """GPUs in a node's Gres (``gpu:4``, ``gpu:a100:4(S:0-1)``, ``gpu:a100:2,gpu:v100:1``)."""
    total = 0
    for item in gres.split(","):
        parts = re.sub(r"\(.*?\)", "", item).split(":")
        if parts[0] == "gpu" and len(parts) >= 2 and parts[-1].isdigit():
            total += int(parts[-1])
    return total


def parse_cluster(partitions_text: str, nodes_text: str, config_text: str,
                  sacct: subprocess.CompletedProcess) -> Cluster:
    """A :class:`Cluster` from ``scontrol show partition -o``, ``scontrol show node -o``,
    ``scontrol show config`` and a ``sacct`` call's result."""
    nodes = [_fields(line) for line in nodes_text.splitlines() if "NodeName=" in line]
    parts: dict[str, Partition] = {}
    for line in partitions_text.splitlines():
        f = _fields(line)
        if "PartitionName" not in f:
            continue
        name = f["PartitionName"]
        members = [n for n in nodes if name in n.get("Partitions", "").split(",")]
        parts[name] = Partition(
            name=name, default=f.get("Default") == "YES", state=f.get("State", "UP"),
            cpus=max((int(n.get("CPUTot", 0)) for n in members), default=0),
            mem_mb=max((int(n.get("RealMemory", 0)) for n in members), default=0),
            gpus=max((_gpus(n.get("Gres", "")) for n in members), default=0),
            max_time=parse_minutes(f.get("MaxTime", "UNLIMITED")),
            max_mem_mb=_limit(f.get("MaxMemPerNode")), max_cpus=_limit(f.get("MaxCPUsPerNode")),
            gpu_kinds=gpu_kinds(members))
    age = re.search(r"^MinJobAge\s*=\s*(\d+)", config_text, re.M)
    message = (sacct.stderr or sacct.stdout or "").strip().splitlines()
    return Cluster(partitions=parts, sacct_ok=sacct.returncode == 0,
                   sacct_message=message[0] if message else "",
                   min_job_age=int(age.group(1)) if age else None)


def _first_line(proc: subprocess.CompletedProcess) -> str:
    lines = [ln.strip() for ln in (proc.stderr or proc.stdout or "").splitlines() if ln.strip()]
    return lines[0] if lines else f"exit {proc.returncode}, no output"


def unreachable(cmd: Sequence[str], proc: subprocess.CompletedProcess) -> str:
    """The one line for a Slurm client that cannot reach a controller (the first ``scontrol``
    failed: no config found, DNS SRV lookup failed, connection refused, munge down): the command,
    its first stderr line and where to run the check instead."""
    return (f"no Slurm controller is reachable from here: `{' '.join(cmd)}` failed "
            f"({_first_line(proc)}): run slurm-check on the cluster's login node, or start the "
            "local test cluster (tests/slurm/start.sh, as root)")


def read_cluster(run: Runner = _run) -> Cluster:
    """Ask the cluster (``scontrol``, ``sacct``).

    Raises:
        CheckError: ``scontrol`` is missing or the controller does not answer.
    """
    outs = []
    for cmd in (["scontrol", "show", "partition", "-o"], ["scontrol", "show", "node", "-o"],
                ["scontrol", "show", "config"]):
        try:
            proc = run(cmd)
        except subprocess.TimeoutExpired as err:
            proc = subprocess.CompletedProcess(cmd, 124, "", f"no answer within {err.timeout:g} s")
        if proc.returncode != 0:
            raise CheckError(unreachable(cmd, proc) if not outs else
                             f"`{' '.join(cmd)}` failed: {_first_line(proc)}")
        outs.append(proc.stdout)
    try:
        sacct = run(["sacct", "-X", "-n", "-o", "JobID", "-S", "now"])
        present = True
    except CheckError:
        sacct = subprocess.CompletedProcess(["sacct"], 127, "", "sacct not found")
        present = False
    cluster = parse_cluster(*outs, sacct)
    accounts = None
    if cluster.sacct_ok:  # accounting works: the user's associations are known
        try:
            proc = run(["sacctmgr", "-n", "-P", "show", "assoc",
                        f"user={os.environ.get('USER') or getpass.getuser()}", "format=account"])
            if proc.returncode == 0:
                accounts = tuple(sorted({a.strip() for a in proc.stdout.split() if a.strip()}))
        except CheckError:
            pass
    return Cluster(cluster.partitions, cluster.sacct_ok, cluster.sacct_message,
                   cluster.min_job_age, sacct_present=present, accounts=accounts)


def resolve_profile(profile: str | os.PathLike) -> Path:
    """The profile's ``config.yaml``: a file, a folder holding one, or a name Snakemake finds in
    its user config folder (``evil-moe install-profiles``).

    Raises:
        CheckError: none of these exists (names the path).
    """
    from evil_moe.cluster.profiles import snakemake_config_dir

    p = Path(profile)
    for cand in (p, p / "config.yaml", snakemake_config_dir() / str(profile) / "config.yaml"):
        if cand.is_file():
            return cand
    raise CheckError(f"profile not found: {profile} (give a folder with config.yaml, e.g. "
                     "profiles/slurm)")


def load_profile(path: Path) -> dict:
    """The profile's settings (YAML; anchors allowed).

    Raises:
        CheckError: not YAML or not a mapping (names the file).
    """
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as err:
        raise CheckError(f"profile {path} is not valid YAML: {err}") from None
    if not isinstance(data, dict):
        raise CheckError(f"profile {path} is not a YAML mapping")
    return data


def _mem_mb(value) -> int:
    """A mem_mb value from a profile (an int, or a string such as ``"8000"`` / ``"8G"``)."""
    if isinstance(value, (int, float)):
        return int(value)
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([KMGT]?)B?\s*", str(value), re.I)
    if not m:
        raise CheckError(f"cannot read mem_mb {value!r} in the profile")
    scale = {"": 1, "K": 1 / 1024, "M": 1, "G": 1024, "T": 1024 * 1024}[m.group(2).upper()]
    return int(float(m.group(1)) * scale)


def planned_requests(cfg: Mapping, profile: Mapping,
                     jobs: Mapping[str, int] | None = None) -> list[Request]:
    """Each planned rule's request with the profile's overrides applied (first attempt).

    ``jobs``: ``{rule: jobs}`` of the run (default: :func:`evil_moe.cluster.plan.planned_jobs`
    of ``cfg``, a dry run of the workflow).

    Raises:
        evil_moe.cluster.plan.PlanError: the dry run failed.
    """
    default = profile.get("default-resources") or {}
    if isinstance(default, list):  # the command-line form ["key=value", ...]
        default = dict(item.split("=", 1) for item in default)
    per_rule = profile.get("set-resources") or {}
    set_threads = profile.get("set-threads") or {}
    out = []
    jobs = planned_jobs(cfg) if jobs is None else jobs
    for rule, count in jobs.items():
        size = job_size(cfg, RULE_STAGE[rule])
        own = per_rule.get(rule) or {}
        values = {"threads": size.threads, "mem_mb": size.mem_mb, "runtime": size.runtime,
                  "gpu": size.gpu, "slurm_partition": None}
        source = {k: "config" for k in values}
        source["slurm_partition"] = "the cluster's default partition"
        if default.get("slurm_partition"):
            values["slurm_partition"], source["slurm_partition"] = \
                default["slurm_partition"], "default-resources"
        for key in ("mem_mb", "runtime", "gpu", "slurm_partition", "cpus_per_task"):
            if key in own:
                values[key], source[key] = own[key], f"set-resources {rule}"
        if "cpus_per_task" in default and "cpus_per_task" not in own:
            values["cpus_per_task"], source["cpus_per_task"] = default["cpus_per_task"], \
                "default-resources"
        if rule in set_threads:
            values["threads"], source["threads"] = set_threads[rule], f"set-threads {rule}"
        if values.get("cpus_per_task") is not None:
            values["threads"], source["threads"] = values["cpus_per_task"], \
                source["cpus_per_task"] + " cpus_per_task"
        account = own.get("slurm_account", default.get("slurm_account"))
        gpu_model, constraint = (own.get(k, default.get(k)) for k in ("gpu_model", "constraint"))
        out.append(Request(rule=rule, account=str(account) if account else None,
                           gpu_model=str(gpu_model) if gpu_model else None,
                           constraint=str(constraint) if constraint else None,
                           threads=int(values["threads"]),
                           mem_mb=_mem_mb(values["mem_mb"]), runtime=int(values["runtime"]),
                           gpu=int(values["gpu"] or 0),
                           partition=str(values["slurm_partition"]) if values["slurm_partition"]
                           else None, source=source, need_mem_mb=size.mem_mb,
                           need_minutes=size.seconds / 60, jobs=int(count)))
    return out


def sized_for_cluster(cfg: Mapping, profile: Mapping, cluster: Cluster) -> tuple[dict, list[str]]:
    """The config the jobs are sized with on this cluster, and any line it adds: with
    ``models.device: auto`` the model rules ask for a GPU when a partition they go to (the
    profile's ``slurm_partition`` for them, else ``default-resources``', else the cluster's
    default) has one (the same decision as the workflow's, :func:`evil_moe.cluster.resources.gpu_for_auto`);
    a pilot that would not fit that GPU gives a line naming the key."""
    from evil_moe.cluster.stages import MODEL_STAGES
    from evil_moe.cluster.shapes import ResourceError
    from evil_moe.cluster.gpu_memory import check_gpu_fit
    from evil_moe.cluster.resources import resolve_auto_device

    if str(cfg["models"]["device"]) != "auto":
        return dict(cfg), []
    per_rule = profile.get("set-resources") or {}
    default = profile.get("default-resources") or {}
    if isinstance(default, list):
        default = dict(item.split("=", 1) for item in default)
    names = {str((per_rule.get(rule) or {})["slurm_partition"]) for rule, stage in RULE_STAGE.items()
             if stage in MODEL_STAGES and "slurm_partition" in (per_rule.get(rule) or {})}
    if not names:
        fallback = default.get("slurm_partition") or next(
            (p.name for p in cluster.partitions.values() if p.default), None)
        names = {str(fallback)} if fallback else set()
    gpu = any(cluster.partitions[n].gpus > 0 for n in names if n in cluster.partitions)
    sized = resolve_auto_device(cfg, gpu)
    if not gpu:
        return sized, []
    try:
        check_gpu_fit(sized)
    except ResourceError as err:
        return sized, [f"models.device auto: the model rules' partition(s) {', '.join(sorted(names))}"
                       f" have GPUs, so the jobs ask for one, but {err}"]
    return sized, []


def _why(req: Request, key: str, config_key: str) -> str:
    src = req.source.get(key, "config")
    return config_key if src == "config" else f"{src} {key} in the profile"


def check(cluster: Cluster, requests: Sequence[Request], profile: Mapping,
          cfg: Mapping) -> list[str]:
    """Every mismatch between the planned requests / profile and the cluster, one line each
    (empty when the run fits)."""
    from evil_moe.cluster.stages import THREAD_KEYS

    lines = []
    names = ", ".join(p.name + ("*" if p.default else "") for p in cluster.partitions.values())
    default_part = next((p.name for p in cluster.partitions.values() if p.default), None)
    default = profile.get("default-resources") or {}
    if isinstance(default, Mapping) and "cpus_per_task" in default:
        lines.append("profile: default-resources sets cpus_per_task, which overrides every rule's "
                     "threads (the config's *.threads): remove it")
    missing: dict[tuple, list[str]] = {}
    gpu_rules: dict[tuple, list[str]] = {}  # (partition, gpu_model, constraint) -> GPU rules
    for req in requests:
        name = req.partition or default_part
        part = cluster.partitions.get(name) if name else None
        where = f"rule {req.rule}"
        if part is None:
            key = (name, req.source["slurm_partition"].split(" ")[0])
            missing.setdefault(key, []).append(req.rule)
            continue
        if part.state.upper() not in {"UP"}:
            lines.append(f"{where}: partition '{name}' is {part.state}, not UP (sinfo)")
        section = THREAD_KEYS.get(RULE_STAGE[req.rule])
        threads_key = f"{section}.threads" if section else "threads"
        cpu_cap = min(c for c in (part.cpus, part.max_cpus) if c) if part.cpus else part.max_cpus
        if cpu_cap and req.threads > cpu_cap:
            lines.append(f"{where}: asks {req.threads} CPUs ({_why(req, 'threads', threads_key)}) "
                         f"but partition '{name}' gives at most {cpu_cap} per node")
        mem_cap = min(m for m in (part.mem_mb, part.max_mem_mb) if m) if part.mem_mb \
            else part.max_mem_mb
        if mem_cap and req.mem_mb > mem_cap:
            lines.append(f"{where}: asks {req.mem_mb} MB memory "
                         f"({_why(req, 'mem_mb', 'estimated from the config: evil_moe/cluster/resources.py')})"
                         f" but partition '{name}' gives at most {mem_cap} MB per node")
        if req.gpu and req.gpu > part.gpus:
            lines.append(f"{where}: asks {req.gpu} GPU(s) ({_why(req, 'gpu', 'models.device')}) "
                         f"but partition '{name}' has " + (f"{part.gpus} per node" if part.gpus
                                                           else "no GPUs")
                         + "; set a GPU partition (EDIT) in the profile")
        lines += _overrides_below_the_model(req, where)
        if req.gpu and part.gpus:
            gpu_rules.setdefault((name, req.gpu_model, req.constraint), []).append(req.rule)
        if part.max_time is not None and req.runtime > part.max_time:
            lines.append(f"{where}: asks {req.runtime} min "
                         f"({_why(req, 'runtime', 'estimated from the config')}) but partition "
                         f"'{name}' allows at most {part.max_time} min")
    for (name, model, constraint), rules in gpu_rules.items():
        lines += check_gpu_memory(name, cluster.partitions[name].gpu_kinds, rules, cfg, model,
                                  constraint)
    if cluster.accounts is not None:
        bad: dict[str, list[str]] = {}
        for req in requests:
            if req.account and req.account not in cluster.accounts:
                bad.setdefault(req.account, []).append(req.rule)
        for account, rules in bad.items():
            lines.append(f"account '{account}' is not one of yours (sacctmgr: "
                         f"{', '.join(cluster.accounts) or 'none'}), asked by rule(s) "
                         f"{', '.join(rules)}: set slurm_account in the profile (EDIT)")
    for (name, where), rules in missing.items():
        lines.insert(0, f"partition '{name}' does not exist (this cluster has: {names or 'none'}),"
                        f" asked by rule(s) {', '.join(rules)}: set slurm_partition in the "
                        f"profile's {where} (EDIT)")
    # unset: the plugin uses sacct when the command exists, else squeue
    status = str(profile.get("slurm-status-command")
                 or ("sacct" if cluster.sacct_present else "squeue"))
    if status == "sacct" and not cluster.sacct_ok:
        lines.append(f"profile: slurm-status-command is sacct (EDIT) but sacct does not work here "
                     f"({cluster.sacct_message or 'it failed'}): set slurm-status-command: squeue,"
                     " or Snakemake never sees a job end and waits for ever")
    if status == "squeue":
        init = int(profile.get("slurm-init-seconds-before-status-checks", 40))
        if cluster.min_job_age is not None and cluster.min_job_age < 3 * init:
            lines.append(f"profile: slurm-status-command squeue needs Slurm's MinJobAge >= 3 x "
                         f"slurm-init-seconds-before-status-checks ({3 * init} s), it is "
                         f"{cluster.min_job_age} s: lower the init seconds (EDIT) or ask your "
                         "admins to raise MinJobAge")
    return lines


def _overrides_below_the_model(req: Request, where: str) -> list[str]:
    """A profile override (``set-resources``) of memory or time below what the job-size model
    expects: the job would be killed."""
    lines = []
    if req.source.get("mem_mb", "config") != "config" and req.mem_mb < req.need_mem_mb:
        lines.append(f"{where}: asks {req.mem_mb} MB memory ({_why(req, 'mem_mb', '')}) but "
                     f"the job-size model expects a peak of {req.need_mem_mb} MB "
                     "(docs/job-sizes.md): the job would be killed for memory; raise or "
                     "remove the override")
    if req.source.get("runtime", "config") != "config" and req.runtime < req.need_minutes:
        lines.append(f"{where}: asks {req.runtime} min ({_why(req, 'runtime', '')}) but the "
                     f"job-size model expects {math.ceil(req.need_minutes)} min on an idle "
                     "node (docs/job-sizes.md): the job would be killed for time; raise or "
                     "remove the override")
    return lines


def bwrap_partitions(cluster: Cluster, requests: Sequence[Request]) -> dict[str, list[str]]:
    """Existing partition → the grading rules that go there (a missing partition is reported by
    :func:`check` already)."""
    default_part = next((p.name for p in cluster.partitions.values() if p.default), None)
    out: dict[str, list[str]] = {}
    for req in requests:
        name = req.partition or default_part
        if req.rule in GRADING_RULES and name in cluster.partitions:
            out.setdefault(name, []).append(req.rule)
    return out


def check_bwrap(cluster: Cluster, requests: Sequence[Request], cfg: Mapping,
                run: Runner = _run, wait_s: int = 45) -> tuple[list[str], list[str]]:
    """``(mismatches, notes)``: the grader's sandbox probe run with ``srun`` on one node of each
    partition the grading rules use (:data:`GRADING_RULES`); nothing when ``grader.isolation``
    is ``rlimit-only``. A partition where no node is free within ``wait_s`` seconds
    (``srun --immediate``) gives a note, not a mismatch."""
    if cfg["grader"]["isolation"] == "rlimit-only":
        return [], []
    lines, notes = [], []
    for name, rules in bwrap_partitions(cluster, requests).items():
        cmd = ["srun", f"--partition={name}", "--nodes=1", "--ntasks=1", "--cpus-per-task=1",
               "--mem=2000", "--time=5", f"--immediate={wait_s}", "--job-name=evil-moe-bwrap-check",
               sys.executable, "-c", BWRAP_PROBE]
        try:
            proc = run(cmd)
        except subprocess.TimeoutExpired:
            proc = subprocess.CompletedProcess(cmd, 124, "", "srun timed out")
        marker = next((line.split(" ", 2) for line in proc.stdout.splitlines()
                       if line.startswith("BWRAP ")), None)
        who = f"rule(s) {', '.join(rules)}"
        fix = ("install bubblewrap on its nodes (or enable unprivileged user namespaces), send "
               "these rules to a partition where it runs (slurm_partition, EDIT), or set "
               "grader.isolation: rlimit-only (then gt_correct is not tamper-proof)")
        if marker and len(marker) == 3 and marker[2] == "ok":
            continue
        if marker and len(marker) == 3:
            lines.append(f"partition '{name}' ({who}): the grader's sandbox does not run on node "
                         f"{marker[1]}: {marker[2]}: {fix}")
            continue
        err = " ".join((proc.stderr or proc.stdout or "no output").split())[:300]
        if re.search(r"Unable to allocate|Immediate execution impossible|timed out|"
                     r"has been revoked", err):
            notes.append(f"partition '{name}': no node free within {wait_s} s to check the "
                         f"grader's sandbox there (srun: {err}); a node without bubblewrap makes "
                         f"{who} fail when they start")
            continue
        lines.append(f"partition '{name}' ({who}): could not run the grader's sandbox probe on a "
                     f"node (srun exit {proc.returncode}: {err}): the jobs run the same Python "
                     f"({sys.executable}) there; {fix}")
    return lines, notes


def table(requests: Sequence[Request], default_partition: str | None) -> str:
    """The planned requests as an aligned text table."""
    rows = [("rule", "jobs", "partition", "cpus", "mem_mb", "runtime_min", "gpus")]
    for r in requests:
        rows.append((r.rule, str(r.jobs), r.partition or f"{default_partition} (default)",
                     str(r.threads), str(r.mem_mb), str(r.runtime), str(r.gpu)))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return "\n".join("  " + "  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip()
                     for row in rows)


def run_check(profile: str | os.PathLike, configfiles: Sequence[str | os.PathLike] = (),
              run: Runner = _run, node_checks: bool = True) -> tuple[list[str], str]:
    """The whole preflight: (mismatch lines, a report of what was compared).

    ``node_checks``: also run the grader's sandbox probe on a compute node of each grading
    partition (:func:`check_bwrap`, ``srun``); its notes end the report.

    ``configfiles`` merge on top of ``config/config.yaml`` (as ``snakemake --configfile``
    does); relative paths are taken from the current folder.

    Raises:
        CheckError: no Slurm commands / controller, an unreadable profile, or the workflow's
            dry run failed (names Snakemake's error).
        evil_moe.config.ConfigError: a bad config (names the key).
        evil_moe.cluster.shapes.ResourceError: the config cannot be sized (names models.params).
    """
    from evil_moe.checks import load_run_config

    path = resolve_profile(profile)
    prof = load_profile(path)
    cfg = load_run_config([REPO / "config" / "config.yaml", *configfiles]).raw
    cluster = read_cluster(run)
    try:  # the jobs of the config as given (models.device does not change which rules run)
        jobs = planned_jobs(cfg)
    except PlanError as err:
        raise CheckError(str(err)) from None
    cfg, gpu_lines = sized_for_cluster(cfg, prof, cluster)
    requests = planned_requests(cfg, prof, jobs)
    default_part = next((p.name for p in cluster.partitions.values() if p.default), None)
    parts = "; ".join(
        f"{p.name}{'*' if p.default else ''} ({p.state}, nodes up to {p.cpus} CPUs, "
        f"{p.mem_mb} MB, {p.gpus} GPUs, time {p.max_time or 'unlimited'})"
        for p in cluster.partitions.values())
    report = "\n".join([
        f"profile {path}; config {', '.join(map(str, configfiles)) or 'config/config.yaml'}",
        f"cluster partitions: {parts or 'none'}",
        f"sacct: {'works' if cluster.sacct_ok else 'does not work (' + cluster.sacct_message + ')'}"
        f"; MinJobAge {cluster.min_job_age} s; status command "
        f"{prof.get('slurm-status-command') or 'sacct (the plugin default)'}",
        "planned jobs (a dry run of `all`, the sweep the gate may add and the optional "
        "re-evaluation; first attempt: a retry asks attempt x mem_mb and runtime):",
        table(requests, default_part),
    ])
    gpus = "; ".join(f"{p.name}: " + ", ".join(k.describe() for k in p.gpu_kinds)
                     for p in cluster.partitions.values() if p.gpu_kinds)
    report += f"\nGPUs (GRES types and node features): {gpus or 'none'}"
    lines = gpu_lines + check(cluster, requests, prof, cfg)
    lines += check_vllm(cfg, [r.rule for r in requests if RULE_STAGE[r.rule] in ("pilot", "reevaluate")])
    if node_checks:
        sandbox, notes = check_bwrap(cluster, requests, cfg, run)
        lines += sandbox
        parts_checked = ", ".join(bwrap_partitions(cluster, requests))
        if cfg["grader"]["isolation"] == "rlimit-only":
            report += "\ngrader sandbox: not checked (grader.isolation is rlimit-only)"
        elif parts_checked:
            report += (f"\ngrader sandbox (bubblewrap) probed on a node of: {parts_checked}"
                       + "".join(f"\nNOTE {n}" for n in notes))
    return lines, report
