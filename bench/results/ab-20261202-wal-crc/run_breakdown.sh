#!/bin/bash
# A/B of the WAL's checksum: old (5dc2bd8) and new (f075fb5) alternated, two_action at 400k.
cd /tmp/bench1
for round in 1 2; do
  for c in 5dc2bd8 f075fb5; do
    git checkout -q $c
    echo "== round $round commit $c $(date -u +%H:%M:%S) core_speed $(.venv/bin/python -c 'from bench.machine import core_speed; print(core_speed())' 2>/dev/null)"
    .venv/bin/python -m bench.cpu_breakdown --rate 400000 --seconds 60 --settle 30 --systems spark_receivers_wal,spark_receivers --pipelines two_action --no-profile --no-write 2>&1 | tail -40
  done
done
echo "== end $(date -u +%H:%M:%S)"
