#!/bin/bash
# The one-action word count's capacity against Spark alone, same host and hour (issue 31).
set -x
cd /tmp/bench1
make .venv/.installed > /tmp/bench1-venv.log 2>&1 || exit 1
date -u
.venv/bin/python -c "from bench.machine import core_speed; print('core_speed', core_speed())"
.venv/bin/python -m bench.throughput --systems spark_receivers --pipelines wordcount --spacing 1.1 --lowest 40000 --highest 4000000 --budget-minutes 10 --output bench/results/throughput-wordcount-20261202.md
date -u
.venv/bin/python -c "from bench.machine import core_speed; print('core_speed', core_speed())"
.venv/bin/python -m bench.query_floor --rungs 731000,804000,884000,972000,1060000,1160000,1270000,1390000 --output bench/results/query_floor-20261202.md
date -u
.venv/bin/python -c "from bench.machine import core_speed; print('core_speed', core_speed())"
