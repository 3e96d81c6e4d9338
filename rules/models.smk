rule convert_smollm2:
    output:
        res("models/smollm2/config.json"),
    log:
        res("logs/convert_smollm2.log"),
    conda:
        "../envs/evil_moe.yaml"
    threads: 1
    params:
        out_dir=get_out_dir,
        dtype=config["models"]["dtype"],
    shell:
        "evil-moe convert-smollm2 --out-dir {params.out_dir:q} --dtype {params.dtype}"
        " > {log:q} 2>&1"
