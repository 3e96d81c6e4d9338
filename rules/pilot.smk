# One Dr.GRPO pilot per (arm, seed). A pilot checkpoints into its own folder and resumes from it,
# so a requeued Slurm job (slurm-requeue) or a rerun after a kill continues where it stopped.
#
# Three rules run the same `evil-moe pilot` command (PILOT_COMMAND) at the same job size; they
# differ only in their inputs, folder, config and report entries: pilot (the comparison's runs,
# with a benchmark), fold_pilot (a leave-one-mode-out fold) and level_pilot (one detector
# quality). pilot and fold_pilot are written out in full (a `use rule` can add a benchmark but
# not remove pilot's); level_pilot reuses fold_pilot (`use rule ... with:` replaces what it names,
# params key by key).
PILOT_COMMAND = (
    "evil-moe pilot --config-json {params.cfg:q} --problems {input.problems:q}"
    " --model {params.model:q} --vhack {input.vhack:q} --random-vhack {input.random_vhack:q}"
    " --arm {wildcards.arm} --seed {wildcards.seed} {params.options}"
    " --out-dir {params.out_dir:q} > {log:q} 2>&1"
)


# The comparison's pilots: v_hack from the known modes, tables in the report.
rule pilot:
    input:
        unpack(get_pilot_input),
    output:
        **(
            {"trajectory": res("pilots/{arm}/s{seed}/trajectory.tsv")}
            if TRAJECTORY
            else {}
        ),
        steps=report(
            res("pilots/{arm}/s{seed}/steps.tsv"),
            caption="../report/pilot_steps.rst",
            category="6. Pilots",
            subcategory="{arm}",
            labels={
                "stage": "pilot",
                "arm": "{arm}",
                "seed": "{seed}",
                "table": "steps",
            },
        ),
        eval=report(
            res("pilots/{arm}/s{seed}/eval.tsv"),
            caption="../report/pilot_eval.rst",
            category="6. Pilots",
            subcategory="{arm}",
            labels={
                "stage": "pilot",
                "arm": "{arm}",
                "seed": "{seed}",
                "table": "eval",
            },
        ),
        outcomes=report(
            res("pilots/{arm}/s{seed}/outcomes.tsv"),
            caption="../report/pilot_outcomes.rst",
            category="6. Pilots",
            subcategory="{arm}",
            labels={
                "stage": "pilot",
                "arm": "{arm}",
                "seed": "{seed}",
                "table": "outcomes",
            },
        ),
        rows=res("pilots/{arm}/s{seed}/rows.tsv"),
        rollouts=res("pilots/{arm}/s{seed}/rollouts.jsonl.gz"),
        adapter=res("pilots/{arm}/s{seed}/adapter.safetensors"),
        status=res("pilots/{arm}/s{seed}/status.json"),
    log:
        res("logs/pilot/{arm}_s{seed}.log"),
    benchmark:
        res("benchmarks/pilot/{arm}_s{seed}.tsv")
    priority: get_pilot_priority
    conda:
        "../envs/evil_moe.yaml"
    threads: get_threads("pilot")
    resources:
        mem_mb=get_mem_mb("pilot"),
        runtime=get_runtime("pilot"),
        gpu=get_gpu("pilot"),
    params:
        cfg=get_pilot_config,
        model=STUDENT,
        options=get_pilot_options,
        out_dir=res("pilots/{arm}/s{seed}"),
    message:
        "pilot {wildcards.arm} seed {wildcards.seed}; log: {log}"
    shell:
        PILOT_COMMAND


# The pilot with v_hack extracted without one mode (sweep.folds): the held-out mode's hack rate
# says whether the direction generalises to a loophole the detector never saw.
rule fold_pilot:
    input:
        unpack(get_fold_pilot_input),
    output:
        steps=res("sweep/folds/{mode}/{arm}/s{seed}/steps.tsv"),
        eval=res("sweep/folds/{mode}/{arm}/s{seed}/eval.tsv"),
        outcomes=res("sweep/folds/{mode}/{arm}/s{seed}/outcomes.tsv"),
        rows=res("sweep/folds/{mode}/{arm}/s{seed}/rows.tsv"),
        rollouts=res("sweep/folds/{mode}/{arm}/s{seed}/rollouts.jsonl.gz"),
        adapter=res("sweep/folds/{mode}/{arm}/s{seed}/adapter.safetensors"),
        status=res("sweep/folds/{mode}/{arm}/s{seed}/status.json"),
    log:
        res("logs/fold_pilot/{mode}/{arm}_s{seed}.log"),
    priority: get_pilot_priority
    conda:
        "../envs/evil_moe.yaml"
    threads: get_threads("pilot")
    resources:
        mem_mb=get_mem_mb("pilot"),
        runtime=get_runtime("pilot"),
        gpu=get_gpu("pilot"),
    params:
        cfg=get_pilot_config,
        model=STUDENT,
        options=get_pilot_options,
        out_dir=res("sweep/folds/{mode}/{arm}/s{seed}"),
    message:
        "fold_pilot without {wildcards.mode}: {wildcards.arm} seed {wildcards.seed}; log: {log}"
    shell:
        PILOT_COMMAND


# The detector-quality sweep (config/detector_sweep.yaml; docs/arms.md): route and filter with
# the noisy_label detector at one level's precision and recall (wildcard level = p{P}_r{R}).
use rule fold_pilot as level_pilot with:
    input:
        unpack(get_pilot_input),
    output:
        steps=res("detector_sweep/{level}/{arm}/s{seed}/steps.tsv"),
        eval=res("detector_sweep/{level}/{arm}/s{seed}/eval.tsv"),
        outcomes=res("detector_sweep/{level}/{arm}/s{seed}/outcomes.tsv"),
        rows=res("detector_sweep/{level}/{arm}/s{seed}/rows.tsv"),
        rollouts=res("detector_sweep/{level}/{arm}/s{seed}/rollouts.jsonl.gz"),
        adapter=res("detector_sweep/{level}/{arm}/s{seed}/adapter.safetensors"),
        status=res("detector_sweep/{level}/{arm}/s{seed}/status.json"),
    log:
        res("logs/level_pilot/{level}/{arm}_s{seed}.log"),
    params:
        cfg=get_level_pilot_config,
        out_dir=res("detector_sweep/{level}/{arm}/s{seed}"),
    message:
        "level_pilot detector {wildcards.level}: {wildcards.arm} seed {wildcards.seed}; log: {log}"
