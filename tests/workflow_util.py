"""Helpers shared by the workflow tests (tests/test_workflow_*.py): run Snakemake on the repo's
Snakefile in a temporary working directory, so test outputs never touch the repo's results/."""

from __future__ import annotations

import collections
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
SNAKEMAKE = str(BIN / "snakemake")
DEFAULT_CONFIG = REPO / "config" / "config.yaml"
CI_CONFIG = REPO / "tests" / "config" / "ci.yaml"
SLURM_STATE = Path(os.environ.get("EVIL_MOE_SLURM_DIR", "/tmp/evil_moe_slurm"))


def env(**extra: str) -> dict:
    """The test environment: the venv's bin first on PATH (evil-moe, snakemake), SLURM_CONF of the
    test cluster when tests/slurm/start.sh wrote one and none is set."""
    e = dict(os.environ)
    e["PATH"] = f"{BIN}{os.pathsep}{e.get('PATH', '')}"
    conf = SLURM_STATE / "etc" / "slurm.conf"
    if "SLURM_CONF" not in e and conf.is_file():
        e["SLURM_CONF"] = str(conf)
    e.update(extra)
    return e


def snakemake(workdir: Path, *args: str, configfiles=(DEFAULT_CONFIG, CI_CONFIG), timeout=900,
              check=False, extra_env: dict | None = None) -> subprocess.CompletedProcess:
    """Run the repo's workflow in ``workdir`` (outputs under workdir/results); ``extra_env`` is
    added to the environment."""
    cmd = [SNAKEMAKE, "--snakefile", str(REPO / "Snakefile"), "--directory", str(workdir)]
    if configfiles:
        cmd += ["--configfile", *map(str, configfiles)]
    cmd += list(args)
    proc = subprocess.run(cmd, cwd=workdir, env=env(**(extra_env or {})), capture_output=True,
                          text=True, timeout=timeout)
    if check and proc.returncode != 0:
        raise AssertionError(f"snakemake failed ({proc.returncode}): {' '.join(cmd)}\n"
                             f"{proc.stdout[-4000:]}\n{proc.stderr[-8000:]}")
    return proc


def job_stats(text: str) -> collections.Counter:
    """The 'Job stats' table Snakemake prints (dry runs and real runs) → Counter(rule → count)."""
    counts: collections.Counter = collections.Counter()
    lines = text.splitlines()
    for i, line in enumerate(lines):
        if line.strip() == "Job stats:":
            counts = collections.Counter()
            for row in lines[i + 3:]:
                parts = row.split()
                if len(parts) != 2 or parts[0] == "total":
                    break
                counts[parts[0]] = int(parts[1])
    return counts


def finished_rules(text: str) -> collections.Counter:
    """Rules of the jobs a real run finished ('Finished jobid: N (Rule: NAME)')."""
    return collections.Counter(re.findall(r"Finished jobid: \d+ \(Rule: (\w+)\)", text))


def chromium() -> str | None:
    """The Chromium binary (Debian package chromium), or None."""
    return shutil.which("chromium") or shutil.which("chromium-browser")


def dump_dom(html: Path, timeout=120) -> str:
    """The DOM of a page after its scripts ran (headless Chromium; the report is a JS app)."""
    import tempfile

    with tempfile.TemporaryDirectory() as profile:
        cmd = [chromium(), "--headless", "--no-sandbox", "--disable-gpu",
               "--disable-background-networking", "--disable-component-update", "--disable-sync",
               "--no-first-run", f"--user-data-dir={profile}", "--virtual-time-budget=5000",
               "--dump-dom", html.resolve().as_uri()]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return proc.stdout


# The values a user of the CI cluster (tests/slurm/start.sh: one node, partition debug, no
# accounting, MinJobAge 600 s) writes into the profile's EDIT lines.
CI_EDIT_VALUES = {
    "slurm_partition": '"debug"',
    "slurm-status-command": "squeue",
    "slurm-init-seconds-before-status-checks": "1",
    "seconds-between-status-checks": "1",
    "latency-wait": "5",
}


def fill_edit_values(text: str, values: dict = CI_EDIT_VALUES) -> str:
    """The profile text with the given keys' values replaced on the lines an ``EDIT`` comment
    governs (a comment block containing EDIT, then the value lines right below it) and nowhere
    else: what a newcomer does by hand. Fails if a key has no EDIT line."""
    import re

    out, governed, seen = [], False, set()
    for line in text.splitlines(keepends=True):
        stripped = line.strip()
        if stripped.startswith("#"):
            governed = governed if out and out[-1].strip().startswith("#") else False
            governed = governed or "EDIT" in stripped
        elif not stripped:
            governed = False
        elif governed:
            m = re.match(r"^(\s*)([\w-]+):(\s*)(&\w+\s+)?([^#\n]*?)(\s*(#.*)?)$", line.rstrip("\n"))
            if m and m.group(2) in values:
                line = (f"{m.group(1)}{m.group(2)}:{m.group(3)}{m.group(4) or ''}"
                        f"{values[m.group(2)]}{m.group(6)}\n")
                seen.add(m.group(2))
        out.append(line)
    missing = set(values) - seen
    assert not missing, f"no EDIT line for {sorted(missing)}"
    return "".join(out)


def no_slurm() -> str | None:
    """Why the CI cluster cannot be used here, or None when a node is idle."""
    if shutil.which("sinfo") is None:
        return "sinfo not found (apt-get install slurm-client; start tests/slurm/start.sh)"
    try:
        ping = subprocess.run(["scontrol", "ping"], env=env(), capture_output=True, text=True,
                              timeout=20)
        if "UP" not in ping.stdout:
            first = ((ping.stdout or ping.stderr).strip().splitlines() or ["no answer"])[0]
            return f"no Slurm controller up (scontrol ping: {first})"
        proc = subprocess.run(["sinfo", "-h", "-N", "-o", "%T"], env=env(), capture_output=True,
                              text=True, timeout=20)
    except subprocess.TimeoutExpired:
        return "scontrol/sinfo timed out"
    if proc.returncode != 0 or not {"idle", "mixed"} & set(proc.stdout.split()):
        return f"no idle Slurm node (sinfo: {proc.stdout.strip() or proc.stderr.strip()})"
    return None
