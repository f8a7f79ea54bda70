# dstl: `make demo` sets everything up and runs the demo; `make test` the tests.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-dev
DEMO_STAMP := $(VENV)/.installed-demo
BENCH_STAMP := $(VENV)/.installed-bench

.PHONY: all venv java-check demo demo-core test test-fast lint typecheck pytest proto proto-check bench bench-core bench-hedging bench-spark bench-fuzz bench-tree bench-cluster bench-chaos bench-bounded bench-api bench-recovery bench-mat clean dist image-test

all: test

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[dev]'
	touch $(STAMP)

venv: $(STAMP)

# the benchmarks' extra packages (matplotlib for the report plots), on top of dev
$(BENCH_STAMP): $(STAMP)
	$(PY) -m pip install -q -e '.[dev,bench]'
	touch $(BENCH_STAMP)

# What the demo needs only: dstl and its `spark` extra (not the development set).
$(DEMO_STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[spark]'
	touch $(DEMO_STAMP)

# Spark needs Java 17 or newer: on PATH or under $JAVA_HOME (tools/check_java.sh).
java-check:
	@sh tools/check_java.sh

# The main job: a real PySpark Structured Streaming job on the DSTL.
demo: java-check $(DEMO_STAMP)
	$(PY) examples/spark_demo.py

# The sidecar alone: concurrent writers, checkpoints, truncation, a verified recovery read.
demo-core: $(DEMO_STAMP)
	$(PY) examples/demo.py

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/lint-imports

typecheck: $(STAMP)
	$(VENV)/bin/mypy dstl_server dstl_client loadtest tests tools

proto: $(STAMP)
	$(PY) tools/gen_proto.py

proto-check: $(STAMP)
	$(PY) tools/gen_proto.py --check

# Test files run in parallel worker processes (pytest-xdist), all the tests of one file in
# one worker: most of a test's time is spent waiting on Spark, SeaweedFS and sidecar
# processes, so two workers fill the two cores of CI. `make pytest PYTEST_WORKERS=0`: serial.
PYTEST_WORKERS ?= 2
XDIST = $(if $(filter 0,$(PYTEST_WORKERS)),,-n $(PYTEST_WORKERS) --dist loadfile)

pytest: $(STAMP)
	$(PY) -m pytest -q -ra --durations=30 $(XDIST) $(PYTEST_ARGS)

test: lint typecheck pytest

# The inner loop: lint, types and every test not marked slow, spark or s3: no JVM, no
# SeaweedFS (under 3 minutes on 2 cores). `make test` (all of it) is the CI command.
test-fast: lint typecheck
	$(PY) -m pytest -q -ra -m "not slow and not spark and not s3" $(XDIST) $(PYTEST_ARGS)

# All benchmarks with their defaults (tens of minutes); the targets below take BENCH_ARGS.
bench: $(BENCH_STAMP)
	$(PY) -m loadtest.bench
	$(PY) -m loadtest.hedging_bench
	$(PY) examples/spark_bench.py
	$(PY) -m loadtest.wire_fuzz
	$(PY) -m loadtest.tree_bench
	$(PY) -m loadtest.cluster_bench
	$(PY) -m loadtest.bounded_bench
	$(PY) -m loadtest.api_bench
	$(PY) -m loadtest.recovery_bench
	$(PY) -m loadtest.chaos_bench

bench-core: $(BENCH_STAMP)
	$(PY) -m loadtest.bench $(BENCH_ARGS)

bench-hedging: $(BENCH_STAMP)
	$(PY) -m loadtest.hedging_bench $(BENCH_ARGS)

bench-spark: $(BENCH_STAMP)
	$(PY) examples/spark_bench.py $(BENCH_ARGS)

bench-fuzz: $(BENCH_STAMP)
	$(PY) -m loadtest.wire_fuzz $(BENCH_ARGS)

bench-tree: $(BENCH_STAMP)
	$(PY) -m loadtest.tree_bench $(BENCH_ARGS)

# Spark standalone clusters of 2 and 3 nodes (one sidecar each) with random node kills
bench-cluster: $(BENCH_STAMP)
	$(PY) -m loadtest.cluster_bench $(BENCH_ARGS)

# A keyed job with timers on a 2-node cluster under a seeded random fault schedule (kills of
# sidecars, executors, nodes and the driver, a rescale, S3 503s/resets/stalls); 30 min
bench-chaos: $(BENCH_STAMP)
	$(PY) -m loadtest.chaos_bench $(BENCH_ARGS)

bench-bounded: $(BENCH_STAMP)
	$(PY) -m loadtest.bounded_bench $(BENCH_ARGS)

# count and sum per key as transformWithStateInPandas, transform_with_state, transform_batches
# and Spark's JVM aggregation (the ceiling), one process each; BENCH_ARGS="--preset large": 1 M keys
bench-api: $(BENCH_STAMP)
	$(PY) -m loadtest.api_bench $(BENCH_ARGS)

# restore from a materialization + changelog tail vs a full snapshot vs Spark's RocksDB store
bench-recovery: $(BENCH_STAMP)
	$(PY) -m loadtest.recovery_bench $(BENCH_ARGS)

bench-mat: $(BENCH_STAMP)
	$(PY) -m loadtest.mat_bench $(BENCH_ARGS)

# sdist and wheel in dist/ (offline: setuptools and wheel of the dev extra), checked by
# twine; the Helm chart packaged into dist/helm with Helm's SDK (the dev extra's
# helm-python-sdk: no helm binary needed)
dist: $(STAMP)
	rm -rf dist
	$(PY) -m build --no-isolation --outdir dist .
	$(PY) -m twine check --strict dist/*.tar.gz dist/*.whl
	mkdir -p dist/helm
	$(PY) -c "import helm_python; print(helm_python.package('deploy/helm/dstl', destination='dist/helm'))"

# Build the sidecar image with podman on a Debian base made here (no Docker engine, no
# registry) and start it: READY, gRPC health, /metrics, a non-root uid, a clean stop
# (tools/image_test.py). Root on Debian; installs podman, runc and mmdebstrap with
# apt-get when missing. About 4 minutes the first time, 1 after: not part of `make test`.
image-test: $(STAMP)
	$(PY) tools/image_test.py

clean:
	rm -rf $(VENV) build dist *.egg-info .mypy_cache .ruff_cache .pytest_cache

# the node-local store's bulk paths (Arrow): keys/s of read and write, flat in the state size
.PHONY: bench-store
bench-store: $(BENCH_STAMP)
	$(PY) -m loadtest.bench_store_bulk $(BENCH_ARGS)
