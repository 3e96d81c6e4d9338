"""The README's figure and verdict line, regenerated from the run they quote.

``make readme-figure`` (after ``make run``) calls :func:`update_readme`, which

1. copies the run's ``compare/summary.tsv`` to ``docs/img/heldout.tsv``,
2. writes ``docs/img/verdict.json``: what :func:`evil_moe.gate.verdict.plain_verdict` reads of
   the run's ``compare/gate.json`` (:func:`verdict_record`) and the sentence it makes,
3. draws ``docs/img/heldout.png`` from ``docs/img/heldout.tsv`` (:func:`draw_readme_figure`,
   the report's held-out figure, :func:`evil_moe.gate.figures.heldout_figure`),
4. rewrites the README's verdict line between :data:`BEGIN` and :data:`END`
   (:func:`readme_verdict_line`).

``tests/test_readme.py`` redraws the figure from the committed table and compares pixels, checks
the README's line against ``verdict.json``, and the verdict's numbers against the table.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path

from evil_moe import files
from evil_moe.gate.criteria import CRITERIA
from evil_moe.gate.verdict import change_text, plain_verdict

IMG = Path("docs") / "img"
TABLE, FIGURE, VERDICT = IMG / "heldout.tsv", IMG / "heldout.png", IMG / "verdict.json"
BEGIN = "<!-- verdict: written by `make readme-figure` from docs/img/verdict.json -->"
END = "<!-- /verdict -->"
# the summary columns the figure draws (every other column is kept as text)
NUMERIC = ("hack_rate", "hack_ci_low", "hack_ci_high", "pass_rate", "pass_ci_low", "pass_ci_high")


def verdict_record(gate: dict) -> dict:
    """What the README's verdict is made of, from ``gate.json``: the verdict, its sentence and
    sizes, each arm's role (treatments: verdict, finding and what would decide them), every gate
    criterion's row (:data:`~evil_moe.gate.criteria.CRITERIA`: value, interval, the two rates),
    the positive control's (and ``compare.min_seeds``, for a gate too small to judge), and
    ``plain``: :func:`evil_moe.gate.verdict.plain_verdict` of it."""
    keep = ("role", "verdict", "finding", "needed_seeds", "needed_problems", "needed_samples")
    crit = [{k: c.get(k) for k in ("name", "arm", "control", "view", "value", "ci_low", "ci_high")}
            | {"effect": {k: (c.get("effect") or {}).get(k) for k in ("mean_a", "mean_b")}}
            for c in gate.get("criteria", []) if c.get("name") in CRITERIA]
    arms = {a: {k: v for k, v in info.items() if k in keep} for a, info in (gate.get("arms") or {}).items()}
    rec = {"verdict": gate.get("verdict"), "sentence": gate.get("sentence"), "sizes": gate.get("sizes"),
           "arms": arms, "criteria": crit}
    pc = gate.get("positive_control")
    if pc:  # a gate too small to judge says so with the positive control's change
        rec["positive_control"] = {k: pc.get(k) for k in ("arm", "value", "ci_low", "ci_high", "mde", "n_seeds")}
        rec["config"] = {"min_seeds": (gate.get("config") or {}).get("min_seeds")}
    det = gate.get("detector") or {}
    rec["detector"] = {k: det.get(k) for k in ("detector", "auc", "auc_ci_low", "auc_ci_high", "placebo_p95",
                                               "beats_placebo", "fpr", "fpr_ci_low", "fpr_ci_high")}
    rec["ceilings"] = {}
    for c in (gate.get("ceilings") or {}).values():  # one entry per ceiling, whatever arm it sits beside
        vs = c.get("ceiling_vs_control") or {}
        if c.get("ceiling") and c.get("ceiling_control") and vs.get("value") is not None:
            pu = c.get("ceiling_pass_drop_vs_untrained") or {}
            rec["ceilings"][c["ceiling"]] = {"control": c["ceiling_control"], "view": c.get("view"),
                                             **{k: vs.get(k) for k in ("value", "ci_low", "ci_high")},
                                             "pass_vs_untrained": ({k: pu.get(k) for k in ("value", "ci_low", "ci_high")}
                                                                   if pu.get("value") is not None else None)}
    rec["plain"] = plain_verdict(rec)
    return rec


def _num(x) -> str:
    return "–" if x is None else f"{float(x):.2f}"


def detector_clause(det: dict) -> str:
    """Route's detector quality on the calibration runs' own rollouts (the detector audit,
    ``gate.json`` ``detector``): its AUC with the cluster-bootstrap interval against its placebos'
    95th percentile, and the false-positive rate at its operating point; '' when not audited."""
    if not det or det.get("auc") is None:
        return ""
    beats = {True: "beats", False: "does not beat"}.get(det.get("beats_placebo"), "is not compared with")
    fpr = (f", false-positive rate {_num(det['fpr'])} [{_num(det.get('fpr_ci_low'))}, "
           f"{_num(det.get('fpr_ci_high'))}]" if det.get("fpr") is not None else "")
    return (f"Route's {det.get('detector')} detector on the policy's own rollouts: AUC {_num(det['auc'])} "
            f"[{_num(det.get('auc_ci_low'))}, {_num(det.get('auc_ci_high'))}], which {beats} its placebos "
            f"(95th percentile {_num(det.get('placebo_p95'))}){fpr}. ")


def ceiling_clause(ceilings: dict) -> str:
    """Whether the run can see a routing method that works: each ceiling (perfect flags: the true
    hack label) against its matched control, as the change in held-out hack rate with its
    crossed interval (:func:`evil_moe.gate.verdict.change_text`; ``gate.json`` ``ceilings``
    stores the control's rate minus the ceiling's), and whether the interval excludes 0, then its
    pass-rate change vs the untrained student and whether that beats not training ('' when no
    ceiling ran beside its control)."""
    parts = []
    for name, c in ceilings.items():
        if c.get("ci_low") is None:
            continue
        seen = ("so the run tells perfect flags from deleting as much at random" if c["ci_low"] > 0 else
                "so the run cannot tell perfect flags from deleting as much at random at these sizes")
        pu = c.get("pass_vs_untrained")
        beats = ("" if not pu or pu.get("ci_low") is None else
                 f"; against the untrained student its pass rate changes {change_text(pu)}, "
                 + ("so it beats not training" if pu["ci_high"] < 0 else "which does not tell it from not training"))
        parts.append(f"The ceiling {name} ({c.get('view')} view) vs its matched control {c['control']}: "
                     f"change in held-out hack rate {change_text(c)}, {seen}{beats}. ")
    return "".join(parts)


def readme_verdict_line(record: dict) -> str:
    """The README's one line: the embedded default's verdict in plain words, route's detector
    quality beside it (:func:`detector_clause`), whether the ceiling separates from its control
    (:func:`ceiling_clause`), and where the measurements are."""
    return (f"**Current verdict of the embedded default** ({record['sizes']}): {record['plain']} "
            f"{detector_clause(record.get('detector') or {})}{ceiling_clause(record.get('ceilings') or {})}"
            "Every measurement, dated: [docs/logs/results.md](docs/logs/results.md).")


def summary_rows_for_figure(tsv: str | Path) -> list[dict]:
    """``compare/summary.tsv``'s rows with :data:`NUMERIC` as floats (None when empty).

    Raises:
        FileNotFoundError: no file at ``tsv``.
    """
    rows = files.read_tsv_rows(tsv)
    return [{k: (None if v == "" else float(v)) if k in NUMERIC else v for k, v in r.items()} for r in rows]


def draw_readme_figure(tsv: str | Path, png: str | Path) -> Path:
    """Draw the held-out figure from a summary table into ``png`` (matplotlib Agg, no metadata:
    the same table gives the same pixels). Returns ``png``."""
    import matplotlib

    matplotlib.use("Agg")
    from evil_moe.gate.figures import heldout_figure

    png = Path(png)
    with tempfile.TemporaryDirectory() as tmp:
        heldout_figure(summary_rows_for_figure(tsv), Path(tmp))
        png.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(Path(tmp) / "heldout.png", png)
    return png


def set_readme_line(readme_text: str, line: str) -> str:
    """``readme_text`` with the text between :data:`BEGIN` and :data:`END` replaced by ``line``.

    Raises:
        ValueError: the markers are missing or out of order.
    """
    i, j = readme_text.find(BEGIN), readme_text.find(END)
    if i < 0 or j < i:
        raise ValueError(f"README: the verdict markers are missing ({BEGIN} ... {END})")
    return readme_text[:i + len(BEGIN)] + "\n" + line + "\n" + readme_text[j:]


def update_readme(results: str | Path, repo: str | Path = ".") -> list[Path]:
    """Regenerate the README's table, verdict, figure and line from a finished run (module
    docstring). Returns the files written.

    Raises:
        FileNotFoundError: the run's ``compare/gate.json`` or ``compare/summary.tsv`` is missing
            (names the path). ValueError: the README lacks the verdict markers.
    """
    results, repo = Path(results), Path(repo)
    gate_path, summary = results / "compare" / "gate.json", results / "compare" / "summary.tsv"
    for path in (gate_path, summary):
        if not path.is_file():
            raise FileNotFoundError(f"{path} not found: run `make run` first")
    record = verdict_record(files.read_json(gate_path, "gate"))
    readme = repo / "README.md"
    text = set_readme_line(readme.read_text(), readme_verdict_line(record))  # fails before any write
    (repo / IMG).mkdir(parents=True, exist_ok=True)
    shutil.copyfile(summary, repo / TABLE)
    # files of the repository, not outputs: no hash record beside them
    files.atomic_write_bytes(repo / VERDICT, (json.dumps(record, indent=1, ensure_ascii=False) + "\n").encode(),
                             record=False)
    draw_readme_figure(repo / TABLE, repo / FIGURE)
    files.atomic_write_bytes(readme, text.encode(), record=False)
    return [repo / TABLE, repo / VERDICT, repo / FIGURE, readme]
