"""The streams of a context and their output operations (Spark's DStreamGraph).

Streams register themselves and their output operations here, never with the
context. While the context is being built the graph changes; from ``start()``
it is frozen, and the job scheduler hands it a **batch reader** (blocks → a
DataFrame) and the Structured Streaming source options. At each batch the job
generator asks :meth:`StreamGraph.generate_jobs` for the batch's output
operations: every receiver stream's DataFrame is built once, from the blocks
allocated to it, and every output operation is bound to its stream's
DataFrame of that batch (derived streams compute theirs lazily, once per batch).
:meth:`StreamGraph.forget` drops a completed batch's DataFrames.

Thread-safety: building happens on the user's thread before ``start()``; after
it, ``generate_jobs`` and ``forget`` run on batch threads and only read the
frozen lists.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from spark_receivers.driver.batches.job_generator import OutputOperation
from spark_receivers.driver.observe.streaming_progress import StateOperatorProgress
from spark_receivers.errors import ConfigError, StateError
from spark_receivers.receiver.schema import as_arrow_schema
from spark_receivers.stream import (
    BatchFunction,
    BatchFunctionWithId,
    DataFrameStream,
    ReceiverInputStream,
    StateStoreLike,
    StructuredReceiverStream,
    UnionStream,
    describe,
)
from spark_receivers.stream.state import KeyedStateStream, MappedStateStream
from spark_receivers.stream.stats import StatefulStream
from spark_receivers.stream.windows import ReducedWindowedStream, WindowedStream

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

    from spark_receivers.receiver.receiver import Receiver
    from spark_receivers.rpc.messages import ReceivedBlockInfo

__all__ = ["BatchReader", "InputStream", "StreamGraph"]

InputStream = ReceiverInputStream | StructuredReceiverStream
BatchReader = Callable[[ReceiverInputStream, int, list["ReceivedBlockInfo"]], "DataFrame"]
"""Builds a receiver stream's DataFrame of one batch (its time in ms) from its blocks (empty
list: none)."""
SourceOptions = Callable[[int], dict[str, str]]
BlocksOf = Callable[[int], dict[int, list["ReceivedBlockInfo"]]]
"""The blocks of every stream in a batch still remembered (the block tracker's)."""


class StreamGraph:
    """The input streams, in stream-id order, and the output operations, in order."""

    def __init__(self, spark: SparkSession, batch_interval_ms: int = 1000) -> None:
        self.spark = spark
        self._interval_ms = batch_interval_ms
        self._zero_ms = -1
        self._windows: dict[int, tuple[str, int]] = {}
        """Stream id of a windowed or stateful stream → (its name, the batches it needs, ms)."""
        self._stateful: list[StatefulStream] = []
        """The streams keeping state across batches, for the progress's ``stateOperators``."""
        self._blocks_of: BlocksOf | None = None
        self._state_store: StateStoreLike | None = None
        self._window_budget: tuple[int, bool] | None = None
        self._inputs: list[InputStream] = []
        self._outputs: list[tuple[DataFrameStream, BatchFunction, str]] = []
        self._frozen: str | None = None
        self._reader: BatchReader | None = None
        self._source_options: SourceOptions | None = None
        self._lock = threading.Lock()

    # --- building (before start) ---------------------------------------------------

    def receiver_stream(self, receiver: Receiver) -> ReceiverInputStream:
        """Add the stream of a receiver read by batches."""
        stream = ReceiverInputStream(self, receiver, self._next_stream_id(receiver))
        self._inputs.append(stream)
        return stream

    def structured_stream(self, receiver: Receiver) -> StructuredReceiverStream:
        """Add the stream of a receiver read by Structured Streaming."""
        stream = StructuredReceiverStream(self, receiver, self._next_stream_id(receiver))
        self._inputs.append(stream)
        return stream

    def union(self, streams: Sequence[DataFrameStream]) -> UnionStream:
        """A stream over ``streams``, one DataFrame per batch (see :class:`UnionStream`).

        Raises :class:`ConfigError` when a stream is not a batch stream of this
        graph, or when the known schemas differ in field names or Spark types.
        """
        self._require_building("make a union of streams")
        if not streams:
            msg = "union() needs at least one stream, got none"
            raise ConfigError(msg)
        for stream in streams:
            if isinstance(stream, StructuredReceiverStream):
                msg = (
                    f"cannot union structured stream {stream.stream_id}: union the "
                    "DataFrames of read_stream() with unionByName instead"
                )
                raise ConfigError(msg)
            if not isinstance(stream, DataFrameStream):
                msg = f"union() takes streams of this context, got {type(stream).__name__}"
                raise ConfigError(msg)
            if stream.graph is not self:
                msg = f"{describe(stream)} belongs to another streaming context"
                raise ConfigError(msg)
        known = [s for s in streams if s.arrow_schema is not None]
        for other in known[1:]:
            _check_same_fields(known[0], other)
        return UnionStream(self, streams)

    def add_output(self, stream: DataFrameStream, fn: BatchFunction, name: str) -> None:
        """Register ``fn(df, batch_time_ms)`` on every batch of ``stream``."""
        self._require_building("add an output operation")
        if stream.graph is not self:
            msg = "this stream belongs to another streaming context"
            raise ConfigError(msg)
        self._outputs.append((stream, fn, name))

    def with_batch_id(self, fn: BatchFunctionWithId) -> BatchFunction:
        """``fn(df, batch_time_ms, batch_id)`` as an output operation (see :meth:`batch_id`)."""

        @functools.wraps(fn)
        def run(df: DataFrame, batch_time_ms: int) -> None:
            fn(df, batch_time_ms, self.batch_id(batch_time_ms))

        return run

    def batch_id(self, batch_time_ms: int) -> int:
        """``batch_time_ms // batch_interval_ms``: the progress's ``batchId``, kept on a redo.

        A context restarted from its checkpoint has the checkpoint's interval (``get_or_create``
        refuses another), so a redone batch gets the same id.
        """
        return batch_time_ms // self.batch_interval_ms

    @property
    def batch_interval_ms(self) -> int:
        """The context's batch interval."""
        return self._interval_ms

    def windowed(
        self, stream: DataFrameStream, length_ms: int, slide_ms: int | None
    ) -> WindowedStream:
        """``stream.window(length_ms, slide_ms)``: see :class:`WindowedStream`."""
        return WindowedStream(stream, length_ms, slide_ms)

    def keyed_state(
        self,
        stream: DataFrameStream,
        fn: Callable[[Any, Any, Any], Any],
        key: str | list[str],
        state_schema: Any,
        timeout_ms: int | None,
    ) -> KeyedStateStream:
        """``stream.update_state_by_key(...)``: see :class:`KeyedStateStream`."""
        state = KeyedStateStream(stream, fn, key, state_schema, timeout_ms)
        self._stateful.append(state)
        return state

    def mapped_state(
        self,
        stream: DataFrameStream,
        fn: Callable[[Any, Any, Any], Any],
        key: str | list[str],
        state_schema: Any,
        output_schema: Any,
        timeout_ms: int | None,
    ) -> MappedStateStream:
        """``stream.map_with_state(...)``: see :class:`MappedStateStream`."""
        state = MappedStateStream(stream, fn, key, state_schema, output_schema, timeout_ms)
        self._stateful.append(state)
        return state

    def state_operators(self, batch_time_ms: int) -> list[StateOperatorProgress]:
        """The progress's ``stateOperators`` of a batch: each stateful stream's stats."""
        out = []
        for state in self._stateful:
            stats = state.stats(batch_time_ms)
            if stats is not None:
                out.append(
                    StateOperatorProgress(
                        operator_name=state.operation,
                        state_name=state.name,
                        num_rows_total=stats.rows,
                        all_updates_time_ms=stats.update_ms,
                        commit_time_ms=stats.save_ms,
                        saved_bytes=stats.saved_bytes,
                    )
                )
        return out

    def reduced_windowed(
        self,
        stream: DataFrameStream,
        reduce_fn: Callable[[Any, Any], Any],
        inv_reduce_fn: Callable[[Any, Any], Any] | None,
        length_ms: int,
        slide_ms: int | None,
        key: str,
        value: str,
        filter_fn: Callable[[Any], Any] | None,
    ) -> ReducedWindowedStream:
        """``stream.reduce_by_key_and_window(...)``: see :class:`ReducedWindowedStream`."""
        reduced = ReducedWindowedStream(
            stream, reduce_fn, inv_reduce_fn, length_ms, slide_ms, key, value, filter_fn
        )
        if inv_reduce_fn is not None:  # without it each slide reduces anew: no state kept
            self._stateful.append(reduced)
        return reduced

    def add_window(self, stream: DataFrameStream, remember_ms: int) -> str:
        """Register a windowed or stateful stream needing the batches of ``remember_ms``.

        Again for the same stream: its need changes. Returns its name, ``window-<n>`` in
        the order the streams were made (stable for the same ``create_fn``).
        """
        self._require_building("make a windowed stream")
        known = self._windows.get(stream.id)
        name = known[0] if known else f"window-{len(self._windows)}"
        self._windows[stream.id] = (name, remember_ms)
        return name

    @property
    def remember_ms(self) -> int:
        """How long a completed batch's blocks are kept for windows (Spark's rememberDuration).

        0 without windows: a batch's blocks are dropped once it completed.
        """
        return max((ms for _, ms in self._windows.values()), default=0)

    @property
    def zero_time_ms(self) -> int:
        """The batch time before the run's first batch: windows slide from it (Spark's zeroTime)."""
        return self._zero_ms

    def set_zero_time(self, zero_ms: int) -> None:
        """Set by the scheduler before the first batch (from the checkpoint when recovering)."""
        self._zero_ms = zero_ms

    def batch_times(self, after_ms: int, until_ms: int) -> list[int]:
        """The batch times ``t`` of the run with ``after_ms < t <= until_ms``, oldest first."""
        interval, zero = self._interval_ms, self._zero_ms
        start = max(after_ms, zero)
        first = zero + ((start - zero) // interval + 1) * interval
        return list(range(first, until_ms + 1, interval))

    def read_blocks_of(
        self, stream: ReceiverInputStream, times: Sequence[int], now_ms: int
    ) -> DataFrame:
        """One DataFrame over the blocks ``stream`` got in the batches ``times``.

        Raises :class:`ConfigError` when the blocks cannot all stay in the block store's
        memory and have nowhere else to be read from (memory-only storage, no receiver WAL).
        """
        reader, blocks_of = self._reader, self._blocks_of
        if reader is None or blocks_of is None:
            msg = "the stream graph has no batch reader: the context is not started"
            raise StateError(msg)
        blocks = [b for t in times for b in blocks_of(t).get(stream.stream_id, [])]
        budget = self._window_budget
        if budget is not None and not budget[1] and not stream.receiver.storage_level.use_disk:
            size = sum(b.size_bytes for b in blocks)
            if size > budget[0]:
                msg = (
                    f"a window over {describe(stream)} holds {size} bytes of blocks in "
                    f"{len(times)} batches, more than the block store's memory "
                    f"({budget[0]} bytes, spark.receivers.receiver.blockStoreMemory) and its "
                    f"storage level {stream.receiver.storage_level.name} keeps blocks in "
                    "memory only: use MEMORY_AND_DISK, a shorter window, a lower "
                    "spark.streaming.receiver.maxRate, more blockStoreMemory, or the "
                    "receiver WAL (spark.streaming.receiver.writeAheadLog.enable)"
                )
                raise ConfigError(msg)
        return reader(stream, now_ms, blocks)

    def state_store(self) -> StateStoreLike | None:
        """Where stateful streams save their state (None without a checkpoint directory)."""
        return self._state_store

    def _next_stream_id(self, receiver: Receiver) -> int:
        self._require_building("add a receiver stream")
        from spark_receivers.receiver.receiver import Receiver

        if not isinstance(receiver, Receiver):
            msg = f"a stream needs a Receiver instance, got {type(receiver).__name__}"
            raise TypeError(msg)
        if any(s.receiver is receiver for s in self._inputs):
            msg = f"receiver {receiver!r} already feeds stream {receiver.stream_id}"
            raise ConfigError(msg)
        if not isinstance(receiver.schema, pa.Schema):
            # Set on the instance after __init__: converted here, on the driver.
            name = f"{type(receiver).__name__}.schema"
            receiver.schema = as_arrow_schema(receiver.schema, name)
        stream_id = len(self._inputs)
        receiver._stream_id = stream_id
        return stream_id

    def _require_building(self, action: str) -> None:
        if self._frozen is not None:
            msg = f"cannot {action}: the streaming context is {self._frozen}, not INITIALIZED"
            raise StateError(msg)

    # --- what the scheduler reads --------------------------------------------------

    @property
    def inputs(self) -> list[InputStream]:
        """Every input stream, by stream id."""
        return list(self._inputs)

    @property
    def receivers(self) -> list[Receiver]:
        """Every receiver, by stream id."""
        return [s.receiver for s in self._inputs]

    @property
    def batched_ids(self) -> list[int]:
        """Ids of the streams read by batches."""
        return [s.stream_id for s in self._inputs if isinstance(s, ReceiverInputStream)]

    @property
    def structured_ids(self) -> list[int]:
        """Ids of the streams read by Structured Streaming."""
        return [s.stream_id for s in self._inputs if isinstance(s, StructuredReceiverStream)]

    @property
    def has_outputs(self) -> bool:
        """True when some output operation is registered."""
        return bool(self._outputs)

    def freeze(
        self,
        state: str,
        reader: BatchReader,
        source_options: SourceOptions,
        blocks_of: BlocksOf | None = None,
        state_store: StateStoreLike | None = None,
        window_budget: tuple[int, bool] | None = None,
    ) -> None:
        """No more changes; batches are read with ``reader`` (called by the scheduler).

        Windows read the blocks of remembered batches from ``blocks_of``, stateful
        streams save their state in ``state_store``; ``window_budget`` is the block
        store's memory and whether the receiver WAL holds every block too.
        """
        with self._lock:
            self._frozen = state
            self._reader = reader
            self._source_options = source_options
            self._blocks_of = blocks_of
            self._state_store = state_store
            self._window_budget = window_budget

    def stopped(self) -> None:
        """The context stopped: structured streams can no longer be read."""
        with self._lock:
            self._frozen = "STOPPED"
            self._source_options = None

    def source_options(self, stream_id: int) -> dict[str, str]:
        """The ``spark.readStream`` options of a structured stream (context must run)."""
        with self._lock:
            options, state = self._source_options, self._frozen or "INITIALIZED"
        if options is None:
            msg = f"cannot read a structured stream: the streaming context is {state}, not ACTIVE"
            raise StateError(msg)
        return options(stream_id)

    # --- batches (batch threads) -----------------------------------------------------

    def generate_jobs(
        self, batch_time_ms: int, blocks: dict[int, list[ReceivedBlockInfo]]
    ) -> list[OutputOperation]:
        """Build the batch's DataFrames and bind every output operation to them."""
        reader = self._reader
        if reader is None:
            msg = "the stream graph has no batch reader: the context is not started"
            raise StateError(msg)
        for stream in self._inputs:
            if isinstance(stream, ReceiverInputStream):
                df = reader(stream, batch_time_ms, blocks.get(stream.stream_id, []))
                stream._set_batch(batch_time_ms, df)
        return [
            OutputOperation(i, name, _bind(fn, out, batch_time_ms))
            for i, (out, fn, name) in enumerate(self._outputs)
            if out._is_valid(batch_time_ms)  # a window's outputs run at its slides only
        ]

    def forget(self, batch_time_ms: int) -> None:
        """Drop the DataFrames of a batch that completed."""
        for out, _, _ in self._outputs:
            out._forget(batch_time_ms)
        for stream in self._inputs:
            if isinstance(stream, ReceiverInputStream):
                stream._forget(batch_time_ms)


def _check_same_fields(first: DataFrameStream, other: DataFrameStream) -> None:
    """Same field names, and by name the same Spark types (nullability aside)."""
    a, b = first.arrow_schema, other.arrow_schema
    assert a is not None and b is not None
    if sorted(a.names) != sorted(b.names):
        missing = sorted(set(a.names) - set(b.names))
        extra = sorted(set(b.names) - set(a.names))
        msg = (
            f"cannot union {describe(other)} with {describe(first)}: a union needs the same "
            f"field names, {describe(other)} has {b.names} ({missing} missing, {extra} extra) "
            f"and {describe(first)} has {a.names}; declare the same schema on the receivers, "
            "or rename the fields in a transform() before the union"
        )
        raise ConfigError(msg)
    for name in a.names:
        left, right = _spark_type(a.field(name).type), _spark_type(b.field(name).type)
        if left != right:
            msg = (
                f"cannot union {describe(other)} with {describe(first)}: field {name!r} is "
                f"{right.simpleString()} in one and {left.simpleString()} in the other; "
                "cast it in a transform() before the union"
            )
            raise ConfigError(msg)


def _spark_type(arrow_type: pa.DataType) -> Any:
    from pyspark.sql.pandas.types import from_arrow_type

    return from_arrow_type(arrow_type)


def _bind(fn: BatchFunction, stream: DataFrameStream, batch_time_ms: int) -> Callable[[], None]:
    def run() -> None:
        fn(stream._dataframe(batch_time_ms), batch_time_ms)

    return run
