"""The messages that cross the wire, as frozen dataclasses in closed sets.

Remote messages to the driver's tracker (:data:`TrackerMessage`) and to a
receiver's supervisor (:data:`SupervisorMessage`) are kept apart from the
driver-local commands (those live in ``driver/tracker_commands.py``), as Spark
keeps ``ReceiverTrackerMessage`` apart from ``ReceiverTrackerLocalMessage``.

Encoding is JSON with a fixed schema: :func:`decode` checks the message type is
one the endpoint accepts, that every field is present with the declared type and
that the size is within ``max_message_bytes``. Nothing received is ever
unpickled or evaluated.
"""

from __future__ import annotations

import dataclasses
import json
import re
import types
import typing
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar, Union

from spark_receivers.errors import RpcError

BLOCK_ID_RE = re.compile(r"input-([0-9]{1,9})-([0-9]{1,20})-([0-9]{1,20})")


@dataclass(frozen=True)
class StreamBlockId:
    """The id of one block: its stream, the supervisor session that cut it and a counter.

    The session is the supervisor's start time in ms, so ids stay unique across
    restarts of the same receiver (a restarted task starts a new session).
    """

    stream_id: int
    session: int
    seq: int

    @property
    def name(self) -> str:
        """The block's name, ``input-<stream>-<session>-<seq>``."""
        return f"input-{self.stream_id}-{self.session}-{self.seq}"

    def __str__(self) -> str:
        return self.name

    @staticmethod
    def parse(name: str) -> StreamBlockId:
        """Parse a block name; raise :class:`RpcError` if it is not well formed."""
        m = BLOCK_ID_RE.fullmatch(name) if isinstance(name, str) else None
        if m is None:
            msg = f"malformed block id {name!r}: expected input-<stream>-<session>-<seq>"
            raise RpcError(msg)
        return StreamBlockId(int(m.group(1)), int(m.group(2)), int(m.group(3)))


@dataclass(frozen=True)
class ReceivedBlockInfo:
    """What the driver knows about one stored block.

    ``store_endpoint`` is the ``host:port`` of the block server holding it (None
    when it is known not to be in any store, e.g. after recovery);
    ``wal_handle`` is the block's write-ahead log record when the receiver WAL is on.
    """

    stream_id: int
    block_id: str
    num_records: int
    generated_ms: int
    store_endpoint: str | None
    size_bytes: int = 0
    wal_handle: dict[str, Any] | None = None
    metadata: dict[str, Any] | None = None

    def without_store(self) -> ReceivedBlockInfo:
        """The block as known after recovery: in no block store, only in the WAL."""
        if self.store_endpoint is None:
            return self
        # Built directly: dataclasses.replace's per-call overhead dominated the
        # replay of 100,000 blocks.
        return ReceivedBlockInfo(
            self.stream_id,
            self.block_id,
            self.num_records,
            self.generated_ms,
            None,
            self.size_bytes,
            self.wal_handle,
            self.metadata,
        )


# --- remote messages to the tracker (driver) --------------------------------


@dataclass(frozen=True)
class RegisterReceiver:
    """A supervisor asks to run receiver ``stream_id``; replied with a bool."""

    stream_id: int
    receiver_type: str
    host: str
    executor_id: str
    endpoint: str


@dataclass(frozen=True)
class AddBlock:
    """A supervisor reports a stored block; replied with a bool."""

    block_info: ReceivedBlockInfo


@dataclass(frozen=True)
class ReportError:
    """A receiver reports an error; one-way."""

    stream_id: int
    message: str
    error: str


@dataclass(frozen=True)
class DeregisterReceiver:
    """A supervisor says its receiver stopped; replied with True."""

    stream_id: int
    message: str
    error: str


@dataclass(frozen=True)
class LatencyCounts:
    """A latency histogram: counts per bucket of ``util.histogram.LATENCY_BUCKETS_S``, sum."""

    counts: tuple[int, ...]
    sum_s: float


@dataclass(frozen=True)
class ReportReceiverMetrics:
    """A supervisor's counters since it started (``session``), every report interval; one-way.

    Counts are totals of the session (the driver adds the sessions of a receiver up);
    ``rate_limit``/``max_rate`` None mean unlimited; ``throttled_s`` is the time
    ``store()`` waited for rate-limit tokens or for room in the block queue.
    """

    stream_id: int
    session: int
    executor_id: str
    records: int
    bytes: int
    blocks: int
    blocks_refused: int
    records_refused: int
    rate_limit: float | None
    max_rate: float | None
    throttled_s: float
    bad_records: int
    bad_record_policy: str
    store_memory_bytes: int
    store_disk_bytes: int
    store_blocks: int
    add_block_latency: LatencyCounts
    wal_write_latency: LatencyCounts


# --- remote messages to the tracker from a Structured Streaming reader --------


@dataclass(frozen=True)
class DescribeStream:
    """Which stream ``stream`` (an id or a receiver name) is; replied with id, name, schema."""

    stream: str


@dataclass(frozen=True)
class StreamOffsets:
    """The block log's ``base`` and ``end`` and the records ``queued`` after it."""

    stream_id: int


@dataclass(frozen=True)
class AllocateOffsets:
    """Append the queued blocks to the log; reply with the end offset (``max_records`` -1: all)."""

    stream_id: int
    start: int
    max_records: int


@dataclass(frozen=True)
class GetOffsetRange:
    """The blocks of ``[start, end)``: replied with ``[block info, first row, rows]`` items."""

    stream_id: int
    start: int
    end: int


@dataclass(frozen=True)
class CommitOffsets:
    """A query committed the stream up to ``end``; replied with True."""

    stream_id: int
    end: int


