"""State by key across batches: Spark's ``updateStateByKey``, on DataFrames with pandas.

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
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from spark_receivers.errors import ConfigError
from spark_receivers.stream import DataFrameStream
from spark_receivers.stream.windows import DEFAULT_CHECKPOINT_MS, refuse_windowed_parent

if TYPE_CHECKING:
    import pandas as pd
    from pyspark.sql import DataFrame
    from pyspark.sql.types import StructType

UPDATED = "__updated_ms"
"""The hidden state column of a stream with a timeout: when the key last got rows."""


class KeyedStateStream(DataFrameStream):
    """The state by key after every batch; made by ``stream.update_state_by_key`` (module doc)."""

    stateful = True

    def __init__(
        self,
        parent: DataFrameStream,
        fn: Callable[[Any, Any, Any], Any],
        key: str | list[str],
        state_schema: Any,
        timeout_ms: int | None = None,
    ) -> None:
        what = "update_state_by_key"
        if not callable(fn):
            msg = f"{what}: fn must be a function (key, rows, state) -> state, got {fn!r}"
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
                state = self._step(state, t, now_ms)
                self._states[t] = state
                self.computed.append(t)
                if store is not None and (t - zero) % self.checkpoint_interval_ms == 0:
                    table = state.toArrow()
                    store.save(self.name, t, table, t - 2 * self.checkpoint_interval_ms)
            for old in [x for x in self._states if x < batch_time_ms]:
                del self._states[old]
            self._states[batch_time_ms] = state
            return state

    def _from_table(self, table: Any) -> DataFrame:
        return self.graph.spark.createDataFrame(table.to_pandas(), self._internal_schema)

    def _step(self, state: DataFrame, t: int, now_ms: int) -> DataFrame:
        assert self._parent is not None
        rows = self._parent._window_frame([t], now_ms)
        missing = [k for k in self.keys if k not in rows.columns]
        if missing:
            msg = (
                f"update_state_by_key: the stream's batches have no key column {missing} "
                f"(columns {rows.columns}); select it in a transform() first"
            )
            raise ConfigError(msg)
        step = _step_fn(self._update_fn, self.state_schema, t, self.timeout_ms)
        keys = self.keys
        new = rows.groupBy(*keys).cogroup(state.groupBy(*keys))
        return new.applyInPandas(step, self._internal_schema).localCheckpoint(eager=True)


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


def _struct(schema: Any, what: str) -> StructType:
    from pyspark.sql.types import StructType, _parse_datatype_string

    if isinstance(schema, StructType):
        return schema
    if isinstance(schema, str):
        try:
            parsed = _parse_datatype_string(schema)
        except Exception as e:
            msg = f"{what}: state_schema {schema!r} is not a DDL schema: {e}"
            raise ConfigError(msg) from e
        if isinstance(parsed, StructType):
            return parsed
    msg = f"{what}: state_schema must be a DDL string or a StructType, got {schema!r}"
    raise ConfigError(msg)
