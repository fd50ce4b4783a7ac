"""``StreamingContext``: the public entry point on the driver.

A thin facade: streams and their output operations live in a
:class:`~spark_receivers.driver.batches.stream_graph.StreamGraph`, and everything that
runs (trackers, job generator, checkpoints, receivers' jobs) is owned by a
:class:`~spark_receivers.driver.job_scheduler.JobScheduler` made whole at ``start()``,
then started.
docs/architecture.md shows the rooms and the order they start and stop in.
"""

from __future__ import annotations

import dataclasses
import enum
import logging
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from spark_receivers.config import StreamingConfig, spark_conf_of
from spark_receivers.driver.batches.checkpoint import Checkpoint, CheckpointStore
from spark_receivers.driver.batches.stream_graph import StreamGraph
from spark_receivers.driver.deployment import prepare
from spark_receivers.driver.job_identity import checkpoint_job_id
from spark_receivers.driver.job_scheduler import JobScheduler
from spark_receivers.driver.observe.listener import ListenerBus, StreamingListener
from spark_receivers.driver.observe.progress import ProgressRecorder
from spark_receivers.driver.observe.receiver_metrics import ReceiverMetricsInfo
from spark_receivers.driver.observe.status import ReceiverStatus, StreamingStatus
from spark_receivers.driver.observe.status_api import StreamDescription
from spark_receivers.driver.observe.streaming_progress import StreamingProgress, stream_uuid
from spark_receivers.driver.shutdown_hook import SigtermHook
from spark_receivers.driver.tracking.receiver_launcher import check_local_cores
from spark_receivers.errors import (
    BadRecordError,
    ConfigError,
    ReceiverError,
    StateError,
    StreamingError,
)
from spark_receivers.receiver.receiver import Receiver
from spark_receivers.receiver.source_support import JobName
from spark_receivers.rpc.auth import new_secret
from spark_receivers.stream import (
    DataFrameStream,
    ReceiverInputStream,
    StructuredReceiverStream,
    UnionStream,
)
from spark_receivers.util.clock import Clock, SystemClock
from spark_receivers.util.signals import wait_event

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry
    from pyspark.sql import SparkSession

    from spark_receivers.driver.observe.observability import Observability

log = logging.getLogger(__name__)


class ContextState(enum.Enum):
    """Lifecycle of a :class:`StreamingContext`."""

    INITIALIZED = 0
    ACTIVE = 1
    STOPPED = 2


