"""A receiver task's counters and the thread that reports them to the driver.

The supervisor owns one :class:`ReceiverMetrics`. Counting happens at the
edges of the push path, never inside it:

* :class:`MeteredTrackerClient` wraps the supervisor's client of the driver's
  tracker: it times every ``AddBlock`` round trip and counts the records, bytes
  and blocks the driver accepted (and those it refused or that failed).
* :class:`MeteredWriteAheadLog` wraps the receiver write-ahead log and times
  every write.
* The rest is read when a report is made: the rate limit, the time ``store()``
  waited (rate-limit tokens, a full block queue), bad records, and the block
  store's bytes in memory and on disk.

:class:`MetricsReporter` sends a :class:`~spark_receivers.rpc.messages.ReportReceiverMetrics`
every ``spark.receivers.metrics.reportInterval`` on a thread of its own, and a
last one when it stops. A report that cannot be sent is logged and the next one
carries the totals again (reports hold totals of the session, not deltas), so
losing one loses nothing.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator
from typing import Any

from spark_receivers.receiver.block_store import BlockStore
from spark_receivers.receiver.rate_limiter import RateLimiter
from spark_receivers.rpc import messages as m
from spark_receivers.util.clock import Clock
from spark_receivers.util.histogram import LatencyHistogram
from spark_receivers.wal.base import RecordHandle, WriteAheadLog

log = logging.getLogger(__name__)

__all__ = ["MeteredTrackerClient", "MeteredWriteAheadLog", "MetricsReporter", "ReceiverMetrics"]

REPORT_TIMEOUT_S = 5.0
"""Bound of one report call: a driver that does not answer delays only the next report."""


class ReceiverMetrics:
    """What the driver accepted from this receiver task, and how long it took. Thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.records = 0
        self.bytes = 0
        self.blocks = 0
        self.blocks_refused = 0
        self.records_refused = 0
        self.add_block_latency = LatencyHistogram()
        self.wal_write_latency = LatencyHistogram()

    def block_added(self, info: m.ReceivedBlockInfo, accepted: bool) -> None:
        """Count a block the driver accepted, or one it refused (or that failed to reach it)."""
        with self._lock:
            if accepted:
                self.records += info.num_records
                self.bytes += info.size_bytes
                self.blocks += 1
            else:
                self.blocks_refused += 1
                self.records_refused += info.num_records

    def report(
        self,
        stream_id: int,
        session: int,
        executor_id: str,
        limiter: RateLimiter,
        waited_for_room_s: float,
        receiver: Any,
        store: BlockStore | Any,
    ) -> m.ReportReceiverMetrics:
        """The report of this moment (totals of the session).

        ``store`` is what holds the blocks: the task's block store, or the executor's
        block keeper (its ``memory_bytes``, ``disk_bytes`` and ``len``).
        """
        policy = getattr(receiver, "bad_record_policy", None)
        with self._lock:
            counts = (
                self.records,
                self.bytes,
                self.blocks,
                self.blocks_refused,
                self.records_refused,
            )
        return m.ReportReceiverMetrics(
            stream_id=stream_id,
            session=session,
            executor_id=executor_id,
            records=counts[0],
            bytes=counts[1],
            blocks=counts[2],
            blocks_refused=counts[3],
            records_refused=counts[4],
            rate_limit=limiter.rate,
            max_rate=limiter.max_rate,
            throttled_s=limiter.waited_s + waited_for_room_s,
            bad_records=int(getattr(receiver, "bad_records", 0)),
            bad_record_policy=str(getattr(policy, "value", policy or "skip")),
            store_memory_bytes=store.memory_bytes,
            store_disk_bytes=store.disk_bytes,
            store_blocks=len(store),
            add_block_latency=_latency(self.add_block_latency),
            wal_write_latency=_latency(self.wal_write_latency),
        )


def _latency(h: LatencyHistogram) -> m.LatencyCounts:
    return m.LatencyCounts(h.counts(), h.sum_s)


