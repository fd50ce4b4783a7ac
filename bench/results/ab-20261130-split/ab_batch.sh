#!/bin/bash
cd /tmp/bench1
for order in new old new old new old; do
  git checkout -q -- spark_receivers tests
  if [ $order = new ]; then git apply /tmp/probe/split.patch; fi
  PYTHONPATH=/tmp/bench1 .venv/bin/python /tmp/probe/batchtime.py $order 500000,750000,750000 2>&1 | grep -E "^(old|new) "
done
git checkout -q -- spark_receivers tests
echo done $(date -u +%H:%M:%S)
