# The pilot comparison is a checkpoint: the sweep target reads its gate.json (get_sweep_input).


checkpoint compare:
    input:
        unpack(get_compare_audit),
        pilots=get_compare_input,
        samples=res("distill/samples.tsv"),
        vhack_checks=res("vhack/main_checks.tsv"),
    output:
        **(
            {
                "heldout_trajectory": report(
                    res("compare/figures/heldout_trajectory.svg"),
                    caption="../report/fig_heldout_trajectory.rst",
                    category="0. Verdict",
                    labels={"stage": "compare", "result": "held-out trajectory"},
                ),
                "heldout_trajectory_png": res(
                    "compare/figures/heldout_trajectory.png"
                ),
            }
            if TRAJECTORY
            else {}
        ),
        gate=report(
            res("compare/gate.json"),
            caption="../report/gate.rst",
            category="0. Verdict",
            labels={"stage": "compare", "result": "gate"},
        ),
        gate_md=res("compare/gate.md"),
        summary=report(
            res("compare/summary.tsv"),
            caption="../report/summary.rst",
            category="0. Verdict",
            labels={"stage": "compare", "result": "summary"},
        ),
        heldout=report(
            res("compare/figures/heldout.svg"),
            caption="../report/fig_heldout.rst",
            category="0. Verdict",
            labels={"stage": "compare", "result": "held-out comparison"},
        ),
        hack_rate=report(
            res("compare/figures/hack_rate.svg"),
            caption="../report/fig_hack_rate.rst",
            category="8. Trajectories",
            labels={"stage": "compare", "figure": "hack_rate"},
        ),
        removed=report(
            res("compare/figures/removed.svg"),
            caption="../report/fig_removed.rst",
            category="8. Trajectories",
            labels={"stage": "compare", "figure": "removed"},
        ),
        pass_rate=report(
            res("compare/figures/pass_rate.svg"),
            caption="../report/fig_pass_rate.rst",
            category="8. Trajectories",
            labels={"stage": "compare", "figure": "pass_rate"},
        ),
        cin=report(
            res("compare/figures/cin.svg"),
            caption="../report/fig_cin.rst",
            category="8. Trajectories",
            labels={"stage": "compare", "figure": "cin"},
        ),
        frac_clipped=report(
            res("compare/figures/frac_clipped.svg"),
            caption="../report/fig_frac_clipped.rst",
            category="8. Trajectories",
            labels={"stage": "compare", "figure": "frac_clipped"},
        ),
        cos_contrib=report(
            res("compare/figures/cos_contrib.svg"),
            caption="../report/fig_cos_contrib.rst",
            category="4. Distill probe",
            labels={"stage": "distill", "table": "cos_contrib figure"},
        ),
        ceiling=report(
            res("compare/figures/ceiling.svg"),
            caption="../report/fig_ceiling.rst",
            category="0. Verdict",
            labels={"stage": "compare", "result": "ceilings"},
        ),
        absorption=report(
            res("compare/figures/absorption.svg"),
            caption="../report/fig_absorption.rst",
            category="0. Verdict",
            labels={"stage": "compare", "result": "absorption"},
        ),
        phases=report(
            res("compare/figures/phases.svg"),
            caption="../report/fig_phases.rst",
            category="8. Trajectories",
            labels={"stage": "compare", "figure": "phases"},
        ),
        png=expand(res("compare/figures/{figure}.png"), figure=FIGURES),
    log:
        res("logs/compare.log"),
    conda:
        "../envs/evil_moe.yaml"
    threads: get_threads("compare")
    resources:
        mem_mb=get_mem_mb("compare"),
        runtime=get_runtime("compare"),
    params:
        cfg=get_stage_config("compare"),
        pilots=get_compare_pilots,
        audit=get_compare_audit_option,
        out_dir=get_compare_out_dir,
    message:
        "compare: the pilot comparison and the gate; log: {log}"
    shell:
        "evil-moe compare --config-json {params.cfg:q} {params.pilots} {params.audit}"
        " --distill-samples {input.samples:q} --vhack-checks {input.vhack_checks:q} --out-dir {params.out_dir:q} > {log:q} 2>&1"
