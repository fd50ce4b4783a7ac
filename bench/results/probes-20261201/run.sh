#!/bin/bash
# The probes of 2026-12-01, as run for their logs (from the repository's root, nothing else running).
set -e
PY=${PY:-.venv/bin/python}
D=bench/results/probes-20261201
for r in 1 2; do
  for e in "" "-event_engine_client,-event_engine_listener"; do
    GRPC_EXPERIMENTS=$e $PY $D/flight_rtt.py client
  done
done > $D/flight_rtt.log 2>&1
$PY $D/split_probe.py > $D/split_probe.log 2>&1
$PY $D/spool_buf.py > $D/spool_buf.log 2>&1
