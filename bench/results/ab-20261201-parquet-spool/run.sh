#!/bin/bash
# A scratch Parquet spool read by Spark's Parquet reader (parquet-spool-scratch.patch, gated
# by SR_PARQUET_SPOOL=1) against today's Arrow IPC spool read by mapInArrow, in a stream:
# the line count at 600,000 lines/s, window 90-179 s after the connection, Spark alone
# settled as long; alternated, two rounds. The patch is applied in /tmp/bench1 only.
cd /tmp/bench1
OUT=/work/main/bench/results/ab-20261201-parquet-spool
for r in 1 2; do
  for mode in 1 0; do
    speed=$(.venv/bin/python -c 'from bench.machine import core_speed; print(f"{core_speed():.1f}")')
    SR_PARQUET_SPOOL=$mode .venv/bin/python -m bench.cpu_breakdown --rate 600000 --seconds 180 --settle 90 --systems spark_receivers --pipelines ingest --no-profile --no-write > /tmp/pqab-$r-$mode.log 2>&1
    f=$(ls -t bench/out/cpu_breakdown-*.json.gz | head -1)
    cp $f $OUT/
    echo "round $r parquet=$mode $(date -u +%H:%M:%S) core_speed=$speed $f $(grep 'all processes' /tmp/pqab-$r-$mode.log)" >> $OUT/runs.log
  done
done
