"""The HTML report's first page: the verdict, the comparison figure and the per-arm table, inline.

Snakemake's report renders ``report/workflow.rst`` (reStructuredText through docutils) as its
first page; that page includes ``results/sweep/decision.rst``, which rule ``sweep_decision``
writes with :func:`front_page_rst` from the comparison's outputs:

1. the verdict sentence (``compare/gate.json``) and the sweep decision (text from
   ``rules/common.smk``),
2. the comparison figure, embedded as a data URI (the report is one self-contained file; a path
   would only work next to ``results/``, and Snakemake's ``embeddedfigure`` directive renders an
   SVG as such a path),
3. the per-arm summary (``compare/summary.tsv``) as a table, every column of the file.
"""

from __future__ import annotations

import base64
import csv
import math
from pathlib import Path

MIME = {".svg": "image/svg+xml", ".png": "image/png"}


def _cell(value: str) -> str:
    """A TSV value for the page: numbers to 3 decimals, empty as a dash, RST-safe text."""
    if value == "":
        return "–"
    try:
        x = float(value)
    except ValueError:
        text = value.replace("|", "/").replace("*", r"\*").replace("`", r"\`")
        return text[:-1] + r"\_" if text.endswith("_") else text  # not a reference
    if not math.isfinite(x):
        return value
    return value if x.is_integer() and "." not in value else f"{x:.3f}"


def table_rst(tsv: str | Path, title: str) -> str:
    """A ``list-table`` of every row and column of a TSV file (header row = the file's header).

    Raises:
        FileNotFoundError: the file is missing. ValueError: it has no header.
    """
    with open(tsv, newline="") as fh:
        rows = list(csv.reader(fh, delimiter="\t"))
    if not rows or not rows[0]:
        raise ValueError(f"{tsv}: no header row")
    lines = [f".. list-table:: {title}", "   :header-rows: 1", ""]
    for i, row in enumerate(rows):
        cells = [_cell(c) for c in row]
        cells += ["–"] * (len(rows[0]) - len(cells))
        lines.append(f"   * - {cells[0]}")
        lines += [f"     - {c}" for c in cells[1:]]
    return "\n".join(lines)


def front_page_rst(verdict: str, decision: str, figure: str | Path, caption: str,
                   summary: str | Path) -> str:
    """The first page's reStructuredText.

    Args:
        verdict: the verdict line (``**Verdict: ...** sentence``), shown first.
        decision: the gate criteria and the sweep decision (reStructuredText), shown last.
        figure: the comparison figure (``.svg`` or ``.png``), embedded as a data URI.
        caption: the figure's caption (one paragraph).
        summary: ``compare/summary.tsv``; every column is shown.

    Raises:
        FileNotFoundError: the figure or the summary is missing. ValueError: a figure that is
            neither SVG nor PNG.
    """
    figure = Path(figure)
    if not figure.is_file():
        raise FileNotFoundError(f"figure not found: {figure}")
    if figure.suffix not in MIME:
        raise ValueError(f"figure {figure}: expected one of {sorted(MIME)}")
    uri = f"data:{MIME[figure.suffix]};base64,{base64.b64encode(figure.read_bytes()).decode()}"
    caption = " ".join(caption.split())
    parts = [
        verdict.strip(),
        # the URI split into 76-character lines (docutils joins them and refuses lines over
        # 10,000 characters)
        ".. figure:: " + "\n   ".join(uri[i:i + 76] for i in range(0, len(uri), 76))
        + f"\n   :width: 80%\n   :alt: {figure.name}\n\n   {caption}",
        table_rst(summary, f"Per arm and view (``{Path(summary).name}``)"),
        decision.strip(),
    ]
    return "\n\n".join(p for p in parts if p) + "\n"


def write_front_page(out: str | Path, **kwargs) -> str:
    """Write :func:`front_page_rst` to ``out`` atomically; returns the text."""
    from evil_moe.tables import atomic_write_bytes

    text = front_page_rst(**kwargs)
    atomic_write_bytes(out, text.encode())
    return text
