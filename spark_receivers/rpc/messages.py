"""The messages that cross the wire, as frozen dataclasses in closed sets.

Remote messages to the driver's tracker (:data:`TrackerMessage`) and to a
receiver's supervisor (:data:`SupervisorMessage`). What Spark sends as
``ReceiverTrackerLocalMessage`` are plain method calls of the driver's
``ReceiverTracker`` here: they never cross the wire.

Encoding is JSON with a fixed schema (:mod:`spark_receivers.rpc.codec`): a
message is checked against the classes an endpoint accepts, field by field.
Nothing received is ever unpickled or evaluated.
"""

from __future__ import annotations

import re
import typing
from dataclasses import dataclass
from typing import Any

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
    write-ahead log record when the receiver WAL is on. ``position`` is the source
    position the block covers, as the receiver wrote it with ``store(..., position=...)``
    (opaque to the driver: a Redis entry id, a file offset...); None when it gave none.
    ``local_file`` is the first copy's file in its keeper's spool (Arrow IPC, or Parquet in
    local mode): a read on that host reads it while the keeper lives, instead of fetching
    the block (``receiver/block_spool.py``); None when the first copy went by a put.
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
    position: str | None = None
    local_file: str | None = None

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

    def to_dict(self) -> dict[str, Any]:
        """The fields as a JSON-friendly dict: what :meth:`from_dict` reads back.

        Spelled out rather than ``dataclasses.asdict``, which deep-copies every value
        and made logging 100,000 blocks five times slower; the two dict fields
        (``wal_handle``, ``metadata``) are JSON values already and are not copied.
        """
        raw: dict[str, Any] = {
            "stream_id": self.stream_id,
            "block_id": self.block_id,
            "num_records": self.num_records,
            "generated_ms": self.generated_ms,
            "store_endpoint": self.store_endpoint,
            "size_bytes": self.size_bytes,
            "wal_handle": self.wal_handle,
            "metadata": self.metadata,
        }
        if self.replica_endpoints:
            raw["replica_endpoints"] = list(self.replica_endpoints)
        if self.position is not None:
            raw["position"] = self.position
        if self.local_file is not None:
            raw["local_file"] = self.local_file
        return raw

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
            (),
            self.position,
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
class GetAcceptedPosition:
    """The last source position the driver accepted for ``stream_id``; replied with it or None.

    A (re)starting receiver asks it to resume after what is already stored: the
    position of the newest block it reported with one (``store(..., position=...)``),
    kept in the driver WAL, so it survives a driver restart with ``get_or_create``.
    """

    stream_id: int


@dataclass(frozen=True)
class ReportError:
    """A receiver reports an error; one-way."""

    stream_id: int
    message: str
    error: str


@dataclass(frozen=True)
class DeregisterReceiver:
    """A supervisor says its receiver stopped; replied with True.

    ``bad_record``: it stopped for good on a bad record under
    ``bad_record_policy='fail'`` (a restart would meet it again): the driver does not
    restart it and fails the context.
    """

    stream_id: int
    message: str
    error: str
    bad_record: bool = False


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


# --- remote messages to a block keeper (executor) ----------------------------


@dataclass(frozen=True)
class ReleaseKeeper:
    """No batch will read this keeper's blocks any more: drop them all and exit."""


@dataclass(frozen=True)
class DescribeKeeper:
    """How many blocks and bytes the keeper holds; replied with a dict."""


@dataclass(frozen=True)
class AdoptBlock:
    """Keep the block a receiver on this host wrote as an Arrow IPC file in the keeper's spool.

    ``file`` is the file's name in the spool directory the keeper told (no path). The keeper
    maps it and keeps the mapped table as it keeps a block sent by ``do_put``, and the file
    until the block is removed (read tasks of the host map it); replied with True. The file
    is the receiver's until the reply: a refusal leaves it there.
    """

    block_id: str
    generated_ms: int
    use_disk: bool
    file: str


TrackerMessage = (
    RegisterReceiver
    | AddBlock
    | AddBlocks
    | GetAcceptedPosition
    | ReportError
    | DeregisterReceiver
    | RegisterBlockKeeper
    | GetReplicaTargets
    | ReportReplication
    | ReportLostBlock
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

KeeperMessage = RemoveBlocks | ReleaseKeeper | DescribeKeeper | AdoptBlock

TRACKER_MESSAGES: tuple[type, ...] = typing.get_args(TrackerMessage)
KEEPER_MESSAGES: tuple[type, ...] = typing.get_args(KeeperMessage)
SUPERVISOR_MESSAGES: tuple[type, ...] = typing.get_args(SupervisorMessage)
