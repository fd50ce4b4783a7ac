"""Prometheus metrics of one streaming context, served at ``/metrics`` by the status page.

Every context has a registry of its own (never the process-wide default one, so
two contexts in one process do not collide). Names and units follow Prometheus'
conventions: ``spark_receivers_`` prefix, base units (seconds, bytes), ``_total``
on counters. Two kinds of sources:

* :class:`BatchMetrics`, a streaming listener: histograms of every completed
  batch's scheduling delay, processing time and total delay, and counters of
  batches and processed records. Observed on the listener bus thread.
* :class:`ReceiverCollector`, read at scrape time from the driver's views (the
  tracker's receiver statuses and the receivers' metrics reports): records,
  blocks and bytes received, refused blocks, bad records by policy, throttled
  time, rate limits and input rates, block-store bytes in memory and on disk,
  receiver state and restarts, and the AddBlock and WAL write latency histograms
  the receivers measured. Nothing is updated per record or per block on the driver.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from spark_receivers.driver.observe.listener import BatchInfo, StreamingListener
from spark_receivers.driver.observe.receiver_metrics import ReceiverMetricsInfo
from spark_receivers.driver.observe.status import StreamingStatus
from spark_receivers.util.histogram import cumulative

__all__ = ["PREFIX", "BatchMetrics", "ReceiverCollector", "new_registry"]

PREFIX = "spark_receivers"
DELAY_BUCKETS_S = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)
RECEIVER_STATES = ("INACTIVE", "SCHEDULED", "ACTIVE")


def new_registry() -> CollectorRegistry:
    """An empty registry for one context (``auto_describe`` so collectors list their names)."""
    return CollectorRegistry(auto_describe=True)


class BatchMetrics(StreamingListener):
    """Histograms and counters of completed batches; a listener (bus thread, never blocks)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        def histogram(name: str, doc: str) -> Histogram:
            return Histogram(f"{PREFIX}_{name}", doc, buckets=DELAY_BUCKETS_S, registry=registry)

        self.scheduling = histogram(
            "batch_scheduling_delay_seconds", "From a batch's submission to its processing start."
        )
        self.processing = histogram(
            "batch_processing_seconds", "How long a batch's output operations ran."
        )
        self.total = histogram(
            "batch_total_delay_seconds", "Scheduling delay plus processing time of a batch."
        )
        self.batches = Counter(
            f"{PREFIX}_batches_completed", "Batches that completed.", ["outcome"], registry=registry
        )
        self.records = Counter(
            f"{PREFIX}_records_processed",
            "Records of the batches that completed successfully.",
            ["stream"],
            registry=registry,
        )
        self.last_batch = Gauge(
            f"{PREFIX}_last_completed_batch_timestamp_seconds",
            "Batch time of the last completed batch (Unix time).",
            registry=registry,
        )

    def on_batch_completed(self, info: BatchInfo) -> None:
        """Observe the batch's delays; count it and, if it succeeded, its records."""
        failed = any(o.failure_reason for o in info.output_operations.values())
        for histogram, ms in (
            (self.scheduling, info.scheduling_delay_ms),
            (self.processing, info.processing_delay_ms),
            (self.total, info.total_delay_ms),
        ):
            if ms is not None:
                histogram.observe(ms / 1000.0)
        self.batches.labels("failed" if failed else "succeeded").inc()
        if not failed:
            for sid, n in info.num_records_per_stream.items():
                self.records.labels(str(sid)).inc(n)
        self.last_batch.set(info.batch_time_ms / 1000.0)


