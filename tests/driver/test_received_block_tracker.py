"""ReceivedBlockTracker in memory and with a real WAL (Spark's ReceivedBlockTrackerSuite)."""

from __future__ import annotations

import os
import threading

import pytest

from spark_receivers.config import StreamingConfig
from spark_receivers.driver.batches.block_events import (
    BatchAllocationEvent,
    BatchCleanupEvent,
    BlockAdditionEvent,
    decode_event,
    encode_event,
)
from spark_receivers.driver.batches.received_block_tracker import (
    ReceivedBlockTracker,
    create_driver_wal,
)
from spark_receivers.errors import WriteAheadLogError
from spark_receivers.rpc.messages import ReceivedBlockInfo
from spark_receivers.util.clock import ManualClock
from spark_receivers.wal import (
    BatchedWriteAheadLog,
    FileBasedWriteAheadLog,
    RecordHandle,
    WriteAheadLog,
    deserialize_batch,
)
from spark_receivers.wal.faults import FaultInjector
from spark_receivers.wal.layout import CheckpointLayout


def block(stream: int, seq: int, records: int = 10) -> ReceivedBlockInfo:
    return ReceivedBlockInfo(stream, f"input-{stream}-1-{seq}", records, seq, "127.0.0.1:1")


def test_block_addition_and_allocation_to_batch():
    tracker = ReceivedBlockTracker([0])
    blocks = [block(0, i) for i in range(5)]
    for b in blocks:
        assert tracker.add_block(b)
    assert tracker.has_unallocated_blocks()
    assert tracker.unallocated_blocks_of_stream(0) == blocks
    assert tracker.get_blocks_of_batch(1000) == {0: []}

    tracker.allocate_blocks_to_batch(1000)
    assert tracker.get_blocks_of_batch(1000) == {0: blocks}
    assert tracker.get_blocks_of_batch_and_stream(1000, 0) == blocks
    assert not tracker.has_unallocated_blocks()
    assert tracker.last_allocated_batch_ms == 1000

    # An empty batch gets nothing.
    tracker.allocate_blocks_to_batch(2000)
    assert tracker.get_blocks_of_batch(2000) == {0: []}

    # Re-allocating an old time changes nothing.
    more = [block(0, 10 + i) for i in range(3)]
    for b in more:
        tracker.add_block(b)
    tracker.allocate_blocks_to_batch(1000)
    tracker.allocate_blocks_to_batch(500)
    assert tracker.get_blocks_of_batch(1000) == {0: blocks}
    assert tracker.unallocated_blocks_of_stream(0) == more
    tracker.allocate_blocks_to_batch(3000)
    assert tracker.get_blocks_of_batch(3000) == {0: more}


def test_blocks_of_several_streams_are_kept_apart():
    tracker = ReceivedBlockTracker([0, 1])
    a, b = block(0, 1), block(1, 1)
    tracker.add_block(a)
    tracker.add_block(b)
    tracker.allocate_blocks_to_batch(1000)
    assert tracker.get_blocks_of_batch(1000) == {0: [a], 1: [b]}


def test_block_of_unknown_stream_is_refused():
    tracker = ReceivedBlockTracker([0])
    assert not tracker.add_block(block(7, 1))
    assert not tracker.has_unallocated_blocks()


def test_cleanup_forgets_old_batches():
    tracker = ReceivedBlockTracker([0])
    for t in (1000, 2000, 3000):
        tracker.add_block(block(0, t))
        tracker.allocate_blocks_to_batch(t)
    tracker.cleanup_old_batches(2500)
    assert tracker.allocated_batch_times() == [3000]
    assert tracker.get_blocks_of_batch(1000) == {0: []}


# --- with a real write-ahead log (Spark's ReceivedBlockTrackerSuite, WAL part) -------

ROLLING_S = 1


def wal_config(**overrides) -> StreamingConfig:
    values = {"driver_wal_rolling_interval_s": ROLLING_S, "driver_wal_fsync": False}
    values.update(overrides)
    return StreamingConfig(**values)


@pytest.fixture(params=[True, False], ids=["batched", "file"])
def batching(request) -> bool:
    return request.param


def open_tracker(ckpt, clock, batching, recover=False, streams=(0,), **cfg) -> ReceivedBlockTracker:
    wal = create_driver_wal(str(ckpt), wal_config(driver_wal_allow_batching=batching, **cfg), clock)
    return ReceivedBlockTracker(list(streams), wal, clock, recover=recover)


