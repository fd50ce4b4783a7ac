"""The driver's receiver tracker: receiver states, registration, the RPC handler.

Spark's ReceiverTracker and its endpoint, without Spark inside: built from plain
parts (the receivers, a :class:`ReceivedBlockTracker`, a :class:`Launcher` that
runs receiver jobs — on Spark the ``ReceiverLauncher`` —, a :class:`ReceiverOutbox`
that talks to the supervisors), unit-tested with a fake launcher and ``ManualClock``.

:meth:`ReceiverTracker.handle` answers the receivers' remote messages
(``RegisterReceiver``, ``AddBlock``/``AddBlocks``, ``ReportError``,
``DeregisterReceiver``) on gRPC threads; driver threads call its methods
(``stop_receivers``, ``update_rate_limit``, ``remove_blocks``...) directly.
Placement follows the :class:`ReceiverSchedulingPolicy`: a registration from an
executor the receiver was not scheduled on is refused; a receiver whose job
ended is relaunched on its old executors if they are alive, else rescheduled.
Failures are counted under a :class:`RestartPolicy`: a receiver that fails too
often is not run again and the context fails with the cause.

**No network call under the lock.** One lock guards the receivers' states, held only for
bookkeeping. Messages to receivers are snapshotted under it and handed to the outbox, which
sends them on threads of its own; calls to the launcher (which may ask the JVM which
executors are alive) happen outside it: a receiver that never answers delays only its own.

States: ``INITIALIZED`` → ``STARTED`` → ``STOPPING`` (receivers told to stop;
registrations refused) → ``STOPPED``.

**Starting.** A receiver's start is *settled* once it registered, once a job of it
ended (it failed, or was refused), or once the restart policy gave up on it;
:meth:`ReceiverTracker.wait_receivers_started` waits for every receiver's. A restarted
context holds the batches it redoes until then, and a graceful stop lets receivers that
are still starting finish (both bounded by ``spark.receivers.receiver.startTimeout``).
"""

from __future__ import annotations

import enum
import logging
import threading
from collections import defaultdict
from collections.abc import Callable, Sequence
from typing import Any

from spark_receivers.driver.batches.received_block_tracker import ReceivedBlockTracker
from spark_receivers.driver.observe.listener import (
    ListenerBus,
    ReceiverReportedError,
    ReceiverStarted,
    ReceiverStopped,
)
from spark_receivers.driver.observe.status import ReceiverStatus
from spark_receivers.driver.tracking.receiver_launcher import Launcher, ReceiverJobs
from spark_receivers.driver.tracking.receiver_outbox import ReceiverOutbox
from spark_receivers.driver.tracking.restart_policy import RestartPolicy
from spark_receivers.driver.tracking.scheduling_policy import (
    ReceiverSchedulingPolicy,
    ReceiverState,
    ReceiverTrackingInfo,
    TaskLocation,
)
from spark_receivers.driver.tracking.tracked_receiver import TrackedReceiver, accepts, check_block
from spark_receivers.errors import RpcError, StateError
from spark_receivers.receiver.receiver import Receiver
from spark_receivers.rpc import messages as m
from spark_receivers.util.clock import Clock, SystemClock

log = logging.getLogger(__name__)

__all__ = ["Launcher", "ReceiverJobs", "ReceiverState", "ReceiverTracker", "TrackerState"]


class TrackerState(enum.Enum):
    """Lifecycle of the tracker."""

    INITIALIZED = 0
    STARTED = 1
    STOPPING = 2
    STOPPED = 3


