"""p50/p90/max of each timed call in the logs ``sitecustomize.py`` wrote.

The first 25 calls of each kind are dropped (warm-up). ``python3 summarize.py times-*.log.gz``.
"""

import gzip
import statistics
import sys
from collections import defaultdict

CALLS = (
    "_run_batch",
    "_finish",
    "_generate",
    "_write_checkpoint",
    "allocate_blocks_to_batch",
    "cleanup_old_batches",
    "add_blocks",
)

for f in sys.argv[1:]:
    d = defaultdict(list)
    with gzip.open(f, "rt") if f.endswith(".gz") else open(f) as lines:
        for line in lines:
            p = line.split()
            d[p[2]].append(float(p[4]))
    print(f.rsplit("/", 1)[-1])
    for k in CALLS:
        v = sorted(d.get(k, [])[25:])
        if v:
            p50, p90 = statistics.median(v), v[int(len(v) * 0.9)]
            print(
                f"  {k:26s} n={len(v):4d}  wall p50 {p50:7.1f}  p90 {p90:7.1f}  max {v[-1]:7.1f} ms"
            )
