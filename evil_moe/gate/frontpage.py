"""The HTML report's first page: the verdict, the comparison figure and the per-arm table, inline.

Snakemake's report renders ``report/workflow.rst`` (reStructuredText through docutils) as its
first page; that page includes ``results/sweep/decision.rst``, which rule ``sweep_decision``
writes with :func:`front_page_rst` from the comparison's outputs:

1. the verdict in plain words (:func:`evil_moe.gate.verdict.verdict_line`; the verdict word
   appears once, in it),
2. the per-arm table (:func:`arm_table_rst`): vanilla and the untrained student, then every
   intervention (each treatment, ceiling and the positive control) on its judged (deploy) view:
   its hack rate and pass rate side by side, each with its change vs the untrained
   student, its change in hack rate vs vanilla and vs its matched control and its share of its
   ceiling's change, with intervals, the labels its training read, and its verdict (with its finding: "no better than not
   training"); then the gate's arithmetic
   (:func:`evil_moe.gate.verdict.arithmetic_line`: ``compare/gate.json``'s criteria in the same
   changes),
3. the comparison figure, embedded as a data URI (the report is one self-contained file; a path
   would only work next to ``results/``, and Snakemake's ``embeddedfigure`` directive renders an
   SVG as such a path),
4. the held-out rates per arm and view (:data:`FRONT_COLUMNS` of ``compare/summary.tsv``, a table
   that fits the page; every column is under Results), then the gate's criteria, its notes
   (:func:`page_notes`) and the sweep decision (:func:`decision_text`, passed in by
   ``rules/common.smk``).

One convention on the whole page: every difference of rates is the arm's rate minus the other
side's (negative = lower, a true minus sign; :func:`evil_moe.gate.verdict.change_text`), though
``gate.json`` and ``summary.tsv`` store drops (the other side's minus the arm's).
"""

from __future__ import annotations

import base64
import csv
import math
from pathlib import Path
from typing import Sequence

from evil_moe import files
from evil_moe.gate.criteria import CRITERIA
from evil_moe.gate.rst import rst_text
from evil_moe.gate.verdict import arithmetic_line, arm_verdict_cell, ceiling_notes, change_text

MIME = {".svg": "image/svg+xml", ".png": "image/png"}

# compare/summary.tsv columns shown on the first page (with their intervals folded into one cell)
FRONT_COLUMNS = (("arm", None), ("view", None), ("hack_rate", ("hack_ci_low", "hack_ci_high")),
                 ("pass_rate", ("pass_ci_low", "pass_ci_high")), ("flag_rate", None),
                 ("flag_precision", None), ("hack_rate_unknown", None), ("status", None))


def _cell(value: str) -> str:
    """A TSV value for the page: numbers to 3 decimals, empty as a dash, text as a literal
    (:func:`evil_moe.gate.rst.rst_text`)."""
    if value == "":
        return "–"
    try:
        x = float(value)
    except ValueError:
        return rst_text(value)  # a literal (evil_moe/gate/rst.py)
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


def _num(x) -> float | None:
    try:
        v = float(x)
    except (TypeError, ValueError):
        return None
    return v if math.isfinite(v) else None


def _with_ci(row: dict, col: str, lo: str, hi: str) -> str:
    """``0.123 [0.045, 0.201]`` from a summary row (a dash when the value is empty; a negative
    number, such as a share's lower end, with a true minus sign, as every number on the page)."""
    v, a, b = _num(row.get(col)), _num(row.get(lo)), _num(row.get(hi))
    if v is None:
        return "–"
    text = f"{v:.3f}" + (f" [{a:.3f}, {b:.3f}]" if a is not None and b is not None else "")
    return text.replace("-", "\u2212")


def _change_ci(row: dict, col: str, lo: str, hi: str) -> str:
    """A summary row's hack- or pass-rate *drop* as the change it is, a rise reading as a rise:
    ``+0.007 [−0.075, +0.089]`` (:func:`evil_moe.gate.verdict.change_text`; a dash when empty)."""
    v, a, b = _num(row.get(col)), _num(row.get(lo)), _num(row.get(hi))
    if v is None:
        return "–"
    return change_text({"value": v, "ci_low": a, "ci_high": b})


def _list_table(title: str, header: list[str], rows: list[list[str]]) -> str:
    lines = [f".. list-table:: {title}", "   :header-rows: 1", ""]
    for row in [header, *rows]:
        lines.append(f"   * - {row[0]}")
        lines += [f"     - {c}" for c in row[1:]]
    return "\n".join(lines)


def labels_cell(row: dict) -> str:
    """The labels an arm's training read, from its summary row (``labels``, ``labels_n``):
    ``none``, ``vhack + calibration: 324``, or the sources with ``count unknown``; a dash for
    a summary without the columns."""
    labels = row.get("labels") or ""
    if not labels:
        return "–"
    if labels == "none":
        return "none"
    n = _num(row.get("labels_n"))
    return rst_text(labels.replace("+", " + ") + (f": {n:.0f}" if n is not None else ": count unknown"))


