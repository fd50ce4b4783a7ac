# spark-receivers — two commands do everything: `make demo` and `make test`.
PYTHON ?= python3
# make test runs the suite on this many pytest-xdist workers (a file stays on one worker).
# Not more on 2 cores: the suite is CPU-bound, and three workers made it slower (fresh
# clones on the same slow host, 2026-11-29: pytest 29 min 27 s with 3, the CPU 99-100 %
# busy for all of it, against 23 min 29 s with 2 an hour before).
TEST_WORKERS ?= 2
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
export SPARK_LOCAL_IP ?= 127.0.0.1
export PYSPARK_PYTHON := $(abspath $(PY))

.PHONY: demo test test-fast lint docs bench bench-quick bench-smoke chaos soak check-java clean screenshots

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

# The package's .pyc files, for the tests' many Python processes (workers, block keepers,
# CLI runs): where PYTHONDONTWRITEBYTECODE is set (it is on the machines this project is
# built on) Python writes none itself and compiles every module of ours from source in
# every process: a task's imports took 1.02-1.20 CPU-s without them, 0.87-0.91 with
# (2026-11-28). pip compiled the venv's packages at install; only changed files are redone.
COMPILE := $(PY) -m compileall -q spark_receivers

# The built-in receivers' tests need redis, mosquitto, RabbitMQ and nats-server: installed here (apt) when
# missing, started by the tests themselves on free loopback ports.
test: $(STAMP)
	scripts/services.sh install all
	$(COMPILE)
	$(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadfile

# The fast part of the suite for a developer's loop: make test without the long scenarios
# (the tests marked slow: clusters, kills and restarts, CLI runs; tests/conftest.py says
# which). CI runs make test, all of it.
test-fast: $(STAMP)
	scripts/services.sh install all
	$(COMPILE)
	$(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadfile -m 'not slow and not bench_smoke'

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check spark_receivers tests bench scripts examples  # not the docs' snippets
	$(VENV)/bin/mypy
	$(VENV)/bin/mypy tests/typing

# docs/config.md and docs/errors.md from the code, the API reference (pdoc) in build/docs/api.
docs: $(STAMP)
	$(PY) scripts/docs.py

# The README's status page and terminal screenshots, from a real demo and a real ingest.
screenshots: $(STAMP)
	scripts/services.sh install chromium
	$(PY) scripts/screenshots.py

# Every benchmark (bench/run.py says what and how long: ~2.1-3.2 h on a quiet machine), the
# tracker and the capacity ladders three times each. Writes BENCHMARKS.md's sections, their
# raw results in bench/results/ (commit both) and the README's performance paragraph.
# BENCH_ARGS="--sections tracker --repeats 5" for part of it.
bench: $(STAMP)
	$(PY) -m bench.run $(BENCH_ARGS)

# The smoke runs of the sections that start JVMs, and of the soak, as tests (2-5 min each):
# that each runs end to end and records what it did. Worth a run before make bench.
bench-smoke: $(STAMP)
	scripts/services.sh install redis
	$(PY) -m pytest -q -m bench_smoke tests/bench/test_smoke.py

# A smoke run of every section (~25 min), written under bench/out: never into the records.
bench-quick: $(STAMP)
	$(PY) -m bench.run --quick $(BENCH_ARGS)

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .mypy_cache .ruff_cache

# Chaos at load on a standalone cluster of its own (Master + 2 Workers, a redis-server): 20,000
# records/s for 10 min of faults (~15 min in all) — kill -9 of the receiver's worker (20), of an
# executor JVM (5) and of the driver (5, restarted from its checkpoint), the receiver cut off from
# the driver (30 s), ENOSPC and EIO on its WAL (20 s each); the sink checked against the stream.
# Writes its section of RELIABILITY.md and its raw file in bench/results/ (commit both).
# CHAOS_ARGS="--quick" for a smoke run (~3 min, written under bench/out).
chaos: $(STAMP)
	scripts/services.sh install redis
	$(PY) scripts/chaos.py --record $(CHAOS_ARGS)

# The word count at 50 % of its measured capacity for 2 h (~2 h 10 min in all), both WALs on:
# RSS of driver and executors, WAL disk use and open fds sampled every 15 s; the first hour is
# warm-up, and over the second each fitted slope must be at most 10 MiB (or 10 fds) an hour.
# Writes its section of RELIABILITY.md, its raw file in bench/results/ and docs/img/soak.png.
# SOAK_ARGS="--quick" for a smoke run (3 min of soak, written under bench/out).
soak: $(STAMP)
	scripts/services.sh install redis
	$(PY) scripts/soak.py --record $(SOAK_ARGS)
