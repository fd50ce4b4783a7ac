#!/bin/bash
# usage: ab.sh RATE SECONDS ROUNDS  -> alternates new (/tmp/bench1) and old (/tmp/old)
RATE=$1; SECS=$2; ROUNDS=$3
for r in $(seq 1 $ROUNDS); do
  for side in new old; do
    if [ $side = new ]; then D=/tmp/bench1; else D=/tmp/old; fi
    cd $D && /tmp/bench1/.venv/bin/python -m bench.cpu_breakdown --rate $RATE --seconds $SECS --systems spark_receivers --pipelines ingest --no-profile --no-write > /tmp/ab-$RATE-$side-$r.log 2>&1
    f=$(ls -t $D/bench/out/cpu_breakdown-*.json.gz | head -1)
    echo "$side $r $(date +%H:%M:%S) $f $(grep 'all processes' /tmp/ab-$RATE-$side-$r.log)"
  done
done
