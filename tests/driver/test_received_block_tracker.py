"""ReceivedBlockTracker without a WAL (Spark's ReceivedBlockTrackerSuite, in-memory part)."""

from __future__ import annotations

from spark_receivers.driver.received_block_tracker import ReceivedBlockTracker
from spark_receivers.rpc.messages import ReceivedBlockInfo


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
