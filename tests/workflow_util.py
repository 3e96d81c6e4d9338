"""Helpers shared by the workflow tests (tests/test_workflow_*.py): run Snakemake on the repo's
Snakefile in a temporary working directory, so test outputs never touch the repo's results/."""

from __future__ import annotations

import collections
import fcntl
import json
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
SMOLLM2_CONFIG = REPO / "config" / "smollm2.yaml"
SMOLLM2_CI_CONFIG = REPO / "tests" / "config" / "smollm2_ci.yaml"
LEETCODE = REPO / "evil_moe" / "data" / "leetcode_medhard_dev.jsonl"  # bundled, see its README
SMOLLM2_MODEL = Path("results") / "smollm2" / "models" / "smollm2"  # rule convert_smollm2's folder
LOCAL_PROFILE = ("--profile", str(REPO / "profiles" / "local"), "--cores", "2")
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
    added to the environment. Snakemake runs in its own process group: past ``timeout`` seconds
    the whole group (Snakemake and its jobs) is stopped and :class:`WorkflowTimeout` names the
    jobs still running with the last lines of their logs (a stalled stage fails the test instead
    of running on beside it)."""
    cmd = [SNAKEMAKE, "--snakefile", str(REPO / "Snakefile"), "--directory", str(workdir)]
    if configfiles:
        cmd += ["--configfile", *map(str, configfiles)]
    cmd += list(args)
    with subprocess.Popen(cmd, cwd=workdir, env=env(**(extra_env or {})), stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True, start_new_session=True) as popen:
        try:
            out, err = popen.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            out, err = _stop_group(popen)
            raise WorkflowTimeout(_timeout_message(workdir, cmd, timeout, out + err)) from None
        except BaseException:
            _stop_group(popen)
            raise
    proc = subprocess.CompletedProcess(cmd, popen.returncode, out, err)
    if check and proc.returncode != 0:
        raise AssertionError(f"snakemake failed ({proc.returncode}): {' '.join(cmd)}\n"
                             f"{proc.stdout[-4000:]}\n{proc.stderr[-8000:]}")
    return proc


class WorkflowTimeout(AssertionError):
    """Snakemake did not finish within the test's time limit (:func:`snakemake`)."""


