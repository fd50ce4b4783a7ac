"""A Structured Streaming driver for the exactly-once crash test, run as its own process.

Builds its context with ``StreamingContext.get_or_create`` (our checkpoint dir, both
WALs, a reliable receiver reading the test's acking source as a structured stream),
then runs a stateful query from the receiver stream into a Parquet file sink with its
own Spark checkpoint: ``applyInPandasWithState`` keeps a running count per key
(``seq % 7``) and gives every record its key's count after it (``n``), so the sink shows
both that each record is written once and that the state counted it once. With
``--slow-ms`` every task of the query writes a marker file and lingers, so that the test
can kill the driver in the middle of a trigger. Stops gracefully on SIGTERM: the query
first, then the context. Prints ``FRESH`` or ``RECOVERED`` once started, ``STOPPED`` at
the end.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
import time
import uuid

os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)

from processes import load_chaos_harness
from pyspark.sql import SparkSession
from pyspark.sql.streaming.state import GroupStateTimeout
from queries import start_query

from spark_receivers import StreamingConfig, StreamingContext

KEYS = 7


def running_count(key, frames, state):
    """The running count of one key: each record gets its key's count after it (1, 2, ...)."""
    import numpy as np
    import pandas as pd

    n = state.get[0] if state.exists else 0
    out = []
    for frame in frames:
        seqs = frame["seq"].to_numpy()
        counts = np.arange(n + 1, n + 1 + len(seqs))
        out.append(pd.DataFrame({"seq": seqs, "key": key[0], "n": counts}))
        n += len(seqs)
    state.update((n,))
    yield from out


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--checkpoint", required=True, help="spark-receivers checkpoint dir")
    parser.add_argument("--sql-checkpoint", required=True, help="the query's checkpointLocation")
    parser.add_argument("--sink", required=True)
    parser.add_argument("--marks", required=True)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--slow-ms", type=int, default=0)
    args = parser.parse_args()
    harness = load_chaos_harness()
    spark = (
        SparkSession.builder.master("local[3]")
        .appName("spark-receivers-structured-crash")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")

    def create() -> StreamingContext:
        cfg = StreamingConfig(
            receiver_wal_enabled=True,
            receiver_restart_delay_ms=300,
            batch_read_partitions=2,
        )
        ssc = StreamingContext(spark, 1000, checkpoint_dir=args.checkpoint, config=cfg)
        ssc.structured_stream(harness.ReliableTcpReceiver("127.0.0.1", args.port))
        return ssc

    ssc = StreamingContext.get_or_create(args.checkpoint, create)
    ssc.start()
    print("RECOVERED" if ssc.recovered_from_checkpoint else "FRESH", flush=True)
    (events,) = ssc.streams
    slow_s, marks = args.slow_ms / 1000.0, args.marks

    def linger(batches):
        # Runs in the query's tasks: a marker says "a trigger is reading now".
        if slow_s:
            name = os.path.join(marks, f"{time.time():.3f}-{uuid.uuid4().hex[:8]}")
            with open(name, "w"):
                pass
            time.sleep(slow_s)
        yield from batches

    df = events.read_stream().selectExpr("CAST(value AS BIGINT) AS seq")  # type: ignore[union-attr]
    keyed = df.mapInArrow(linger, df.schema).selectExpr("seq", f"seq % {KEYS} AS key")
    counted = keyed.groupBy("key").applyInPandasWithState(
        running_count, "seq long, key long, n long", "n long", "append", GroupStateTimeout.NoTimeout
    )
    writer = (
        counted.writeStream.format("parquet")
        .outputMode("append")
        .option("path", args.sink)
        .option("checkpointLocation", args.sql_checkpoint)
        .trigger(processingTime="1 second")
    )
    query = start_query(writer.start)
    print("STARTED", flush=True)
    done = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: done.set())
    last_status = 0.0
    while not done.wait(0.5):
        if time.monotonic() - last_status >= 5:  # what the test shows when a wait fails
            last_status = time.monotonic()
            status, progress = ssc.status(), query.lastProgress
            r = status.receivers[0]
            trigger = (
                f"batch {progress['batchId']} rows {progress['numInputRows']} "
                f"end {progress['sources'][0]['endOffset']}"
                if progress
                else "no trigger yet"
            )
            print(
                f"STATUS {time.strftime('%H:%M:%S')} receiver {r.state} records {r.records} "
                f"jobs {r.jobs} error {r.last_error_message!r}; query {trigger}",
                flush=True,
            )
        if query.exception() is not None or not query.isActive:
            print(f"QUERY FAILED {query.exception()}", flush=True)
            ssc.stop(graceful=False)
            spark.stop()
            return 1
    query.stop()
    ssc.stop(graceful=True)
    print("STOPPED", flush=True)
    spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
