"""The jobs the Slurm preflight sizes (evil_moe/cluster/plan.py) are the jobs the workflow submits:
for every shipped config, the rules `planned_rules` returns equal the non-local rules of the
user's own dry runs (`snakemake -n`, plus the sweep's and the re-evaluation's targets, named here
from the config by hand), with the local rules read from the rule files."""

from __future__ import annotations

import re
import subprocess

import pytest

from evil_moe.cluster.plan import PlanError, dry_run_jobs, job_stats, planned_rules
from workflow_util import REPO, SNAKEMAKE, env, raw_config

SHIPPED = sorted(p.name for p in (REPO / "config").glob("*.yaml") if p.name != "schema.yaml")
# Each dry run costs a few CPU-seconds: the default and the real pilot (sweep, folds, make_teacher)
# in the fast suite, the other configs and overlays in the slow one.
FAST = {"config.yaml", "pilot.yaml"}


def local_rules() -> set[str]:
    """Rules never submitted: those named under ``localrules:`` and those without a command
    (``all``, ``sweep``: Snakemake runs a rule with no shell/run/script in the driver)."""
    local = set()
    for path in [REPO / "Snakefile", *sorted((REPO / "rules").glob("*.smk"))]:
        text = path.read_text()
        for m in re.finditer(r"^localrules:\n((?:[ \t]+\w+,?\n)+)", text, re.M):
            local |= set(re.findall(r"\w+", m.group(1)))
        for m in re.finditer(r"^(?:rule|checkpoint) (\w+):\n(.*?)(?=^\S|\Z)", text, re.S | re.M):
            if not re.search(r"^\s+(shell|run|script|notebook|wrapper):", m.group(2), re.M):
                local.add(m.group(1))
    return local


def test_local_rules_are_read():
    assert local_rules() == {"all", "sweep", "sweep_decision", "sweep_ungated", "toy_summary"}


def users_dry_run(name: str, tmp_path) -> set[str]:
    """Non-local rules of the dry run a user makes of ``config/<name>``: ``all`` (``snakemake
    -n``), the sweep's targets when the config has one (``sweep.seeds``: its comparison;
    ``sweep.folds`` with more than one mode: a fold comparison per mode) and the re-evaluation's
    comparison (docs/running.md)."""
    cfg = raw_config(REPO / "config" / name)
    results = tmp_path / "results"
    targets = ["all", "reeval_compare"]
    if cfg["sweep"]["seeds"]:
        targets.append("sweep_compare")
    modes = ([cfg["problems"]["force_mode"]] if cfg["problems"]["force_mode"]
             else cfg["problems"]["modes"])
    if cfg["sweep"]["folds"] and len(modes) > 1:
        targets += [f"{results}/sweep/folds/{m}/compare/gate.json" for m in modes]
    proc = subprocess.run([SNAKEMAKE, *targets, "-n", "--nolock", "--configfile",
                           f"config/{name}", "--config", f"results={results}"],
                          cwd=REPO, env=env(), capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return set(job_stats(proc.stdout)) - local_rules()


@pytest.mark.parametrize("name", [n if n in FAST else pytest.param(n, marks=pytest.mark.slow)
                                  for n in SHIPPED])
def test_planned_rules_are_the_dry_runs_submitted_rules(name, tmp_path):
    cfg = raw_config(REPO / "config" / name)
    path = cfg["problems"]["path"]
    if cfg["problems"]["source"] == "leetcode" and not (REPO / path).is_file():
        pytest.skip(f"problem file {path} not present next to this checkout")
    rules = planned_rules(cfg)
    assert len(rules) == len(set(rules))
    assert set(rules) == users_dry_run(name, tmp_path)


def test_job_stats_table():
    text = ("Building DAG of jobs...\nJob stats:\njob          count\n---------  -------\n"
            "problems         1\npilot           48\nall              1\ntotal           50\n\n")
    assert job_stats(text) == {"problems": 1, "pilot": 48, "all": 1}
    assert job_stats("Nothing to be done (all requested files are present and up to date).") == {}


def test_a_config_the_workflow_refuses_names_its_error():
    """The dry run's failure is one line with the workflow's own message (naming the key)."""
    cfg = raw_config()
    cfg["problems"]["source"] = "leetcode"
    cfg["problems"]["path"] = "no/such/problems.jsonl"
    with pytest.raises(PlanError, match=r"^a dry run of the workflow failed \(snakemake -n all "
                       r"sweep_ungated reeval_compare, exit 1\): invalid config.*no/such/problems"):
        dry_run_jobs(cfg)
