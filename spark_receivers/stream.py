"""Streams of DataFrames: the input stream of a receiver and streams derived from it."""

from __future__ import annotations

import itertools
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

    from spark_receivers.context import StreamingContext
    from spark_receivers.receiver.receiver import Receiver

BatchFunction = Callable[["DataFrame", int], None]


class DataFrameStream:
    """A stream with one DataFrame per batch.

    ``foreach_batch(fn)`` registers an output operation called as
    ``fn(df, batch_time_ms)`` on every batch, in registration order across the
    context; ``transform(fn)`` derives a stream whose DataFrame is ``fn(df)``.
    """

    _ids = itertools.count()

    def __init__(
        self,
        context: StreamingContext,
        parent: DataFrameStream | None = None,
        fn: Callable[[DataFrame], DataFrame] | None = None,
    ) -> None:
        self.context = context
        self._parent = parent
        self._fn = fn
        self.id = next(self._ids)
        self._cache: dict[int, DataFrame] = {}
        self._lock = threading.Lock()

    def foreach_batch(self, fn: BatchFunction, name: str | None = None) -> DataFrameStream:
        """Call ``fn(df, batch_time_ms)`` for every batch; return this stream."""
        self.context._add_output(self, fn, name or str(getattr(fn, "__name__", "foreach_batch")))
        return self

    def transform(self, fn: Callable[[DataFrame], DataFrame]) -> DataFrameStream:
        """A stream whose every batch is ``fn`` of this stream's batch."""
        return DataFrameStream(self.context, self, fn)

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

    def __init__(self, context: StreamingContext, receiver: Receiver, stream_id: int) -> None:
        super().__init__(context)
        self.receiver = receiver
        self.stream_id = stream_id

    def _set_batch(self, batch_time_ms: int, df: DataFrame) -> None:
        with self._lock:
            self._cache[batch_time_ms] = df

    def _dataframe(self, batch_time_ms: int) -> DataFrame:
        with self._lock:
            return self._cache[batch_time_ms]
