# spark-receivers — two commands do everything: `make demo` and `make test`.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
export SPARK_LOCAL_IP ?= 127.0.0.1
export PYSPARK_PYTHON := $(abspath $(PY))

.PHONY: demo test lint bench bench-quick chaos check-java clean

$(STAMP): pyproject.toml
	@scripts/check-java.sh
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev]'
	@touch $(STAMP)

check-java:
	@scripts/check-java.sh

demo: $(STAMP)
	$(VENV)/bin/spark-receivers demo --seconds 15

test: $(STAMP)
	$(PY) -m pytest -q

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy

bench: $(STAMP)
	$(PY) -m bench.run

bench-quick: $(STAMP)
	$(PY) -m bench.run --quick

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .mypy_cache .ruff_cache
