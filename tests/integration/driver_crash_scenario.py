"""A streaming driver for the driver-crash test, run as its own process (twice).

Builds its context with ``StreamingContext.get_or_create`` (checkpoint dir, both
WALs, a reliable receiver reading the test's acking source) and an idempotent
sink: every batch is written with Spark to ``<out>/batch=<time>`` in overwrite
mode, then a manifest of its records goes to ``<out>/manifests/<time>-<pid>.json``
and the batch lingers ``--slow-ms`` so that the test can kill the driver in the
middle of a batch. With ``--state``, a count per key (``value % 10``) kept by
``update_state_by_key`` (saved every 2 batches) is written after every batch to
``<out>/state=<time>``. Stops gracefully on SIGTERM (``stop_gracefully_on_shutdown``).
Prints ``FRESH`` or ``RECOVERED <batches>`` once started, ``STOPPED`` at the end.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import sys
import threading
import time

os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)

import pyarrow.parquet as pq
from processes import load_chaos_harness
from pyspark.sql import SparkSession

from spark_receivers import StreamingConfig, StreamingContext


def read_values(path: str) -> list[str]:
    """The ``value`` column of a Parquet directory written by Spark (no Spark job)."""
    files = sorted(glob.glob(os.path.join(path, "*.parquet")))
    return [v for f in files for v in pq.read_table(f).column("value").to_pylist()]


def count_rows(key, rows, state):
    """A running count per key (update_state_by_key's function, pickled by value)."""
    import pandas as pd

    before = int(state["n"].iloc[0]) if len(state) else 0
    return pd.DataFrame({"key": [key[0]], "n": [before + len(rows)]})


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--checkpoint", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--slow-ms", type=int, default=1500)
    parser.add_argument("--remote", default=None, help="a Spark Connect server's sc:// URL")
    parser.add_argument("--state", action="store_true", help="also keep a count per key")
    args = parser.parse_args()
    harness = load_chaos_harness()
    if args.remote:
        spark = SparkSession.builder.remote(args.remote).getOrCreate()
    else:
        spark = (
            SparkSession.builder.master("local[3]")
            .appName("spark-receivers-driver-crash")
            .config("spark.ui.enabled", "false")
            .config("spark.ui.showConsoleProgress", "false")
            .config("spark.sql.shuffle.partitions", "2")
            .config("spark.driver.bindAddress", "127.0.0.1")
            .getOrCreate()
        )
        spark.sparkContext.setLogLevel("OFF")
    manifests = os.path.join(args.out, "manifests")
    os.makedirs(manifests, exist_ok=True)
    pause = threading.Event()

    def sink(df, batch_time_ms: int) -> None:
        path = os.path.join(args.out, f"batch={batch_time_ms}")
        df.write.mode("overwrite").parquet(path)  # idempotent: a re-run replaces the batch
        values = sorted(int(v) for v in read_values(path))
        print(f"BATCH {batch_time_ms} {len(values)} at {time.time():.3f}", flush=True)
        if not values:
            return
        name = os.path.join(manifests, f"{batch_time_ms}-{os.getpid()}.json")
        with open(name + ".tmp", "w") as f:
            json.dump(values, f)
        os.replace(name + ".tmp", name)
        pause.wait(args.slow_ms / 1000.0)  # the batch is still running: a kill lands here

    def save_state(df, batch_time_ms: int) -> None:
        df.write.mode("overwrite").parquet(os.path.join(args.out, f"state={batch_time_ms}"))

    def create() -> StreamingContext:
        cfg = StreamingConfig(
            receiver_wal_enabled=True,
            receiver_restart_delay_ms=300,
            receiver_drain_timeout_s=10.0,
            stop_gracefully_on_shutdown=True,
        )
        ssc = StreamingContext(spark, 2000, checkpoint_dir=args.checkpoint, config=cfg)
        stream = ssc.receiver_stream(harness.ReliableTcpReceiver("127.0.0.1", args.port))
        stream.foreach_batch(sink, "parquet-sink")
        if args.state:
            keys = stream.transform(
                lambda df: df.selectExpr("CAST(CAST(value AS INT) % 10 AS STRING) AS key")
            )
            state = keys.update_state_by_key(count_rows, "key", "key string, n bigint")
            state.checkpoint(4000).foreach_batch(save_state, "state-sink")
        return ssc

    ssc = StreamingContext.get_or_create(args.checkpoint, create)
    print(f"STARTING at {time.time():.3f}", flush=True)
    ssc.start()
    if ssc.recovered_from_checkpoint:
        print("RECOVERED " + json.dumps(list(ssc.status().recovered_batches_ms)), flush=True)
    else:
        print("FRESH", flush=True)
    print(f"STARTED at {time.time():.3f}", flush=True)
    ssc.await_termination()
    print("STOPPED", flush=True)
    spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
