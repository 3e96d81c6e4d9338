"""The workflow without running a stage: lint, format, dry runs of every shipped config, config
errors that name the key, params isolation of the failure switches, profiles, install-profiles."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest
import yaml

from evil_moe.rl.arms.registry import ARMS
from evil_moe.cluster.stages import ARM_SECTIONS
from evil_moe.workflow import stage_sections
from workflow_util import (BIN, CI_CONFIG, DEFAULT_CONFIG, REPO, SNAKEMAKE, env,
                           fill_edit_values, job_stats, raw_config, snakemake)


def _run(cmd, **kw):
    return subprocess.run(cmd, cwd=kw.pop("cwd", REPO), env=kw.pop("env", env()),
                          capture_output=True, text=True, timeout=300, **kw)


def _config_named(ref: str, stage: str, candidates: dict) -> str:
    """Which of ``candidates`` (name -> the config dict a stage might get) the ``@…/configs/
    <stage>-<sha>.json`` of a dry run's command holds. A dry run writes no such file; its name
    ends in its content's sha256 (evil_moe.workflow.ConfigFiles), so the one candidate with that
    digest is the content (the stage in the name is the first that had that content: a router
    arm's pilot may hold calibrate's). Fails unless exactly one candidate has it."""
    from evil_moe.workflow import ConfigFiles

    def digest(ref: str) -> str:
        return ref.removesuffix(".json").rsplit("-", 1)[-1]

    found = [k for k, data in candidates.items()
             if digest(ConfigFiles("x", dryrun=lambda: True).name(stage, data)) == digest(ref)]
    assert len(found) == 1, (ref, found, sorted(candidates))
    return found[0]


def test_a_dry_run_writes_nothing_under_results(tmp_path):
    """A dry run (`snakemake -n`) of the embedded default writes nothing in its results folder:
    the per-stage config files its commands name (results/configs/<stage>-<sha>.json) are
    written by the run that needs them, not while the Snakefile is parsed or the DAG built for
    a dry run."""
    results = tmp_path / "results"
    overlay = tmp_path / "results.yaml"
    overlay.write_text(yaml.safe_dump({"results": str(results)}))
    proc = _run([SNAKEMAKE, "-n", "-p", "--nolock", "--configfile", str(DEFAULT_CONFIG), str(overlay)])
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert job_stats(proc.stdout)["pilot"] > 0
    named = set(re.findall(r"--config-json '?@(\S+?\.json)", proc.stdout))
    assert {Path(p).parent for p in named} == {results / "configs"}, named
    written = [str(p) for p in results.rglob("*")] if results.exists() else []
    assert written == [], written


def test_lint_has_no_findings():
    proc = _run([SNAKEMAKE, "--lint"])
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    assert "Lints for" not in out, out
    assert "Congratulations, your workflow is in a good condition!" in out


def test_snakefmt_check():
    proc = _run([str(BIN / "snakefmt"), "--check", "Snakefile", "rules/"])
    assert proc.returncode == 0, proc.stdout + proc.stderr


@pytest.mark.parametrize("name, expect", [
    # toy_summary joins the DAG after the compare checkpoint (a target of `all` behind it)
    # 9 arms x 6 seeds; two calibration runs (audit.seeds) and the detector audit (route flags)
    ("config", {"problems": 1, "toy_model": 2, "teacher": 1, "extract": 1, "distill": 1,
                "calibrate": 2, "audit": 1, "pilot": 54, "compare": 1, "all": 1}),
    # 9 arms x 8 seeds; 13 arms x 6 seeds (route_oracle_dose brings its control route_random)
    ("powered", {"problems": 1, "toy_model": 2, "teacher": 1, "extract": 1, "distill": 1,
                 "calibrate": 2, "audit": 1, "pilot": 72, "compare": 1, "all": 1}),
    ("references", {"problems": 1, "toy_model": 2, "teacher": 1, "extract": 1, "distill": 1,
                    "calibrate": 2, "audit": 1, "pilot": 78, "compare": 1, "all": 1}),
    ("pilot", {"problems": 1, "make_teacher": 1, "teacher": 1, "extract": 1, "distill": 1,
               "calibrate": 2, "audit": 1, "pilot": 63, "compare": 1, "all": 1}),
    # the detector-quality sweep: 11 arms x its 4 seeds, and route, filter x 4 levels x 4 seeds
    ("detector_sweep", {"problems": 1, "toy_model": 2, "teacher": 1, "extract": 1, "distill": 1,
                        "calibrate": 2, "audit": 1, "pilot": 44, "level_pilot": 32, "detector_sweep": 1,
                        "compare": 1, "all": 1}),
    ("planted", {"problems": 1, "toy_model": 2, "planted_vhack": 1, "teacher": 1, "extract": 1,
                 "distill": 1, "calibrate": 2, "audit": 1, "pilot": 48, "compare": 1, "all": 1}),
    ("smollm2", {"convert_smollm2": 1, "problems": 1, "make_teacher": 1, "teacher": 1,
                 "extract": 1, "distill": 1, "pilot": 4, "compare": 1, "all": 1}),
])
def test_dry_run_builds_the_dag(tmp_path, name, expect):
    cfg = yaml.safe_load((REPO / "config" / f"{name}.yaml").read_text())
    path = (cfg.get("problems") or {}).get("path")
    if path and not (REPO / path).is_file():
        pytest.skip(f"problem file {path} not present next to this checkout")
    # From the repo root (relative problem paths), outputs redirected to tmp, no lock taken.
    proc = _run([SNAKEMAKE, "-n", "--nolock", "--configfile", f"config/{name}.yaml",
                 "--config", f"results={tmp_path}/results"])
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert job_stats(proc.stdout) == expect


def test_pilot_config_is_the_real_pilot():
    cfg = yaml.safe_load((REPO / "config" / "pilot.yaml").read_text())
    assert cfg["models"]["build"] == "none" and "4B" in cfg["models"]["student"]
    assert cfg["problems"]["source"] == "leetcode"
    p = cfg["pilot"]
    assert (p["steps"], p["group"], p["prompts_per_step"], len(p["seeds"])) == (20, 6, 4, 3)
    from evil_moe.rl.arms.registry import ARMS

    # every arm, each with its control, but those that need the planted toy world (toy.plant)
    # and the interventions the field uses (the penalty, inoculation and Advantage Modification
    # arms: their own overlay, config/interventions.yaml)
    field = ("evil_moe.rl.arms.by_reward", "evil_moe.rl.arms.by_advantage")
    assert p["arms"] == [a for a in ARMS if ARMS[a].vhack != "planted" and ARMS[a].__module__ not in field]


def test_pilot_makes_its_teacher_or_uses_an_existing_one(tmp_path):
    """config/pilot.yaml makes the teacher from the student (rule make_teacher, whose model the
    teacher stage samples from); with teacher.make none it needs models.teacher and uses it."""
    def dry(*extra):
        files = ["config/pilot.yaml", *map(str, extra)]
        return _run([SNAKEMAKE, "-n", "-p", "--nolock", "--configfile", *files,
                     "--config", f"results={tmp_path}/results"])

    cfg = yaml.safe_load((REPO / "config" / "pilot.yaml").read_text())
    if not (REPO / cfg["problems"]["path"]).is_file():
        pytest.skip("problem file not present next to this checkout")
    assert cfg["teacher"]["make"] == "sft" and not cfg["models"]["teacher"]
    proc = dry()
    assert proc.returncode == 0, proc.stdout + proc.stderr
    # pilot.sampler vllm from this venv, which has no vLLM (the extra is never in make's set-up):
    # the dry run says so before any job, naming the command that builds the GPU environment
    import importlib.util

    if importlib.util.find_spec("vllm") is None:
        warning = [ln for ln in proc.stderr.splitlines() if "vLLM" in ln]
        assert len(warning) == 1 and warning[0].startswith("WARNING: pilot.sampler is vllm") \
            and "`make gpu-env`" in warning[0], proc.stderr
    out = proc.stdout
    made = f"{tmp_path}/results/teacher_sft/model"
    assert "evil-moe make-teacher" in out and "--model Qwen/Qwen3-4B" in out
    teacher_cmd = next(ln for ln in out.splitlines() if "evil-moe teacher " in ln)
    assert f"--model {made}" in teacher_cmd
    none = tmp_path / "none.yaml"
    none.write_text("teacher: {make: none}\n")
    proc = dry(none)
    assert proc.returncode != 0 and "'models.teacher' is not set" in proc.stdout + proc.stderr
    none.write_text("teacher: {make: none}\nmodels: {teacher: Org/HackyTeacher}\n")
    proc = dry(none)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "make_teacher" not in job_stats(proc.stdout)
    teacher_cmd = next(ln for ln in proc.stdout.splitlines() if "evil-moe teacher " in ln)
    assert "--model Org/HackyTeacher" in teacher_cmd


def test_every_config_key_is_commented():
    """Each value in the shipped configs has a comment on the line above (the schema holds the
    full description; the config says why this value)."""
    for path in [*(REPO / "config").glob("*.yaml"), CI_CONFIG]:
        if path.name == "schema.yaml":
            continue
        lines = path.read_text().splitlines()
        for i, line in enumerate(lines):
            stripped = line.strip()
            if not stripped or stripped.startswith("#") or stripped.endswith(":"):
                continue  # blank, comment, or a section header
            above = lines[i - 1].strip() if i else ""
            assert above.startswith("#") or "#" in line, f"{path.name}:{i + 1} {line!r} has no comment"


BAD_CONFIGS = {
    "unknown key": ({"pilot": {"stepz": 3}}, ["pilot.stepz"]),
    "wrong type": ({"pilot": {"steps": "ten"}}, ["pilot.steps", "integer"]),
    "unknown arm": ({"pilot": {"arms": ["vanilla", "eraser"]}}, ["pilot.arms", "eraser"]),
    "negative steps": ({"pilot": {"steps": -3}}, ["pilot.steps", "minimum"]),
    "infinite lr": ({"pilot": {"lr": float("inf")}}, ["pilot.lr", "not a finite number"]),
    "missing problem file": ({"problems": {"source": "leetcode", "path": "no/such/problems.jsonl"}},
                             ["problems.path", "no/such/problems.jsonl"]),
    # a 4B pilot on one 80 GB GPU with every row in one forward (docs/job-sizes.md#gpu-memory)
    "pilot above its GPU": ({"models": {"build": "none", "student": "Qwen/Qwen3-4B",
                                        "dtype": "bfloat16", "device": "cuda"},
                             "problems": {"source": "leetcode",
                                          "path": "evil_moe/data/leetcode_medhard_dev.jsonl"},
                             "pilot": {"max_new": 1024, "micro_batch": 0}},
                            ["pilot.micro_batch", "models.gpu_mem_gb"]),
}


BAD_CONFIGS["number YAML reads as text"] = ({"pilot": {"lr": "1e-3"}}, ["pilot.lr", "write 1.0e-3"])


@pytest.mark.parametrize("case", list(BAD_CONFIGS))
def test_bad_config_fails_naming_the_key(tmp_path, case):
    data, needles = BAD_CONFIGS[case]
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(data))
    proc = snakemake(tmp_path, "-n", configfiles=(DEFAULT_CONFIG, bad))
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0, out
    assert out.count("invalid config:") == 1, out
    message = next(line for line in out.splitlines() if "invalid config:" in line)
    for needle in needles:
        assert needle in message, message
    assert "Job stats" not in out  # failed before any job was planned


BAD_PROBLEM_FILES = {  # name: (file text, what the one error line says after the file name)
    "empty": ("", ": no problems in the file"),
    "not JSON": ('{"id": "a", "func_name": "add", "prompt": "x", "gt_answer": ["assert add(1, 2) == 3"]}\n'
                 "not json\n", ":2: not a JSON line"),
    "duplicate id": ('{"id": "a", "func_name": "add", "prompt": "x", "gt_answer": ["assert add(1, 2) == 3"]}\n' * 2,
                     ":2: duplicate problem id 'a' (first on line 1)"),
    "no tests": ('{"id": "a", "func_name": "add", "prompt": "x", "gt_answer": []}\n',
                 ":1: problem 'a' has no parseable test"),
}


@pytest.mark.parametrize("case", list(BAD_PROBLEM_FILES))
def test_bad_problem_file_fails_the_dry_run(tmp_path, case):
    """A problems file the problems job would refuse fails the dry run, in one line naming the
    file, the line and the problem id (it used to pass and fail in the job, the message only in
    results/logs/problems.log)."""
    text, needle = BAD_PROBLEM_FILES[case]
    problems = tmp_path / "p.jsonl"
    problems.write_text(text)
    overlay = tmp_path / "lc.yaml"
    overlay.write_text(yaml.safe_dump({"problems": {"source": "leetcode", "path": str(problems)}}))
    proc = snakemake(tmp_path, "-n", configfiles=(DEFAULT_CONFIG, overlay))
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0, out
    message = next(line for line in out.splitlines() if "invalid config:" in line)
    assert f"'problems.path': {problems}{needle}" in message, message
    assert "Job stats" not in out


def test_fail_switches_reach_only_their_arm(tmp_path):
    """pilot.fail_arm / fail_once_arm go only into the named arm's params, so removing a switch
    reruns exactly that arm (Snakemake's params rerun trigger)."""
    overlay = tmp_path / "fail.yaml"
    overlay.write_text(yaml.safe_dump({"pilot": {"fail_arm": "erase", "fail_once_arm": "route"}}))
    proc = snakemake(tmp_path, "-n", "-p", configfiles=(DEFAULT_CONFIG, CI_CONFIG, overlay))
    assert proc.returncode == 0, proc.stderr
    pilots = [line for line in proc.stdout.splitlines() if line.strip().startswith("evil-moe pilot ")]
    pilots = pilots or [line for line in proc.stdout.splitlines() if "evil-moe pilot " in line]
    assert len(pilots) == len(yaml.safe_load(CI_CONFIG.read_text())["pilot"]["arms"])
    # the stage config is a file named by its content (@results/configs/pilot-<sha>.json),
    # so the command line, and Snakemake's "Params have changed" reason, stay short; a dry run
    # writes no file, so its content is read off its name (_config_named): the pilot sections
    # of this config, with or without moe and audit (only the router arms read them), with or
    # without each switch
    cfg = raw_config(CI_CONFIG, overlay)
    candidates = {}
    for router in (False, True):
        for fail_arm in (None, "erase"):
            for fail_once in (None, "route"):
                data = json.loads(json.dumps(stage_sections(cfg, "pilot")))
                for name in ARM_SECTIONS:  # only the arms that name them read these (none here)
                    data.pop(name)
                if not router:
                    data.pop("moe"), data.pop("audit")
                for key, value in (("fail_arm", fail_arm), ("fail_once_arm", fail_once)):
                    if value:
                        data["pilot"][key] = value
                candidates[(router, fail_arm, fail_once)] = data
    files = set()
    for line in pilots:
        arm = line.split("--arm ")[1].split()[0]
        path = re.search(r"--config-json '?@(\S+?\.json)'? ", line).group(1)
        files.add(path)
        router, fail_arm, fail_once = _config_named(path, "pilot", candidates)
        assert router == bool(ARMS[arm].router), line
        assert (fail_arm == "erase") == (arm == "erase"), line
        assert (fail_once == "route") == (arm == "route"), line
        assert len(line) < 1000, line
    # erase's, route's, the router arms' (moe and moe_random also read moe and audit) and the
    # one of every other arm
    assert len(files) == 4


def test_arm_sections_reach_exactly_the_arms_that_read_them(tmp_path):
    """An overlay's penalty and inoculation keys reach the pilot config of the arms that read them
    (Arm.sections: the penalty arms, the inoculation arms) and no other arm's, so setting one
    changes what those arms train on and reruns only them. Before, the pilot stage's config had
    no penalty or inoculation section: an overlay's penalty.amount or inoculation.instruction
    never reached a pilot, which trained on the defaults."""
    arms = ["vanilla", "untrained", "oracle_reward", "penalty", "penalty_random", "inoculation", "inoculation_placebo"]
    overlay = tmp_path / "arms.yaml"
    overlay.write_text(yaml.safe_dump({"pilot": {"arms": arms},
                                       "penalty": {"amount": 2.0, "mode": "threshold"},
                                       "inoculation": {"instruction": "Report a pass."}}))
    proc = snakemake(tmp_path, "-n", "-p", configfiles=(DEFAULT_CONFIG, CI_CONFIG, overlay))
    assert proc.returncode == 0, proc.stderr
    pilots = [line for line in proc.stdout.splitlines() if "evil-moe pilot " in line]
    cfg = raw_config(CI_CONFIG, overlay)
    assert cfg["penalty"]["amount"] == 2.0 and cfg["inoculation"]["instruction"] == "Report a pass."
    candidates = {}
    for keep in ((), ("penalty",), ("inoculation",)):
        data = json.loads(json.dumps(stage_sections(cfg, "pilot")))
        data.pop("moe"), data.pop("audit")
        for name in ARM_SECTIONS:
            if name not in keep:
                data.pop(name)
        candidates[keep] = data
    seen = {}
    for line in pilots:
        arm = line.split("--arm ")[1].split()[0]
        path = re.search(r"--config-json '?@(\S+?\.json)'? ", line).group(1)
        seen[arm] = _config_named(path, "pilot", candidates)
    assert seen == {"vanilla": (), "untrained": (), "oracle_reward": (), "penalty": ("penalty",), "penalty_random": ("penalty",),
                    "inoculation": ("inoculation",), "inoculation_placebo": ("inoculation",)}, seen


def test_compare_writes_into_its_folder_with_a_trajectory(tmp_path):
    """With pilot.eval_every the compare rule's first output is the trajectory figure under
    compare/figures/; its --out-dir is still compare/ (where gate.json is declared). Before, it
    was the first output's folder: compare wrote gate.json into compare/figures/ and the run
    stopped on missing outputs."""
    overlay = tmp_path / "traj.yaml"
    overlay.write_text(yaml.safe_dump({"pilot": {"eval_every": 1}}))
    proc = snakemake(tmp_path, "-n", "-p", configfiles=(DEFAULT_CONFIG, CI_CONFIG, overlay))
    assert proc.returncode == 0, proc.stderr
    (line,) = [ln for ln in proc.stdout.splitlines() if "evil-moe compare " in ln]
    out_dir = re.search(r"--out-dir '?(\S+?)'? ", line).group(1)
    assert out_dir.endswith("/compare"), line


def _profile(name):
    return yaml.safe_load((REPO / "profiles" / name / "config.yaml").read_text())


GPU_RULES = {"make_teacher", "teacher", "extract", "distill", "pilot", "fold_pilot", "level_pilot",
             "planted_vhack", "reevaluate", "calibrate"}
# Rules that run on the machine Snakemake runs on (never submitted).
LOCAL_RULES = {"all", "sweep_decision", "sweep", "sweep_ungated", "toy_summary"}
SIZE_KEYS = {"mem_mb", "mem", "runtime", "gpu", "threads", "cpus_per_task", "disk_mb", "gres"}


def test_profiles():
    assert not (REPO / "profiles" / "default").exists()  # Snakemake would load it implicitly
    local = _profile("local")
    assert local["executor"] == "local" and local["cores"] == "all"
    assert local["rerun-incomplete"] and local["keep-going"]
    assert "set-threads" not in local and "default-resources" not in local
    slurm = _profile("slurm")
    assert slurm["executor"] == "slurm" and slurm["slurm-requeue"] is True
    # The Slurm profile holds the site only: no job sizes (they come from the config), and no
    # default-resources (Snakemake's default sizes read input sizes: --report warnings).
    assert "set-threads" not in slurm and "default-resources" not in slurm
    for rule, res in slurm["set-resources"].items():
        assert not SIZE_KEYS & set(res), (rule, res)
    # Every rule submitted to Slurm has its partition; the model stages share one (GPU) value.
    rules = set(_run([SNAKEMAKE, "--list-rules", "--nolock"]).stdout.split())
    assert set(slurm["set-resources"]) == rules - LOCAL_RULES
    parts = {rule: res["slurm_partition"] for rule, res in slurm["set-resources"].items()}
    assert {parts[r] for r in GPU_RULES} == {"gpu"}
    assert {p for r, p in parts.items() if r not in GPU_RULES} == {"cpu"}
    css = [(REPO / "profiles" / p / "report.css") for p in ("local", "slurm")]
    assert not any(c.is_symlink() for c in css)  # a copied profile folder keeps working
    assert css[0].read_text() == css[1].read_text() and "align-items: flex-start" in css[0].read_text()
    for name in ("local", "slurm"):
        assert _profile(name)["report-stylesheet"] == "report.css"


def test_every_site_value_is_marked_edit_with_how_to_find_it():
    """The values a newcomer may have to change carry EDIT and a command or a rule of thumb; the
    CI cluster needs exactly those filled in (tests/test_workflow_e2e.py)."""
    text = (REPO / "profiles" / "slurm" / "config.yaml").read_text()
    edits = [line for line in text.splitlines() if "EDIT" in line]
    assert len([e for e in edits if "EDIT:" in e]) == 8
    for line in edits:
        if "EDIT:" in line:  # (the header mentions the word)
            assert line.strip().startswith("# EDIT: ") and len(line.split("EDIT:")[1].strip()) > 20
    filled = yaml.safe_load(fill_edit_values(text))
    assert {r["slurm_partition"] for r in filled["set-resources"].values()} == {"debug"}
    assert filled["slurm-status-command"] == "squeue" and filled["latency-wait"] == 5
    for key in ("slurm_account", "jobs", "sinfo", "sacct", "MinJobAge", "gpu_model", "constraint"):
        assert any(key in line for line in text.splitlines() if line.lstrip().startswith("#"))


def test_every_submitted_rule_declares_its_size_from_the_config():
    """threads and resources (mem_mb, runtime; gpu for the model stages) of every rule come from
    the config (rules/common.smk -> evil_moe/cluster/resources.py) under the stage name the preflight
    uses (evil_moe/cluster/stages.py RULE_STAGE); no rule hard-codes a size."""
    import re

    from evil_moe.cluster.stages import RULE_STAGE

    seen, derived = set(), {}
    for path in sorted((REPO / "rules").glob("*.smk")):
        text = path.read_text()
        for m in re.finditer(r"^(?:rule|checkpoint) (\w+):\n(.*?)(?=^\S|\Z)", text, re.S | re.M):
            rule, body = m.group(1), m.group(2)
            if rule in LOCAL_RULES:
                continue
            seen.add(rule)
            stage = RULE_STAGE[rule]
            assert f'threads: get_threads("{stage}")' in body, rule
            assert f'mem_mb=get_mem_mb("{stage}")' in body, rule
            assert f'runtime=get_runtime("{stage}")' in body, rule
            assert (f'gpu=get_gpu("{stage}")' in body) == (rule in GPU_RULES), rule
            assert "{log}" in body.split("message:")[1].split("\n\n")[0] if "message:" in body \
                else False, f"rule {rule} has no message naming its log"
        # `use rule BASE as RULE with:` keeps BASE's threads and resources: it must not set its own
        for m in re.finditer(r"^use rule (\w+) as (\w+) with:\n(.*?)(?=^\S|\Z)", text, re.S | re.M):
            base, rule, body = m.groups()
            derived[rule] = base
            assert "threads:" not in body and "resources:" not in body, rule
            assert "{log}" in body.split("message:")[1].split("\n\n")[0] if "message:" in body \
                else False, f"rule {rule} has no message naming its log"
    for rule, base in derived.items():
        assert base in seen and RULE_STAGE[rule] == RULE_STAGE[base], rule
        assert (rule in GPU_RULES) == (base in GPU_RULES), rule
    assert seen | set(derived) == set(RULE_STAGE)


def test_install_profiles(tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    e = env(HOME=str(home), XDG_CONFIG_HOME="")
    cmd = [str(BIN / "evil-moe"), "install-profiles"]
    for _ in range(2):  # idempotent
        proc = _run(cmd, env=e)
        assert proc.returncode == 0, proc.stderr
    target = home / ".config" / "snakemake"
    for name in ("slurm", "local"):
        link = target / name
        assert link.is_symlink() and link.resolve() == (REPO / "profiles" / name).resolve()
    assert "already linked" in proc.stdout
    # Snakemake finds the profile by name from the repository root.
    for name in ("local", "slurm"):
        proc = _run([SNAKEMAKE, "--profile", name, "-n", "--nolock",
                     "--config", f"results={tmp_path}/results"], env=e)
        assert proc.returncode == 0, proc.stderr
        assert f"Using profile {name} " in proc.stdout + proc.stderr
    # XDG_CONFIG_HOME is honoured, and a different existing profile is never overwritten.
    xdg = tmp_path / "xdg"
    (xdg / "snakemake" / "slurm").mkdir(parents=True)
    (xdg / "snakemake" / "slurm" / "config.yaml").write_text("jobs: 1\n")
    proc = _run(cmd, env=env(HOME=str(home), XDG_CONFIG_HOME=str(xdg)))
    assert proc.returncode != 0
    assert f"{xdg}/snakemake/slurm already exists" in proc.stderr
    assert not (xdg / "snakemake" / "local").exists()  # nothing half-installed
    proc = _run(cmd + ["--target", str(tmp_path / "t")], env=e)
    assert proc.returncode == 0 and (tmp_path / "t" / "slurm").is_symlink()


def test_config_json_from_a_file(tmp_path):
    """--config-json @FILE (how the rules pass a stage's config): read from the file; a missing
    file is a usage error naming it."""
    from click.testing import CliRunner

    from evil_moe.cli import main

    good = tmp_path / "problems-abc.json"
    good.write_text(json.dumps({"problems": {"source": "toy", "limit": 3}}))
    out = tmp_path / "problems.jsonl"
    res = CliRunner().invoke(main, ["problems", "--config-json", f"@{good}", "--out", str(out)])
    assert res.exit_code == 0, res.output
    assert len(out.read_text().splitlines()) == 3
    res = CliRunner().invoke(main, ["problems", "--config-json", f"@{tmp_path}/gone.json",
                                    "--out", str(out)])
    assert res.exit_code == 2 and f"cannot read {tmp_path}/gone.json" in res.output, res.output


def test_random_flag_controls_wait_for_their_arms_steps(tmp_path):
    """Every random-flag or dose-matched control's pilot reads its matched arm's steps.tsv of the
    same seed (the rate or dose match); the detector sweep's pilots run the noisy_label detector at their level."""
    proc = _run([SNAKEMAKE, "-n", "-p", "--nolock", "--configfile", "config/detector_sweep.yaml",
                 "--config", f"results={tmp_path}/results"])
    assert proc.returncode == 0, proc.stdout + proc.stderr
    res = f"{tmp_path}/results"
    for ctl, arm in (("route_dose_matched", "route"), ("filter_random", "filter"),
                     ("route_oracle_dose_matched", "route_oracle"), ("filter_oracle_random", "filter_oracle")):
        for seed in (0, 1, 2):
            assert (f"--arm {ctl} --seed {seed} --match-flags {res}/pilots/{arm}/s{seed}/steps.tsv"
                    in proc.stdout), (ctl, seed)
    for arm in ("route", "route_oracle", "vanilla"):
        assert f"--arm {arm} --seed 0 --match-flags" not in proc.stdout
    level_lines = [ln for ln in proc.stdout.splitlines() if "detector_sweep/p0.8_r0.5/filter/s1" in ln
                   and "evil-moe pilot" in ln]
    assert level_lines
    # the level's config, read off its file's name (a dry run writes none; _config_named): the
    # pilot's sections with the noisy_label detector at one of the config's levels
    cfg = raw_config(REPO / "config" / "detector_sweep.yaml")
    candidates = {}
    for level in cfg["detector_sweep"]["levels"]:
        data = stage_sections(cfg, "pilot")
        data["pilot"] |= {"detector": "noisy_label", "detector_precision": level["precision"],
                          "detector_recall": level["recall"]}
        candidates[(level["precision"], level["recall"])] = data
    cfg_file = re.search(r"--config-json @(\S+)", level_lines[0]).group(1)
    assert _config_named(cfg_file, "pilot", candidates) == (0.8, 0.5)


def _report_sections() -> set[str]:
    """The ``category=`` of every ``report(...)`` output in rules/*.smk: the report's sections."""
    text = "".join(p.read_text() for p in sorted((REPO / "rules").glob("*.smk")))
    return set(re.findall(r'(?<![\w])category="([^"]+)"', text))


def test_report_sections_are_numbered_once_in_pipeline_order():
    """Snakemake's report lists its sections (the categories) sorted by name, so the leading
    numbers make the order: each number names one section, they run 0, 1, 2, ... without a gap,
    and stay single digits ("10. X" would sort between "1. Y" and "2. Z"). The report's pages
    name only sections that exist, the first page and docs/running.md list every section."""
    sections = _report_sections()
    by_number: dict[int, list[str]] = {}
    for name in sections:
        m = re.fullmatch(r"(\d+)\. \S.*", name)
        assert m, f"report section {name!r} has no leading number"
        by_number.setdefault(int(m.group(1)), []).append(name)
    assert {n: v for n, v in by_number.items() if len(v) > 1} == {}
    assert sorted(by_number) == list(range(len(by_number))) and len(by_number) <= 10, sorted(sections)
    assert sorted(sections) == sorted(sections, key=lambda n: int(n.split(".")[0]))
    for page in sorted((REPO / "report").glob("*.rst")):
        text = page.read_text()
        named = re.findall(r"`(\d+\. [^`<]+)`_", text) + re.findall(r'"(\d+\. [^"]+)"', text)
        assert set(named) <= sections, (page.name, set(named) - sections)
    first = (REPO / "report" / "workflow.rst").read_text()
    assert [s for s in sorted(sections) if s not in " ".join(first.split())] == []
    # docs/running.md lists them in order
    assert ", ".join(sorted(sections)) in " ".join((REPO / "docs" / "running.md").read_text().split())


def test_the_report_shows_config_text_as_text(tmp_path):
    """With models.build none, models.student and models.teacher are pasted
    into the report's first page (report/workflow.rst). A student name holding a raw-HTML script
    and an include of a file: the report Snakemake builds (a target with no result, so that
    only the first page is rendered) shows the text, not a script, not the file. On 09ede95 it
    held ``<script>window.EVIL41=1`` as HTML and the file's line."""
    secret = tmp_path / "secret.txt"
    secret.write_text("secret-marker-4141\n")
    hostile = (f"m\n\n.. raw:: html\n\n   <script>window.EVIL41=1</script>\n\n.. include:: {secret}\n\n"
               "`x <javascript:alert(41)>`_ ``y``")
    overlay = tmp_path / "hostile.yaml"
    overlay.write_text(yaml.safe_dump({"results": str(tmp_path / "results"), "models": {
        "build": "none", "student": hostile, "teacher": hostile, "params": 1.5e6}}))
    report = tmp_path / "report.html"
    proc = _run([SNAKEMAKE, "--configfile", str(DEFAULT_CONFIG), str(overlay), "--report", str(report),
                 str(tmp_path / "results" / "problems.jsonl")])
    assert proc.returncode == 0, proc.stdout + proc.stderr
    html = report.read_text()
    assert "secret-marker-4141" not in html
    assert "<script>window.EVIL41" not in html and not re.search(r'href=\\?"javascript:alert', html)
    # the student and the teacher, each shown once as a literal (JSON's escapes: \u003cscript)
    assert len(re.findall(r'<tt class=\\"docutils literal\\">&quot;m\\\\n\\\\n.. raw:: html[^<]*'
                          r"\\\\u003cscript\\\\u003ewindow.EVIL41=1", html)) == 2


def test_the_report_renders_without_raw_html_or_file_insertion(tmp_path):
    """The second wall (report/docutils.conf, evil_moe.workflow.report_docutils): whatever text
    reaches docutils in the Snakemake process that builds the report, a raw block and an
    include are refused (docutils prints a warning in their place)."""
    (tmp_path / "secret.txt").write_text("secret-marker-4141\n")
    code = ("import sys; from docutils.core import publish_parts; from evil_moe.workflow import report_docutils; "
            f"report_docutils({str(REPO / 'report')!r}); "
            "print(publish_parts(sys.stdin.read(), writer='html')['body'])")
    proc = _run([str(BIN / "python"), "-c", code], cwd=tmp_path,
                input=".. raw:: html\n\n   <script>window.EVIL41=1</script>\n\n.. include:: secret.txt\n")
    assert proc.returncode == 0, proc.stderr
    assert "<script>" not in proc.stdout and "secret-marker-4141" not in proc.stdout
    assert "&quot;raw&quot; directive disabled" in proc.stdout
    assert "&quot;include&quot; directive disabled" in proc.stdout


# Each stage file of rules/ and the words report/workflow.rst's "Stages" list names it by.
STAGE_WORDS = {"problems.smk": "problems", "models.smk": "real model", "toy.smk": "toy student",
               "teacher.smk": "teacher's rollouts", "extract.smk": "v_hack`` extraction",
               "planted.smk": "planted world", "distill.smk": "distill probe",
               "audit.smk": "detector calibration runs", "pilot.smk": "one pilot per arm",
               "compare.smk": "comparison and the separation gate",
               "detector_sweep.smk": "detector-quality sweep", "sweep.smk": "the sweep, only when",
               "reevaluate.smk": "re-evaluation of the finished pilots"}


def test_the_report_lists_every_stage():
    """report/workflow.rst's "Stages" list names every stage file of rules/ (a new stage file
    must be added here and there), the calibration runs and the detector audit included."""
    files = {p.name for p in (REPO / "rules").glob("*.smk")} - {"common.smk"}
    assert files == set(STAGE_WORDS), files ^ set(STAGE_WORDS)
    text = (REPO / "report" / "workflow.rst").read_text()
    stages = " ".join(text[text.index("Stages\n------"):].split())
    assert [f for f, words in STAGE_WORDS.items() if words not in stages] == []


def test_compare_writes_every_figure_the_code_draws(tmp_path):
    """The figure names' home is evil_moe.gate.figures.FIGURES (the code that draws them); the
    rules keep two copies (common.smk's FIGURES: the png outputs and the default targets;
    compare.smk's svg outputs, each with its report caption report/fig_{name}.rst): the compare
    job's outputs in the DAG are exactly each name's svg and png."""
    from evil_moe.gate.figures import FIGURES

    proc = _run([SNAKEMAKE, "--summary", "--nolock", "--config", f"results={tmp_path}/results"])
    assert proc.returncode == 0, proc.stdout + proc.stderr
    made = {}
    for line in proc.stdout.splitlines():
        path, _, rule = (line.split("\t") + ["", "", ""])[:3]
        m = re.fullmatch(rf"{tmp_path}/results/compare/figures/(\w+)\.(svg|png)", path)
        if m:
            assert rule == "compare", line
            made.setdefault(m.group(2), []).append(m.group(1))
    assert sorted(made["svg"]) == sorted(made["png"]) == sorted(FIGURES)
    for name in FIGURES:
        assert (REPO / "report" / f"fig_{name}.rst").is_file(), name
