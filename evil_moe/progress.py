"""Progress bars for the stages' logs (tqdm).

Every stage that runs longer than a few seconds shows a bar on stderr, which Snakemake's rule
sends to the job's log (``results/logs/...``): ``tail -f`` it to follow a long stage. A log is
not a terminal, so each refresh is a new line's worth of text; :data:`MININTERVAL` seconds
between refreshes keep a 20-minute stage to about a hundred lines.

Imports nothing of the package (any floor may use it).
"""

from __future__ import annotations

import sys

MININTERVAL = 10.0  # seconds between two refreshes of a bar in a log


def bar(total: int | None, desc: str, unit: str, *, initial: int = 0, mininterval: float = MININTERVAL):
    """A tqdm bar on stderr: ``desc`` (``"<stage>: <phase>"``), ``total`` units of ``unit``,
    refreshed at most every ``mininterval`` seconds, plain ASCII (logs are read with ``less``).
    Use it as a context manager and call ``.update(n)``; it prints its final state on close.

    Args:
        total: the units the phase will count (None: unknown, a counter without percentage).
        desc: the label, e.g. ``"distill: steps"``.
        unit: the unit's name, e.g. ``"step"`` or ``"completion"``.
        initial: units already done (a resumed phase).
        mininterval: seconds between refreshes.
    """
    from tqdm import tqdm

    return tqdm(total=total, desc=desc, unit=unit, initial=initial, file=sys.stderr,
                mininterval=mininterval, ascii=True, dynamic_ncols=False, ncols=100)
