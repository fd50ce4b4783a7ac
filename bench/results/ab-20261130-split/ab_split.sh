#!/bin/bash
# A/B: whole-block runs (old) vs row-balanced runs (new), word count ladder, alternated.
cd /tmp/bench1
for order in old new old new; do
  git checkout -q -- spark_receivers tests
  if [ $order = new ]; then git apply /tmp/probe/split.patch; fi
  echo "=== $order $(date -u +%H:%M:%S) $(git diff --stat | tail -1)"
  .venv/bin/python -m bench.throughput --systems spark_receivers --pipelines wordcount --repeats 1 \
     --spacing 1.1 --lowest 500000 --highest 1300000 --budget-minutes 8 --no-write 2>&1 \
     | grep -E "^\| spark_receivers \| wordcount \| (fine|coarse)|held|raw results"
done
git checkout -q -- spark_receivers tests
echo done $(date -u +%H:%M:%S)