class MeteredTrackerClient:
    """The supervisor's client of the tracker, timing ``AddBlock`` and counting its outcome.

    Every other message passes through untouched. Same contract as
    :class:`~spark_receivers.rpc.transport.EndpointClient` (thread-safe).
    """

    def __init__(self, client: Any, metrics: ReceiverMetrics, clock: Clock) -> None:
        self._client = client
        self._metrics = metrics
        self._now = clock.monotonic_s
        self.address: str = client.address

    def call(self, message: Any, timeout_s: float | None = None) -> Any:
        """Send ``message``; ``AddBlock``/``AddBlocks`` are timed and counted (accepted or not).

        An ``AddBlocks`` call is one latency sample (one round trip) and counts each of
        its blocks by its own answer.
        """
        kind = type(message)
        if kind is not m.AddBlock and kind is not m.AddBlocks:
            return self._client.call(message, timeout_s)
        infos = (message.block_info,) if kind is m.AddBlock else message.block_infos
        started = self._now()
        answers: list[bool] = [False] * len(infos)
        try:
            reply = self._client.call(message, timeout_s)
            if kind is m.AddBlock:
                answers = [reply is True]
            elif isinstance(reply, list) and len(reply) == len(infos):
                answers = [a is True for a in reply]
            return reply
        finally:
            self._metrics.add_block_latency.observe(self._now() - started)
            for info, accepted in zip(infos, answers, strict=True):
                self._metrics.block_added(info, accepted)

    def close(self) -> None:
        """Close the underlying client."""
        self._client.close()


class MeteredWriteAheadLog(WriteAheadLog):
    """A write-ahead log whose writes are timed into ``histogram``; everything else delegates."""

    def __init__(self, wal: WriteAheadLog, histogram: LatencyHistogram, clock: Clock) -> None:
        self.wal = wal
        self._histogram = histogram
        self._now = clock.monotonic_s

    def write(self, data: bytes | bytearray | memoryview, time_ms: int) -> RecordHandle:
        """Write through the wrapped log and time it (failed writes are timed too)."""
        started = self._now()
        try:
            return self.wal.write(data, time_ms)
        finally:
            self._histogram.observe(self._now() - started)

    def read(self, handle: RecordHandle) -> bytes:
        """Read through the wrapped log."""
        return self.wal.read(handle)

    def read_all(self) -> Iterator[bytes]:
        """Read every record through the wrapped log."""
        return self.wal.read_all()

    def clean(self, threshold_time_ms: int, wait: bool) -> None:
        """Clean through the wrapped log."""
        self.wal.clean(threshold_time_ms, wait)

    def close(self) -> None:
        """Close the wrapped log."""
        self.wal.close()


def meter_wal(handler: Any, metrics: ReceiverMetrics, clock: Clock) -> None:
    """Time the write-ahead log writes of a block handler that has one (else do nothing)."""
    wal = getattr(handler, "wal", None)
    if isinstance(wal, WriteAheadLog) and not isinstance(wal, MeteredWriteAheadLog):
        handler.wal = MeteredWriteAheadLog(wal, metrics.wal_write_latency, clock)


class MetricsReporter:
    """Sends ``report()`` through ``send`` every ``interval_ms`` and once more on :meth:`stop`.

    ``interval_ms`` 0 turns reporting off (start and stop do nothing). The thread
    waits on the injected clock (a ``ManualClock`` drives it in tests); a failed
    send is logged (the first one as a warning, later ones at debug level) and
    never ends the thread.
    """

    def __init__(
        self,
        report: Callable[[], m.ReportReceiverMetrics],
        send: Callable[[Any, float], Any],
        interval_ms: int,
        clock: Clock,
        name: str = "receiver-metrics",
    ) -> None:
        self._report = report
        self._send = send
        self.interval_ms = interval_ms
        self._clock = clock
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._failures = 0
        self.sent = 0
        """Reports the driver received."""

    def start(self) -> None:
        """Start the reporting thread (not when reporting is off)."""
        if self.interval_ms > 0:
            self._thread.start()

    def stop(self) -> None:
        """Stop the thread and send one last report (the final totals); idempotent."""
        if self.interval_ms <= 0 or self._stopping.is_set():
            return
        self._stopping.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(REPORT_TIMEOUT_S + 1)
        self.send_now()

    def send_now(self) -> bool:
        """Make and send a report now; False when it could not be sent."""
        try:
            self._send(self._report(), REPORT_TIMEOUT_S)
        except Exception as e:  # noqa: BLE001 - a lost report is replaced by the next one
            self._failures += 1
            level = logging.WARNING if self._failures == 1 else logging.DEBUG
            log.log(level, "could not send receiver metrics to the driver: %s", e)
            return False
        self.sent += 1
        return True

    def _run(self) -> None:
        due = self._clock.get_time_ms()
        while True:
            due += self.interval_ms
            now = self._clock.get_time_ms()
            if due <= now:  # a slow send: skip the reports it overran instead of bursting
                due = now + self.interval_ms
            self._clock.wait_till_time(due, self._stopping)
            if self._stopping.is_set():
                return
            self.send_now()