# --- remote messages to a supervisor (executor) -----------------------------


@dataclass(frozen=True)
class StopReceiver:
    """Stop the receiver for good."""


@dataclass(frozen=True)
class CleanupOldBlocks:
    """Drop blocks (and WAL segments) generated before ``threshold_ms``."""

    threshold_ms: int


@dataclass(frozen=True)
class RemoveBlocks:
    """Drop these blocks from the block store: their batch completed."""

    block_ids: tuple[str, ...]


@dataclass(frozen=True)
class UpdateRateLimit:
    """Set the rate limit of every block generator of the receiver (records/s)."""

    rate: float


@dataclass(frozen=True)
class ReleaseReceiver:
    """No batch will read this receiver's blocks any more: drop them and end the task.

    Sent when the context stops, after the last batch; it implies ``StopReceiver``.
    """


TrackerMessage = (
    RegisterReceiver
    | AddBlock
    | ReportError
    | DeregisterReceiver
    | ReportReceiverMetrics
    | DescribeStream
    | StreamOffsets
    | AllocateOffsets
    | GetOffsetRange
    | CommitOffsets
)
SupervisorMessage = (
    StopReceiver | CleanupOldBlocks | RemoveBlocks | UpdateRateLimit | ReleaseReceiver
)

TRACKER_MESSAGES: tuple[type, ...] = typing.get_args(TrackerMessage)
SUPERVISOR_MESSAGES: tuple[type, ...] = typing.get_args(SupervisorMessage)

T = TypeVar("T")


def encode(message: Any) -> bytes:
    """Encode a message dataclass as JSON bytes."""
    return json.dumps(dataclasses.asdict(message), separators=(",", ":")).encode()


def decode(kind: str, body: bytes, allowed: tuple[type, ...], max_bytes: int) -> Any:
    """Decode ``body`` as the message named ``kind`` among ``allowed``.

    Raises :class:`RpcError` naming what was wrong: an unknown type, an oversized
    body, invalid JSON, a missing, unknown or mistyped field.
    """
    if len(body) > max_bytes:
        msg = f"{kind} message of {len(body)} bytes exceeds max_message_bytes={max_bytes}"
        raise RpcError(msg)
    cls = next((c for c in allowed if c.__name__ == kind), None)
    if cls is None:
        names = ", ".join(c.__name__ for c in allowed)
        msg = f"unknown message type {kind[:80]!r}; this endpoint accepts {names}"
        raise RpcError(msg)
    try:
        raw = json.loads(body.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as e:
        msg = f"{kind} body is not valid JSON: {e}"
        raise RpcError(msg) from None
    return _build(cls, raw, kind)


def _build(cls: type[T], raw: Any, where: str) -> T:
    if not isinstance(raw, dict):
        msg = f"{where} must be a JSON object, got {type(raw).__name__}"
        raise RpcError(msg)
    hints, fields = _shape(cls)
    unknown = set(raw) - set(fields)
    if unknown:
        msg = f"{where} has unknown field(s) {sorted(unknown)[:5]}"
        raise RpcError(msg)
    values = {}
    for name, f in fields.items():
        if name not in raw:
            if f.default is not dataclasses.MISSING:
                continue
            msg = f"{where} is missing field {name!r}"
            raise RpcError(msg)
        values[name] = _check(hints[name], raw[name], f"{where}.{name}")
    return cls(**values)


_Shape = tuple[dict[str, Any], dict[str, dataclasses.Field[Any]]]
_SHAPES: dict[type, _Shape] = {}


def _shape(cls: type) -> _Shape:
    """A message class's resolved field types and fields (resolving types is slow: once)."""
    shape = _SHAPES.get(cls)
    if shape is None:
        fields = {f.name: f for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
        shape = _SHAPES[cls] = (typing.get_type_hints(cls), fields)
    return shape


_SCALAR_CHECKS: dict[Any, Callable[[Any], bool]] = {
    int: lambda v: isinstance(v, int) and not isinstance(v, bool),
    float: lambda v: isinstance(v, int | float) and not isinstance(v, bool),
    str: lambda v: isinstance(v, str),
    bool: lambda v: isinstance(v, bool),
}


def _check(tp: Any, value: Any, where: str) -> Any:
    origin = typing.get_origin(tp)
    if origin in (Union, types.UnionType):
        args = typing.get_args(tp)
        if value is None and type(None) in args:
            return None
        inner = [a for a in args if a is not type(None)]
        return _check(inner[0], value, where)
    if dataclasses.is_dataclass(tp):
        return _build(tp, value, where)  # type: ignore[arg-type]
    if origin is tuple:
        (item,) = typing.get_args(tp)[:1]
        if not isinstance(value, list):
            msg = f"{where} must be a list, got {type(value).__name__}"
            raise RpcError(msg)
        return tuple(_check(item, v, f"{where}[]") for v in value)
    if origin is dict:
        if not isinstance(value, dict):
            msg = f"{where} must be an object, got {type(value).__name__}"
            raise RpcError(msg)
        return value
    ok = _SCALAR_CHECKS.get(tp)
    if ok is None or not ok(value):
        msg = f"{where} must be {getattr(tp, '__name__', tp)}, got {value!r:.60}"
        raise RpcError(msg)
    return float(value) if tp is float else value


def json_reply(value: Any) -> bytes:
    """Encode a handler's reply (None, bool, number, str, list or dict) as JSON."""
    return json.dumps(value, separators=(",", ":")).encode()


def json_unreply(body: bytes) -> Any:
    """Decode a reply encoded by :func:`json_reply`."""
    return json.loads(body.decode("utf-8"))
