"""The ``evil-moe`` command line (evil_moe/cli/): every command answers --help (without importing
torch), every command that reads the config names a wrong key, every command the workflow runs
exists, the pilot's bad inputs are one-line errors, and the teacher's own rollouts give v_hack
through it (the later stages' commands run in the workflow tests).
"""

from __future__ import annotations

import gzip
import json
import re
import subprocess
import sys
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from evil_moe.cli import main
from stage_fixtures import evil_moe_cmd, set_flags, subprocess_env

REPO = Path(__file__).resolve().parent.parent

# tiny models on a busy 2-core machine: one torch thread (the conftest fixture)
pytestmark = pytest.mark.usefixtures("one_thread")

# every subcommand of evil_moe/cli/, and those that take --config/--config-json/--set
COMMANDS = {"problems", "toy-models", "convert-smollm2", "teacher", "make-teacher", "extract",
            "planted-vhack", "planted-checks", "distill", "pilot", "compare", "detector-sweep",
            "front-page", "grade", "install-profiles", "slurm-check", "cancel-run", "reevaluate",
            "calibrate", "audit", "readme-figure", "verdict"}
CONFIG_COMMANDS = {"problems", "toy-models", "teacher", "make-teacher", "extract", "planted-vhack",
                   "planted-checks", "distill", "pilot", "compare", "detector-sweep", "reevaluate",
                   "calibrate", "audit"}


def test_every_command_answers_help():
    assert set(main.commands) == COMMANDS
    for name in sorted(COMMANDS):
        res = CliRunner().invoke(main, [name, "--help"])
        assert res.exit_code == 0, (name, res.output)
        assert f" {name} [OPTIONS]" in res.output.splitlines()[0], (name, res.output)


