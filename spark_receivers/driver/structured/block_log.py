"""Block logs of Structured Streaming streams, and the offset endpoint that reads them.

A stream made with ``StreamingContext.structured_stream`` never goes to batches:
its blocks are appended to a **block log** whose positions count records
(docs/decisions/0004). :meth:`BlockLogs.allocate_offsets` appends every queued
block (an ``OffsetRangeEvent`` at the log's end position, in the driver WAL) and
returns an end offset, at most ``max_records`` past the start;
:meth:`BlockLogs.offset_range` gives the blocks and row slices of ``[start, end)``,
the same every time, also after a restart; :meth:`BlockLogs.commit_offsets`
forgets what lies wholly below ``end`` (an ``OffsetCommitEvent``).

On replay, a range event that starts before the log's end replaces what follows
its start (the earlier write was reported failed, so no query ever saw it), and
one that starts past the end follows WAL segments already cleaned. Every event
carries its write time; the driver WAL is never cleaned past the oldest event a
block log still needs (:meth:`BlockLogs.wal_floor_ms`).

The logs share the
:class:`~spark_receivers.driver.batches.received_block_tracker.ReceivedBlockTracker`'s
lock, queues and WAL (one WAL orders every block event); the tracker owns them as
``tracker.logs``. :class:`OffsetEndpoint` answers the readers' remote
messages (``DescribeStream``, ``StreamOffsets``, ``AllocateOffsets``,
``GetOffsetRange``, ``CommitOffsets``; see ``spark/stream_source.py``).
"""

from __future__ import annotations

import base64
import bisect
import logging
import threading
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from spark_receivers.driver.structured.offset_events import (
    OffsetCommitEvent,
    OffsetEvent,
    OffsetRangeEvent,
)
from spark_receivers.errors import OffsetError, RpcError
from spark_receivers.rpc import messages as m
from spark_receivers.rpc.messages import ReceivedBlockInfo
from spark_receivers.util.clock import Clock

log = logging.getLogger(__name__)

__all__ = ["OFFSET_MESSAGES", "BlockLogs", "OffsetEndpoint", "StructuredStreamInfo"]

OFFSET_MESSAGES: tuple[type, ...] = (
    m.DescribeStream,
    m.StreamOffsets,
    m.AllocateOffsets,
    m.GetOffsetRange,
    m.CommitOffsets,
)
"""The tracker messages a Structured Streaming reader sends."""


@dataclass
class _BlockLog:
    """The block log of one stream (positions count records)."""

    starts: list[int] = field(default_factory=list)
    """Log position of each retained block, ascending."""
    blocks: list[ReceivedBlockInfo] = field(default_factory=list)
    written_ms: list[int] = field(default_factory=list)
    """Write time of the range event that appended each block."""
    base: int = 0
    """The first position still readable (everything below was committed)."""
    end: int = 0
    """The position after the last appended block."""
    commit_ms: int | None = None
    """Write time of the newest commit event (it holds ``base`` when the log is empty)."""
    queued_since_ms: int | None = None
    """Driver time before the oldest queued block was logged (0: unknown, after replay)."""

    def append(self, start: int, blocks: Iterable[ReceivedBlockInfo], written_ms: int) -> None:
        if start > self.end:  # the events before this one were cleaned from the WAL
            self.starts.clear()
            self.blocks.clear()
            self.written_ms.clear()
            self.base = start
        elif start < self.end:  # replaces an append whose write was reported failed
            keep = bisect.bisect_left(self.starts, start)
            del self.starts[keep:], self.blocks[keep:], self.written_ms[keep:]
            self.base = min(self.base, start)
        position = start
        for b in blocks:
            self.starts.append(position)
            self.blocks.append(b)
            self.written_ms.append(written_ms)
            position += b.num_records
        self.end = position

    def commit(self, end: int, written_ms: int) -> list[ReceivedBlockInfo]:
        keep = 0
        while keep < len(self.blocks) and self.starts[keep] + self.blocks[keep].num_records <= end:
            keep += 1
        gone = self.blocks[:keep]
        del self.starts[:keep], self.blocks[:keep], self.written_ms[:keep]
        self.base = max(self.base, end)
        self.end = max(self.end, end)
        self.commit_ms = written_ms
        return gone

    def wal_floor_ms(self) -> int | None:
        times = [t for t in (self.commit_ms, self.queued_since_ms) if t is not None]
        if self.written_ms:
            times.append(self.written_ms[0])
        return min(times, default=None)


