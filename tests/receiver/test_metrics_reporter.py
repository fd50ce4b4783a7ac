"""A receiver task's metrics, reported over real RPC to a stand-in tracker (no Spark)."""

from __future__ import annotations

import threading

import pytest

from spark_receivers import Receiver
from spark_receivers.receiver.metrics import MetricsReporter
from spark_receivers.receiver.rate_limiter import RateLimiter
from spark_receivers.rpc import messages as m
from spark_receivers.rpc.transport import EndpointClient
from spark_receivers.testing import ManualClock, StandInTracker, supervise

WAIT_S = 15


class Idle(Receiver):
    def on_start(self) -> None:
        pass

    def on_stop(self) -> None:
        pass


@pytest.fixture
def tracker():
    t = StandInTracker()
    yield t
    t.close()


def last_report(tracker: StandInTracker) -> m.ReportReceiverMetrics:
    return tracker.of(m.ReportReceiverMetrics)[-1]


def stop(tracker: StandInTracker, sup) -> None:
    # Blocks are in the block keeper: the stopped supervisor has none to serve.
    sup.stop("done")
    assert sup.await_termination(WAIT_S)


def test_the_final_report_counts_what_the_driver_accepted(tracker):
    receiver = Idle()
    sup = supervise(tracker, receiver, metrics_report_interval_ms=100)
    sup.start()
    for i in range(5):
        receiver.store([f"r{i}-{j}" for j in range(100)], metadata={"offset": i}, reliable=True)
    receiver.store(["loose"] * 7)
    tracker.wait_for(lambda: tracker.records() == 507)
    tracker.wait_for(lambda: len(tracker.of(m.ReportReceiverMetrics)) >= 1)  # periodic
    stop(tracker, sup)
    adds = tracker.blocks()  # AddBlock or AddBlocks, one latency sample per call
    calls = len(tracker.of(m.AddBlock)) + len(tracker.of(m.AddBlocks))
    r = last_report(tracker)
    assert (r.records, r.blocks, r.bytes) == (507, len(adds), sum(b.size_bytes for b in adds))
    assert (r.blocks_refused, r.records_refused) == (0, 0)
    assert sum(r.add_block_latency.counts) == calls
    assert r.add_block_latency.sum_s > 0
    assert sum(r.wal_write_latency.counts) == 0  # no receiver WAL
    session = m.StreamBlockId.parse(adds[0].block_id).session
    assert r.session == session and r.executor_id == "driver" and r.stream_id == 0
    assert r.rate_limit is None and r.bad_record_policy == "skip"


def test_blocks_the_driver_refuses_are_counted_as_refused(tracker):
    receiver = Idle()
    sup = supervise(tracker, receiver)
    sup.start()
    tracker.accept_blocks = False
    with pytest.raises(Exception, match="Failed to add block"):
        receiver.store(["a", "b", "c"], reliable=True)
    tracker.accept_blocks = True
    receiver.store(["d"], reliable=True)
    stop(tracker, sup)
    r = last_report(tracker)
    assert (r.records, r.blocks, r.blocks_refused, r.records_refused) == (1, 1, 1, 3)


def test_wal_writes_are_timed(tracker, tmp_path):
    receiver = Idle()
    sup = supervise(tracker, receiver, receiver_wal_enabled=True, checkpoint_dir=str(tmp_path))
    sup.start()
    for i in range(3):
        receiver.store([f"x{i}"] * 10, reliable=True)
    stop(tracker, sup)
    r = last_report(tracker)
    assert sum(r.wal_write_latency.counts) == 3
    assert r.wal_write_latency.sum_s > 0


def test_bad_records_and_block_store_bytes_are_reported(tracker):
    receiver = Idle(bad_record_policy="skip")
    sup = supervise(tracker, receiver)
    sup.start()
    receiver.handle_bad_record(b"\xff\xfe", "not UTF-8")
    receiver.store(["kept"] * 50, reliable=True)
    tracker.wait_for(lambda: tracker.records() == 50)
    reporter_report = sup._metrics_report()  # what the next report says, now
    assert reporter_report.bad_records == 1
    assert reporter_report.store_blocks == 1 and reporter_report.store_memory_bytes > 0
    stop(tracker, sup)


def test_disabled_metrics_send_no_report(tracker):
    receiver = Idle()
    sup = supervise(tracker, receiver, metrics_enabled=False)
    sup.start()
    receiver.store(["a"], reliable=True)
    stop(tracker, sup)
    assert tracker.of(m.ReportReceiverMetrics) == []


def test_the_reporter_sends_on_the_clock_and_a_last_report_on_stop(tracker):
    clock = ManualClock(0)
    client = EndpointClient(tracker.endpoint.address, tracker.secret)
    made = []

    def make() -> m.ReportReceiverMetrics:
        made.append(clock.get_time_ms())
        empty = m.LatencyCounts((0,) * 14, 0.0)
        return m.ReportReceiverMetrics(
            0, 1, "driver", len(made), 0, 0, 0, 0, None, None, 0.0, 0, "skip", 0, 0, 0,
            empty, empty,
        )  # fmt: skip

    reporter = MetricsReporter(make, client.call, 1000, clock)
    reporter.start()
    clock.wait_for_waiters(1)
    assert made == []
    clock.advance(1000)
    tracker.wait_for(lambda: len(tracker.of(m.ReportReceiverMetrics)) == 1)
    clock.wait_for_waiters(1)
    clock.advance(1000)
    tracker.wait_for(lambda: len(tracker.of(m.ReportReceiverMetrics)) == 2)
    reporter.stop()
    assert [r.records for r in tracker.of(m.ReportReceiverMetrics)] == [1, 2, 3]
    assert made == [1000, 2000, 2000]
    assert reporter.sent == 3
    client.close()


def test_throttled_time_is_the_time_acquire_waited():
    clock = ManualClock(0)
    limiter = RateLimiter(max_rate=10, clock=clock)
    done = threading.Event()

    def take() -> None:
        limiter.acquire(10)  # a full bucket: one second of tokens
        done.set()

    threading.Thread(target=take, daemon=True).start()
    clock.wait_for_waiters(1)
    assert limiter.waited_s == 0.0
    clock.advance(1000)
    assert done.wait(WAIT_S)
    assert limiter.waited_s == pytest.approx(1.0)