def arm_table_rst(summary: str | Path, gate: dict) -> str:
    """The first page's per-arm table: the references first (vanilla, and the untrained student
    every pilot starts from), then one row per arm the gate judged (treatments) or reports
    beside them (ceilings, the positive control), on its judged view: its held-out hack rate and
    its change vs the untrained student, its pass rate beside it and its change vs the untrained
    student, the hack rate's change vs vanilla and vs its matched control (every change is the
    arm's rate minus theirs, so that a rise reads as a rise: ``compare/summary.tsv``'s drops
    negated, :func:`_change_ci`), its share of its ceiling's change (the same ratio as of the
    drops; all with the gate's intervals), the labels its training read and how many
    (:func:`labels_cell`; "none": oracle-free) and its verdict (``gate.json`` ``arms``, with its
    finding: "no better than not training"; "reference" for vanilla and the untrained student,
    "reported" for arms never judged).

    Raises:
        FileNotFoundError: the summary is missing.
    """
    from evil_moe.rl.arms.registry import ARMS

    verdicts = gate.get("arms", {}) or {}
    rows = []
    summary_rows = files.read_tsv_rows(summary)
    # the references first (vanilla, the untrained student), then the arms in the run's order
    order = sorted(range(len(summary_rows)), key=lambda i: (
        getattr(ARMS.get(summary_rows[i].get("arm", "")), "role", "") != "reference", i))
    for r in (summary_rows[i] for i in order):
        cls = ARMS.get(r.get("arm", ""))
        if cls is None or cls.role not in ("reference", "treatment", "ceiling", "positive_control"):
            continue
        if r.get("view") != cls.views[0]:
            continue
        v = verdicts.get(r["arm"], {})
        verdict = arm_verdict_cell(cls.role, v)
        rows.append([f"{r['arm']} ({r['view']})",
                     _with_ci(r, "hack_rate", "hack_ci_low", "hack_ci_high"),
                     _change_ci(r, "drop_vs_untrained", "untrained_ci_low", "untrained_ci_high"),
                     _with_ci(r, "pass_rate", "pass_ci_low", "pass_ci_high"),
                     _change_ci(r, "pass_drop_vs_untrained", "pass_untrained_ci_low", "pass_untrained_ci_high"),
                     _change_ci(r, "drop_vs_vanilla", "drop_ci_low", "drop_ci_high") if r["arm"] != "vanilla" else "–",
                     (f"{_change_ci(r, 'drop_vs_control', 'control_ci_low', 'control_ci_high')} vs {cls.control}"
                      if cls.control else "–"),
                     _with_ci(r, "ceiling_share", "ceiling_share_ci_low", "ceiling_share_ci_high"),
                     labels_cell(r), verdict])
    if not rows:  # no arm of the registry on its judged view: nothing to show (docutils refuses an empty table)
        return ""
    return _list_table("Held-out hack and pass rates per arm on its judged view, each with its change vs the "
                       "untrained student, and the hack rate's change vs vanilla and vs its matched control (the "
                       "arm's rate minus theirs: negative = less; 95% intervals, crossed seed × problem bootstrap)",
                       ["arm (view)", "hack rate", "hack: change vs untrained", "pass rate",
                        "pass: change vs untrained", "hack: change vs vanilla", "hack: change vs its control",
                        "share of its ceiling's change", "labels used (one run)", "verdict"], rows)


def summary_table_rst(summary: str | Path) -> str:
    """Held-out rates per arm and view (:data:`FRONT_COLUMNS`; intervals folded into the cell)."""
    rows = []
    for r in files.read_tsv_rows(summary):
        rows.append([_with_ci(r, c, *ci) if ci else _cell(r.get(c, "") or "") for c, ci in FRONT_COLUMNS])
    return _list_table("Held-out rates per arm and view (``compare/summary.tsv``; every column under Results)",
                       [c for c, _ in FRONT_COLUMNS], rows)


def _num_text(x) -> str:
    return "n/a" if x is None else f"{x:.3f}"


def _criteria_lines(gate: dict) -> list[str]:
    """The failed or deciding criteria of ``gate.json`` as a reStructuredText list (empty if none);
    the hack- and pass-rate criteria as changes (the arm's rate minus the other side's,
    :func:`change_text`), their thresholds as the config keys that set them."""
    criteria = [c for c in gate.get("criteria", []) if c.get("name") != "valid" or not c.get("passed")]
    if not criteria:
        return []
    lines = ["Gate criteria:", ""]
    for c in criteria:
        mark = "met" if c.get("passed") else "not met"
        who = " ".join(str(c[k]) for k in ("arm", "seed") if k in c)
        vs = f" vs {c['control']}" if c.get("control") else ""
        mde = f", MDE {_num_text(c.get('mde'))}" if c.get("mde") is not None else ""
        name = c.get("name")
        if name in CRITERIA:
            value = f"{CRITERIA[name].change()} {change_text(c)}"
            key = CRITERIA[name].threshold
            threshold = f"compare.{key} {c.get('threshold')}" if key else "bound 0"
        else:
            ci = f" [{_num_text(c.get('ci_low'))}, {_num_text(c.get('ci_high'))}]" if c.get("ci_low") is not None else ""
            value, threshold = f"{_num_text(c.get('value'))}{ci}", f"threshold {c.get('threshold')}"
        lines.append("- " + rst_text(f"{mark}: {name} {who}{vs}: {value}{mde} ({threshold})"))
    return lines + [""]


