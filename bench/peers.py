"""What PySpark users run today: the peers spark-receivers is measured against.

- ``dstream``: ``StreamingContext.socketTextStream`` (pyspark.streaming, deprecated since
  Spark 3.4, still shipped in 4.x), a ``StreamingListener`` for per-batch timings.
- ``structured_socket``: Structured Streaming's ``socket`` source, ``foreachBatch`` with a
  processing-time trigger, per-batch timings from ``query.recentProgress``.

Both compute the same word count per batch: split each line on spaces, drop the sequence
number, count per word, collect the counts to the driver. The sequence number token is
replaced by the word ``#lines``, so its count is the batch's line count, computed in the same
job as the word count and at no extra per-line cost. ``ingest`` counts lines instead;
``two_action`` runs ``count()`` and then the word count on each batch (DStream: two output
operations, so the batch's RDD is read twice, as in DStream's word-count examples);
``windowed`` counts each batch's lines, then the word count over the last 30 s every second
with ``reduceByKeyAndWindow(add, sub, 30, 1)`` (checkpointed, as Spark requires), collected.

Runners (parent side) have the :class:`bench.harness.Runner` signature; the children are
``python -m bench.peers <system> --port P --seconds S ...`` (see ``bench/child.py``).
"""

from __future__ import annotations

import datetime as dt
import operator
import shutil
import sys
import tempfile
import threading
import time
from functools import partial
from typing import Any

from bench.child import (
    SLIDE_S,
    WINDOW_S,
    BatchRecorder,
    ChildArgs,
    Pipeline,
    Stop,
    child_main,
    count_lines_of_batch,
    set_batch_record,
    spark_conf,
    warmup_lines,
)
from bench.harness import Runner
from bench.pipelines import WORD_MARK, batch_query
from bench.step import run_child_session

__all__ = ["run_dstream", "run_structured_socket"]


# -- parent side ------------------------------------------------------------------------------


run_dstream: Runner = partial(run_child_session, "dstream", "bench.peers")
"""The DStream ``socketTextStream`` word count (or line count), one session over the rates."""


run_structured_socket: Runner = partial(run_child_session, "structured_socket", "bench.peers")
"""The Structured Streaming ``socket`` source word count (or line count), one session."""


# -- child side: DStream ----------------------------------------------------------------------


def _dstream(args: ChildArgs, recorder: BatchRecorder) -> Stop:
    import warnings

    from pyspark import SparkConf, SparkContext
    from pyspark.streaming import StreamingContext
    from pyspark.streaming.listener import StreamingListener

    conf = SparkConf().setMaster(args.master).setAppName(f"bench-dstream-{args.pipeline}")
    conf.setAll(list(spark_conf(args).items()))
    sc = SparkContext(conf=conf)
    sc.setLogLevel("WARN")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # "DStream is deprecated"
        ssc = StreamingContext(sc, args.batch_interval_s)  # type: ignore[arg-type]  # float s ok
    offset_s = time.time() - time.monotonic()

    def mono(epoch_ms: float) -> float:
        return epoch_ms / 1000.0 - offset_s

    class Listener(StreamingListener):
        # Runs on a py4j callback thread, called from Spark's listener bus; must not block.
        def onBatchCompleted(self, batchCompleted: Any) -> None:
            # A JavaBatchInfo: plain longs, -1 where Scala's BatchInfo has None.
            info = batchCompleted.batchInfo()
            sched, proc, end = (
                info.schedulingDelay(),
                info.processingDelay(),
                info.processingEndTime(),
            )
            fields: dict[str, Any] = {"records": int(info.numRecords())}
            if sched >= 0:
                fields["scheduling_delay_ms"] = float(sched)
            if proc >= 0:
                fields["processing_ms"] = float(proc)
            if end >= 0:
                fields["completed_s"] = mono(end)
            recorder.update(int(info.batchTime().milliseconds()), **fields)

    ssc.addStreamingListener(Listener())
    lines = ssc.socketTextStream(args.host, args.port)
    mark = WORD_MARK

    def record(t: dt.datetime, n: int, started: float) -> None:
        # Runs on the py4j callback thread inside the batch's output operation. Its timings
        # are fallbacks: the listener's onBatchCompleted comes after it and overwrites them.
        batch_ms = round(t.timestamp() * 1000)
        now = time.monotonic()
        recorder.update(
            batch_ms,
            batch_time_s=mono(batch_ms),
            lines=n,
            completed_s=now,
            processing_ms=(now - started) * 1000,
        )

    def words(line: str) -> list[str]:
        parts = line.split(" ")
        parts[0] = mark
        return parts

    def word_count(rdd: Any) -> Any:
        return rdd.flatMap(words).map(lambda w: (w, 1)).reduceByKey(lambda a, b: a + b)

    warm = sc.parallelize(warmup_lines(), sc.defaultParallelism)
    for _ in range(0 if args.cold else 2):
        warm.count() if args.ingest_only else word_count(warm).collect()

    checkpoint = None
    if args.ingest_only or args.windowed:
        set_batch_record(record)
        lines.foreachRDD(count_lines_of_batch)
    if args.windowed:
        checkpoint = tempfile.mkdtemp(prefix="bench-dstream-")
        ssc.checkpoint(checkpoint)  # reduceByKeyAndWindow with an inverse needs one
        pairs = lines.flatMap(words).map(lambda w: (w, 1))
        window = pairs.reduceByKeyAndWindow(operator.add, operator.sub, WINDOW_S, SLIDE_S)
        window.foreachRDD(lambda rdd: rdd.collect())
    elif not args.ingest_only:

        def collect_counts(t: dt.datetime, rdd: Any) -> None:
            started = time.monotonic()
            result = dict(rdd.collect())
            record(t, result.get(mark, 0), started)

        if args.two_actions:
            # Two output operations, as DStream's examples do: the batch's RDD is read from
            # the BlockManager twice.
            lines.foreachRDD(lambda rdd: rdd.count())
        lines.transform(word_count).foreachRDD(collect_counts)

    ssc.start()

    def stop() -> dict[str, Any]:
        # Listener events trail the output callback; give the last ones a moment.
        recorder.wait_for(lambda: _all_have(recorder, "records"), 3 * args.batch_interval_s)
        version = sc.version
        ssc.stop(stopSparkContext=True, stopGraceFully=False)
        if checkpoint:
            shutil.rmtree(checkpoint, ignore_errors=True)
        return {"spark_version": version}

    return stop


