"""The events the driver's block tracker writes to its WAL before changing memory.

One WAL orders every block event, so one codec writes them all; the two events of the
Structured Streaming block logs are defined with them, in
``driver/structured/offset_events.py``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from spark_receivers.driver.structured import OffsetCommitEvent, OffsetRangeEvent
from spark_receivers.errors import CorruptRecordError
from spark_receivers.rpc.messages import ReceivedBlockInfo


@dataclass(frozen=True)
class BlockAdditionEvent:
    """A block was reported by a receiver."""

    block_info: ReceivedBlockInfo


@dataclass(frozen=True)
class BatchAllocationEvent:
    """The unallocated blocks of every stream went to the batch at ``batch_time_ms``."""

    batch_time_ms: int
    blocks: dict[int, tuple[ReceivedBlockInfo, ...]]


@dataclass(frozen=True)
class BatchCleanupEvent:
    """These batches completed and were forgotten.

    ``positions``: per stream, the last source position accepted when it was written and
    the block that brought it (``[block id, position]``), so that cleaning the WAL
    segments holding their addition events keeps them.
    """

    batch_times_ms: tuple[int, ...]
    positions: dict[int, tuple[str, str]] = field(default_factory=dict)


BlockTrackerEvent = (
    BlockAdditionEvent
    | BatchAllocationEvent
    | BatchCleanupEvent
    | OffsetRangeEvent
    | OffsetCommitEvent
)


# One encoder for every event: json.dumps with separators builds a new encoder per call.
_ENCODER = json.JSONEncoder(separators=(",", ":"))


def encode_event(event: BlockTrackerEvent) -> bytes:
    """Serialize an event as JSON (never pickle)."""
    match event:
        case BlockAdditionEvent(block_info=info):
            body: dict[str, Any] = {"t": "add", "block": info.to_dict()}
        case BatchAllocationEvent(batch_time_ms=t, blocks=blocks):
            body = {
                "t": "alloc",
                "time": t,
                "blocks": {str(s): [b.to_dict() for b in bs] for s, bs in blocks.items()},
            }
        case BatchCleanupEvent(batch_times_ms=times, positions=positions):
            body = {"t": "clean", "times": list(times)}
            if positions:
                body["positions"] = {str(s): list(p) for s, p in positions.items()}
        case OffsetRangeEvent(stream_id=s, start=start, blocks=blocks, written_ms=w):
            body = {
                "t": "range",
                "stream": s,
                "start": start,
                "blocks": [b.to_dict() for b in blocks],
                "written": w,
            }
        case OffsetCommitEvent(stream_id=s, end=end, written_ms=w):
            body = {"t": "commit", "stream": s, "end": end, "written": w}
    return _ENCODER.encode(body).encode()


_info = ReceivedBlockInfo.from_dict


def decode_event(data: bytes) -> BlockTrackerEvent:
    """Parse an event written by :func:`encode_event`; raise CorruptRecordError otherwise."""
    try:
        body = json.loads(data.decode("utf-8"))
        kind = body["t"]
        if kind == "add":
            return BlockAdditionEvent(_info(body["block"]))
        if kind == "alloc":
            blocks = {int(s): tuple(_info(b) for b in bs) for s, bs in body["blocks"].items()}
            return BatchAllocationEvent(int(body["time"]), blocks)
        if kind == "clean":
            positions = {
                int(s): (str(b), str(p)) for s, (b, p) in body.get("positions", {}).items()
            }
            return BatchCleanupEvent(tuple(int(t) for t in body["times"]), positions)
        if kind == "range":
            return OffsetRangeEvent(
                int(body["stream"]),
                int(body["start"]),
                tuple(_info(b) for b in body["blocks"]),
                int(body["written"]),
            )
        if kind == "commit":
            return OffsetCommitEvent(int(body["stream"]), int(body["end"]), int(body["written"]))
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        msg = f"driver WAL record is not a block tracker event: {e}"
        raise CorruptRecordError(msg) from e
    msg = f"driver WAL record has unknown event type {kind!r:.40}"
    raise CorruptRecordError(msg)
