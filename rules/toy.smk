rule toy_models:
    input:
        problems=res("problems.jsonl"),
    output:
        student=res("models/student/config.json"),
        teacher=res("models/teacher/config.json"),
        summary=report(
            res("models/toy_summary.tsv"),
            caption="../report/toy_summary.rst",
            category="1. Models",
            labels={"stage": "toy_models", "table": "summary"},
        ),
    log:
        res("logs/toy_models.log"),
    benchmark:
        res("benchmarks/toy_models.tsv")
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
        "toy_models: training the toy student and teacher; log: {log}"
    shell:
        "evil-moe toy-models --config-json {params.cfg:q} --problems {input.problems:q}"
        " --out-dir {params.out_dir:q} > {log:q} 2>&1"