def test_help_does_not_import_torch():
    """`evil-moe pilot --help` (which lists the arms) stays cheap: no torch import."""
    code = ("import sys\nfrom click.testing import CliRunner\nfrom evil_moe.cli import main\n"
            "for c in ('pilot', 'grade', 'compare'):\n"
            "    assert CliRunner().invoke(main, [c, '--help']).exit_code == 0\n"
            "print(sorted(m for m in ('torch', 'transformers') if m in sys.modules))")
    res = subprocess.run([sys.executable, "-c", code], env=subprocess_env(), capture_output=True,
                         text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == "[]"


def test_every_command_the_workflow_runs_exists():
    used = set()
    for smk in sorted((REPO / "rules").glob("*.smk")):
        used |= set(re.findall(r'"evil-moe ([a-z0-9-]+)', smk.read_text()))
    assert {"problems", "teacher", "extract", "distill", "pilot", "compare"} <= used
    assert used <= set(main.commands)


def _config_commands():
    return sorted(n for n, c in main.commands.items() if any(p.name == "overrides" for p in c.params))


def _required_args(cmd, path: Path) -> list[str]:
    """Placeholder values for the command's required options (``path``, an existing file, for a
    file; a folder beside it that does not exist, for a folder)."""
    args = []
    for p in cmd.params:
        if isinstance(p, click.Option) and p.required:
            if isinstance(p.type, click.Choice):
                value = p.type.choices[0]
            elif isinstance(p.type, click.Path):  # a folder that does not exist yet, or the file
                value = str(path.parent / "out") if not p.type.file_okay else str(path)
            elif p.type is click.INT:
                value = "0"
            else:
                value = "x=y"
            args += [p.opts[0], value]
    return args


@pytest.mark.parametrize("name", sorted(CONFIG_COMMANDS))
def test_a_wrong_config_key_fails_naming_it(name, tmp_path):
    """Before any work: a misspelt key (--set or --config-json) and a wrong-typed value are a
    usage error (exit 2) whose one line names the key."""
    assert _config_commands() == sorted(CONFIG_COMMANDS)
    dummy = tmp_path / "dummy"
    dummy.write_text("")
    cmd = main.commands[name]
    base = [name, *_required_args(cmd, dummy)]
    for extra, shown in ((["--set", "pilot.stepz=3"], "unknown config key 'pilot.stepz'"),
                         (["--config-json", '{"vhack": {"kk": 1}}'], "unknown config key 'vhack.kk'"),
                         (["--set", "pilot.steps=many"], "config key 'pilot.steps': expected integer")):
        res = CliRunner().invoke(main, base + extra)
        assert res.exit_code == 2, (name, extra, res.output)
        assert shown in res.output, (name, extra, res.output)
        assert sorted(p.name for p in tmp_path.iterdir()) == ["dummy"]  # nothing written


def test_pilot_cli_bad_inputs_are_one_line_errors(world, tmp_path):
    """A missing v_hack is named before any model loads and leaves no output folder; a bad model
    path is one clear error line, not a traceback."""
    from click.testing import CliRunner

    from evil_moe.cli import main

    out = tmp_path / "p"
    base = ["pilot", *set_flags(), "--problems", str(world.problems), "--arm", "erase",
            "--seed", "0", "--out-dir", str(out)]
    r = CliRunner().invoke(main, base + ["--model", str(world.student), "--vhack", "/nope/v.safetensors"])
    assert r.exit_code == 1 and "v_hack not found: /nope/v.safetensors" in r.output
    assert not out.exists()
    r = CliRunner().invoke(main, base + ["--model", str(tmp_path / "no_model"), "--vhack", str(world.vhack)])
    assert r.exit_code == 1 and r.output.startswith("Error:") and "Traceback" not in r.output


def _cli(args, cwd: Path) -> str:
    res = subprocess.run([*evil_moe_cmd(), *args], cwd=str(cwd), env=subprocess_env(),
                         capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, f"{args[0]} failed:\n{res.stdout}\n{res.stderr}"
    return res.stdout


@pytest.mark.slow
def test_teacher_rollouts_to_v_hack_through_the_cli(tmp_path):
    """problems -> toy-models -> teacher -> extract by hand through the CLI, with the default
    vhack.source (teacher): a longer-trained toy teacher than the fixture's, so that its own
    rollouts hold (hack, clean) pairs for extract (the stage fixture and the workflow tests use
    template rows instead). The later stages' commands (distill, pilot, compare) run in the
    workflow's own local run: tests/test_workflow_e2e.py checks them there."""
    from evil_moe.rl.vhack.direction import VHack

    s = set_flags("toy.train_steps=150", "toy.lr=0.01", "toy.batch_size=16")
    r = tmp_path
    _cli(["problems", *s, "--out", "problems.jsonl"], r)
    s = s + ["--threads", "1"]
    # only the teacher needs the longer training (its rollouts must hack); extract's student
    # is the fixtures' half-trained one (base sizes), a fifth of the teacher's NLL work
    _cli(["toy-models", *s, "--problems", "problems.jsonl", "--out-dir", "models",
          "--which", "teacher"], r)
    _cli(["toy-models", *set_flags(), "--threads", "1", "--problems", "problems.jsonl",
          "--out-dir", "models", "--which", "student"], r)
    _cli(["teacher", *s, "--problems", "problems.jsonl", "--model", "models/teacher",
          "--out-dir", "teacher"], r)
    _cli(["extract", *s, "--problems", "problems.jsonl", "--rollouts", "teacher/rollouts.jsonl.gz",
          "--model", "models/student", "--out-dir", "vhack"], r)
    with gzip.open(r / "teacher" / "rollouts.jsonl.gz", "rt") as fh:
        recs = [json.loads(line) for line in fh]
    assert len(recs) == 8 * 4  # 8 training problems (12, 1/3 held out) x teacher.n 4
    v = VHack.load(r / "vhack" / "main_hack.safetensors")
    assert v.meta["source"] == "teacher" and v.n_pairs >= 1, (v.meta, v.n_pairs)
    # the pairs come from the teacher's own graded rollouts: an extraction problem with a hack
    # and a non-hack among them (extract.build_pairs)
    hacks = {str(x["problem_id"]) for x in recs if x["exploited"]}
    others = {str(x["problem_id"]) for x in recs if not x["exploited"]}
    assert hacks & others & set(v.meta["extraction_problems"]), (hacks, others, v.meta)