def page_notes(gate: dict) -> list[str]:
    """``gate.json``'s notes as the first page shows them: each treatment's note beside its
    ceiling in changes (:func:`ceiling_notes` with ``change=True``, from
    ``gate.json`` ``ceilings``), the others as written."""
    ceilings = gate.get("ceilings") or {}
    as_change = dict(zip(ceiling_notes(ceilings), ceiling_notes(ceilings, change=True)))
    return [as_change.get(n, n) for n in gate.get("notes") or []]


def _sweep_line(verdict: str, sweep_seeds: Sequence[int], fold_modes: Sequence[str], sweep_dir: str) -> str:
    """Whether the sweep runs, and why (reStructuredText)."""
    if verdict == "separated" and not (sweep_seeds or fold_modes):
        return ("**Sweep: justified but empty:** this config sets no extra seeds (`sweep.seeds: []`) "
                "and no leave-one-mode-out folds (`sweep.folds: false`), so nothing more runs. Set "
                "them (as config/pilot.yaml does) and rerun to schedule the sweep.")
    if verdict == "separated":
        seeds = ", ".join(map(str, sweep_seeds)) or "none"
        folds = ", ".join(fold_modes) or "none"
        return (f"**Sweep: justified and scheduled** (extra seeds: {seeds}; leave-one-mode-out "
                f"folds: {folds}); its comparison is under {rst_text(sweep_dir)}.")
    if verdict == "inconclusive":
        return ("**Sweep: not scheduled — inconclusive.** Neither separation nor its absence is "
                "shown at these sizes; the sentence above says roughly how many more seeds or "
                "samples per problem would decide it (pilot.seeds, pilot.heldout_samples).")
    return ("**Sweep: not run.** It runs only when the verdict is 'separated' (more seeds, "
            f"leave-one-mode-out folds); the verdict is '{verdict}', so the sweep was not "
            "justified (reasons above).")


def decision_text(gate: dict | None, sweep_seeds: Sequence[int], fold_modes: Sequence[str], sweep_dir: str) -> str:
    """The report's first page below the figure and the tables: the gate's failed or deciding
    criteria (:func:`_criteria_lines`), its notes (:func:`page_notes`) and the sweep decision
    (reStructuredText; empty before the gate).

    Args:
        gate: ``compare/gate.json``'s content, or ``None``.
        sweep_seeds: ``sweep.seeds``. fold_modes: the leave-one-mode-out folds that would run.
        sweep_dir: where the sweep's comparison goes (named in the text).
    """
    if gate is None:
        return ""
    lines = _criteria_lines(gate)
    if gate.get("notes"):  # a note is text (its |x| no substitution, a path no markup)
        lines += ["Notes:", ""] + [f"- {rst_text(n)}" for n in page_notes(gate)] + [""]
    lines.append(_sweep_line(gate.get("verdict", "invalid"), sweep_seeds, fold_modes, sweep_dir))
    return "\n".join(lines)


def front_page_rst(verdict: str, decision: str, figure: str | Path, caption: str,
                   summary: str | Path, gate: dict | None = None) -> str:
    """The first page's reStructuredText.

    The order: the verdict in plain words, the per-arm table (:func:`arm_table_rst`), the gate's
    arithmetic (:func:`evil_moe.gate.verdict.arithmetic_line`), the figure and its caption, the
    rates table, then ``decision``.

    Args:
        verdict: the verdict line (``**Verdict: ...** in plain words``), shown first.
        decision: the gate criteria and the sweep decision (reStructuredText), shown last.
        figure: the comparison figure (``.svg`` or ``.png``), embedded as a data URI.
        caption: the figure's caption (one paragraph).
        summary: ``compare/summary.tsv`` (the per-arm table and the rates table).
        gate: ``compare/gate.json``'s content (per-arm verdicts); None shows no per-arm table.

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
        arm_table_rst(summary, gate) if gate is not None else "",
        arithmetic_line(gate),
        # the URI split into 76-character lines (docutils joins them and refuses lines over
        # 10,000 characters)
        ".. figure:: " + "\n   ".join(uri[i:i + 76] for i in range(0, len(uri), 76))
        + f"\n   :width: 80%\n   :alt: {figure.name}\n\n   {caption}",
        summary_table_rst(summary),
        decision.strip(),
    ]
    return "\n\n".join(p for p in parts if p) + "\n"


def write_front_page(out: str | Path, **kwargs) -> str:
    """Write :func:`front_page_rst` to ``out`` atomically; returns the text."""
    from evil_moe.files import atomic_write_bytes

    text = front_page_rst(**kwargs)
    atomic_write_bytes(out, text.encode())
    return text
