"""Summarise raw cpu_breakdown files with the tool's own arithmetic (bench.cpu_breakdown.Breakdown).

Run from the repository's root: python bench/results/cpu-600k-20261201/summary.py FILES...
Also used for bench/results/cpu-600k-steady-20261201/ and ab-20261201-block-interval/ (the
JIT compilers' share and the settle were added for those).
"""

import gzip
import json
import sys

sys.path.insert(0, ".")
from bench.cpu_breakdown import JIT_THREADS, breakdowns
from bench.proc_cpu import JVM, RECEIVER

for path in sys.argv[1:]:
    with gzip.open(path) as f:
        data = json.load(f)["data"]
    for b in breakdowns(data):
        jvm = b.kind_per_million(JVM)
        compilers = b.per_million(sum(b.jvm_threads.get(t, 0.0) for t in JIT_THREADS))
        print(
            f"{path.rsplit('/', 1)[-1]}: all {b.total_per_million:.2f}, JVM {jvm:.2f}, "
            f"Python processes {b.total_per_million - jvm:.2f} "
            f"(receiver task {b.kind_per_million(RECEIVER):.2f}), "
            f"compilers {compilers:.2f}, "
            f"Spark alone {b.spark_alone_per_million:.2f}, everything but the query "
            f"{b.but_the_query:.2f}; settle {b.settle_s}; sustained {b.sustained}"
        )
