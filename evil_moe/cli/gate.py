"""The commands of the comparison and the gate: ``compare`` (the pilots' comparison and the
gate), ``detector-sweep``, ``front-page`` (the report's first page) and ``readme-figure`` (the
README's figure and verdict from a finished run), over :mod:`evil_moe.stages.compare` and
:mod:`evil_moe.gate`.
"""

from __future__ import annotations

import click

from evil_moe import files
from evil_moe.cli.common import config_options, fail, main


@main.command("compare")
@config_options
@click.option("--pilots-dir", type=click.Path(file_okay=False), default=None,
              help="Folder of pilots {arm}/s{seed}/ (expected: pilot.arms x pilot.seeds).")
@click.option("--pilot", "pilot_dirs", multiple=True, type=click.Path(file_okay=False),
              help="One pilot folder .../{arm}/s{seed} (repeatable; instead of --pilots-dir).")
@click.option("--distill-samples", type=click.Path(dir_okay=False), default=None,
              help="The distill probe's samples.tsv, for the cos_contrib figure.")
@click.option("--audit", "audit_path", type=click.Path(dir_okay=False), default=None,
              help="The detector audit's quality.tsv (route/filter are 'uninformative' unless their "
                   "detector beats its placebo there).")
@click.option("--vhack-checks", type=click.Path(dir_okay=False), default=None,
              help="The extraction's vhack/main_checks.tsv (v_hack's pairs: the labels it read).")
@click.option("--out-dir", type=click.Path(file_okay=False), default="results/compare", show_default=True)
def compare_cmd(cfg, pilots_dir, pilot_dirs, distill_samples, audit_path, vhack_checks, out_dir) -> None:
    """Aggregate the pilots into summary.tsv, gate.json and figures; print the verdict last."""
    from evil_moe.stages.compare import run_compare

    if bool(pilots_dir) == bool(pilot_dirs):
        raise click.UsageError("give exactly one of --pilots-dir or --pilot")
    try:
        gate = run_compare(pilots_dir or list(pilot_dirs), out_dir, cfg, distill_samples=distill_samples,
                           audit_path=audit_path, vhack_checks=vhack_checks)
    except (FileNotFoundError, ValueError) as err:
        raise click.ClickException(str(err)) from err
    for c in gate["criteria"]:
        if c["name"] != "valid" or not c["passed"]:
            mark = "ok  " if c["passed"] else "FAIL"
            who = c["arm"] + (f" s{c['seed']}" if "seed" in c else "")
            click.echo(f"{mark} {c['name']:<16} {who:<10} {c.get('note', '')}")
    click.echo(f"wrote {out_dir}/summary.tsv, gate.json, gate.md, figures/")
    click.echo(gate["sentence"])


@main.command("detector-sweep")
@config_options
@click.option("--pilot", "pilots", multiple=True, required=True,
              help="LEVEL=DIR: a detector-sweep pilot folder .../{level}/{arm}/s{seed} (LEVEL "
                   "p{precision}_r{recall}) or a main pilot (LEVEL main: vanilla, the ceilings).")
@click.option("--out-dir", type=click.Path(file_okay=False), default="results/detector_sweep", show_default=True)
def detector_sweep_cmd(cfg, pilots, out_dir) -> None:
    """Route's and filter's held-out hack-rate drop against detector quality (docs/arms.md)."""
    from evil_moe.stages.detector_sweep import run_detector_sweep

    pairs = []
    for item in pilots:
        level, sep, folder = item.partition("=")
        if not sep:
            raise click.BadParameter(f"expected LEVEL=DIR, got {item!r}", param_hint="--pilot")
        pairs.append((level, folder))
    try:
        rows = run_detector_sweep(pairs, out_dir, cfg)
    except (FileNotFoundError, ValueError) as err:
        raise click.ClickException(str(err)) from err
    for r in rows:
        d = "n/a" if r["drop_vs_vanilla"] is None else f"{r['drop_vs_vanilla']:.3f}"
        click.echo(f"{r['level']:<12} {r['arm']:<14} drop vs vanilla {d}")
    click.echo(f"wrote {out_dir}/summary.tsv, quality.svg")


@main.command("front-page")
@click.option("--verdict", required=True, help="The verdict line (reStructuredText).")
@click.option("--decision", default="", help="Gate criteria and the sweep decision (reStructuredText).")
@click.option("--figure", required=True, type=click.Path(dir_okay=False),
              help="The comparison figure (relative to the folder --report runs in).")
@click.option("--caption", default="", help="The figure's caption.")
@click.option("--summary", required=True, type=click.Path(dir_okay=False),
              help="compare/summary.tsv (the per-arm table and the rates table).")
@click.option("--gate", "gate_path", default=None, type=click.Path(dir_okay=False),
              help="compare/gate.json (the per-arm verdicts of the first table).")
@click.option("--out", required=True, type=click.Path(dir_okay=False))
def front_page_cmd(verdict, decision, figure, caption, summary, gate_path, out) -> None:
    """Write the HTML report's first page (results/sweep/decision.rst): the per-arm table, the
    verdict, the figure, the rates table and the criteria."""
    from evil_moe.gate.frontpage import write_front_page

    try:
        gate = files.read_json(gate_path, "gate") if gate_path else None
        write_front_page(out, verdict=verdict, decision=decision, figure=figure, caption=caption,
                         summary=summary, gate=gate)
    except (OSError, ValueError) as err:
        fail(err)
    click.echo(f"wrote {out}")


@main.command("verdict")
@click.option("--gate", "gate_path", default="results/compare/gate.json", show_default=True,
              type=click.Path(dir_okay=False), help="The comparison's gate.json.")
def verdict_cmd(gate_path) -> None:
    """Print the gate's verdict in plain words (``verdict: ...``, the last line of make run; a
    missing or damaged gate.json is one error line naming it)."""
    from evil_moe.gate.verdict import plain_verdict

    try:
        gate = files.read_json(gate_path, "gate")
    except (OSError, ValueError) as err:
        fail(err)
    click.echo(f"verdict: {plain_verdict(gate)}")


@main.command("readme-figure")
@click.option("--results", default="results", show_default=True, type=click.Path(file_okay=False),
              help="The finished run whose compare/ the README quotes.")
@click.option("--repo", default=".", show_default=True, type=click.Path(file_okay=False),
              help="The repository (README.md, docs/img/).")
def readme_figure_cmd(results, repo) -> None:
    """Regenerate the README's figure (docs/img/heldout.png), its table and verdict
    (docs/img/heldout.tsv, verdict.json) and the README's verdict line from a finished run
    (`make readme-figure` after `make run`)."""
    from evil_moe.gate.readme import update_readme

    try:
        written = update_readme(results, repo)
    except (OSError, ValueError) as err:
        fail(err)
    for path in written:
        click.echo(f"wrote {path}")
