#!/usr/bin/env bash
# Runs once inside the new conda env of envs/evil_moe.yaml (snakemake --use-conda), from the
# working directory of the run (the repository root): the pinned requirements, then evil_moe.
set -euo pipefail
pip install -r requirements.txt
pip install --no-deps -e .
