"""``StreamingContext``: the public entry point on the driver."""

from __future__ import annotations

import enum
import logging
import os
import re
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from spark_receivers.config import StreamingConfig
from spark_receivers.driver import tracker_commands
from spark_receivers.driver.checkpoint import Checkpoint, CheckpointStore
from spark_receivers.driver.job_generator import JobGenerator, OutputOperation
from spark_receivers.driver.listener import (
    BlockLostInfo,
    ListenerBus,
    StreamingListener,
)
from spark_receivers.driver.progress import ProgressRecorder
from spark_receivers.driver.rate_controller import RateController
from spark_receivers.driver.rate_estimator import create_rate_estimator
from spark_receivers.driver.received_block_tracker import (
    ReceivedBlockTracker,
    create_driver_wal,
)
from spark_receivers.driver.receiver_tracker import ReceiverTracker
from spark_receivers.driver.scheduling_policy import ReceiverState
from spark_receivers.driver.shutdown_hook import SigtermHook
from spark_receivers.errors import CheckpointError, ConfigError, SparkReceiversError, StateError
from spark_receivers.receiver.receiver import Receiver
from spark_receivers.rpc.auth import new_secret
from spark_receivers.rpc.messages import ReceivedBlockInfo
from spark_receivers.rpc.transport import local_bind_host
from spark_receivers.spark import block_source, stream_source
from spark_receivers.spark.block_fetch import LOST_BLOCK_RE
from spark_receivers.stream import (
    BatchFunction,
    DataFrameStream,
    ReceiverInputStream,
    StructuredReceiverStream,
)
from spark_receivers.util.clock import Clock, SystemClock

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

log = logging.getLogger(__name__)

WARM_UP_JOB_GROUP = "spark-receivers-warm-up"


class ContextState(enum.Enum):
    """Lifecycle of a :class:`StreamingContext`."""

    INITIALIZED = 0
    ACTIVE = 1
    STOPPED = 2


class StreamingError(SparkReceiversError):
    """A batch failed; raised by :meth:`StreamingContext.await_termination`."""


