"""Backpressure: one rate controller per input stream, fed by completed batches.

Spark's RateController. It listens to batch completions (on the listener bus
thread, where it only queues), computes the stream's new rate on its own
thread with a :class:`RateEstimator`, and publishes it to the stream's
receivers through the tracker (``UpdateReceiverRateLimit`` → every block
generator's ``UpdateRateLimit``), never above ``receiver_max_rate``.

Correct with ``concurrent_jobs`` > 1, where Spark's is not (SPARK-15429):
when batches overlap, each batch's processing delay counts time it shared with
the others, so ``records / processing delay`` underestimates what the pipeline
does, and completions may arrive out of batch order (which Spark's estimator
then skips). This controller (1) feeds the estimator in batch-time order,
holding an early completion until the batches before it completed, and (2)
measures each batch's cost as the wall time the pipeline spent finishing it:
``min(processing delay, its end - the previous batch's end)``, which is the
processing delay itself when batches do not overlap.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable

from spark_receivers.config import StreamingConfig
from spark_receivers.driver.backpressure.rate_estimator import RateEstimator, create_rate_estimator
from spark_receivers.driver.observe.listener import BatchInfo, StreamingListener

log = logging.getLogger(__name__)

Publish = Callable[[int, float], None]


class RateController(StreamingListener):
    """Computes and publishes the rate of one input stream.

    ``publish(stream_id, rate)`` runs on the controller's thread, which :meth:`start`
    starts. ``latest_rate`` is the last published rate (None before the first estimate).
    """

    def __init__(
        self,
        stream_id: int,
        estimator: RateEstimator,
        publish: Publish,
        max_rate: float | None = None,
    ) -> None:
        self.stream_id = stream_id
        self._estimator = estimator
        self._publish = publish
        self._max_rate = max_rate
        self._queue: queue.Queue[BatchInfo | None] = queue.Queue()
        self._submitted: set[int] = set()
        self._held: dict[int, BatchInfo] = {}
        self._last_end_ms: int | None = None
        self._lock = threading.Lock()
        self.latest_rate: float | None = None
        self.history: list[tuple[int, float]] = []
        self._thread = threading.Thread(
            target=self._run, name=f"rate-controller-{stream_id}", daemon=True
        )

    def start(self) -> RateController:
        """Start the thread that computes and publishes the rates; returns ``self``."""
        self._thread.start()
        return self

    # Listener callbacks run on the bus thread: only bookkeeping and a queue put.

    def on_batch_submitted(self, info: BatchInfo) -> None:
        """Remember that the batch is outstanding, to keep completions in order."""
        with self._lock:
            self._submitted.add(info.batch_time_ms)

    def on_batch_completed(self, info: BatchInfo) -> None:
        """Queue the batch for estimation, in batch-time order."""
        ready: list[BatchInfo] = []
        with self._lock:
            self._held[info.batch_time_ms] = info
            self._submitted.add(info.batch_time_ms)
            while self._submitted:
                oldest = min(self._submitted)
                done = self._held.pop(oldest, None)
                if done is None:
                    break
                self._submitted.discard(oldest)
                ready.append(done)
        for done in ready:
            self._queue.put(done)

    def stop(self, timeout_s: float = 5.0) -> None:
        """Finish what is queued and stop the thread (if it was started)."""
        self._queue.put(None)
        if self._thread.is_alive():
            self._thread.join(timeout_s)

    def _run(self) -> None:
        while True:
            info = self._queue.get()
            if info is None:
                return
            try:
                self._compute(info)
            except Exception:
                log.exception(
                    "rate controller of stream %d failed on batch %d",
                    self.stream_id,
                    info.batch_time_ms,
                )

    def _compute(self, info: BatchInfo) -> None:
        end = info.processing_end_time_ms
        processing = info.processing_delay_ms
        scheduling = info.scheduling_delay_ms
        if end is None or processing is None or scheduling is None:
            return
        if self._last_end_ms is not None and end > self._last_end_ms:
            processing = min(processing, end - self._last_end_ms)
        self._last_end_ms = end if self._last_end_ms is None else max(self._last_end_ms, end)
        records = info.num_records_per_stream.get(self.stream_id, 0)
        rate = self._estimator.compute(end, records, processing, scheduling)
        if rate is None:
            return
        if self._max_rate is not None:
            rate = min(rate, self._max_rate)
        self.latest_rate = rate
        self.history.append((info.batch_time_ms, rate))
        log.debug(
            "stream %d: new rate %.0f records/s after batch %d",
            self.stream_id,
            rate,
            info.batch_time_ms,
        )
        self._publish(self.stream_id, rate)


def rate_controllers_for(
    stream_ids: list[int],
    config: StreamingConfig,
    batch_interval_ms: int,
    publish: Callable[[int, float], None],
) -> dict[int, RateController]:
    """One rate controller per stream, with the estimator ``config`` names (backpressure)."""
    return {
        stream_id: RateController(
            stream_id,
            create_rate_estimator(
                config.backpressure_rate_estimator,
                batch_interval_ms,
                config.backpressure_pid_proportional,
                config.backpressure_pid_integral,
                config.backpressure_pid_derived,
                config.backpressure_pid_min_rate,
            ),
            publish,
            config.max_rate_or_none,
        )
        for stream_id in stream_ids
    }