class BlockLogs:
    """The block logs of the streams read through offsets; see the module doc.

    Thread-safe through the owning tracker's lock, which every method takes.
    ``queues`` are the tracker's per-stream queues of blocks not yet appended,
    ``write(event)`` its WAL write (True when durable), ``changed`` its condition.
    """

    def __init__(
        self,
        stream_ids: Iterable[int],
        lock: threading.RLock,
        changed: threading.Condition,
        queues: dict[int, deque[ReceivedBlockInfo]],
        write: Callable[[OffsetEvent], bool],
        clock: Clock,
    ) -> None:
        self._logs: dict[int, _BlockLog] = {s: _BlockLog() for s in stream_ids}
        self._lock = lock
        self._changed = changed
        self._queues = queues
        self._write = write
        self._clock = clock

    def __contains__(self, stream_id: object) -> bool:
        return stream_id in self._logs

    @property
    def stream_ids(self) -> list[int]:
        """The streams read through offsets."""
        return list(self._logs)

    # --- called by the tracker, under its lock ---------------------------------

    def block_queued(self, stream_id: int, before_ms: int) -> None:
        """A block of ``stream_id`` was queued; ``before_ms`` is the time before it was logged."""
        block_log = self._logs.get(stream_id)
        if block_log is not None and block_log.queued_since_ms is None:
            block_log.queued_since_ms = before_ms

    def generated_ms_in_use(self) -> Iterator[int]:
        """``generated_ms`` of every block a log still holds."""
        for block_log in self._logs.values():
            for b in block_log.blocks:
                yield b.generated_ms

    def wal_floor_ms(self) -> int | None:
        """The oldest driver WAL event time a log still needs (None: no need)."""
        floors = [f for f in (b.wal_floor_ms() for b in self._logs.values()) if f is not None]
        return min(floors, default=None)

    def replay(self, event: OffsetEvent, known: dict[str, int | None]) -> None:
        """Apply a recovered range or commit event (see the module doc)."""
        match event:
            case OffsetRangeEvent(stream_id=s, start=start, blocks=infos, written_ms=w):
                block_log = self._logs.get(s)
                if block_log is None:
                    log.warning("recovered block log of stream %d, not read by offsets; ignored", s)
                    return
                names = {b.block_id for b in infos}
                for name in names:
                    known[name] = None
                queue = self._queues[s]
                self._queues[s] = deque(b for b in queue if b.block_id not in names)
                block_log.append(start, (b.without_store() for b in infos), w)
            case OffsetCommitEvent(stream_id=s, end=end, written_ms=w):
                block_log = self._logs.get(s)
                if block_log is not None:
                    block_log.commit(end, w)

    def recovered(self) -> None:
        """After replay: when the queued blocks were logged is unknown, keep the whole WAL."""
        for s, block_log in self._logs.items():
            block_log.queued_since_ms = 0 if self._queues[s] else None

    # --- the offset API ------------------------------------------------------

    def offset_status(self, stream_id: int) -> dict[str, int]:
        """``base`` and ``end`` of the stream's block log, records ``queued`` after its end."""
        with self._lock:
            block_log = self._block_log(stream_id)
            queued = sum(b.num_records for b in self._queues[stream_id])
            return {"base": block_log.base, "end": block_log.end, "queued": queued}

    def allocate_offsets(self, stream_id: int, start: int, max_records: int | None = None) -> int:
        """Append the stream's queued blocks to its log; return the end offset from ``start``.

        The end is the log's end, or at most ``max_records`` past ``start``. If the
        append cannot be logged, the blocks stay queued and the end is computed over
        what the log already holds (a later call appends them). ``max_records``
        None or -1: no limit.
        """
        if max_records is not None and max_records < -1:
            msg = f"max_records must be -1 (no limit) or >= 0, got {max_records}"
            raise OffsetError(msg)
        with self._lock:
            block_log = self._block_log(stream_id)
            self._check_position(stream_id, block_log, start, "start")
            queue = self._queues[stream_id]
            if queue:
                blocks = tuple(queue)
                now = self._clock.get_time_ms()
                if self._write(OffsetRangeEvent(stream_id, block_log.end, blocks, now)):
                    queue.clear()
                    block_log.append(block_log.end, blocks, now)
                    block_log.queued_since_ms = None
                    self._changed.notify_all()
                else:
                    log.warning(
                        "blocks of stream %d not appended to its log: WAL write failed", stream_id
                    )
            if max_records is None or max_records < 0:
                return block_log.end
            return min(block_log.end, start + max_records)

    def offset_range(
        self, stream_id: int, start: int, end: int
    ) -> list[tuple[ReceivedBlockInfo, int, int]]:
        """The blocks of ``[start, end)`` as (block, first row, row count), in log order."""
        with self._lock:
            block_log = self._block_log(stream_id)
            self._check_position(stream_id, block_log, start, "start")
            self._check_position(stream_id, block_log, end, "end")
            if end < start:
                msg = f"offset range of stream {stream_id} ends before it starts: [{start}, {end})"
                raise OffsetError(msg)
            i = max(0, bisect.bisect_right(block_log.starts, start) - 1)
            out = []
            while i < len(block_log.blocks) and block_log.starts[i] < end:
                b, first = block_log.blocks[i], block_log.starts[i]
                lo, hi = max(start, first), min(end, first + b.num_records)
                if hi > lo:
                    out.append((b, lo - first, hi - lo))
                i += 1
            return out

    def commit_offsets(self, stream_id: int, end: int) -> list[ReceivedBlockInfo]:
        """Forget the blocks wholly below ``end``; return them (their stores may drop them).

        Nothing changes if the commit cannot be logged (a later commit covers it).
        """
        with self._lock:
            block_log = self._block_log(stream_id)
            if end > block_log.end:
                msg = (
                    f"cannot commit offset {end} of stream {stream_id}: its block log ends at "
                    f"{block_log.end}"
                )
                raise OffsetError(msg)
            if end <= block_log.base:
                return []
            now = self._clock.get_time_ms()
            if not self._write(OffsetCommitEvent(stream_id, end, now)):
                log.warning("commit of stream %d up to %d not logged; kept", stream_id, end)
                return []
            return block_log.commit(end, now)

    def _block_log(self, stream_id: int) -> _BlockLog:
        block_log = self._logs.get(stream_id)
        if block_log is None:
            kind = "batches" if stream_id in self._queues else "no stream"
            msg = (
                f"stream {stream_id} is not read through offsets (it feeds {kind}); "
                "create it with StreamingContext.structured_stream(receiver)"
            )
            raise OffsetError(msg)
        return block_log

    @staticmethod
    def _check_position(stream_id: int, block_log: _BlockLog, position: int, what: str) -> None:
        if block_log.base <= position <= block_log.end:
            return
        if position < block_log.base:
            why = (
                "was committed and cleaned up already: a structured stream serves one query "
                "(a second query over it, or one restarted without its checkpoint, asks for "
                "what another committed); read it in one query and write to several sinks "
                "with foreachBatch, or give each query a structured_stream of its own"
            )
        else:
            why = "is past the end of the log: was the checkpoint directory replaced?"
        msg = (
            f"{what} offset {position} of stream {stream_id} {why} "
            f"(the block log holds [{block_log.base}, {block_log.end}))"
        )
        raise OffsetError(msg)