class ReceiverCollector(Collector):  # type: ignore[misc]
    """Receiver and context metrics read at scrape time (see the module doc).

    ``status()`` and ``metrics()`` are the driver's views; both are cheap
    snapshots taken under their owners' locks, on the scraping thread.
    """

    def __init__(
        self,
        status: Callable[[], StreamingStatus],
        metrics: Callable[[], dict[int, ReceiverMetricsInfo]],
    ) -> None:
        self._status = status
        self._metrics = metrics

    def describe(self) -> list[Metric]:
        """No fixed description: metrics depend on the receivers (collected each scrape)."""
        return []

    def collect(self) -> Iterator[Metric]:
        """The metrics of this moment."""
        status, reports = self._status(), self._metrics()
        labels = ["stream", "receiver"]

        def family(kind: type[Any], name: str, doc: str, extra: tuple[str, ...] = ()) -> Any:
            return kind(f"{PREFIX}_{name}", doc, labels=[*labels, *extra])

        received = family(CounterMetricFamily, "records_received", "Records the driver accepted.")
        blocks = family(CounterMetricFamily, "blocks_received", "Blocks the driver accepted.")
        bytes_ = family(
            CounterMetricFamily, "bytes_received", "Bytes of the blocks the driver accepted."
        )
        refused = family(
            CounterMetricFamily,
            "blocks_refused",
            "Blocks refused by, or lost on the way to, the driver.",
        )
        bad = family(CounterMetricFamily, "bad_records", "Bad records, by policy.", ("policy",))
        throttled = family(
            CounterMetricFamily,
            "throttled_seconds",
            "Time store() waited for the rate limit or a full block queue.",
        )
        restarts = family(CounterMetricFamily, "receiver_restarts", "Relaunches of the receiver.")
        state = family(
            GaugeMetricFamily,
            "receiver_state",
            "1 for the receiver's state.",
            ("state", "executor"),
        )
        limit = family(
            GaugeMetricFamily,
            "rate_limit_records_per_second",
            "The receiver's rate limit (backpressure or maxRate); absent when unlimited.",
        )
        max_rate = family(
            GaugeMetricFamily,
            "max_rate_records_per_second",
            "The cap no rate limit exceeds (spark.streaming.receiver.maxRate); absent: none.",
        )
        rate = family(
            GaugeMetricFamily,
            "input_rate_records_per_second",
            "Records/s the receiver stored between its last two reports.",
        )
        memory = family(
            GaugeMetricFamily,
            "block_store_memory_bytes",
            "Bytes of blocks held in memory where the receiver keeps them (with block keepers: "
            "its executor's keeper, shared by the receivers there).",
        )
        disk = family(
            GaugeMetricFamily,
            "block_store_disk_bytes",
            "Bytes of blocks spilled to disk (with block keepers: its executor's keeper).",
        )
        errors = family(
            GaugeMetricFamily,
            "receiver_last_error_timestamp_seconds",
            "When the receiver last reported an error (Unix time).",
        )
        add_block = family(
            HistogramMetricFamily,
            "add_block_latency_seconds",
            "AddBlock round trips as the receivers timed them.",
        )
        wal = family(
            HistogramMetricFamily,
            "wal_write_latency_seconds",
            "Receiver write-ahead log writes as the receivers timed them.",
        )
        for r in status.receivers:
            key = [str(r.stream_id), r.name]
            info = reports.get(r.stream_id) or ReceiverMetricsInfo(r.stream_id)
            received.add_metric(key, r.records)
            blocks.add_metric(key, r.blocks)
            bytes_.add_metric(key, info.bytes)
            refused.add_metric(key, info.blocks_refused)
            bad.add_metric([*key, info.bad_record_policy], info.bad_records)
            throttled.add_metric(key, info.throttled_s)
            restarts.add_metric(key, r.restarts)
            executor = r.executor_id or info.executor_id or ""
            for s in RECEIVER_STATES:
                state.add_metric([*key, s, executor], 1.0 if r.state == s else 0.0)
            current = status.rate_limits.get(r.stream_id, info.rate_limit)
            if current is not None:
                limit.add_metric(key, current)
            if info.max_rate is not None:
                max_rate.add_metric(key, info.max_rate)
            rate.add_metric(key, info.input_rate)
            memory.add_metric(key, info.store_memory_bytes)
            disk.add_metric(key, info.store_disk_bytes)
            if r.last_error_time_ms >= 0:
                errors.add_metric(key, r.last_error_time_ms / 1000.0)
            add_block.add_metric(
                key, cumulative(info.add_block_counts), sum_value=info.add_block_sum_s
            )
            wal.add_metric(key, cumulative(info.wal_write_counts), sum_value=info.wal_write_sum_s)
        yield from (received, blocks, bytes_, refused, bad, throttled, restarts, state)
        yield from (limit, max_rate, rate, memory, disk, errors, add_block, wal)
        yield from _context_metrics(status)


def _context_metrics(status: StreamingStatus) -> Iterator[Metric]:
    interval = GaugeMetricFamily(
        f"{PREFIX}_batch_interval_seconds",
        "The batch interval.",
        value=status.batch_interval_ms / 1000,
    )
    pending = GaugeMetricFamily(
        f"{PREFIX}_pending_batches",
        "Batches generated and not yet completed (queued or running).",
        value=len(status.pending_batches_ms),
    )
    active = GaugeMetricFamily(
        f"{PREFIX}_context_active", "1 while the streaming context is ACTIVE.",
        value=1.0 if status.state == "ACTIVE" else 0.0,
    )  # fmt: skip
    yield from (interval, pending, active)
