"""State by key across batches: Spark's ``updateStateByKey`` and ``mapWithState``, in pandas.

(``mapWithState``: :class:`MappedStateStream`, which keeps the state the same way.)

``stream.update_state_by_key(fn, key, state_schema)`` keeps one state row per key. At
every batch ``fn(key, rows, state)`` is called for every key that has rows in the batch or
a state (Spark calls ``updateFunc`` for every key, with no new values for those without):
``rows`` is a pandas frame of the batch's rows of that key (maybe empty), ``state`` a
pandas frame of its state row (empty for a new key); it returns the new state row(s) of
the key with the ``state_schema`` columns (the key columns among them), or an empty frame
to drop the key. It runs in Spark, one group per key (``cogroup(...).applyInPandas``);
the stream's batch is the whole state after the batch.

``timeout_ms``: a key whose state got no rows for that long is dropped before ``fn`` sees
it (the timeout of Spark's ``StateSpec`` for ``mapWithState``).

The state is materialised every batch (``localCheckpoint``, which cuts the lineage) and,
with a checkpoint directory, saved there every ``checkpoint(interval_ms)`` (by default
every ``interval * ceil(10 s / interval)``, as Spark checkpoints a ``StateDStream``): a
driver restarted by ``get_or_create`` loads the last saved state and computes the batches
since then again from their blocks (kept that long; with the receiver WAL they are read
from it after a restart).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from spark_receivers.errors import ConfigError
from spark_receivers.stream import DataFrameStream
from spark_receivers.stream.stats import StateStats, ms_since
from spark_receivers.stream.windows import DEFAULT_CHECKPOINT_MS, refuse_windowed_parent

if TYPE_CHECKING:
    import pandas as pd
    from pyspark.sql import DataFrame
    from pyspark.sql.types import StructType

UPDATED = "__updated_ms"
"""The hidden state column of a stream with a timeout: when the key last got rows."""
OUT = "__output"
"""The hidden column of a ``map_with_state`` frame: True on its output rows, False on state."""
OUT_PREFIX = "__output_"
"""The output columns' prefix in that frame (output and state may share column names)."""


