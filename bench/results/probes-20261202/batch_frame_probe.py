"""CPU of building one batch's DataFrame (no action): a new read input each batch, or kept.

Run from the repository's root: PYSPARK_PYTHON=.venv/bin/python .venv/bin/python
bench/results/probes-20261202/batch_frame_probe.py

``blocks_dataframe`` over 20 blocks in 4 read tasks, as the batch reader calls it, with a
new ``spark.range`` per batch (``task_ranges=None``) or the batch reader's
``TaskRanges``. CPU of this process and its children (the driver's Python and the JVM)
per DataFrame; 300 of each first (the JIT's warm-up), then three alternated rounds of 200.
"""

import os
import sys
import time

sys.path.insert(0, ".")
from pyspark.sql import SparkSession
from pyspark.sql.types import StringType, StructField, StructType

from bench.proc_cpu import tree_cpu_seconds
from spark_receivers.rpc.messages import ReceivedBlockInfo
from spark_receivers.spark.block_source import TaskRanges, blocks_dataframe


def tree_cpu() -> float:
    """CPU seconds of this process and its descendants (the JVM)."""
    return tree_cpu_seconds(os.getpid())


spark = SparkSession.builder.master("local[4]").config("spark.ui.enabled", "false").getOrCreate()
schema = StructType([StructField("value", StringType())])
blocks = [
    ReceivedBlockInfo(0, f"input-0-{i}", 15000, 1000 + i, "127.0.0.1:1", 1 << 20) for i in range(20)
]
ranges = TaskRanges(spark)
forms = {
    "new range per batch": None,
    "TaskRanges": ranges,
}


def build(i: int, task_ranges) -> None:
    blocks_dataframe(
        spark,
        blocks,
        schema,
        "s" * 32,
        max_partitions=4,
        batch_key=f"0:{i}",
        task_ranges=task_ranges,
    )


for form in forms.values():
    for i in range(300):
        build(i, form)
for _ in range(3):
    for name, form in forms.items():
        n, cpu, wall = 200, tree_cpu(), time.monotonic()
        for i in range(n):
            build(i, form)
        cpu_ms = 1000 * (tree_cpu() - cpu) / n
        wall_ms = 1000 * (time.monotonic() - wall) / n
        print(f"{name:22s} {cpu_ms:6.2f} ms CPU, {wall_ms:6.2f} ms wall a batch", flush=True)
spark.stop()
