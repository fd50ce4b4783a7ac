"""ReceiverSupervisor over real RPC against a stand-in tracker (Spark's ReceiverSuite).

The tracker here is a real Flight endpoint that records what it receives and
replies as told; no Spark is involved.
"""

from __future__ import annotations

import threading
import time

import pandas as pd
import pyarrow as pa
import pytest

from spark_receivers import Receiver
from spark_receivers.config import StreamingConfig
from spark_receivers.errors import ReceiverError, StateError
from spark_receivers.receiver.supervisor import ReceiverSupervisor
from spark_receivers.rpc import messages as m
from spark_receivers.rpc.transport import EndpointClient
from spark_receivers.testing import ManualClock, StandInTracker, supervise

WAIT_S = 15


class Recording(Receiver):
    def __init__(self, fail_on_start: bool = False, **kwargs) -> None:
        super().__init__(**kwargs)
        self.starts = 0
        self.stops = 0
        self.fail_on_start = fail_on_start

    def on_start(self) -> None:
        self.starts += 1
        if self.fail_on_start:
            raise RuntimeError("cannot connect")

    def on_stop(self) -> None:
        self.stops += 1


@pytest.fixture
def tracker():
    t = StandInTracker()
    yield t
    t.close()


def eventually(predicate) -> None:
    deadline = time.monotonic() + WAIT_S
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        threading.Event().wait(0.01)


def drop_all_blocks(tracker, sup) -> None:
    """RemoveBlocks to every store holding a copy, as the driver sends after a batch."""
    for info in tracker.blocks():
        for endpoint in info.locations:
            client = EndpointClient(endpoint, tracker.secret)
            assert client.call(m.RemoveBlocks((info.block_id,))) == 1
            client.close()


def test_receiver_life_cycle_with_every_store_form(tracker):
    receiver = Recording()
    sup = supervise(tracker, receiver)
    assert not receiver.is_started()
    sup.start()
    assert receiver.is_started() and not receiver.is_stopped()
    assert receiver.starts == 1
    (reg,) = tracker.of(m.RegisterReceiver)
    assert reg.receiver_type == "Recording" and reg.endpoint == sup.endpoint

    receiver.store("one")
    receiver.store("with metadata", metadata={"k": 1})
    receiver.store(["a", "b", "c"])
    receiver.store(iter(["d", "e"]))
    receiver.store(pa.RecordBatch.from_pydict({"value": ["f", "g"]}))
    receiver.store(pa.table({"value": ["h"]}))
    receiver.store(pd.DataFrame({"value": ["i", "j"]}))
    receiver.store(["k", "l"], reliable=True)
    tracker.wait_for(lambda: tracker.records() == 14)

    # Every stored record can be read back from where the block was kept.
    values = tracker.stored_table(sup).column("value").to_pylist()
    expected = ["one", "with metadata", *"abcdefghijkl"]
    assert sorted(values) == sorted(expected)
    ids = [x.block_id for x in tracker.blocks()]
    assert len(set(ids)) == len(ids)

    receiver.report_error("bad frame", ValueError("x"))
    tracker.wait_for(lambda: len(tracker.of(m.ReportError)) == 1)
    assert tracker.of(m.ReportError)[0].message == "bad frame"
    assert "ValueError" in tracker.of(m.ReportError)[0].error

    drop_all_blocks(tracker, sup)
    receiver.stop("done")
    assert sup.await_termination(WAIT_S)
    assert receiver.is_stopped() and receiver.stops == 1
    (dereg,) = tracker.of(m.DeregisterReceiver)
    assert dereg.message == "done" and dereg.error == ""
    with pytest.raises(StateError):
        receiver.store("late")


def test_restart_is_stop_then_start_and_block_ids_stay_unique(tracker):
    receiver = Recording()
    sup = supervise(tracker, receiver)
    sup.start()
    receiver.store(["before"])
    tracker.wait_for(lambda: tracker.records() == 1)
    receiver.restart("reconnect", delay_ms=10)
    tracker.wait_for(lambda: len(tracker.of(m.RegisterReceiver)) == 2)
    eventually(lambda: receiver.starts == 2)
    assert receiver.stops == 1
    assert tracker.of(m.DeregisterReceiver)[0].message == "reconnect"
    assert receiver.is_started()
    receiver.store(["after"])
    tracker.wait_for(lambda: tracker.records() == 2)
    ids = [x.block_id for x in tracker.blocks()]
    assert len(set(ids)) == 2
    drop_all_blocks(tracker, sup)
    sup.stop("end")
    assert sup.await_termination(WAIT_S)


def test_stop_with_error_fails_the_task_visibly(tracker):
    receiver = Recording()
    sup = supervise(tracker, receiver)
    sup.start()
    receiver.stop("source broke", RuntimeError("boom"))
    with pytest.raises(ReceiverError, match="source broke") as info:
        sup.await_termination(WAIT_S)
    assert isinstance(info.value.__cause__, RuntimeError)
    assert "boom" in tracker.of(m.DeregisterReceiver)[0].error