class StreamingContext:
    """Runs receivers on Spark and hands every batch to PySpark as a DataFrame.

    Example::

        ssc = StreamingContext(spark, batch_interval_ms=1000)
        lines = ssc.receiver_stream(SocketTextReceiver("127.0.0.1", 9999))
        lines.foreach_batch(lambda df, t: df.groupBy("value").count().show())
        ssc.start()
        ssc.await_termination(timeout_s=30)
        ssc.stop(graceful=True)

    ``config`` overrides the ``spark.streaming.*`` keys read from the Spark conf.

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
        conf = dict(spark.sparkContext.getConf().getAll())
        self.config = config or StreamingConfig.from_spark_conf(conf)
        self.checkpoint_dir: str | None = None
        self._use_checkpoint_dir(checkpoint_dir or self.config.checkpoint_dir or None)
        self._spark_conf = conf
        self._clock = clock or SystemClock()
        self._streams: list[ReceiverInputStream | StructuredReceiverStream] = []
        self._outputs: list[tuple[DataFrameStream, BatchFunction, str]] = []
        self._bus = ListenerBus()
        self._state = ContextState.INITIALIZED
        self._lock = threading.RLock()
        self._terminated = threading.Event()
        self._error: BaseException | None = None
        self._secret = conf.get("spark.authenticate.secret") or new_secret()
        self._empty: dict[int, DataFrame] = {}
        self.receiver_tracker: ReceiverTracker | None = None
        self.block_tracker: ReceivedBlockTracker | None = None
        self.job_generator: JobGenerator | None = None
        self._recovery: Checkpoint | None = None
        self._checkpoints: CheckpointStore | None = None
        self._sigterm = SigtermHook(
            lambda: self.stop(graceful=True), lambda: self._state is ContextState.STOPPED
        )
        self.rate_controllers: dict[int, RateController] = {}
        """Per stream id, with ``backpressure_enabled``: its latest rate and history."""
        self._progress = ProgressRecorder(self.batch_interval_ms, self._receiver_states)
        self._bus.add(self._progress)

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
        try:
            checkpoint = store.read()
        except CheckpointError:
            if not create_on_error:
                raise
            moved = store.quarantine()
            log.warning(
                "corrupt checkpoint in %s moved to %s; starting afresh", checkpoint_dir, moved
            )
            checkpoint = None
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
        return list(self._streams)

    def receiver_stream(self, receiver: Receiver) -> ReceiverInputStream:
        """Add an input stream fed by ``receiver``, read by batches; return it."""
        stream = ReceiverInputStream(self, receiver, self._add_receiver(receiver))
        self._streams.append(stream)
        return stream

    def structured_stream(self, receiver: Receiver) -> StructuredReceiverStream:
        """Add a stream fed by ``receiver``, read by Structured Streaming; return it.

        Its blocks go to a block log on the driver instead of batches; after
        ``start()``, :meth:`StructuredReceiverStream.read_stream` gives the
        streaming DataFrame. Stop the queries that read it before stopping the
        context.
        """
        stream = StructuredReceiverStream(self, receiver, self._add_receiver(receiver))
        self._streams.append(stream)
        return stream

    def _add_receiver(self, receiver: Receiver) -> int:
        self._require(ContextState.INITIALIZED, "add a receiver stream")
        if not isinstance(receiver, Receiver):
            msg = f"a stream needs a Receiver instance, got {type(receiver).__name__}"
            raise TypeError(msg)
        if any(s.receiver is receiver for s in self._streams):
            msg = f"receiver {receiver!r} already feeds stream {receiver.stream_id}"
            raise ConfigError(msg)
        stream_id = len(self._streams)
        receiver._stream_id = stream_id
        return stream_id

    def add_streaming_listener(self, listener: StreamingListener) -> None:
        """Add a listener; its callbacks run on the listener bus thread."""
        self._bus.add(listener)

    def remove_streaming_listener(self, listener: StreamingListener) -> None:
        """Remove a listener."""
        self._bus.remove(listener)

    def _add_output(self, stream: DataFrameStream, fn: BatchFunction, name: str) -> None:
        self._require(ContextState.INITIALIZED, "add an output operation")
        self._outputs.append((stream, fn, name))

    # --- running --------------------------------------------------------------

    def start(self) -> None:
        """Start the receivers and the batches; returns at once."""
        with self._lock:
            self._require(ContextState.INITIALIZED, "start")
            if not self._streams:
                msg = "no receiver stream: call receiver_stream(...) before start()"
                raise StateError(msg)
            structured = [s.stream_id for s in self._streams if not _batched(s)]
            if not self._outputs and not structured:
                msg = "no output operation: call foreach_batch(...) on a stream before start()"
                raise StateError(msg)
            self._check_cores()
            block_source.register(self.spark)
            if structured:
                stream_source.register(self.spark)
            stream_ids = [s.stream_id for s in self._streams]
            self.block_tracker = self._create_block_tracker(stream_ids, structured)
            self._bus.start()
            self.receiver_tracker = ReceiverTracker(
                self.spark,
                [s.receiver for s in self._streams],
                self.block_tracker,
                self.config,
                self._secret,
                local_bind_host(self._spark_conf),
                self._bus,
                self._clock,
            )
            if self.config.backpressure_enabled:
                self._start_rate_controllers()
            if self.checkpoint_dir:
                self._checkpoints = CheckpointStore(self.checkpoint_dir)
            self.job_generator = JobGenerator(
                self.spark.sparkContext,
                self.batch_interval_ms,
                self.block_tracker,
                self._build_batch,
                self.receiver_tracker.remove_blocks,
                self._bus,
                self._clock,
                self.config.concurrent_jobs,
                self._on_batch_error,
                self._forget_batch,
                self._clean_receivers if self.config.receiver_wal_enabled else None,
                self._write_checkpoint if self._checkpoints is not None else None,
            )
            if self._checkpoints is not None and self._recovery is None:
                self._write_checkpoint(-1, [])
            # First on the bus, before any receiver can register.
            self._bus.post("on_streaming_started", self._clock.get_time_ms())
            if self._recovery is not None:
                # Recovered and down-time batches are allocated before any receiver
                # runs again, so they hold exactly what was logged before the crash.
                self.job_generator.start(self._recovery)
                self.receiver_tracker.start()
            else:
                self.receiver_tracker.start()
                self.job_generator.start()
            self._state = ContextState.ACTIVE
            if self.config.stop_gracefully_on_shutdown:
                self._sigterm.install()
            threading.Thread(
                target=self._warm_up_block_reader, name="block-reader-warm-up", daemon=True
            ).start()
        log.info("streaming context started with %d receiver(s)", len(self._streams))

    def await_termination(self, timeout_s: float | None = None) -> bool:
        """Wait until the context stops; re-raise a batch failure. False on timeout."""
        if not self._terminated.wait(timeout_s):
            return False
        if self._error is not None:
            msg = f"a streaming batch failed: {self._error}"
            raise StreamingError(msg) from self._error
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
            was_active = self._state is ContextState.ACTIVE
            self._state = ContextState.STOPPED
        if was_active:
            assert self.receiver_tracker is not None and self.job_generator is not None
            assert self.block_tracker is not None
            timeout_ms = self.config.graceful_stop_timeout_ms or 10 * self.batch_interval_ms
            self.spark.sparkContext.cancelJobGroup(WARM_UP_JOB_GROUP)
            self.receiver_tracker.stop(graceful)
            self.job_generator.stop(graceful, timeout_ms)
            self.block_tracker.stop()
            self._bus.stop()
            for controller in self.rate_controllers.values():
                controller.stop()
        self._sigterm.restore()
        self._terminated.set()
        if stop_spark:
            self.spark.stop()
        log.info("streaming context stopped (graceful=%s)", graceful)

    def _read_partitions(self) -> int:
        """Read tasks per stream and batch: ``batch_read_partitions``, or one wave.

        One wave is the task slots the receivers leave free (each holds a slot for
        as long as it runs); in local mode also no more than the host's cores, since
        ``local[N]`` may offer more slots than there are cores, and on a busy core
        every extra Python read task costs more than it reads.
        """
        if self.config.batch_read_partitions:
            return self.config.batch_read_partitions
        sc = self.spark.sparkContext
        free = sc.defaultParallelism - len(self._streams)
        master = sc.master or ""
        if master.startswith("local[") or master == "local":
            free = min(free, os.cpu_count() or 1)
        return max(1, free)

    def _warm_up_block_reader(self) -> None:
        """Start the block reader's Python workers before the first batch needs them."""
        sc = self.spark.sparkContext
        try:
            sc.setJobGroup(WARM_UP_JOB_GROUP, "spark-receivers: warm up the block reader", True)
            block_source.warm_up(self.spark, self._read_partitions())
        except Exception as e:  # noqa: BLE001 - only a head start: batches work without it
            log.debug("block reader warm-up did not finish: %s", e)

    # --- backpressure -------------------------------------------------------------

    def _start_rate_controllers(self) -> None:
        """One RateController per stream, fed by the listener bus (Spark's backpressure)."""
        cfg = self.config
        for stream in filter(_batched, self._streams):
            estimator = create_rate_estimator(
                cfg.backpressure_rate_estimator,
                self.batch_interval_ms,
                cfg.backpressure_pid_proportional,
                cfg.backpressure_pid_integral,
                cfg.backpressure_pid_derived,
                cfg.backpressure_pid_min_rate,
            )
            controller = RateController(
                stream.stream_id, estimator, self._publish_rate, cfg.max_rate_or_none
            )
            self.rate_controllers[stream.stream_id] = controller
            self._bus.add(controller)

    def _publish_rate(self, stream_id: int, rate: float) -> None:
        tracker = self.receiver_tracker
        if tracker is not None and self._state is not ContextState.STOPPED:
            tracker.update_rate_limit(stream_id, rate)

    # --- write-ahead logs ---------------------------------------------------------

    def _create_block_tracker(
        self, stream_ids: list[int], offset_stream_ids: list[int]
    ) -> ReceivedBlockTracker:
        if not self.checkpoint_dir:
            return ReceivedBlockTracker(
                stream_ids, clock=self._clock, offset_stream_ids=offset_stream_ids
            )
        wal = create_driver_wal(self.checkpoint_dir, self.config, self._clock)
        recover = self._recovery is not None
        if not recover:
            # A fresh start must not later replay the events of an older run: drop them.
            wal.clean(2**62, wait=True)
        return ReceivedBlockTracker(
            stream_ids, wal, self._clock, recover=recover, offset_stream_ids=offset_stream_ids
        )

    def _write_checkpoint(self, last_completed_ms: int, pending_ms: list[int]) -> None:
        assert self._checkpoints is not None
        self._checkpoints.write(
            Checkpoint(
                batch_interval_ms=self.batch_interval_ms,
                last_completed_batch_ms=last_completed_ms,
                pending_batch_ms=tuple(pending_ms),
                checkpoint_time_ms=self._clock.get_time_ms(),
                config=self.config.as_dict(),
            )
        )

    def _clean_receivers(self, batch_time_ms: int) -> None:
        """Tell receivers to delete WAL segments no batch can need any more.

        The threshold is the oldest ``generated_ms`` of a block the driver still
        tracks (receivers stamp WAL records no earlier than that, in their own
        clock), capped at one batch interval before the completed batch.
        """
        assert self.block_tracker is not None and self.receiver_tracker is not None
        threshold = batch_time_ms - self.batch_interval_ms
        oldest = self.block_tracker.oldest_generated_ms_in_use()
        if oldest is not None:
            threshold = min(threshold, oldest)
        if threshold > 0:
            self.receiver_tracker.run(tracker_commands.CleanupOldBlocks(threshold))

    # --- batches ----------------------------------------------------------------

    def _build_batch(
        self, batch_time_ms: int, blocks: dict[int, list[ReceivedBlockInfo]]
    ) -> list[OutputOperation]:
        from pyspark.sql.pandas.types import from_arrow_schema

        for stream in self._streams:
            if not isinstance(stream, ReceiverInputStream):
                continue
            stream_blocks = blocks.get(stream.stream_id, [])
            if stream_blocks:
                schema = from_arrow_schema(stream.receiver.schema)
                df = block_source.blocks_dataframe(
                    self.spark,
                    stream_blocks,
                    schema,
                    self._secret,
                    self.checkpoint_dir,
                    self._read_partitions(),
                )
            else:
                df = self._empty_dataframe(stream)
            stream._set_batch(batch_time_ms, df)
        return [
            OutputOperation(i, name, _bind(fn, out, batch_time_ms))
            for i, (out, fn, name) in enumerate(self._outputs)
        ]

    def _empty_dataframe(self, stream: ReceiverInputStream) -> DataFrame:
        df = self._empty.get(stream.stream_id)
        if df is None:
            from pyspark.sql.pandas.types import from_arrow_schema

            df = self.spark.createDataFrame([], from_arrow_schema(stream.receiver.schema))
            self._empty[stream.stream_id] = df
        return df

    def _forget_batch(self, batch_time_ms: int) -> None:
        for out, _, _ in self._outputs:
            out._forget(batch_time_ms)
        for stream in self._streams:
            if isinstance(stream, ReceiverInputStream):
                stream._forget(batch_time_ms)

    def _on_batch_error(self, batch_time_ms: int, error: BaseException) -> None:
        self._report_lost_blocks(batch_time_ms, error)
        with self._lock:
            if self._error is None:
                self._error = error
        log.error("batch %d failed; stopping the streaming context", batch_time_ms)
        threading.Thread(
            target=self.stop, kwargs={"graceful": False}, name="streaming-stop", daemon=True
        ).start()

    def _report_lost_blocks(self, batch_time_ms: int, error: BaseException) -> None:
        # Spark wraps the reader's BlockNotFoundError (maybe several times): find the
        # blocks it names in the whole text of the error and its causes.
        texts: list[str] = []
        cause: BaseException | None = error
        while cause is not None and len(texts) < 10:
            texts.append(str(cause))
            cause = cause.__cause__ or cause.__context__
        seen: set[str] = set()
        for match in LOST_BLOCK_RE.finditer("\n".join(texts)):
            block_id, stream_id, records = match.group(1), int(match.group(2)), int(match.group(3))
            if block_id in seen:
                continue
            seen.add(block_id)
            end = match.string.find("\n", match.start())
            reason = match.string[match.start() : end if end >= 0 else None]
            log.error(
                "batch %d lost block %s of stream %d (%d records)",
                batch_time_ms,
                block_id,
                stream_id,
                records,
            )
            self._bus.post(
                "on_block_lost",
                BlockLostInfo(batch_time_ms, stream_id, block_id, records, reason),
            )

    # --- progress ----------------------------------------------------------------

    @property
    def last_progress(self) -> dict[str, Any] | None:
        """Progress of the last completed batch, as a plain dict."""
        return self._progress.last

    @property
    def recent_progress(self) -> list[dict[str, Any]]:
        """Progress of the recent completed batches (up to 100), oldest first."""
        return self._progress.recent

    def _receiver_states(self) -> dict[int, ReceiverState]:
        tracker = self.receiver_tracker
        return {} if tracker is None else tracker.receiver_states()

    # --- checks -----------------------------------------------------------------

    def _require(self, state: ContextState, action: str) -> None:
        if self._state is not state:
            msg = f"cannot {action}: the streaming context is {self._state.name}, not {state.name}"
            raise StateError(msg)

    def _check_cores(self) -> None:
        master = self._spark_conf.get("spark.master", "")
        m = re.fullmatch(r"local\[(\d+)(?:,\d+)?\]", master)
        cores = 1 if master == "local" else int(m.group(1)) if m else None
        if cores is not None and cores <= len(self._streams):
            msg = (
                f"master {master!r} has {cores} core(s) but {len(self._streams)} receiver(s): each "
                "receiver holds a core for good, so no batch could run; "
                f"use local[{len(self._streams) + 2}]"
            )
            raise ConfigError(msg)


def _batched(stream: ReceiverInputStream | StructuredReceiverStream) -> bool:
    return isinstance(stream, ReceiverInputStream)


def _bind(fn: BatchFunction, stream: DataFrameStream, batch_time_ms: int) -> Callable[[], None]:
    def run() -> None:
        df: DataFrame = stream._dataframe(batch_time_ms)
        fn(df, batch_time_ms)

    return run
