"""The progress of recent batches as plain dicts: ``StreamingContext.last_progress``."""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable, Mapping
from typing import Any

from spark_receivers.driver.listener import BatchInfo, StreamingListener
from spark_receivers.driver.scheduling_policy import ReceiverState

__all__ = ["ProgressRecorder"]


class ProgressRecorder(StreamingListener):
    """Keeps the progress of the last ``keep`` completed batches, oldest first.

    Registered on the context's listener bus; ``on_batch_completed`` runs on the bus
    thread and does not block. ``receiver_states`` is asked for the receivers' states
    at each batch (it returns an empty mapping before the receivers are tracked).
    Readers on other threads get copies.
    """

    def __init__(
        self,
        batch_interval_ms: int,
        receiver_states: Callable[[], Mapping[int, ReceiverState]],
        keep: int = 100,
    ) -> None:
        self._interval_s = batch_interval_ms / 1000.0
        self._receiver_states = receiver_states
        self._lock = threading.Lock()
        self._progress: deque[dict[str, Any]] = deque(maxlen=keep)

    @property
    def last(self) -> dict[str, Any] | None:
        """Progress of the last completed batch."""
        with self._lock:
            return self._progress[-1] if self._progress else None

    @property
    def recent(self) -> list[dict[str, Any]]:
        """Progress of the recent completed batches, oldest first."""
        with self._lock:
            return list(self._progress)

    def on_batch_completed(self, info: BatchInfo) -> None:
        """Record the batch's figures."""
        processing_s = (info.processing_delay_ms or 0) / 1000.0
        receivers = {str(sid): state.name for sid, state in self._receiver_states().items()}
        entry = {
            "batch_time_ms": info.batch_time_ms,
            "num_input_rows": info.num_records,
            "input_rows_per_stream": {str(k): v for k, v in info.num_records_per_stream.items()},
            "input_rows_per_second": info.num_records / self._interval_s,
            "processed_rows_per_second": (info.num_records / processing_s) if processing_s else 0.0,
            "durations_ms": {
                "scheduling_delay": info.scheduling_delay_ms,
                "processing": info.processing_delay_ms,
                "total_delay": info.total_delay_ms,
            },
            "failed": any(o.failure_reason for o in info.output_operations.values()),
            "receivers": receivers,
        }
        with self._lock:
            self._progress.append(entry)
