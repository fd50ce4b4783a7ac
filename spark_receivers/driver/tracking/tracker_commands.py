"""Driver-local commands of the receiver tracker, apart from the remote messages.

Spark keeps ``ReceiverTrackerLocalMessage`` apart from the messages receivers
send; so do we: these never cross the wire. ``ReceiverTracker.run`` takes them
from any driver thread; what they send to receivers goes through the tracker's
outbox, never under its lock.
"""

from __future__ import annotations

from dataclasses import dataclass

from spark_receivers.rpc.messages import ReceivedBlockInfo


@dataclass(frozen=True)
class StopAllReceivers:
    """Refuse registrations and send ``StopReceiver`` to every running receiver."""


@dataclass(frozen=True)
class ReleaseAllReceivers:
    """Send ``ReleaseReceiver`` to every supervisor: no batch will read its blocks any more."""


@dataclass(frozen=True)
class AllReceiverIds:
    """Ids of the receivers that are not INACTIVE."""


@dataclass(frozen=True)
class GetAllReceiverInfo:
    """Tracking info of every receiver."""


@dataclass(frozen=True)
class UpdateReceiverRateLimit:
    """Set the rate limit of the receiver of ``stream_id`` (records/s)."""

    stream_id: int
    rate: float


@dataclass(frozen=True)
class CleanupOldBlocks:
    """Tell every receiver to drop WAL segments older than ``threshold_ms``."""

    threshold_ms: int


@dataclass(frozen=True)
class RemoveBlocks:
    """Tell the block stores holding these blocks to drop them (their batch completed)."""

    blocks: tuple[ReceivedBlockInfo, ...]


TrackerCommand = (
    StopAllReceivers
    | ReleaseAllReceivers
    | AllReceiverIds
    | GetAllReceiverInfo
    | UpdateReceiverRateLimit
    | CleanupOldBlocks
    | RemoveBlocks
)