@dataclass(frozen=True)
class StructuredStreamInfo:
    """What a Structured Streaming reader may learn of a stream."""

    stream_id: int
    name: str
    schema: pa.Schema


class OffsetEndpoint:
    """Answers the offset messages of Structured Streaming readers (on gRPC threads).

    ``remove_blocks`` is told the blocks a commit freed; it must not block (the
    scheduler hands them to the receivers' outbox).
    """

    def __init__(
        self,
        logs: BlockLogs,
        streams: Sequence[StructuredStreamInfo],
        remove_blocks: Callable[[list[ReceivedBlockInfo]], None],
    ) -> None:
        self._logs = logs
        self._streams = {s.stream_id: s for s in streams}
        self._remove_blocks = remove_blocks

    def handle(self, message: Any) -> Any:
        """Answer one offset message; :class:`RpcError` for what a reader got wrong."""
        if isinstance(message, m.DescribeStream):
            return self._describe(message.stream)
        sid = message.stream_id
        if sid not in self._streams:
            msg = f"unknown stream id {sid}; known: {sorted(self._streams)}"
            raise RpcError(msg)
        try:
            match message:
                case m.StreamOffsets():
                    return self._logs.offset_status(sid)
                case m.AllocateOffsets(start=start, max_records=limit):
                    _non_negative(start=start)
                    return self._logs.allocate_offsets(sid, start, limit)
                case m.GetOffsetRange(start=start, end=end):
                    _non_negative(start=start, end=end)
                    return [
                        [b.to_dict(), first, rows]
                        for b, first, rows in self._logs.offset_range(sid, start, end)
                    ]
                case m.CommitOffsets(end=end):
                    _non_negative(end=end)
                    done = self._logs.commit_offsets(sid, end)
                    if done:
                        self._remove_blocks(done)
                    return True
        except OffsetError as e:
            raise RpcError(str(e)) from None
        msg = f"unexpected message {message!r:.100}"
        raise RpcError(msg)

    def _describe(self, stream: str) -> dict[str, Any]:
        found = [s for s in self._streams.values() if stream in (str(s.stream_id), s.name)]
        if not found:
            names = sorted(f"{s.stream_id} ({s.name})" for s in self._streams.values())
            msg = f"no stream {stream[:100]!r}: this application has streams {names}"
            raise RpcError(msg)
        described = found[0]
        if described.stream_id not in self._logs:
            msg = (
                f"stream {described.stream_id} ({described.name}) feeds DStream batches; "
                "create it with StreamingContext.structured_stream(receiver) to read it "
                "from Structured Streaming"
            )
            raise RpcError(msg)
        schema = base64.b64encode(described.schema.serialize().to_pybytes()).decode()
        return {"stream_id": described.stream_id, "name": described.name, "schema": schema}


def _non_negative(**offsets: int) -> None:
    for name, value in offsets.items():
        if value < 0:
            msg = f"offset {name} must be >= 0, got {value}"
            raise OffsetError(msg)


def describe_streams(receivers: Mapping[int, Any]) -> list[StructuredStreamInfo]:
    """Descriptions of receivers by stream id (anything with ``name`` and ``schema``)."""
    return [StructuredStreamInfo(sid, r.name, r.schema) for sid, r in receivers.items()]
