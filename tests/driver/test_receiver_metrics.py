"""The driver's side of receiver metrics: reports validated, sessions added up, rates measured."""

from __future__ import annotations

import dataclasses

import pytest

from spark_receivers.driver.observe.receiver_metrics import MAX_SESSIONS, ReceiverMetricsTracker
from spark_receivers.errors import AuthenticationError, RpcError
from spark_receivers.rpc import codec
from spark_receivers.rpc import messages as m
from spark_receivers.rpc.auth import new_secret
from spark_receivers.rpc.transport import EndpointClient, FlightEndpoint
from spark_receivers.testing import ManualClock
from spark_receivers.util.histogram import LATENCY_BUCKETS_S

N = len(LATENCY_BUCKETS_S) + 1


def report(
    stream_id: int = 0, session: int = 1000, records: int = 0, **changes
) -> m.ReportReceiverMetrics:
    empty = m.LatencyCounts((0,) * N, 0.0)
    base = m.ReportReceiverMetrics(
        stream_id=stream_id,
        session=session,
        executor_id="driver",
        records=records,
        bytes=records * 10,
        blocks=records // 100,
        blocks_refused=0,
        records_refused=0,
        rate_limit=None,
        max_rate=None,
        throttled_s=0.0,
        bad_records=0,
        bad_record_policy="skip",
        store_memory_bytes=0,
        store_disk_bytes=0,
        store_blocks=0,
        add_block_latency=empty,
        wal_write_latency=empty,
    )
    return dataclasses.replace(base, **changes)


def test_totals_add_up_across_sessions_and_gauges_come_from_the_newest():
    clock = ManualClock(0)
    t = ReceiverMetricsTracker([0, 1], clock)
    t.handle(report(session=1000, records=500, store_memory_bytes=7, rate_limit=100.0))
    t.handle(report(session=2000, records=300, store_memory_bytes=3, rate_limit=50.0))
    # the old task's last report arrives after the new task's first: nothing goes back
    t.handle(report(session=1000, records=600, store_memory_bytes=9, rate_limit=100.0))
    info = t.snapshot()[0]
    assert (info.records, info.bytes, info.reports) == (900, 9000, 3)
    assert (info.store_memory_bytes, info.rate_limit) == (3, 50.0)
    assert not t.snapshot()[1]  # never reported: falsy, zeros
    # a late, older report of a session does not replace a newer one
    t.handle(report(session=2000, records=100))
    assert t.snapshot()[0].records == 900


def test_input_rate_is_measured_on_the_driver_clock_between_reports():
    clock = ManualClock(10_000)
    t = ReceiverMetricsTracker([0], clock)
    t.handle(report(records=1_000))
    assert t.snapshot()[0].input_rate == 0.0
    clock.advance(2_000)
    t.handle(report(records=5_000))
    assert t.snapshot()[0].input_rate == pytest.approx(2_000.0)
    clock.advance(1_000)
    t.handle(report(session=9_000, records=10))  # a restart: no rate across sessions
    assert t.snapshot()[0].input_rate == 0.0


def test_latency_histograms_add_up():
    t = ReceiverMetricsTracker([0], ManualClock(0))
    one = tuple(1 if i == 3 else 0 for i in range(N))
    t.handle(report(session=1, add_block_latency=m.LatencyCounts(one, 0.008)))
    t.handle(report(session=2, add_block_latency=m.LatencyCounts(one, 0.006)))
    info = t.snapshot()[0]
    assert info.add_block_counts[3] == 2
    assert info.add_block_mean_ms == pytest.approx(7.0)
    assert info.wal_write_mean_ms is None


def test_old_sessions_are_folded_without_losing_counts():
    t = ReceiverMetricsTracker([0], ManualClock(0))
    for session in range(MAX_SESSIONS + 5):
        t.handle(report(session=session, records=10, bad_records=1))
    info = t.snapshot()[0]
    assert info.records == 10 * (MAX_SESSIONS + 5)
    assert info.bad_records == MAX_SESSIONS + 5


@pytest.mark.parametrize(
    ("changes", "error"),
    [
        ({"stream_id": 7}, "unknown stream id 7"),
        ({"records": -1}, "negative"),
        ({"throttled_s": -0.5}, "negative"),
        ({"add_block_latency": m.LatencyCounts((1, 2), 0.0)}, "bucket counts"),
        ({"bad_record_policy": "shrug"}, "unknown bad record policy"),
    ],
)
def test_reports_a_receiver_could_not_send_are_refused(changes, error):
    t = ReceiverMetricsTracker([0], ManualClock(0))
    with pytest.raises(RpcError, match=error):
        t.handle(report(**changes))
    assert not t.snapshot()[0]


def test_reports_cross_the_wire_validated_and_authenticated():
    t = ReceiverMetricsTracker([0], ManualClock(0))
    secret = new_secret()
    endpoint = FlightEndpoint("tracker", "127.0.0.1", secret, m.TRACKER_MESSAGES, t.handle)
    client = EndpointClient(endpoint.address, secret)
    stranger = EndpointClient(endpoint.address, new_secret())
    try:
        client.call(report(records=42))
        assert t.snapshot()[0].records == 42
        with pytest.raises(AuthenticationError):
            stranger.call(report(records=99))
        with pytest.raises(RpcError, match="negative"):
            client.call(report(records=-3))
        body = codec.encode(report()).replace(b'"records":0,', b"")
        with pytest.raises(RpcError, match="missing field 'records'"):
            codec.decode("ReportReceiverMetrics", body, m.TRACKER_MESSAGES, 1 << 20)
        assert t.snapshot()[0].records == 42
    finally:
        client.close()
        stranger.close()
        endpoint.close()
