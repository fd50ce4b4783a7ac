"""Core-s per million lines read, per process kind and JVM thread group, of raw cpu_breakdown files.

From the repository's root: python bench/results/ab-20261201-parquet-read/jvm_threads.py FILES...
"""

import gzip
import json
import sys

for path in sys.argv[1:]:
    with gzip.open(path) as f:
        data = json.load(f)["data"]
    r = data["results"][0]
    per = r["lines"] / 1e6
    threads = sorted(r["jvm_threads"].items(), key=lambda kv: -kv[1])
    kinds = ", ".join(f"{k} {v / per:.3f}" for k, v in sorted(r["by_kind"].items()) if v)
    ratio = r["lines_processed"] / r["lines"]
    print(f"{path.rsplit('/', 1)[-1]}: processed/read {ratio:.3f}; {kinds}")
    print("  " + ", ".join(f"{k} {v / per:.3f}" for k, v in threads if v / per >= 0.005))
