"""Tracks every received block on the driver and allocates them to batches.

Spark's ReceivedBlockTracker: a FIFO of unallocated blocks per stream, the
blocks of every allocated batch, and the last allocated batch time. With a WAL,
every change is logged first and memory changes only if the write succeeded;
:meth:`recover` replays the log (recovered blocks are known to be in no block
store, so they are read from the receivers' WAL).

The driver WAL lives in ``<checkpoint_dir>/receivedBlockMetadata``
(:func:`create_driver_wal`): a :class:`BatchedWriteAheadLog` over a
:class:`FileBasedWriteAheadLog` when batching is allowed, so that concurrent
``AddBlock`` calls share one write and one fsync.

Replay tolerates what the WAL may hand back twice or after a failed write
(docs/decisions/0002: a record whose write failed can still be on disk):

* a ``BlockAdditionEvent`` of a block already known (queued or allocated) is
  ignored, so a block is never queued twice;
* a ``BatchAllocationEvent`` holding a block that an earlier allocation event
  also holds means the earlier write was reported failed (live, a successful
  allocation removes its blocks from the queues, so they cannot be allocated
  again): the later event is what happened, and the block is taken out of the
  earlier batch.

Source positions (``ReceivedBlockInfo.position``) are remembered per stream as their
blocks are added: :meth:`ReceivedBlockTracker.accepted_position` is the newest one,
rebuilt on replay from the addition events and from the cleanup events, which carry
every stream's position so that cleaning the WAL never forgets one. The newest is the
one of the newest block (by its id's session and counter), whatever the order the
events have in the WAL (a cleanup event may follow the addition of a newer block).

Streams read by Structured Streaming (``offset_stream_ids``) never go to batches:
their blocks go to the block logs of :mod:`spark_receivers.driver.structured`
(``tracker.logs``), which share this tracker's lock, queues and WAL.
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from collections.abc import Iterable, Sequence

from spark_receivers.config import StreamingConfig
from spark_receivers.driver.batches.block_events import (
    BatchAllocationEvent,
    BatchCleanupEvent,
    BlockAdditionEvent,
    BlockTrackerEvent,
    decode_event,
    encode_event,
)
from spark_receivers.driver.structured import BlockLogs, OffsetCommitEvent, OffsetRangeEvent
from spark_receivers.rpc.messages import ReceivedBlockInfo, StreamBlockId
from spark_receivers.util.clock import Clock, SystemClock
from spark_receivers.wal.base import WriteAheadLog
from spark_receivers.wal.batched_log import BatchedWriteAheadLog
from spark_receivers.wal.file_log import FileBasedWriteAheadLog
from spark_receivers.wal.layout import CheckpointLayout

log = logging.getLogger(__name__)


def create_driver_wal(
    checkpoint: str | CheckpointLayout, config: StreamingConfig, clock: Clock | None = None
) -> WriteAheadLog:
    """The driver's WAL under a checkpoint directory, configured by the ``driver_wal_*`` keys.

    Nothing is created on the filesystem before the first write.
    """
    layout = (
        checkpoint if isinstance(checkpoint, CheckpointLayout) else CheckpointLayout(checkpoint)
    )
    file_log = FileBasedWriteAheadLog(
        layout.driver_wal_dir,
        filesystem=layout.filesystem,
        rolling_interval_s=config.driver_wal_rolling_interval_s,
        max_failures=config.driver_wal_max_failures,
        close_file_after_write=config.driver_wal_close_file_after_write,
        fsync=config.driver_wal_fsync,
        clock=clock,
    )
    if not config.driver_wal_allow_batching:
        return file_log
    return BatchedWriteAheadLog(
        file_log, batching_timeout_s=config.driver_wal_batching_timeout_ms / 1000.0
    )


def open_block_tracker(
    stream_ids: list[int],
    offset_stream_ids: Iterable[int],
    layout: CheckpointLayout | None,
    config: StreamingConfig,
    clock: Clock,
    recover: bool,
) -> ReceivedBlockTracker:
    """The block tracker of a starting context: with a driver WAL under ``layout`` if any.

    A recovering driver replays the WAL; a fresh start first drops the events of an
    older run, so they are never replayed later.
    """
    offset_ids = list(offset_stream_ids)
    if layout is None:
        return ReceivedBlockTracker(stream_ids, clock=clock, offset_stream_ids=offset_ids)
    wal = create_driver_wal(layout, config, clock)
    if not recover:
        wal.clean(2**62, wait=True)
    return ReceivedBlockTracker(
        stream_ids, wal, clock, recover=recover, offset_stream_ids=offset_ids
    )


class ReceivedBlockTracker:
    """Blocks per stream, allocated to batches. Thread-safe.

    Example::

        tracker = ReceivedBlockTracker([0])
        tracker.add_block(info)
        tracker.allocate_blocks_to_batch(1000)
        tracker.get_blocks_of_batch(1000)   # {0: [info]}

    With ``wal`` every change is logged first; with ``recover=True`` the state is
    rebuilt from ``wal`` before anything else (see the module doc).
    """

    def __init__(
        self,
        stream_ids: Iterable[int],
        wal: WriteAheadLog | None = None,
        clock: Clock | None = None,
        recover: bool = False,
        offset_stream_ids: Iterable[int] = (),
    ) -> None:
        self._stream_ids = list(stream_ids)
        offset_ids = list(offset_stream_ids)
        unknown = set(offset_ids) - set(self._stream_ids)
        if unknown:
            msg = f"offset_stream_ids {sorted(unknown)} are not among stream_ids {self._stream_ids}"
            raise ValueError(msg)
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
        self._positions: dict[int, tuple[str, str]] = {}
        """Stream id -> (block id, position) of its newest block with a position."""
        self.recovered_events = 0
        self.logs = BlockLogs(
            offset_ids,
            self._lock,
            self.allocation_changed,
            self._unallocated,
            self._write,
            self._clock,
        )
        """The block logs of the streams read by Structured Streaming."""
        if recover and wal is not None:
            self._recover()

    @property
    def wal(self) -> WriteAheadLog | None:
        """The driver WAL, if any."""
        return self._wal

    @property
    def is_write_ahead_log_enabled(self) -> bool:
        """True when events are logged before memory changes."""
        return self._wal is not None

    @property
    def last_allocated_batch_ms(self) -> int:
        """The newest batch time blocks were allocated to (-1 before the first)."""
        return self._last_allocated_ms

    def add_block(self, info: ReceivedBlockInfo) -> bool:
        """Log then enqueue a block; return False (and log) if the WAL write failed.

        The write happens outside the tracker's lock, as in Spark, so that
        concurrent adds share batched WAL writes; the block is enqueued only once
        its event is durable, so every allocation event is logged after the
        addition events of its blocks.
        """
        return self.add_blocks((info,))[0]

    def add_blocks(self, infos: Sequence[ReceivedBlockInfo]) -> list[bool]:
        """:meth:`add_block` for each of ``infos`` (one supervisor's call), in order.

        The lock is taken once for the call: the endpoint's gRPC threads contend for it,
        and taking it per block made them queue behind each other.
        """
        # A block log's WAL floor is the time before its first block was logged: taken
        # before any write, so that cleanup never drops an addition event it needs.
        offsets = any(info.stream_id in self.logs for info in infos)
        before_ms = self._clock.get_time_ms() if offsets else 0
        ok = []
        for info in infos:
            known = info.stream_id in self._unallocated
            if not known:
                log.warning("block %s of unknown stream %s refused", info.block_id, info.stream_id)
            ok.append(known and self._write(BlockAdditionEvent(info)))
        queued = [info for info, good in zip(infos, ok, strict=True) if good]
        if queued:
            with self._lock:
                for info in queued:
                    if info.stream_id in self.logs:
                        self.logs.block_queued(info.stream_id, before_ms)
                    self._unallocated[info.stream_id].append(info)
                    self._note_position(info)
                self.allocation_changed.notify_all()
        return ok

    def accepted_position(self, stream_id: int) -> str | None:
        """The position of the newest block of ``stream_id`` added with one (None: none)."""
        with self._lock:
            newest = self._positions.get(stream_id)
            return None if newest is None else newest[1]

    def _note_position(self, info: ReceivedBlockInfo) -> None:
        if info.position is not None:
            self._keep_newest(info.stream_id, info.block_id, info.position)

    def _keep_newest(self, stream_id: int, block_id: str, position: str) -> None:
        # Under the lock. Block ids order a stream's blocks: session (start ms), counter.
        old = self._positions.get(stream_id)
        if old is None or _order(block_id) >= _order(old[0]):
            self._positions[stream_id] = (block_id, position)

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
            blocks = {s: tuple(q) for s, q in self._unallocated.items() if s not in self.logs}
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

    def batch_of(self, block_id: str) -> int:
        """The batch time a block was allocated to, or -1 (unallocated, or cleaned up)."""
        for batch_ms in self.allocated_batch_times():
            for blocks in self.get_blocks_of_batch(batch_ms).values():
                if any(b.block_id == block_id for b in blocks):
                    return batch_ms
        return -1

    def has_unallocated_blocks(self) -> bool:
        """True while some stream read by batches has blocks not yet given to a batch."""
        with self._lock:
            return any(q for s, q in self._unallocated.items() if s not in self.logs)

    def unallocated_blocks_of_stream(self, stream_id: int) -> list[ReceivedBlockInfo]:
        """The blocks of a stream that wait for a batch."""
        with self._lock:
            return list(self._unallocated.get(stream_id, ()))

    def allocated_batch_times(self) -> list[int]:
        """Times of the batches still remembered, oldest first."""
        with self._lock:
            return sorted(self._allocated)

    def oldest_generated_ms_in_use(self) -> int | None:
        """The oldest ``generated_ms`` of a block still queued or in a remembered batch.

        Receivers stamp their WAL records no earlier than the block's
        ``generated_ms`` (in their own clock), so cleaning the receiver WALs
        below this value never deletes a block a batch may still read.
        """
        with self._lock:
            times = [b.generated_ms for q in self._unallocated.values() for b in q]
            times.extend(
                b.generated_ms
                for batch in self._allocated.values()
                for bs in batch.values()
                for b in bs
            )
            times.extend(self.logs.generated_ms_in_use())
            return min(times, default=None)

    def cleanup_old_batches(self, threshold_ms: int, wait_for_completion: bool = False) -> None:
        """Forget batches older than ``threshold_ms`` (logged first), then clean the WAL.

        If the cleanup event cannot be logged nothing is forgotten or deleted: a
        later cleanup covers these batches too. WAL deletion errors are logged by
        the WAL and never change the recovered state (deleted segments only hold
        events older than every remembered batch).
        """
        with self._lock:
            times = tuple(t for t in sorted(self._allocated) if t < threshold_ms)
            # With positions, always logged: the WAL segments cleaned below may hold the
            # last event that carried them.
            positions = dict(self._positions)
            if (times or positions) and not self._write(BatchCleanupEvent(times, positions)):
                return
            for t in times:
                self._allocated.pop(t, None)
            floor = self.logs.wal_floor_ms()
            wal_threshold = threshold_ms if floor is None else min(threshold_ms, floor)
        if self._wal is not None:
            self._wal.clean(wal_threshold, wait_for_completion)

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
        # block id -> batch time it is allocated to (None while queued), for dedupe.
        known: dict[str, int | None] = {}
        with self._lock:
            for record in self._wal.read_all():
                self._replay(decode_event(record), known)
                n += 1
            self.recovered_events = n
            self.logs.recovered()
        log.info(
            "recovered %d block tracker events: %d unallocated blocks, %d batches, last %d",
            n,
            sum(len(q) for q in self._unallocated.values()),
            len(self._allocated),
            self._last_allocated_ms,
        )

    def _replay(self, event: BlockTrackerEvent, known: dict[str, int | None]) -> None:
        match event:
            case BlockAdditionEvent(block_info=info):
                if info.stream_id not in self._unallocated:
                    log.warning("recovered block %s of unknown stream ignored", info.block_id)
                elif info.block_id in known:
                    log.info("recovered a duplicate addition of block %s; ignored", info.block_id)
                else:
                    known[info.block_id] = None
                    self._unallocated[info.stream_id].append(info.without_store())
                    self._note_position(info)
            case BatchAllocationEvent(batch_time_ms=t, blocks=blocks):
                recovered: dict[int, tuple[ReceivedBlockInfo, ...]] = {}
                for s, infos in blocks.items():
                    names = {b.block_id for b in infos}
                    for name in names:
                        earlier = known.get(name)
                        if earlier is not None and earlier != t:
                            self._take_from_batch(earlier, s, name, t)
                        known[name] = t
                    queue = self._unallocated.get(s, deque())
                    self._unallocated[s] = deque(b for b in queue if b.block_id not in names)
                    recovered[s] = tuple(b.without_store() for b in infos)
                self._allocated[t] = recovered
                self._last_allocated_ms = max(self._last_allocated_ms, t)
            case BatchCleanupEvent(batch_times_ms=times, positions=positions):
                for t in times:
                    self._allocated.pop(t, None)
                for s, (block_id, position) in positions.items():
                    if s in self._unallocated:
                        self._keep_newest(s, block_id, position)
            case OffsetRangeEvent() | OffsetCommitEvent():
                self.logs.replay(event, known)

    def _take_from_batch(self, batch_ms: int, stream_id: int, block_id: str, later: int) -> None:
        # The allocation of `batch_ms` was reported failed live (see the module doc).
        batch = self._allocated.get(batch_ms)
        if batch is None:
            return
        log.warning(
            "block %s is allocated to batch %d and again to batch %d in the driver WAL: "
            "the first allocation's write had failed; keeping it in batch %d",
            block_id,
            batch_ms,
            later,
            later,
        )
        batch[stream_id] = tuple(b for b in batch.get(stream_id, ()) if b.block_id != block_id)


def _order(block_id: str) -> tuple[int, int]:
    """(session, counter) of a block id: the order its receiver stored it in."""
    parsed = StreamBlockId.parse(block_id)
    return parsed.session, parsed.seq
