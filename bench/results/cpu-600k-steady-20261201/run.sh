#!/bin/bash
# three sessions of the line count at 600,000 lines/s with the window from 150 s after the
# connection (--settle 150, 240 s sessions), one after the other, raw files kept; in the first,
# the per-thread CPU of every Python process and the JVM for 20 s at ~200 s (tstat.py).
cd /tmp/bench1
OUT=/work/main/bench/results/cpu-600k-steady-20261201
for r in 1 2 3; do
  .venv/bin/python -m bench.cpu_breakdown --rate 600000 --seconds 240 --settle 150 --systems spark_receivers --pipelines ingest --no-profile --no-write > /tmp/cbs-$r.log 2>&1 &
  BP=$!
  if [ $r = 1 ]; then
    sleep 200
    PIDS=$(pgrep -f "python|SparkSubmit" | grep -v "^$$\$" | tr '\n' ',' | sed 's/,$//')
    python3 /work/main/bench/results/ab-20261201-rcvlowat/tstat.py $PIDS 20 > $OUT/threads-200s.log 2>&1
    for p in ${PIDS//,/ }; do echo "$p $(tr '\0' ' ' < /proc/$p/cmdline 2>/dev/null | cut -c1-160)"; done >> $OUT/threads-200s.log
  fi
  wait $BP
  f=$(ls -t bench/out/cpu_breakdown-*.json.gz | head -1)
  cp $f $OUT/
  echo "run $r $(date +%H:%M:%S) $f $(grep 'all processes' /tmp/cbs-$r.log)" >> $OUT/runs.log
done
