"""The progress of one batch, shaped like Structured Streaming's ``StreamingQueryProgress``.

``ssc.last_progress`` / ``ssc.recent_progress`` and the listener event
``on_batch_progress`` give a :class:`StreamingProgress`: typed, frozen, with
snake_case attributes in Python and, in :meth:`StreamingProgress.json`, the JSON
field names of ``StreamingQueryProgress`` wherever the meaning is the same, so
dashboards and tools written for Structured Streaming read it as they are:

==========================  =====================================================
JSON field                  here
==========================  =====================================================
``id``                      the stream's id: stable across restarts from the same
                            checkpoint directory, else new for every context
``runId``                   new at every ``start()``
``name``                    ``None`` (a DStream application has no query name)
``timestamp``               the batch time, ISO 8601 in UTC
``batchId``                 ``batch time / batch interval``: unique, increasing,
                            the same for a batch run again after a driver restart
``batchDuration``           how long the batch's output operations ran (ms)
``numInputRows``            records of every stream in the batch
``inputRowsPerSecond``      those records over one batch interval
``processedRowsPerSecond``  those records over the batch's processing time
``durationMs``              ``triggerExecution`` (processing), ``addBatch`` (the
                            output operations), and ours: ``schedulingDelay``,
                            ``totalDelay``
``sources[]``               one per input stream: ``description``, ``numInputRows``,
                            rates, ``startOffset``/``endOffset`` (the ``store()``
                            metadata of its first and last block, when there is
                            any; else ``null``), ``metrics`` (blocks, bytes)
``sink``                    the output operations (``numOutputRows`` -1: unknown)
``stateOperators[]``        one per stream keeping state by key
                            (``update_state_by_key``, ``map_with_state``):
                            ``operatorName``, ``numRowsTotal`` (keys in the state
                            after the batch), ``allUpdatesTimeMs`` (computing it),
                            ``commitTimeMs`` (saving it to the checkpoint, 0 when
                            not saved at this batch), ``customMetrics``
                            (``stateName``, ``savedBytes``)
``eventTime``,              empty: not known to a receiver stream
``observedMetrics``
==========================  =====================================================

Our own fields, also in camelCase: ``batchTime`` (ms), ``batchInterval`` (ms),
``failed``, ``outputOperations`` and ``receivers`` (each stream's receiver state),
and per source ``streamId``, ``metadata`` (the blocks' ``store()`` metadata) and
``metadataOmitted``.
"""

from __future__ import annotations

import datetime as dt
import json
import uuid
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "OutputOperationProgress",
    "SourceProgress",
    "StateOperatorProgress",
    "StreamingProgress",
    "iso_time",
    "stream_uuid",
]


def iso_time(time_ms: int) -> str:
    """``time_ms`` as Structured Streaming writes times: ``2026-11-24T10:00:01.000Z``."""
    when = dt.datetime.fromtimestamp(time_ms / 1000, tz=dt.UTC)
    return when.strftime("%Y-%m-%dT%H:%M:%S.") + f"{when.microsecond // 1000:03d}Z"


def stream_uuid(checkpoint_dir: str | None) -> str:
    """The ``id`` of a context's progress: derived from its checkpoint dir, else random."""
    if checkpoint_dir:
        return str(uuid.uuid5(uuid.NAMESPACE_URL, "spark-receivers:" + checkpoint_dir))
    return str(uuid.uuid4())


@dataclass(frozen=True)
class StateOperatorProgress:
    """The state of one stateful stream after a batch (Structured's ``StateOperatorProgress``)."""

    operator_name: str
    state_name: str
    """The stream's name in the checkpoint: ``<checkpoint_dir>/state/<state_name>``."""
    num_rows_total: int
    all_updates_time_ms: int
    commit_time_ms: int
    saved_bytes: int
    """Bytes of the state saved at this batch (Arrow), 0 when not saved at it."""

    def to_dict(self) -> dict[str, Any]:
        """The JSON object."""
        return {
            "operatorName": self.operator_name,
            "numRowsTotal": self.num_rows_total,
            "allUpdatesTimeMs": self.all_updates_time_ms,
            "commitTimeMs": self.commit_time_ms,
            "customMetrics": {"stateName": self.state_name, "savedBytes": self.saved_bytes},
        }


