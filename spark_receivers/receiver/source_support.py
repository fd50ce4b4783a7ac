"""What the built-in receivers share besides their thread: an arrival-time column, a job name.

* :data:`TIMESTAMP_FIELD` is the column ``include_timestamp=True`` adds to a
  receiver's schema (Spark's socket source calls the option
  ``includeTimestamp``): when each record arrived, in UTC, in microseconds —
  or the source's own time of it where it has one (a Redis entry id's).
* :func:`durable_name` names a receiver's stream uniquely and stably: the same
  in every restart of its job, different for every other job and stream (an
  MQTT client id, for example).

Executor side; plain functions, no state.
"""

from __future__ import annotations

import hashlib
import os
import time
from collections.abc import Sequence
from typing import Any

import pyarrow as pa

from spark_receivers.errors import ConfigError
from spark_receivers.receiver.schema import records_to_table

__all__ = [
    "TIMESTAMP_FIELD",
    "durable_name",
    "durable_scope",
    "now_us",
    "table_with_times",
    "with_timestamp",
]

TIMESTAMP_FIELD = pa.field("timestamp", pa.timestamp("us", tz="UTC"))
"""The column ``include_timestamp=True`` adds: when a record arrived (UTC, microseconds)."""


def now_us() -> int:
    """The wall-clock time now, in microseconds since the epoch (an arrival time)."""
    return time.time_ns() // 1000


def with_timestamp(schema: pa.Schema, owner: str) -> pa.Schema:
    """``schema`` with :data:`TIMESTAMP_FIELD` appended; ConfigError if it has one already."""
    if TIMESTAMP_FIELD.name in schema.names:
        msg = (
            f"{owner}: include_timestamp=True adds a column {TIMESTAMP_FIELD.name!r}, but the "
            f"declared schema already has one: {schema.names}"
        )
        raise ConfigError(msg)
    return schema.append(TIMESTAMP_FIELD)


def table_with_times(
    records: list[Any] | pa.Array,
    record_schema: pa.Schema,
    times_us: int | Sequence[int] | None = None,
) -> pa.Table:
    """``records`` of ``record_schema`` as a table with the ``timestamp`` column appended.

    ``records`` is a list of records, or an Arrow array (the one column of the
    default schema); ``times_us`` one time for all of them (None: now) or one per
    record, in microseconds since the epoch.
    """
    if isinstance(records, pa.Array):
        table = pa.Table.from_arrays([records], schema=record_schema)
    else:
        table = records_to_table(records, record_schema)
    if times_us is None:
        times_us = now_us()
    if isinstance(times_us, int):
        column = pa.repeat(pa.scalar(times_us, TIMESTAMP_FIELD.type), table.num_rows)
    else:
        column = pa.array(times_us, TIMESTAMP_FIELD.type)
    return table.append_column(TIMESTAMP_FIELD, column)


def durable_name(supervisor: Any, stream_id: int, prefix: str) -> str:
    """``<prefix>-<job>-<stream id>``: unique to one job's stream, stable across its restarts.

    ``<job>`` is a hash of the context's checkpoint directory when it has one
    (a job restarted from its checkpoint gets the same name; a local path is
    made absolute first), else the Spark application id (the same for every
    restart of the receiver within the application). Both come from the
    supervisor running the receiver (``supervisor.config.checkpoint_dir``,
    ``supervisor.app_id``); when it knows neither (a test harness), the name is
    ``<prefix>-<stream id>``.
    """
    config = getattr(supervisor, "config", None)
    checkpoint = str(getattr(config, "checkpoint_dir", "") or "")
    if checkpoint:
        where = checkpoint if "://" in checkpoint else os.path.abspath(checkpoint)
        digest = hashlib.sha256(where.rstrip("/").encode()).hexdigest()[:16]
        return f"{prefix}-{digest}-{stream_id}"
    app_id = str(getattr(supervisor, "app_id", "") or "")
    if app_id:
        return f"{prefix}-{app_id}-{stream_id}"
    return f"{prefix}-{stream_id}"


def durable_scope(supervisor: Any) -> str:
    """What :func:`durable_name` derives from: ``checkpoint``, ``application`` or ''."""
    config = getattr(supervisor, "config", None)
    if getattr(config, "checkpoint_dir", ""):
        return "checkpoint"
    return "application" if getattr(supervisor, "app_id", "") else ""
