"""The driver's receiver tracker: places receivers, launches them as Spark jobs, answers them.

Spark's ReceiverTracker. Its endpoint (Arrow Flight, authenticated) answers the
remote messages of :mod:`spark_receivers.rpc.messages` — ``RegisterReceiver``,
``AddBlock``, ``ReportError``, ``DeregisterReceiver``, and the offset messages of
Structured Streaming readers (``DescribeStream``, ``StreamOffsets``,
``AllocateOffsets``, ``GetOffsetRange``, ``CommitOffsets``) — on gRPC threads; the
driver-local commands of :mod:`spark_receivers.driver.tracker_commands` run
through :meth:`ReceiverTracker.run`.

Each receiver runs as a one-partition, one-task Spark job that prefers the
executors the :class:`ReceiverSchedulingPolicy` chose, submitted from a driver
thread under its own job group; a registration from any other executor is
refused. When the job ends (the receiver stopped, failed, or its executor was
lost) it is relaunched after ``receiver_restart_delay_ms``, on its old executors
if they are alive, else rescheduled — until the tracker stops.

States: ``INITIALIZED`` → ``STARTED`` → ``STOPPING`` → ``STOPPED``.
"""

from __future__ import annotations

import base64
import dataclasses
import enum
import logging
import threading
from collections import defaultdict
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from spark_receivers.config import StreamingConfig
from spark_receivers.driver import tracker_commands as cmd
from spark_receivers.driver.block_events import info_to_dict
from spark_receivers.driver.listener import ListenerBus, ReceiverInfo
from spark_receivers.driver.received_block_tracker import ReceivedBlockTracker
from spark_receivers.driver.receiver_launcher import (
    alive_executors,
    receiver_rdd,
    wait_for_executors,
)
from spark_receivers.driver.scheduling_policy import (
    ExecutorCacheTaskLocation,
    ReceiverSchedulingPolicy,
    ReceiverState,
    ReceiverTrackingInfo,
    TaskLocation,
)
from spark_receivers.errors import OffsetError, RpcError, StateError, WriteAheadLogError
from spark_receivers.receiver.receiver import Receiver
from spark_receivers.rpc import messages as m
from spark_receivers.rpc.transport import EndpointClient, FlightEndpoint
from spark_receivers.spark.receiver_task import ReceiverTaskSpec, make_task_function
from spark_receivers.util.clock import Clock, SystemClock

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

log = logging.getLogger(__name__)

__all__ = ["ReceiverState", "ReceiverTracker", "TrackerState"]

OFFSET_STREAM_DRAIN_S = 0.5


class TrackerState(enum.Enum):
    """Lifecycle of the tracker."""

    INITIALIZED = 0
    STARTED = 1
    STOPPING = 2
    STOPPED = 3


@dataclasses.dataclass
class _Receiver:
    receiver: Receiver
    info: ReceiverTrackingInfo
    host: str | None = None
    client: EndpointClient | None = None
    error: str = ""
    records: int = 0
    blocks: int = 0
    jobs: int = 0


