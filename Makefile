# Two entry points: `make demo` and `make test`. Both build .venv themselves.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test lint typecheck docs docs-serve bench bench-quick stress soak clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/python examples/self_destruct.py

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

typecheck: $(STAMP)
	$(BIN)/mypy

# The suite starts about 230 worker and command processes. Most are forked, already
# imported, by a launcher in each pytest process (tests/support/launcher.py); the launchers and
# about 120 others (a supervisor's children, -c scripts) start an interpreter. Their
# bytecode is written first: where PYTHONDONTWRITEBYTECODE is set (CI's shell may set it),
# each would otherwise compile durafn from source again (a worker's life: 1.06 s of CPU, 0.81 s from bytecode;
# docs/contributing.md).
test: lint typecheck
	$(BIN)/python -m compileall -q durafn tests examples _durafn_cli.py
	$(BIN)/pytest -n 2

# The documentation site (docs/, mkdocs.yml): strict, so a broken link or reference fails.
docs: $(STAMP)
	$(BIN)/mkdocs build --strict --site-dir site

docs-serve: $(STAMP)
	$(BIN)/mkdocs serve

BENCH_STAMP := $(VENV)/.bench-installed

$(BENCH_STAMP): $(STAMP) benchmarks/graphile/package.json
	$(BIN)/pip install --quiet -e '.[dev,bench]'
	# Graphile Worker, a peer in the benchmarks, where Node is present (else: skipped).
	if command -v npm >/dev/null; then npm install --prefix benchmarks/graphile --no-audit --no-fund --silent; fi
	touch $(BENCH_STAMP)

bench: $(BENCH_STAMP)
	$(BIN)/python -m benchmarks

bench-quick: $(BENCH_STAMP)
	$(BIN)/python -m benchmarks --quick

# Two executors in one process (an app and its app.using() twin) on the fake clock, rounds
# of fan-in work until a wake-up is lost (benchmarks/stress.py; outside the suite: minutes).
# PostgreSQL at 127.0.0.1:5432 (database durafn_stress, or $DURAFN_STRESS_PG_DATABASE) and
# SQLite; a CPU-burning process beside it. Exits 1 if a round hung. More:
# make stress STRESS_ARGS="--rounds 10000 --engines postgres".
STRESS_ARGS ?=
stress: $(STAMP)
	$(BIN)/python -m benchmarks.stress --rounds 3000 --burn 1 $(STRESS_ARGS)

# A long run, as deployments run (benchmarks/soak.py): a scratch PostgreSQL cluster with
# autovacuum on (initdb in a temporary folder, port 55432), an hour of mixed work with a
# kill -9 every 3 minutes, then W1-W4 on that cluster. Options: make soak SOAK_ARGS='--minutes 5'.
SOAK_ARGS ?=

soak: $(BENCH_STAMP)
	mkdir -p benchmarks/results
	$(BIN)/python -m benchmarks.soak --realwork --tracemalloc --json benchmarks/results/soak.json $(SOAK_ARGS)

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache durafn.egg-info
