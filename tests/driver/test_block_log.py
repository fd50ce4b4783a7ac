"""The block logs of Structured Streaming streams in the ReceivedBlockTracker (issue 10)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_received_block_tracker import FlakyLog, block, logged_events, segments, wal_config

from spark_receivers.driver.batches.block_events import decode_event, encode_event
from spark_receivers.driver.batches.received_block_tracker import (
    ReceivedBlockTracker,
    create_driver_wal,
)
from spark_receivers.driver.structured import OffsetCommitEvent, OffsetRangeEvent
from spark_receivers.errors import OffsetError
from spark_receivers.util.clock import ManualClock


def ranges(tracker, stream, start, end) -> list[tuple[str, int, int]]:
    return [
        (b.block_id, first, rows)
        for b, first, rows in tracker.logs.offset_range(stream, start, end)
    ]


def test_offset_events_round_trip():
    b = block(1, 3)
    for event in (OffsetRangeEvent(1, 40, (b, b), 123), OffsetCommitEvent(1, 50, 456)):
        assert decode_event(encode_event(event)) == event


def test_offset_streams_stay_out_of_batches_and_graceful_stop():
    tracker = ReceivedBlockTracker([0, 1], offset_stream_ids=[1])
    tracker.add_block(block(0, 1))
    tracker.add_block(block(1, 1))
    tracker.allocate_blocks_to_batch(1000)
    assert tracker.get_blocks_of_batch(1000) == {0: [block(0, 1)], 1: []}
    assert not tracker.has_unallocated_blocks()  # a graceful stop does not wait for queries
    assert tracker.logs.offset_status(1) == {"base": 0, "end": 0, "queued": 10}
    assert tracker.oldest_generated_ms_in_use() == 1
    with pytest.raises(OffsetError, match="stream 0 is not read through offsets"):
        tracker.logs.allocate_offsets(0, 0)
    with pytest.raises(ValueError, match="not among stream_ids"):
        ReceivedBlockTracker([0], offset_stream_ids=[3])


def test_positions_count_records_and_limits_split_blocks():
    tracker = ReceivedBlockTracker([0], offset_stream_ids=[0])
    for seq, records in enumerate([10, 5, 20]):
        tracker.add_block(block(0, seq, records))
    assert tracker.logs.allocate_offsets(0, 0, 12) == 12
    assert tracker.logs.offset_status(0) == {"base": 0, "end": 35, "queued": 0}
    assert ranges(tracker, 0, 0, 12) == [("input-0-1-0", 0, 10), ("input-0-1-1", 0, 2)]
    assert tracker.logs.allocate_offsets(0, 12, 12) == 24
    assert ranges(tracker, 0, 12, 24) == [("input-0-1-1", 2, 3), ("input-0-1-2", 0, 9)]
    assert tracker.logs.allocate_offsets(0, 24) == 35
    assert tracker.logs.allocate_offsets(0, 24, -1) == 35
    assert ranges(tracker, 0, 24, 35) == [("input-0-1-2", 9, 11)]
    assert ranges(tracker, 0, 35, 35) == []
    # The same range gives the same blocks every time.
    assert ranges(tracker, 0, 0, 12) == [("input-0-1-0", 0, 10), ("input-0-1-1", 0, 2)]
    with pytest.raises(OffsetError, match="max_records must be -1"):
        tracker.logs.allocate_offsets(0, 0, -2)


def test_commit_forgets_whole_blocks_below_the_end_and_refuses_what_is_gone():
    tracker = ReceivedBlockTracker([0], offset_stream_ids=[0])
    for seq in range(3):
        tracker.add_block(block(0, seq, 10))
    tracker.logs.allocate_offsets(0, 0)
    assert [b.block_id for b in tracker.logs.commit_offsets(0, 15)] == ["input-0-1-0"]
    assert tracker.logs.offset_status(0)["base"] == 15
    assert ranges(tracker, 0, 15, 30) == [("input-0-1-1", 5, 5), ("input-0-1-2", 0, 10)]
    assert tracker.logs.commit_offsets(0, 10) == []  # below the base: nothing to do
    with pytest.raises(OffsetError, match="cleaned up already: a structured stream serves one"):
        tracker.logs.offset_range(0, 0, 30)
    with pytest.raises(OffsetError, match="past the end of the log"):
        tracker.logs.allocate_offsets(0, 31)
    with pytest.raises(OffsetError, match="ends at 30"):
        tracker.logs.commit_offsets(0, 40)
    with pytest.raises(OffsetError, match="ends before it starts"):
        tracker.logs.offset_range(0, 20, 16)
    assert tracker.oldest_generated_ms_in_use() == 1


@given(
    sizes=st.lists(st.integers(0, 50), min_size=1, max_size=30),
    limits=st.lists(st.integers(1, 60), min_size=1, max_size=40),
)
@settings(max_examples=100, deadline=None)
def test_consecutive_ranges_cover_every_record_once_within_the_limit(sizes, limits):
    tracker = ReceivedBlockTracker([0], offset_stream_ids=[0])
    for seq, n in enumerate(sizes):
        tracker.add_block(block(0, seq, n))
    start, seen = 0, []
    for limit in limits:
        end = tracker.logs.allocate_offsets(0, start, limit)
        assert start <= end <= start + limit
        for b, first, rows in tracker.logs.offset_range(0, start, end):
            seen.extend((b.block_id, first + i) for i in range(rows))
        tracker.logs.commit_offsets(0, end)
        start = end
    everything = [(f"input-0-1-{seq}", i) for seq, n in enumerate(sizes) for i in range(n)]
    assert seen == everything[: len(seen)]
    assert len(seen) == min(sum(sizes), sum(limits)) or len(seen) == sum(sizes)


def open_tracker(ckpt, clock, recover=False, wal=None) -> ReceivedBlockTracker:
    wal = wal or create_driver_wal(str(ckpt), wal_config(), clock)
    return ReceivedBlockTracker([0, 1], wal, clock, recover=recover, offset_stream_ids=[1])


def test_recovery_gives_the_same_blocks_for_the_same_range(tmp_path):
    clock = ManualClock(1_000_000)
    tracker = open_tracker(tmp_path, clock)
    for seq in range(4):
        tracker.add_block(block(1, seq, 10))
    assert tracker.logs.allocate_offsets(1, 0, 25) == 25
    tracker.add_block(block(1, 9, 10))  # queued, not in the log yet
    tracker.logs.commit_offsets(1, 10)
    before = ranges(tracker, 1, 10, 25)
    tracker.stop()

    tracker = open_tracker(tmp_path, clock, recover=True)
    assert ranges(tracker, 1, 10, 25) == before
    assert tracker.logs.offset_status(1) == {"base": 10, "end": 40, "queued": 10}
    assert all(b.store_endpoint is None for b, _, _ in tracker.logs.offset_range(1, 10, 40))
    assert tracker.logs.allocate_offsets(1, 25) == 50
    assert ranges(tracker, 1, 40, 50) == [("input-1-1-9", 0, 10)]
    tracker.stop()


@pytest.mark.parametrize("persisted", [False, True], ids=["not-written", "written-then-failed"])
def test_a_failed_range_write_keeps_blocks_queued_and_replay_agrees(tmp_path, persisted):
    clock = ManualClock(1_000)
    log = FlakyLog(create_driver_wal(str(tmp_path), wal_config(), clock))
    tracker = open_tracker(tmp_path, clock, wal=log)
    tracker.add_block(block(1, 0, 10))
    log.fail_next, log.fail_after_write = 1, persisted
    assert tracker.logs.allocate_offsets(1, 0) == 0  # nothing appended, no error for the query
    assert tracker.logs.offset_status(1) == {"base": 0, "end": 0, "queued": 10}
    tracker.add_block(block(1, 1, 5))
    assert tracker.logs.allocate_offsets(1, 0) == 15
    tracker.stop()

    recovered = open_tracker(tmp_path, clock, recover=True)
    assert ranges(recovered, 1, 0, 15) == [("input-1-1-0", 0, 10), ("input-1-1-1", 0, 5)]
    assert recovered.logs.offset_status(1) == {"base": 0, "end": 15, "queued": 0}
    recovered.stop()


def test_wal_cleanup_keeps_the_events_a_block_log_still_needs(tmp_path):
    clock = ManualClock(1_000_000)
    tracker = open_tracker(tmp_path, clock)
    tracker.add_block(block(1, 0, 10))
    tracker.logs.allocate_offsets(1, 0)
    for i in range(1, 6):  # DStream batches go on; their cleanup rolls the WAL segments
        clock.advance(2_000)
        tracker.add_block(block(0, i))
        tracker.allocate_blocks_to_batch(clock.get_time_ms())
    tracker.logs.commit_offsets(1, 4)  # the block is still partly uncommitted
    clock.advance(2_000)
    tracker.cleanup_old_batches(clock.get_time_ms(), wait_for_completion=True)
    assert OffsetRangeEvent in {type(e) for e in logged_events(tmp_path)}
    tracker.stop()
    tracker = open_tracker(tmp_path, clock, recover=True)
    assert ranges(tracker, 1, 4, 10) == [("input-1-1-0", 4, 6)]

    # Once committed, older segments go, but the position survives in the commit event.
    tracker.logs.commit_offsets(1, 10)
    for _ in range(3):
        clock.advance(2_000)
        tracker.allocate_blocks_to_batch(clock.get_time_ms())
    before = len(segments(tmp_path))
    clock.advance(2_000)
    tracker.cleanup_old_batches(clock.get_time_ms(), wait_for_completion=True)
    assert len(segments(tmp_path)) < before
    assert not any(isinstance(e, OffsetRangeEvent) for e in logged_events(tmp_path))
    tracker.stop()
    tracker = open_tracker(tmp_path, clock, recover=True)
    assert tracker.logs.offset_status(1) == {"base": 10, "end": 10, "queued": 0}
    tracker.stop()


def test_the_wal_floor_of_a_call_of_blocks_is_no_later_than_its_first_addition_event(tmp_path):
    clock = ManualClock(1_000_000)

    class SlowLog(FlakyLog):
        """Each write takes 50 ms of the clock, as an fsync does of the wall clock."""

        def __init__(self, inner):
            super().__init__(inner)
            self.times: list[int] = []

        def write(self, data, time_ms):
            self.times.append(time_ms)
            clock.advance(50)
            return super().write(data, time_ms)

    wal = SlowLog(create_driver_wal(str(tmp_path), wal_config(), clock))
    tracker = open_tracker(tmp_path, clock, wal=wal)
    assert tracker.add_blocks([block(1, 1), block(1, 2), block(1, 3)]) == [True] * 3
    # The log still needs the first addition event: cleanup must keep everything from it.
    assert tracker.logs.wal_floor_ms() <= min(wal.times)
    tracker.stop()
