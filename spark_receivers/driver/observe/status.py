"""Typed snapshots of a running context: :meth:`StreamingContext.status`.

Frozen dataclasses, taken under the owners' locks and safe to keep: they never
change after they are made. Listener events (``driver/observe/listener.py``) say what
happened; a status says where things stand now.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from spark_receivers.driver.observe.receiver_metrics import ReceiverMetricsInfo

__all__ = ["ReceiverStatus", "StreamingStatus"]


@dataclass(frozen=True)
class ReceiverStatus:
    """Where one receiver stands, as the driver knows it."""

    stream_id: int
    name: str
    state: str
    """``INACTIVE``, ``SCHEDULED`` or ``ACTIVE`` (Spark's receiver states)."""
    executor_id: str | None
    host: str | None
    endpoint: str | None
    """``host:port`` of its supervisor's block and control server, once registered."""
    records: int
    """Records in the blocks the driver accepted from it."""
    blocks: int
    jobs: int
    """Spark jobs launched for it: 1 + its relaunches."""
    scheduled_locations: tuple[str, ...] = ()
    """Where the driver scheduled it (Spark's location strings)."""
    rate_limit: float | None = None
    """The rate backpressure last published for its stream (None: none published)."""
    last_error_message: str = ""
    last_error: str = ""
    """The last error with its traceback ('' when none)."""
    last_error_time_ms: int = -1
    metrics: ReceiverMetricsInfo | None = None
    """What the receiver last reported about itself: bytes, input rate, rate limit,
    throttled time, bad records, block-store bytes, AddBlock and WAL write latency
    (None before ``start()`` or with ``spark.receivers.metrics.enabled=false``)."""

    @property
    def restarts(self) -> int:
        """How many times its job was launched again."""
        return max(0, self.jobs - 1)


@dataclass(frozen=True)
class StreamingStatus:
    """Where a streaming context stands now."""

    state: str
    """The context's state: ``INITIALIZED``, ``ACTIVE`` or ``STOPPED``."""
    batch_interval_ms: int
    receivers: tuple[ReceiverStatus, ...] = ()
    batches_completed: int = 0
    last_completed_batch_ms: int = -1
    pending_batches_ms: tuple[int, ...] = ()
    """Batches generated and not yet completed (queued or running)."""
    records_received: int = 0
    """Records in every block the driver accepted."""
    records_processed: int = 0
    """Records of the batches that completed successfully, less those of blocks that
    batches ran without (``lostBlockPolicy=skip``)."""
    recovered_batches_ms: tuple[int, ...] = ()
    """Batches run again after a restart from a checkpoint."""
    tracker_address: str | None = None
    """``host:port`` of the driver's tracker endpoint while it runs."""
    failure: str | None = None
    """Why the context failed, when it did."""
    rate_limits: dict[int, float] = field(default_factory=dict)
    """Per stream, the rate backpressure last published."""
    block_copies: dict[int, tuple[int, int]] = field(default_factory=dict)
    """Per stream, ``(copies, wanted)``: on how many executors its latest block is kept,
    and how many its storage level asks for (fewer: degraded)."""
    block_keepers: dict[str, str] = field(default_factory=dict)
    """The block keeper of each executor that has one: executor id → ``host:port``."""
    blocks_lost: int = 0
    records_lost: int = 0
    """Blocks (and their records) that batches ran without (``lostBlockPolicy=skip``)."""

    def receiver(self, stream_id: int) -> ReceiverStatus:
        """The status of the receiver of ``stream_id``; KeyError if there is none."""
        for r in self.receivers:
            if r.stream_id == stream_id:
                return r
        msg = f"no receiver for stream {stream_id}"
        raise KeyError(msg)
