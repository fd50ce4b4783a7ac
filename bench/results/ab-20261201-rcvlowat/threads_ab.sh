#!/bin/bash
# usage: threads_ab.sh RATE ROUNDS: per-thread CPU of the receiver task, new vs old, 30 s in the window
# tstat.py is the copy beside this script (run then from /tmp/probe; rewritten for lint since, same output)
RATE=$1; ROUNDS=$2
for r in $(seq 1 $ROUNDS); do
  for side in new old; do
    if [ $side = new ]; then D=/tmp/bench1; else D=/tmp/old; fi
    cd $D && (/tmp/bench1/.venv/bin/python -m bench.cpu_breakdown --rate $RATE --seconds 100 --systems spark_receivers --pipelines ingest --no-profile --no-write > /tmp/th-$RATE-$side-$r.log 2>&1 &)
    sleep 55
    R=""
    for p in $(pgrep -f "pyspark.daemon|pyspark/daemon|worker_main|spark_receivers" ); do
      if /tmp/bench1/.venv/bin/py-spy dump -p $p 2>/dev/null | grep -q '"socket-receiver'; then R=$p; fi
    done
    echo "== $side $r receiver pid $R $(date +%H:%M:%S)"
    python3 /tmp/probe/tstat.py $R 30 | head -8
    while pgrep -f "bench.cpu_breakdown" > /dev/null; do sleep 5; done
    grep "all processes" /tmp/th-$RATE-$side-$r.log
  done
done
