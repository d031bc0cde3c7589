# Two commands for a newcomer: `make demo` and `make test`. Both set everything up first.
PYTHON ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
export DAGSTER_HOME ?= $(CURDIR)/.dagster_home

.PHONY: setup demo test ui clean

setup: $(STAMP)

# Packages, then the Delta jars (once, from Maven Central, into .cache/), then the Dagster home.
$(STAMP): pyproject.toml dagster.yaml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e ".[test]"
	$(BIN)/incremental-assets setup
	touch $(STAMP)

demo: setup
	$(BIN)/incremental-assets demo

# pytest exits 5 when it collects no test; make treats any non-zero exit as a failure.
test: setup
	$(BIN)/pytest -q -p no:cacheprovider

ui: setup
	$(BIN)/dagster dev -h 127.0.0.1 -p 3000 -w workspace.yaml

clean:
	rm -rf warehouse .dagster_home
