"""The jobs a run of the workflow submits, read from the workflow itself: a Snakemake dry run.

The Slurm preflight (:mod:`evil_moe.cluster.slurm_check`) sizes every rule whose jobs a run of
the config may submit. That set is not written down a second time here: it is the job list of a
dry run (``snakemake -n``, Snakemake's own "Job stats" table) of the repository's workflow with
that config, into an empty results folder (so that every job is planned, whatever a previous run
finished), for the targets :data:`TARGETS`:

- ``all``: what ``snakemake`` (and ``make run``) runs;
- ``sweep_ungated``: the sweep's jobs (``sweep.seeds``, ``sweep.folds``), which the real run adds
  behind the compare checkpoint only when the gate says separated, so a dry run of ``all`` cannot
  see them (``rules/sweep.smk``; the same outputs as the gated ``sweep``);
- ``reeval_compare``: the optional re-evaluation (``docs/running.md``), never part of ``all``.

The rules kept are those the stage table sizes (:data:`evil_moe.cluster.stages.RULE_STAGE`); the
others (``all``, ``sweep_ungated``, ``toy_summary``, ...) are local rules and never submitted.
A dry run costs about 2 CPU-seconds (Snakemake's start and the DAG); each config's plan is kept
for the life of the process.
"""

from __future__ import annotations

import collections
import json
import subprocess
import sys
import tempfile
from functools import lru_cache
from pathlib import Path
from typing import Mapping

import yaml

from evil_moe.cluster.stages import RULE_STAGE

REPO = Path(__file__).resolve().parents[2]
TARGETS: tuple[str, ...] = ("all", "sweep_ungated", "reeval_compare")


class PlanError(RuntimeError):
    """The workflow's dry run failed; the message names the command and Snakemake's error."""


def job_stats(text: str) -> dict[str, int]:
    """Snakemake's "Job stats" table (printed by every run and dry run) as ``{rule: jobs}`` in
    the table's order (the last table when there are several; empty when there is none)."""
    counts: dict[str, int] = {}
    lines = text.splitlines()
    for i, line in enumerate(lines):
        if line.strip() == "Job stats:":
            counts = {}
            for row in lines[i + 3:]:  # the header and its rule of dashes
                parts = row.split()
                if len(parts) != 2 or parts[0] == "total" or not parts[1].isdigit():
                    break
                counts[parts[0]] = int(parts[1])
    return counts


def _error_line(text: str) -> str:
    """The line of Snakemake's output that says what went wrong (``invalid config: ...`` from the
    workflow's checks, else the last line that names an error, else the last line)."""
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    for pattern in ("invalid config", "Error", "error"):
        hits = [ln for ln in lines if pattern in ln]
        if hits:
            return hits[0] if pattern == "invalid config" else hits[-1]
    return lines[-1] if lines else "no output"


def dry_run_jobs(cfg: Mapping, targets: tuple[str, ...] = TARGETS,
                 snakefile: Path = REPO / "Snakefile") -> dict[str, int]:
    """``{rule: jobs}`` of a dry run of ``snakefile`` for ``targets`` with the whole config
    ``cfg`` (a validated config: :func:`evil_moe.checks.load_run_config`), its results folder
    replaced by an empty temporary one. Runs in the repository root, as the workflow does
    (relative paths in the config, such as ``problems.path``, are read from there).

    Raises:
        PlanError: Snakemake failed (the workflow's checks refused the config, a target is
            unknown); names the command and Snakemake's error line.
    """
    key = json.dumps(cfg, sort_keys=True, default=str)
    return dict(_dry_run(key, tuple(targets), str(snakefile)))


@lru_cache(maxsize=64)
def _dry_run(key: str, targets: tuple[str, ...], snakefile: str) -> tuple[tuple[str, int], ...]:
    cfg = json.loads(key)
    with tempfile.TemporaryDirectory(prefix="evil_moe_plan_") as tmp:
        cfg["results"] = str(Path(tmp) / "results")
        overlay = Path(tmp) / "config.yaml"
        overlay.write_text(yaml.safe_dump(cfg, sort_keys=False))
        cmd = [sys.executable, "-m", "snakemake", "--snakefile", snakefile, *targets,
               "--dry-run", "--nolock", "--quiet", "rules", "host", "reason", "--configfile", str(overlay)]
        proc = subprocess.run(cmd, cwd=Path(snakefile).parent, capture_output=True, text=True,
                              timeout=600)
    if proc.returncode != 0:
        raise PlanError(f"a dry run of the workflow failed (snakemake -n {' '.join(targets)}, "
                        f"exit {proc.returncode}): {_error_line(proc.stderr + proc.stdout)}")
    jobs = job_stats(proc.stdout + "\n" + proc.stderr)
    if not jobs:
        raise PlanError("a dry run of the workflow printed no job table (snakemake -n "
                        f"{' '.join(targets)}): {_error_line(proc.stderr + proc.stdout)}")
    return tuple(jobs.items())


def planned_jobs(cfg: Mapping) -> dict[str, int]:
    """``{rule: jobs}`` of every rule a run of ``cfg`` may submit to a cluster (the dry run of
    :data:`TARGETS`, local rules left out), in the order of the stage table
    (:data:`evil_moe.cluster.stages.RULE_STAGE`).

    Raises:
        PlanError: the dry run failed (names Snakemake's error).
    """
    jobs = dry_run_jobs(cfg)
    return {rule: jobs[rule] for rule in RULE_STAGE if rule in jobs}


def planned_rules(cfg: Mapping) -> list[str]:
    """The rules a run of ``cfg`` may submit (:func:`planned_jobs`), in the stage table's order.

    Raises:
        PlanError: the dry run failed (names Snakemake's error).
    """
    return list(planned_jobs(cfg))
