# spark-receivers — two commands do everything: `make demo` and `make test`.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
export SPARK_LOCAL_IP ?= 127.0.0.1
export PYSPARK_PYTHON := $(abspath $(PY))

.PHONY: demo test lint docs bench bench-quick chaos check-java clean screenshots

$(STAMP): pyproject.toml
	@scripts/check-java.sh
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev]'  # dev pulls in [all]: every receiver's library
	@touch $(STAMP)

check-java:
	@scripts/check-java.sh

demo: $(STAMP)
	$(VENV)/bin/spark-receivers demo --seconds 15

# The built-in receivers' tests need redis and mosquitto: installed here (apt) when
# missing, started by the tests themselves on free loopback ports.
test: $(STAMP)
	scripts/services.sh install all
	$(PY) -m pytest -q

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy
	$(VENV)/bin/mypy tests/typing

# docs/config.md and docs/errors.md from the code, the API reference (pdoc) in build/docs/api.
docs: $(STAMP)
	$(PY) scripts/docs.py

# The README's status page and terminal screenshots, from a real demo and a real ingest.
screenshots: $(STAMP)
	scripts/services.sh install chromium
	$(PY) scripts/screenshots.py

bench: $(STAMP)
	$(PY) -m bench.run

bench-quick: $(STAMP)
	$(PY) -m bench.run --quick

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .mypy_cache .ruff_cache

# Long zero-loss run: >= 20 kill -9 of a reliable receiver's worker; prints sent/acked/delivered/lost/duplicated.
chaos: $(STAMP)
	$(PY) scripts/chaos.py --kills 40 --max-gap-s 4
