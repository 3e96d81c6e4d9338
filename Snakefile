# evil_moe: reward hacking in RL fine-tuning, stopped at the gradient level.
#   snakemake --profile profiles/local                 # embedded default (toy models, CPU)
#   snakemake --profile profiles/slurm --configfile config/pilot.yaml   # after `make slurm-check`
#   snakemake --profile profiles/local --report results/report.html
# Data flow and file names: rules/*.smk (one per stage), config keys: config/schema.yaml, job
# sizes: evil_moe/cluster/resources.py (through rules/common.smk).


from snakemake.utils import min_version

min_version("9.0")


configfile: "config/config.yaml"


report: "report/workflow.rst"


include: "rules/common.smk"
include: "rules/problems.smk"
include: "rules/models.smk"
include: "rules/toy.smk"
include: "rules/teacher.smk"
include: "rules/extract.smk"
include: "rules/planted.smk"
include: "rules/distill.smk"
include: "rules/audit.smk"
include: "rules/pilot.smk"
include: "rules/compare.smk"
include: "rules/detector_sweep.smk"
include: "rules/sweep.smk"
include: "rules/reevaluate.smk"


rule all:
    default_target: True
    input:
        get_final_output,
        get_detector_sweep_target,
