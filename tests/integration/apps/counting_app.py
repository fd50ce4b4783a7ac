"""A user's app with a receiver of its own: two receivers, every record exactly once.

An unchanged app for ``spark-submit --master spark://...``: nothing in it knows
the cluster. Each of two ``NumberedReceiver``s stores ``--records`` numbered
records and then idles; the app waits until every record was processed, stops
gracefully, and prints one ``RESULT {json}`` line: where each receiver ran, what
was sent, delivered, duplicated and lost. ``--secret-file`` writes the secret of
every context it made (one a line) where the test can grep the logs for them.

``--check-first`` first starts a context of ``spark.receivers.shipPackage=check``
(given in code, as a user would for that one context) and records how its
``start()`` failed in ``check_error``; then the app runs as above with the
session's own settings: one application shows both the refusal and the shipping.
"""

from __future__ import annotations

import argparse
import collections
import json
import sys
import threading
import time

from pyspark.sql import SparkSession

from spark_receivers import Receiver, StreamingConfig, StreamingContext


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
    p.add_argument("--records", type=int, default=20_000)
    p.add_argument("--timeout-s", type=float, default=150)
    p.add_argument("--secret-file", default=None)
    p.add_argument("--check-first", action="store_true")
    args = p.parse_args()
    spark = SparkSession.builder.appName("counting-app").getOrCreate()
    spark.sparkContext.setLogLevel("INFO" if args.secret_file else "WARN")
    seen: collections.Counter[str] = collections.Counter()
    lock = threading.Lock()
    secrets: list[str] = []

    def collect(df, batch_time_ms: int) -> None:
        values = [r.value for r in df.collect()]
        with lock:
            seen.update(values)

    def context(config: StreamingConfig | None = None) -> StreamingContext:
        ssc = StreamingContext(spark, batch_interval_ms=1000, config=config)
        secrets.append(ssc._secret)
        for _ in range(2):
            ssc.receiver_stream(NumberedReceiver(args.records)).foreach_batch(collect)
        return ssc

    def write_secrets() -> None:
        if args.secret_file:
            with open(args.secret_file, "w") as f:
                f.write("\n".join(secrets) + "\n")

    out: dict = {}
    if args.check_first:
        checked = context(StreamingConfig(ship_package="check"))
        try:
            checked.start()
        except Exception as e:  # the test asserts on this message
            out["check_error"] = f"{type(e).__name__}: {e}"
        else:
            out["check_error"] = None
            checked.stop(graceful=False)
    ssc = context()
    try:
        ssc.start()
    except Exception as e:  # the test asserts on this message
        out["start_error"] = f"{type(e).__name__}: {e}"
        write_secrets()
        print("RESULT " + json.dumps(out), flush=True)
        spark.stop()
        return 0
    write_secrets()
    expected = {f"{s}-{n}" for s in range(2) for n in range(args.records)}
    deadline = time.monotonic() + args.timeout_s
    placed = {}
    while time.monotonic() < deadline:
        for r in ssc.status().receivers:
            if r.executor_id:
                placed[r.stream_id] = {
                    "executor": r.executor_id,
                    "host": r.host,
                    "endpoint": r.endpoint,
                }
        with lock:
            if expected <= set(seen):
                break
        time.sleep(0.5)
    ssc.stop(graceful=True)
    with lock:
        delivered = set(seen)
        out.update(
            receivers=placed,
            sent=len(expected),
            delivered=len(delivered & expected),
            duplicated=sum(c - 1 for c in seen.values() if c > 1),
            lost=len(expected - delivered),
            unexpected=len(delivered - expected),
        )
    out["status_records"] = ssc.status().records_received
    out["last_progress"] = ssc.last_progress
    print("RESULT " + json.dumps(out, default=str), flush=True)
    spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
