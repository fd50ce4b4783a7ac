"""The events the driver's block tracker writes to its WAL before changing memory."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

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
    """These batches completed and were forgotten."""

    batch_times_ms: tuple[int, ...]


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
            body: dict[str, Any] = {"t": "add", "block": info_to_dict(info)}
        case BatchAllocationEvent(batch_time_ms=t, blocks=blocks):
            body = {
                "t": "alloc",
                "time": t,
                "blocks": {str(s): [info_to_dict(b) for b in bs] for s, bs in blocks.items()},
            }
        case BatchCleanupEvent(batch_times_ms=times):
            body = {"t": "clean", "times": list(times)}
        case OffsetRangeEvent(stream_id=s, start=start, blocks=blocks, written_ms=w):
            body = {
                "t": "range",
                "stream": s,
                "start": start,
                "blocks": [info_to_dict(b) for b in blocks],
                "written": w,
            }
        case OffsetCommitEvent(stream_id=s, end=end, written_ms=w):
            body = {"t": "commit", "stream": s, "end": end, "written": w}
    return _ENCODER.encode(body).encode()


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
            return BatchCleanupEvent(tuple(int(t) for t in body["times"]))
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


def info_to_dict(info: ReceivedBlockInfo) -> dict[str, Any]:
    """The fields of a block info as a JSON-friendly dict.

    Spelled out rather than ``dataclasses.asdict``, which deep-copies every value
    and made logging 100,000 blocks five times slower; the two dict fields
    (``wal_handle``, ``metadata``) are JSON values already and are not copied.
    """
    raw = {
        "stream_id": info.stream_id,
        "block_id": info.block_id,
        "num_records": info.num_records,
        "generated_ms": info.generated_ms,
        "store_endpoint": info.store_endpoint,
        "size_bytes": info.size_bytes,
        "wal_handle": info.wal_handle,
        "metadata": info.metadata,
    }
    if info.replica_endpoints:
        raw["replica_endpoints"] = list(info.replica_endpoints)
    return raw


def _info(raw: dict[str, Any]) -> ReceivedBlockInfo:
    return ReceivedBlockInfo.from_dict(raw)
