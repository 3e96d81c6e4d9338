"""Stage ``problems``: the problem set with a loophole mode per problem → ``results/problems.jsonl``.

Reads the source named by ``problems.source`` (the project's toy bank, a LeetCode JSONL file in
the rl-rewardhacking format, or HumanEval), assigns loophole modes evenly and deterministically
from ``problems.seed`` (or forces ``problems.force_mode``), applies each mode's hint, and writes
one JSON record per problem. Every later stage reads this file, so all of them agree on modes.
"""

from __future__ import annotations

from pathlib import Path

from evil_moe.config import Config


def problems_from_config(cfg: Config) -> list:
    """Load the configured problem set with modes and hints applied.

    Raises:
        FileNotFoundError: ``problems.source == "leetcode"`` and ``problems.path`` is missing
            or unset (names the path).
    """
    from evil_moe.env.loopholes import RUN_TESTS_NAMES
    from evil_moe.env.problems import load_problems

    pc = cfg.problems
    if pc.source == "leetcode":
        if not pc.path:
            raise FileNotFoundError("problems.source is leetcode but 'problems.path' is not set")
        if not Path(pc.path).is_file():
            raise FileNotFoundError(f"problems.path not found: {pc.path}")
    names = RUN_TESTS_NAMES if pc.varied_names else ("run_tests",)
    return load_problems(pc.source, pc.path, modes=tuple(pc.modes), mode=pc.force_mode,
                         seed=pc.seed, run_tests_names=names, limit=pc.limit,
                         toy_bank=pc.toy_bank, toy_bank_size=pc.toy_bank_size)


def write_problem_set(cfg: Config, out: str) -> list:
    """Write ``out`` (JSONL, atomically) from the config; returns the problems.

    Raises:
        FileNotFoundError: see :func:`problems_from_config`.
    """
    from evil_moe.env.problems import write_problems

    problems = problems_from_config(cfg)
    write_problems(out, problems)
    return problems
