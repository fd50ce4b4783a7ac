"""The driver's block keeper registry, replication reports, lost blocks and the keeper starter."""

from __future__ import annotations

import threading

import pytest

from spark_receivers.driver.batches.received_block_tracker import ReceivedBlockTracker
from spark_receivers.driver.observe.listener import ListenerBus, StreamingListener
from spark_receivers.driver.tracking.block_keepers import BlockKeepers, KeeperStarter
from spark_receivers.driver.tracking.receiver_tracker import ReceiverTracker
from spark_receivers.driver.tracking.scheduling_policy import ExecutorCacheTaskLocation
from spark_receivers.errors import RpcError
from spark_receivers.rpc import messages as m
from spark_receivers.util.clock import ManualClock

A = ExecutorCacheTaskLocation("h1", "1")
B = ExecutorCacheTaskLocation("h2", "2")
C = ExecutorCacheTaskLocation("h3", "3")


class RecordingOutbox:
    def __init__(self) -> None:
        self.sent: list[tuple[str, object]] = []

    def send(self, endpoint, message) -> None:
        self.sent.append((endpoint, message))


class Events(StreamingListener):
    def __init__(self) -> None:
        self.events: list[tuple[str, object]] = []
        self.cond = threading.Condition()

    def _add(self, kind, info) -> None:
        with self.cond:
            self.events.append((kind, info))
            self.cond.notify_all()

    def on_replication_changed(self, info) -> None:
        self._add("replication", info)

    def on_block_lost(self, info) -> None:
        self._add("lost", info)

    def wait(self, n: int) -> list[tuple[str, object]]:
        with self.cond:
            assert self.cond.wait_for(lambda: len(self.events) >= n, 10)
            return list(self.events)


@pytest.fixture
def world():
    bus = ListenerBus()
    events = Events()
    bus.add(events)
    bus.start()
    alive = [A, B, C]
    clock = ManualClock(0)
    outbox = RecordingOutbox()
    keepers = BlockKeepers(bus, outbox, lambda: list(alive), lambda block: 4000, clock)
    yield keepers, alive, clock, outbox, events
    bus.stop()


def test_targets_are_keepers_on_live_other_executors_rotated_by_stream(world):
    keepers, alive, clock, _, _ = world
    for executor in (A, B, C):
        assert keepers.handle(
            m.RegisterBlockKeeper(executor.executor_id, executor.host, f"{executor.host}:7")
        )
    assert keepers.handle(m.GetReplicaTargets(0, "1")) == ["h2:7", "h3:7"]
    assert keepers.handle(m.GetReplicaTargets(1, "1")) == ["h3:7", "h2:7"]
    alive.remove(C)  # its executor died: not a target any more, once the cache is stale
    assert keepers.targets(0, "1") == ["h2:7", "h3:7"]
    clock.advance(2_000)
    assert keepers.targets(0, "1") == ["h2:7"]
    assert keepers.targets(0, "2") == ["h1:7"]
    assert keepers.missing([A, B, ExecutorCacheTaskLocation("h4", "4")]) == [
        ExecutorCacheTaskLocation("h4", "4")
    ]


def test_replication_reports_reach_listeners_and_the_status(world):
    keepers, _, _, _, events = world
    keepers.handle(m.ReportReplication(0, 2, 1, "kept on 1 executor(s) instead of 2"))
    keepers.handle(m.ReportReplication(0, 2, 2, "replicated again"))
    (_, degraded), (_, restored) = events.wait(2)
    assert degraded.degraded and degraded.achieved == 1 and "instead of 2" in degraded.message
    assert not restored.degraded
    assert keepers.copies() == {0: (2, 2)}


def test_a_lost_block_is_reported_once_with_its_batch(world):
    keepers, _, _, _, events = world
    for _ in range(2):  # a second action reads the batch again
        keepers.handle(m.ReportLostBlock(0, "input-0-1-3", 25, "lost block ... in no store"))
    ((kind, info),) = events.wait(1)
    assert kind == "lost" and info.batch_time_ms == 4000 and info.num_records == 25
    assert keepers.lost() == (1, 25)


def test_release_ends_every_keeper_and_refuses_newcomers(world):
    keepers, _, _, outbox, _ = world
    keepers.register("1", "h1:7")
    keepers.register("2", "h2:7")
    keepers.release()
    assert sorted(e for e, x in outbox.sent if isinstance(x, m.ReleaseKeeper)) == ["h1:7", "h2:7"]
    assert keepers.register("3", "h3:7") is False
    with pytest.raises(RpcError, match="unexpected message"):
        keepers.handle(m.StreamOffsets(0))


def test_removing_a_batch_tells_every_copy(world):
    outbox = RecordingOutbox()
    tracker = ReceiverTracker([], ReceivedBlockTracker([0]), ListenerBus(), None, outbox)  # type: ignore[arg-type]
    blocks = [
        m.ReceivedBlockInfo(0, "input-0-1-0", 1, 0, "h1:7", replica_endpoints=("h2:7",)),
        m.ReceivedBlockInfo(0, "input-0-1-1", 1, 0, "h1:7", replica_endpoints=("h3:7",)),
    ]
    tracker.remove_blocks(blocks)
    sent = {e: x.block_ids for e, x in outbox.sent}
    assert sent == {
        "h1:7": ("input-0-1-0", "input-0-1-1"),
        "h2:7": ("input-0-1-0",),
        "h3:7": ("input-0-1-1",),
    }


def test_the_starter_starts_keepers_where_they_are_missing_and_keeps_going(world):
    keepers, alive, _, _, _ = world
    keepers.register("1", "h1:7")
    started: list[list[str]] = []
    done = threading.Event()

    def start(missing):
        started.append([e.executor_id for e in missing])
        if len(started) == 1:
            raise RuntimeError("the job failed")  # logged, tried again next round
        for e in missing:
            keepers.register(e.executor_id, f"{e.host}:7")
        done.set()

    starter = KeeperStarter(keepers, lambda: list(alive), start, interval_s=0.01)
    starter.start()
    assert started == [["2", "3"]]  # the first round ran before start() returned
    assert done.wait(10)
    starter.stop()
    assert started[:2] == [["2", "3"], ["2", "3"]]
    assert len(started) == 2  # nothing missing any more
