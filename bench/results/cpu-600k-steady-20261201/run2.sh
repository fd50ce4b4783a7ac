#!/bin/bash
# After d5437ef (Spark alone paced and settled like the stream): three sessions of the line
# count at 600,000 lines/s, window from 150 s after the connection, one after the other.
cd /tmp/bench1
OUT=/work/main/bench/results/cpu-600k-steady-20261201
for r in 1 2 3; do
  .venv/bin/python -m bench.cpu_breakdown --rate 600000 --seconds 240 --settle 150 --systems spark_receivers --pipelines ingest --no-profile --no-write > /tmp/cbs2-$r.log 2>&1
  f=$(ls -t bench/out/cpu_breakdown-*.json.gz | head -1)
  cp $f $OUT/
  echo "paced $r $(date +%H:%M:%S) $f $(grep 'all processes' /tmp/cbs2-$r.log)" >> $OUT/runs.log
done
