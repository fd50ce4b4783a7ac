"""The driver's receiver tracker: launches receivers as Spark jobs and answers them.

Spark's ReceiverTracker. Its endpoint (Arrow Flight, authenticated) answers the
remote messages of :mod:`spark_receivers.rpc.messages` — ``RegisterReceiver``,
``AddBlock``, ``ReportError``, ``DeregisterReceiver`` — on gRPC threads. Each
receiver runs as a one-partition, one-task Spark job submitted from a driver
thread under its own job group; the job is submitted again after it ends,
until the tracker stops.

States: ``INITIALIZED`` → ``STARTED`` → ``STOPPING`` → ``STOPPED``.
"""

from __future__ import annotations

import dataclasses
import enum
import logging
import threading
from collections import defaultdict
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from spark_receivers.config import StreamingConfig
from spark_receivers.driver.listener import ListenerBus, ReceiverInfo
from spark_receivers.driver.received_block_tracker import ReceivedBlockTracker
from spark_receivers.errors import RpcError, StateError
from spark_receivers.receiver.receiver import Receiver
from spark_receivers.rpc import messages as m
from spark_receivers.rpc.transport import EndpointClient, FlightEndpoint
from spark_receivers.spark.receiver_task import ReceiverTaskSpec, make_task_function
from spark_receivers.util.clock import Clock, SystemClock

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

log = logging.getLogger(__name__)


class TrackerState(enum.Enum):
    """Lifecycle of the tracker."""

    INITIALIZED = 0
    STARTED = 1
    STOPPING = 2
    STOPPED = 3


class ReceiverState(enum.Enum):
    """Where a receiver is in its life, as seen by the driver."""

    INACTIVE = 0
    SCHEDULED = 1
    ACTIVE = 2


@dataclasses.dataclass
class _Tracking:
    receiver: Receiver
    state: ReceiverState = ReceiverState.INACTIVE
    host: str | None = None
    executor_id: str | None = None
    endpoint: str | None = None
    client: EndpointClient | None = None
    error_message: str = ""
    error: str = ""
    error_time_ms: int = -1
    records: int = 0
    blocks: int = 0


