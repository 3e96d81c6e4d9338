# The toy student and teacher train as two jobs at once (the same tokenizer is built from the same
# corpora in both); toy_summary joins their one-row summaries.


rule toy_model:
    input:
        problems=res("problems.jsonl"),
    output:
        model=res("models/{toy}/config.json"),
        summary=res("models/{toy}_summary.tsv"),
    log:
        res("logs/toy_models_{toy}.log"),
    benchmark:
        res("benchmarks/toy_model_{toy}.tsv")
    conda:
        "../envs/evil_moe.yaml"
    threads: get_threads("toy_models")
    resources:
        mem_mb=get_mem_mb("toy_models"),
        runtime=get_runtime("toy_models"),
    params:
        cfg=get_stage_config("toy_models"),
        out_dir=get_models_dir,
    message:
        "toy_models: training the toy {wildcards.toy}; log: {log}"
    shell:
        "evil-moe toy-models --config-json {params.cfg:q} --problems {input.problems:q}"
        " --which {wildcards.toy} --out-dir {params.out_dir:q} > {log:q} 2>&1"


localrules:
    toy_summary,


rule toy_summary:
    input:
        teacher=res("models/teacher_summary.tsv"),
        student=res("models/student_summary.tsv"),
    output:
        report(
            res("models/toy_summary.tsv"),
            caption="../report/toy_summary.rst",
            category="1. Models",
            labels={"stage": "toy_models", "table": "summary"},
        ),
    log:
        res("logs/toy_summary.log"),
    conda:
        "../envs/evil_moe.yaml"
    shell:
        "(head -n 1 {input.teacher:q} && tail -q -n +2 {input:q}) > {output:q} 2> {log:q}"
