#!/bin/bash
# The line count at 150,000 lines/s (the CPU breakdown section's rate) with Spark's default
# block interval (200 ms) and with 1 s, alternated, two rounds. The key reaches the stream
# through the Spark conf the application starts with (PYSPARK_SUBMIT_ARGS), as a
# spark-submit --conf would; Spark alone has no receiver and does not read it.
cd /tmp/bench1
OUT=/work/main/bench/results/ab-20261201-block-interval
for r in 1 2; do
  for ms in 200 1000; do
    PYSPARK_SUBMIT_ARGS="--conf spark.streaming.blockInterval=${ms}ms pyspark-shell" \
      .venv/bin/python -m bench.cpu_breakdown --rate 150000 --seconds 90 --systems spark_receivers \
      --pipelines ingest --no-profile --no-write > /tmp/bi-$r-$ms.log 2>&1
    f=$(ls -t bench/out/cpu_breakdown-*.json.gz | head -1)
    cp $f $OUT/
    echo "round $r blockInterval ${ms}ms $(date +%H:%M:%S) $(basename $f) $(grep 'all processes' /tmp/bi-$r-$ms.log)" >> $OUT/runs.log
  done
done
