# The sweep runs only when the pilot comparison's gate says "separated" (get_sweep_input reads
# gate.json through the compare checkpoint); sweep_decision writes the report's first page: the
# verdict, the comparison figure and the per-arm table, the gate's criteria and whether the sweep
# was justified.


localrules:
    sweep_decision,


rule sweep_decision:
    input:
        gate=get_gate,
        summary=res("compare/summary.tsv"),
        figure=get_front_figure,
    output:
        report(
            res("sweep/decision.rst"),
            caption="../report/decision.rst",
            category="0. Verdict",
            labels={"stage": "compare", "result": "verdict page"},
        ),
    log:
        res("logs/sweep_decision.log"),
    conda:
        "../envs/evil_moe.yaml"
    params:
        verdict=get_verdict_text,
        decision=get_decision_text,
        caption=get_front_caption,
    shell:
        "evil-moe front-page --verdict {params.verdict:q} --decision {params.decision:q}"
        " --figure {input.figure:q} --caption {params.caption:q} --summary {input.summary:q}"
        " --gate {input.gate:q}"
        " --out {output:q} > {log:q} 2>&1"


# Pilots over pilot.seeds + sweep.seeds (the pilot rule makes the extra seeds), compared again.
rule sweep_compare:
    input:
        pilots=get_sweep_compare_input,
        samples=res("distill/samples.tsv"),
    output:
        gate=report(
            res("sweep/compare/gate.json"),
            caption="../report/sweep_gate.rst",
            category="9. Sweep",
            labels={"stage": "sweep", "fold": "all modes"},
        ),
        summary=res("sweep/compare/summary.tsv"),
        hack_rate=report(
            res("sweep/compare/figures/hack_rate.svg"),
            caption="../report/fig_hack_rate.rst",
            category="9. Sweep",
            labels={"stage": "sweep", "fold": "all modes, hack rate"},
        ),
    log:
        res("logs/sweep_compare.log"),
    conda:
        "../envs/evil_moe.yaml"
    threads: get_threads("compare")
    resources:
        mem_mb=get_mem_mb("compare"),
        runtime=get_runtime("compare"),
    params:
        cfg=get_stage_config("compare"),
        pilots=get_pilot_flags,
        out_dir=get_out_dir,
    message:
        "sweep_compare: pilots over all seeds; log: {log}"
    shell:
        "evil-moe compare --config-json {params.cfg:q} {params.pilots}"
        " --distill-samples {input.samples:q} --out-dir {params.out_dir:q} > {log:q} 2>&1"


# One leave-one-mode-out fold (sweep.folds): pilots whose v_hack never saw {mode}, compared as
# sweep_compare compares (`use rule`: the same command, job size and params).
use rule sweep_compare as fold_compare with:
    input:
        pilots=get_fold_compare_input,
        samples=res("distill/samples.tsv"),
    output:
        gate=report(
            res("sweep/folds/{mode}/compare/gate.json"),
            caption="../report/sweep_gate.rst",
            category="9. Sweep",
            labels={"stage": "sweep", "fold": "without {mode}"},
        ),
        summary=res("sweep/folds/{mode}/compare/summary.tsv"),
        hack_rate=report(
            res("sweep/folds/{mode}/compare/figures/hack_rate.svg"),
            caption="../report/fig_hack_rate.rst",
            category="9. Sweep",
            labels={"stage": "sweep", "fold": "without {mode}, hack rate"},
        ),
    log:
        res("logs/fold_compare/{mode}.log"),
    message:
        "fold_compare without {wildcards.mode}; log: {log}"


# Target: `snakemake sweep` = the gate note, plus the sweep when the gate says separated.
rule sweep:
    input:
        res("sweep/decision.rst"),
        get_sweep_input,


# Target: every job of the sweep without waiting for the gate (nothing when the config has no
# sweep): the jobs the gate may add, for the Slurm preflight's dry run (evil_moe/cluster/plan.py).
rule sweep_ungated:
    input:
        _sweep_outputs(),
