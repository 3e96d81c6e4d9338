rule extract:
    input:
        problems=res("problems.jsonl"),
        rollouts=res("teacher/rollouts.jsonl.gz"),
        model=get_model_input("student"),
    output:
        hack=res("vhack/{name}_hack.safetensors"),
        random=res("vhack/{name}_random.safetensors"),
        shuffled=res("vhack/{name}_shuffled.safetensors"),
        table=report(
            res("vhack/{name}.tsv"),
            caption="../report/vhack.rst",
            category="3. v_hack",
            labels={"stage": "extract", "name": "{name}"},
        ),
        checks=report(
            res("vhack/{name}_checks.tsv"),
            caption="../report/vhack_checks.rst",
            category="3. v_hack",
            labels={"stage": "extract", "name": "{name}", "table": "checks"},
        ),
        curve=report(
            res("vhack/{name}_curve.tsv"),
            caption="../report/vhack_curve.rst",
            category="3. v_hack",
            labels={"stage": "extract", "name": "{name}", "table": "cin by pairs"},
        ),
        curve_fig=report(
            res("vhack/{name}_curve.svg"),
            caption="../report/fig_vhack_curve.rst",
            category="3. v_hack",
            labels={"stage": "extract", "name": "{name}", "figure": "cin by pairs"},
        ),
        curve_png=res("vhack/{name}_curve.png"),
    log:
        res("logs/extract/{name}.log"),
    benchmark:
        res("benchmarks/extract_{name}.tsv")
    conda:
        "../envs/evil_moe.yaml"
    threads: get_threads("extract")
    resources:
        mem_mb=get_mem_mb("extract"),
        runtime=get_runtime("extract"),
        gpu=get_gpu("extract"),
    params:
        cfg=get_stage_config("extract"),
        model=get_student,
        known=get_known_modes,
        out_dir=get_out_dir,
    message:
        "extract: v_hack {wildcards.name}; log: {log}"
    shell:
        "evil-moe extract --config-json {params.cfg:q} --problems {input.problems:q}"
        " --rollouts {input.rollouts:q} --model {params.model:q} --out-dir {params.out_dir:q}"
        " --name {wildcards.name} {params.known} > {log:q} 2>&1"
