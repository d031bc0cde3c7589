# Two commands for a newcomer: `make demo` and `make test`. Both set everything up first.
PYTHON ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# Debian's Chromium, for the browser test (tests/system/test_ui_browser.py), and its PostgreSQL, for
# the daemon's test on the production instance (tests/system/test_dagster_surfaces.py).
CHROMIUM := /usr/bin/chromium
POSTGRES := /usr/lib/postgresql
export DAGSTER_HOME ?= $(CURDIR)/.dagster_home

.PHONY: setup demo test soak bench bench-maintenance bench-process bench-object-store bench-history bench-erasure ui clean

# Packages (again only when pyproject.toml changes), then the Delta jars (resolved once from
# Maven Central into .cache/, a quick no-op after) and the Dagster home.
setup: $(STAMP)
	$(BIN)/incremental-assets setup

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e ".[test,connect,bench,postgres]"
	touch $(STAMP)

demo: setup
	$(BIN)/incremental-assets demo

# pytest exits 5 when it collects no test; make treats any non-zero exit as a failure.
test: setup $(CHROMIUM) $(POSTGRES)
	$(BIN)/pytest -q -p no:cacheprovider -m "not soak" -n 2 --dist loadfile

# tests/system/test_ui_browser.py drives the Dagster UI in Debian's Chromium (Playwright's own browser
# downloads are not used): installed once, as root, when it is missing.
$(CHROMIUM):
	@test "$$(id -u)" = 0 || { echo "make test needs Debian's chromium at $@: apt-get install chromium (as root)" >&2; exit 1; }
	apt-get update
	DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends chromium

$(POSTGRES):
	@test "$$(id -u)" = 0 || { echo "make test needs Debian's postgresql at $@: apt-get install postgresql (as root)" >&2; exit 1; }
	apt-get update
	DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends postgresql

# Not part of make test: what runs cost on this machine (BENCH_SIZE=full goes bigger). Writes
# benchmarks/results.md and benchmarks/results.json; BENCH_ONLY=steady_state (or big_window,
# first_backfill) measures that part again and keeps the others.
bench: setup
	$(BIN)/python benchmarks/bench.py --size $(or $(BENCH_SIZE),small) $(if $(BENCH_ONLY),--only $(BENCH_ONLY))

# 50 small runs, then the maintenance job: files, read times and rows before and after
# (benchmarks/results/maintenance.json).
bench-maintenance: setup
	$(BIN)/python benchmarks/maintenance.py --runs 50

# One-hour runs as whole processes on 7 and 60 days of history, and where their seconds go, at
# the earlier benches' shape and at a real site's (benchmarks/results/process.json and
# process-site.json; make bench adds them to results.md).
bench-process: setup
	$(BIN)/python benchmarks/process.py --histories 7 60 --reps 3
	$(BIN)/python benchmarks/process.py --shape site --histories 7 60 --reps 3

# The same history on local disk and in a bucket of moto's S3 server, side by side: one-hour runs
# and a run over a million events (benchmarks/results/object_store.json; make bench adds it).
bench-object-store: setup
	$(BIN)/python benchmarks/object_store.py --reps 3

# attributes_history on 90 days of 20,000 events a day: its cost beside attributes, its rows per
# key, a point-in-time lookup of 100,000 examples (benchmarks/results/attributes_history.json; make bench adds it).
bench-history: setup
	$(BIN)/python benchmarks/history.py --reps 3

# Seconds per forgotten person against the warehouse's size, at a real site's shape
# (benchmarks/results/erasure.json; make bench adds it).
bench-erasure: setup
	$(BIN)/python benchmarks/erasure.py

# Not part of make test: the batching property searched longer (hypothesis' soak profile), and the
# crash matrix (tests/soak/, a process per failure).
soak: setup
	HYPOTHESIS_PROFILE=soak $(BIN)/pytest -q -p no:cacheprovider -m "soak or property" -n 2 --dist loadfile

# The webserver and the daemon (dagster dev) with the warm worker beside them, as a deployment runs
# them (docs/deployment.md): the runs they launch start in its warm Spark session. The worker stops
# with them. UI_PORT=3001 serves elsewhere.
UI_PORT ?= 3000
ui: setup
	$(BIN)/incremental-assets serve & worker=$$!; \
	trap 'kill $$worker 2>/dev/null; wait $$worker' EXIT; \
	$(BIN)/dagster dev -h 127.0.0.1 -p $(UI_PORT) -w workspace.yaml

clean:
	rm -rf warehouse .dagster_home
