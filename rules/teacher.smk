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
    threads: 2
    params:
        cfg=get_stage_config("teacher"),
        model=get_teacher,
        out_dir=get_out_dir,
    shell:
        "evil-moe teacher --config-json {params.cfg:q} --problems {input.problems:q}"
        " --model {params.model:q} --out-dir {params.out_dir:q} --threads {threads} > {log:q} 2>&1"
