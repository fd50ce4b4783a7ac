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

    ``store_endpoint`` is the ``host:port`` of the block store holding the first
    copy (the block keeper on the receiver's executor; None when the block is
    known to be in no store, e.g. after recovery) and ``replica_endpoints`` those
    of the other copies, on other executors; ``wal_handle`` is the block's
    write-ahead log record when the receiver WAL is on.
    """

    stream_id: int
    block_id: str
    num_records: int
    generated_ms: int
    store_endpoint: str | None
    size_bytes: int = 0
    wal_handle: dict[str, Any] | None = None
    metadata: dict[str, Any] | None = None
    replica_endpoints: tuple[str, ...] = ()

    @property
    def locations(self) -> tuple[str, ...]:
        """Every block store holding a copy, the first copy first."""
        if self.store_endpoint is None:
            return self.replica_endpoints
        return (self.store_endpoint, *self.replica_endpoints)

    @staticmethod
    def from_dict(raw: dict[str, Any]) -> ReceivedBlockInfo:
        """A block info from its JSON form (as written by ``asdict`` or the driver WAL)."""
        replicas = raw.get("replica_endpoints")
        if replicas is not None and not isinstance(replicas, tuple):
            raw = {**raw, "replica_endpoints": tuple(replicas)}
        return ReceivedBlockInfo(**raw)

    def without_store(self) -> ReceivedBlockInfo:
        """The block as known after recovery: in no block store, only in the WAL."""
        if self.store_endpoint is None and not self.replica_endpoints:
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
class AddBlocks:
    """A supervisor reports stored blocks, in the order it stored them.

    Replied with one bool per block, in the same order. The blocks that piled up
    while the previous call was in flight travel together (see
    ``receiver/block_reporter.py``).
    """

    block_infos: tuple[ReceivedBlockInfo, ...]


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
class RegisterBlockKeeper:
    """A block keeper serves blocks on executor ``executor_id``; replied with True."""

    executor_id: str
    host: str
    endpoint: str


@dataclass(frozen=True)
class GetReplicaTargets:
    """Block keepers on executors other than ``executor_id``; replied with their endpoints."""

    stream_id: int
    executor_id: str


@dataclass(frozen=True)
class ReportReplication:
    """A receiver's blocks now have ``achieved`` of ``wanted`` copies; one-way."""

    stream_id: int
    wanted: int
    achieved: int
    message: str


@dataclass(frozen=True)
class ReportLostBlock:
    """A batch read skipped a block in no store (``lostBlockPolicy=skip``); one-way."""

    stream_id: int
    block_id: str
    num_records: int
    reason: str


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


# --- remote messages to a block keeper (executor) ----------------------------


@dataclass(frozen=True)
class ReleaseKeeper:
    """No batch will read this keeper's blocks any more: drop them all and exit."""


@dataclass(frozen=True)
class DescribeKeeper:
    """How many blocks and bytes the keeper holds; replied with a dict."""


TrackerMessage = (
    RegisterReceiver
    | AddBlock
    | AddBlocks
    | ReportError
    | DeregisterReceiver
    | RegisterBlockKeeper
    | GetReplicaTargets
    | ReportReplication
    | ReportLostBlock
    | DescribeStream
    | StreamOffsets
    | AllocateOffsets
    | GetOffsetRange
    | CommitOffsets
)
SupervisorMessage = (
    StopReceiver | CleanupOldBlocks | RemoveBlocks | UpdateRateLimit | ReleaseReceiver
)

KeeperMessage = RemoveBlocks | ReleaseKeeper | DescribeKeeper

TRACKER_MESSAGES: tuple[type, ...] = typing.get_args(TrackerMessage)
KEEPER_MESSAGES: tuple[type, ...] = typing.get_args(KeeperMessage)
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
    checks, required = _shape(cls)
    if not raw.keys() <= checks.keys():
        unknown = set(raw) - set(checks)
        msg = f"{where} has unknown field(s) {sorted(unknown)[:5]}"
        raise RpcError(msg)
    values = {}
    for name, check in checks.items():  # in field order: the first problem is reported
        if name in raw:
            values[name] = check(raw[name], where, name)
        elif name in required:
            msg = f"{where} is missing field {name!r}"
            raise RpcError(msg)
    return cls(**values)


Check = Callable[[Any, str, str], Any]
"""Checks (and converts) one field's JSON value: ``check(value, where, field_name)``."""
_SHAPES: dict[type, tuple[dict[str, Check], frozenset[str]]] = {}


def _shape(cls: type) -> tuple[dict[str, Check], frozenset[str]]:
    """A message class's field checks (by name, in field order) and its required fields.

    Built once per class: resolving type hints is slow, and a check made for its type is
    several times cheaper per message than walking the type on every decode (the tracker
    decodes thousands of block infos a second).
    """
    shape = _SHAPES.get(cls)
    if shape is None:
        hints = typing.get_type_hints(cls)
        fields = dataclasses.fields(cls)  # type: ignore[arg-type]
        checks = {f.name: _compile(hints[f.name]) for f in fields}
        required = frozenset(
            f.name
            for f in fields
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
        )
        shape = _SHAPES[cls] = (checks, required)
    return shape


_SCALAR_CHECKS: dict[Any, Callable[[Any], bool]] = {
    int: lambda v: type(v) is int or (isinstance(v, int) and not isinstance(v, bool)),
    float: lambda v: isinstance(v, int | float) and not isinstance(v, bool),
    str: lambda v: type(v) is str,
    bool: lambda v: isinstance(v, bool),
}


def _compile(tp: Any) -> Check:
    """The check of a field typed ``tp`` (see :data:`Check`)."""
    origin = typing.get_origin(tp)
    if origin in (Union, types.UnionType):
        args = typing.get_args(tp)
        inner = _compile(next(a for a in args if a is not type(None)))
        if type(None) not in args:
            return inner
        return lambda v, where, name: None if v is None else inner(v, where, name)
    if dataclasses.is_dataclass(tp):
        return lambda v, where, name: _build(tp, v, f"{where}.{name}")  # type: ignore[arg-type]
    if origin is tuple:
        item = _compile(typing.get_args(tp)[0])

        def check_tuple(v: Any, where: str, name: str) -> tuple[Any, ...]:
            if not isinstance(v, list):
                msg = f"{where}.{name} must be a list, got {type(v).__name__}"
                raise RpcError(msg)
            return tuple(item(x, f"{where}.{name}", "[]") for x in v)

        return check_tuple
    if origin is dict:

        def check_dict(v: Any, where: str, name: str) -> Any:
            if not isinstance(v, dict):
                msg = f"{where}.{name} must be an object, got {type(v).__name__}"
                raise RpcError(msg)
            return v

        return check_dict
    ok = _SCALAR_CHECKS.get(tp)
    type_name = getattr(tp, "__name__", str(tp))

    def check_scalar(v: Any, where: str, name: str) -> Any:
        if ok is None or not ok(v):
            msg = f"{where}.{name} must be {type_name}, got {v!r:.60}"
            raise RpcError(msg)
        return float(v) if tp is float else v

    return check_scalar


def json_reply(value: Any) -> bytes:
    """Encode a handler's reply (None, bool, number, str, list or dict) as JSON."""
    return json.dumps(value, separators=(",", ":")).encode()


def json_unreply(body: bytes) -> Any:
    """Decode a reply encoded by :func:`json_reply`."""
    return json.loads(body.decode("utf-8"))
