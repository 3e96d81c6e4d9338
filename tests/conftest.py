"""Session-wide test settings."""

import atexit
import os
import shutil
import tempfile

# The on-disk SVD cache (evil_moe.stages.common.svd_cache_dir) in one fresh folder per test
# session, inherited by every subprocess (CLI, Snakemake jobs), removed at the end.
_SVD = tempfile.mkdtemp(prefix="evil_moe_svd_")
os.environ["EVIL_MOE_SVD_CACHE"] = _SVD
atexit.register(shutil.rmtree, _SVD, ignore_errors=True)


import pytest  # noqa: E402


@pytest.fixture(scope="session")
def one_thread():
    """Tiny models on a busy 2-core machine: one torch thread is ~10x faster than two."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="session")
def world(tmp_path_factory, one_thread):
    """The tiny toy world of tests/stage_fixtures.py, built once per session."""
    from stage_fixtures import build_world

    return build_world(tmp_path_factory.mktemp("toy_world"))


def pytest_collection_modifyitems(config, items):
    """Long modules first: those whose every test is marked slow or slurm (the end-to-end
    workflows), then those with some slow test, then the rest; file order within each group.
    With ``make test``'s ``--dist loadscope --no-loadscope-reorder`` each xdist worker starts on
    one of the long modules and the short ones fill in around them (xdist's own reorder, by test
    count, started the two longest modules last)."""
    def long(item):
        return any(item.get_closest_marker(m) for m in ("slow", "slurm"))

    by_module: dict[str, list[bool]] = {}
    for item in items:
        by_module.setdefault(item.nodeid.split("::")[0], []).append(long(item))
    rank = {m: 0 if all(v) else 1 if any(v) else 2 for m, v in by_module.items()}
    items.sort(key=lambda item: rank[item.nodeid.split("::")[0]])
