"""What the built-in receivers share besides their thread: an arrival-time column, a job name.

* :data:`TIMESTAMP_FIELD` is the column ``include_timestamp=True`` adds to a
  receiver's schema (Spark's socket source calls the option
  ``includeTimestamp``): when each record arrived, in UTC, in microseconds —
  or the source's own time of it where it has one (a Redis entry id's).
* :func:`durable_name` names a receiver's stream uniquely and stably: the same
  in every restart of its job, different for every other job and stream (an
  MQTT client id, for example), from the job's id, never from a path.

Executor side (and the driver, where a receiver prepares its source); no state.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from spark_receivers.errors import ConfigError
from spark_receivers.receiver.schema import records_to_table

__all__ = [
    "TIMESTAMP_FIELD",
    "JobName",
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
    records: list[Any] | pa.Array | pa.Table,
    record_schema: pa.Schema,
    times_us: int | Sequence[int] | pa.Array | None = None,
) -> pa.Table:
    """``records`` of ``record_schema`` as a table with the ``timestamp`` column appended.

    ``records`` is a list of records, an Arrow array (the one column of the
    default schema) or an Arrow table of ``record_schema``; ``times_us`` one time for
    all of them (None: now) or one per record (a list or an Arrow integer array), in
    microseconds since the epoch.
    """
    if isinstance(records, pa.Array):
        table = pa.Table.from_arrays([records], schema=record_schema)
    elif isinstance(records, pa.Table):
        table = records
    else:
        table = records_to_table(records, record_schema)
    if times_us is None:
        times_us = now_us()
    if isinstance(times_us, int):
        column = pa.repeat(pa.scalar(times_us, TIMESTAMP_FIELD.type), table.num_rows)
    elif isinstance(times_us, pa.Array):
        column = times_us.cast(pa.int64()).cast(TIMESTAMP_FIELD.type)
    else:
        column = pa.array(times_us, TIMESTAMP_FIELD.type)
    return table.append_column(TIMESTAMP_FIELD, column)


@dataclass(frozen=True)
class JobName:
    """What names a job in durable source names: its job id, else its application id.

    ``job_id`` is the config's (``spark.receivers.jobId``, else the random id a
    context with a checkpoint keeps in it: the same for a job restarted from its
    checkpoint wherever that is mounted, different for every other job;
    :mod:`spark_receivers.driver.job_identity`); ``app_id`` the Spark application
    id (the same for every restart of a receiver within the application). Never a
    path or a host name: two pods mount their own volumes at one path.
    """

    job_id: str = ""
    app_id: str = ""

    @classmethod
    def of(cls, supervisor: Any) -> JobName:
        """The job of the supervisor running a receiver (``config.job_id``, ``app_id``)."""
        config = getattr(supervisor, "config", None)
        job_id = str(getattr(config, "job_id", "") or "")
        return cls(job_id, str(getattr(supervisor, "app_id", "") or ""))

    @property
    def scope(self) -> str:
        """What names derive from: ``job``, ``application`` or '' (neither is known)."""
        if self.job_id:
            return "job"
        return "application" if self.app_id else ""

    def durable_name(self, stream_id: int, prefix: str) -> str:
        """``<prefix>-<job>-<stream id>`` (``<prefix>-<stream id>`` when neither is known)."""
        job = self.job_id or self.app_id
        return f"{prefix}-{job}-{stream_id}" if job else f"{prefix}-{stream_id}"


def durable_name(supervisor: Any, stream_id: int, prefix: str) -> str:
    """``<prefix>-<job>-<stream id>``: unique to one job's stream, stable across its restarts.

    The job is the supervisor's (:meth:`JobName.of`): its job id, else its
    application id; a test harness that knows neither gets ``<prefix>-<stream id>``.
    """
    return JobName.of(supervisor).durable_name(stream_id, prefix)


def durable_scope(supervisor: Any) -> str:
    """What :func:`durable_name` derives from: ``job``, ``application`` or ''."""
    return JobName.of(supervisor).scope