def logged_events(ckpt) -> list:
    log = FileBasedWriteAheadLog(CheckpointLayout(str(ckpt)).driver_wal_dir)
    events = []
    for record in log.read_all():
        if record.startswith(b"SRB1"):
            events.extend(decode_event(r) for r in deserialize_batch(record))
        else:
            events.append(decode_event(record))
    return events


def segments(ckpt) -> list[str]:
    d = CheckpointLayout(str(ckpt)).driver_wal_dir
    return sorted(n for n in os.listdir(d) if n.startswith("log-")) if os.path.isdir(d) else []


def test_driver_wal_is_batched_over_file_log_when_allowed(tmp_path):
    batched = create_driver_wal(str(tmp_path), wal_config())
    plain = create_driver_wal(str(tmp_path), wal_config(driver_wal_allow_batching=False))
    try:
        assert isinstance(batched, BatchedWriteAheadLog)
        assert isinstance(batched.wrapped, FileBasedWriteAheadLog)
        assert isinstance(plain, FileBasedWriteAheadLog)
        assert not os.path.exists(
            CheckpointLayout(str(tmp_path)).driver_wal_dir
        )  # nothing before a write
    finally:
        batched.close()
        plain.close()


def test_no_wal_without_a_checkpoint_dir():
    tracker = ReceivedBlockTracker([0])
    assert not tracker.is_write_ahead_log_enabled
    assert tracker.add_block(block(0, 1))


def test_recovery_and_cleanup_with_a_rolling_wal(tmp_path, batching):
    clock = ManualClock(1_000_000)
    tracker = open_tracker(tmp_path, clock, batching)
    batch1 = [block(0, i) for i in range(5)]
    for b in batch1:
        assert tracker.add_block(b)
    assert logged_events(tmp_path) == [BlockAdditionEvent(b) for b in batch1]

    # Restart without recovery: nothing; with recovery: the same unallocated blocks.
    tracker.stop()
    fresh = open_tracker(tmp_path, clock, batching)
    assert fresh.unallocated_blocks_of_stream(0) == []
    fresh.stop()
    tracker = open_tracker(tmp_path, clock, batching, recover=True)
    assert tracker.unallocated_blocks_of_stream(0) == [b.without_store() for b in batch1]
    assert all(b.store_endpoint is None for b in tracker.unallocated_blocks_of_stream(0))

    # Allocate, restart, recover: the same allocation; re-allocating the time is a no-op.
    clock.advance(1000)
    t1 = clock.get_time_ms()
    tracker.allocate_blocks_to_batch(t1)
    batch2 = [block(0, 10 + i) for i in range(3)]
    clock.advance(1000)
    for b in batch2:
        assert tracker.add_block(b)
    tracker.stop()
    tracker = open_tracker(tmp_path, clock, batching, recover=True)
    expected1 = [b.without_store() for b in batch1]
    assert tracker.get_blocks_of_batch(t1) == {0: expected1}
    assert tracker.unallocated_blocks_of_stream(0) == [b.without_store() for b in batch2]
    assert tracker.last_allocated_batch_ms == t1
    tracker.allocate_blocks_to_batch(t1)
    assert tracker.get_blocks_of_batch(t1) == {0: expected1}
    assert tracker.unallocated_blocks_of_stream(0) == [b.without_store() for b in batch2]

    clock.advance(1000)
    t2 = clock.get_time_ms()
    tracker.allocate_blocks_to_batch(t2)
    assert tracker.get_blocks_of_batch(t2) == {0: [b.without_store() for b in batch2]}

    # Cleanup: an event, old batches forgotten, old segment files deleted.
    clock.advance(5000)
    before = segments(tmp_path)
    assert len(before) >= 3
    tracker.cleanup_old_batches(t2, wait_for_completion=True)
    assert tracker.allocated_batch_times() == [t2]
    after = segments(tmp_path)
    assert len(after) < len(before)
    assert BatchCleanupEvent((t1,)) in logged_events(tmp_path)
    tracker.stop()

    tracker = open_tracker(tmp_path, clock, batching, recover=True)
    assert tracker.allocated_batch_times() == [t2]
    assert tracker.get_blocks_of_batch(t2) == {0: [b.without_store() for b in batch2]}
    assert not tracker.has_unallocated_blocks()
    tracker.stop()


