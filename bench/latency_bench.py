"""Issue 6's batch benchmarks: per-batch overhead and end-to-end latency.

    python -m bench.latency_bench                 # ~2.5 minutes, writes the `latency` section
    python -m bench.latency_bench --quick         # smoke: 10 s per case
    python -m bench.latency_bench --seconds 5 --no-write

1. **Empty-batch overhead**: a receiver that stores nothing, 1 s batches, one
   ``foreach_batch`` that counts the (empty) DataFrame: processing time per batch from
   the listener (submission to completion), p50 and p99.
2. **End-to-end latency** from ``store`` to ``foreach_batch``: a receiver stores
   ``--rate`` records/s (1,000 by default, one record per call), each its ``time.time()``;
   the output operation collects the batch and takes ``now - stamp`` per record. At 1 s
   batches with 200 ms blocks and at 500 ms batches with 100 ms blocks; p50 and p99 over
   every record after a warm-up. Target: p50 <= batch interval + block interval + 300 ms.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import threading
import time
from typing import Any

from bench.record import Recording, Section, add_record_arguments

SLACK_MS = 300
CASES = ((1000, 200), (500, 100))  # (batch interval, block interval) in ms


def percentile(values: list[float], q: float) -> float:
    """The ``q`` quantile (0-1) of ``values`` by nearest rank."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def run_empty(spark: Any, seconds: float) -> dict[str, Any]:
    from spark_receivers import Receiver, StreamingConfig, StreamingContext, StreamingListener

    class Silent(Receiver):
        def on_start(self) -> None:
            pass

        def on_stop(self) -> None:
            pass

    times: list[int] = []

    class Batches(StreamingListener):
        def on_batch_completed(self, info: Any) -> None:
            if info.processing_delay_ms is not None:
                times.append(info.processing_delay_ms)

    ssc = StreamingContext(spark, 1000, config=StreamingConfig(block_interval_ms=200))
    ssc.add_streaming_listener(Batches())
    ssc.receiver_stream(Silent()).foreach_batch(lambda df, t: df.count())
    ssc.start()
    ssc.await_termination(timeout_s=seconds)
    ssc.stop(graceful=False)
    steady = times[len(times) // 5 :]  # after the warm-up
    return {
        "batches": len(steady),
        "p50_ms": percentile(steady, 0.5),
        "p99_ms": percentile(steady, 0.99),
    }


def run_latency(
    spark: Any, batch_ms: int, block_ms: int, rate: int, seconds: float
) -> dict[str, Any]:
    from spark_receivers import Receiver, StreamingConfig, StreamingContext

    class Stamps(Receiver):
        def __init__(self, rate: int) -> None:
            super().__init__()
            self.rate = rate

        def on_start(self) -> None:
            threading.Thread(target=self._run, daemon=True).start()

        def on_stop(self) -> None:
            pass

        def _run(self) -> None:
            pause = 1.0 / self.rate
            next_at = time.time()
            while not self.is_stopped():
                self.store(repr(time.time()))
                next_at += pause
                time.sleep(max(0.0, next_at - time.time()))

    latencies: list[float] = []
    started = time.time()
    warm_up_s = seconds / 5

    def measure(df: Any, batch_time_ms: int) -> None:
        stamps = [float(r.value) for r in df.collect()]
        now = time.time()
        if now - started > warm_up_s:
            latencies.extend(1000 * (now - s) for s in stamps)

    config = StreamingConfig(block_interval_ms=block_ms)
    ssc = StreamingContext(spark, batch_ms, config=config)
    ssc.receiver_stream(Stamps(rate)).foreach_batch(measure)
    ssc.start()
    ssc.await_termination(timeout_s=seconds)
    ssc.stop(graceful=False)
    target = batch_ms + block_ms + SLACK_MS
    p50 = statistics.median(latencies) if latencies else float("nan")
    return {
        "batch_ms": batch_ms,
        "block_ms": block_ms,
        "records": len(latencies),
        "p50_ms": p50,
        "p99_ms": percentile(latencies, 0.99) if latencies else float("nan"),
        "target_ms": target,
        "met": bool(latencies) and p50 <= target,
    }


def render_table(empty: dict[str, Any], cases: list[dict[str, Any]]) -> str:
    lines = [
        "| measure | p50 | p99 | target | met |",
        "|---|---:|---:|---:|:---:|",
        f"| empty batch, 1 s batches ({empty['batches']} batches) | {empty['p50_ms']:.0f} ms "
        f"| {empty['p99_ms']:.0f} ms | - | - |",
    ]
    for c in cases:
        lines.append(
            f"| store → foreach_batch, {c['batch_ms']} ms batches, {c['block_ms']} ms blocks "
            f"({c['records']:,} records) | {c['p50_ms']:.0f} ms | {c['p99_ms']:.0f} ms "
            f"| p50 ≤ {c['target_ms']} ms | {'yes' if c['met'] else 'NO'} |"
        )
    return "\n".join(lines)


def render(data: dict[str, Any]) -> str:
    """The ``latency`` section's body from a run's raw data."""
    return (
        render_table(data["empty"], data["cases"])
        + f"\n\n{data['seconds']:.0f} s per case on local[4], the first fifth a warm-up. "
        f"Latency is per record, from the `time.time()` it was stored with "
        f"({data['rate']:,} records/s, one `store` per record) to `foreach_batch` having "
        "collected it; the empty batch is the listener's processing time of a batch whose one "
        "output operation counts an empty DataFrame."
    )


SECTION = Section(
    name="latency",
    module="bench.latency_bench",
    title="Batch overhead and latency (issue 6)",
    render=render,
)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m bench.latency_bench", description=(__doc__ or "").split("\n")[0]
    )
    p.add_argument("--quick", action="store_true", help="10 s per case")
    p.add_argument("--seconds", type=float, help="per case (30; quick 10)")
    p.add_argument("--rate", type=int, default=1000, help="records/s stored")
    add_record_arguments(p)
    args = p.parse_args(argv)
    seconds = args.seconds or (10.0 if args.quick else 30.0)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    with Recording(SECTION, "python -m bench.latency_bench", argv, args) as rec:
        spark = (
            SparkSession.builder.master("local[4]")
            .appName("latency-bench")
            .config("spark.ui.enabled", "false")
            .config("spark.ui.showConsoleProgress", "false")
            .getOrCreate()
        )
        spark.sparkContext.setLogLevel("ERROR")
        try:
            empty = run_empty(spark, seconds)
            cases = [run_latency(spark, b, k, args.rate, seconds) for b, k in CASES]
        finally:
            spark.stop()
    data = {"seconds": seconds, "rate": args.rate, "empty": empty, "cases": cases}
    print(render_table(empty, cases), flush=True)
    rec.finish(data)
    return 0


if __name__ == "__main__":
    sys.exit(main())
