"""The compare stage: aggregate the pilots and decide the separation gate.

Reads every pilot folder ``results/pilots/{arm}/s{seed}/`` (``status.json``, ``steps.tsv``,
``eval.tsv``, ``outcomes.tsv``) and writes, in ``out_dir``:

- ``summary.tsv`` — :data:`evil_moe.tables.COMPARE_SUMMARY`, one row per (arm, view): the
  held-out hack, pass and truncation rates with cluster-bootstrap intervals (seeds and problems
  resampled, :mod:`evil_moe.gate.effects`), and beside them the training rollouts' last-``k`` means and
  the arm's removed energy share;
- ``gate.json`` — ``{"verdict", "sentence", "criteria": [...], "arms": {...},
  "positive_control", "notes", "isolation", "config", ...}``; every
  criterion has ``name, arm, control, view, value, ci_low, ci_high, mde, threshold, test, bound,
  passed, rules_out, note`` (raw values; the sentence and the report round them); every judged
  arm its ``verdict``, ``reason`` and ``finding`` (``no_better_than_untrained`` or null);
- ``gate.md`` — the same criteria as a short markdown table (:func:`evil_moe.gate.verdict.gate_md`);
- ``figures/{name}.{png,svg}`` for each name of :data:`evil_moe.gate.figures.FIGURES`, and
  ``figures/heldout_trajectory.{png,svg}`` where the pilots evaluated along the run
  (``pilot.eval_every``; their ``trajectory.tsv``): held-out hack and pass rate against step per
  arm, with the rebound rule's finding (:mod:`evil_moe.gate.trajectory`) in ``gate.json``.

:func:`run_compare` only loads (the pilots, through :func:`evil_moe.pilots.read_pilot`, and the
detector audit's row), calls the gate (:func:`evil_moe.gate.gate_json.build_gate`: every key of
``gate.json``, its notes and the router's audit are the gate's), writes and draws
(:mod:`evil_moe.gate.figures`).

The gate (the statistics are :mod:`evil_moe.gate`, explained in ``docs/gate.md``):

1. **Validity.** Every expected (arm, seed) pilot is present (folder, ``status.json``,
   ``steps.tsv``, ``outcomes.tsv``) as the pilot wrote them (their recorded SHA-256), has
   ``status == "ok"``, a non-empty ``steps.tsv``, a largest ``frac_clipped`` ≤
   ``pilot.max_frac_clipped`` and no collapse (:mod:`evil_moe.rl.trainer.collapse`). Otherwise
   the verdict is ``invalid`` and one ``valid`` criterion per pilot names it and why; the arms'
   numbers are still computed from the data present, for information. Expected pilots: given a
   pilots folder, ``cfg.pilot.arms × cfg.pilot.seeds``; given a list, every listed arm × every
   listed seed.
2. **Per treatment arm X** (an arm whose :mod:`evil_moe.rl.arms.registry` role is ``treatment``; its matched
   control ``C`` and judged view ``v = X.views[0]`` come from the registry), on the last
   evaluated step's per-completion held-out outcomes:
   ``drop_vs_vanilla`` (hack, ``(X, v)`` vs ``(vanilla, trained)``), ``beats_control`` (hack,
   ``(X, v)`` vs ``(C, v)``), ``matched_pass`` (pass-rate drop vs vanilla, non-inferiority within
   ``compare.pass_margin`` absolute and ``compare.pass_margin_rel`` × vanilla's pass rate),
   ``pass_vs_untrained`` (its pass rate above the untrained student's, ``(X, v)`` vs
   ``(untrained, trained)``) and ``hack_vs_untrained`` (its hack rate no higher than the
   untrained student's plus ``compare.min_drop``) — :func:`evil_moe.gate.rule.decide_arm`; an
   arm whose pass rate does not beat the untrained student's is "no better than not training"; intervals from the crossed seed × problem bootstrap
   (``compare.resample``). ``separated`` is Holm-corrected over the treatment arms judged
   (``compare.multiplicity``; :func:`evil_moe.gate.rule.decide_gate`).
3. **Positive control** (``compare.positive_control``, default ``oracle_reward``): its hack
   drop vs vanilla must pass ``drop_vs_vanilla``, else the verdict is ``inconclusive
   (underpowered)`` — :func:`evil_moe.gate.rule.decide_gate`.
4. **Verdict**: ``invalid`` if validity fails; else the gate's ``separated`` / ``not_separated``
   / ``inconclusive``. ``sentence`` says it in one sentence with rounded numbers
   (:func:`evil_moe.gate.verdict.sentence`, where all the verdict's prose is written).

Notes beside the verdict (never part of it; :func:`evil_moe.gate.gate_json.notes`): erase-type arms' removed energy share against their
controls' (an erase that removes no more than its random control has not been tested); subtract's
deploy view against vanilla's static projection (``projected`` view); truncation dominating the
held-out completions; a sampler/trainer log-prob gap above float noise (top-p and the like); the
grader's isolation level when it was not the bubblewrap sandbox.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

from evil_moe import files, tables
from evil_moe.gate.figures import absorption_figure, ceiling_figure, draw_figures, heldout_trajectory_figure
from evil_moe.gate.gate_json import build_gate, by_arm
from evil_moe.gate.summary import rounded
from evil_moe.gate.verdict import gate_md
from evil_moe.pilots import Pilot, PilotRun, pilot_from_path, read_pilot
from evil_moe.rl.arms.registry import ARMS
from evil_moe.rl.trainer.collapse import collapsed


def _collect(pilots, cfg) -> tuple[list[PilotRun], list[str]]:
    """The expected pilots, and for a folder the pilot folders ignored under it, for a list the
    ``arm/s{seed}`` cells of the grid that were not listed (see the module docstring)."""
    if isinstance(pilots, (str, Path)):
        root = Path(pilots)
        if not root.is_dir():
            raise FileNotFoundError(f"pilots folder not found: {root}")
        arms, seeds = list(cfg.pilot.arms), list(cfg.pilot.seeds)
        expected = [PilotRun(a, s, root / a / f"s{s}") for a in arms for s in seeds]
        want = {r.path for r in expected}
        ignored = sorted(str(p) for p in root.glob("*/s*") if p.is_dir() and p not in want)
        return expected, ignored
    runs = [p if isinstance(p, PilotRun) else pilot_from_path(p, ARMS) for p in pilots]
    if not runs:
        raise ValueError("no pilots given")
    given = {(r.arm, r.seed): r for r in runs}
    order = list(ARMS)
    arms = sorted({r.arm for r in runs}, key=lambda a: (order.index(a) if a in order else len(order), a))
    seeds = sorted({r.seed for r in runs})
    expected, unlisted = [], []
    for a in arms:
        for s in seeds:
            if (a, s) in given:
                expected.append(given[(a, s)])
            else:  # not listed: missing, even if a folder for it exists on disk
                base = next(iter(r.path for r in runs if r.arm == a)).parent
                expected.append(PilotRun(a, s, base / f"s{s}"))
                unlisted.append(f"{a}/s{s}")
    return expected, unlisted


def detector_audit(path: str | Path | None, detector: str) -> dict | None:
    """The detector audit's pooled quality row (``mode`` all) of ``detector``, from
    ``audit/quality.tsv`` (:data:`evil_moe.tables.AUDIT_QUALITY`); None when no audit is given
    or it has no row for the detector.

    Raises:
        FileNotFoundError: a given path that does not exist (names it).
    """
    if path is None:
        return None
    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"detector audit not found: {p}")
    rows = [r for r in files.read_tsv_rows(p) if r["detector"] == detector and r["mode"] == "all"]
    if not rows:
        return None
    out: dict[str, Any] = {}
    for k, v in rows[0].items():
        if v == "":
            out[k] = None
        elif k in ("detector", "mode", "population", "placebo"):
            out[k] = v
        elif k == "beats_placebo":
            out[k] = v == "true"
        else:
            out[k] = float(v)
    return out


def vhack_pairs(path: str | Path | None) -> int | None:
    """The pairs v_hack was extracted from: the ``n`` of the ``extraction_hack_clean`` check of
    ``vhack/{name}_checks.tsv`` (:data:`evil_moe.tables.VHACK_CHECKS`); None without the file
    or the row.

    Raises:
        FileNotFoundError: a given path that does not exist (names it).
    """
    if path is None:
        return None
    if not Path(path).is_file():
        raise FileNotFoundError(f"v_hack checks not found: {path}")
    n = [r["n"] for r in files.read_tsv_rows(path) if r["check"] == "extraction_hack_clean" and r["n"] != ""]
    return int(float(n[0])) if n else None


def run_compare(pilots: Sequence[PilotRun | str | Path] | str | Path, out_dir: str | Path, cfg,
                distill_samples: str | Path | None = None, figures: bool = True,
                audit_path: str | Path | None = None, vhack_checks: str | Path | None = None) -> dict:
    """Aggregate the pilots, decide the separation gate, write the summary, gate and figures.

    Args:
        pilots: the pilots folder (``{arm}/s{seed}/`` under it; expected pilots are
            ``cfg.pilot.arms × cfg.pilot.seeds``), or a list of pilot folders / :class:`PilotRun`
            (expected: every listed arm × every listed seed; an unlisted cell is missing). Each
            folder holds ``steps.tsv`` (:data:`evil_moe.tables.STEPS`), ``outcomes.tsv``
            (:data:`evil_moe.tables.OUTCOMES`), ``eval.tsv`` and ``status.json``; a missing
            folder or file marks the pilot missing.
        out_dir: where ``summary.tsv``, ``gate.json``, ``gate.md`` and ``figures/`` go (created).
        cfg: a :class:`evil_moe.config.Config`; uses ``cfg.compare`` and
            ``cfg.pilot.{arms,seeds,max_frac_clipped}``.
        distill_samples: the distill probe's ``samples.tsv`` for the ``cos_contrib`` figure;
            ``None`` draws a figure saying it was not given.
        figures: draw the figures (tests of the gate alone may skip them).
        audit_path: the detector audit's ``quality.tsv``: a treatment that flags with the run's
            detector is judged ``uninformative`` unless the audit shows the detector beating its
            placebo (without an audit, too).

    Returns:
        The gate dict as written to ``gate.json`` (rules in the module docstring).

    Raises:
        FileNotFoundError: the pilots folder or the given ``distill_samples`` file does not exist
            (names the path).
        ValueError: a ``steps.tsv``/``outcomes.tsv`` lacks a needed column (names the file and
            column); a pilot folder whose arm and seed cannot be told; an empty pilot list.
    """
    max_fc = float(cfg.pilot.max_frac_clipped)
    expected, extra = _collect(pilots, cfg)
    from_dir = isinstance(pilots, (str, Path))
    ignored, unlisted = (extra, set()) if from_dir else ([], set(extra))
    if distill_samples is not None and not Path(distill_samples).is_file():
        raise FileNotFoundError(f"distill samples file not found: {distill_samples}")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    loaded = [Pilot(r, "missing", "not among the pilots given, though other arms ran this seed")
              if f"{r.arm}/s{r.seed}" in unlisted
              else read_pilot(r, max_fc, trains=ARMS[r.arm].trains if r.arm in ARMS else True,
                              collapsed=lambda rows: collapsed(rows, cfg.pilot))
              for r in expected]
    gate, rows = build_gate(loaded, cfg, detector_audit(audit_path, cfg.pilot.detector), vhack_pairs(vhack_checks))
    if ignored:
        gate["ignored"] = ignored
    _write(out, gate, rows)
    if figures:
        arms, by = list(gate["arms"]), by_arm(loaded)
        draw_figures(by, arms, out / "figures", max_fc, distill_samples, rows)
        ceiling_figure(rows, out / "figures")
        absorption_figure(rows, gate["known_modes"], out / "figures")
        if "trajectory" in gate or cfg.pilot.eval_every:  # the workflow expects it whenever eval_every is set
            heldout_trajectory_figure(gate.get("trajectory", []), gate.get("rebounds", {}), out / "figures")
    return gate


def _write(out: Path, gate: dict, summary_rows: list[dict]) -> None:
    """Write ``summary.tsv`` (rounded), ``gate.json`` (raw) and ``gate.md`` into ``out``."""
    tables.write_tsv(out / "summary.tsv", tables.COMPARE_SUMMARY, [rounded(r) for r in summary_rows])
    files.write_json(out / "gate.json", gate)
    files.atomic_write_bytes(out / "gate.md", gate_md(gate).encode())


