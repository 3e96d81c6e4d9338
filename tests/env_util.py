"""Helpers shared by the environment's tests."""

import contextlib
import subprocess
import sys
import time


@contextlib.contextmanager
def cpu_burners(n=2):
    """``n`` busy-looping child processes for the duration of the block: load on the machine,
    so a test can check that the grader's limits count CPU time, not wall time."""
    procs = [subprocess.Popen([sys.executable, "-c", "while True:\n    pass\n"]) for _ in range(n)]
    try:
        time.sleep(0.2)
        yield
    finally:
        for p in procs:
            p.kill()
            p.wait()
