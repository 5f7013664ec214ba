# The README's two commands: `make quick` and `make test`.
SHELL := /bin/bash
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
BIN := $(VENV)/bin
CORES ?= 2
TEST_WORKERS ?= 2
export MLFLOW_DISABLE_TELEMETRY := true
export PYTHONUNBUFFERED := 1

# When this make began and the 1-minute load average then, before its own install or jobs add
# to it. RECORDED runs a build and, when it succeeds, writes its duration record under
# bench/results/durations/ (darel/tools/build_record.py; the page: docs/durations.md).
MAKE_STARTED := $(shell $(PYTHON) -c 'import os, time; print(f"{time.time():.3f} {os.getloadavg()[0]:.2f}")' 2>/dev/null)
RECORDED = $(BIN)/python -m darel.tools.build_record --target $@ --install-stamp $(VENV)/.installed \
	--make-started "$(word 1,$(MAKE_STARTED))" --load-before "$(word 2,$(MAKE_STARTED))"

.PHONY: quick tables studies test test-fast test-ui bench dvc-repro mlflow-ui clean gpu-kit report

$(BIN)/activate:
	$(PYTHON) -m venv $(VENV)

# pip byte-compiles what it installs on one core; compileall does it afterwards on every core:
# 101 s against 126 s for the install on the 2-core machine (bench/results/install_compile_2026-11-30.txt).
# A few packages ship test files that are not Python 3, which pip skips in the same way: those
# failures go to .venv/compileall.log and the install goes on (an uncompiled file costs its first import).
$(VENV)/.installed: requirements.lock pyproject.toml | $(BIN)/activate
	$(BIN)/python -m pip install -q --no-compile -r requirements.lock
	$(BIN)/python -m pip install -q --no-compile --no-deps --no-build-isolation -e .
	$(BIN)/python -m compileall -q -j 0 "$$($(BIN)/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')" \
		> $(VENV)/compileall.log 2>&1 || true
	touch $@

## Build Table 1 on the offline quick profile (CPU, minutes).
quick: $(VENV)/.installed
	$(RECORDED) -- $(BIN)/snakemake --cores $(CORES) results/table1.csv
	@$(BIN)/python -m darel.tools.summary

## A self-contained HTML report to send a colleague (results/report.html): Table 1 beside the paper, the
## plot, the comparison with each row's reasons, the data card and, where built, Tables 2/3 and the
## studies' verdicts, with captions, beside Snakemake's DAG, runtimes and packages. Run it after make
## quick: it builds only the data card's page (or name other targets with REPORT_TARGETS).
REPORT_TARGETS ?= results/table1.csv results/data_card.md $(wildcard results/table2.csv results/table3.csv \
	results/study_table1.csv results/study_table2.csv results/study_table3.csv)
report: $(VENV)/.installed
	$(BIN)/snakemake --cores 1 results/data_card.md
	$(BIN)/snakemake --report results/report.html $(REPORT_TARGETS)
	@echo "open results/report.html"

## All three tables on the quick profile (Table 1, then Tables 2/3; durations: README, "How long it takes").
tables: $(VENV)/.installed
	$(RECORDED) -- $(BIN)/snakemake --cores $(CORES) results/table1.csv results/table2.csv results/table3.csv
	@$(BIN)/python -m darel.tools.summary

## The studies: every control at the same budgets, over the declared seeds (hours on 2 cores: README, "How long it takes").
studies: $(VENV)/.installed
	$(RECORDED) -- $(BIN)/snakemake --cores $(CORES) results/study_table1.csv results/study_table2.csv results/study_table3.csv
	@$(BIN)/python -m darel.tools.summary

## The whole test suite (unit tests and the real Snakemake/DVC/MLflow runs), whole test files
## spread over $(TEST_WORKERS) worker processes (TEST_WORKERS=1 for one; the slowest 15 tests are listed).
test: $(VENV)/.installed
	$(RECORDED) --no-jobs -- $(BIN)/python -m pytest -q -ra -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder --durations=15

## The MLflow UI in a real headless Chromium (tests_ui/): installs Debian's chromium (apt-get,
## as root) and playwright (requirements-ui.lock) where missing, or stops with one line saying which.
test-ui: $(VENV)/.installed
	@tests_ui/setup.sh
	DAREL_TEST_UI_REQUIRED=1 $(BIN)/python -m pytest -q -ra tests_ui

## Unit tests only (skips the end-to-end workflow runs).
test-fast: $(VENV)/.installed
	$(BIN)/python -m pytest -q -m "not slow"

bench: $(VENV)/.installed
	$(BIN)/python bench/online.py
	$(BIN)/python bench/nlg.py
	$(BIN)/python bench/gpu.py --quick
	$(BIN)/python bench/budget.py --before 9781502
	$(BIN)/python bench/faults.py

## The wheels a lent GPU machine (Python 3.12, x86-64, no package index) lacks for Table 1 and the
## benchmarks, into gpu-kit/ (ignored; carried with the tree), with a size report: bench/README.md, "On a GPU".
gpu-kit: $(VENV)/.installed
	$(BIN)/python -m darel.tools.gpu_kit --dest gpu-kit

## The three tables through DVC, in the environment (the studies: dvc repro studies/dvc.yaml).
dvc-repro: $(VENV)/.installed
	PATH=$(CURDIR)/$(BIN):$$PATH $(BIN)/dvc repro

## MLflow on Table 1: starts the server and, once it answers, prints the address of the table's view (Ctrl-C stops it).
mlflow-ui: $(VENV)/.installed
	@$(BIN)/python -m darel.tools.mlflow_ui --port $${MLFLOW_PORT:-5000}

clean:
	rm -rf runs results/cells results/table1* results/table2* results/table3* results/study_* logs .snakemake

.PHONY: pull test-cluster

## Another clone's results from the DVC remote (README "Many machines"): dvc pull (what was pushed), then
## snakemake --touch (the pulled files' times in the DAG's order), then a check that
## `snakemake -n` plans nothing.
pull: $(VENV)/.installed
	PATH=$(CURDIR)/$(BIN):$$PATH $(BIN)/dvc pull --allow-missing  # the stages that were never pushed are built here
	$(BIN)/snakemake --touch --cores 1 $(or $(TARGETS),results/table1.csv) >/dev/null
	@$(BIN)/snakemake -n $(or $(TARGETS),results/table1.csv) 2>&1 | grep -q "Nothing to be done" \
	  && echo "make pull: everything is here; snakemake plans nothing" \
	  || { $(BIN)/snakemake -n $(or $(TARGETS),results/table1.csv); echo "make pull: snakemake still plans the jobs above (not on the remote yet?)"; exit 1; }

## The cluster proof (README "Many machines"): a one-node Slurm with accounting, PostgreSQL and
## `mlflow server` on this machine (root and apt), then tests/cluster. CI runs it after `make test`.
test-cluster: $(VENV)/.installed
	bash tests/cluster/run.sh