def _stop_group(popen: subprocess.Popen, grace: float = 20.0) -> tuple[str, str]:
    """SIGTERM to the process group of ``popen`` (Snakemake stops its jobs), SIGKILL to whatever
    is left after ``grace`` seconds; returns what Snakemake wrote."""
    import signal

    out = err = ""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(popen.pid, sig)
        except ProcessLookupError:
            pass
        try:
            out, err = popen.communicate(timeout=grace)
            break
        except subprocess.TimeoutExpired:
            continue
    try:  # the jobs of a Snakemake that exited before them
        os.killpg(popen.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    return out or "", err or ""


def _timeout_message(workdir: Path, cmd: list, timeout: float, output: str) -> str:
    """Which jobs were still running when the time ran out (started, 'Job N: message; log:
    path', but not 'Finished jobid: N'), each with the last lines of its log."""
    started = dict(re.findall(r"^Job (\d+): (.*)$", output, re.M))
    done = set(re.findall(r"Finished jobid: (\d+)", output))
    lines = [f"snakemake did not finish within {timeout:.0f} s and was stopped: {' '.join(cmd)}"]
    for jobid, message in started.items():
        if jobid in done:
            continue
        lines.append(f"still running: job {jobid}: {message}")
        log = re.search(r"log: (\S+)$", message)
        path = workdir / log.group(1) if log else None
        if path is not None and path.is_file():
            tail = path.read_text(errors="replace").replace("\r", "\n").splitlines()[-8:]
            lines += [f"  {path} (last lines):", *(f"    {t}" for t in tail)]
    if len(lines) == 1:
        lines.append(f"(no job running; snakemake's last output: {output[-2000:]})")
    return "\n".join(lines)


def _once(root: Path, name: str, make) -> subprocess.CompletedProcess:
    """``make(work)`` (a Snakemake run in ``root/name``, made empty first) at most once per
    ``root`` however many processes ask: the first takes an exclusive lock on ``root/name.lock``
    and runs it, recording its exit status and output in ``root/name.json``; the others wait on
    the lock and read the record. Fails if the run failed."""
    work, record = root / name, root / f"{name}.json"
    root.mkdir(parents=True, exist_ok=True)
    with open(root / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not record.is_file():
            shutil.rmtree(work, ignore_errors=True)
            work.mkdir()
            proc = make(work)
            record.write_text(json.dumps({"args": proc.args, "returncode": proc.returncode,
                                          "stdout": proc.stdout, "stderr": proc.stderr}))
        proc = subprocess.CompletedProcess(**json.loads(record.read_text()))
    assert proc.returncode == 0, f"{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}"
    return proc


def toy_run_once(root: Path) -> tuple[Path, subprocess.CompletedProcess]:
    """The toy workflow (tests/config/ci.yaml through profiles/local) finished in ``root/toy_run``,
    run at most once per ``root`` however many processes ask: the first takes an exclusive lock
    on ``root/toy_run.lock`` and runs it, recording Snakemake's exit status and output in
    ``root/toy_run.json``; the others wait on the lock and read the record. Returns the working
    folder and the run's CompletedProcess (fails if the run failed)."""
    proc = _once(root, "toy_run", lambda work: snakemake(work, *LOCAL_PROFILE))
    return root / "toy_run", proc


def smollm2_ci_once(root: Path) -> tuple[Path, tuple[Path, ...]]:
    """The working folder of the smallest real-model run (``root/smollm2_ci``) with SmolLM2
    converted by the workflow's own convert_smollm2 rule (``SMOLLM2_MODEL`` in it), made at most
    once per ``root`` however many processes ask (an exclusive lock on ``root/smollm2_ci.lock``,
    the outcome recorded in ``root/smollm2_ci.json``, as :func:`toy_run_once`). Its problem file
    holds the two problems of the bundled LeetCode file with the shortest statement and canonical
    solution (every forward and backward of the run is as short as the data allows), named by an
    overlay after ``tests/config/smollm2_ci.yaml``. Returns the folder and its config files;
    fails if the conversion failed. The conversion test reads the model; the workflow test runs
    the rest of the workflow in the same folder."""
    work = root / "smollm2_ci"
    files = (DEFAULT_CONFIG, SMOLLM2_CONFIG, SMOLLM2_CI_CONFIG, work / "problems.yaml")

    def make(work: Path) -> subprocess.CompletedProcess:
        rows = [json.loads(line) for line in LEETCODE.read_text().splitlines() if line.strip()]
        size = [sum(len(m["content"]) for m in r["prompt"]) + len(r["canonical_solution"])
                for r in rows]
        short = sorted(sorted(range(len(rows)), key=size.__getitem__)[:2])
        (work / "problems.jsonl").write_text("".join(json.dumps(rows[i]) + "\n" for i in short))
        (work / "problems.yaml").write_text(
            f"problems: {{path: {json.dumps(str(work / 'problems.jsonl'))}}}\n")
        return snakemake(work, *LOCAL_PROFILE, str(SMOLLM2_MODEL / "config.json"),
                         configfiles=files, timeout=900)

    _once(root, "smollm2_ci", make)
    return work, files


def raw_config(*files, sets=()) -> dict:
    """The validated config dict of config/config.yaml, then ``files``, then ``--set``-style
    ``sets`` (what a stage's job sizes and the Slurm preflight read), with the cross-key checks
    the CLI and the Snakefile run (:func:`evil_moe.checks.load_run_config`)."""
    from evil_moe.checks import load_run_config

    return load_run_config([DEFAULT_CONFIG, *files], list(sets)).raw


def job_stats(text: str) -> collections.Counter:
    """The 'Job stats' table Snakemake prints (dry runs and real runs) → Counter(rule → count)
    (:func:`evil_moe.cluster.plan.job_stats`, the parser slurm-check plans with)."""
    from evil_moe.cluster.plan import job_stats as parse

    return collections.Counter(parse(text))


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


# Measures the report's first page as laid out: after the app rendered, the bounding boxes (left,
# top, right, bottom, in CSS px of the window) of the navigation bar, the first page, its tables
# (with their rows' first cells) and its paragraphs, written into the DOM for --dump-dom.
_LAYOUT_JS = """<script>
window.addEventListener('load', () => setTimeout(() => {
  const box = el => { const b = el.getBoundingClientRect(); return [b.left, b.top, b.right, b.bottom]; };
  const page = document.querySelector('div.prose.prose-sm.max-w-lg');
  const nav = document.querySelector('nav');
  const out = {viewport: [window.innerWidth, window.innerHeight], nav: nav ? box(nav) : null,
    page: page ? box(page) : null,
    tables: page ? [...page.querySelectorAll('table')].map(t => ({box: box(t),
      rows: [...t.querySelectorAll('tr')].map(r => [r.cells.length ? r.cells[0].textContent.trim() : '', box(r)])})) : [],
    paragraphs: page ? [...page.querySelectorAll('p')].map(q => [q.textContent.replace(/\\s+/g, ' ').trim(), box(q)]) : []};
  const pre = document.createElement('pre');
  pre.id = 'evil-moe-layout';
  pre.textContent = JSON.stringify(out);
  document.body.appendChild(pre);
}, 1500));
</script>"""


def _chromium(args: list[str], timeout: int) -> subprocess.CompletedProcess:
    import tempfile

    with tempfile.TemporaryDirectory() as profile:
        cmd = [chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
               "--disable-background-networking", "--disable-component-update", "--disable-sync",
               "--no-first-run", f"--user-data-dir={profile}", "--virtual-time-budget=8000", *args]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return proc


def report_layout(html: Path, width: int, height: int, screenshot: Path | None = None,
                  timeout=180) -> dict:
    """The report's first page laid out by headless Chromium in a ``width`` × ``height`` window
    (``_LAYOUT_JS``'s boxes); with ``screenshot``, a PNG of the window is saved there too."""
    import json
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        probe = Path(tmp) / "report.html"
        text = html.read_text()
        i = text.rfind("</body>")
        probe.write_text(text[:i] + _LAYOUT_JS + text[i:])
        dom = _chromium([f"--window-size={width},{height}", "--dump-dom", probe.as_uri()], timeout).stdout
        if screenshot is not None:
            screenshot.parent.mkdir(parents=True, exist_ok=True)
            _chromium([f"--window-size={width},{height}", f"--screenshot={screenshot}", html.resolve().as_uri()],
                      timeout)
    m = re.search(r'<pre id="evil-moe-layout">(.*?)</pre>', dom, re.S)
    assert m, "the layout probe did not run: " + dom[-2000:]
    import html as html_mod

    return json.loads(html_mod.unescape(m.group(1)))


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
