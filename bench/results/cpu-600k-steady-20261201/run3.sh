#!/bin/bash
# After the measured runs of Spark alone went back to back again (the settle still paced):
# three sessions of the line count at 600,000 lines/s, window from 150 s after the
# connection, then one at 150,000 lines/s with the default 30 s settle.
cd /tmp/bench1
OUT=/work/main/bench/results/cpu-600k-steady-20261201
for r in 1 2 3 150k; do
  if [ $r = 150k ]; then args="--rate 150000 --seconds 90"; else args="--rate 600000 --seconds 240 --settle 150"; fi
  .venv/bin/python -m bench.cpu_breakdown $args --systems spark_receivers --pipelines ingest --no-profile --no-write > /tmp/cbs3-$r.log 2>&1
  f=$(ls -t bench/out/cpu_breakdown-*.json.gz | head -1)
  cp $f $OUT/
  echo "back-to-back $r $(date +%H:%M:%S) $f $(grep 'all processes' /tmp/cbs3-$r.log)" >> $OUT/runs.log
done
