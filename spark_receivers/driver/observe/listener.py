"""Streaming listener events and the bus that delivers them.

Each event is a frozen dataclass of one closed union, :data:`StreamingListenerEvent`;
the bus calls each listener's method for it, chosen by the event's type (:func:`deliver`,
Spark's ``StreamingListenerBus``). Every callback runs on the bus's one thread, in the
order events were posted; a callback may block briefly (it delays the callbacks after
it, not the stream).
A listener that raises is logged and does not stop the stream.
"""

from __future__ import annotations

import logging
import queue
import threading
import typing
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from spark_receivers.driver.observe.streaming_progress import StreamingProgress

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ReceiverInfo:
    """What the driver knows of one receiver."""

    stream_id: int
    name: str
    active: bool
    location: str | None
    executor_id: str | None
    last_error_message: str = ""
    last_error: str = ""
    last_error_time_ms: int = -1


@dataclass(frozen=True)
class OutputOperationInfo:
    """One output operation of one batch."""

    batch_time_ms: int
    id: int
    name: str
    description: str
    start_time_ms: int | None = None
    end_time_ms: int | None = None
    failure_reason: str | None = None

    @property
    def duration_ms(self) -> int | None:
        """How long it ran, once it ended."""
        if self.start_time_ms is None or self.end_time_ms is None:
            return None
        return self.end_time_ms - self.start_time_ms


@dataclass(frozen=True)
class StreamInputInfo:
    """What one stream brought to one batch (Spark's ``StreamInputInfo``).

    ``metadata`` holds the ``metadata`` the receiver passed to ``store()`` with the
    batch's blocks, in block order (blocks stored without any are left out; at most
    :data:`MAX_METADATA_PER_STREAM`, ``metadata_omitted`` counts the rest).
    ``position``: the source position of the batch's last block stored with one
    (``store(..., position=...)``), None if none was.
    """

    stream_id: int
    num_records: int
    num_blocks: int = 0
    size_bytes: int = 0
    metadata: tuple[dict[str, Any], ...] = ()
    metadata_omitted: int = 0
    position: str | None = None


MAX_METADATA_PER_STREAM = 100


@dataclass(frozen=True)
class BatchInfo:
    """One batch: its records per stream and its delays (ms; None until known)."""

    batch_time_ms: int
    num_records_per_stream: dict[int, int]
    submission_time_ms: int
    processing_start_time_ms: int | None = None
    processing_end_time_ms: int | None = None
    output_operations: dict[int, OutputOperationInfo] = field(default_factory=dict)
    stream_input_info: dict[int, StreamInputInfo] = field(default_factory=dict)
    """Per stream: records, blocks, bytes and ``store()`` metadata of the batch."""

    @property
    def num_records(self) -> int:
        """Records of every stream in the batch."""
        return sum(self.num_records_per_stream.values())

    @property
    def scheduling_delay_ms(self) -> int | None:
        """From the batch's submission to the start of its processing."""
        if self.processing_start_time_ms is None:
            return None
        return self.processing_start_time_ms - self.submission_time_ms

    @property
    def processing_delay_ms(self) -> int | None:
        """How long the batch's output operations ran."""
        if self.processing_start_time_ms is None or self.processing_end_time_ms is None:
            return None
        return self.processing_end_time_ms - self.processing_start_time_ms

    @property
    def total_delay_ms(self) -> int | None:
        """Scheduling plus processing delay."""
        s, p = self.scheduling_delay_ms, self.processing_delay_ms
        return None if s is None or p is None else s + p


@dataclass(frozen=True)
class BlockLostInfo:
    """A block a batch needed could be read neither from a block store nor from a WAL.

    Without the receiver WAL this happens when every executor holding a copy died
    before the batches holding the block ran. With ``lostBlockPolicy=fail`` (the
    default) the batch then fails and the context with it; with ``skip`` the
    batch ran without the block (``batch_time_ms`` is -1 when the block is no
    longer known to any batch).
    """

    batch_time_ms: int
    stream_id: int
    block_id: str
    num_records: int
    reason: str


