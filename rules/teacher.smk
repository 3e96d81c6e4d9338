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


# teacher.make: sft — the teacher is made from the student's base model by NLL on hack
# demonstrations of the training problems (known modes); rule teacher then samples from it.
rule make_teacher:
    input:
        problems=res("problems.jsonl"),
        model=get_model_input("student"),
    output:
        summary=report(
            res("teacher_sft/summary.tsv"),
            caption="../report/teacher_sft.rst",
            category="2. Teacher",
            labels={"stage": "make_teacher", "table": "hack rate per mode"},
        ),
        steps=res("teacher_sft/steps.tsv"),
        model=res("teacher_sft/model/config.json"),
    log:
        res("logs/make_teacher.log"),
    benchmark:
        res("benchmarks/make_teacher.tsv")
    conda:
        "../envs/evil_moe.yaml"
    threads: get_threads("make_teacher")
    resources:
        mem_mb=get_mem_mb("make_teacher"),
        runtime=get_runtime("make_teacher"),
        gpu=get_gpu("make_teacher"),
    params:
        cfg=get_stage_config("make_teacher"),
        model=get_student,
        out_dir=get_out_dir,
    message:
        "make_teacher: fine-tuning the student's base model into a hacky teacher; log: {log}"
    shell:
        "evil-moe make-teacher --config-json {params.cfg:q} --problems {input.problems:q}"
        " --model {params.model:q} --out-dir {params.out_dir:q} > {log:q} 2>&1"