def test_many_blocks_make_one_addition_event_each_and_one_allocation_event(tmp_path):
    clock = ManualClock(1_000)
    # Spark's SPARK-26734 scenario: one allocation event holding 100,000 blocks.
    # (Concurrent, batched adds are covered by the concurrency test below.)
    tracker = open_tracker(tmp_path, clock, False)
    blocks = [block(0, i) for i in range(100_000)]
    assert all(tracker.add_block(b) for b in blocks)
    tracker.allocate_blocks_to_batch(2_000)
    tracker.stop()
    events = logged_events(tmp_path)
    additions = [e for e in events if isinstance(e, BlockAdditionEvent)]
    allocations = [e for e in events if isinstance(e, BatchAllocationEvent)]
    assert len(additions) == 100_000
    assert len(allocations) == 1
    assert len(events) == 100_001
    assert len(allocations[0].blocks[0]) == 100_000
    assert {b.block_id for b in allocations[0].blocks[0]} == {b.block_id for b in blocks}
    recovered = open_tracker(tmp_path, clock, False, recover=True)
    assert len(recovered.get_blocks_of_batch(2_000)[0]) == 100_000
    assert not recovered.has_unallocated_blocks()
    recovered.stop()


def test_recovery_removes_only_allocated_blocks_from_the_queue(tmp_path, batching):
    clock = ManualClock(10_000)
    tracker = open_tracker(tmp_path, clock, batching, streams=(0, 1))
    first = [block(0, 1), block(1, 1), block(0, 2)]
    for b in first:
        tracker.add_block(b)
    tracker.allocate_blocks_to_batch(11_000)
    later = [block(0, 3), block(1, 2)]
    for b in later:
        tracker.add_block(b)
    tracker.stop()
    recovered = open_tracker(tmp_path, clock, batching, recover=True, streams=(0, 1))
    assert recovered.get_blocks_of_batch(11_000) == {
        0: [first[0].without_store(), first[2].without_store()],
        1: [first[1].without_store()],
    }
    assert recovered.unallocated_blocks_of_stream(0) == [later[0].without_store()]
    assert recovered.unallocated_blocks_of_stream(1) == [later[1].without_store()]
    recovered.stop()


class FlakyLog(WriteAheadLog):
    """Forwards to a real log; ``fail_next`` makes writes raise, before or after writing."""

    def __init__(self, inner: WriteAheadLog) -> None:
        self.inner = inner
        self.fail_next = 0
        self.fail_after_write = False

    def write(self, data: bytes, time_ms: int) -> RecordHandle:
        if self.fail_next:
            self.fail_next -= 1
            if self.fail_after_write:
                self.inner.write(data, time_ms)  # on disk, yet reported failed
            raise WriteAheadLogError("injected write failure")
        return self.inner.write(data, time_ms)

    def read(self, handle: RecordHandle) -> bytes:
        return self.inner.read(handle)

    def read_all(self):
        return self.inner.read_all()

    def clean(self, threshold_time_ms: int, wait: bool) -> None:
        self.inner.clean(threshold_time_ms, wait)

    def close(self) -> None:
        self.inner.close()


@pytest.mark.parametrize("persisted", [False, True], ids=["not-written", "written-then-failed"])
def test_failed_allocation_write_keeps_blocks_unallocated_and_the_retry_works(tmp_path, persisted):
    clock = ManualClock(1_000)
    log = FlakyLog(create_driver_wal(str(tmp_path), wal_config(), clock))
    tracker = ReceivedBlockTracker([0], log, clock)
    blocks = [block(0, i) for i in range(4)]
    for b in blocks:
        assert tracker.add_block(b)
    log.fail_next, log.fail_after_write = 1, persisted
    tracker.allocate_blocks_to_batch(2_000)
    assert tracker.get_blocks_of_batch(2_000) == {0: []}
    assert tracker.unallocated_blocks_of_stream(0) == blocks
    assert tracker.last_allocated_batch_ms == -1
    tracker.allocate_blocks_to_batch(3_000)
    assert tracker.get_blocks_of_batch(3_000) == {0: blocks}
    assert not tracker.has_unallocated_blocks()
    tracker.stop()

    # Replay agrees with what happened live, even when the failed write reached disk.
    recovered = ReceivedBlockTracker(
        [0], create_driver_wal(str(tmp_path), wal_config(), clock), clock, recover=True
    )
    assert recovered.get_blocks_of_batch(3_000) == {0: [b.without_store() for b in blocks]}
    assert recovered.get_blocks_of_batch(2_000) == {0: []}
    assert not recovered.has_unallocated_blocks()
    recovered.stop()


