"""The path of one record on a real local Spark: receiver → blocks → DataFrame batches."""

from __future__ import annotations

import threading

import pytest
from waiting import wait_until

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
        assert wait_until(lambda: ssc.status().records_received >= sent, 60)
        ssc.stop(graceful=True)
    assert sent > 0
    assert ssc.status().records_received == sent
    assert sum(counted) == sent
    assert_nothing_of_ours_left(spark)


def test_tracker_refuses_strangers_and_keeps_running(spark):
    from spark_receivers.errors import AuthenticationError, RpcError
    from spark_receivers.rpc import messages as m
    from spark_receivers.rpc.transport import EndpointClient
    from spark_receivers.testing import CountingReceiver

    ssc = StreamingContext(spark, batch_interval_ms=500)
    counted = []
    ssc.receiver_stream(CountingReceiver(rate=200)).foreach_batch(
        lambda df, t: counted.append(df.count())
    )
    ssc.start()
    try:
        assert wait_until(
            lambda: (
                ssc.status().receiver(0).state == "ACTIVE" and ssc.status().records_received > 0
            ),
            60,
        )
        address = ssc.status().tracker_address
        assert address is not None
        client = EndpointClient(address, ssc._secret)
        # A registration from an executor the receiver was not scheduled on is refused.
        assert (
            client.call(
                m.RegisterReceiver(0, "CountingReceiver", "127.0.0.1", "exec-7", "127.0.0.1:1")
            )
            is False
        )
        with pytest.raises(RpcError, match="unknown stream id 9"):
            client.call(m.AddBlock(m.ReceivedBlockInfo(9, "input-9-1-1", 1, 0, "127.0.0.1:1")))
        with pytest.raises(RpcError, match="does not belong to stream 0"):
            client.call(m.AddBlock(m.ReceivedBlockInfo(0, "input-3-1-1", 1, 0, "127.0.0.1:1")))
        with pytest.raises(RpcError, match="malformed block id"):
            client.call(m.AddBlock(m.ReceivedBlockInfo(0, "../../etc/passwd", 1, 0, "127.0.0.1:1")))
        # A WAL handle is refused when the WAL is off (and confined to its directory when on).
        handle = {"path": "/etc/passwd", "offset": 0, "length": 10}
        with pytest.raises(RpcError, match="receiver WAL is not enabled"):
            client.call(
                m.AddBlock(
                    m.ReceivedBlockInfo(0, "input-0-1-9", 1, 0, "127.0.0.1:1", wal_handle=handle)
                )
            )
        with pytest.raises(RpcError, match="exceeds max_message_bytes"):
            big = {"pad": "x" * (5 * 1024 * 1024)}
            client.call(
                m.AddBlock(m.ReceivedBlockInfo(0, "input-0-1-9", 1, 0, "h:1", metadata=big))
            )
        # Strangers: a wrong secret, on the tracker and on the receiver's block server.
        receiver_endpoint = ssc.status().receiver(0).endpoint
        assert receiver_endpoint
        for where in (address, receiver_endpoint):
            stranger = EndpointClient(where, "not-the-secret")
            forged = m.StopReceiver() if where == receiver_endpoint else m.ReportError(0, "x", "")
            with pytest.raises(AuthenticationError):
                stranger.call(forged)
            with pytest.raises(AuthenticationError):
                stranger.read_table(b"input-0-1-0")
            stranger.close()
        before = ssc.status().records_received
        assert wait_until(lambda: ssc.status().records_received > before, 30)  # still receiving
        status = ssc.status().receiver(0)
        assert status.name == "CountingReceiver-0"
        assert status.executor_id is not None
    finally:
        ssc.stop(graceful=True)
    assert sum(counted) == ssc.status().records_received
    with pytest.raises(RpcError):
        client.call(m.AddBlock(m.ReceivedBlockInfo(0, "input-0-1-1", 1, 0, "127.0.0.1:1")))
    assert_nothing_of_ours_left(spark)


@pytest.mark.parametrize("parquet_spool", [True, False])
def test_local_batches_read_spooled_parquet_with_sparks_reader_unless_turned_off(
    spark, parquet_spool
):
    from spark_receivers import StreamingConfig

    records = [f"record-{i:05d}" for i in range(3_000)]
    config = StreamingConfig(batch_parquet_spool=parquet_spool)
    ssc = StreamingContext(spark, batch_interval_ms=500, config=config)
    stream = ssc.receiver_stream(SequenceReceiver(records, mode="mixed", chunk=100))
    seen: list[str] = []
    files: list[str] = []
    lock = threading.Lock()

    def collect(df, batch_time_ms):
        values = [r.value for r in df.collect()]
        with lock:
            seen.extend(values)
            files.extend(df.inputFiles())

    stream.foreach_batch(collect)
    ssc.start()
    try:
        assert wait_until(lambda: len(seen) >= len(records), 120), f"only {len(seen)} arrived"
    finally:
        ssc.stop(graceful=True)
    assert sorted(seen) == records  # each record exactly once
    if parquet_spool:  # every block came from a keeper's spool, read by Spark's reader
        assert files and all(f.endswith(".parquet") and "/block-spool-" in f for f in files)
    else:
        assert files == []
    assert_nothing_of_ours_left(spark)