class KeyedStateStream(DataFrameStream):
    """The state by key after every batch; made by ``stream.update_state_by_key`` (module doc)."""

    stateful = True
    operation = "update_state_by_key"

    def __init__(
        self,
        parent: DataFrameStream,
        fn: Callable[[Any, Any, Any], Any],
        key: str | list[str],
        state_schema: Any,
        timeout_ms: int | None = None,
    ) -> None:
        what = self.operation
        if not callable(fn):
            msg = f"{what}: fn must be a function (key, rows, state), got {fn!r}"
            raise ConfigError(msg)
        keys = [key] if isinstance(key, str) else list(key)
        schema = _struct(state_schema, what)
        missing = [k for k in keys if k not in schema.fieldNames()]
        if not keys or missing:
            msg = (
                f"{what}: the state_schema ({schema.simpleString()}) must hold the key "
                f"columns {keys}; {missing or 'no key'} missing"
            )
            raise ConfigError(msg)
        interval = parent.graph.batch_interval_ms
        if timeout_ms is not None and (
            isinstance(timeout_ms, bool) or not isinstance(timeout_ms, int) or timeout_ms <= 0
        ):
            msg = f"{what}: timeout_ms must be an integer of ms > 0 or None, got {timeout_ms!r}"
            raise ConfigError(msg)
        refuse_windowed_parent(what, parent)
        super().__init__(parent.graph, parent, None)
        self.keys, self.state_schema, self.timeout_ms = keys, schema, timeout_ms
        self._update_fn = fn
        self.description = f"the state by key {keys}"
        self.checkpoint_interval_ms = interval * -(-DEFAULT_CHECKPOINT_MS // interval)
        self.name = self.graph.add_window(self, self._remember_ms())
        self._states: dict[int, DataFrame] = {}
        self._state_lock = threading.RLock()
        self.computed: list[int] = []
        """Times of the batches whose state was computed (not loaded from the checkpoint)."""
        self._stats: dict[int, StateStats] = {}

    def checkpoint(self, interval_ms: int) -> KeyedStateStream:
        """Save the state every ``interval_ms`` (a multiple of the batch interval)."""
        interval = self.graph.batch_interval_ms
        if (
            isinstance(interval_ms, bool)
            or not isinstance(interval_ms, int)
            or interval_ms <= 0
            or interval_ms % interval
        ):
            msg = (
                f"checkpoint: interval_ms must be a multiple of the batch interval "
                f"({interval} ms), got {interval_ms!r}"
            )
            raise ConfigError(msg)
        self.checkpoint_interval_ms = interval_ms
        self.graph.add_window(self, self._remember_ms())
        return self

    def _remember_ms(self) -> int:
        # A restart computes again the batches since the last saved state.
        return self.checkpoint_interval_ms + self.graph.batch_interval_ms

    def _window_frame(self, times: Any, now_ms: int) -> DataFrame:
        msg = "a window over a stateful stream is refused when it is made"
        raise AssertionError(msg)

    @property
    def _internal_schema(self) -> StructType:
        from pyspark.sql.types import LongType, StructField, StructType

        if self.timeout_ms is None:
            return self.state_schema
        return StructType([*self.state_schema.fields, StructField(UPDATED, LongType())])

    def _compute(self, batch_time_ms: int) -> DataFrame:
        state = self.state_at(batch_time_ms, batch_time_ms)
        return state.drop(UPDATED) if self.timeout_ms is not None else state

    def state_at(self, batch_time_ms: int, now_ms: int) -> DataFrame:
        """The state after the batch at ``batch_time_ms`` (with the hidden column, if any)."""
        graph = self.graph
        zero, interval = graph.zero_time_ms, graph.batch_interval_ms
        store = graph.state_store()
        with self._state_lock:
            t, state = batch_time_ms, None
            # Back to the newest state in memory or saved, or to the start of the run.
            saved = store.latest(self.name, t) if store is not None else None
            floor = zero if saved is None else max(zero, saved)
            while t > floor and (state := self._states.get(t)) is None:
                t -= interval
            if state is None and store is not None and saved is not None and t == saved > zero:
                table = store.load(self.name, saved)
                if table is not None:
                    state = self._from_table(table)
            if state is None:
                state = graph.spark.createDataFrame([], self._internal_schema)
            while t < batch_time_ms:
                t += interval
                began = time.monotonic()
                state = self._step(state, t, now_ms)
                stats = StateStats(self._state_rows(state).count(), ms_since(began))
                self._states[t] = state
                self.computed.append(t)
                if store is not None and (t - zero) % self.checkpoint_interval_ms == 0:
                    began = time.monotonic()
                    table = state.toArrow()
                    store.save(self.name, t, table, t - 2 * self.checkpoint_interval_ms)
                    stats = replace(stats, save_ms=ms_since(began), saved_bytes=table.nbytes)
                self._stats[t] = stats
            for old in [x for x in self._states if x < batch_time_ms]:
                del self._states[old]
            for old in [x for x in self._stats if x < batch_time_ms - self._remember_ms()]:
                del self._stats[old]
            self._states[batch_time_ms] = state
            return state

    def stats(self, batch_time_ms: int) -> StateStats | None:
        """The state's size and cost at that batch; None when this run did not compute it."""
        with self._state_lock:
            return self._stats.get(batch_time_ms)

    def _from_table(self, table: Any) -> DataFrame:
        return self.graph.spark.createDataFrame(table.to_pandas(), self._internal_schema)

    def _step(self, state: DataFrame, t: int, now_ms: int) -> DataFrame:
        assert self._parent is not None
        rows = self._parent._window_frame([t], now_ms)
        missing = [k for k in self.keys if k not in rows.columns]
        if missing:
            msg = (
                f"{self.operation}: the stream's batches have no key column {missing} "
                f"(columns {rows.columns}); select it in a transform() first"
            )
            raise ConfigError(msg)
        step = self._step_fn(t)
        keys = self.keys
        new = rows.groupBy(*keys).cogroup(self._state_rows(state).groupBy(*keys))
        return new.applyInPandas(step, self._internal_schema).localCheckpoint(eager=True)

    def _step_fn(self, t: int) -> Callable[[Any, pd.DataFrame, pd.DataFrame], pd.DataFrame]:
        return _step_fn(self._update_fn, self.state_schema, t, self.timeout_ms)

    def _state_rows(self, frame: DataFrame) -> DataFrame:
        """The state rows of a frame ``state_at`` gives (all of them here)."""
        return frame


class MappedStateStream(KeyedStateStream):
    """Records mapped with a state by key: Spark's ``mapWithState``, by ``stream.map_with_state``.

    At every batch ``fn(key, rows, state)`` is called for every key with rows in the batch
    (unlike ``update_state_by_key``, a key without rows is not called and keeps its
    state), ``rows`` and ``state`` pandas frames as there. It returns ``(new_state,
    output)``: the key's new state row(s) with the ``state_schema`` columns (None or an
    empty frame removes the key) and the records it maps to with the ``output_schema``
    columns (None or empty: none). The stream's batch is the output of that batch;
    :meth:`state_snapshots` is the stream of the whole state after every batch (Spark's
    ``stateSnapshots``).

    ``timeout_ms``: a key whose state got no rows for that long is called once more with
    no rows (Spark's ``State.isTimingOut``: ``len(rows) == 0`` says it, for only a timing
    out key is ever called without rows); its output is kept and its state removed,
    whatever ``fn`` returns as the new state.

    The state and the output are one frame in Spark (a hidden column tells them apart),
    materialised and checkpointed as ``update_state_by_key``'s state is.
    """

    operation = "map_with_state"

    def __init__(
        self,
        parent: DataFrameStream,
        fn: Callable[[Any, Any, Any], Any],
        key: str | list[str],
        state_schema: Any,
        output_schema: Any,
        timeout_ms: int | None = None,
    ) -> None:
        self.output_schema = _struct(output_schema, self.operation, "output_schema")
        super().__init__(parent, fn, key, state_schema, timeout_ms)
        self.description = f"the records mapped with the state by key {self.keys}"

    def state_snapshots(self) -> DataFrameStream:
        """The whole state after every batch (Spark's ``stateSnapshots``)."""
        return StateSnapshotStream(self)

    @property
    def _internal_schema(self) -> StructType:
        from pyspark.sql.types import BooleanType, LongType, StructField, StructType

        state = [StructField(f.name, f.dataType, True) for f in self.state_schema.fields]
        if self.timeout_ms is not None:
            state.append(StructField(UPDATED, LongType()))
        out = [
            StructField(OUT_PREFIX + f.name, f.dataType, True) for f in self.output_schema.fields
        ]
        return StructType([*state, StructField(OUT, BooleanType(), False), *out])

    def _compute(self, batch_time_ms: int) -> DataFrame:
        from pyspark.sql import functions as F

        frame = self.state_at(batch_time_ms, batch_time_ms).filter(F.col(OUT))
        return frame.select(
            *[F.col(OUT_PREFIX + n).alias(n) for n in self.output_schema.fieldNames()]
        )

    def snapshot(self, batch_time_ms: int) -> DataFrame:
        """The whole state after the batch at ``batch_time_ms``."""
        frame = self._state_rows(self.state_at(batch_time_ms, batch_time_ms))
        return frame.select(*self.state_schema.fieldNames())

    def _from_table(self, table: Any) -> DataFrame:
        # From Arrow, not pandas: the state's integers are null on the output rows.
        return self.graph.spark.createDataFrame(table, self._internal_schema)

    def _state_rows(self, frame: DataFrame) -> DataFrame:
        from pyspark.sql import functions as F

        return frame.filter(~F.col(OUT))

    def _step_fn(self, t: int) -> Callable[[Any, pd.DataFrame, pd.DataFrame], pd.DataFrame]:
        return _map_step_fn(
            self._update_fn, self.state_schema, self._internal_schema, t, self.timeout_ms
        )


class StateSnapshotStream(DataFrameStream):
    """The whole state of a :class:`MappedStateStream` after every batch."""

    stateful = True

    def __init__(self, parent: MappedStateStream) -> None:
        super().__init__(parent.graph, parent, None)
        self.description = f"the state snapshots of {parent.description}"

    def _compute(self, batch_time_ms: int) -> DataFrame:
        assert isinstance(self._parent, MappedStateStream)
        return self._parent.snapshot(batch_time_ms)

    def _window_frame(self, times: Any, now_ms: int) -> DataFrame:
        msg = "a window over a stateful stream is refused when it is made"
        raise AssertionError(msg)


def _step_fn(
    fn: Callable[[Any, Any, Any], Any], schema: StructType, t: int, timeout_ms: int | None
) -> Callable[[Any, pd.DataFrame, pd.DataFrame], pd.DataFrame]:
    """What runs in Spark for one key at batch ``t`` (pickled with ``fn``)."""
    names = schema.fieldNames()

    def step(key: Any, rows: pd.DataFrame, state: pd.DataFrame) -> pd.DataFrame:
        # Spark's Arrow conversion wants typed columns: an empty frame of the state's types.
        empty = state.iloc[0:0]
        if timeout_ms is not None and len(state):
            if len(rows) == 0 and int(state[UPDATED].iloc[0]) <= t - timeout_ms:
                return empty  # timed out: dropped
            updated = t if len(rows) else int(state[UPDATED].iloc[0])
            state = state.drop(columns=[UPDATED])
        else:
            updated = t
        out = fn(key, rows, state)
        if out is None or len(out) == 0:
            return empty  # the key is dropped
        out = out[names]
        if timeout_ms is not None:
            out = out.assign(**{UPDATED: updated})
        return out

    return step


def _map_step_fn(
    fn: Callable[[Any, Any, Any], Any],
    schema: StructType,
    internal: StructType,
    t: int,
    timeout_ms: int | None,
) -> Callable[[Any, pd.DataFrame, pd.DataFrame], pd.DataFrame]:
    """What runs in Spark for one key at batch ``t`` of a ``map_with_state``."""
    state_names = schema.fieldNames()
    columns = internal.fieldNames()
    out_names = [c.removeprefix(OUT_PREFIX) for c in columns if c.startswith(OUT_PREFIX)]

    def step(key: Any, rows: pd.DataFrame, state: pd.DataFrame) -> pd.DataFrame:
        import pandas as pd

        timing_out = (
            timeout_ms is not None
            and len(rows) == 0
            and len(state) > 0
            and int(state[UPDATED].iloc[0]) <= t - timeout_ms
        )
        if len(rows) == 0 and not timing_out:
            # Not called: the state stays as it is. As Python objects: a column Spark gave
            # as Arrow-backed (the all-null output columns) does not go back as it came.
            return state[columns].astype(object)
        new_state, output = _pair(fn(key, rows, state[state_names].reset_index(drop=True)))
        parts = []
        if not timing_out and new_state is not None and len(new_state):
            part = new_state[state_names].assign(**{OUT: False})
            if timeout_ms is not None:
                part = part.assign(**{UPDATED: t})
            parts.append(part)
        if output is not None and len(output):
            part = output[out_names].rename(columns=lambda c: OUT_PREFIX + str(c))
            parts.append(part.assign(**{OUT: True}))
        if not parts:
            return state.iloc[0:0][columns].astype(object)
        return pd.concat(parts, ignore_index=True).reindex(columns=columns).astype(object)

    return step


def _pair(result: Any) -> tuple[Any, Any]:
    if isinstance(result, tuple) and len(result) == 2:
        return result
    msg = (
        "map_with_state: fn must return (new_state, output), two pandas frames or None, "
        f"got {type(result).__name__}"
    )
    raise TypeError(msg)


def _struct(schema: Any, what: str, field: str = "state_schema") -> StructType:
    from pyspark.sql.types import StructType, _parse_datatype_string

    if isinstance(schema, StructType):
        return schema
    if isinstance(schema, str):
        try:
            parsed = _parse_datatype_string(schema)
        except Exception as e:
            msg = f"{what}: {field} {schema!r} is not a DDL schema: {e}"
            raise ConfigError(msg) from e
        if isinstance(parsed, StructType):
            return parsed
    msg = f"{what}: {field} must be a DDL string or a StructType, got {schema!r}"
    raise ConfigError(msg)
