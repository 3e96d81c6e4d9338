rule convert_smollm2:
    output:
        res("models/smollm2/config.json"),
    log:
        res("logs/convert_smollm2.log"),
    conda:
        "../envs/evil_moe.yaml"
    threads: get_threads("convert_smollm2")
    resources:
        mem_mb=get_mem_mb("convert_smollm2"),
        runtime=get_runtime("convert_smollm2"),
    params:
        out_dir=get_out_dir,
        dtype=config["models"]["dtype"],
    message:
        "convert_smollm2: dequantising SmolLM2-135M-Instruct; log: {log}"
    shell:
        "evil-moe convert-smollm2 --out-dir {params.out_dir:q} --dtype {params.dtype}"
        " > {log:q} 2>&1"
