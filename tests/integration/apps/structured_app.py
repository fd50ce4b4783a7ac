"""A Structured Streaming query over a receiver, as a user would submit it to a cluster.

One ``NumberedReceiver`` feeds ``ssc.structured_stream``; a
query reads it with ``read_stream()`` and writes each micro-batch's values to the
driver through ``foreachBatch``. Once every record arrived the query stops, then
the context; one ``RESULT {json}`` line says where the receiver ran and what was
sent, delivered, duplicated and lost.
"""

from __future__ import annotations

import argparse
import collections
import json
import sys
import tempfile
import threading
import time

from pyspark.sql import SparkSession

from spark_receivers import Receiver, StreamingContext


class NumberedReceiver(Receiver):
    """Stores ``"<stream>-<n>"`` for n < total, 500 at a time, then idles."""

    def __init__(self, total: int) -> None:
        super().__init__()
        self.total = total

    def on_start(self) -> None:
        threading.Thread(target=self._run, daemon=True).start()

    def on_stop(self) -> None:
        pass

    def _run(self) -> None:
        for first in range(0, self.total, 500):
            if self.is_stopped():
                return
            last = min(first + 500, self.total)
            self.store([f"{self.stream_id}-{n}" for n in range(first, last)], reliable=True)


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--records", type=int, default=10_000)
    p.add_argument("--timeout-s", type=float, default=150)
    args = p.parse_args()
    spark = SparkSession.builder.appName("structured-app").getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    ssc = StreamingContext(spark, batch_interval_ms=1000)
    ssc.structured_stream(NumberedReceiver(args.records))
    ssc.start()
    (stream,) = ssc.streams
    seen: collections.Counter[str] = collections.Counter()
    lock = threading.Lock()

    def collect(df, epoch: int) -> None:
        values = [r.value for r in df.collect()]
        with lock:
            seen.update(values)

    query = (
        stream.read_stream(max_records_per_trigger=4000)
        .writeStream.foreachBatch(collect)
        .option("checkpointLocation", tempfile.mkdtemp(prefix="structured-app-"))
        .trigger(processingTime="1 second")
        .start()
    )
    expected = {f"0-{n}" for n in range(args.records)}
    deadline = time.monotonic() + args.timeout_s
    placed = {}
    while time.monotonic() < deadline:
        r = ssc.status().receiver(0)
        if r.executor_id:
            placed = {"executor": r.executor_id, "host": r.host, "endpoint": r.endpoint}
        with lock:
            if expected <= set(seen):
                break
        time.sleep(0.5)
    query.stop()
    ssc.stop(graceful=True)
    with lock:
        delivered = set(seen)
        out = {
            "receiver": placed,
            "sent": len(expected),
            "delivered": len(delivered & expected),
            "duplicated": sum(c - 1 for c in seen.values() if c > 1),
            "lost": len(expected - delivered),
            "query_exception": str(query.exception()) if query.exception() else None,
        }
    print("RESULT " + json.dumps(out), flush=True)
    spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
