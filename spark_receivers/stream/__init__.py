"""Streams of DataFrames: the input stream of a receiver and streams derived from it."""

from __future__ import annotations

import functools
import inspect
import itertools
import threading
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from spark_receivers.errors import ConfigError

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import DataFrame, SparkSession

    from spark_receivers.receiver.receiver import Receiver

BatchFunction = Callable[["DataFrame", int], None]
BatchFunctionWithId = Callable[["DataFrame", int, int], None]


def takes_batch_id(fn: Callable[..., Any], with_batch_id: bool | None) -> bool:
    """Whether ``foreach_batch`` calls ``fn(df, batch_time_ms, batch_id)``.

    ``with_batch_id`` True or False decides; None: True when ``fn`` has three or more
    positional parameters (``*args`` alone does not count: say it with
    ``with_batch_id=True``), else the two-argument form ``fn(df, batch_time_ms)``.
    """
    if with_batch_id is not None:
        if not isinstance(with_batch_id, bool):
            msg = (
                "foreach_batch(with_batch_id=...) must be True, False or None, "
                f"got {with_batch_id!r}"
            )
            raise ConfigError(msg)
        return with_batch_id
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):  # a builtin without a signature: the two-argument form
        return False
    positional = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    return sum(p.kind in positional for p in params) >= 3


class StreamGraphLike(Protocol):
    """What a stream asks of its graph (``driver/batches/stream_graph.StreamGraph`` is the one)."""

    spark: SparkSession

    def add_output(self, stream: DataFrameStream, fn: BatchFunction, name: str) -> None:
        """Register an output operation on ``stream``."""
        ...

    def with_batch_id(self, fn: BatchFunctionWithId) -> BatchFunction:
        """``fn`` called with the batch's id as third argument."""
        ...

    def source_options(self, stream_id: int) -> dict[str, str]:
        """The ``spark.readStream`` options of a structured stream."""
        ...

    def union(self, streams: Sequence[DataFrameStream]) -> UnionStream:
        """A stream over ``streams`` (checked: same graph, same fields)."""
        ...

    def windowed(
        self, stream: DataFrameStream, length_ms: int, slide_ms: int | None
    ) -> DataFrameStream:
        """``stream.window(length_ms, slide_ms)`` (``stream/windows.py``)."""
        ...

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
    ) -> DataFrameStream:
        """``stream.reduce_by_key_and_window(...)`` (``stream/windows.py``)."""
        ...

    def keyed_state(
        self,
        stream: DataFrameStream,
        fn: Callable[[Any, Any, Any], Any],
        key: str | list[str],
        state_schema: Any,
        timeout_ms: int | None,
    ) -> DataFrameStream:
        """``stream.update_state_by_key(...)`` (``stream/state.py``)."""
        ...

    def mapped_state(
        self,
        stream: DataFrameStream,
        fn: Callable[[Any, Any, Any], Any],
        key: str | list[str],
        state_schema: Any,
        output_schema: Any,
        timeout_ms: int | None,
    ) -> DataFrameStream:
        """``stream.map_with_state(...)`` (``stream/state.py``)."""
        ...

    @property
    def batch_interval_ms(self) -> int:
        """The context's batch interval."""
        ...

    @property
    def zero_time_ms(self) -> int:
        """The batch time before the first batch of the run (Spark's ``zeroTime``)."""
        ...

    def add_window(self, stream: DataFrameStream, remember_ms: int) -> str:
        """Register a windowed or stateful stream that needs ``remember_ms`` of batches.

        Returns the stream's stable name (the same for the same ``create_fn``).
        """
        ...

    def batch_times(self, after_ms: int, until_ms: int) -> list[int]:
        """The batch times ``t`` of this run with ``after_ms < t <= until_ms``, oldest first."""
        ...

    def read_blocks_of(
        self, stream: ReceiverInputStream, times: Sequence[int], now_ms: int
    ) -> DataFrame:
        """One DataFrame over the blocks ``stream`` got in the batches ``times``."""
        ...

    def state_store(self) -> StateStoreLike | None:
        """Where stateful streams checkpoint their state (None without a checkpoint dir)."""
        ...


class StateStoreLike(Protocol):
    """Saves and loads the state of stateful streams (``driver/batches/state_store.py``)."""

    def save(self, name: str, time_ms: int, table: pa.Table, keep_after_ms: int) -> None:
        """Save the state of ``name`` at ``time_ms``; drop those before ``keep_after_ms``."""
        ...

    def load(self, name: str, time_ms: int) -> pa.Table | None:
        """The state of ``name`` saved at ``time_ms``, or None."""
        ...

    def latest(self, name: str, at_most_ms: int) -> int | None:
        """The newest time at most ``at_most_ms`` with a saved state of ``name``."""
        ...