@dataclass(frozen=True)
class SourceProgress:
    """What one input stream brought to a batch (Structured Streaming's ``SourceProgress``)."""

    stream_id: int
    description: str
    num_input_rows: int
    input_rows_per_second: float
    processed_rows_per_second: float
    num_blocks: int = 0
    size_bytes: int = 0
    start_offset: Any = None
    """The ``store()`` metadata of the stream's first block in the batch that had some."""
    end_offset: Any = None
    """The ``store()`` metadata of its last block in the batch that had some."""
    metadata: tuple[dict[str, Any], ...] = ()
    metadata_omitted: int = 0
    position: str | None = None
    """The source position of the stream's last block in the batch stored with one."""

    def to_dict(self) -> dict[str, Any]:
        """The JSON object, with ``SourceProgress`` field names."""
        return {
            "description": self.description,
            "startOffset": self.start_offset,
            "endOffset": self.end_offset,
            "latestOffset": None,
            "numInputRows": self.num_input_rows,
            "inputRowsPerSecond": self.input_rows_per_second,
            "processedRowsPerSecond": self.processed_rows_per_second,
            "metrics": {"numBlocks": str(self.num_blocks), "sizeBytes": str(self.size_bytes)},
            "streamId": self.stream_id,
            "metadata": [dict(x) for x in self.metadata],
            "metadataOmitted": self.metadata_omitted,
            "position": self.position,
        }


@dataclass(frozen=True)
class OutputOperationProgress:
    """One output operation of a batch: how long it ran and why it failed, if it did."""

    id: int
    name: str
    duration_ms: int | None
    failure_reason: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """The JSON object."""
        return {
            "id": self.id,
            "name": self.name,
            "durationMs": self.duration_ms,
            "failureReason": self.failure_reason,
        }


@dataclass(frozen=True)
class StreamingProgress:
    """The progress of one completed batch; see the module doc for its JSON.

    Example::

        p = ssc.last_progress
        p.batch_id, p.num_input_rows, p.processed_rows_per_second
        p.json()           # '{"id": "...", "runId": "...", "batchId": 1732...}'
        p["numInputRows"]  # the JSON field, as with PySpark's StreamingQueryProgress
    """

    id: str
    run_id: str
    batch_id: int
    batch_time_ms: int
    batch_interval_ms: int
    num_input_rows: int
    input_rows_per_second: float
    processed_rows_per_second: float
    batch_duration_ms: int
    scheduling_delay_ms: int | None
    total_delay_ms: int | None
    output_duration_ms: int
    sources: tuple[SourceProgress, ...] = ()
    output_operations: tuple[OutputOperationProgress, ...] = ()
    failed: bool = False
    receivers: dict[str, str] = field(default_factory=dict)
    """Each stream's receiver state (``ACTIVE``...) when the batch completed, by stream id."""
    name: str | None = None
    state_operators: tuple[StateOperatorProgress, ...] = ()

    @property
    def timestamp(self) -> str:
        """The batch time, ISO 8601 in UTC (``2026-11-24T10:00:01.000Z``)."""
        return iso_time(self.batch_time_ms)

    def to_dict(self) -> dict[str, Any]:
        """The JSON object: ``StreamingQueryProgress`` field names, then ours."""
        durations = {
            "triggerExecution": self.batch_duration_ms,
            "addBatch": self.output_duration_ms,
        }
        if self.scheduling_delay_ms is not None:
            durations["schedulingDelay"] = self.scheduling_delay_ms
        if self.total_delay_ms is not None:
            durations["totalDelay"] = self.total_delay_ms
        names = ", ".join(o.name for o in self.output_operations) or "none"
        return {
            "id": self.id,
            "runId": self.run_id,
            "name": self.name,
            "timestamp": self.timestamp,
            "batchId": self.batch_id,
            "batchDuration": self.batch_duration_ms,
            "numInputRows": self.num_input_rows,
            "inputRowsPerSecond": self.input_rows_per_second,
            "processedRowsPerSecond": self.processed_rows_per_second,
            "durationMs": durations,
            "eventTime": {},
            "stateOperators": [s.to_dict() for s in self.state_operators],
            "sources": [s.to_dict() for s in self.sources],
            "sink": {
                "description": f"foreach_batch[{names}]",
                "numOutputRows": -1,
                "metrics": {},
            },
            "observedMetrics": {},
            "batchTime": self.batch_time_ms,
            "batchInterval": self.batch_interval_ms,
            "failed": self.failed,
            "outputOperations": [o.to_dict() for o in self.output_operations],
            "receivers": dict(self.receivers),
        }

    def json(self) -> str:
        """The compact JSON text (Structured Streaming's ``progress.json``)."""
        return json.dumps(self.to_dict(), separators=(",", ":"), default=str)

    def prettyJson(self) -> str:
        """The indented JSON text (Structured Streaming's ``progress.prettyJson``)."""
        return json.dumps(self.to_dict(), indent=2, default=str)

    def __getitem__(self, key: str) -> Any:
        """A JSON field by its name, as PySpark's ``StreamingQueryProgress`` allows."""
        return self.to_dict()[key]

    def __str__(self) -> str:
        return self.prettyJson()
