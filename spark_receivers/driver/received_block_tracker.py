"""Tracks every received block on the driver and allocates them to batches.

Spark's ReceivedBlockTracker: a FIFO of unallocated blocks per stream, the
blocks of every allocated batch, and the last allocated batch time. With a WAL,
every change is logged first and memory changes only if the write succeeded;
:meth:`recover` replays the log (recovered blocks are known to be in no block
store, so they are read from the receivers' WAL).
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from collections.abc import Iterable

from spark_receivers.driver.block_events import (
    BatchAllocationEvent,
    BatchCleanupEvent,
    BlockAdditionEvent,
    BlockTrackerEvent,
    decode_event,
    encode_event,
)
from spark_receivers.rpc.messages import ReceivedBlockInfo
from spark_receivers.util.clock import Clock, SystemClock
from spark_receivers.wal_protocol import WriteAheadLogLike

log = logging.getLogger(__name__)


class ReceivedBlockTracker:
    """Blocks per stream, allocated to batches. Thread-safe.

    Example::

        tracker = ReceivedBlockTracker([0])
        tracker.add_block(info)
        tracker.allocate_blocks_to_batch(1000)
        tracker.get_blocks_of_batch(1000)   # {0: [info]}
    """

    def __init__(
        self,
        stream_ids: Iterable[int],
        wal: WriteAheadLogLike | None = None,
        clock: Clock | None = None,
        recover: bool = False,
    ) -> None:
        self._stream_ids = list(stream_ids)
        self._wal = wal
        self._clock = clock or SystemClock()
        self._lock = threading.RLock()
        self.allocation_changed = threading.Condition(self._lock)
        """Notified whenever blocks are added or allocated."""
        self._unallocated: dict[int, deque[ReceivedBlockInfo]] = {
            s: deque() for s in self._stream_ids
        }
        self._allocated: dict[int, dict[int, tuple[ReceivedBlockInfo, ...]]] = {}
        self._last_allocated_ms = -1
        if recover and wal is not None:
            self._recover()

    @property
    def last_allocated_batch_ms(self) -> int:
        """The newest batch time blocks were allocated to (-1 before the first)."""
        return self._last_allocated_ms

    def add_block(self, info: ReceivedBlockInfo) -> bool:
        """Log then enqueue a block; return False (and log) if the WAL write failed."""
        with self._lock:
            if info.stream_id not in self._unallocated:
                log.warning("block %s of unknown stream %s refused", info.block_id, info.stream_id)
                return False
            if not self._write(BlockAdditionEvent(info)):
                return False
            self._unallocated[info.stream_id].append(info)
            self.allocation_changed.notify_all()
            return True

    def allocate_blocks_to_batch(self, batch_time_ms: int) -> None:
        """Move every unallocated block to the batch at ``batch_time_ms``.

        Only moves forward in time: for a time at or before the last allocated
        one this does nothing (during recovery such batches keep the blocks they
        were allocated before the crash). If the WAL write fails, the blocks stay
        unallocated and a later call takes them.
        """
        with self._lock:
            if batch_time_ms <= self._last_allocated_ms:
                log.info(
                    "batch %d is already allocated (last %d)",
                    batch_time_ms,
                    self._last_allocated_ms,
                )
                return
            blocks = {s: tuple(q) for s, q in self._unallocated.items()}
            if not self._write(BatchAllocationEvent(batch_time_ms, blocks)):
                log.warning(
                    "allocation of batch %d not logged; its blocks stay unallocated", batch_time_ms
                )
                return
            for s, taken in blocks.items():
                queue = self._unallocated[s]
                for _ in range(len(taken)):
                    queue.popleft()
            self._allocated[batch_time_ms] = blocks
            self._last_allocated_ms = batch_time_ms
            self.allocation_changed.notify_all()

    def get_blocks_of_batch(self, batch_time_ms: int) -> dict[int, list[ReceivedBlockInfo]]:
        """The blocks of every stream in a batch (empty lists if none)."""
        with self._lock:
            blocks = self._allocated.get(batch_time_ms, {})
            return {s: list(blocks.get(s, ())) for s in self._stream_ids}

    def get_blocks_of_batch_and_stream(
        self, batch_time_ms: int, stream_id: int
    ) -> list[ReceivedBlockInfo]:
        """The blocks of one stream in a batch."""
        with self._lock:
            return list(self._allocated.get(batch_time_ms, {}).get(stream_id, ()))

    def has_unallocated_blocks(self) -> bool:
        """True while some stream has blocks not yet given to a batch."""
        with self._lock:
            return any(self._unallocated.values())

    def unallocated_blocks_of_stream(self, stream_id: int) -> list[ReceivedBlockInfo]:
        """The blocks of a stream that wait for a batch."""
        with self._lock:
            return list(self._unallocated.get(stream_id, ()))

    def allocated_batch_times(self) -> list[int]:
        """Times of the batches still remembered, oldest first."""
        with self._lock:
            return sorted(self._allocated)

    def cleanup_old_batches(self, threshold_ms: int, wait_for_completion: bool = False) -> None:
        """Forget batches older than ``threshold_ms`` (logged first), then clean the WAL."""
        with self._lock:
            times = tuple(t for t in sorted(self._allocated) if t < threshold_ms)
            if times and not self._write(BatchCleanupEvent(times)):
                return
            for t in times:
                self._allocated.pop(t, None)
        if self._wal is not None:
            self._wal.clean(threshold_ms, wait_for_completion)

    def stop(self) -> None:
        """Close the WAL."""
        if self._wal is not None:
            self._wal.close()

    def _write(self, event: BlockTrackerEvent) -> bool:
        if self._wal is None:
            return True
        try:
            self._wal.write(encode_event(event), self._clock.get_time_ms())
        except Exception:
            log.exception("could not write %s to the driver WAL", type(event).__name__)
            return False
        return True

    def _recover(self) -> None:
        assert self._wal is not None
        n = 0
        for record in self._wal.read_all():
            self._replay(decode_event(record))
            n += 1
        log.info(
            "recovered %d block tracker events: %d batches allocated, last %d",
            n,
            len(self._allocated),
            self._last_allocated_ms,
        )

    def _replay(self, event: BlockTrackerEvent) -> None:
        match event:
            case BlockAdditionEvent(block_info=info):
                if info.stream_id in self._unallocated:
                    self._unallocated[info.stream_id].append(info.without_store())
            case BatchAllocationEvent(batch_time_ms=t, blocks=blocks):
                recovered: dict[int, tuple[ReceivedBlockInfo, ...]] = {}
                for s, infos in blocks.items():
                    names = {b.block_id for b in infos}
                    queue = self._unallocated.get(s, deque())
                    self._unallocated[s] = deque(b for b in queue if b.block_id not in names)
                    recovered[s] = tuple(b.without_store() for b in infos)
                self._allocated[t] = recovered
                self._last_allocated_ms = max(self._last_allocated_ms, t)
            case BatchCleanupEvent(batch_times_ms=times):
                for t in times:
                    self._allocated.pop(t, None)
