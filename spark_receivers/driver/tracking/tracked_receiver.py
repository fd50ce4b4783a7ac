"""What the receiver tracker keeps about one receiver, and the changes it goes through.

Not thread-safe on its own: the
:class:`~spark_receivers.driver.tracking.receiver_tracker.ReceiverTracker` holds its
lock around every call. The scheduling part of the state is Spark's
:class:`ReceiverTrackingInfo` (an immutable snapshot replaced on every change).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

from spark_receivers.driver.observe.listener import ReceiverInfo
from spark_receivers.driver.observe.status import ReceiverStatus
from spark_receivers.driver.tracking.restart_policy import (
    RestartCounter,
    RestartPolicy,
    give_up_error,
)
from spark_receivers.driver.tracking.scheduling_policy import (
    ExecutorCacheTaskLocation,
    ReceiverState,
    ReceiverTrackingInfo,
    TaskLocation,
)
from spark_receivers.errors import BadRecordError, RpcError
from spark_receivers.receiver.receiver import Receiver
from spark_receivers.rpc import messages as m

__all__ = ["TrackedReceiver", "accepts", "check_block"]


def check_block(
    info: m.ReceivedBlockInfo, check_wal_handle: Callable[[m.ReceivedBlockInfo], None] | None
) -> None:
    """Refuse (:class:`RpcError`) a block from the network that is not well formed.

    Its id must be one of its stream's, its counts non-negative, and a WAL handle is
    only accepted with the receiver WAL on (``check_wal_handle`` then vets it).
    """
    block_id = m.StreamBlockId.parse(info.block_id)
    if block_id.stream_id != info.stream_id:
        msg = f"block {info.block_id} does not belong to stream {info.stream_id}"
        raise RpcError(msg)
    if info.num_records < 0 or info.size_bytes < 0:
        msg = f"block {info.block_id} has a negative record count or size"
        raise RpcError(msg)
    if info.wal_handle is not None:
        if check_wal_handle is None:
            msg = f"block {info.block_id} has a WAL handle but the receiver WAL is not enabled"
            raise RpcError(msg)
        check_wal_handle(info)


@dataclasses.dataclass
class TrackedReceiver:
    """One receiver as the driver tracks it: placement, registration, counts, last error."""

    receiver: Receiver
    info: ReceiverTrackingInfo
    host: str | None = None
    error: str = ""
    """The last error with its traceback."""
    records: int = 0
    blocks: int = 0
    jobs: int = 0
    rate_limit: float | None = None
    restarts: RestartCounter = dataclasses.field(
        default_factory=lambda: RestartCounter(RestartPolicy())
    )
    """Its recent failures under the restart policy."""
    anywhere: bool = False
    """Its running job may register from any executor (the launcher's last placement try
    on Spark Connect, which cannot place a task); until that job ends."""

    @classmethod
    def of(cls, receiver: Receiver, policy: RestartPolicy | None = None) -> TrackedReceiver:
        """A receiver not yet scheduled, restarted under ``policy`` (default: the defaults)."""
        return cls(
            receiver,
            ReceiverTrackingInfo(
                receiver.stream_id, ReceiverState.INACTIVE, None, None, receiver.name
            ),
            restarts=RestartCounter(policy or RestartPolicy()),
        )

    @property
    def state(self) -> ReceiverState:
        """INACTIVE, SCHEDULED or ACTIVE."""
        return self.info.state

    @property
    def active_endpoint(self) -> str | None:
        """Its supervisor's endpoint while it is ACTIVE."""
        return self.info.endpoint if self.info.state is ReceiverState.ACTIVE else None

    def schedule(self, locations: Sequence[TaskLocation]) -> None:
        """SCHEDULED on ``locations`` (INACTIVE when there are none)."""
        state = ReceiverState.SCHEDULED if locations else ReceiverState.INACTIVE
        self.info = dataclasses.replace(
            self.info,
            state=state,
            scheduled_locations=tuple(locations) or None,
            running_executor=None,
        )

    def locations_alive(self, executors: Sequence[ExecutorCacheTaskLocation]) -> list[TaskLocation]:
        """Its scheduled locations that are still alive (host locations always are)."""
        return [
            loc
            for loc in self.info.scheduled_locations or ()
            if not isinstance(loc, ExecutorCacheTaskLocation) or loc in executors
        ]

    def unschedule(self) -> None:
        """INACTIVE with no locations (so that rescheduling does not weigh it)."""
        self.info = dataclasses.replace(
            self.info, state=ReceiverState.INACTIVE, scheduled_locations=None, running_executor=None
        )

    def activate(self, host: str, executor_id: str, endpoint: str) -> None:
        """ACTIVE: it registered from ``executor_id`` and serves at ``endpoint``."""
        self.info = dataclasses.replace(
            self.info,
            state=ReceiverState.ACTIVE,
            running_executor=ExecutorCacheTaskLocation(host, executor_id),
            endpoint=endpoint,
        )
        self.host = host

    def deactivate(self) -> None:
        """INACTIVE: it stopped, or its task ended."""
        self.info = dataclasses.replace(
            self.info, state=ReceiverState.INACTIVE, running_executor=None
        )

    def launching(self) -> bool:
        """A job of it starts (counted; it runs again); False once it must not run any more."""
        if self.restarts.gave_up:
            return False
        self.restarts.running()
        self.jobs += 1
        return True

    def failed(self, time_ms: int, message: str, bad_record: bool = False) -> Exception | None:
        """Count a failure (``message``: why); past the policy, the error to fail with.

        A bad record under ``fail`` is that error at once: a restart would meet it again.
        """
        if bad_record:
            self.restarts.gave_up = True  # never registered or relaunched again
            return BadRecordError(
                f"receiver {self.info.receiver_id} ({self.receiver.name}) stopped for good "
                f"(bad_record_policy=fail) and is not restarted: {message}"
            )
        if not self.restarts.failed(time_ms):
            return None
        return give_up_error(self.info.receiver_id, self.receiver.name, self.restarts, message)

    def record_error(self, message: str, error: str, time_ms: int) -> None:
        """Remember the last error: one line, and the whole text with its traceback."""
        self.info = dataclasses.replace(self.info, error_message=message, error_time_ms=time_ms)
        self.error = error

    def to_info(self) -> ReceiverInfo:
        """The listener view."""
        executor = self.info.running_executor
        return ReceiverInfo(
            stream_id=self.info.receiver_id,
            name=self.receiver.name,
            active=self.info.state is ReceiverState.ACTIVE,
            location=self.host,
            executor_id=executor.executor_id if executor else None,
            last_error_message=self.info.error_message or "",
            last_error=self.error,
            last_error_time_ms=_or_minus_one(self.info.error_time_ms),
        )

    def to_status(self) -> ReceiverStatus:
        """The status view."""
        executor = self.info.running_executor
        return ReceiverStatus(
            stream_id=self.info.receiver_id,
            name=self.receiver.name,
            state=self.info.state.name,
            executor_id=executor.executor_id if executor else None,
            host=self.host,
            endpoint=self.info.endpoint,
            records=self.records,
            blocks=self.blocks,
            jobs=self.jobs,
            scheduled_locations=tuple(str(x) for x in self.info.scheduled_locations or ()),
            rate_limit=self.rate_limit,
            last_error_message=self.info.error_message or "",
            last_error=self.error,
            last_error_time_ms=_or_minus_one(self.info.error_time_ms),
        )


def _or_minus_one(value: int | None) -> int:
    return -1 if value is None else value


def accepts(location: TaskLocation, host: str, executor_id: str) -> bool:
    """True when a receiver registering from ``executor_id`` on ``host`` fits ``location``."""
    if isinstance(location, ExecutorCacheTaskLocation):
        return location.executor_id == executor_id
    return location.host == host