class DataFrameStream:
    """A stream with one DataFrame per batch.

    ``foreach_batch(fn)`` registers an output operation called as
    ``fn(df, batch_time_ms)`` — or ``fn(df, batch_time_ms, batch_id)`` — on every
    batch, in registration order across the context; ``transform(fn)`` derives a
    stream whose DataFrame is ``fn(df)``.
    """

    _ids = itertools.count()

    def __init__(
        self,
        graph: StreamGraphLike,
        parent: DataFrameStream | None = None,
        fn: Callable[[DataFrame], DataFrame] | None = None,
    ) -> None:
        self.graph = graph
        self._parent = parent
        self._fn = fn
        self.id = next(self._ids)
        self._cache: dict[int, DataFrame] = {}
        self._lock = threading.Lock()

    def foreach_batch(
        self,
        fn: BatchFunction | BatchFunctionWithId,
        name: str | None = None,
        *,
        with_batch_id: bool | None = None,
    ) -> DataFrameStream:
        """Call ``fn(df, batch_time_ms)`` for every batch; return this stream.

        A function of three positional parameters (or any, with ``with_batch_id=True``)
        is called ``fn(df, batch_time_ms, batch_id)``: ``batch_id`` is
        ``batch_time_ms // batch_interval_ms``, the ``batchId`` of the batch's progress
        (``ssc.last_progress``), the same when the batch runs again after a recovery from
        the checkpoint — with the same blocks, so the same records — and different for
        every other batch of the job: a key a sink can write idempotently by (skip or
        replace what an earlier run of the batch wrote), as Structured Streaming's
        ``foreachBatch(df, batch_id)``; with the progress's ``id`` (one per checkpoint) it
        names the batch across jobs. The two-argument form stays as it is.
        """
        label = name or str(getattr(fn, "__name__", "foreach_batch"))
        if takes_batch_id(fn, with_batch_id):
            self.graph.add_output(self, self.graph.with_batch_id(fn), label)  # type: ignore[arg-type]
        else:
            self.graph.add_output(self, fn, label)  # type: ignore[arg-type]
        return self

    def transform(self, fn: Callable[[DataFrame], DataFrame]) -> DataFrameStream:
        """A stream whose every batch is ``fn`` of this stream's batch."""
        return DataFrameStream(self.graph, self, fn)

    def union(self, *others: DataFrameStream) -> UnionStream:
        """A stream whose every batch is this stream's batch and the others', by column name.

        The same as ``ssc.union(self, *others)`` (see :class:`UnionStream`).
        """
        return self.graph.union([self, *others])

    def window(self, length_ms: int, slide_ms: int | None = None) -> DataFrameStream:
        """A stream whose batch at each slide is every batch of the last ``length_ms``.

        Spark's ``window(windowDuration, slideDuration)``: see
        :class:`~spark_receivers.stream.windows.WindowedStream`.
        """
        return self.graph.windowed(self, length_ms, slide_ms)

    def count_by_window(self, length_ms: int, slide_ms: int) -> DataFrameStream:
        """One row, column ``count``: the records of the window, at each slide.

        Spark's ``countByWindow``.
        """
        return self.window(length_ms, slide_ms).transform(lambda df: df.groupBy().count())

    def reduce_by_key_and_window(
        self,
        reduce_fn: Callable[[Any, Any], Any],
        inv_reduce_fn: Callable[[Any, Any], Any] | None,
        length_ms: int,
        slide_ms: int | None = None,
        key: str = "key",
        value: str = "value",
        filter_fn: Callable[[Any], Any] | None = None,
    ) -> DataFrameStream:
        """Per ``key``, ``value`` reduced over the window, at each slide.

        Spark's ``reduceByKeyAndWindow``: see
        :class:`~spark_receivers.stream.windows.ReducedWindowedStream`.
        """
        return self.graph.reduced_windowed(
            self, reduce_fn, inv_reduce_fn, length_ms, slide_ms, key, value, filter_fn
        )

    def update_state_by_key(
        self,
        fn: Callable[[Any, Any, Any], Any],
        key: str | list[str],
        state_schema: Any,
        timeout_ms: int | None = None,
    ) -> DataFrameStream:
        """The state by ``key`` after every batch, updated by ``fn(key, rows, state)``.

        Spark's ``updateStateByKey`` on pandas frames: see
        :class:`~spark_receivers.stream.state.KeyedStateStream`.
        """
        return self.graph.keyed_state(self, fn, key, state_schema, timeout_ms)

    def map_with_state(
        self,
        fn: Callable[[Any, Any, Any], Any],
        key: str | list[str],
        state_schema: Any,
        output_schema: Any,
        timeout_ms: int | None = None,
    ) -> DataFrameStream:
        """Records mapped by ``fn(key, rows, state) -> (new_state, output)`` per ``key``.

        Spark's ``mapWithState``: the stream's batch is the output; its
        ``state_snapshots()`` the whole state. See
        :class:`~spark_receivers.stream.state.MappedStateStream`.
        """
        return self.graph.mapped_state(self, fn, key, state_schema, output_schema, timeout_ms)

    def checkpoint(self, interval_ms: int) -> DataFrameStream:
        """Save this stream's state every ``interval_ms``: Spark's ``DStream.checkpoint``.

        Only a stream that keeps state across batches has one to save (a
        ``reduce_by_key_and_window`` with an inverse, an ``update_state_by_key``);
        on any other stream this raises :class:`ConfigError`.
        """
        msg = (
            f"checkpoint({interval_ms!r}): {describe(self)} keeps no state across batches; "
            "call it on the stream reduce_by_key_and_window (with inv_reduce_fn) or "
            "update_state_by_key or map_with_state returns"
        )
        raise ConfigError(msg)

    @property
    def arrow_schema(self) -> pa.Schema | None:
        """The schema of this stream's batches when known before they run, else None.

        Known for a receiver's stream (its receiver's schema) and a union of
        streams with a known schema; a ``transform`` may change it, so it is None.
        """
        return None

    def show(self, n: int = 20, truncate: bool = True) -> DataFrameStream:
        """Print the first ``n`` rows of every batch with its time (an output operation)."""

        def show(df: DataFrame, batch_time_ms: int) -> None:
            print(
                f"-------------------------------------------\nBatch: {batch_time_ms}\n"
                "-------------------------------------------"
            )
            df.show(n, truncate=truncate)

        return self.foreach_batch(show, "show")

    print = show

    def _dataframe(self, batch_time_ms: int) -> DataFrame:
        with self._lock:
            df = self._cache.get(batch_time_ms)
        if df is None:
            df = self._compute(batch_time_ms)
            with self._lock:
                self._cache[batch_time_ms] = df
        return df

    def _compute(self, batch_time_ms: int) -> DataFrame:
        assert self._parent is not None and self._fn is not None
        return self._fn(self._parent._dataframe(batch_time_ms))

    def _upstream(self) -> tuple[DataFrameStream, ...]:
        return () if self._parent is None else (self._parent,)

    def _is_valid(self, batch_time_ms: int) -> bool:
        """Whether this stream has a batch at ``batch_time_ms`` (a window: only at its slides)."""
        return all(p._is_valid(batch_time_ms) for p in self._upstream())

    def _window_frame(self, times: Sequence[int], now_ms: int) -> DataFrame:
        """The union of this stream's batches at ``times`` (computed during batch ``now_ms``).

        Spark's ``slice``: a derived stream's batch of a window is the union of its
        batches, each computed from its parent's batch of that time.
        """
        assert self._parent is not None and self._fn is not None
        if list(times) == [now_ms]:
            return self._dataframe(now_ms)
        if len(times) <= 1:
            return self._fn(self._parent._window_frame(times, now_ms))
        frames = [self._fn(self._parent._window_frame([t], now_ms)) for t in times]
        return functools.reduce(lambda a, b: a.unionByName(b), frames)

    def _forget(self, batch_time_ms: int) -> None:
        with self._lock:
            self._cache.pop(batch_time_ms, None)
        for parent in self._upstream():
            parent._forget(batch_time_ms)


