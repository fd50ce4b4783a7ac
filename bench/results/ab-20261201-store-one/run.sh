#!/bin/bash
# store(one) A/B: 63cec40 (the commit of the 3.15 M record, 2026-11-24) vs HEAD, alternated
OUT=/work/main/bench/results/ab-20261201-store-one
mkdir -p $OUT
for r in 1 2 3; do
  for side in old new; do
    if [ $side = old ]; then D=/tmp/old; else D=/tmp/bench1; fi
    cd $D && /tmp/bench1/.venv/bin/python -m bench.store_bench --forms one --pipeline-seconds 0 --no-write > /tmp/store-$side-$r.log 2>&1
    echo "round $r $side $(date +%H:%M:%S) $(grep '^one ' /tmp/store-$side-$r.log)" >> $OUT/store_one.log
  done
done
