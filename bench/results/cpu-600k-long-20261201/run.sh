#!/bin/bash
# The steady state, judged the strict way: three sessions of the line count at 600,000
# lines/s, window 600-719 s after the receiver connected; Spark alone settled as long
# (paced once a second), then measured back to back. The core's speed before each session.
cd /tmp/bench1
OUT=/work/main/bench/results/cpu-600k-long-20261201
for r in 1 2 3; do
  speed=$(.venv/bin/python -c 'from bench.machine import core_speed; print(f"{core_speed():.1f}")')
  .venv/bin/python -m bench.cpu_breakdown --rate 600000 --seconds 720 --settle 600 --systems spark_receivers --pipelines ingest --no-profile --no-write > /tmp/cbl4-$r.log 2>&1
  f=$(ls -t bench/out/cpu_breakdown-*.json.gz | head -1)
  cp $f $OUT/
  echo "long $r $(date -u +%H:%M:%S) core_speed=$speed $f $(grep 'all processes' /tmp/cbl4-$r.log)" >> $OUT/runs.log
done