class ReceiverTracker:
    """Places, watches and stops the receivers; see the module doc. Thread-safe.

    ``check_wal_handle(info)`` vets the write-ahead log handle of a block from the
    network (raises :class:`RpcError` when it points outside the receiver WAL);
    None refuses every handle (no receiver WAL). A receiver that fails more often
    than ``restart_policy`` allows is not run again and ``on_fatal(error)`` is
    called (off the lock) with why: the context fails with it.
    """

    def __init__(
        self,
        receivers: Sequence[Receiver],
        block_tracker: ReceivedBlockTracker,
        bus: ListenerBus,
        launcher: Launcher,
        outbox: ReceiverOutbox,
        clock: Clock | None = None,
        policy: ReceiverSchedulingPolicy | None = None,
        check_wal_handle: Callable[[m.ReceivedBlockInfo], None] | None = None,
        restart_policy: RestartPolicy | None = None,
        on_fatal: Callable[[BaseException], None] | None = None,
    ) -> None:
        self._block_tracker = block_tracker
        self._bus = bus
        self._launcher = launcher
        self._outbox = outbox
        self._clock = clock or SystemClock()
        self._policy = policy or ReceiverSchedulingPolicy()
        self._check_wal_handle = check_wal_handle
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self._receivers = {r.stream_id: TrackedReceiver.of(r, restart_policy) for r in receivers}
        self._on_fatal = on_fatal
        self._endpoints: set[str] = set()
        """Every supervisor endpoint that registered: they may still serve blocks."""
        self._settled: set[int] = set()
        """Receivers whose start is settled (see the module doc)."""
        self.started_at_ms: int | None = None
        """When :meth:`start` launched the receivers (on the tracker's clock)."""
        self._state = TrackerState.INITIALIZED

    # --- lifecycle ----------------------------------------------------------

    @property
    def state(self) -> TrackerState:
        """The tracker's lifecycle state."""
        return self._state

    def start(self) -> None:
        """Place every receiver and launch its job."""
        with self._lock:
            if self._state is not TrackerState.INITIALIZED:
                msg = f"cannot start the receiver tracker in state {self._state.name}"
                raise StateError(msg)
            self._state = TrackerState.STARTED
            self.started_at_ms = self._clock.get_time_ms()
        if not self._receivers:
            return
        executors = self._launcher.alive_executors()
        placement = self._policy.schedule_receivers(
            [r.receiver for r in self._receivers.values()], executors
        )
        log.info(
            "scheduled receivers %s on executors %s",
            {s: [str(loc) for loc in locs] for s, locs in placement.items()},
            [str(e) for e in executors],
        )
        with self._lock:
            for sid, locations in placement.items():
                self._receivers[sid].schedule(locations)
        for sid in placement:
            self._launcher.launch(sid, self)

    def stop_receivers(self) -> None:
        """Refuse registrations from now on and tell every running receiver to stop.

        Receivers stop receiving, push their last blocks, deregister and then keep
        serving their blocks until :meth:`release_receivers`.
        """
        with self._lock:
            if self._state is TrackerState.INITIALIZED:
                self._state = TrackerState.STOPPED
                return
            if self._state is not TrackerState.STARTED:
                return
            self._state = TrackerState.STOPPING
            endpoints = self._active_endpoints()
            self._changed.notify_all()
        for endpoint in endpoints:
            self._outbox.send(endpoint, m.StopReceiver())

    def wait_receivers_started(self, timeout_s: float | None) -> bool:
        """Wait until every receiver's start is settled (see the module doc); False on timeout.

        Returns at once (True) when the tracker is not running: stopping, nothing waits
        for a receiver to start.
        """
        with self._changed:
            return self._changed.wait_for(self._all_settled, timeout_s)

    def _all_settled(self) -> bool:
        """Under the lock."""
        return self._state is not TrackerState.STARTED or self._settled >= set(self._receivers)

    def starting_receivers(self) -> list[int]:
        """The receivers whose start is not settled yet."""
        with self._lock:
            return sorted(set(self._receivers) - self._settled)

    def wait_receivers_stopped(self, timeout_s: float | None) -> bool:
        """Wait until no receiver is ACTIVE (they deregistered); False on timeout."""
        with self._changed:
            return self._changed.wait_for(
                lambda: all(r.state is not ReceiverState.ACTIVE for r in self._receivers.values()),
                timeout_s,
            )

    def release_receivers(self) -> None:
        """Tell every supervisor that ever registered that no batch will read its blocks."""
        with self._lock:
            endpoints = sorted(self._endpoints)
        for endpoint in endpoints:
            self._outbox.send(endpoint, m.ReleaseReceiver())

    def stop(self) -> None:
        """The final state: nothing is answered any more; idempotent."""
        with self._lock:
            still_active = [
                s for s, r in self._receivers.items() if r.state is ReceiverState.ACTIVE
            ]
            self._state = TrackerState.STOPPED
            self._changed.notify_all()
        if still_active:
            log.warning("receivers %s did not deregister before the tracker stopped", still_active)

    # --- commands to receivers (sent by the outbox, never under the lock) ------

    def update_rate_limit(self, stream_id: int, rate: float) -> None:
        """Send ``UpdateRateLimit`` to the receiver of ``stream_id`` if it runs."""
        with self._lock:
            r = self._receivers[stream_id]
            r.rate_limit = float(rate)
            endpoint = r.active_endpoint
        if endpoint is not None:
            self._outbox.send(endpoint, m.UpdateRateLimit(float(rate)))

    def cleanup_old_blocks(self, threshold_ms: int) -> None:
        """Tell every running receiver to drop WAL segments older than ``threshold_ms``."""
        with self._lock:
            endpoints = self._active_endpoints()
        for endpoint in endpoints:
            self._outbox.send(endpoint, m.CleanupOldBlocks(threshold_ms))

    def remove_blocks(self, blocks: Sequence[m.ReceivedBlockInfo]) -> None:
        """Tell every block store holding a copy of these blocks to drop it (never blocks)."""
        by_endpoint: dict[str, list[str]] = defaultdict(list)
        for b in blocks:
            for endpoint in b.locations:
                by_endpoint[endpoint].append(b.block_id)
        for endpoint, names in by_endpoint.items():
            self._outbox.send(endpoint, m.RemoveBlocks(tuple(names)))

    # --- what the launcher asks (ReceiverJobs) -----------------------------------

    def job_starting(self, stream_id: int) -> Sequence[TaskLocation] | None:
        """Count a launch of the receiver's job; where to run it (None: do not)."""
        with self._lock:
            if self._state is not TrackerState.STARTED:
                return None
            r = self._receivers[stream_id]
            if not r.launching():
                self._settle(stream_id)
                return None
            return list(r.info.scheduled_locations or ())

    def job_ended(self, stream_id: int, failure: str, detail: str = "") -> None:
        """Bookkeeping when a receiver's job ended; an error unless it deregistered first.

        ``failure`` is '' for a job that ended, else one line saying why it failed;
        ``detail`` the whole error with its traceback (kept as ``last_error``).
        """
        with self._lock:
            r = self._receivers[stream_id]
            r.anywhere = False
            vanished = r.state is ReceiverState.ACTIVE
            executor = r.info.running_executor
            if vanished or failure:
                r.deactivate()
            self._settle(stream_id)
        if vanished or failure:
            # The receiver did not deregister: its task or executor died.
            message = (
                "receiver job failed" if failure else "receiver task ended without deregistering"
            )
            where = f" on executor {executor.executor_id}" if executor else ""
            why = f": {failure}" if failure else ""
            self._record_error(stream_id, f"{message}{where}{why}", detail or failure)
            self._count_failure(stream_id, f"{message}{where}{why}")
        log.info("receiver %d job ended%s", stream_id, ": failed" if failure else "")

    def place_anywhere(self, stream_id: int) -> None:
        """Accept the receiver from whatever executor its running job lands on.

        The launcher's last placement try on Spark Connect (which cannot place a task)
        runs wherever it lands: refusing it there too would leave a receiver whose chosen
        executors have no free slot never running. Until the job ends (:meth:`job_ended`).
        """
        with self._lock:
            self._receivers[stream_id].anywhere = True

    def restart_receiver(self, stream_id: int) -> Sequence[TaskLocation] | None:
        """Where a receiver whose job ended runs next: its old executors if alive, else new ones."""
        if self._state is not TrackerState.STARTED:
            return None
        executors = self._launcher.alive_executors()
        with self._lock:
            if self._state is not TrackerState.STARTED:
                return None
            r = self._receivers[stream_id]
            old = r.locations_alive(executors)
            if old:
                locations: Sequence[TaskLocation] = old
            else:
                # Not weighing against itself: INACTIVE with no locations, then reschedule.
                r.unschedule()
                infos = {s: x.info for s, x in self._receivers.items()}
                locations = self._policy.reschedule_receiver(
                    stream_id, r.receiver.preferred_location, infos, executors
                )
            r.schedule(locations)
        log.info("restarting receiver %d on %s", stream_id, [str(loc) for loc in locations])
        return locations

    # --- the endpoint (gRPC threads) ------------------------------------------------

    def handle(self, message: m.TrackerMessage) -> Any:
        """Answer one remote message from a receiver; :class:`RpcError` when refused."""
        if self._state is TrackerState.STOPPED:
            msg = "ReceiverTracker RpcEndpoint shut down."
            raise RpcError(msg)
        match message:
            case m.AddBlock(block_info=info):
                return self._add_blocks((info,))[0]
            case m.AddBlocks(block_infos=infos):
                return self._add_blocks(infos)
            case m.GetAcceptedPosition(stream_id=sid):
                self._known(sid)
                return self._block_tracker.accepted_position(sid)
            case m.RegisterReceiver():
                return self._register(message)
            case m.DeregisterReceiver(stream_id=sid, message=text, error=error, bad_record=bad):
                return self._deregister(sid, text, error, bad)
            case m.ReportError(stream_id=sid, message=text, error=error):
                self._known(sid)
                self._record_error(sid, text, error)
                return None
        msg = f"unexpected message {message!r:.100}"
        raise RpcError(msg)

    def _known(self, stream_id: int) -> TrackedReceiver:
        r = self._receivers.get(stream_id)
        if r is None:
            msg = f"unknown stream id {stream_id}; known: {sorted(self._receivers)}"
            raise RpcError(msg)
        return r

    def _add_blocks(self, infos: Sequence[m.ReceivedBlockInfo]) -> list[bool]:
        """Validate every block first (one bad block refuses the call), then add each."""
        tracked = [self._check_block(info) for info in infos]
        accepted = self._block_tracker.add_blocks(infos)
        with self._lock:
            for r, info, ok in zip(tracked, infos, accepted, strict=True):
                if ok:
                    r.records += info.num_records
                    r.blocks += 1
        return accepted

    def _check_block(self, info: m.ReceivedBlockInfo) -> TrackedReceiver:
        r = self._known(info.stream_id)
        check_block(info, self._check_wal_handle)
        return r

    def _register(self, msg_: m.RegisterReceiver) -> bool:
        r = self._known(msg_.stream_id)
        with self._lock:
            allowed: Sequence[TaskLocation] | None = r.info.scheduled_locations
        executors = None if allowed else self._launcher.alive_executors()
        with self._lock:
            if self._state is not TrackerState.STARTED:
                log.info(
                    "refusing receiver %d: the tracker is %s", msg_.stream_id, self._state.name
                )
                return False
            if not allowed:
                infos = {s: x.info for s, x in self._receivers.items()}
                allowed = self._policy.reschedule_receiver(
                    msg_.stream_id, r.receiver.preferred_location, infos, executors or []
                )
            if r.restarts.gave_up:
                return False  # the context is failing: this receiver restarted too often
            if not r.anywhere and not any(
                accepts(loc, msg_.host, msg_.executor_id) for loc in allowed
            ):
                log.warning(
                    "refusing receiver %d from executor %s on %s: it is scheduled on %s",
                    msg_.stream_id,
                    msg_.executor_id,
                    msg_.host,
                    [str(loc) for loc in allowed],
                )
                return False
            r.activate(msg_.host, msg_.executor_id, msg_.endpoint)
            r.restarts.running()
            self._endpoints.add(msg_.endpoint)
            rate = r.rate_limit
            started = r.to_info()
        log.info(
            "registered receiver %d at %s on executor %s",
            msg_.stream_id,
            msg_.endpoint,
            msg_.executor_id,
        )
        if rate is not None:
            # A relaunched receiver starts at the rate backpressure last published.
            self._outbox.send(msg_.endpoint, m.UpdateRateLimit(rate))
        self._bus.post(ReceiverStarted(started))
        with self._lock:  # after the event: listeners see it before any batch it releases
            self._settle(msg_.stream_id)
        return True

    def _deregister(self, stream_id: int, text: str, error: str, bad_record: bool = False) -> bool:
        r = self._known(stream_id)
        with self._lock:
            r.deactivate()
            if error:
                r.record_error(text, error, self._clock.get_time_ms())
            stopped = r.to_info()
            self._changed.notify_all()
        log.log(logging.WARNING if error else logging.INFO, "receiver %d: %s", stream_id, text)
        if error:  # it stopped or restarts after a failure: as loud as a ReportError
            self._bus.post(ReceiverReportedError(stopped))
        self._bus.post(ReceiverStopped(stopped))
        if error:
            self._count_failure(stream_id, text, bad_record)
        return True

    def _count_failure(self, stream_id: int, message: str, bad_record: bool = False) -> None:
        """Count a failure under the restart policy; past it (a bad record: at once), fail."""
        with self._lock:
            r = self._receivers[stream_id]
            started = self._state is TrackerState.STARTED
            now = self._clock.get_time_ms()
            error = r.failed(now, message, bad_record) if started else None
            if error is not None:
                self._settle(stream_id)
        if error is not None:
            self._record_error(stream_id, str(error), r.error)
            if self._on_fatal is not None:
                self._on_fatal(error)

    def _record_error(self, stream_id: int, message: str, error: str) -> None:
        with self._lock:
            r = self._receivers[stream_id]
            r.record_error(message, error, self._clock.get_time_ms())
            info = r.to_info()
        log.warning("receiver %d: %s", stream_id, message)
        if error:
            log.info("receiver %d error detail:\n%s", stream_id, error)
        self._bus.post(ReceiverReportedError(info))

    def _settle(self, stream_id: int) -> None:
        """Under the lock: the receiver's start is settled; wake whoever waits for it."""
        self._settled.add(stream_id)
        self._changed.notify_all()

    def _active_endpoints(self) -> list[str]:
        """Under the lock: the endpoints of the ACTIVE receivers."""
        return [e for e in (r.active_endpoint for r in self._receivers.values()) if e]

    # --- views ------------------------------------------------------------------

    def receiver_statuses(self) -> list[ReceiverStatus]:
        """A typed snapshot of every receiver, by stream id."""
        with self._lock:
            return [r.to_status() for _, r in sorted(self._receivers.items())]

    def tracking_infos(self) -> dict[int, ReceiverTrackingInfo]:
        """Scheduling state of every receiver."""
        with self._lock:
            return {s: r.info for s, r in self._receivers.items()}

    def receiver_states(self) -> dict[int, ReceiverState]:
        """The state of every receiver."""
        with self._lock:
            return {s: r.state for s, r in self._receivers.items()}

    def records_received(self, stream_id: int | None = None) -> int:
        """Records in blocks accepted so far (of one stream, or of all)."""
        with self._lock:
            if stream_id is not None:
                return self._receivers[stream_id].records
            return sum(r.records for r in self._receivers.values())
