"""evil_moe/workflow.py, what the Snakefile asks of the package, called directly (the dry runs of
tests/test_workflow_static.py call it through Snakemake): the config's checks raise Snakemake's
error naming the key, a stage's params hold only its sections, the config files are named by
their content and written once (never by a dry run), a job size that cannot be worked out names models.params."""

from __future__ import annotations

import copy
from pathlib import Path
import hashlib
import json

import pytest
import yaml
from snakemake.exceptions import WorkflowError

from evil_moe.config import PILOT_RUN_INDEPENDENT, validate
from evil_moe.workflow import (ConfigFiles, JobSizes, check_config, check_inputs, per_job,
                               share_svd_cache, stage_config_param, stage_sections, vllm_warning)
from workflow_util import DEFAULT_CONFIG


def _default() -> dict:
    return validate(yaml.safe_load(DEFAULT_CONFIG.read_text()))


def test_check_config_names_the_bad_key_and_leaves_the_config_alone():
    cfg = yaml.safe_load(DEFAULT_CONFIG.read_text())
    before = copy.deepcopy(cfg)
    check_config(cfg)
    assert cfg == before  # Snakemake's validate fills the defaults afterwards, not this check
    cfg["pilot"]["no_such_key"] = 1
    with pytest.raises(WorkflowError, match=r"^invalid config: .*no_such_key"):
        check_config(cfg)


def test_check_inputs_names_each_key():
    cfg = _default()
    check_inputs(cfg)  # the embedded default passes
    bad = copy.deepcopy(cfg)
    bad["audit"]["seeds"] = [cfg["pilot"]["seeds"][0]]
    with pytest.raises(WorkflowError, match=r"audit.seeds must be disjoint .*shared: \[%d\]"
                       % cfg["pilot"]["seeds"][0]):
        check_inputs(bad)
    bad = copy.deepcopy(cfg)
    bad["problems"].update(source="leetcode", path="")
    with pytest.raises(WorkflowError, match="'problems.path' is not set"):
        check_inputs(bad)
    bad = copy.deepcopy(cfg)
    bad["models"].update(build="none", student="", teacher="")
    with pytest.raises(WorkflowError, match="'models.student' is not set"):
        check_inputs(bad)
    bad = copy.deepcopy(cfg)
    bad["toy"]["plant"]["enabled"] = False
    bad["pilot"]["arms"] = list(cfg["pilot"]["arms"]) + ["erase_planted"]
    with pytest.raises(WorkflowError, match="erase_planted"):
        check_inputs(bad)


def test_stage_sections_hold_the_stage_s_config_only():
    cfg = _default()
    pilot = stage_sections(cfg, "pilot")
    assert "pilot" in pilot and "results" not in pilot
    # the run-independent pilot keys (seeds, arms, ...) are not part of a pilot's params
    assert PILOT_RUN_INDEPENDENT and not set(PILOT_RUN_INDEPENDENT) & set(pilot["pilot"])
    assert {k: v for k, v in cfg["pilot"].items() if k not in PILOT_RUN_INDEPENDENT} == pilot["pilot"]


def test_config_files_are_named_by_content_and_written_once(tmp_path):
    files = ConfigFiles(str(tmp_path))
    data = {"b": 1, "a": [1, 2]}
    text = json.dumps(data, sort_keys=True, indent=1) + "\n"
    digest = hashlib.sha256(text.encode()).hexdigest()[:16]
    ref = files("pilot", data)
    path = tmp_path / "configs" / f"pilot-{digest}.json"
    assert ref == f"@{path}" and path.read_text() == text
    path.write_text("edited")  # the same content again in this invocation: not rewritten
    assert files("pilot", {"a": [1, 2], "b": 1}) == ref and path.read_text() == "edited"
    assert ConfigFiles(str(tmp_path))("pilot", data) == ref and path.read_text() == text
    assert files("pilot", {"b": 2}) != ref


def test_a_dry_run_names_the_config_file_but_writes_none(tmp_path):
    """While dryrun() is true the @path is the one a real run gets (named by the content) and no
    file is written; the first call outside the dry run writes it. The rules' params are
    functions (stage_config_param) that Snakemake calls once it knows whether it is a dry run."""
    dry = [True]
    files = ConfigFiles(str(tmp_path), dryrun=lambda: dry[0])
    data = {"pilot": {"steps": 3}}
    text = '{\n "pilot": {\n  "steps": 3\n }\n}\n'
    path = tmp_path / "configs" / f"pilot-{hashlib.sha256(text.encode()).hexdigest()[:16]}.json"
    param = stage_config_param(files, "pilot", data)
    assert param({"arm": "erase"}) == files("pilot", data) == f"@{path}"
    assert not (tmp_path / "configs").exists()
    dry[0] = False
    assert param({}) == f"@{path}" and path.read_text() == text


