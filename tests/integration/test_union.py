"""ssc.union(*streams) on a real local Spark, with schemas declared as Spark users write them."""

from __future__ import annotations

import sys
import threading
import time

import pytest
from pyspark import cloudpickle
from pyspark.sql.types import LongType, StringType, StructField, StructType

from spark_receivers import Receiver, StreamingContext

pytestmark = pytest.mark.spark
cloudpickle.register_pickle_by_value(sys.modules[__name__])  # executors cannot import tests


class Numbered(Receiver):
    """Stores ``{id, source}`` records, ``count`` of them in chunks of 50, then idles."""

    schema = "id bigint, source string"  # a DDL class attribute, converted on the driver

    def __init__(self, source: str, count: int, **kwargs) -> None:
        super().__init__(**kwargs)
        self.source, self.count = source, count

    def on_start(self) -> None:
        threading.Thread(target=self._run, daemon=True).start()

    def on_stop(self) -> None:
        pass  # the thread sees is_stopped()

    def _run(self) -> None:
        for start in range(0, self.count, 50):
            if self.is_stopped():
                return
            ids = range(start, min(start + 50, self.count))
            self.store([{"id": i, "source": self.source} for i in ids])
            time.sleep(0.01)


def test_a_union_batch_holds_every_record_of_every_stream_once(spark):
    struct = StructType([StructField("source", StringType()), StructField("id", LongType())])
    receivers = [
        Numbered("ddl", 3000),
        Numbered("struct", 2000, schema=struct),  # other field order: matched by name
    ]
    ssc = StreamingContext(spark, batch_interval_ms=500)
    streams = [ssc.receiver_stream(r) for r in receivers]
    union = ssc.union(*streams)
    assert union.arrow_schema is not None and union.arrow_schema.names == ["id", "source"]
    seen: list[tuple[str, int]] = []
    columns: set[tuple[str, ...]] = set()
    lock = threading.Lock()

    def collect(df, batch_time_ms):
        rows = [(r.source, r.id) for r in df.collect()]
        with lock:
            seen.extend(rows)
            columns.add(tuple(df.columns))

    union.foreach_batch(collect)
    ssc.start()
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            with lock:
                if len(seen) >= 5000:
                    break
            time.sleep(0.1)
    finally:
        ssc.stop(graceful=True)
    expected = [("ddl", i) for i in range(3000)] + [("struct", i) for i in range(2000)]
    assert sorted(seen) == sorted(expected)  # every record of both streams, each once
    assert columns == {("id", "source")}  # one DataFrame per batch, the first stream's order
