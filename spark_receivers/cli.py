"""The ``spark-receivers`` command line."""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import threading
import time
from typing import Any


def _local_spark(master: str, app_name: str) -> Any:
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    spark = (
        SparkSession.builder.master(master)
        .appName(app_name)
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "4")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def demo(args: argparse.Namespace) -> int:
    """Word count over the built-in line source through a socket receiver."""
    from pyspark.sql import functions as F

    from spark_receivers import LineSource, SocketTextReceiver, StreamingContext

    out = sys.stdout
    say = (
        (lambda *a: print(*a, file=sys.stderr, flush=True))
        if args.json
        else (lambda *a: print(*a, file=out, flush=True))
    )
    say(f"starting local Spark ({args.master}) ...")
    spark = _local_spark(args.master, "spark-receivers-demo")
    source = LineSource(rate=args.rate).start()
    ssc = StreamingContext(spark, batch_interval_ms=args.batch_interval_ms)
    lines = ssc.receiver_stream(SocketTextReceiver(source.host, source.port))
    stats = {"processed": 0, "batches": 0, "processing_ms": 0.0}
    lock = threading.Lock()

    def word_count(df: Any, batch_time_ms: int) -> None:
        started = time.monotonic()
        df = df.persist()
        n = df.count()
        top = (
            df.select(F.explode(F.split("value", " ")).alias("word"))
            .where(~F.col("word").rlike("^[0-9]+$"))
            .groupBy("word")
            .count()
            .orderBy(F.desc("count"))
            .limit(5)
            .collect()
        )
        df.unpersist()
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
    say(
        f"streaming for {args.seconds:g}s at {args.rate:,.0f} lines/s "
        f"from {source.host}:{source.port} ..."
    )
    started = time.monotonic()
    ssc.await_termination(timeout_s=args.seconds)
    sent = source.finish()
    deadline = time.monotonic() + 30
    while ssc.status().records_received < sent and time.monotonic() < deadline:
        time.sleep(0.05)
    received = ssc.status().records_received
    ssc.stop(graceful=True)
    elapsed = time.monotonic() - started
    source.stop()
    summary = {
        "records_sent": sent,
        "records_received": received,
        "records_processed": stats["processed"],
        "batches": stats["batches"],
        "seconds": round(elapsed, 2),
        "throughput_rps": round(stats["processed"] / elapsed, 1) if elapsed > 0 else 0.0,
        "avg_batch_processing_ms": round(stats["processing_ms"] / max(stats["batches"], 1), 1),
        "offered_rate": args.rate,
        "batch_interval_ms": args.batch_interval_ms,
        "ok": sent == received == stats["processed"] and sent > 0,
    }
    say(
        f"\nsent {sent:,}  received {received:,}  processed {stats['processed']:,}  "
        f"in {stats['batches']} batches over {elapsed:.1f}s "
        f"({summary['throughput_rps']:,.0f} records/s)"
    )
    say(
        "every record sent was processed exactly once"
        if summary["ok"]
        else "MISMATCH: see the counts above"
    )
    if args.json:
        print(json.dumps(summary), file=out, flush=True)
    spark.stop()
    return 0 if summary["ok"] else 1


def ingest(args: argparse.Namespace) -> int:
    """Run a source → sink streaming job until --seconds pass or Ctrl-C."""
    import signal

    from spark_receivers import StreamingConfig, StreamingContext
    from spark_receivers.ingest import ProgressPrinter, parse_duration_ms, receiver_for, sink_for

    interval_ms = parse_duration_ms(args.batch_interval)
    receiver = receiver_for(args.source)
    if args.wal and not args.checkpoint:
        print(
            "error: --wal needs --checkpoint DIR (the write-ahead logs live there)", file=sys.stderr
        )
        return 2
    spark = _local_spark(args.master, "spark-receivers-ingest")
    sink = sink_for(args.sink, spark)
    # Only what the flags say is explicit: every other key still comes from --conf.
    config = StreamingConfig(receiver_wal_enabled=True) if args.wal else None

    def create() -> StreamingContext:
        ctx = StreamingContext(spark, interval_ms, checkpoint_dir=args.checkpoint, config=config)
        ctx.receiver_stream(receiver).foreach_batch(sink, name=args.sink)
        return ctx

    # With a checkpoint a restart recovers: the batches a killed run left unfinished run
    # again with the same blocks, and blocks it had received reach a batch.
    ssc = StreamingContext.get_or_create(args.checkpoint, create) if args.checkpoint else create()
    if ssc.recovered_from_checkpoint:
        print(f"recovering from the checkpoint in {args.checkpoint}", file=sys.stderr, flush=True)
    progress = ProgressPrinter(ssc)
    ssc.add_streaming_listener(progress)
    interrupted = threading.Event()

    def on_signal(signum: int, frame: Any) -> None:
        if interrupted.is_set():
            print("stopping now", file=sys.stderr, flush=True)
            ssc.stop(graceful=False)
        interrupted.set()

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    ssc.start()
    print(
        f"ingesting {args.source} -> {args.sink} every {interval_ms} ms; Ctrl-C stops gracefully",
        file=sys.stderr,
        flush=True,
    )
    interrupted.wait(args.seconds)
    print("stopping gracefully (Ctrl-C again to stop at once) ...", file=sys.stderr, flush=True)
    failure = None
    try:
        ssc.stop(graceful=True)
        ssc.await_termination(0)
    except Exception as e:  # noqa: BLE001 - reported below, exit code 1
        failure = e
    received = ssc.status().records_received
    print(
        f"done: {progress.batches} batches, {progress.records:,} records processed, "
        f"{received:,} received",
        file=sys.stderr,
        flush=True,
    )
    spark.stop()
    if failure is not None:
        print(f"error: {failure}", file=sys.stderr)
        return 1
    return 0


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``spark-receivers`` command."""
    parser = argparse.ArgumentParser(prog="spark-receivers", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("demo", help="streaming word count over a built-in local line source")
    p.add_argument(
        "--seconds", type=float, default=20.0, help="how long the source sends (default 20)"
    )
    p.add_argument(
        "--rate", type=float, default=20_000.0, help="lines per second offered (default 20000)"
    )
    p.add_argument(
        "--batch-interval-ms", type=int, default=1000, help="batch interval (default 1000)"
    )
    p.add_argument("--master", default="local[4]", help="Spark master (default local[4])")
    p.add_argument("--json", action="store_true", help="print a JSON summary as the last line")
    p.set_defaults(func=demo)
    q = sub.add_parser("ingest", help="stream a source URI into a sink")
    q.add_argument(
        "--source",
        required=True,
        help="socket://, http://, file://, redis://, mqtt:// or generator:// URI",
    )
    q.add_argument("--sink", required=True, help="parquet:DIR, console or table:NAME")
    q.add_argument("--batch-interval", default="1s", help="batch interval (default 1s)")
    q.add_argument("--checkpoint", default=None, help="checkpoint directory (needed by --wal)")
    q.add_argument(
        "--wal", action="store_true", help="write-ahead logs: nothing acknowledged is lost"
    )
    q.add_argument(
        "--seconds",
        type=float,
        default=None,
        help="stop after N seconds (default: run until Ctrl-C)",
    )
    q.add_argument("--master", default="local[4]", help="Spark master (default local[4])")
    q.set_defaults(func=ingest)
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=os.environ.get("SPARK_RECEIVERS_LOG_LEVEL", "WARNING"),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    rc: int = args.func(args)
    return rc


if __name__ == "__main__":
    sys.exit(main())
