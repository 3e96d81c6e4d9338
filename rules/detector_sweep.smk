# The detector-quality sweep's comparison: each swept arm's held-out hack-rate drop vs vanilla
# against the detector's precision and recall (results/detector_sweep/summary.tsv and figure).


rule detector_sweep:
    input:
        pilots=get_detector_sweep_input,
    output:
        summary=report(
            res("detector_sweep/summary.tsv"),
            caption="../report/detector_sweep.rst",
            category="5. Detectors",
            labels={"stage": "detector_sweep", "result": "quality sweep"},
        ),
        figure=report(
            res("detector_sweep/quality.svg"),
            caption="../report/fig_detector_sweep.rst",
            category="5. Detectors",
            labels={"stage": "detector_sweep", "result": "quality sweep figure"},
        ),
        png=res("detector_sweep/quality.png"),
    log:
        res("logs/detector_sweep.log"),
    conda:
        "../envs/evil_moe.yaml"
    threads: get_threads("compare")
    resources:
        mem_mb=get_mem_mb("compare"),
        runtime=get_runtime("compare"),
    params:
        cfg=get_stage_config("detector_sweep"),
        pilots=get_detector_sweep_pilots,
        out_dir=get_out_dir,
    message:
        "detector_sweep: drop vs vanilla against detector quality; log: {log}"
    shell:
        "evil-moe detector-sweep --config-json {params.cfg:q} {params.pilots}"
        " --out-dir {params.out_dir:q} > {log:q} 2>&1"
