"""Issue 3's store forms through the whole pipeline on local Spark (a child of store_bench).

    python -m bench.store_pipeline --forms one,list,arrow --seconds 30

One SparkSession (``local[4]``), then for each form a fresh
:class:`~spark_receivers.StreamingContext` (1 s batches, 200 ms blocks) whose receiver stores
that form in a loop as fast as ``store`` lets it: ``one`` record, lists of 1,000 records,
Arrow batches of 10,000 rows (cycling through 32 distinct batches). The output operation
counts each batch's rows (``df.count()``: every block is read from the receiver over
Flight into Spark).

A producer that never waits would only fill the receiver's memory: ``store`` returns as soon
as a block is in the receiver's store, whatever Spark does with it. So backpressure is on
(PID, initial rate 100,000/s: it climbs to the measured processing rate within a few
batches, where starting above it builds a backlog that the integral term pays off slowly):
the rate the pipeline sustains is the rate backpressure settles at. Reported per form, over
the second half of the run: rows processed per second of wall time, the receiver's rate
limit, batch processing p50 and the largest scheduling delay.
Prints one JSON line, ``RESULT <json>``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import threading
import time
from typing import Any

RESULT = "RESULT "
FORMS = ("one", "list", "arrow")
LIST_LEN = 1000
ARROW_ROWS = 10_000
ARROW_POOL = 32
INITIAL_RATE = 100_000


def _records(n: int, offset: int = 0) -> list[str]:
    return [f"{i:010d} " + "x" * 89 for i in range(offset, offset + n)]


def run_form(spark: Any, form: str, seconds: float, wal: bool = False) -> dict[str, Any]:
    """One form through a fresh streaming context; the measurements of its second half.

    ``wal``: with the receiver WAL on (a fresh checkpoint directory), so that every
    block is also written and fsync'd to the receiver's write-ahead log.
    """
    import tempfile

    import pyarrow as pa

    from spark_receivers import Receiver, StreamingConfig, StreamingContext, StreamingListener

    class FlatOut(Receiver):
        """Stores ``form`` in a loop until stopped (store blocks under the rate limit)."""

        def __init__(self, form: str) -> None:
            super().__init__()
            self.form = form

        def on_start(self) -> None:
            threading.Thread(target=self._run, daemon=True).start()

        def on_stop(self) -> None:
            pass

        def _run(self) -> None:
            import pyarrow as pa

            records = _records(LIST_LEN)
            payload: list[Any]
            if self.form == "one":
                payload = records
            elif self.form == "list":
                payload = [records]
            else:
                payload = [
                    pa.RecordBatch.from_arrays(
                        [pa.array(_records(ARROW_ROWS, i * ARROW_ROWS), pa.string())],
                        names=["value"],
                    )
                    for i in range(ARROW_POOL)
                ]
            try:
                while not self.is_stopped():
                    for item in payload:
                        self.store(item)
            except Exception:
                return

    samples: list[tuple[int, int, int | None, int | None]] = []

    class Batches(StreamingListener):
        def on_batch_completed(self, info: Any) -> None:
            samples.append(
                (
                    info.batch_time_ms,
                    info.num_records,
                    info.processing_delay_ms,
                    info.scheduling_delay_ms,
                )
            )

    config = StreamingConfig(
        backpressure_enabled=True,
        backpressure_initial_rate=INITIAL_RATE,
        receiver_drain_timeout_s=10.0,
        receiver_wal_enabled=wal,
    )
    checkpoint = tempfile.mkdtemp(prefix="store-pipeline-wal-") if wal else None
    ssc = StreamingContext(spark, batch_interval_ms=1000, checkpoint_dir=checkpoint, config=config)
    ssc.add_streaming_listener(Batches())
    ssc.receiver_stream(FlatOut(form)).foreach_batch(lambda df, t: df.count())
    ssc.start()
    started = time.time() * 1000
    ssc.await_termination(timeout_s=seconds)
    ssc.stop(graceful=False)
    half = started + seconds * 500
    rates = [
        r
        # The rate history is not public: read it off the scheduler (bench only).
        for controller in ssc._scheduler.rate_controllers.values()  # type: ignore[union-attr]
        for t, r in controller.history
        if t >= half
    ]
    late = [s for s in samples if s[0] >= half]
    span_s = (max(s[0] for s in late) - min(s[0] for s in late)) / 1000 + 1 if late else 0
    processed = sum(s[1] for s in late)
    delays = [s[3] for s in late if s[3] is not None]
    times = [s[2] for s in late if s[2] is not None]
    del pa
    if checkpoint is not None:
        import shutil

        shutil.rmtree(checkpoint, ignore_errors=True)
    return {
        "form": form,
        "wal": wal,
        "batches": len(late),
        "records": processed,
        "rate": processed / span_s if span_s else 0.0,
        "rate_limit": statistics.median(rates) if rates else None,
        "batch_p50_ms": statistics.median(times) if times else None,
        "max_sched_delay_ms": max(delays) if delays else None,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.store_pipeline", description=__doc__)
    p.add_argument("--forms", default=",".join(FORMS))
    p.add_argument("--seconds", type=float, default=30.0)
    p.add_argument("--master", default="local[4]")
    p.add_argument(
        "--wal",
        choices=("off", "on", "both", "abba"),
        default="off",
        help="receiver WAL (both: off, on; abba: off, on, on, off, so that a drift of the "
        "machine's speed during the runs hits both modes alike)",
    )
    p.add_argument(
        "--warmup-seconds",
        type=float,
        default=0.0,
        help="first run the first form this long, unmeasured (a cold JVM and cold Python "
        "workers slow the first context, which would bias whichever mode runs first)",
    )
    args = p.parse_args(argv)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    spark = (
        SparkSession.builder.master(args.master)
        .appName("store-pipeline-bench")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.driver.memory", "2g")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    try:
        wal_modes = {
            "off": [False],
            "on": [True],
            "both": [False, True],
            "abba": [False, True, True, False],
        }[args.wal]
        forms = [f for f in args.forms.split(",") if f]
        if args.warmup_seconds > 0 and forms:
            run_form(spark, forms[0], args.warmup_seconds, False)
        results = [run_form(spark, f, args.seconds, wal) for f in forms for wal in wal_modes]
    finally:
        spark.stop()
    print(RESULT + json.dumps(results), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
