"""The JSON documents of the status page's API, built from the driver's views.

``GET /api/v1/statistics``, ``/api/v1/streams``, ``/api/v1/receivers`` and
``/api/v1/batches`` (see ``driver/observe/ui_server.py``). Field names follow Spark's
own streaming REST API (``/api/v1/applications/<id>/streaming/...``) where the
meaning is the same (``streamId``, ``isActive``, ``executorId``, ``batchTime``,
``schedulingDelay``, ``processingTime``, ``totalDelay``, ``inputSize``...), in
camelCase; times are epoch milliseconds, durations milliseconds. The status page
itself reads nothing else.

Every method takes fresh snapshots (each under its owner's lock) and builds
plain dicts: safe on any thread, no lock held while building.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from spark_receivers.driver.observe.receiver_metrics import ReceiverMetricsInfo
from spark_receivers.driver.observe.status import ReceiverStatus, StreamingStatus
from spark_receivers.driver.observe.streaming_progress import StreamingProgress

__all__ = ["StatusApi", "StreamDescription"]


@dataclass(frozen=True)
class StreamDescription:
    """What the page says about an input stream."""

    stream_id: int
    name: str
    kind: str
    """``batch`` (read by batches) or ``structured`` (read by Structured Streaming)."""
    receiver_type: str


def _mean(values: Sequence[float]) -> float | None:
    return sum(values) / len(values) if values else None


class StatusApi:
    """Builds the API's documents from the driver's views (see the module doc)."""

    def __init__(
        self,
        streams: Sequence[StreamDescription],
        status: Callable[[], StreamingStatus],
        metrics: Callable[[], dict[int, ReceiverMetricsInfo]],
        progress: Callable[[], list[StreamingProgress]],
        start_time_ms: int,
        app_name: str = "",
    ) -> None:
        self._streams = list(streams)
        self._status = status
        self._metrics = metrics
        self._progress = progress
        self.start_time_ms = start_time_ms
        self.app_name = app_name

    def statistics(self) -> dict[str, Any]:
        """The context as a whole (Spark's ``streaming/statistics``, plus ours)."""
        status, recent = self._status(), self._progress()
        ok = [p for p in recent if not p.failed]
        active = sum(r.state == "ACTIVE" for r in status.receivers)
        return {
            "appName": self.app_name,
            "state": status.state,
            "startTime": self.start_time_ms,
            "batchDuration": status.batch_interval_ms,
            "numReceivers": len(status.receivers),
            "numActiveReceivers": active,
            "numInactiveReceivers": len(status.receivers) - active,
            "numTotalCompletedBatches": status.batches_completed,
            "numRetainedCompletedBatches": len(recent),
            "numActiveBatches": len(status.pending_batches_ms),
            "numProcessedRecords": status.records_processed,
            "numReceivedRecords": status.records_received,
            "avgInputRate": _mean([p.input_rows_per_second for p in ok]),
            "avgSchedulingDelay": _mean([p.scheduling_delay_ms or 0 for p in ok]),
            "avgProcessingTime": _mean([p.batch_duration_ms for p in ok]),
            "avgTotalDelay": _mean([p.total_delay_ms or 0 for p in ok]),
            "lastCompletedBatchTime": status.last_completed_batch_ms,
            "failure": status.failure,
        }

    def streams(self) -> list[dict[str, Any]]:
        """Every input stream, with what its receiver brought so far."""
        status, reports = self._status(), self._metrics()
        by_id = {r.stream_id: r for r in status.receivers}
        out = []
        for s in self._streams:
            r, info = by_id.get(s.stream_id), reports.get(s.stream_id)
            out.append(
                {
                    "streamId": s.stream_id,
                    "streamName": s.name,
                    "kind": s.kind,
                    "receiverType": s.receiver_type,
                    "numReceivedRecords": r.records if r else 0,
                    "inputRate": info.input_rate if info else 0.0,
                    "rateLimit": status.rate_limits.get(
                        s.stream_id, info.rate_limit if info else None
                    ),
                }
            )
        return out

    def receivers(self) -> list[dict[str, Any]]:
        """Every receiver: Spark's receiver fields, then the receivers' own metrics."""
        status, reports = self._status(), self._metrics()
        return [
            _receiver(r, reports.get(r.stream_id) or ReceiverMetricsInfo(r.stream_id), status)
            for r in status.receivers
        ]

    def batches(self, limit: int | None = None) -> list[dict[str, Any]]:
        """The retained completed batches, newest last (the last ``limit`` only, if given)."""
        recent = self._progress()
        if limit is not None:
            recent = recent[-limit:] if limit > 0 else []
        return [_batch(p) for p in recent]


def _receiver(r: ReceiverStatus, info: ReceiverMetricsInfo, status: StreamingStatus) -> dict:
    limit = status.rate_limits.get(r.stream_id, info.rate_limit)
    return {
        "streamId": r.stream_id,
        "streamName": r.name,
        "isActive": r.state == "ACTIVE",
        "state": r.state,
        "executorId": r.executor_id or info.executor_id or None,
        "executorHost": r.host,
        "endpoint": r.endpoint,
        "lastErrorTime": r.last_error_time_ms if r.last_error_time_ms >= 0 else None,
        "lastErrorMessage": r.last_error_message or None,
        "lastError": r.last_error or None,
        "restarts": r.restarts,
        "numRecords": r.records,
        "numBlocks": r.blocks,
        "bytes": info.bytes,
        "blocksRefused": info.blocks_refused,
        "recordsRefused": info.records_refused,
        "inputRate": info.input_rate,
        "rateLimit": limit,
        "maxRate": info.max_rate,
        "throttledSeconds": info.throttled_s,
        "badRecords": info.bad_records,
        "badRecordPolicy": info.bad_record_policy,
        "blockStoreMemoryBytes": info.store_memory_bytes,
        "blockStoreDiskBytes": info.store_disk_bytes,
        "blockStoreBlocks": info.store_blocks,
        "addBlockMeanMs": info.add_block_mean_ms,
        "walWriteMeanMs": info.wal_write_mean_ms,
        "lastReportTime": info.last_report_ms if info.last_report_ms >= 0 else None,
    }


def _batch(p: StreamingProgress) -> dict[str, Any]:
    failures = [o.failure_reason for o in p.output_operations if o.failure_reason]
    return {
        "batchId": p.batch_id,
        "batchTime": p.batch_time_ms,
        "status": "FAILED" if p.failed else "COMPLETED",
        "inputSize": p.num_input_rows,
        "inputRate": p.input_rows_per_second,
        "schedulingDelay": p.scheduling_delay_ms,
        "processingTime": p.batch_duration_ms,
        "totalDelay": p.total_delay_ms,
        "numTotalOutputOps": len(p.output_operations),
        "numFailedOutputOps": len(failures),
        "firstFailureReason": failures[0] if failures else None,
        "outputOperations": [o.to_dict() for o in p.output_operations],
        "streams": [
            {
                "streamId": s.stream_id,
                "description": s.description,
                "numRecords": s.num_input_rows,
                "numBlocks": s.num_blocks,
                "bytes": s.size_bytes,
                "metadata": [dict(x) for x in s.metadata],
                "metadataOmitted": s.metadata_omitted,
            }
            for s in p.sources
        ],
        "stateOperators": [o.to_dict() for o in p.state_operators],
    }
