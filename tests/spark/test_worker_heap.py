"""The worker's imports frozen out of the cyclic collector (spark/worker_heap.py)."""

from __future__ import annotations

import gc
import subprocess
import sys

import pytest

from spark_receivers.spark import worker_heap


def test_freezing_leaves_the_imports_out_of_every_collection_and_collects_what_comes_after():
    code = (
        "import gc, pyarrow\n"
        "from spark_receivers.spark import worker_heap\n"
        "frozen = worker_heap.freeze_heap()\n"
        "tracked = {id(o) for o in gc.get_objects()}\n"
        "print(frozen, len(tracked), id(vars(pyarrow)) in tracked)\n"
        "junk = [[] for _ in range(3)]\n"
        "junk[0].append(junk[0])\n"  # a cycle made after the freeze
        "del junk\n"
        "print(gc.collect())\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    ).stdout.split()
    frozen, tracked, module_tracked, collected = out
    assert int(frozen) > 10_000 and int(tracked) < 100, out
    assert module_tracked == "False"  # pyarrow's module dict: never walked again
    assert int(collected) >= 1  # the cycle made after the freeze is still collected


def test_outside_a_spark_task_nothing_is_frozen():
    before = gc.get_freeze_count()
    assert worker_heap.freeze_in_task() is False
    assert gc.get_freeze_count() == before


@pytest.mark.spark
def test_in_a_task_the_workers_imports_are_frozen_once(spark):
    def probe(batches):
        import gc as gc_
        import os as os_
        import sys as sys_

        import pyarrow as pa

        from spark_receivers.spark import worker_heap as heap

        heap.freeze_in_task()
        again = heap.freeze_in_task()  # once per process
        walked = {id(o) for o in gc_.get_objects()}
        worker_module = id(vars(sys_.modules["pyspark.worker"]))
        for _ in batches:
            pass
        yield pa.RecordBatch.from_pylist(
            [
                {
                    "mine": heap._frozen_in == os_.getpid(),
                    "again": again,
                    "walked": worker_module in walked,
                }
            ]
        )

    rows = spark.range(0, 2, 1, 2).mapInArrow(probe, "mine boolean, again boolean, walked boolean")
    for row in rows.collect():
        assert row["mine"] and not row["again"] and not row["walked"], row