class UnionStream(DataFrameStream):
    """One DataFrame per batch over several streams: Spark's ``union`` of DStreams.

    Made by ``ssc.union(*streams)`` or ``stream.union(*others)``. Every batch is
    the streams' DataFrames of that batch joined with ``unionByName``: the
    streams must have the same field names (in any order; the union has the
    first stream's order) and, by name, the same Spark types. Receivers' schemas
    are known up front, so a mismatch among them is a :class:`ConfigError` when
    the union is made; for a stream made by ``transform`` it is one when the
    first batch runs. The usual use is spreading one source over several receivers::

        streams = [ssc.receiver_stream(SocketTextReceiver(host, port)) for _ in range(3)]
        ssc.union(*streams).foreach_batch(lambda df, t: df.groupBy("value").count().show())

    Thread-safety: as every stream, built before ``start()``; batches are
    computed on batch threads, once per batch.
    """

    def __init__(self, graph: StreamGraphLike, streams: Sequence[DataFrameStream]) -> None:
        super().__init__(graph)
        self.streams = tuple(streams)

    @property
    def arrow_schema(self) -> pa.Schema | None:
        """The first stream's schema when every stream's schema is known, else None."""
        schemas = [s.arrow_schema for s in self.streams]
        return None if any(x is None for x in schemas) else schemas[0]

    def _compute(self, batch_time_ms: int) -> DataFrame:
        frames = [s._dataframe(batch_time_ms) for s in self.streams]
        first = frames[0].columns
        for stream, df in zip(self.streams[1:], frames[1:], strict=True):
            if sorted(df.columns) != sorted(first):
                msg = (
                    f"cannot union the batch {batch_time_ms} of {describe(stream)} "
                    f"(columns {df.columns}) with {describe(self.streams[0])} (columns "
                    f"{first}): a union needs the same column names; rename or select "
                    "them in a transform() before the union"
                )
                raise ConfigError(msg)
        return functools.reduce(lambda a, b: a.unionByName(b), frames)

    def _upstream(self) -> tuple[DataFrameStream, ...]:
        return self.streams

    def _window_frame(self, times: Sequence[int], now_ms: int) -> DataFrame:
        frames = [s._window_frame(times, now_ms) for s in self.streams]
        return functools.reduce(lambda a, b: a.unionByName(b), frames)


