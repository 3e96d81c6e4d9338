rule distill:
    input:
        problems=res("problems.jsonl"),
        rollouts=res("teacher/rollouts.jsonl.gz"),
        model=get_model_input("student"),
        vhack=res("vhack/main_hack.safetensors"),
    output:
        steps=report(
            res("distill/steps.tsv"),
            caption="../report/distill_steps.rst",
            category="4. Distill probe",
            labels={"stage": "distill", "table": "steps"},
        ),
        samples=report(
            res("distill/samples.tsv"),
            caption="../report/distill_samples.rst",
            category="4. Distill probe",
            labels={"stage": "distill", "table": "samples"},
        ),
        adapter=res("distill/student_adapter.safetensors"),
    log:
        res("logs/distill.log"),
    benchmark:
        res("benchmarks/distill.tsv")
    conda:
        "../envs/evil_moe.yaml"
    threads: get_threads("distill")
    resources:
        mem_mb=get_mem_mb("distill"),
        runtime=get_runtime("distill"),
        gpu=get_gpu("distill"),
    params:
        cfg=get_stage_config("distill"),
        model=get_student,
        out_dir=get_out_dir,
    message:
        "distill: the distill probe; log: {log}"
    shell:
        "evil-moe distill --config-json {params.cfg:q} --problems {input.problems:q}"
        " --rollouts {input.rollouts:q} --model {params.model:q} --vhack {input.vhack:q}"
        " --out-dir {params.out_dir:q} > {log:q} 2>&1"
