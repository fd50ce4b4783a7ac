# spark-receivers — two commands do everything: `make demo` and `make test`.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
export SPARK_LOCAL_IP ?= 127.0.0.1
export PYSPARK_PYTHON := $(abspath $(PY))

.PHONY: demo test lint docs bench bench-quick chaos soak check-java clean screenshots

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

# Chaos at load on a standalone cluster of its own (Master + 2 Workers, a redis-server): 20,000
# records/s for 10 min of faults (~15 min in all) — kill -9 of the receiver's worker (20), of an
# executor JVM (5) and of the driver (5, restarted from its checkpoint), the receiver cut off from
# the driver (30 s), ENOSPC and EIO on its WAL (20 s each); the sink checked against the stream.
# Writes its summary into RELIABILITY.md. CHAOS_ARGS="--duration 120 --workers 4 ..." for less.
chaos: $(STAMP)
	scripts/services.sh install redis
	$(PY) scripts/chaos.py --record $(CHAOS_ARGS)

# The word count at 50 % of its measured capacity for 30 min (~35 min in all), both WALs on: RSS,
# WAL disk use and open fds sampled each minute must stay flat. Writes RELIABILITY.md, its section
# of BENCHMARKS.md and docs/img/soak.png. SOAK_ARGS="--minutes 5 --sample-s 10" for less.
soak: $(STAMP)
	scripts/services.sh install redis
	$(PY) scripts/soak.py --record $(SOAK_ARGS)
