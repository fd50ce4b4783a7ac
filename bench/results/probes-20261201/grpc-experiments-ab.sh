#!/bin/bash
# usage: ab_env.sh RATE SECONDS ROUNDS: /tmp/bench1 with and without GRPC_EXPERIMENTS
RATE=$1; SECS=$2; ROUNDS=$3
for r in $(seq 1 $ROUNDS); do
  for side in ee-off default; do
    cd /tmp/bench1
    if [ $side = ee-off ]; then export GRPC_EXPERIMENTS=-event_engine_client,-event_engine_listener; else unset GRPC_EXPERIMENTS; fi
    /tmp/bench1/.venv/bin/python -m bench.cpu_breakdown --rate $RATE --seconds $SECS --systems spark_receivers --pipelines ingest --no-profile --no-write > /tmp/abe-$RATE-$side-$r.log 2>&1
    f=$(ls -t bench/out/cpu_breakdown-*.json.gz | head -1)
    echo "$side $r $(date +%H:%M:%S) $f $(grep 'all processes' /tmp/abe-$RATE-$side-$r.log)"
  done
done
