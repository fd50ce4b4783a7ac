"""p50/p90/max of each timed call in the logs sitecustomize.py wrote (the first 25 calls of
each kind dropped: warm-up)."""
import gzip, statistics, sys
from collections import defaultdict
for f in sys.argv[1:]:
    d = defaultdict(list)
    for line in (gzip.open(f, "rt") if f.endswith(".gz") else open(f)):
        p = line.split()
        d[p[2]].append(float(p[4]))
    print(f.rsplit("/", 1)[-1])
    for k in ("_run_batch", "_finish", "_generate", "_write_checkpoint", "allocate_blocks_to_batch", "cleanup_old_batches", "add_blocks"):
        v = d.get(k, [])[25:]
        if v:
            v.sort()
            print(f"  {k:26s} n={len(v):4d}  wall p50 {statistics.median(v):7.1f}  p90 {v[int(len(v)*.9)]:7.1f}  max {v[-1]:7.1f} ms")
