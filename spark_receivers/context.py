"""``StreamingContext``: the public entry point on the driver."""

from __future__ import annotations

import enum
import logging
import re
import threading
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from spark_receivers.config import StreamingConfig
from spark_receivers.driver.job_generator import JobGenerator, OutputOperation
from spark_receivers.driver.listener import BatchInfo, ListenerBus, StreamingListener
from spark_receivers.driver.received_block_tracker import ReceivedBlockTracker
from spark_receivers.driver.receiver_tracker import ReceiverTracker
from spark_receivers.errors import ConfigError, SparkReceiversError, StateError
from spark_receivers.receiver.receiver import Receiver
from spark_receivers.rpc.auth import new_secret
from spark_receivers.rpc.messages import ReceivedBlockInfo
from spark_receivers.rpc.transport import local_bind_host
from spark_receivers.spark import block_source
from spark_receivers.stream import BatchFunction, DataFrameStream, ReceiverInputStream
from spark_receivers.util.clock import Clock, SystemClock

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

log = logging.getLogger(__name__)


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
        self.checkpoint_dir = checkpoint_dir
        conf = dict(spark.sparkContext.getConf().getAll())
        self.config = config or StreamingConfig.from_spark_conf(conf)
        if self.config.receiver_wal_enabled and not checkpoint_dir:
            msg = (
                "Cannot enable receiver write-ahead log without checkpoint directory set: "
                "pass checkpoint_dir=... to StreamingContext"
            )
            raise ConfigError(msg)
        self._spark_conf = conf
        self._clock = clock or SystemClock()
        self._streams: list[ReceiverInputStream] = []
        self._outputs: list[tuple[DataFrameStream, BatchFunction, str]] = []
        self._bus = ListenerBus()
        self._state = ContextState.INITIALIZED
        self._lock = threading.RLock()
        self._terminated = threading.Event()
        self._error: BaseException | None = None
        self._secret = conf.get("spark.authenticate.secret") or new_secret()
        self._progress: deque[dict[str, Any]] = deque(maxlen=100)
        self._empty: dict[int, DataFrame] = {}
        self.receiver_tracker: ReceiverTracker | None = None
        self.block_tracker: ReceivedBlockTracker | None = None
        self.job_generator: JobGenerator | None = None
        self._bus.add(_ProgressListener(self))

    # --- building -------------------------------------------------------------

    @property
    def state(self) -> ContextState:
        """The context's lifecycle state."""
        return self._state

    def receiver_stream(self, receiver: Receiver) -> ReceiverInputStream:
        """Add an input stream fed by ``receiver``; return it."""
        self._require(ContextState.INITIALIZED, "add a receiver stream")
        if not isinstance(receiver, Receiver):
            msg = f"receiver_stream needs a Receiver instance, got {type(receiver).__name__}"
            raise TypeError(msg)
        if any(s.receiver is receiver for s in self._streams):
            msg = f"receiver {receiver!r} already feeds stream {receiver.stream_id}"
            raise ConfigError(msg)
        stream_id = len(self._streams)
        receiver._stream_id = stream_id
        stream = ReceiverInputStream(self, receiver, stream_id)
        self._streams.append(stream)
        return stream

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
            if not self._outputs:
                msg = "no output operation: call foreach_batch(...) on a stream before start()"
                raise StateError(msg)
            self._check_cores()
            block_source.register(self.spark)
            stream_ids = [s.stream_id for s in self._streams]
            self.block_tracker = ReceivedBlockTracker(stream_ids, clock=self._clock)
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
            )
            self.receiver_tracker.start()
            self.job_generator.start()
            self._state = ContextState.ACTIVE
            self._bus.post("on_streaming_started", self._clock.get_time_ms())
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
            self.receiver_tracker.stop(graceful)
            self.job_generator.stop(graceful, timeout_ms)
            self.block_tracker.stop()
            self._bus.stop()
        self._terminated.set()
        if stop_spark:
            self.spark.stop()
        log.info("streaming context stopped (graceful=%s)", graceful)

    # --- batches ----------------------------------------------------------------

    def _build_batch(
        self, batch_time_ms: int, blocks: dict[int, list[ReceivedBlockInfo]]
    ) -> list[OutputOperation]:
        from pyspark.sql.pandas.types import from_arrow_schema

        for stream in self._streams:
            stream_blocks = blocks.get(stream.stream_id, [])
            if stream_blocks:
                schema = from_arrow_schema(stream.receiver.schema)
                df = block_source.blocks_dataframe(self.spark, stream_blocks, schema, self._secret)
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
        for stream, _, _ in self._outputs:
            stream._forget(batch_time_ms)
        for stream in self._streams:
            stream._forget(batch_time_ms)

    def _on_batch_error(self, batch_time_ms: int, error: BaseException) -> None:
        with self._lock:
            if self._error is None:
                self._error = error
        log.error("batch %d failed; stopping the streaming context", batch_time_ms)
        threading.Thread(
            target=self.stop, kwargs={"graceful": False}, name="streaming-stop", daemon=True
        ).start()

    # --- progress ----------------------------------------------------------------

    @property
    def last_progress(self) -> dict[str, Any] | None:
        """Progress of the last completed batch, as a plain dict."""
        return self._progress[-1] if self._progress else None

    @property
    def recent_progress(self) -> list[dict[str, Any]]:
        """Progress of the recent completed batches (up to 100), oldest first."""
        return list(self._progress)

    def _record_progress(self, info: BatchInfo) -> None:
        interval_s = self.batch_interval_ms / 1000.0
        processing_s = (info.processing_delay_ms or 0) / 1000.0
        receivers = {}
        if self.receiver_tracker is not None:
            for sid, state in self.receiver_tracker.receiver_states().items():
                receivers[str(sid)] = state.name
        self._progress.append(
            {
                "batch_time_ms": info.batch_time_ms,
                "num_input_rows": info.num_records,
                "input_rows_per_stream": {
                    str(k): v for k, v in info.num_records_per_stream.items()
                },
                "input_rows_per_second": info.num_records / interval_s,
                "processed_rows_per_second": (info.num_records / processing_s)
                if processing_s
                else 0.0,
                "durations_ms": {
                    "scheduling_delay": info.scheduling_delay_ms,
                    "processing": info.processing_delay_ms,
                    "total_delay": info.total_delay_ms,
                },
                "failed": any(o.failure_reason for o in info.output_operations.values()),
                "receivers": receivers,
            }
        )

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


def _bind(fn: BatchFunction, stream: DataFrameStream, batch_time_ms: int) -> Callable[[], None]:
    def run() -> None:
        df: DataFrame = stream._dataframe(batch_time_ms)
        fn(df, batch_time_ms)

    return run


class _ProgressListener(StreamingListener):
    def __init__(self, ctx: StreamingContext) -> None:
        self._ctx = ctx

    def on_batch_completed(self, info: BatchInfo) -> None:
        self._ctx._record_progress(info)
