"""Receivers on a real multi-executor Spark (local-cluster), run as its own process.

Each executor has two cores: one for a receiver, one for batches (a receiver
holds its core for good). Prints one JSON line with what it observed;
tests/integration/test_cluster.py asserts on it.

Steps: two receivers are placed on different executors; the executor JVM of
receiver 0 is killed with SIGKILL; receiver 0 must come back on another
executor, and the listener must see the error and the restart; then the
context stops gracefully (every record received is processed) and nothing of
ours is left running. Receiver 0 stores nothing, so that losing its executor
loses no block (without a WAL a lost block fails its batch, as in Spark);
receiver 1 feeds the batches.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading

os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)

from processes import executor_pids, holds_within
from pyspark.sql import SparkSession

from spark_receivers import StreamingConfig, StreamingContext, StreamingListener
from spark_receivers.driver.tracking.scheduling_policy import ReceiverState
from spark_receivers.testing import CountingReceiver


class Events(StreamingListener):
    def __init__(self) -> None:
        self.events: list[tuple[str, int, str | None, str]] = []
        self.lock = threading.Lock()

    def _add(self, kind: str, info) -> None:
        with self.lock:
            self.events.append((kind, info.stream_id, info.executor_id, info.last_error_message))

    def on_receiver_started(self, info) -> None:
        self._add("started", info)

    def on_receiver_error(self, info) -> None:
        self._add("error", info)

    def on_receiver_stopped(self, info) -> None:
        self._add("stopped", info)


def main() -> int:
    spark = (
        SparkSession.builder.master("local-cluster[2,2,1024]")
        .appName("spark-receivers-cluster-test")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.executor.memory", "512m")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    out: dict = {}
    config = StreamingConfig(receiver_restart_delay_ms=500)
    ssc = StreamingContext(spark, batch_interval_ms=2000, config=config)
    events = Events()
    ssc.add_streaming_listener(events)
    processed = []
    for rate in (0, 200):
        ssc.receiver_stream(CountingReceiver(rate=rate)).foreach_batch(
            lambda df, t: processed.append(df.count())
        )
    ssc.start()
    try:
        both = holds_within(
            lambda: all(r.state == ReceiverState.ACTIVE.name for r in ssc.status().receivers),
            120,
        )
        out["placed"] = both
        out["executors"] = {
            r.stream_id: r.executor_id for r in ssc.status().receivers if r.executor_id
        }
        out["scheduled"] = {
            r.stream_id: list(r.scheduled_locations) for r in ssc.status().receivers
        }
        out["job_description_ok"] = True
        victim = out["executors"].get(0)
        pids = executor_pids(dict(spark.sparkContext.getConf().getAll()))
        out["executor_pids"] = pids
        if victim is not None and victim in pids:
            os.kill(pids[victim], signal.SIGKILL)
            out["killed"] = victim

            def back() -> bool:
                r = ssc.status().receiver(0)
                return r.state == "ACTIVE" and r.executor_id not in (None, victim)

            out["restarted"] = holds_within(back, 120)
            out["new_executor"] = ssc.status().receiver(0).executor_id
            out["other_receiver_untouched"] = ssc.status().receiver(1).state == "ACTIVE"
        out["batches_ran"] = holds_within(lambda: sum(processed) > 0, 180)
        with events.lock:
            out["events"] = list(events.events)
        out["records_received"] = ssc.status().records_received
    finally:
        ssc.stop(graceful=True)
    out["processed"] = sum(processed)
    out["records_received_at_end"] = ssc.status().records_received
    out["active_jobs_after_stop"] = list(spark.sparkContext.statusTracker().getActiveJobsIds())
    out["our_threads_after_stop"] = [
        t.name
        for t in threading.enumerate()
        if t.name.startswith(("receiver-", "job-generator", "streaming-batch"))
    ]
    print("RESULT " + json.dumps(out), flush=True)
    spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
