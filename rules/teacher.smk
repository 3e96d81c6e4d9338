rule teacher:
    input:
        problems=res("problems.jsonl"),
        model=get_model_input("teacher"),
    output:
        rollouts=res("teacher/rollouts.jsonl.gz"),
        summary=report(
            res("teacher/summary.tsv"),
            caption="../report/teacher_summary.rst",
            category="2. Teacher",
            labels={"stage": "teacher", "table": "summary"},
        ),
    log:
        res("logs/teacher.log"),
    benchmark:
        res("benchmarks/teacher.tsv")
    conda:
        "../envs/evil_moe.yaml"
    threads: get_threads("teacher")
    resources:
        mem_mb=get_mem_mb("teacher"),
        runtime=get_runtime("teacher"),
        gpu=get_gpu("teacher"),
    params:
        cfg=get_stage_config("teacher"),
        model=get_teacher,
        out_dir=get_out_dir,
    message:
        "teacher: rollouts of the hacky teacher; log: {log}"
    shell:
        "evil-moe teacher --config-json {params.cfg:q} --problems {input.problems:q}"
        " --model {params.model:q} --out-dir {params.out_dir:q} > {log:q} 2>&1"
