rule problems:
    output:
        res("problems.jsonl"),
    log:
        res("logs/problems.log"),
    conda:
        "../envs/evil_moe.yaml"
    params:
        cfg=get_stage_config("problems"),
    shell:
        "evil-moe problems --config-json {params.cfg:q} --out {output:q} > {log:q} 2>&1"
