# dstl: `make demo` sets everything up and runs the demo; `make test` the tests.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-dev

.PHONY: all venv demo test lint typecheck pytest proto proto-check bench clean

all: test

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[dev]'
	touch $(STAMP)

venv: $(STAMP)

demo: $(STAMP)
	$(PY) examples/demo.py

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

typecheck: $(STAMP)
	$(VENV)/bin/mypy dstl_server dstl_client loadtest

proto: $(STAMP)
	$(PY) tools/gen_proto.py

proto-check: $(STAMP)
	$(PY) tools/gen_proto.py --check

pytest: $(STAMP)
	$(PY) -m pytest -q -ra $(PYTEST_ARGS)

test: lint typecheck pytest

bench: $(STAMP)
	$(PY) -m loadtest.bench $(BENCH_ARGS)

clean:
	rm -rf $(VENV) build dist *.egg-info .mypy_cache .ruff_cache .pytest_cache