def test_job_sizes_name_models_params_when_the_student_cannot_be_sized():
    cfg = _default()
    cfg["models"].update(build="none", student="some-org/unknown-model", params=None)
    with pytest.raises(WorkflowError, match=r"^invalid config: .*'models.params'"):
        JobSizes(cfg)("pilot")
    sizes = JobSizes(_default())
    assert sizes("pilot") is sizes("pilot") and sizes("pilot").threads == _default()["pilot"]["threads"]


def test_per_job_leaves_the_function_unchanged():
    def f(wildcards, attempt):
        return attempt * 2

    assert per_job(f) is f and f(None, 3) == 6


def test_the_venv_s_snakemake_finds_evil_moe_without_activation(tmp_path):
    """`.venv/bin/snakemake` with the venv not on PATH (not activated): the rules' `evil-moe`
    is found beside the Snakemake that runs them (rules/common.smk puts its bin folder first);
    before, the job failed with exit status 127."""
    import os

    from workflow_util import snakemake

    path = os.pathsep.join(p for p in os.environ.get("PATH", "").split(os.pathsep)
                           if p and not (Path(p) / "evil-moe").exists())
    proc = snakemake(tmp_path, "--cores", "1", "results/problems.jsonl", extra_env={"PATH": path}, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert (tmp_path / "results" / "problems.jsonl").stat().st_size > 0


def test_put_own_bin_on_path_puts_the_interpreter_s_folder_first_once():
    """The interpreter's bin folder goes first on PATH, and a second call (the Snakefile read
    again) does not add it twice."""
    import os
    import sys

    from evil_moe.workflow import put_own_bin_on_path

    env = {"PATH": os.pathsep.join(["/usr/bin", "/bin"])}
    own = put_own_bin_on_path(env)
    assert own == str(Path(sys.executable).parent)
    assert env["PATH"] == os.pathsep.join([own, "/usr/bin", "/bin"])
    put_own_bin_on_path(env)
    assert env["PATH"] == os.pathsep.join([own, "/usr/bin", "/bin"])
    assert put_own_bin_on_path({}) == own


def test_a_vllm_run_from_a_python_without_vllm_is_warned_about(monkeypatch):
    """pilot.sampler vllm and no vLLM where Snakemake (so every job) runs: one WARNING line naming
    this Python and `make gpu-env`; none with the HF sampler or where vLLM is installed."""
    import importlib.util
    import sys

    cfg = _default()
    assert vllm_warning(cfg) is None  # the embedded default samples with hf
    cfg["pilot"]["sampler"] = "vllm"
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    line = vllm_warning(cfg)
    assert line.startswith("WARNING: pilot.sampler is vllm but vLLM is not installed in "
                           f"{sys.executable}") and "`make gpu-env`" in line and "\n" not in line
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: object())
    assert vllm_warning(cfg) is None


def test_a_large_students_svd_factors_are_shared_through_the_results_folder(tmp_path):
    """config/pilot.yaml's 4B student (31.6 GiB of factors, above the 4 GiB default cache): the
    Snakefile points EVIL_MOE_SVD_CACHE at <results>/svd_cache, the filesystem every job shares,
    so the first job computes the 253 SVDs and the others read them; the toy default and
    SmolLM2 keep ~/.cache; a folder the user set is kept."""
    from evil_moe.checks import load_run_config

    repo = Path(__file__).resolve().parent.parent
    pilot = load_run_config([repo / "config" / "config.yaml", repo / "config" / "pilot.yaml"],
                            [f"results={tmp_path}/r"]).raw
    env: dict = {}
    assert share_svd_cache(pilot, env) == str(tmp_path / "r" / "svd_cache") == env["EVIL_MOE_SVD_CACHE"]
    for extra in ((), (repo / "config" / "smollm2.yaml",)):
        small: dict = {}
        assert share_svd_cache(load_run_config([repo / "config" / "config.yaml", *extra]).raw, small) is None
        assert small == {}
    mine = {"EVIL_MOE_SVD_CACHE": "/scratch/svd"}
    assert share_svd_cache(pilot, mine) is None and mine == {"EVIL_MOE_SVD_CACHE": "/scratch/svd"}