class ReceiverTracker:
    """Places, launches, watches and stops the receivers; see the module doc.

    Thread-safe: endpoint handlers run on gRPC threads, launchers on their own
    threads, commands on the caller's; all share one lock.
    """

    def __init__(
        self,
        spark: SparkSession,
        receivers: Sequence[Receiver],
        block_tracker: ReceivedBlockTracker,
        config: StreamingConfig,
        secret: str,
        host: str,
        bus: ListenerBus,
        clock: Clock | None = None,
        policy: ReceiverSchedulingPolicy | None = None,
    ) -> None:
        self._spark = spark
        self._sc = spark.sparkContext
        self._block_tracker = block_tracker
        self._config = config
        self._secret = secret
        self._host = host
        self._bus = bus
        self._clock = clock or SystemClock()
        self._policy = policy or ReceiverSchedulingPolicy()
        self._lock = threading.RLock()
        self._receivers = {
            r.stream_id: _Receiver(
                r, ReceiverTrackingInfo(r.stream_id, ReceiverState.INACTIVE, None, None, r.name)
            )
            for r in receivers
        }
        self._state = TrackerState.INITIALIZED
        self._endpoint: FlightEndpoint | None = None
        self._launchers: dict[int, threading.Thread] = {}
        self._stopping = threading.Event()
        self.app_id = self._sc.applicationId

    # --- lifecycle ----------------------------------------------------------

    @property
    def state(self) -> TrackerState:
        """The tracker's lifecycle state."""
        return self._state

    @property
    def address(self) -> str:
        """``host:port`` of the tracker endpoint."""
        if self._endpoint is None:
            msg = "the receiver tracker is not started"
            raise StateError(msg)
        return self._endpoint.address

    def start(self) -> None:
        """Start the endpoint, wait for executors, then place and launch every receiver."""
        with self._lock:
            if self._state is not TrackerState.INITIALIZED:
                msg = f"cannot start the receiver tracker in state {self._state.name}"
                raise StateError(msg)
            self._endpoint = FlightEndpoint(
                "receiver-tracker",
                self._host,
                self._secret,
                m.TRACKER_MESSAGES,
                self._handle,
                max_message_bytes=self._config.max_message_bytes,
            )
            self._state = TrackerState.STARTED
        if self._receivers:
            wait_for_executors(self._sc)
            self.run(cmd.StartAllReceivers())

    def stop(self, graceful: bool) -> None:
        """Stop every receiver, wait for them, cancel what is left, close the endpoint.

        Receivers get ``StopReceiver``; they deregister, push their last blocks
        and keep serving them until batches read them, then their jobs end. The
        wait is unbounded when ``graceful``, else ``receiver_stop_timeout_s``;
        then the receivers' job groups are cancelled, so nothing keeps running.
        """
        with self._lock:
            if self._state in (TrackerState.STOPPING, TrackerState.STOPPED):
                return
            if self._state is TrackerState.INITIALIZED:
                self._state = TrackerState.STOPPED
                return
            self._state = TrackerState.STOPPING
        self._stopping.set()
        self.run(cmd.StopAllReceivers())
        timeout = None if graceful else self._config.receiver_stop_timeout_s
        for stream_id, thread in self._launchers.items():
            thread.join(timeout)
            if thread.is_alive():
                log.warning("receiver %d did not stop in time; cancelling its job", stream_id)
                self._sc.cancelJobGroup(self._job_group(stream_id))
        for thread in self._launchers.values():
            thread.join(30)
        with self._lock:
            still_active = [
                s for s, r in self._receivers.items() if r.info.state is ReceiverState.ACTIVE
            ]
            if still_active:
                log.warning(
                    "receivers %s did not deregister before the tracker stopped", still_active
                )
            for r in self._receivers.values():
                if r.client is not None:
                    r.client.close()
                    r.client = None
            self._state = TrackerState.STOPPED
        if self._endpoint is not None:
            self._endpoint.close()

    # --- local commands -------------------------------------------------------

    def run(self, command: cmd.TrackerCommand) -> Any:
        """Run a driver-local command (one at a time) and return its result."""
        with self._lock:
            match command:
                case cmd.StartAllReceivers():
                    return self._start_all()
                case cmd.RestartReceiver(stream_id=sid):
                    return self._restart(sid)
                case cmd.StopAllReceivers():
                    return self._send_all(m.StopReceiver())
                case cmd.AllReceiverIds():
                    return [
                        s
                        for s, r in self._receivers.items()
                        if r.info.state is not ReceiverState.INACTIVE
                    ]
                case cmd.GetAllReceiverInfo():
                    return {s: r.info for s, r in self._receivers.items()}
                case cmd.UpdateReceiverRateLimit(stream_id=sid, rate=rate):
                    return self.send(sid, m.UpdateRateLimit(float(rate)))
                case cmd.CleanupOldBlocks(threshold_ms=threshold):
                    return self._send_all(m.CleanupOldBlocks(threshold))
        msg = f"unknown tracker command {command!r}"
        raise StateError(msg)

    def _start_all(self) -> None:
        executors = alive_executors(self._sc)
        placement = self._policy.schedule_receivers(
            [r.receiver for r in self._receivers.values()], executors
        )
        log.info(
            "scheduled receivers %s on executors %s", _show(placement), [str(e) for e in executors]
        )
        for sid, locations in placement.items():
            self._schedule(sid, locations)
            self._launch(sid)

    def _schedule(self, stream_id: int, locations: Sequence[TaskLocation]) -> None:
        r = self._receivers[stream_id]
        state = ReceiverState.SCHEDULED if locations else ReceiverState.INACTIVE
        r.info = dataclasses.replace(
            r.info, state=state, scheduled_locations=tuple(locations) or None, running_executor=None
        )

    def _restart(self, stream_id: int) -> list[TaskLocation]:
        r = self._receivers[stream_id]
        executors = alive_executors(self._sc)
        old = [
            loc
            for loc in r.info.scheduled_locations or ()
            if not isinstance(loc, ExecutorCacheTaskLocation) or loc in executors
        ]
        if old:
            locations = old
        else:
            # Not weighing against itself: INACTIVE with no locations, then reschedule.
            r.info = dataclasses.replace(
                r.info,
                state=ReceiverState.INACTIVE,
                scheduled_locations=None,
                running_executor=None,
            )
            infos = {s: x.info for s, x in self._receivers.items()}
            locations = self._policy.reschedule_receiver(
                stream_id, r.receiver.preferred_location, infos, executors
            )
        self._schedule(stream_id, locations)
        log.info("restarting receiver %d on %s", stream_id, [str(loc) for loc in locations])
        return locations

    # --- launching ----------------------------------------------------------

    def _job_group(self, stream_id: int) -> str:
        return f"spark-receivers-{self.app_id}-receiver-{stream_id}"

    def _launch(self, stream_id: int) -> None:
        thread = threading.Thread(
            target=self._run_receiver_job,
            args=(stream_id,),
            name=f"receiver-launcher-{stream_id}",
            daemon=True,
        )
        self._launchers[stream_id] = thread
        thread.start()

    def _run_receiver_job(self, stream_id: int) -> None:
        r = self._receivers[stream_id]
        config = self._config.as_dict()
        if self._block_tracker.is_offset_stream(stream_id) and self._config.receiver_wal_enabled:
            # A structured stream's blocks are read whenever a query gets to them, from
            # the WAL once the receiver is gone: nothing to keep serving after a stop.
            config["receiver_drain_timeout_s"] = OFFSET_STREAM_DRAIN_S
        spec = ReceiverTaskSpec(r.receiver, stream_id, self.address, self._secret, config)
        task = make_task_function(spec)
        while not self._stopping.is_set():
            with self._lock:
                locations = list(r.info.scheduled_locations or ())
                r.jobs += 1
            self._sc.setJobGroup(
                self._job_group(stream_id),
                f"Streaming job running receiver {stream_id} ({r.receiver.name})",
                interruptOnCancel=True,
            )
            failure = ""
            try:
                receiver_rdd(self._sc, stream_id, locations).mapPartitions(task).collect()  # type: ignore[arg-type]
            except Exception as e:  # noqa: BLE001 - any job failure means: restart the receiver
                failure = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            finally:
                self._sc.setLocalProperty("spark.jobGroup.id", None)  # type: ignore[arg-type]
                self._sc.setLocalProperty("spark.job.description", None)  # type: ignore[arg-type]
            if self._stopping.is_set():
                break
            self._job_ended(stream_id, failure)
            if self._stopping.wait(self._config.receiver_restart_delay_ms / 1000.0):
                break
            self.run(cmd.RestartReceiver(stream_id))

    def _job_ended(self, stream_id: int, failure: str) -> None:
        with self._lock:
            r = self._receivers[stream_id]
            vanished = r.info.state is ReceiverState.ACTIVE
        if vanished or failure:
            # The receiver did not deregister: its task or executor died.
            message = (
                "receiver job failed" if failure else "receiver task ended without deregistering"
            )
            executor = r.info.running_executor
            where = f" on executor {executor.executor_id}" if executor else ""
            self._record_error(stream_id, f"{message}{where}; restarting it", failure)
            with self._lock:
                r.info = dataclasses.replace(
                    r.info, state=ReceiverState.INACTIVE, running_executor=None
                )
                if r.client is not None:
                    r.client.close()
                    r.client = None
        log.info("receiver %d job ended%s", stream_id, f": {failure}" if failure else "")

    # --- endpoint -------------------------------------------------------------

    def _handle(self, message: m.TrackerMessage) -> Any:
        if self._state is TrackerState.STOPPED:
            msg = "ReceiverTracker RpcEndpoint shut down."
            raise RpcError(msg)
        match message:
            case m.AddBlock(block_info=info):
                return self._add_block(info)
            case m.RegisterReceiver():
                return self._register(message)
            case m.DeregisterReceiver(stream_id=sid, message=text, error=error):
                self._known(sid)
                with self._lock:
                    r = self._receivers[sid]
                    r.info = dataclasses.replace(
                        r.info, state=ReceiverState.INACTIVE, running_executor=None
                    )
                    if error:
                        r.info = dataclasses.replace(
                            r.info, error_message=text, error_time_ms=self._clock.get_time_ms()
                        )
                        r.error = error
                    stopped = self._receiver_info(sid)
                log.info("receiver %d deregistered: %s", sid, text)
                self._bus.post("on_receiver_stopped", stopped)
                return True
            case m.ReportError(stream_id=sid, message=text, error=error):
                self._known(sid)
                self._record_error(sid, text, error)
                return None
            case m.DescribeStream() | m.StreamOffsets() | m.AllocateOffsets():
                return self._offsets(message)
            case m.GetOffsetRange() | m.CommitOffsets():
                return self._offsets(message)
        msg = f"unexpected message {message!r:.100}"
        raise RpcError(msg)

    def _offsets(self, message: m.TrackerMessage) -> Any:
        """Answer a Structured Streaming reader (see ``spark/stream_source.py``)."""
        if isinstance(message, m.DescribeStream):
            return self._describe(message.stream)
        sid = message.stream_id  # type: ignore[union-attr]
        self._known(sid)
        try:
            match message:
                case m.StreamOffsets():
                    return self._block_tracker.offset_status(sid)
                case m.AllocateOffsets(start=start, max_records=limit):
                    _non_negative(start=start)
                    return self._block_tracker.allocate_offsets(sid, start, limit)
                case m.GetOffsetRange(start=start, end=end):
                    _non_negative(start=start, end=end)
                    return [
                        [info_to_dict(b), first, rows]
                        for b, first, rows in self._block_tracker.offset_range(sid, start, end)
                    ]
                case m.CommitOffsets(end=end):
                    _non_negative(end=end)
                    done = self._block_tracker.commit_offsets(sid, end)
                    if done:
                        threading.Thread(
                            target=self.remove_blocks, args=(done,), daemon=True
                        ).start()
                    return True
        except OffsetError as e:
            raise RpcError(str(e)) from None
        msg = f"unexpected message {message!r:.100}"
        raise RpcError(msg)

    def _describe(self, stream: str) -> dict[str, Any]:
        with self._lock:
            found = [
                r.receiver
                for sid, r in self._receivers.items()
                if stream in (str(sid), r.receiver.name)
            ]
            names = sorted(f"{sid} ({r.receiver.name})" for sid, r in self._receivers.items())
        if not found:
            msg = f"no stream {stream[:100]!r}: this application has streams {names}"
            raise RpcError(msg)
        receiver = found[0]
        if not self._block_tracker.is_offset_stream(receiver.stream_id):
            msg = (
                f"stream {receiver.stream_id} ({receiver.name}) feeds DStream batches; "
                "create it with StreamingContext.structured_stream(receiver) to read it "
                "from Structured Streaming"
            )
            raise RpcError(msg)
        schema = base64.b64encode(receiver.schema.serialize().to_pybytes()).decode()
        return {"stream_id": receiver.stream_id, "name": receiver.name, "schema": schema}

    def _known(self, stream_id: int) -> None:
        if stream_id not in self._receivers:
            msg = f"unknown stream id {stream_id}; known: {sorted(self._receivers)}"
            raise RpcError(msg)

    def _add_block(self, info: m.ReceivedBlockInfo) -> bool:
        self._known(info.stream_id)
        block_id = m.StreamBlockId.parse(info.block_id)
        if block_id.stream_id != info.stream_id:
            msg = f"block {info.block_id} does not belong to stream {info.stream_id}"
            raise RpcError(msg)
        if info.num_records < 0 or info.size_bytes < 0:
            msg = f"block {info.block_id} has a negative record count or size"
            raise RpcError(msg)
        if info.wal_handle is not None:
            self._check_wal_handle(info)
        ok = self._block_tracker.add_block(info)
        if ok:
            with self._lock:
                r = self._receivers[info.stream_id]
                r.records += info.num_records
                r.blocks += 1
        return ok

    def _check_wal_handle(self, info: m.ReceivedBlockInfo) -> None:
        """Refuse a WAL handle outside ``<checkpoint_dir>/receivedData/<stream id>``.

        Batch readers open the file a handle names: one from the network must not
        point anywhere else (``..``, another stream, another directory).
        """
        from spark_receivers.receiver.block_handler import received_data_dir, resolve_checkpoint
        from spark_receivers.wal.base import RecordHandle, confine_handle

        cfg = self._config
        if not (cfg.receiver_wal_enabled and cfg.checkpoint_dir):
            msg = f"block {info.block_id} has a WAL handle but the receiver WAL is not enabled"
            raise RpcError(msg)
        try:
            handle = RecordHandle.from_dict(info.wal_handle or {})
            _, root = resolve_checkpoint(received_data_dir(cfg.checkpoint_dir, info.stream_id))
            confine_handle(handle, root)
        except WriteAheadLogError as e:
            msg = f"block {info.block_id} has a bad WAL handle: {e}"
            raise RpcError(msg) from None

    def _register(self, msg_: m.RegisterReceiver) -> bool:
        self._known(msg_.stream_id)
        with self._lock:
            if self._state is not TrackerState.STARTED:
                log.info(
                    "refusing receiver %d: the tracker is %s", msg_.stream_id, self._state.name
                )
                return False
            r = self._receivers[msg_.stream_id]
            allowed: Sequence[TaskLocation] | None = r.info.scheduled_locations
            if not allowed:
                infos = {s: x.info for s, x in self._receivers.items()}
                allowed = self._policy.reschedule_receiver(
                    msg_.stream_id, r.receiver.preferred_location, infos, alive_executors(self._sc)
                )
            if not any(_accepts(loc, msg_.host, msg_.executor_id) for loc in allowed):
                log.warning(
                    "refusing receiver %d from executor %s on %s: it is scheduled on %s",
                    msg_.stream_id,
                    msg_.executor_id,
                    msg_.host,
                    [str(loc) for loc in allowed],
                )
                return False
            if r.client is not None:
                r.client.close()
            r.info = dataclasses.replace(
                r.info,
                state=ReceiverState.ACTIVE,
                running_executor=ExecutorCacheTaskLocation(msg_.host, msg_.executor_id),
                endpoint=msg_.endpoint,
            )
            r.host = msg_.host
            r.client = EndpointClient(msg_.endpoint, self._secret, timeout_s=30)
            started = self._receiver_info(msg_.stream_id)
        log.info(
            "registered receiver %d at %s on executor %s",
            msg_.stream_id,
            msg_.endpoint,
            msg_.executor_id,
        )
        self._bus.post("on_receiver_started", started)
        return True

    def _record_error(self, stream_id: int, message: str, error: str) -> None:
        with self._lock:
            r = self._receivers[stream_id]
            r.info = dataclasses.replace(
                r.info, error_message=message, error_time_ms=self._clock.get_time_ms()
            )
            r.error = error
            info = self._receiver_info(stream_id)
        log.warning("receiver %d: %s", stream_id, message)
        self._bus.post("on_receiver_error", info)

    # --- talking to receivers ------------------------------------------------

    def _send_all(self, message: Any) -> dict[int, Any]:
        return {stream_id: self.send(stream_id, message) for stream_id in list(self._receivers)}

    def send(self, stream_id: int, message: Any) -> Any:
        """Send a message to a receiver's supervisor; None (logged) if it cannot be reached."""
        with self._lock:
            client = self._receivers[stream_id].client
        if client is None:
            return None
        try:
            return client.call(message)
        except RpcError as e:
            log.info("could not send %s to receiver %d: %s", type(message).__name__, stream_id, e)
            return None

    def remove_blocks(self, blocks: Sequence[m.ReceivedBlockInfo]) -> None:
        """Tell the receivers holding these blocks to drop them."""
        by_endpoint: dict[str, list[str]] = defaultdict(list)
        for b in blocks:
            if b.store_endpoint:
                by_endpoint[b.store_endpoint].append(b.block_id)
        for endpoint, names in by_endpoint.items():
            with self._lock:
                client = next(
                    (x.client for x in self._receivers.values() if x.info.endpoint == endpoint),
                    None,
                )
            owned = client is None
            if client is None:
                # The receiver restarted elsewhere; its old task may still serve these blocks.
                client = EndpointClient(endpoint, self._secret, timeout_s=10)
            try:
                client.call(m.RemoveBlocks(tuple(names)))
            except RpcError as e:
                log.info("could not remove %d block(s) at %s: %s", len(names), endpoint, e)
            finally:
                if owned:
                    client.close()

    def update_rate_limit(self, stream_id: int, rate: float) -> None:
        """Send ``UpdateRateLimit`` to the receiver of ``stream_id``."""
        self.run(cmd.UpdateReceiverRateLimit(stream_id, rate))

    # --- views ------------------------------------------------------------------

    def _receiver_info(self, stream_id: int) -> ReceiverInfo:
        r = self._receivers[stream_id]
        executor = r.info.running_executor
        return ReceiverInfo(
            stream_id=stream_id,
            name=r.receiver.name,
            active=r.info.state is ReceiverState.ACTIVE,
            location=r.host,
            executor_id=executor.executor_id if executor else None,
            last_error_message=r.info.error_message or "",
            last_error=r.error,
            last_error_time_ms=r.info.error_time_ms if r.info.error_time_ms is not None else -1,
        )

    def receiver_infos(self) -> dict[int, ReceiverInfo]:
        """What the driver knows of every receiver, for listeners and progress."""
        with self._lock:
            return {s: self._receiver_info(s) for s in self._receivers}

    def tracking_infos(self) -> dict[int, ReceiverTrackingInfo]:
        """Scheduling state of every receiver."""
        result: dict[int, ReceiverTrackingInfo] = self.run(cmd.GetAllReceiverInfo())
        return result

    def receiver_states(self) -> dict[int, ReceiverState]:
        """The state of every receiver."""
        with self._lock:
            return {s: r.info.state for s, r in self._receivers.items()}

    def records_received(self, stream_id: int | None = None) -> int:
        """Records in blocks accepted so far (of one stream, or of all)."""
        with self._lock:
            if stream_id is not None:
                return self._receivers[stream_id].records
            return sum(r.records for r in self._receivers.values())

    def jobs_launched(self, stream_id: int) -> int:
        """How many jobs were submitted for a receiver (1 + its restarts)."""
        with self._lock:
            return self._receivers[stream_id].jobs


def _non_negative(**offsets: int) -> None:
    for name, value in offsets.items():
        if value < 0:
            msg = f"offset {name} must be >= 0, got {value}"
            raise OffsetError(msg)


def _accepts(location: TaskLocation, host: str, executor_id: str) -> bool:
    if isinstance(location, ExecutorCacheTaskLocation):
        return location.executor_id == executor_id
    return location.host == host


def _show(placement: dict[int, list[TaskLocation]]) -> dict[int, list[str]]:
    return {s: [str(loc) for loc in locs] for s, locs in placement.items()}
