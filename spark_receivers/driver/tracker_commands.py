"""Driver-local commands of the receiver tracker, apart from the remote messages.

Spark keeps ``ReceiverTrackerLocalMessage`` apart from the messages receivers
send; so do we: these never cross the wire, and the tracker runs them one at a
time under its lock (``ReceiverTracker.run``).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class StartAllReceivers:
    """Schedule every receiver and launch its job."""


@dataclass(frozen=True)
class RestartReceiver:
    """Relaunch a receiver whose job ended: on its old executors if alive, else rescheduled."""

    stream_id: int


@dataclass(frozen=True)
class StopAllReceivers:
    """Send ``StopReceiver`` to every registered receiver."""


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
    """Tell every receiver to drop blocks (and WAL segments) older than ``threshold_ms``."""

    threshold_ms: int


TrackerCommand = (
    StartAllReceivers
    | RestartReceiver
    | StopAllReceivers
    | AllReceiverIds
    | GetAllReceiverInfo
    | UpdateReceiverRateLimit
    | CleanupOldBlocks
)
