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
