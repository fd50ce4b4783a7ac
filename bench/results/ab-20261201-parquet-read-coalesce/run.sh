#!/bin/bash
# As ../ab-20261201-parquet-read/run.sh, the word count only, after the Parquet read was
# coalesced to the batch's read-task count (block_source.blocks_dataframe): Spark cuts a file
# read into tasks by bytes, maybe more of them than mapInArrow gets (reasoned, not counted).
cd /tmp/bench1
OUT=/work/main/bench/results/ab-20261201-parquet-read-coalesce
for r in 1 2; do
  for pipe_rate in wordcount:300000; do
    pipe=${pipe_rate%%:*}; rate=${pipe_rate##*:}
    for system in spark_receivers spark_receivers_arrowspool; do
      speed=$(.venv/bin/python -c 'from bench.machine import core_speed; print(f"{core_speed():.1f}")')
      log=/tmp/pqreadc-$r-$pipe-$system.log
      .venv/bin/python -m bench.cpu_breakdown --rate $rate --seconds 180 --settle 90 --systems $system --pipelines $pipe --no-profile --no-write > $log 2>&1
      f=$(ls -t bench/out/cpu_breakdown-*.json.gz | head -1)
      cp $f $OUT/
      echo "round $r $pipe $rate $system $(date -u +%H:%M:%S) core_speed=$speed $(basename $f) $(grep 'all processes' $log)" >> $OUT/runs.log
    done
  done
done
echo done >> $OUT/runs.log
