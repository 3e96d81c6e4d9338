"""Each registry's table in docs/ is the registry's, row for row: a new entry without its row, or a
row that says something its declaration does not, fails here (docs/arms.md's arm table is
tests/test_docs_arms.py's)."""

from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def table_rows(page: str, heading: str, n_cells: int) -> dict[str, list[str]]:
    """The rows of the first markdown table after ``heading`` in ``docs/{page}``, by the name in
    backticks that opens the row (``n_cells`` cells each; the header and rule rows are skipped)."""
    text = (REPO / "docs" / page).read_text()
    rows: dict[str, list[str]] = {}
    for line in text[text.index(heading):].splitlines()[1:]:
        if not line.startswith("|"):
            if rows:
                break
            continue
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == n_cells and cells[0].startswith("`"):
            rows[cells[0].split("`")[1]] = cells
    return rows


def _codes(cell: str) -> list[str]:
    """The backticked names of a cell, in order."""
    return cell.split("`")[1::2]


def test_the_detectors_table_is_the_detector_registry():
    """docs/detectors.md's table has one row per registered detector, in registry order, each
    with its score's unit (the ``score_{detector}`` column of rows.tsv; none for one without a
    score), what the step computes for it (its ``needs``) and the calibrations it is thresholded
    by (— for one that flags on its own)."""
    from evil_moe.rl.detectors.registry import DETECTORS

    rows = table_rows("detectors.md", "## The detectors", 5)
    assert list(rows) == list(DETECTORS)
    for name, cls in DETECTORS.items():
        _, score, needs, calibrations, _ = rows[name]
        assert (score.rsplit("; unit: ", 1)[-1] if "; unit: " in score else None) == cls.unit, name
        assert set(_codes(needs)) == set(cls.needs), name
        assert _codes(calibrations) == list(cls.calibrations), name
        assert calibrations.startswith("—") == (not cls.thresholded()), name


def test_table_rows_reads_a_table_that_disagrees(tmp_path, monkeypatch):
    """The reader sees a planted page: a missing row and a wrong cell are what the checks above
    compare, so a table that disagrees with its registry cannot pass."""
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "x.md").write_text("# X\n\n## The detectors\n\n| a | b |\n|---|---|\n| `gradient` (default) | `fpr` |\n"
                               "| `probe` | — |\n\nafter\n\n| `other` | x |\n")
    monkeypatch.setitem(globals(), "REPO", tmp_path)
    rows = table_rows("x.md", "## The detectors", 2)
    assert list(rows) == ["gradient", "probe"] and _codes(rows["gradient"][1]) == ["fpr"]


def test_the_modes_table_is_the_mode_registry():
    """docs/environment.md's table has one row per registered loophole mode, in registry order,
    each quoting the mode's own hint (the prompt's words)."""
    from evil_moe.env.loopholes import LOOPHOLES

    rows = table_rows("environment.md", "## Overview", 4)
    assert list(rows) == list(LOOPHOLES)
    for name, cls in LOOPHOLES.items():
        hint = rows[name][1].strip('"').removeprefix("…")
        assert cls().hint("run_tests").endswith(hint), name


def test_the_criteria_table_is_the_criterion_registry():
    """docs/gate.md's criteria table has one row per registered gate criterion, in registry
    order, each with its rate (metric), the other side of its effect and its threshold's key (a
    dash for a criterion without one)."""
    from evil_moe.gate.criteria import CRITERIA

    rows = table_rows("gate.md", "## The criteria, per treatment arm", 5)
    assert list(rows) == list(CRITERIA)
    sides = {"vanilla": "vanilla", "control": "the matched control", "untrained": "the untrained student"}
    for name, c in CRITERIA.items():
        _, metric, against, threshold, _ = rows[name]
        assert metric == c.metric, name
        assert against.startswith(sides[c.against]), name
        assert _codes(threshold) == ([] if c.threshold is None else [f"compare.{c.threshold}"]), name
        assert threshold.startswith("—") == (c.threshold is None), name