class ReceiverTracker:
    """Launches, watches and stops the receivers; see the module doc.

    Thread-safe: the endpoint handlers run on gRPC threads, launchers on their
    own threads, and the public methods on the caller's.
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
    ) -> None:
        self._spark = spark
        self._block_tracker = block_tracker
        self._config = config
        self._secret = secret
        self._host = host
        self._bus = bus
        self._clock = clock or SystemClock()
        self._lock = threading.RLock()
        self._info: dict[int, _Tracking] = {r.stream_id: _Tracking(r) for r in receivers}
        self._state = TrackerState.INITIALIZED
        self._endpoint: FlightEndpoint | None = None
        self._launchers: dict[int, threading.Thread] = {}
        self._stopping = threading.Event()
        self._deregistered = threading.Condition(self._lock)
        self.app_id = spark.sparkContext.applicationId

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
        """Start the endpoint and launch every receiver."""
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
        for stream_id in self._info:
            self._launch(stream_id)

    def stop(self, graceful: bool) -> None:
        """Stop every receiver, wait for them, cancel what is left, close the endpoint.

        Receivers get ``StopReceiver``; they deregister, push their last blocks
        and keep serving them until batches read them. The wait is unbounded when
        ``graceful``, else ``receiver_stop_timeout_s``; then the receivers' job
        groups are cancelled.
        """
        with self._lock:
            if self._state in (TrackerState.STOPPING, TrackerState.STOPPED):
                return
            if self._state is TrackerState.INITIALIZED:
                self._state = TrackerState.STOPPED
                return
            self._state = TrackerState.STOPPING
        self._stopping.set()
        self._send_all(m.StopReceiver())
        timeout = None if graceful else self._config.receiver_stop_timeout_s
        for stream_id, thread in self._launchers.items():
            thread.join(timeout)
            if thread.is_alive():
                log.warning("receiver %d did not stop in time; cancelling its job", stream_id)
        sc = self._spark.sparkContext
        for stream_id, thread in self._launchers.items():
            if thread.is_alive():
                sc.cancelJobGroup(self._job_group(stream_id))
        for thread in self._launchers.values():
            thread.join(30)
        with self._lock:
            for t in self._info.values():
                if t.client is not None:
                    t.client.close()
                    t.client = None
            still_active = [
                s for s, t in self._info.items() if t.state is not ReceiverState.INACTIVE
            ]
            if still_active:
                log.warning(
                    "receivers %s did not deregister before the tracker stopped", still_active
                )
            self._state = TrackerState.STOPPED
        if self._endpoint is not None:
            self._endpoint.close()

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
        sc = self._spark.sparkContext
        tracking = self._info[stream_id]
        spec = ReceiverTaskSpec(
            tracking.receiver, stream_id, self.address, self._secret, self._config.as_dict()
        )
        task = make_task_function(spec)
        name = tracking.receiver.name
        while not self._stopping.is_set():
            with self._lock:
                tracking.state = ReceiverState.SCHEDULED
            sc.setJobGroup(
                self._job_group(stream_id),
                f"Streaming job running receiver {stream_id} ({name})",
                interruptOnCancel=True,
            )
            try:
                sc.parallelize([stream_id], 1).mapPartitions(task).collect()  # type: ignore[arg-type]
                log.info("receiver %d job ended", stream_id)
            except Exception as e:  # noqa: BLE001 - any job failure means: restart the receiver
                if self._stopping.is_set():
                    break
                log.warning(
                    "receiver %d job failed: %s", stream_id, str(e).splitlines()[0] if str(e) else e
                )
                self._record_error(stream_id, "receiver job failed", str(e))
            finally:
                sc.setLocalProperty("spark.jobGroup.id", None)  # type: ignore[arg-type]
                sc.setLocalProperty("spark.job.description", None)  # type: ignore[arg-type]
            with self._lock:
                tracking.state = ReceiverState.INACTIVE
            if self._stopping.wait(self._config.receiver_restart_delay_ms / 1000.0):
                break
            log.info("restarting receiver %d (%s)", stream_id, name)

    # --- endpoint -------------------------------------------------------------

    def _handle(self, message: m.TrackerMessage) -> Any:
        match message:
            case m.AddBlock(block_info=info):
                self._known(info.stream_id)
                block_id = m.StreamBlockId.parse(info.block_id)
                if block_id.stream_id != info.stream_id:
                    msg = f"block {info.block_id} does not belong to stream {info.stream_id}"
                    raise RpcError(msg)
                if info.num_records < 0:
                    msg = f"block {info.block_id} has a negative record count {info.num_records}"
                    raise RpcError(msg)
                ok = self._block_tracker.add_block(info)
                if ok:
                    with self._lock:
                        t = self._info[info.stream_id]
                        t.records += info.num_records
                        t.blocks += 1
                return ok
            case m.RegisterReceiver():
                return self._register(message)
            case m.DeregisterReceiver(stream_id=sid, message=text, error=error):
                self._known(sid)
                with self._lock:
                    t = self._info[sid]
                    t.state = ReceiverState.INACTIVE
                    if error:
                        t.error_message, t.error = text, error
                        t.error_time_ms = self._clock.get_time_ms()
                    stopped = self._receiver_info(sid)
                    self._deregistered.notify_all()
                log.info("receiver %d deregistered: %s", sid, text)
                self._bus.post("on_receiver_stopped", stopped)
                return True
            case m.ReportError(stream_id=sid, message=text, error=error):
                self._known(sid)
                self._record_error(sid, text, error)
                return None
        msg = f"unexpected message {message!r:.100}"
        raise RpcError(msg)

    def _known(self, stream_id: int) -> None:
        if stream_id not in self._info:
            msg = f"unknown stream id {stream_id}; known: {sorted(self._info)}"
            raise RpcError(msg)

    def _register(self, msg_: m.RegisterReceiver) -> bool:
        self._known(msg_.stream_id)
        with self._lock:
            if self._state is not TrackerState.STARTED:
                log.info(
                    "refusing receiver %d: the tracker is %s", msg_.stream_id, self._state.name
                )
                return False
            t = self._info[msg_.stream_id]
            if t.client is not None:
                t.client.close()
            t.state = ReceiverState.ACTIVE
            t.host, t.executor_id, t.endpoint = msg_.host, msg_.executor_id, msg_.endpoint
            t.client = EndpointClient(msg_.endpoint, self._secret, timeout_s=30)
            info = self._receiver_info(msg_.stream_id)
        log.info(
            "registered receiver %d at %s on executor %s",
            msg_.stream_id,
            msg_.endpoint,
            msg_.executor_id,
        )
        self._bus.post("on_receiver_started", info)
        return True

    def _record_error(self, stream_id: int, message: str, error: str) -> None:
        with self._lock:
            t = self._info[stream_id]
            t.error_message, t.error = message, error
            t.error_time_ms = self._clock.get_time_ms()
            info = self._receiver_info(stream_id)
        log.warning("receiver %d reported an error: %s", stream_id, message)
        self._bus.post("on_receiver_error", info)

    # --- talking to receivers ------------------------------------------------

    def _send_all(self, message: Any) -> None:
        for stream_id in list(self._info):
            self.send(stream_id, message)

    def send(self, stream_id: int, message: Any) -> Any:
        """Send a message to a receiver's supervisor; None (logged) if it cannot be reached."""
        with self._lock:
            client = self._info[stream_id].client
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
                    (t.client for t in self._info.values() if t.endpoint == endpoint), None
                )
                owned = client is None
                if client is None:
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
        self.send(stream_id, m.UpdateRateLimit(float(rate)))

    # --- views ------------------------------------------------------------------

    def _receiver_info(self, stream_id: int) -> ReceiverInfo:
        t = self._info[stream_id]
        return ReceiverInfo(
            stream_id=stream_id,
            name=t.receiver.name,
            active=t.state is ReceiverState.ACTIVE,
            location=t.host,
            executor_id=t.executor_id,
            last_error_message=t.error_message,
            last_error=t.error,
            last_error_time_ms=t.error_time_ms,
        )

    def receiver_infos(self) -> dict[int, ReceiverInfo]:
        """What the driver knows of every receiver."""
        with self._lock:
            return {s: self._receiver_info(s) for s in self._info}

    def receiver_states(self) -> dict[int, ReceiverState]:
        """The state of every receiver."""
        with self._lock:
            return {s: t.state for s, t in self._info.items()}

    def records_received(self, stream_id: int | None = None) -> int:
        """Records in blocks accepted so far (of one stream, or of all)."""
        with self._lock:
            if stream_id is not None:
                return self._info[stream_id].records
            return sum(t.records for t in self._info.values())

    def all_receivers_ended(self) -> bool:
        """True when no receiver job is running."""
        return not any(t.is_alive() for t in self._launchers.values())
