#!/bin/bash
# One 720 s session of the line count at 600,000 lines/s, window from 600 s after the
# connection; every 60 s the JVM's threads for 10 s (tstat.py): how long its compilers run.
cd /tmp/bench1
OUT=/work/main/bench/results/cpu-600k-steady-20261201
.venv/bin/python -m bench.cpu_breakdown --rate 600000 --seconds 720 --settle 600 --systems spark_receivers --pipelines ingest --no-profile --no-write > /tmp/cbl.log 2>&1 &
BP=$!
for i in $(seq 1 60); do
  JP=$(pgrep -f "java.*SparkSubmit" | head -1); [ -n "$JP" ] && break; sleep 1
done
T0=$(date +%s)
for k in $(seq 1 12); do
  sleep 50
  echo "== $(( $(date +%s) - T0 )) s after the JVM appeared" >> $OUT/long-jvm-threads.log
  python3 /work/main/bench/results/ab-20261201-rcvlowat/tstat.py $JP 10 2>&1 | head -8 >> $OUT/long-jvm-threads.log
done
wait $BP
f=$(ls -t bench/out/cpu_breakdown-*.json.gz | head -1)
cp $f $OUT/
echo "long $(date +%H:%M:%S) $f $(grep 'all processes' /tmp/cbl.log)" >> $OUT/runs.log
