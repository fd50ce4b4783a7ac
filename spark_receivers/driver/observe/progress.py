"""The progress of recent batches: ``ssc.last_progress`` and the ``on_batch_progress`` event.

:class:`ProgressRecorder` listens on the context's bus: every completed batch
becomes a :class:`~spark_receivers.driver.observe.streaming_progress.StreamingProgress`
(Structured Streaming's shape), kept among the last ``keep`` (the status page's
``spark.streaming.ui.retainedBatches``), and is posted back to the bus as
``on_batch_progress`` so that every listener sees it right after
``on_batch_completed``.
"""

from __future__ import annotations

import enum
import threading
import uuid
from collections import deque
from collections.abc import Callable, Mapping, Sequence

from spark_receivers.driver.observe.listener import (
    BatchInfo,
    BatchProgress,
    ListenerBus,
    StreamingListener,
)
from spark_receivers.driver.observe.streaming_progress import (
    OutputOperationProgress,
    SourceProgress,
    StateOperatorProgress,
    StreamingProgress,
    stream_uuid,
)

__all__ = ["ProgressRecorder"]


class ProgressRecorder(StreamingListener):
    """Keeps the progress of the last ``keep`` completed batches, oldest first.

    Registered on the context's listener bus; ``on_batch_completed`` runs on the
    bus thread, does not block, and posts ``on_batch_progress`` to ``bus``.
    ``receiver_states`` gives the receivers' states (an empty mapping before the
    receivers are tracked); ``describe(stream_id)`` a stream's description;
    ``state_operators(batch_time_ms)`` the stateful streams' state after that batch.
    Readers on other threads get immutable records.
    """

    def __init__(
        self,
        batch_interval_ms: int,
        receiver_states: Callable[[], Mapping[int, enum.Enum]],
        bus: ListenerBus | None = None,
        keep: int = 1000,
        describe: Callable[[int], str] | None = None,
        progress_id: str | None = None,
        state_operators: Callable[[int], Sequence[StateOperatorProgress]] | None = None,
    ) -> None:
        self._interval_ms = batch_interval_ms
        self._receiver_states = receiver_states
        self._bus = bus
        self._describe = describe or (lambda sid: f"stream {sid}")
        self._state_operators = state_operators or (lambda batch_time_ms: ())
        self.id = progress_id or stream_uuid(None)
        """The ``id`` of every progress (see :func:`stream_uuid`)."""
        self.run_id = str(uuid.uuid4())
        self._lock = threading.Lock()
        self._progress: deque[StreamingProgress] = deque(maxlen=keep)
        self._batches = 0

    def new_run(self, progress_id: str) -> None:
        """The context starts: a new ``runId`` (and the ``id`` its checkpoint gives)."""
        with self._lock:
            self.id = progress_id
            self.run_id = str(uuid.uuid4())

    @property
    def last(self) -> StreamingProgress | None:
        """Progress of the last completed batch."""
        with self._lock:
            return self._progress[-1] if self._progress else None

    @property
    def recent(self) -> list[StreamingProgress]:
        """Progress of the recent completed batches, oldest first."""
        with self._lock:
            return list(self._progress)

    @property
    def batches_seen(self) -> int:
        """Batches completed since the context was made (also those no longer kept)."""
        with self._lock:
            return self._batches

    def on_batch_completed(self, info: BatchInfo) -> None:
        """Record the batch's progress and post ``on_batch_progress``."""
        progress = self.progress_of(info)
        with self._lock:
            self._progress.append(progress)
            self._batches += 1
        if self._bus is not None:
            self._bus.post(BatchProgress(progress))

    def progress_of(self, info: BatchInfo) -> StreamingProgress:
        """The :class:`StreamingProgress` of a completed batch."""
        processing_ms = info.processing_delay_ms or 0
        interval_s = self._interval_ms / 1000.0

        def per_second(rows: int) -> tuple[float, float]:
            return rows / interval_s, (rows * 1000.0 / processing_ms) if processing_ms else 0.0

        ids = sorted(set(info.num_records_per_stream) | set(info.stream_input_info))
        sources = []
        for sid in ids:
            inputs = info.stream_input_info.get(sid)
            rows = info.num_records_per_stream.get(sid, inputs.num_records if inputs else 0)
            arriving, processed = per_second(rows)
            metadata = inputs.metadata if inputs else ()
            sources.append(
                SourceProgress(
                    stream_id=sid,
                    description=self._describe(sid),
                    num_input_rows=rows,
                    input_rows_per_second=arriving,
                    processed_rows_per_second=processed,
                    num_blocks=inputs.num_blocks if inputs else 0,
                    size_bytes=inputs.size_bytes if inputs else 0,
                    start_offset=metadata[0] if metadata else None,
                    end_offset=metadata[-1] if metadata else None,
                    metadata=metadata,
                    metadata_omitted=inputs.metadata_omitted if inputs else 0,
                    position=inputs.position if inputs else None,
                )
            )
        operations = tuple(
            OutputOperationProgress(o.id, o.name, o.duration_ms, o.failure_reason)
            for _, o in sorted(info.output_operations.items())
        )
        arriving, processed = per_second(info.num_records)
        with self._lock:
            progress_id, run_id = self.id, self.run_id
        return StreamingProgress(
            id=progress_id,
            run_id=run_id,
            batch_id=info.batch_time_ms // self._interval_ms,
            batch_time_ms=info.batch_time_ms,
            batch_interval_ms=self._interval_ms,
            num_input_rows=info.num_records,
            input_rows_per_second=arriving,
            processed_rows_per_second=processed,
            batch_duration_ms=processing_ms,
            scheduling_delay_ms=info.scheduling_delay_ms,
            total_delay_ms=info.total_delay_ms,
            output_duration_ms=sum(o.duration_ms or 0 for o in operations),
            sources=tuple(sources),
            output_operations=operations,
            failed=any(o.failure_reason for o in operations),
            receivers={str(sid): s.name for sid, s in sorted(self._receiver_states().items())},
            state_operators=tuple(self._state_operators(info.batch_time_ms)),
        )
