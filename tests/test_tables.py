"""The column table is defined once (evil_moe/tables.py) and docs/outputs.md shows exactly it."""

import re
from pathlib import Path

import pytest

from evil_moe import files, tables
from evil_moe.env.loopholes import MODES
from evil_moe.rl.detectors import registry  # noqa: F401  (registers the score_{detector} columns)

REPO = Path(__file__).resolve().parent.parent


def test_docs_columns_match_tables():
    text = (REPO / "docs" / "outputs.md").read_text()
    section = text.split(tables.START, 1)[1].split(tables.END, 1)[0]
    assert section.strip() == tables.readme_section().strip(), \
        "docs/outputs.md columns are stale: run python -m evil_moe.tables --update docs/outputs.md"


def test_audit_rows_have_one_score_column_per_detector_with_a_score():
    """rows.tsv's score columns: the registered detectors that have a score, in registry order,
    then the calibration run's shuffled-label v_hack and the router (the rollout records carry
    exactly these: evil_moe.rl.trainer.step_log.SCORE_COLUMNS)."""
    from evil_moe.rl.detectors.registry import DETECTORS
    from evil_moe.rl.trainer.step_log import SCORE_COLUMNS

    scores = [n for n in tables.names(tables.AUDIT_ROWS) if n.startswith("score_")]
    assert scores == ["score_gradient", "score_probe", "score_pattern", "score_shuffled", "score_router"]
    assert [n for n, cls in DETECTORS.items() if cls.unit is not None] == ["gradient", "probe", "pattern"]
    assert SCORE_COLUMNS == tuple(s.removeprefix("score_") for s in scores)


def test_column_names_are_unique_snake_case():
    for path, cols in tables.TABLES.items():
        names = tables.names(cols)
        assert len(names) == len(set(names)), path
        for n in names:
            assert n == n.lower() and " " not in n and "-" not in n, (path, n)


def test_design_md_minimum_step_columns_present():
    # the minimum steps.tsv columns (docs/outputs.md) (one hack_rate_<mode> per mode)
    required = ("step arm seed reward_mean hack_rate pass_rate format_rate parse_rate "
                "hack_parsed_rate entropy frac_zero_std loss grad_norm cin cin_student "
                "cin_teacher cout cout_update frac_fired coverage null_cin frac_clipped "
                "ratio_p05 ratio_p50 ratio_p95 delta_s_norm delta_s_hack_norm tokens seconds").split()
    required += [f"hack_rate_{m}" for m in MODES]
    assert set(required) <= set(tables.names(tables.STEPS))


def test_writer_rejects_undefined_column(tmp_path):
    with pytest.raises(KeyError, match="not_a_column"):
        tables.write_tsv(tmp_path / "x.tsv", tables.EVAL, [{"not_a_column": 1}])


def test_write_tsv_is_atomic_and_formats(tmp_path):
    out = tmp_path / "e.tsv"
    tables.write_tsv(out, tables.EVAL, [{"step": 3, "arm": "erase", "hack_rate": 0.25,
                                         "pass_rate": float("nan"), "n": 8}])
    lines = out.read_text().splitlines()
    assert lines[0].split("\t") == tables.names(tables.EVAL)
    row = dict(zip(lines[0].split("\t"), lines[1].split("\t")))
    assert row["step"] == "3" and row["hack_rate"] == "0.25" and row["pass_rate"] == "" and row["view"] == ""
    assert not list(tmp_path.glob(".*tmp"))


def test_atomic_writes_are_readable_by_others(tmp_path):
    """mkstemp creates 0600 files; results are shared on clusters, so writes honour the umask."""
    import os

    old = os.umask(0o022)
    try:
        files.write_json(tmp_path / "g.json", {"verdict": "x"})
    finally:
        os.umask(old)
    assert (tmp_path / "g.json").stat().st_mode & 0o777 == 0o644


def test_read_jsonl_names_the_file_and_line_of_a_bad_line(tmp_path):
    from evil_moe import files

    f = tmp_path / "rows.jsonl"
    f.write_text('{"a": 1}\n\nnot json\n')
    with pytest.raises(ValueError, match=rf"^{re.escape(str(f))}:3: not a JSON line"):
        files.read_jsonl(f)
    f.write_text('{"a": 1}\n\n{"b": 2}\n')
    assert files.read_jsonl(f) == [{"a": 1}, {"b": 2}]
