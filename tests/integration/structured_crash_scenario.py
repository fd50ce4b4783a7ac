"""A Structured Streaming driver for the exactly-once crash test, run as its own process.

Builds its context with ``StreamingContext.get_or_create`` (our checkpoint dir, both
WALs, a reliable receiver reading the test's acking source as a structured stream),
then runs a query from the receiver stream into a Parquet file sink with its own
Spark checkpoint. With ``--slow-ms`` every task of the query writes a marker file and
lingers, so that the test can kill the driver in the middle of a trigger. Stops
gracefully on SIGTERM: the query first, then the context. Prints ``FRESH`` or
``RECOVERED`` once started, ``STOPPED`` at the end.
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

from spark_receivers import StreamingConfig, StreamingContext


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
    query = (
        df.mapInArrow(linger, df.schema)
        .writeStream.format("parquet")
        .option("path", args.sink)
        .option("checkpointLocation", args.sql_checkpoint)
        .trigger(processingTime="1 second")
        .start()
    )
    print("STARTED", flush=True)
    done = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: done.set())
    while not done.wait(0.5):
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