def test_failed_addition_write_refuses_the_block(tmp_path):
    clock = ManualClock(1_000)
    log = FlakyLog(create_driver_wal(str(tmp_path), wal_config(), clock))
    tracker = ReceivedBlockTracker([0], log, clock)
    log.fail_next = 1
    assert not tracker.add_block(block(0, 1))
    assert not tracker.has_unallocated_blocks()
    assert tracker.add_block(block(0, 2))
    tracker.stop()


def test_a_call_of_blocks_keeps_the_good_ones_in_order_and_refuses_each_bad_one(tmp_path):
    clock = ManualClock(1_000)
    log = FlakyLog(create_driver_wal(str(tmp_path), wal_config(), clock))
    tracker = ReceivedBlockTracker([0, 1], log, clock)
    a, b, c, d = block(0, 1), block(1, 1), block(0, 2), block(7, 1)
    log.fail_next = 1  # the first addition's write fails
    assert tracker.add_blocks([a, b, c, d]) == [False, True, True, False]  # d: unknown stream
    assert tracker.unallocated_blocks_of_stream(0) == [c]
    assert tracker.unallocated_blocks_of_stream(1) == [b]
    tracker.allocate_blocks_to_batch(2_000)
    tracker.stop()
    # What the WAL holds agrees: the refused blocks were never logged as added.
    recovered = ReceivedBlockTracker(
        [0, 1], create_driver_wal(str(tmp_path), wal_config(), clock), clock, recover=True
    )
    assert recovered.get_blocks_of_batch(2_000) == {0: [c.without_store()], 1: [b.without_store()]}
    recovered.stop()


def test_replayed_duplicate_additions_do_not_duplicate_a_block(tmp_path):
    clock = ManualClock(1_000)
    log = create_driver_wal(str(tmp_path), wal_config(driver_wal_allow_batching=False), clock)
    a, b = block(0, 1), block(0, 2)
    for event in (BlockAdditionEvent(a), BlockAdditionEvent(a), BlockAdditionEvent(b)):
        log.write(encode_event(event), clock.get_time_ms())
    log.write(encode_event(BatchAllocationEvent(2_000, {0: (a,)})), 2_000)
    log.write(encode_event(BlockAdditionEvent(a)), 2_001)  # a duplicate after allocation
    log.close()
    tracker = open_tracker(tmp_path, clock, False, recover=True)
    assert tracker.get_blocks_of_batch(2_000) == {0: [a.without_store()]}
    assert tracker.unallocated_blocks_of_stream(0) == [b.without_store()]
    assert tracker.recovered_events == 5
    tracker.stop()


def test_file_deletion_errors_during_cleanup_do_not_change_the_recovered_state(tmp_path):
    clock = ManualClock(1_000_000)
    faults = FaultInjector()
    config = wal_config(driver_wal_allow_batching=False)

    def open_log() -> FileBasedWriteAheadLog:
        return FileBasedWriteAheadLog(
            CheckpointLayout(str(tmp_path)).driver_wal_dir,
            filesystem=faults.filesystem(),
            rolling_interval_s=config.driver_wal_rolling_interval_s,
            fsync=False,
        )

    tracker = ReceivedBlockTracker([0], open_log(), clock)
    times = []
    for i in range(5):
        tracker.add_block(block(0, i))
        clock.advance(1000)
        tracker.allocate_blocks_to_batch(clock.get_time_ms())
        times.append(clock.get_time_ms())
        clock.advance(1000)
    faults.fail_next("delete", 100)
    tracker.cleanup_old_batches(times[3], wait_for_completion=True)
    assert faults.raised["delete"] > 0
    assert tracker.allocated_batch_times() == times[3:]
    tracker.stop()
    faults.clear()
    recovered = ReceivedBlockTracker([0], open_log(), clock, recover=True)
    assert recovered.allocated_batch_times() == times[3:]
    assert recovered.get_blocks_of_batch(times[4]) == {0: [block(0, 4).without_store()]}
    assert not recovered.has_unallocated_blocks()
    recovered.stop()


def test_concurrent_adds_and_allocations_lose_nothing_on_replay(tmp_path):
    clock = ManualClock(1_000)
    tracker = open_tracker(tmp_path, clock, True)
    stop = threading.Event()
    added: list[ReceivedBlockInfo] = []

    def add(worker: int) -> None:
        for i in range(300):
            b = block(0, worker * 1000 + i)
            assert tracker.add_block(b)
            added.append(b)

    threads = [threading.Thread(target=add, args=(w,)) for w in range(4)]
    for t in threads:
        t.start()
    batch = 1_000
    while any(t.is_alive() for t in threads):
        batch += 100
        tracker.allocate_blocks_to_batch(batch)
    for t in threads:
        t.join()
    stop.set()
    tracker.allocate_blocks_to_batch(batch + 100)
    live = {t: tracker.get_blocks_of_batch(t)[0] for t in tracker.allocated_batch_times()}
    tracker.stop()
    recovered = open_tracker(tmp_path, clock, True, recover=True)
    replayed = {t: recovered.get_blocks_of_batch(t)[0] for t in recovered.allocated_batch_times()}
    assert replayed == {t: [b.without_store() for b in bs] for t, bs in live.items()}
    ids = [b.block_id for bs in replayed.values() for b in bs]
    assert sorted(ids) == sorted(b.block_id for b in added)
    recovered.stop()


