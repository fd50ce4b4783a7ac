"""``spark-receivers demo``: a word count over the built-in local line source.

A :class:`LineSource` on 127.0.0.1 sends numbered lines of words to a
:class:`SocketTextReceiver`; each batch is counted and its top words printed;
at the end the command checks that every line sent was received and processed
exactly once (exit 1 otherwise). On local Spark it is the one command that sets
``SPARK_LOCAL_IP`` (to 127.0.0.1, when unset): everything it runs is on this
machine. With ``--master spark://...`` (or any cluster master) the line source
listens on the driver's host (``spark.driver.host``) instead, on a free port the
executors must be able to reach.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from spark_receivers.cli.ingest import parse_interval_ms, parse_seconds
from spark_receivers.cli.spark_session import (
    SparkSettings,
    is_local,
    spark_settings,
    start_spark,
    without_unavailable_status_page,
)
from spark_receivers.errors import ConfigError

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = ["run"]

DRAIN_BOUND_S = 30.0
RECEIVER_START_BOUND_S = 300.0


def run(
    args: argparse.Namespace, start: Callable[[SparkSettings], SparkSession] = start_spark
) -> int:
    """The ``demo`` command; returns its exit status."""
    seconds = parse_seconds(args.seconds, unset="the default is 20s") or 20.0
    interval_ms = parse_interval_ms(args.batch_interval, args.batch_interval_ms)
    if not math.isfinite(args.rate) or args.rate <= 0:
        msg = f"--rate must be a finite number of lines/s > 0, got {args.rate!r}"
        raise ConfigError(msg)
    settings = spark_settings(
        "spark-receivers-demo",
        args.master,
        args.conf,
        ui=not args.no_ui,
        remote=getattr(args, "remote", None),
    )
    settings, page_warning = without_unavailable_status_page(settings)
    local = is_local(settings.master)
    out = sys.stdout
    say: Callable[..., None] = (
        (lambda *a: print(*a, file=sys.stderr, flush=True))
        if args.json
        else (lambda *a: print(*a, file=out, flush=True))
    )
    if local:
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    if page_warning:
        print(f"warning: {page_warning}", file=sys.stderr, flush=True)
    say(f"starting {'local ' if local else ''}Spark ({settings.master}) ...")
    spark = start(settings)
    try:
        summary = _word_count(spark, args.rate, seconds, interval_ms, say)
    finally:
        spark.stop()
    if args.json:
        print(json.dumps(summary), file=out, flush=True)
    return 0 if summary["ok"] else 1


def _wait_for_the_receiver(ssc: Any, say: Callable[..., None]) -> str | None:
    """Wait (up to :data:`RECEIVER_START_BOUND_S`) until the receiver runs; None if it does.

    The demo's ``--seconds`` count from then: on a busy machine or a cluster whose
    executors take a while, the receiver's task may start seconds after ``start()``.
    """
    started = time.monotonic()
    told = False
    while (waited := time.monotonic() - started) < RECEIVER_START_BOUND_S:
        status = ssc.status()
        if status.failure is not None:
            return str(status.failure)
        if status.receivers and all(r.state == "ACTIVE" for r in status.receivers):
            return None
        if not told and waited > 5:
            say("waiting for the receiver's task to start ...")
            told = True
        time.sleep(0.1)
    return (
        f"the receiver did not start within {RECEIVER_START_BOUND_S:g}s: are the executors' "
        "task slots all taken, or can they not reach the driver? (see the Spark UI)"
    )


def _word_count(
    spark: SparkSession, rate: float, seconds: float, interval_ms: int, say: Callable[..., None]
) -> dict[str, Any]:
    from pyspark.sql import functions as F

    from spark_receivers import LineSource, SocketTextReceiver, StreamingContext
    from spark_receivers.receivers.lines import LINE_WORDS

    # On a cluster the executors connect to the source: it listens where they reach the driver.
    master = spark.conf.get("spark.master", "") or ""
    host = "127.0.0.1" if is_local(master) else spark.conf.get("spark.driver.host", "127.0.0.1")
    source = LineSource(rate, host=host or "127.0.0.1", words=LINE_WORDS).start()
    ssc = StreamingContext(spark, batch_interval_ms=interval_ms)
    lines = ssc.receiver_stream(SocketTextReceiver(source.host, source.port))
    stats = {"processed": 0, "batches": 0, "processing_ms": 0.0}
    lock = threading.Lock()

    def word_count(df: Any, batch_time_ms: int) -> None:
        started = time.monotonic()
        n = df.count()  # the batch's rows stay cached for the word count (batch_cache)
        top = (
            df.select(F.explode(F.split("value", " ")).alias("word"))
            .where(~F.col("word").rlike("^[0-9]+$"))
            .groupBy("word")
            .count()
            .orderBy(F.desc("count"))
            .limit(5)
            .collect()
        )
        elapsed = (time.monotonic() - started) * 1000
        with lock:
            stats["processed"] += n
            stats["batches"] += 1
            stats["processing_ms"] += elapsed
        when = time.strftime("%H:%M:%S", time.localtime(batch_time_ms / 1000))
        words = "  ".join(f"{r['word']}={r['count']}" for r in top) or "-"
        say(f"batch {when}  records {n:>8,}  {elapsed:6.0f} ms  top: {words}")

    lines.foreach_batch(word_count)
    ssc.start()
    if ssc.status_page_url:
        say(f"status page {ssc.status_page_url}  (Prometheus: {ssc.status_page_url}metrics)")
    failed = _wait_for_the_receiver(ssc, say)
    started = time.monotonic()
    say(f"streaming for {seconds:g}s at {rate:,.0f} lines/s from {source.host}:{source.port} ...")
    try:
        if failed is None:
            ssc.await_termination(timeout_s=seconds)
    except Exception as e:  # noqa: BLE001 - the stream failed: reported in the summary
        failed = str(e)
    sent = source.finish()
    deadline = time.monotonic() + DRAIN_BOUND_S
    while failed is None and ssc.status().records_received < sent and time.monotonic() < deadline:
        time.sleep(0.05)
    received = ssc.status().records_received
    ssc.stop(graceful=True)
    elapsed = time.monotonic() - started
    source.stop()
    processed = ssc.status().records_processed
    summary = {
        "records_sent": sent,
        "records_received": received,
        "records_processed": processed,
        "batches": stats["batches"],
        "seconds": round(elapsed, 2),
        "throughput_rps": round(processed / elapsed, 1) if elapsed > 0 else 0.0,
        "avg_batch_processing_ms": round(stats["processing_ms"] / max(stats["batches"], 1), 1),
        "offered_rate": rate,
        "batch_interval_ms": interval_ms,
        "ok": failed is None and sent == received == processed and sent > 0,
    }
    say(
        f"\nsent {sent:,}  received {received:,}  processed {processed:,}  "
        f"in {stats['batches']} batches over {elapsed:.1f}s "
        f"({summary['throughput_rps']:,.0f} records/s)"
    )
    if failed is not None:
        say(f"error: the stream failed: {failed.splitlines()[0]}")
    else:
        say(
            "every record sent was processed exactly once"
            if summary["ok"]
            else "MISMATCH: see the counts above"
        )
    return summary