class StreamingContext:
    """Runs receivers on Spark and hands every batch to PySpark as a DataFrame.

    Example::

        ssc = StreamingContext(spark, batch_interval_ms=1000)
        lines = ssc.receiver_stream(SocketTextReceiver("127.0.0.1", 9999))
        lines.foreach_batch(lambda df, t: df.groupBy("value").count().show())
        ssc.start()
        ssc.await_termination(timeout_s=30)
        ssc.stop(graceful=True)

    The configuration is read from the Spark conf (``--conf``, the session builder, and
    runtime ``spark.conf.set``); the fields set explicitly in ``config`` win over it
    (see :mod:`spark_receivers.config`).

    With ``checkpoint_dir`` (a local path or a ``pyarrow.fs`` URI) the driver logs
    its block events to ``<checkpoint_dir>/receivedBlockMetadata``; with
    ``receiver_wal_enabled`` too, receivers log every block to
    ``<checkpoint_dir>/receivedData/<stream_id>`` and batches read blocks whose
    receiver is gone from there. A checkpoint of the batches is written there
    after every batch; :meth:`get_or_create` restarts from it after a driver
    failure. ``start()`` on a context not made by ``get_or_create`` starts
    afresh: it drops the driver WAL events of an earlier run.
    """

    def __init__(
        self,
        spark: SparkSession,
        batch_interval_ms: int,
        checkpoint_dir: str | None = None,
        config: StreamingConfig | None = None,
        clock: Clock | None = None,
    ) -> None:
        if (
            isinstance(batch_interval_ms, bool)
            or not isinstance(batch_interval_ms, int)
            or batch_interval_ms <= 0
        ):
            msg = f"batch_interval_ms must be an integer > 0, got {batch_interval_ms!r}"
            raise ConfigError(msg)
        self.spark = spark
        self.batch_interval_ms = batch_interval_ms
        self._spark_conf = spark_conf_of(spark)
        # Explicit fields of `config` win; every other key still comes from the conf.
        self.config = (config or StreamingConfig()).over(self._spark_conf)
        self.checkpoint_dir: str | None = None
        self._use_checkpoint_dir(checkpoint_dir or self.config.checkpoint_dir or None)
        self._clock = clock or SystemClock()
        self._graph = StreamGraph(spark, batch_interval_ms)
        self._bus = ListenerBus()
        self._state = ContextState.INITIALIZED
        self._lock = threading.RLock()
        self._terminated = threading.Event()
        self._secret = self._spark_conf.get("spark.authenticate.secret") or new_secret()
        self._scheduler: JobScheduler | None = None
        self._recovery: Checkpoint | None = None
        self._sigterm = SigtermHook(
            lambda: self.stop(graceful=True), lambda: self._state is ContextState.STOPPED
        )
        self._progress = ProgressRecorder(
            batch_interval_ms,
            self._receiver_states,
            self._bus,
            keep=self.config.ui_retained_batches,
            describe=self._describe_stream,
            state_operators=self._graph.state_operators,
        )
        self._bus.add(self._progress)
        # Imported here: executors import this package to unpickle receivers, and need
        # pyarrow and pandas only, never the driver's prometheus-client or aiohttp.
        from spark_receivers.driver.observe.observability import Observability

        self._observability: Observability = Observability(
            self.config, self._bus, self._progress, self._spark_conf
        )

    def _use_checkpoint_dir(self, checkpoint_dir: str | None) -> None:
        if checkpoint_dir and self.config.checkpoint_dir != checkpoint_dir:
            # Receivers learn the checkpoint directory through the config they are sent.
            self.config = self.config.replace(checkpoint_dir=checkpoint_dir)
        self.checkpoint_dir = checkpoint_dir
        if self.config.receiver_wal_enabled and not checkpoint_dir:
            msg = (
                "Cannot enable receiver write-ahead log without checkpoint directory set: "
                "pass checkpoint_dir=... to StreamingContext"
            )
            raise ConfigError(msg)

    @classmethod
    def get_or_create(
        cls,
        checkpoint_dir: str,
        create_fn: Callable[[], StreamingContext],
        create_on_error: bool = False,
    ) -> StreamingContext:
        """Build a context with ``create_fn`` and, if a checkpoint exists, restart from it.

        Python pipelines are code, so the context is always built by
        ``create_fn`` (receivers, transforms, outputs); what is recovered is the
        batch state: on ``start()`` the driver WAL is replayed, batches that were
        allocated but not completed run again with the same blocks (read from
        the receiver WAL), the batches of the down time run, the receivers are
        relaunched and batches continue on the grid. Without a checkpoint this
        is a fresh start. A corrupt checkpoint raises :class:`CheckpointError`,
        or, with ``create_on_error=True``, is moved aside for a fresh start.

        Example::

            def create():
                ssc = StreamingContext(spark, 1000, checkpoint_dir=path)
                ssc.receiver_stream(MyReceiver()).foreach_batch(write_batch)
                return ssc

            ssc = StreamingContext.get_or_create(path, create)
            ssc.start()
        """
        store = CheckpointStore(checkpoint_dir)
        checkpoint = store.recover(create_on_error)
        ssc = create_fn()
        if not isinstance(ssc, StreamingContext):
            msg = f"create_fn must return a StreamingContext, got {type(ssc).__name__}"
            raise TypeError(msg)
        ssc._require(ContextState.INITIALIZED, "recover from a checkpoint")
        if ssc.checkpoint_dir != checkpoint_dir:
            ssc._use_checkpoint_dir(checkpoint_dir)
        if checkpoint is not None:
            if checkpoint.batch_interval_ms != ssc.batch_interval_ms:
                msg = (
                    f"the checkpoint in {checkpoint_dir} has batch_interval_ms="
                    f"{checkpoint.batch_interval_ms} but create_fn made {ssc.batch_interval_ms}; "
                    "keep the interval, or delete the checkpoint directory to start afresh"
                )
                raise ConfigError(msg)
            log.info(
                "recovering from %s: last completed batch %d, pending %s",
                store.path,
                checkpoint.last_completed_batch_ms,
                list(checkpoint.pending_batch_ms),
            )
        ssc._recovery = checkpoint
        return ssc

    @property
    def recovered_from_checkpoint(self) -> bool:
        """True when this context restarts from a checkpoint (see :meth:`get_or_create`)."""
        return self._recovery is not None

    # --- building -------------------------------------------------------------

    @property
    def state(self) -> ContextState:
        """The context's lifecycle state."""
        return self._state

    @property
    def streams(self) -> list[ReceiverInputStream | StructuredReceiverStream]:
        """The receiver streams, by stream id (e.g. to reach those ``create_fn`` made)."""
        return self._graph.inputs

    def receiver_stream(self, receiver: Receiver) -> ReceiverInputStream:
        """Add an input stream fed by ``receiver``, read by batches; return it."""
        return self._graph.receiver_stream(receiver)

    def structured_stream(self, receiver: Receiver) -> StructuredReceiverStream:
        """Add a stream fed by ``receiver``, read by Structured Streaming; return it.

        Its blocks go to a block log on the driver instead of batches; after
        ``start()``, :meth:`StructuredReceiverStream.read_stream` gives the
        streaming DataFrame. Stop the queries that read it before stopping the
        context.
        """
        return self._graph.structured_stream(receiver)

    def union(self, *streams: DataFrameStream) -> UnionStream:
        """One stream over ``streams``: each batch is their batches' union by column name.

        Spark's ``ssc.union``, the way to spread one source over several
        receivers. The streams need the same field names and, by name, the same
        Spark types; a mismatch among receivers' schemas raises
        :class:`ConfigError` here (see :class:`~spark_receivers.stream.UnionStream`).
        """
        return self._graph.union(streams)

    def add_streaming_listener(self, listener: StreamingListener) -> None:
        """Add a listener; its callbacks run on the listener bus thread."""
        self._bus.add(listener)

    def remove_streaming_listener(self, listener: StreamingListener) -> None:
        """Remove a listener."""
        self._bus.remove(listener)

    # --- running --------------------------------------------------------------

    def start(self) -> None:
        """Start the receivers and the batches; returns at once."""
        with self._lock:
            self._require(ContextState.INITIALIZED, "start")
            if not self._graph.inputs:
                msg = "no receiver stream: call receiver_stream(...) before start()"
                raise StateError(msg)
            if not self._graph.has_outputs and not self._graph.structured_ids:
                msg = "no output operation: call foreach_batch(...) on a stream before start()"
                raise StateError(msg)
            check_local_cores(self._spark_conf.get("spark.master", ""), len(self._graph.inputs))
            if self.checkpoint_dir and not self.config.job_id:
                # Durable source names (MQTT client ids) come from the checkpoint's own id.
                self.config = self.config.replace(job_id=checkpoint_job_id(self.checkpoint_dir))
            # Network, memory budget, executors' package: one clear error here, or go.
            deployment = prepare(
                self.spark, self.config, self._spark_conf, bool(self._graph.structured_ids)
            )
            assert deployment.side is not None
            self._prepare_sources(JobName(deployment.config.job_id, deployment.side.app_id))
            self._progress.new_run(stream_uuid(self.checkpoint_dir))
            # First the page (a port it cannot bind fails here, before anything runs).
            url = self._observability.start(
                [self._stream_description(s) for s in self._graph.inputs],
                self.status,
                self._receiver_metrics,
                self._clock.get_time_ms(),
                self._spark_conf.get("spark.app.name", ""),
            )
            if url is not None:
                log.info("status page at %s", url)
            try:
                # Every part is made here (nothing runs yet), then started in order.
                self._scheduler = JobScheduler(
                    self.spark,
                    self._graph,
                    self.batch_interval_ms,
                    deployment.config,
                    self._secret,
                    deployment.driver,
                    self._bus,
                    self._clock,
                    self._on_failure,
                    self._recovery,
                )
                self._scheduler.start()
            except BaseException:
                if self._scheduler is not None:
                    # Close what was made (the endpoint's port, the driver WAL).
                    self._scheduler.stop(graceful=False, timeout_ms=0)
                    self._scheduler = None
                self._observability.stop()
                raise
            self._state = ContextState.ACTIVE
            if self.config.stop_gracefully_on_shutdown:
                self._sigterm.install()
        log.info("streaming context started with %d receiver(s)", len(self._graph.inputs))

    def _prepare_sources(self, job: JobName) -> None:
        """Let each receiver open its source's state now (an MQTT session; best effort)."""
        for receiver in self._graph.receivers:
            try:
                receiver.prepare_source(job)
            except Exception as e:
                log.warning(
                    "receiver %d (%s): could not prepare its source (%s); what is sent to it "
                    "before the receiver connects may not be kept for it",
                    receiver.stream_id,
                    receiver.name,
                    e,
                    exc_info=not isinstance(e, ReceiverError),  # an expected one: no stack
                )

    def await_termination(self, timeout_s: float | None = None) -> bool:
        """Wait until the context stops; raise why it failed, if it did. False on timeout.

        On the main thread it wakes every quarter second, so that Ctrl-C (and the SIGTERM
        of ``stop_gracefully_on_shutdown``) are handled even when another thread took the
        signal (``util/signals.py``).
        """
        if not wait_event(self._terminated, timeout_s):
            return False
        error = self._scheduler.error if self._scheduler is not None else None
        if error is not None:
            msg = f"the streaming context failed: {error}"
            raise StreamingError(msg) from error
        return True

    def stop(self, graceful: bool = True, stop_spark: bool = False) -> None:
        """Stop the receivers, then the batches (idempotent).

        ``graceful``: the receivers push their last blocks and every received
        record is processed before this returns (within the graceful stop
        timeout). ``stop_spark`` also stops the SparkSession.
        """
        with self._lock:
            if self._state is ContextState.STOPPED:
                return
            self._state = ContextState.STOPPED
        if self._scheduler is not None:
            timeout_ms = self.config.graceful_stop_timeout_ms or 10 * self.batch_interval_ms
            self._scheduler.stop(graceful, timeout_ms)
        self._observability.stop()
        self._sigterm.restore()
        self._terminated.set()
        if stop_spark:
            self.spark.stop()
        log.info("streaming context stopped (graceful=%s)", graceful)

    def _on_failure(self) -> None:
        # Called on the failing thread (a batch thread, the timer, a launcher): never
        # stop from it, since stopping joins those very threads. A receiver stopped at a
        # bad record (bad_record_policy=fail) leaves a sound pipeline: what it stored
        # before, and the source acknowledged, is processed first.
        error = self._scheduler.error if self._scheduler is not None else None
        graceful = isinstance(error, BadRecordError)
        threading.Thread(
            target=self.stop, kwargs={"graceful": graceful}, name="streaming-stop", daemon=True
        ).start()

    # --- progress and status -------------------------------------------------------

    @property
    def last_progress(self) -> StreamingProgress | None:
        """Progress of the last completed batch, shaped like Structured Streaming's.

        A :class:`~spark_receivers.StreamingProgress`: ``.json()`` and
        ``.prettyJson()`` give ``StreamingQueryProgress``'s field names
        (``batchId``, ``numInputRows``, ``inputRowsPerSecond``, ``sources``...).
        """
        return self._progress.last

    @property
    def recent_progress(self) -> list[StreamingProgress]:
        """Progress of the recent completed batches, oldest first.

        As many as ``spark.streaming.ui.retainedBatches`` (1000) keeps.
        """
        return self._progress.recent

    @property
    def status_page_url(self) -> str | None:
        """The status page's URL while it is served (``spark.receivers.ui.enabled``)."""
        return self._observability.url

    @property
    def metrics_registry(self) -> CollectorRegistry:
        """The context's Prometheus registry (what the status page serves at ``/metrics``).

        For an application that runs its own exporter, e.g.
        ``prometheus_client.start_http_server(9100, registry=ssc.metrics_registry)``.
        """
        return self._observability.registry

    def status(self) -> StreamingStatus:
        """A typed snapshot of where the stream stands now (receivers, batches, records)."""
        scheduler = self._scheduler
        if scheduler is not None:  # made whole, before its start() (JobScheduler's doc)
            status = scheduler.status(self._state.name)
            reports = scheduler.receiver_metrics.snapshot()
            receivers = tuple(
                dataclasses.replace(r, metrics=m if (m := reports.get(r.stream_id)) else None)
                for r in status.receivers
            )
            return dataclasses.replace(status, receivers=receivers)
        receivers = tuple(
            ReceiverStatus(s.stream_id, s.receiver.name, "INACTIVE", None, None, None, 0, 0, 0)
            for s in self._graph.inputs
        )
        return StreamingStatus(self._state.name, self.batch_interval_ms, receivers)

    def _receiver_metrics(self) -> dict[int, ReceiverMetricsInfo]:
        scheduler = self._scheduler
        return {} if scheduler is None else scheduler.receiver_metrics.snapshot()

    def _describe_stream(self, stream_id: int) -> str:
        stream = self._graph.inputs[stream_id]
        return f"{type(stream).__name__}[{stream_id}]: {stream.receiver.name}"

    @staticmethod
    def _stream_description(
        stream: ReceiverInputStream | StructuredReceiverStream,
    ) -> StreamDescription:
        kind = "structured" if isinstance(stream, StructuredReceiverStream) else "batch"
        receiver = stream.receiver
        return StreamDescription(stream.stream_id, receiver.name, kind, type(receiver).__name__)

    def _receiver_states(self) -> dict[int, Any]:
        scheduler = self._scheduler
        return {} if scheduler is None else scheduler.receiver_tracker.receiver_states()

    # --- checks -----------------------------------------------------------------

    def _require(self, state: ContextState, action: str) -> None:
        if self._state is not state:
            msg = f"cannot {action}: the streaming context is {self._state.name}, not {state.name}"
            raise StateError(msg)
