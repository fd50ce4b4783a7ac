"""The bench's word count on N lines: Spark alone (cache, 4 partitions) vs a mapInArrow read
of 5 Arrow IPC block files (mapped, as from the spool) in whole-block runs or row-balanced runs."""

import os
import statistics
import sys
import time
from typing import Any

import pyarrow as pa

from bench.child import local_session
from bench.pipelines import word_count
from bench.query_floor import lines_table, warm_up
from spark_receivers.receivers.lines import LinePool
from spark_receivers.spark.block_source import split_rows


# group_blocks left the package after these runs (8a070aa+); its whole-block grouping:
def group_blocks(blocks: list[dict[str, Any]], max_partitions: int) -> list[list[dict[str, Any]]]:
    """Split ``blocks`` (in order) into at most ``max_partitions`` runs of similar record counts.

    >>> [len(g) for g in group_blocks([{"num_records": 10}] * 5, 2)]
    [3, 2]
    """
    n = max(1, min(len(blocks), max_partitions))
    total = sum(max(1, b["num_records"]) for b in blocks)
    groups: list[list[dict[str, Any]]] = [[]]
    seen = 0
    for i, block in enumerate(blocks):
        left = len(blocks) - i
        # Close the current run once it holds its share, or when each remaining
        # group needs one of the remaining blocks.
        if (
            groups[-1]
            and len(groups) < n
            and (seen >= total * len(groups) / n or left <= n - len(groups))
        ):
            groups.append([])
        groups[-1].append(block)
        seen += max(1, block["num_records"])
    return groups


N = int(sys.argv[1]) if len(sys.argv) > 1 else 700_000
ROUNDS = int(sys.argv[2]) if len(sys.argv) > 2 else 5
SET = sys.argv[3] if len(sys.argv) > 3 else "split"  # or "chunks"
spark = local_session("readpath")
pool = LinePool()
warm_up(spark, pool, 20.0)
table = lines_table(pool, N)
d = "/tmp/probe/blocks"
os.makedirs(d, exist_ok=True)
per = N // 5
blocks = []
for i in range(5):
    path = f"{d}/b{i}.arrow"
    with pa.OSFile(path, "wb") as f, pa.ipc.new_file(f, table.schema) as w:
        w.write_table(table.slice(i * per, per))
    blocks.append({"block_id": path, "num_records": per})


def reader(runs, chunk=None):
    def f(it):
        import pyarrow as pa

        for b in it:
            for i in b.column(0).to_pylist():
                for blk, first, end in runs[i]:
                    t = pa.ipc.open_file(pa.memory_map(blk["block_id"])).read_all()
                    if first or end is not None:
                        t = t.slice(first, None if end is None else end - first)
                    yield from t.to_batches(max_chunksize=chunk)

    return f


def mia(runs, chunk=None):
    return spark.range(0, len(runs), 1, len(runs)).mapInArrow(reader(runs, chunk), "value string")


if SET == "split":  # the run of 18:47-18:51 (readpath.log)
    variants = {
        "whole-2": mia([[(b, 0, None) for b in g] for g in group_blocks(blocks, 2)]),
        "rows-2": mia(split_rows(blocks, 2)),
        "rows-3": mia(split_rows(blocks, 3)),
        "rows-4": mia(split_rows(blocks, 4)),
    }
else:  # the run of 19:45-19:48 (readpath-chunks.log)
    variants = {
        "rows-2": mia(split_rows(blocks, 2)),
        "rows-2-10k": mia(split_rows(blocks, 2), 10_000),
        "rows-2-64k": mia(split_rows(blocks, 2), 65_536),
    }
cached = spark.createDataFrame(table).repartition(4).cache()
cached.count()
variants["spark-alone"] = cached
for df in variants.values():
    for _ in range(2):
        word_count(df)
times = {k: [] for k in variants}
for _ in range(ROUNDS):
    for k, df in variants.items():
        t0 = time.perf_counter()
        got = word_count(df)
        times[k].append(1000 * (time.perf_counter() - t0))
        assert got == N, (k, got)
for k, v in times.items():
    print(
        f"{N} {k:12s} p50 {statistics.median(v):5.0f} ms  min {min(v):5.0f}  max {max(v):5.0f}",
        flush=True,
    )
spark.stop()
