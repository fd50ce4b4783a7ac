#!/bin/bash
# spark.receivers.batch.parquetSpool as built (decision 0026): the Parquet spool read by
# Spark's reader (system spark_receivers) against the Arrow spool read by mapInArrow
# (spark_receivers_arrowspool), in a stream; the line count at 600,000 lines/s and the word
# count at 300,000, window 90-179 s after the connection, Spark alone settled as long;
# alternated, two rounds. Run in /tmp/bench1 (a clone with the change applied).
cd /tmp/bench1
OUT=/work/main/bench/results/ab-20261201-parquet-read
for r in 1 2; do
  for pipe_rate in ingest:600000 wordcount:300000; do
    pipe=${pipe_rate%%:*}; rate=${pipe_rate##*:}
    for system in spark_receivers spark_receivers_arrowspool; do
      speed=$(.venv/bin/python -c 'from bench.machine import core_speed; print(f"{core_speed():.1f}")')
      log=/tmp/pqread-$r-$pipe-$system.log
      .venv/bin/python -m bench.cpu_breakdown --rate $rate --seconds 180 --settle 90 --systems $system --pipelines $pipe --no-profile --no-write > $log 2>&1
      f=$(ls -t bench/out/cpu_breakdown-*.json.gz | head -1)
      cp $f $OUT/
      echo "round $r $pipe $rate $system $(date -u +%H:%M:%S) core_speed=$speed $(basename $f) $(grep 'all processes' $log)" >> $OUT/runs.log
    done
  done
done
echo done >> $OUT/runs.log
