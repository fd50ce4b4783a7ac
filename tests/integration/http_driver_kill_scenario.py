"""A streaming driver for the HTTP idempotency test, run as its own process (twice).

Builds its context with ``StreamingContext.get_or_create`` (checkpoint dir, both WALs)
around an :class:`HttpReceiver` on ``--http-port``; every batch's values are written to
``<out>/batch-<time>.json`` (replaced when a batch is run again: idempotent by batch
time). Prints ``FRESH`` or ``RECOVERED`` once started, ``STOPPED`` at the end; stops
gracefully on SIGTERM (``stop_gracefully_on_shutdown``).
"""

from __future__ import annotations

import argparse
import json
import os
import sys

os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)

from pyspark.sql import SparkSession

from spark_receivers import StreamingConfig, StreamingContext
from spark_receivers.receivers import HttpReceiver


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--checkpoint", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--http-port", type=int, required=True)
    args = parser.parse_args()
    spark = (
        SparkSession.builder.master("local[3]")
        .appName("spark-receivers-http-driver-kill")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("OFF")
    os.makedirs(args.out, exist_ok=True)

    def sink(df, batch_time_ms: int) -> None:
        values = sorted(r["value"] for r in df.collect())
        name = os.path.join(args.out, f"batch-{batch_time_ms}.json")
        with open(name + ".tmp", "w") as f:
            json.dump(values, f)
        os.replace(name + ".tmp", name)  # a re-run batch replaces its file

    def create() -> StreamingContext:
        cfg = StreamingConfig(
            receiver_wal_enabled=True,
            receiver_restart_delay_ms=300,
            receiver_drain_timeout_s=10.0,
            stop_gracefully_on_shutdown=True,
        )
        ssc = StreamingContext(spark, 1000, checkpoint_dir=args.checkpoint, config=cfg)
        receiver = HttpReceiver(host="127.0.0.1", port=args.http_port)
        ssc.receiver_stream(receiver).foreach_batch(sink, "json-sink")
        return ssc

    ssc = StreamingContext.get_or_create(args.checkpoint, create)
    ssc.start()
    print("RECOVERED" if ssc.recovered_from_checkpoint else "FRESH", flush=True)
    ssc.await_termination()
    print("STOPPED", flush=True)
    spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
