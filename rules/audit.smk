# The detector audit (docs/detectors.md): calibration runs (vanilla on audit.seeds, every rollout
# scored by every detector and placebo), then the audit that fits the thresholds and the probe on
# them and says how well each detector sees hacks. route's and filter's pilots wait for it when
# their detector is thresholded on the calibration runs (pilot.detector_calibration fpr) or is
# the probe.


rule calibrate:
    input:
        unpack(get_calibrate_input),
    output:
        rows=res("audit/calibration/s{seed}/rows.tsv"),
        scores=res("audit/calibration/s{seed}/scores.safetensors"),
        steps=res("audit/calibration/s{seed}/steps.tsv"),
        status=res("audit/calibration/s{seed}/status.json"),
    log:
        res("logs/calibrate/s{seed}.log"),
    benchmark:
        res("benchmarks/calibrate/s{seed}.tsv")
    # before every pilot: route's pilots wait for the audit (evil_moe.cluster.resources)
    priority: GATING_PRIORITY
    conda:
        "../envs/evil_moe.yaml"
    threads: get_threads("pilot")
    resources:
        mem_mb=get_mem_mb("pilot"),
        runtime=get_runtime("pilot"),
        gpu=get_gpu("pilot"),
    params:
        cfg=get_stage_config("calibrate"),
        model=STUDENT,
        options=get_calibrate_options,
        out_dir=res("audit/calibration/s{seed}"),
    message:
        "calibrate: detector calibration run seed {wildcards.seed}; log: {log}"
    shell:
        "evil-moe calibrate --config-json {params.cfg:q} --problems {input.problems:q}"
        " --model {params.model:q} --vhack {input.vhack:q} --shuffled-vhack {input.shuffled:q}"
        " --seed {wildcards.seed} {params.options} --out-dir {params.out_dir:q} > {log:q} 2>&1"


rule audit:
    input:
        runs=expand(res("audit/calibration/s{seed}/status.json"), seed=AUDIT_SEEDS),
        rows=expand(res("audit/calibration/s{seed}/rows.tsv"), seed=AUDIT_SEEDS),
    output:
        calibration=res("audit/calibration.json"),
        quality=report(
            res("audit/quality.tsv"),
            caption="../report/audit_quality.rst",
            category="5. Detectors",
            labels={"stage": "audit", "result": "quality"},
        ),
        curve=res("audit/probe_curve.tsv"),
        figure=report(
            res("audit/figures/probe_curve.svg"),
            caption="../report/fig_probe_curve.rst",
            category="5. Detectors",
            labels={"stage": "audit", "result": "probe curve"},
        ),
    log:
        res("logs/audit.log"),
    priority: GATING_PRIORITY
    conda:
        "../envs/evil_moe.yaml"
    threads: get_threads("compare")
    resources:
        mem_mb=get_mem_mb("compare"),
        runtime=get_runtime("compare"),
    params:
        cfg=get_stage_config("audit"),
        runs=get_calibration_runs,
        out_dir=get_out_dir,
    message:
        "audit: detector quality on the calibration runs; log: {log}"
    shell:
        "evil-moe audit --config-json {params.cfg:q} {params.runs} --out-dir {params.out_dir:q} > {log:q} 2>&1"