@dataclass(frozen=True)
class ReplicationInfo:
    """A receiver's blocks now have ``achieved`` of the ``wanted`` copies its level asks for.

    Fewer than wanted (degraded) when no block keeper on another executor
    answered; back to ``wanted`` (restored) as soon as one does.
    """

    stream_id: int
    wanted: int
    achieved: int
    message: str
    time_ms: int

    @property
    def degraded(self) -> bool:
        """True while blocks have fewer copies than their level asks for."""
        return self.achieved < self.wanted


class StreamingListener:
    """Receives the events of a streaming context; every method is a no-op by default.

    All callbacks run on the listener bus thread, one at a time, in order.
    """

    def on_streaming_started(self, time_ms: int) -> None:
        """The context started."""

    def on_receiver_started(self, info: ReceiverInfo) -> None:
        """A receiver registered and started."""

    def on_receiver_error(self, info: ReceiverInfo) -> None:
        """A receiver reported an error (``info.last_error_message``)."""

    def on_receiver_stopped(self, info: ReceiverInfo) -> None:
        """A receiver deregistered."""

    def on_batch_submitted(self, info: BatchInfo) -> None:
        """A batch was allocated and queued."""

    def on_batch_started(self, info: BatchInfo) -> None:
        """A batch started processing."""

    def on_batch_completed(self, info: BatchInfo) -> None:
        """A batch finished (all of its output operations ran)."""

    def on_output_operation_started(self, info: OutputOperationInfo) -> None:
        """An output operation of a batch started."""

    def on_output_operation_completed(self, info: OutputOperationInfo) -> None:
        """An output operation ended (``failure_reason`` set if it failed)."""

    def on_block_lost(self, info: BlockLostInfo) -> None:
        """A batch could not read a block (see :class:`BlockLostInfo`)."""

    def on_replication_changed(self, info: ReplicationInfo) -> None:
        """A receiver's blocks got fewer, or again all, of their copies (ReplicationInfo)."""

    def on_batch_progress(self, progress: StreamingProgress) -> None:
        """A batch completed: its progress, shaped like Structured Streaming's.

        Posted right after :meth:`on_batch_completed` (same bus thread), with what
        ``ssc.last_progress`` returns (see :class:`~spark_receivers.StreamingProgress`).
        """


# --- the events: one frozen dataclass each, one closed union, dispatched by type -----------


@dataclass(frozen=True, slots=True)
class StreamingStarted:
    """The context started: :meth:`StreamingListener.on_streaming_started`."""

    time_ms: int


@dataclass(frozen=True, slots=True)
class ReceiverStarted:
    """A receiver registered and started: ``on_receiver_started``."""

    info: ReceiverInfo


@dataclass(frozen=True, slots=True)
class ReceiverReportedError:
    """A receiver reported an error: ``on_receiver_error``."""

    info: ReceiverInfo


@dataclass(frozen=True, slots=True)
class ReceiverStopped:
    """A receiver deregistered: ``on_receiver_stopped``."""

    info: ReceiverInfo


@dataclass(frozen=True, slots=True)
class BatchSubmitted:
    """A batch was allocated and queued: ``on_batch_submitted``."""

    info: BatchInfo


@dataclass(frozen=True, slots=True)
class BatchStarted:
    """A batch started processing: ``on_batch_started``."""

    info: BatchInfo


@dataclass(frozen=True, slots=True)
class BatchCompleted:
    """A batch finished: ``on_batch_completed``."""

    info: BatchInfo


@dataclass(frozen=True, slots=True)
class OutputOperationStarted:
    """An output operation of a batch started: ``on_output_operation_started``."""

    info: OutputOperationInfo


@dataclass(frozen=True, slots=True)
class OutputOperationCompleted:
    """An output operation ended: ``on_output_operation_completed``."""

    info: OutputOperationInfo


