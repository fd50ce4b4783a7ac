"""Windowed streams: Spark's ``window``, ``countByWindow`` and ``reduceByKeyAndWindow``.

Spark's semantics (``WindowedDStream``, ``ReducedWindowedDStream``), kept here:

* the length and the slide are multiples of the batch interval (a :class:`ConfigError`
  says which is not); as in Spark the length need not be a multiple of the slide;
* a window fires at the batch times ``t`` with ``t - zero`` a multiple of the slide,
  where ``zero`` is the batch time before the first batch of the run (Spark's
  ``zeroTime``; kept in the checkpoint so a restarted driver keeps the same grid):
  with a slide of 2 s and batches at 1 s, 2 s, 3 s... windows fire at 2 s, 4 s...;
* the window at ``t`` holds the batches with times in ``(t - length, t]``: the first
  windows of a run hold fewer batches (those since the start);
* output operations of a windowed stream (and of streams derived from it) run only
  at its slides.

The blocks of a batch are kept (in the keepers, and their allocation in the driver WAL)
as long as a window needs them: the graph's ``remember`` is the longest window (plus a
slide and the checkpoint interval for an incremental reduce), as Spark's
``rememberDuration``; see ``driver/job_scheduler.py``.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from spark_receivers.errors import ConfigError
from spark_receivers.stream import DataFrameStream, describe
from spark_receivers.stream.keyed_reduce import combine, partials_of_partition, reduce_by_key
from spark_receivers.stream.stats import StateStats, ms_since

if TYPE_CHECKING:
    import pandas as pd
    from pyspark.sql import DataFrame
    from pyspark.sql.types import StructType

DEFAULT_CHECKPOINT_MS = 10_000
"""Spark checkpoints a stream that must be checkpointed every ``slide * ceil(10 s / slide)``."""


def check_durations(what: str, length_ms: int, slide_ms: int, interval_ms: int) -> None:
    """Refuse durations that are not positive multiples of the batch interval."""
    for name, value in (("length_ms", length_ms), ("slide_ms", slide_ms)):
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            msg = f"{what}: {name} must be an integer number of ms > 0, got {value!r}"
            raise ConfigError(msg)
        if value % interval_ms:
            msg = (
                f"{what}: {name}={value} is not a multiple of the batch interval "
                f"({interval_ms} ms); use {max(1, round(value / interval_ms)) * interval_ms}"
            )
            raise ConfigError(msg)


def refuse_windowed_parent(what: str, parent: DataFrameStream) -> None:
    """Refuse a window or a state over a stream derived from a window or a state."""
    todo = [parent]
    while todo:
        s = todo.pop()
        if getattr(s, "stateful", False):
            msg = (
                f"{what} of {describe(s)}: a window or state over a windowed or stateful "
                "stream is not supported; window the input stream once, with the longest "
                "length you need"
            )
            raise ConfigError(msg)
        todo.extend(s._upstream())


class WindowedStream(DataFrameStream):
    """At each slide, one DataFrame over every batch of the last ``length_ms``.

    Made by ``stream.window(length_ms, slide_ms)`` (slide: the batch interval when
    omitted)::

        lines.window(30_000, 10_000).foreach_batch(
            lambda df, t: df.groupBy("value").count().show())

    For a receiver stream (or a union of them) the window is one read over the blocks
    of its batches; for a ``transform`` it is the union of the transform of each batch.
    See the module doc for when windows fire and what they hold.
    """

    stateful = True

    def __init__(self, parent: DataFrameStream, length_ms: int, slide_ms: int | None) -> None:
        interval = parent.graph.batch_interval_ms
        slide = interval if slide_ms is None else slide_ms
        check_durations("window", length_ms, slide, interval)
        refuse_windowed_parent("window", parent)
        super().__init__(parent.graph, parent, None)
        self.length_ms = length_ms
        self.slide_ms = slide
        self.description = f"a window of {length_ms} ms sliding by {slide} ms"
        self.name = self.graph.add_window(self, length_ms)

    def _is_valid(self, batch_time_ms: int) -> bool:
        zero = self.graph.zero_time_ms
        return batch_time_ms > zero and (batch_time_ms - zero) % self.slide_ms == 0

    def window_times(self, batch_time_ms: int) -> list[int]:
        """The batch times of the window that fires at ``batch_time_ms``."""
        return self.graph.batch_times(batch_time_ms - self.length_ms, batch_time_ms)

    def _compute(self, batch_time_ms: int) -> DataFrame:
        assert self._parent is not None
        return self._parent._window_frame(self.window_times(batch_time_ms), batch_time_ms)

    def _window_frame(self, times: Sequence[int], now_ms: int) -> DataFrame:
        msg = "a window over a windowed stream is refused when it is made"
        raise AssertionError(msg)


class ReducedWindowedStream(DataFrameStream):
    """Per key, the values of a window reduced, at each slide: Spark's ``reduceByKeyAndWindow``.

    ``reduce_fn(a, b)`` combines two values of ``value`` (associative and commutative);
    ``inv_reduce_fn(a, b)`` undoes it (``a - b`` for a sum). Both are given pandas
    Series aligned by key (functions written with operators, ``operator.add``,
    ``operator.sub``, are called once per round of pairs: :mod:`.keyed_reduce`), or
    scalars, pair by pair, when a function does not work on Series (``max``). The batch
    at each slide has the columns ``key`` and ``value``.

    A slide is reduced in one Spark stage without a shuffle (each partition by key in
    its task, the partials combined here) and its reduced values are kept until it
    leaves the window, so the slide that leaves costs no Spark job.

    Without ``inv_reduce_fn`` every slide reduces its whole window again. With it, as
    Spark's ``ReducedWindowedDStream`` does, a slide's result is the previous one, with
    the slide that left the window taken out (``inv_reduce_fn``) and the slide that came
    in added (``reduce_fn``): a key stays (with its reduced value, 0 for a count) until
    ``filter_fn(values) -> bool Series`` drops it. That state is kept on the driver and,
    with a checkpoint directory, saved every ``checkpoint(interval_ms)`` (by default every
    ``slide * ceil(10 s / slide)``, as Spark), so a restarted driver goes on from it.
    """

    stateful = True
    operation = "reduce_by_key_and_window"

    def __init__(
        self,
        parent: DataFrameStream,
        reduce_fn: Callable[[Any, Any], Any],
        inv_reduce_fn: Callable[[Any, Any], Any] | None,
        length_ms: int,
        slide_ms: int | None,
        key: str,
        value: str,
        filter_fn: Callable[[Any], Any] | None,
    ) -> None:
        what = "reduce_by_key_and_window"
        interval = parent.graph.batch_interval_ms
        slide = interval if slide_ms is None else slide_ms
        check_durations(what, length_ms, slide, interval)
        refuse_windowed_parent(what, parent)
        for name, fn in (("reduce_fn", reduce_fn), ("inv_reduce_fn", inv_reduce_fn)):
            if fn is not None and not callable(fn):
                msg = f"{what}: {name} must be a function of two values, got {fn!r}"
                raise ConfigError(msg)
        if reduce_fn is None:
            msg = f"{what}: reduce_fn is required (operator.add for a sum)"
            raise ConfigError(msg)
        if filter_fn is not None and inv_reduce_fn is None:
            msg = f"{what}: filter_fn only applies with inv_reduce_fn (as in Spark)"
            raise ConfigError(msg)
        super().__init__(parent.graph, parent, None)
        self.length_ms, self.slide_ms = length_ms, slide
        self.key, self.value = key, value
        self._reduce_fn, self._inv_fn, self._filter_fn = reduce_fn, inv_reduce_fn, filter_fn
        self.description = f"a reduce by key over a window of {length_ms} ms by {slide} ms"
        self.checkpoint_interval_ms = slide * -(-DEFAULT_CHECKPOINT_MS // slide)
        self.name = self.graph.add_window(self, self._remember_ms())
        self._states: dict[int, pd.Series] = {}
        self._schema: StructType | None = None
        self._state_lock = threading.RLock()
        self.states_computed = 0
        """Slides whose state was computed (not loaded): for tests and progress."""
        self._stats: dict[int, StateStats] = {}
        self._slides: dict[int, pd.Series] = {}
        """Each slide's values reduced, by the slide's end time, while it is in the window."""

    def checkpoint(self, interval_ms: int) -> ReducedWindowedStream:
        """Save the state every ``interval_ms`` (a multiple of the slide); return this stream.

        Spark's ``DStream.checkpoint(interval)``: a restarted driver recomputes the slides
        since the last saved state, so the blocks of that long are kept too.
        """
        if isinstance(interval_ms, bool) or not isinstance(interval_ms, int) or interval_ms <= 0:
            msg = f"checkpoint: interval_ms must be an integer of ms > 0, got {interval_ms!r}"
            raise ConfigError(msg)
        if interval_ms % self.slide_ms:
            msg = (
                f"checkpoint: interval_ms={interval_ms} is not a multiple of the slide "
                f"({self.slide_ms} ms) of {self.description}"
            )
            raise ConfigError(msg)
        self.checkpoint_interval_ms = interval_ms
        self.graph.add_window(self, self._remember_ms())
        return self

    def _remember_ms(self) -> int:
        if self._inv_fn is None:
            return self.length_ms
        # The slide that leaves the window, and the slides since the last saved state.
        return self.length_ms + self.slide_ms + self.checkpoint_interval_ms

    def _is_valid(self, batch_time_ms: int) -> bool:
        zero = self.graph.zero_time_ms
        return batch_time_ms > zero and (batch_time_ms - zero) % self.slide_ms == 0

    def _window_frame(self, times: Sequence[int], now_ms: int) -> DataFrame:
        msg = "a window over a windowed stream is refused when it is made"
        raise AssertionError(msg)

    # --- computing -------------------------------------------------------------------

    def _compute(self, batch_time_ms: int) -> DataFrame:
        if self._inv_fn is None:
            times = self.graph.batch_times(batch_time_ms - self.length_ms, batch_time_ms)
            state = self._reduce(times, batch_time_ms)
        else:
            state = self.state_at(batch_time_ms, batch_time_ms)
        assert self._schema is not None
        table = self._to_table(state, (self.key, self.value))
        return self.graph.spark.createDataFrame(table, self._schema)

    def _frame(self, times: Sequence[int], now_ms: int) -> DataFrame:
        """The ``key`` and ``value`` columns of the batches at ``times``, checked."""
        assert self._parent is not None
        key, value = self.key, self.value
        df = self._parent._window_frame(times, now_ms)
        missing = [c for c in (key, value) if c not in df.columns]
        if missing:
            msg = (
                f"reduce_by_key_and_window: the stream's batches have no column {missing} "
                f"(columns {df.columns}); pass key=... and value=..., or select them in a "
                "transform() before the window"
            )
            raise ConfigError(msg)
        df = df.select(key, value)
        if self._schema is None:
            self._schema = df.schema
        return df

    def _reduce(self, times: Sequence[int], now_ms: int) -> pd.Series:
        """The values by key of the batches at ``times``, reduced: one Spark stage.

        Each partition reduces its rows to one per key in its task (``mapInArrow``, no
        shuffle); the driver combines the partitions' partials (:mod:`.keyed_reduce`).
        """
        import pandas as pd

        df = self._frame(times, now_ms)
        if not times:
            return pd.Series([], dtype=object)
        partials = partials_of_partition(self._reduce_fn, self.key, self.value)
        table = df.mapInArrow(partials, df.schema).toArrow()
        keys, values = (_series(table.column(c)) for c in (self.key, self.value))
        return reduce_by_key(self._reduce_fn, keys, values)

    def _slide_values(self, end_ms: int, now_ms: int) -> pd.Series:
        """The values of the slide that ends at ``end_ms``, reduced once and kept.

        A slide is reduced when it comes into the window and kept until it leaves, so the
        slide that leaves costs no Spark job (after a driver restart, the slides of the
        window are read again from their blocks, which are kept that long).
        """
        import pandas as pd

        values = self._slides.get(end_ms)
        if values is None:
            times = self.graph.batch_times(end_ms - self.slide_ms, end_ms)
            if not times:  # before the first batch: nothing to read
                return pd.Series([], dtype=object)
            values = self._slides[end_ms] = self._reduce(times, now_ms)
        return values

    def state_at(self, batch_time_ms: int, now_ms: int) -> pd.Series:
        """The reduced values by key of the window at ``batch_time_ms`` (a slide time)."""
        import pandas as pd

        zero = self.graph.zero_time_ms
        store = self.graph.state_store()
        with self._state_lock:
            if self._schema is None:  # the types of the state's table and frame
                self._frame([], now_ms)
            # Go back to a state known in memory or saved, or to the start of the run.
            t = batch_time_ms
            base: pd.Series | None = None
            saved = store.latest(self.name, t) if store is not None else None
            floor = zero if saved is None else max(zero, saved)
            while t > floor and (base := self._states.get(t)) is None:
                t -= self.slide_ms
            if base is None and store is not None and saved is not None and t == saved > zero:
                table = store.load(self.name, saved)
                if table is not None:
                    base = self._from_table(table)
            state = base if base is not None else pd.Series([], dtype=object)
            while t < batch_time_ms:
                t += self.slide_ms
                began = time.monotonic()
                state = self._slide(state, t, now_ms)
                stats = StateStats(len(state), ms_since(began))
                self._states[t] = state
                self.states_computed += 1
                if store is not None and (t - zero) % self.checkpoint_interval_ms == 0:
                    began = time.monotonic()
                    table = self._to_table(state)
                    store.save(self.name, t, table, t - 2 * self.checkpoint_interval_ms)
                    stats = StateStats(stats.rows, stats.update_ms, ms_since(began), table.nbytes)
                self._stats[t] = stats
            for old in [x for x in self._states if x < batch_time_ms - self.slide_ms]:
                del self._states[old]
            for old in [x for x in self._stats if x < batch_time_ms - self._remember_ms()]:
                del self._stats[old]
            for old in [x for x in self._slides if x <= batch_time_ms - self.length_ms]:
                del self._slides[old]
            return state

    def stats(self, batch_time_ms: int) -> StateStats | None:
        """The state's size and cost at that slide.

        None without an inverse function (no state is kept), off the slides, or when this
        run did not compute it.
        """
        with self._state_lock:
            return self._stats.get(batch_time_ms)

    def _slide(self, prev: pd.Series, t: int, now_ms: int) -> pd.Series:
        """Spark's ``ReducedWindowedDStream``: (previous ⊖ slide that left) ⊕ slide that came."""
        import pandas as pd

        assert self._inv_fn is not None
        new = self._slide_values(t, now_ms)
        old = self._slide_values(t - self.length_ms, now_ms)
        state = prev.copy()
        leaving = old[old.index.isin(state.index)]
        if len(leaving):
            before = state.loc[leaving.index]
            state.loc[leaving.index] = combine(self._inv_fn, before, leaving).to_numpy()
        again = new[new.index.isin(state.index)]
        if len(again):
            before = state.loc[again.index]
            state.loc[again.index] = combine(self._reduce_fn, before, again).to_numpy()
        fresh = new[~new.index.isin(state.index)]
        if len(fresh):
            state = fresh.astype(object) if not len(state) else pd.concat([state, fresh])
        if self._filter_fn is not None and len(state):
            state = state[self._filter_fn(state).astype(bool)]
        return state

    def _to_table(self, state: pd.Series, names: tuple[str, str] = ("key", "value")) -> Any:
        """The state as an Arrow table of the Spark schema's types (checkpoint: key, value)."""
        import pyarrow as pa
        from pyspark.sql.pandas.types import to_arrow_schema

        assert self._schema is not None
        types = [f.type for f in to_arrow_schema(self._schema)]
        keys = pa.array(state.index.to_list(), type=types[0])
        return pa.table([keys, pa.array(state.to_list(), type=types[1])], names=list(names))

    @staticmethod
    def _from_table(table: Any) -> pd.Series:
        import pandas as pd

        return pd.Series(
            table.column("value").to_pylist(), index=table.column("key").to_pylist(), dtype=object
        )


def _series(column: Any) -> pd.Series:
    """An Arrow column as pandas values: Python objects when it has nulls (ints stay ints)."""
    import pandas as pd

    if column.null_count:
        return pd.Series(column.to_pylist(), dtype=object)
    return column.to_pandas()
