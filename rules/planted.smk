# The planted world (toy.plant; docs/planted.md): the known hack direction as a v_hack over the
# pilot adapter's modules (erase_planted erases along it), and the world's checks.


rule planted_vhack:
    input:
        unpack(get_plant_input),
    output:
        res("vhack/planted.safetensors"),
    log:
        res("logs/planted_vhack.log"),
    conda:
        "../envs/evil_moe.yaml"
    threads: get_threads("extract")
    resources:
        mem_mb=get_mem_mb("extract"),
        runtime=get_runtime("extract"),
        gpu=get_gpu("extract"),
    params:
        cfg=get_stage_config("planted_vhack"),
        model=get_student,
    message:
        "planted_vhack: the planted direction; log: {log}"
    shell:
        "evil-moe planted-vhack --config-json {params.cfg:q} --model {params.model:q}"
        " --problems {input.problems:q} --out {output:q} > {log:q} 2>&1"


rule planted_checks:
    input:
        unpack(get_planted_checks_input),
    output:
        recovery=report(
            res("planted/recovery.tsv"),
            caption="../report/planted_recovery.rst",
            category="7. Planted world",
            labels={"stage": "planted", "table": "recovery"},
        ),
        checks=report(
            res("planted/checks.tsv"),
            caption="../report/planted_checks.rst",
            category="7. Planted world",
            labels={"stage": "planted", "table": "checks"},
        ),
    log:
        res("logs/planted_checks.log"),
    conda:
        "../envs/evil_moe.yaml"
    threads: get_threads("compare")
    resources:
        mem_mb=get_mem_mb("compare"),
        runtime=get_runtime("compare"),
    params:
        cfg=get_stage_config("planted_checks"),
        pilots=get_planted_pilot_flags,
        out_dir=get_out_dir,
    message:
        "planted_checks: v_hack's recovery of the plant, erase_planted vs random_v; log: {log}"
    shell:
        "evil-moe planted-checks --config-json {params.cfg:q} --planted {input.planted:q}"
        " --vhack main_hack={input.hack:q} --vhack main_random={input.random:q}"
        " --vhack main_shuffled={input.shuffled:q} {params.pilots} --out-dir {params.out_dir:q}"
        " > {log:q} 2>&1"