@dataclass(frozen=True, slots=True)
class BlockLost:
    """A batch could not read a block: ``on_block_lost``."""

    info: BlockLostInfo


@dataclass(frozen=True, slots=True)
class ReplicationChanged:
    """A receiver's blocks lost, or got back, copies: ``on_replication_changed``."""

    info: ReplicationInfo


@dataclass(frozen=True, slots=True)
class BatchProgress:
    """A batch's progress, right after its completion: ``on_batch_progress``."""

    progress: StreamingProgress


StreamingListenerEvent = (
    StreamingStarted
    | ReceiverStarted
    | ReceiverReportedError
    | ReceiverStopped
    | BatchSubmitted
    | BatchStarted
    | BatchCompleted
    | OutputOperationStarted
    | OutputOperationCompleted
    | BlockLost
    | ReplicationChanged
    | BatchProgress
)
"""Every event the bus delivers (Spark's ``StreamingListenerEvent``): a closed union."""

EVENT_TYPES: tuple[type, ...] = typing.get_args(StreamingListenerEvent)


def deliver(listener: StreamingListener, event: StreamingListenerEvent) -> None:
    """Call the listener's method for ``event``, chosen by the event's type.

    Spark's ``StreamingListenerBus.doPostEvent``; mypy checks that every event type has
    its case.
    """
    match event:
        case StreamingStarted(time_ms=time_ms):
            listener.on_streaming_started(time_ms)
        case ReceiverStarted(info=receiver):
            listener.on_receiver_started(receiver)
        case ReceiverReportedError(info=receiver):
            listener.on_receiver_error(receiver)
        case ReceiverStopped(info=receiver):
            listener.on_receiver_stopped(receiver)
        case BatchSubmitted(info=batch):
            listener.on_batch_submitted(batch)
        case BatchStarted(info=batch):
            listener.on_batch_started(batch)
        case BatchCompleted(info=batch):
            listener.on_batch_completed(batch)
        case OutputOperationStarted(info=operation):
            listener.on_output_operation_started(operation)
        case OutputOperationCompleted(info=operation):
            listener.on_output_operation_completed(operation)
        case BlockLost(info=lost):
            listener.on_block_lost(lost)
        case ReplicationChanged(info=replication):
            listener.on_replication_changed(replication)
        case BatchProgress(progress=progress):
            listener.on_batch_progress(progress)
        case _:
            typing.assert_never(event)


class ListenerBus:
    """Delivers events to listeners on one thread, in order."""

    def __init__(self) -> None:
        self._listeners: list[StreamingListener] = []
        self._queue: queue.Queue[StreamingListenerEvent | None] = queue.Queue()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def add(self, listener: StreamingListener) -> None:
        """Add a listener (it sees events posted from now on)."""
        with self._lock:
            self._listeners = [*self._listeners, listener]

    def remove(self, listener: StreamingListener) -> None:
        """Remove a listener."""
        with self._lock:
            self._listeners = [x for x in self._listeners if x is not listener]

    def start(self) -> None:
        """Start the bus thread."""
        if self._thread is None:
            self._thread = threading.Thread(
                target=self._run, name="streaming-listener-bus", daemon=True
            )
            self._thread.start()

    def post(self, event: StreamingListenerEvent) -> None:
        """Queue ``event`` for every listener; each gets the call its type names."""
        if not isinstance(event, EVENT_TYPES):
            msg = (
                "the listener bus takes a StreamingListenerEvent (StreamingStarted, "
                f"BatchCompleted, ... of driver/observe/listener.py), not {event!r:.80}"
            )
            raise TypeError(msg)
        self._queue.put(event)

    def stop(self, timeout_s: float = 10.0) -> None:
        """Deliver what is queued, then stop the thread."""
        if self._thread is not None:
            self._queue.put(None)
            self._thread.join(timeout_s)
            self._thread = None

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            for listener in self._listeners:
                try:
                    deliver(listener, item)
                except Exception:
                    log.exception(
                        "streaming listener %r raised on %s", listener, type(item).__name__
                    )