def test_driver_refusal_stops_the_supervisor_with_its_message(tracker):
    tracker.accept_register = False
    receiver = Recording()
    sup = supervise(tracker, receiver)
    sup.start()
    assert sup.await_termination(WAIT_S)
    assert receiver.starts == 0
    assert "Driver refused to start receiver 0" in sup._stop_message


def test_exception_in_on_start_stops_with_that_error(tracker):
    receiver = Recording(fail_on_start=True)
    sup = supervise(tracker, receiver)
    sup.start()
    with pytest.raises(ReceiverError, match="Error starting receiver") as info:
        sup.await_termination(WAIT_S)
    assert "cannot connect" in str(info.value.__cause__)


def test_reliable_store_raises_when_the_driver_refuses_the_block(tracker):
    tracker.accept_blocks = False
    receiver = Recording()
    sup = supervise(tracker, receiver)
    sup.start()
    with pytest.raises(ReceiverError, match="Failed to add block"):
        receiver.store(["x"], reliable=True)
    assert len(sup.block_store) == 0  # the refused block is not kept
    sup.stop("end")
    sup.await_termination(WAIT_S)


def test_records_that_do_not_fit_the_schema_are_named():
    schema = pa.schema([("id", pa.int64()), ("name", pa.string())])
    tracker = StandInTracker()
    try:
        receiver = Recording(schema=schema)
        sup = supervise(tracker, receiver)
        sup.start()
        receiver.store({"id": 1, "name": "a"})
        receiver.store((2, "b"))
        with pytest.raises(ReceiverError, match=r"field 'id' \(int64\) cannot hold value 'three'"):
            receiver.store({"id": "three", "name": "c"})
        with pytest.raises(ReceiverError, match="must be a dict or a tuple"):
            receiver.store("a plain string")
        with pytest.raises(ReceiverError, match="columns"):
            receiver.store(pa.table({"other": [1]}))
        tracker.wait_for(lambda: tracker.records() == 2)
        block = tracker.stored_table(sup)
        assert block.schema.equals(schema)
        assert block.to_pylist() == [{"id": 1, "name": "a"}, {"id": 2, "name": "b"}]
        drop_all_blocks(tracker, sup)
        sup.stop("end")
        sup.await_termination(WAIT_S)
    finally:
        tracker.close()


def test_update_rate_limit_reaches_the_block_generator(tracker):
    receiver = Recording()
    sup = supervise(tracker, receiver, receiver_max_rate=1000)
    sup.start()
    client = EndpointClient(sup.endpoint, tracker.secret)
    client.call(m.UpdateRateLimit(250.0))
    assert sup.rate_limiter.rate == 250.0
    client.call(m.UpdateRateLimit(5000.0))
    assert sup.rate_limiter.rate == 1000.0  # never above max_rate
    sup.stop("end")
    sup.await_termination(WAIT_S)


def test_block_generator_throttling(tracker):
    receiver = Recording()
    started = time.monotonic()  # the limiter's bucket fills from the supervisor's making
    sup = supervise(tracker, receiver, receiver_max_rate=100, block_interval_ms=100)
    sup.start()
    for i in range(200):
        receiver.store(str(i))
    elapsed = time.monotonic() - started
    sup.stop("end")
    sup.await_termination(WAIT_S)
    counts = [x.num_records for x in tracker.blocks()]
    assert sum(counts) == 200
    # 200 records at 100/s: the total rate stays at the limit, and every full
    # block holds about rate * interval = 10 records.
    assert 200 / elapsed <= 100 * 1.15
    full = counts[1:-1]
    assert full and max(full) <= 10 + 3


class Fatal(BaseException):
    """Not an Exception: the generator's per-block handler lets it through."""


def test_a_dead_block_generator_stops_the_supervisor_with_its_cause(tracker):
    clock = ManualClock(0)
    cfg = StreamingConfig(block_interval_ms=50, receiver_drain_timeout_s=5.0)
    receiver = Recording()
    sup = ReceiverSupervisor(
        receiver, 0, tracker.endpoint.address, tracker.secret, cfg, "127.0.0.1", "driver", clock
    )
    death = Fatal("the block handler's process state is gone")

    def store_block(*args):
        raise death

    sup.block_handler.store_block = store_block
    sup.start()
    receiver.store("never pushed")
    clock.advance(50)  # the block is cut; pushing it kills the pushing thread
    with pytest.raises(ReceiverError, match="receiver 0 stopped") as info:
        sup.await_termination(WAIT_S)
    assert info.value.__cause__ is death
    assert receiver.is_stopped() and receiver.stops == 1
    (dereg,) = tracker.of(m.DeregisterReceiver)
    assert "BlockGenerator" in dereg.message and "Fatal" in dereg.error
    assert tracker.blocks() == []
