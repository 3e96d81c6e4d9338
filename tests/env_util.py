"""Helpers shared by the environment's tests."""

import contextlib
import dataclasses
import subprocess
import sys
import time

from evil_moe.env.problems import load_problems

# The toy's `add` problem: a right and a wrong answer, and the model's own tests of it.
ADD = "class Solution:\n    def add(self, a, b):\n        return a + b\n"
ADD_WRONG = "class Solution:\n    def add(self, a, b):\n        return 0\n"
RUN_TESTS = "\ndef run_tests():\n    assert Solution().add(1, 2) == 3\n"


def add_problem(mode="run_tests"):
    """The toy bank's ``toy/add`` problem graded in loophole ``mode``."""
    p = next(p for p in load_problems("toy") if p.id == "toy/add")
    return dataclasses.replace(p, mode=mode)


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
