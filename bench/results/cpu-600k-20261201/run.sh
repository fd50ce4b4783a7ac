#!/bin/bash
# three sessions of the line count at 600,000 lines/s, one after the other, raw files kept
cd /tmp/bench1
for r in 1 2 3; do
  .venv/bin/python -m bench.cpu_breakdown --rate 600000 --seconds 60 --systems spark_receivers --pipelines ingest --no-profile --no-write > /tmp/cb600x3-$r.log 2>&1
  f=$(ls -t bench/out/cpu_breakdown-*.json.gz | head -1)
  echo "run $r $(date +%H:%M:%S) $f $(grep 'all processes' /tmp/cb600x3-$r.log)"
done
