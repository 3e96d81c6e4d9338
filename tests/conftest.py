"""Session-wide test settings."""

import atexit
import os
import shutil
import tempfile
from pathlib import Path

# The on-disk SVD cache (evil_moe.stages.common.svd_cache_dir) in one fresh folder per test
# session, inherited by every subprocess (CLI, Snakemake jobs), removed at the end.
_SVD = tempfile.mkdtemp(prefix="evil_moe_svd_")
os.environ["EVIL_MOE_SVD_CACHE"] = _SVD
atexit.register(shutil.rmtree, _SVD, ignore_errors=True)


import pytest  # noqa: E402


@pytest.fixture(autouse=True)
def _torch_threads_restored():
    """Torch's thread count after each test is what it was before: a test that changes it (an
    in-process CLI applying a stage's ``threads``) would otherwise change the float reduction
    order, and so the numbers, of the tests after it on the same xdist worker."""
    import sys

    torch = sys.modules.get("torch")
    before = torch.get_num_threads() if torch is not None else None
    yield
    if before is not None and torch.get_num_threads() != before:
        torch.set_num_threads(before)


@pytest.fixture(scope="session")
def one_thread():
    """Tiny models on a busy 2-core machine: one torch thread is ~10x faster than two."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def _shared_tmp(tmp_path_factory, request) -> Path:
    """The session's temporary folder that every xdist worker sees (a worker's own basetemp is
    popen-gwN inside it); without xdist, the basetemp."""
    base = tmp_path_factory.getbasetemp()
    return base.parent if hasattr(request.config, "workerinput") else base


@pytest.fixture(scope="session")
def world(tmp_path_factory, request, one_thread):
    """The tiny toy world of tests/stage_fixtures.py, built once per session and shared by the
    xdist workers (the first to ask builds it under a lock; stage_fixtures.shared_world)."""
    from stage_fixtures import shared_world

    return shared_world(_shared_tmp(tmp_path_factory, request) / "toy_world")


@pytest.fixture(scope="session")
def toy_run(tmp_path_factory, request):
    """One finished local run of the toy workflow (tests/config/ci.yaml, CI sizes) per test
    session, ``(working folder, CompletedProcess)``, shared by the pytest-xdist workers (xdist's
    recipe for a session fixture made once: a lock in the workers' common temporary folder):
    tests/test_workflow_e2e.py checks it and tests/test_workflow_slurm.py compares its Slurm
    runs' numbers with it. Tests read it (the report test adds report.html; nothing else writes).
    """
    from workflow_util import toy_run_once

    return toy_run_once(_shared_tmp(tmp_path_factory, request))


@pytest.fixture(scope="session")
def smollm2_ci(tmp_path_factory, request):
    """The smallest real-model run's working folder with SmolLM2-135M-Instruct converted by the
    workflow's convert_smollm2 rule, ``(folder, config files)``, made once per session and shared
    by the xdist workers (:func:`workflow_util.smollm2_ci_once`): tests/test_stage_models.py reads
    the converted model, tests/test_workflow_smollm2.py runs the rest of the workflow there."""
    from workflow_util import smollm2_ci_once

    return smollm2_ci_once(_shared_tmp(tmp_path_factory, request))


def pytest_collection_modifyitems(config, items):
    _opt_in_realmodel(config, items)
    _long_modules_first(items)


def _opt_in_realmodel(config, items):
    """Tests marked ``realmodel`` (the real pretrained model through every stage, ~20 min) run
    only when asked for by name: ``pytest -m realmodel``. Plain ``pytest`` and ``make test`` skip
    them, saying how to run them."""
    if "realmodel" in (config.getoption("markexpr") or ""):
        return
    skip = pytest.mark.skip(reason="real-model end to end (~20 min): opt in with -m realmodel")
    for item in items:
        if item.get_closest_marker("realmodel"):
            item.add_marker(skip)


def _long_modules_first(items):
    """Long modules first: those whose every test is marked slow or slurm (the end-to-end
    workflows; the Slurm one, the longest, before the others), then those with some slow test,
    then the rest; within each group, modules with more slow tests first (the shared toy run's
    module before a one-test module), then file order. With ``make test``'s ``-n 3 --dist loadscope
    --no-loadscope-reorder`` each xdist worker starts on one of the long modules and the short
    ones fill in around them (xdist's own reorder, by test count, started the two longest
    modules last)."""
    def long(item):
        return any(item.get_closest_marker(m) for m in ("slow", "slurm"))

    by_module: dict[str, list[bool]] = {}
    slurm: set[str] = set()
    for item in items:
        module = item.nodeid.split("::")[0]
        by_module.setdefault(module, []).append(long(item))
        if item.get_closest_marker("slurm"):
            slurm.add(module)
    rank = {m: (0 if all(v) else 1 if any(v) else 2, m not in slurm, -sum(v))
            for m, v in by_module.items()}
    items.sort(key=lambda item: rank[item.nodeid.split("::")[0]])
