"""The driver WAL events of the Structured Streaming block logs.

Written through the block tracker's WAL with every other block event (one WAL orders
them all; the codec is ``driver/batches/block_events.py``).
"""

from __future__ import annotations

from dataclasses import dataclass

from spark_receivers.rpc.messages import ReceivedBlockInfo


@dataclass(frozen=True)
class OffsetRangeEvent:
    """Blocks of a Structured Streaming stream were appended to its block log at ``start``.

    ``start`` is the log position (records) of the first block; ``written_ms`` the
    driver's clock when the event was written (it bounds how far the WAL may be cleaned).
    """

    stream_id: int
    start: int
    blocks: tuple[ReceivedBlockInfo, ...]
    written_ms: int


@dataclass(frozen=True)
class OffsetCommitEvent:
    """A Structured Streaming query committed ``stream_id``'s block log up to ``end``."""

    stream_id: int
    end: int
    written_ms: int


OffsetEvent = OffsetRangeEvent | OffsetCommitEvent
