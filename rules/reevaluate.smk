# Optional, never part of `all`: the held-out evaluation of every finished pilot again with
# reevaluate.samples completions per problem and fresh sampling seeds (reevaluate.seed_offset),
# into a mirror tree the compare stage judges unchanged:
#   snakemake results/reeval/compare/gate.json --profile profiles/local [--configfile ...]


rule reevaluate:
    input:
        unpack(get_reeval_input),
    output:
        outcomes=res("reeval/pilots/{arm}/s{seed}/outcomes.tsv"),
        eval=res("reeval/pilots/{arm}/s{seed}/eval.tsv"),
        steps=res("reeval/pilots/{arm}/s{seed}/steps.tsv"),
        status=res("reeval/pilots/{arm}/s{seed}/status.json"),
    log:
        res("logs/reevaluate/{arm}_s{seed}.log"),
    conda:
        "../envs/evil_moe.yaml"
    threads: get_threads("reevaluate")
    resources:
        mem_mb=get_mem_mb("reevaluate"),
        runtime=get_runtime("reevaluate"),
        gpu=get_gpu("reevaluate"),
    params:
        cfg=get_stage_config("reevaluate"),
        model=STUDENT,
        options=get_reeval_options,
        pilots_dir=get_reeval_pilots_dir,
        out_dir=get_reeval_out_dir,
    message:
        "reevaluate {wildcards.arm} seed {wildcards.seed}; log: {log}"
    shell:
        "evil-moe reevaluate --config-json {params.cfg:q} --pilots-dir {params.pilots_dir:q}"
        " --arms {wildcards.arm} --seeds {wildcards.seed} --problems {input.problems:q}"
        " --model {params.model:q} {params.options} --out-dir {params.out_dir:q} > {log:q} 2>&1"


# The re-evaluated pilots judged by the compare stage, as the pilots are (rule compare).
rule reeval_compare:
    input:
        pilots=get_reeval_compare_input,
        samples=res("distill/samples.tsv"),
    output:
        gate=res("reeval/compare/gate.json"),
        gate_md=res("reeval/compare/gate.md"),
        summary=res("reeval/compare/summary.tsv"),
    log:
        res("logs/reeval_compare.log"),
    conda:
        "../envs/evil_moe.yaml"
    threads: get_threads("compare")
    resources:
        mem_mb=get_mem_mb("compare"),
        runtime=get_runtime("compare"),
    params:
        cfg=get_stage_config("compare"),
        pilots=get_reeval_compare_pilots,
        out_dir=get_out_dir,
    message:
        "reeval_compare: the re-evaluated pilots' comparison; log: {log}"
    shell:
        "evil-moe compare --config-json {params.cfg:q} {params.pilots}"
        " --distill-samples {input.samples:q} --out-dir {params.out_dir:q} > {log:q} 2>&1"
