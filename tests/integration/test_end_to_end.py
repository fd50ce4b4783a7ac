"""The path of one record on a real local Spark: receiver → blocks → DataFrame batches."""

from __future__ import annotations

import threading
import time

import pytest

from spark_receivers import LineSource, SocketTextReceiver, StreamingContext
from spark_receivers.testing import SequenceReceiver

pytestmark = pytest.mark.spark

OUR_THREAD_PREFIXES = (
    "receiver-",
    "block-generator",
    "job-generator",
    "streaming-",
    "socket-receiver",
)


def wait_until(predicate, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        threading.Event().wait(0.05)
    return predicate()


def assert_nothing_of_ours_left(spark) -> None:
    assert wait_until(lambda: not spark.sparkContext.statusTracker().getActiveJobsIds(), 30)
    ours = [t.name for t in threading.enumerate() if t.name.startswith(OUR_THREAD_PREFIXES)]
    assert ours == []


def test_every_store_form_delivers_each_record_exactly_once(spark):
    records = [f"record-{i:05d}" for i in range(5_000)]
    ssc = StreamingContext(spark, batch_interval_ms=500)
    stream = ssc.receiver_stream(SequenceReceiver(records, mode="mixed", chunk=100))
    batches: dict[int, list[str]] = {}
    lock = threading.Lock()

    def collect(df, batch_time_ms):
        values = [r.value for r in df.collect()]
        with lock:
            assert batch_time_ms not in batches
            batches[batch_time_ms] = values

    stream.foreach_batch(collect)
    ssc.start()
    try:

        def total():
            with lock:
                return sum(len(v) for v in batches.values())

        assert wait_until(lambda: total() >= len(records), 120), f"only {total()} records arrived"
    finally:
        ssc.stop(graceful=True)
    seen = [v for values in batches.values() for v in values]
    assert sorted(seen) == records  # each record exactly once, none in two batches
    assert len([b for b in batches.values() if b]) >= 1
    assert ssc.last_progress is not None
    assert_nothing_of_ours_left(spark)


def test_socket_pipeline_counts_exactly_what_the_source_sent(spark):
    with LineSource(rate=5_000) as source:
        ssc = StreamingContext(spark, batch_interval_ms=1000)
        lines = ssc.receiver_stream(SocketTextReceiver(source.host, source.port))
        counted = []
        lines.foreach_batch(lambda df, t: counted.append(df.count()))
        ssc.start()
        assert wait_until(lambda: source.lines_sent >= 15_000, 60)
        sent = source.finish()
        tracker = ssc.receiver_tracker
        assert wait_until(lambda: tracker.records_received() >= sent, 60)
        ssc.stop(graceful=True)
    assert sent > 0
    assert tracker.records_received() == sent
    assert sum(counted) == sent
    assert_nothing_of_ours_left(spark)
