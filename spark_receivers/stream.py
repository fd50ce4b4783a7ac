"""Streams of DataFrames: the input stream of a receiver and streams derived from it."""

from __future__ import annotations

import itertools
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

    from spark_receivers.receiver.receiver import Receiver

BatchFunction = Callable[["DataFrame", int], None]


class StreamGraph(Protocol):
    """What a stream asks of its graph (``driver/stream_graph.StreamGraph``)."""

    spark: SparkSession

    def add_output(self, stream: DataFrameStream, fn: BatchFunction, name: str) -> None:
        """Register an output operation on ``stream``."""
        ...

    def source_options(self, stream_id: int) -> dict[str, str]:
        """The ``spark.readStream`` options of a structured stream."""
        ...


class DataFrameStream:
    """A stream with one DataFrame per batch.

    ``foreach_batch(fn)`` registers an output operation called as
    ``fn(df, batch_time_ms)`` on every batch, in registration order across the
    context; ``transform(fn)`` derives a stream whose DataFrame is ``fn(df)``.
    """

    _ids = itertools.count()

    def __init__(
        self,
        graph: StreamGraph,
        parent: DataFrameStream | None = None,
        fn: Callable[[DataFrame], DataFrame] | None = None,
    ) -> None:
        self.graph = graph
        self._parent = parent
        self._fn = fn
        self.id = next(self._ids)
        self._cache: dict[int, DataFrame] = {}
        self._lock = threading.Lock()

    def foreach_batch(self, fn: BatchFunction, name: str | None = None) -> DataFrameStream:
        """Call ``fn(df, batch_time_ms)`` for every batch; return this stream."""
        self.graph.add_output(self, fn, name or str(getattr(fn, "__name__", "foreach_batch")))
        return self

    def transform(self, fn: Callable[[DataFrame], DataFrame]) -> DataFrameStream:
        """A stream whose every batch is ``fn`` of this stream's batch."""
        return DataFrameStream(self.graph, self, fn)

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
            assert self._parent is not None and self._fn is not None
            df = self._fn(self._parent._dataframe(batch_time_ms))
            with self._lock:
                self._cache[batch_time_ms] = df
        return df

    def _forget(self, batch_time_ms: int) -> None:
        with self._lock:
            self._cache.pop(batch_time_ms, None)
        if self._parent is not None:
            self._parent._forget(batch_time_ms)


class ReceiverInputStream(DataFrameStream):
    """The stream of one receiver: each batch reads the blocks it received."""

    def __init__(self, graph: StreamGraph, receiver: Receiver, stream_id: int) -> None:
        super().__init__(graph)
        self.receiver = receiver
        self.stream_id = stream_id

    def _set_batch(self, batch_time_ms: int, df: DataFrame) -> None:
        with self._lock:
            self._cache[batch_time_ms] = df

    def _dataframe(self, batch_time_ms: int) -> DataFrame:
        with self._lock:
            return self._cache[batch_time_ms]


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

    def __init__(self, graph: StreamGraph, receiver: Receiver, stream_id: int) -> None:
        self._graph = graph
        self.receiver = receiver
        self.stream_id = stream_id

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
        """
        from pyspark.sql.pandas.types import from_arrow_schema

        from spark_receivers.spark.stream_source import FORMAT, MAX_RECORDS_OPTION

        options = self.source_options()
        if max_records_per_trigger is not None:
            options[MAX_RECORDS_OPTION] = str(max_records_per_trigger)
        return (
            self._graph.spark.readStream.format(FORMAT)
            .schema(from_arrow_schema(self.receiver.schema))
            .options(**options)
            .load()
        )
