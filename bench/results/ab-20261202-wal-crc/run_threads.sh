#!/bin/bash
# The receiver worker's threads with the WAL on, old (5dc2bd8) and new (f075fb5) alternated:
# ingest at 400,000 lines/s, /proc per thread over 30 s from 75 s into the session.
cd /tmp/bench1
for round in 1 2; do
  for c in 5dc2bd8 f075fb5; do
    git checkout -q $c
    echo "== round $round commit $c $(date -u +%H:%M:%S) core_speed $(.venv/bin/python -c 'from bench.machine import core_speed; print(core_speed())' 2>/dev/null)"
    setsid .venv/bin/python -m bench.cpu_breakdown --rate 400000 --seconds 150 --settle 30 --systems spark_receivers_wal --pipelines ingest --no-profile --no-write > /tmp/walthreads-session.log 2>&1 &
    sleep 75
    pid=$(ps -eo pid,nlwp,args --sort=-nlwp | grep "pyspark.daemon" | grep -v grep | head -1 | awk '{print $1}')
    .venv/bin/python /tmp/threads_cpu.py $pid 30 > /tmp/wt.txt
    .venv/bin/py-spy dump --pid $pid 2>/dev/null | grep "^Thread" > /tmp/names.txt
    head -1 /tmp/wt.txt
    tail -n +2 /tmp/wt.txt | while read ms a b c d e tid name; do echo "$ms $a $b $c $d $e $(grep -o "Thread $tid [^\"]*\"[^\"]*\"" /tmp/names.txt | sed 's/.*"\(.*\)"/\1/')"; done | head -8
    pkill -f "bench.cpu_breakdown"; sleep 3; pkill -f SparkSubmit; pkill -f "bench.receivers"; sleep 5
  done
done
git checkout -q f075fb5
echo "== end $(date -u +%H:%M:%S)"