def positioned(stream: int, session: int, seq: int, position: str) -> ReceivedBlockInfo:
    return ReceivedBlockInfo(
        stream, f"input-{stream}-{session}-{seq}", 1, seq, "127.0.0.1:1", position=position
    )


def test_accepted_position_is_the_newest_blocks_and_survives_cleanup_and_recovery(tmp_path):
    clock = ManualClock(1_000)
    tracker = open_tracker(tmp_path, clock, False, streams=(0, 1))
    assert tracker.accepted_position(0) is None
    assert tracker.add_block(positioned(0, 5, 0, "1-1"))
    assert tracker.add_block(block(0, 1))  # no position: keeps the last one
    assert tracker.add_block(positioned(0, 5, 2, "1-9"))
    assert tracker.add_block(positioned(1, 5, 0, "offset:10"))
    assert (tracker.accepted_position(0), tracker.accepted_position(1)) == ("1-9", "offset:10")
    clock.advance(1_000)
    tracker.allocate_blocks_to_batch(clock.get_time_ms())
    # The batch completes later; cleanup deletes every WAL segment holding the additions.
    clock.advance(100_000)
    tracker.cleanup_old_batches(clock.get_time_ms(), wait_for_completion=True)
    tracker.stop()
    assert not [e for e in logged_events(tmp_path) if isinstance(e, BlockAdditionEvent)]

    recovered = open_tracker(tmp_path, clock, False, recover=True, streams=(0, 1))
    assert recovered.get_blocks_of_batch(2_000) == {0: [], 1: []}  # the cleanup happened
    assert recovered.accepted_position(0) == "1-9"
    assert recovered.accepted_position(1) == "offset:10"
    # A restarted receiver (a later session) moves it on; a replay keeps the newest block's.
    assert recovered.add_block(positioned(0, 9, 0, "2-0"))
    recovered.stop()
    again = open_tracker(tmp_path, clock, False, recover=True, streams=(0, 1))
    assert again.accepted_position(0) == "2-0"
    again.stop()


def test_a_cleanup_event_written_after_a_newer_addition_does_not_move_the_position_back(tmp_path):
    clock = ManualClock(1_000)
    wal = create_driver_wal(str(tmp_path), wal_config(), clock)
    wal.write(encode_event(BlockAdditionEvent(positioned(0, 5, 3, "new"))), 1_000)
    wal.write(encode_event(BatchCleanupEvent((), {0: ("input-0-5-2", "old")})), 1_001)
    wal.close()
    wal = create_driver_wal(str(tmp_path), wal_config(), clock)
    recovered = ReceivedBlockTracker([0], wal, clock, recover=True)
    assert recovered.accepted_position(0) == "new"
    recovered.stop()


def test_cleanup_events_round_trip_their_positions():
    event = BatchCleanupEvent((1_000,), {0: ("input-0-5-2", "1-9"), 3: ("input-3-1-0", "x")})
    assert decode_event(encode_event(event)) == event
    assert decode_event(encode_event(BatchCleanupEvent((1_000,)))) == BatchCleanupEvent((1_000,))


def test_a_cleanup_without_batches_still_logs_the_positions_before_cleaning_the_wal(tmp_path):
    clock = ManualClock(1_000)
    tracker = open_tracker(tmp_path, clock, False)
    assert tracker.add_block(positioned(0, 5, 0, "p"))
    tracker.allocate_blocks_to_batch(2_000)
    tracker.cleanup_old_batches(3_000)  # forgets batch 2000
    clock.advance(100_000)
    tracker.cleanup_old_batches(clock.get_time_ms(), wait_for_completion=True)  # no batch
    tracker.stop()
    events = logged_events(tmp_path)
    assert not [e for e in events if isinstance(e, BlockAdditionEvent)]
    recovered = open_tracker(tmp_path, clock, False, recover=True)
    assert recovered.accepted_position(0) == "p"
    recovered.stop()
