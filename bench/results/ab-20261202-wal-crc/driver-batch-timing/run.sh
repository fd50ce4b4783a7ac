#!/bin/bash
# The driver's batch thread with and without the receiver WAL: JobGenerator and tracker calls
# timed by /tmp/instr/sitecustomize.py, two_action at RATE lines/s, 60 s after 20 s settle.
cd /tmp/bench1
RATE=$1
for sys in spark_receivers_wal spark_receivers spark_receivers_wal spark_receivers; do
  out=/tmp/instr/times-$sys-$RATE-$(date -u +%H%M%S).log
  echo "== $sys $RATE $(date -u +%H:%M:%S) -> $out"
  PYTHONPATH=/tmp/instr INSTR_OUT=$out setsid .venv/bin/python -m bench.cpu_breakdown --rate $RATE --seconds 60 --settle 20 --systems $sys --pipelines two_action --no-profile --no-write > /tmp/instr/session.log 2>&1 &
  sleep 110
  pkill -f "bench.cpu_breakdown"; sleep 2; pkill -f SparkSubmit; pkill -f bench.receivers; sleep 3
done
echo "== end $(date -u +%H:%M:%S)"