def _all_have(recorder: BatchRecorder, key: str) -> bool:
    return all(key in e for e in recorder.entries() if e.get("lines"))


# -- child side: Structured Streaming socket source -------------------------------------------


def _structured_socket(args: ChildArgs, recorder: BatchRecorder) -> Stop:
    from pyspark.sql import SparkSession

    builder = SparkSession.builder.master(args.master).appName(
        f"bench-structured-socket-{args.pipeline}"
    )
    for k, v in spark_conf(args).items():
        builder = builder.config(k, v)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    checkpoint = tempfile.mkdtemp(prefix="bench-structured-")
    # No window here: a windowed run of this peer counts each batch's words.
    lines_in = batch_query("wordcount" if args.windowed else args.pipeline)

    if not args.cold:
        warm = spark.createDataFrame([(line,) for line in warmup_lines()], "value string")
        for _ in range(2):
            lines_in(warm)

    def on_batch(df: Any, batch_id: int) -> None:
        # Runs on the stream's execution thread (via py4j); blocking here is the batch.
        started = time.monotonic()
        n = lines_in(df)
        now = time.monotonic()
        recorder.update(
            batch_id, lines=int(n), completed_s=now, fb_processing_ms=(now - started) * 1000
        )

    source = (
        spark.readStream.format("socket").option("host", args.host).option("port", args.port).load()
    )
    query = (
        source.writeStream.foreachBatch(on_batch)
        .trigger(processingTime=f"{args.batch_interval_ms} milliseconds")
        .option("checkpointLocation", checkpoint)
        .start()
    )

    # Batch timings come from the query's progress reports: poll them, so that each batch
    # reaches the parent while the session runs (a Python StreamingQueryListener would be
    # called back over py4j on Spark's listener thread; a poll costs less and needs no bridge).
    polling = threading.Event()

    def poll_progress() -> None:
        while not polling.wait(0.5):
            _record_progress(query.recentProgress, recorder, args.batch_interval_ms)

    poller = threading.Thread(target=poll_progress, name="bench-progress", daemon=True)
    poller.start()

    def stop() -> dict[str, Any]:
        polling.set()
        poller.join(10)
        query.stop()
        _record_progress(query.recentProgress, recorder, args.batch_interval_ms)
        version = spark.version
        spark.stop()
        shutil.rmtree(checkpoint, ignore_errors=True)
        return {"spark_version": version}

    return stop


def _record_progress(progress: list[Any], recorder: BatchRecorder, interval_ms: int) -> None:
    """Per-batch timings from the query's progress reports.

    A processing-time trigger fires on the wall-clock grid (multiples of the interval since
    the epoch); when a batch overruns, the next fires as soon as it ends. Its scheduling
    delay, in DStream's sense, is how far past its grid time it started: the previous batch's
    end minus the first grid point after the previous batch's start.
    """
    offset_s = time.time() - time.monotonic()
    previous: tuple[float, float] | None = None  # (start, end) in epoch ms
    for p in sorted(progress, key=lambda p: p.batchId):
        start_ms = _parse_iso_ms(p.timestamp)
        duration_ms = float(p.durationMs.get("triggerExecution", 0))
        delay = 0.0
        if previous is not None:
            due_ms = (previous[0] // interval_ms + 1) * interval_ms
            delay = max(0.0, previous[1] - due_ms)
        previous = (start_ms, start_ms + duration_ms)
        recorder.update(
            int(p.batchId),
            batch_time_s=start_ms / 1000.0 - offset_s,
            processing_ms=duration_ms,
            scheduling_delay_ms=delay,
            records=int(p.numInputRows),
        )


def _parse_iso_ms(stamp: str) -> float:
    t = dt.datetime.strptime(stamp, "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=dt.UTC)
    return t.timestamp() * 1000.0


PIPELINES: dict[str, Pipeline] = {"dstream": _dstream, "structured_socket": _structured_socket}

if __name__ == "__main__":
    sys.exit(child_main(PIPELINES))
