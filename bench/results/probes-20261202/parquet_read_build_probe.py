"""CPU of building a batch's Parquet spool read (no action): the file list, or one directory.

Run from the repository's root: PYSPARK_PYTHON=.venv/bin/python .venv/bin/python
bench/results/probes-20261202/parquet_read_build_probe.py

The opt-in Parquet spool read (decision 0026) planned dearer than the ``mapInArrow`` read
in a stream (the JVM's py4j thread, 2026-12-01). Here, 20 Parquet files of 1,000 rows:
``_parquet_read`` as the batch reader builds it (``spark.read.schema(s).parquet(*files)``),
the same through the Java reader with the schema parsed once, and one read of a directory
holding hard links to the 20 files; then the ``mapInArrow`` read of 20 blocks in 4 tasks
(no action either) for scale. CPU of this process and its children per DataFrame, py4j
calls counted; 150 of each first, then three alternated rounds of 100.
"""

import os
import sys
import tempfile
import time

import py4j.clientserver
import pyarrow as pa
import pyarrow.parquet as pq

sys.path.insert(0, ".")
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.types import StringType, StructField, StructType

from bench.proc_cpu import tree_cpu_seconds
from spark_receivers.rpc.messages import ReceivedBlockInfo
from spark_receivers.spark.block_source import TaskRanges, _parquet_read, blocks_dataframe


def tree_cpu() -> float:
    """CPU seconds of this process and its descendants (the JVM)."""
    return tree_cpu_seconds(os.getpid())


calls = [0]
_send = py4j.clientserver.ClientServerConnection.send_command


def _counted(self, command):
    calls[0] += 1
    return _send(self, command)


py4j.clientserver.ClientServerConnection.send_command = _counted

spark = SparkSession.builder.master("local[4]").config("spark.ui.enabled", "false").getOrCreate()
schema = StructType([StructField("value", StringType())])
spool, links = tempfile.mkdtemp(), tempfile.mkdtemp()
files = []
for i in range(20):
    path = os.path.join(spool, f"input-0-17000000{i:02d}-3-a1b2c3.parquet")
    pq.write_table(pa.table({"value": [f"x {j}" for j in range(1000)]}), path)
    os.link(path, os.path.join(links, os.path.basename(path)))
    files.append(path)
jschema = spark._jsparkSession.parseDataType(schema.json())
blocks = [
    ReceivedBlockInfo(0, f"input-0-{i}", 15000, 1000 + i, "127.0.0.1:1", 1 << 20) for i in range(20)
]
ranges = TaskRanges(spark)


def java_reader(i: int) -> DataFrame:
    seq = spark._jvm.org.apache.spark.api.python.PythonUtils.toSeq(files)
    return DataFrame(spark._jsparkSession.read().schema(jschema).parquet(seq), spark)


forms = {
    "Parquet: the file list (today)": lambda i: _parquet_read(spark, files, schema),
    "Parquet: the file list, Java reader": java_reader,
    "Parquet: one directory of links": lambda i: spark.read.schema(schema).parquet(links),
    "mapInArrow: 20 blocks, 4 tasks": lambda i: blocks_dataframe(
        spark, blocks, schema, "s" * 32, max_partitions=4, task_ranges=ranges
    ),
}
for name, form in forms.items():
    if name.startswith("Parquet"):
        assert form(0).count() == 20_000
    for i in range(150):
        form(i)
for _ in range(3):
    for name, form in forms.items():
        n, cpu, wall = 100, tree_cpu(), time.monotonic()
        calls[0] = 0
        for i in range(n):
            form(i).alias(f"batch_{i}")
        cpu_ms = 1000 * (tree_cpu() - cpu) / n
        wall_ms = 1000 * (time.monotonic() - wall) / n
        print(
            f"{name:36s} {cpu_ms:6.2f} ms CPU, {wall_ms:6.2f} ms wall, "
            f"{calls[0] / n:5.1f} py4j calls a batch",
            flush=True,
        )
spark.stop()
