rule problems:
    output:
        res("problems.jsonl"),
    log:
        res("logs/problems.log"),
    conda:
        "../envs/evil_moe.yaml"
    threads: get_threads("problems")
    resources:
        mem_mb=get_mem_mb("problems"),
        runtime=get_runtime("problems"),
    params:
        cfg=get_stage_config("problems"),
    message:
        "problems: the problem set; log: {log}"
    shell:
        "evil-moe problems --config-json {params.cfg:q} --out {output:q} > {log:q} 2>&1"