def describe(stream: DataFrameStream) -> str:
    """How errors name a stream: ``stream 2 (SocketTextReceiver-2)`` or ``a transform``."""
    if isinstance(stream, ReceiverInputStream):
        return f"stream {stream.stream_id} ({stream.receiver.name})"
    if isinstance(stream, UnionStream):
        return f"the union of {', '.join(describe(s) for s in stream.streams)}"
    return getattr(stream, "description", "a transformed stream")


class ReceiverInputStream(DataFrameStream):
    """The stream of one receiver: each batch reads the blocks it received."""

    def __init__(self, graph: StreamGraphLike, receiver: Receiver, stream_id: int) -> None:
        super().__init__(graph)
        self.receiver = receiver
        self.stream_id = stream_id

    @property
    def arrow_schema(self) -> pa.Schema:
        """The receiver's schema."""
        return self.receiver.schema

    def _set_batch(self, batch_time_ms: int, df: DataFrame) -> None:
        with self._lock:
            self._cache[batch_time_ms] = df

    def _dataframe(self, batch_time_ms: int) -> DataFrame:
        with self._lock:
            return self._cache[batch_time_ms]

    def _window_frame(self, times: Sequence[int], now_ms: int) -> DataFrame:
        """One read over the blocks of every batch in ``times``."""
        if list(times) == [now_ms]:
            return self._dataframe(now_ms)
        return self.graph.read_blocks_of(self, times, now_ms)


class StructuredReceiverStream:
    """A receiver stream read by Structured Streaming instead of DStream batches.

    Made by :meth:`StreamingContext.structured_stream`; once the context is
    started, :meth:`read_stream` returns the streaming DataFrame (the receiver's
    schema), to use with everything Structured Streaming offers::

        events = ssc.structured_stream(MyReceiver())
        ssc.start()
        counts = events.read_stream().groupBy("value").count()
        query = counts.writeStream.outputMode("complete").format("console").start()

    Offsets are positions in the stream's block log on the driver (recorded in the
    driver WAL with a ``checkpoint_dir``), so a query restarted with the same
    Spark checkpoint and the same ``checkpoint_dir`` reads the same blocks for the
    same offsets (see ``spark/stream_source.py``).
    """

    def __init__(self, graph: StreamGraphLike, receiver: Receiver, stream_id: int) -> None:
        self._graph = graph
        self.receiver = receiver
        self.stream_id = stream_id
        self._read = False

    def source_options(self) -> dict[str, str]:
        """The options of ``spark.readStream.format("spark_receivers")`` for this stream.

        They hold the tracker's address and the application secret: the context must
        be started, and a restarted driver must read them again.
        """
        return self._graph.source_options(self.stream_id)

    def read_stream(self, max_records_per_trigger: int | None = None) -> DataFrame:
        """The streaming DataFrame of this receiver (Structured Streaming).

        ``max_records_per_trigger`` caps the records of one micro-batch (Spark's
        ``ReadMaxRows``; the ``maxRecordsPerTrigger`` option).

        One query per stream: the block log forgets what its query commits, so a second
        call raises :class:`ConfigError` (one query can write to several sinks with
        ``foreachBatch``; a second query needs a ``structured_stream`` of its own).
        """
        from pyspark.sql.pandas.types import from_arrow_schema

        from spark_receivers.spark.stream_source import FORMAT, MAX_RECORDS_OPTION

        if self._read:
            msg = (
                f"read_stream() of structured stream {self.stream_id} was called already: a "
                "structured stream serves one query (its block log forgets what that query "
                "commits). Use the first DataFrame, write to several sinks from one query "
                "with foreachBatch, or make a second structured_stream with its own receiver"
            )
            raise ConfigError(msg)
        options = self.source_options()
        self._read = True
        if max_records_per_trigger is not None:
            options[MAX_RECORDS_OPTION] = str(max_records_per_trigger)
        return (
            self._graph.spark.readStream.format(FORMAT)
            .schema(from_arrow_schema(self.receiver.schema))
            .options(**options)
            .load()
        )
