"""What the receivers report about themselves, kept on the driver per stream.

Each supervisor sends a :class:`~spark_receivers.rpc.messages.ReportReceiverMetrics`
every report interval (``receiver/metrics.py``): totals since its task started (its
*session*). :class:`ReceiverMetricsTracker` validates each report (a known stream,
counts that are not negative, histograms of the right shape) and keeps the latest
report of every session, so totals add up across restarts and never go back, even
when an old task's last report arrives after the new task's first. Gauges (rate
limit, bytes held) come from the newest session. The input rate is measured here,
on the driver's clock, from the records of consecutive reports.

Thread-safety: :meth:`handle` runs on the tracker endpoint's gRPC threads;
:meth:`snapshot` on any thread (the status page, /metrics, ``status()``). One lock,
held only to copy small records.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable
from dataclasses import dataclass, field

from spark_receivers.errors import RpcError
from spark_receivers.receiver.bad_records import BadRecordPolicy
from spark_receivers.rpc import messages as m
from spark_receivers.util.clock import Clock
from spark_receivers.util.histogram import LATENCY_BUCKETS_S

__all__ = ["ReceiverMetricsInfo", "ReceiverMetricsTracker"]

MAX_SESSIONS = 32
"""Sessions kept apart per stream; older ones are folded into one total."""
_POLICIES = frozenset(p.value for p in BadRecordPolicy)
_BUCKETS = len(LATENCY_BUCKETS_S) + 1


@dataclass(frozen=True)
class ReceiverMetricsInfo:
    """One stream's receiver as its reports tell it (totals over every task it ran in).

    ``rate_limit``/``max_rate`` None: unlimited. ``input_rate`` is records/s between
    its last two reports (0 before the second). Latency counts are per bucket of
    :data:`~spark_receivers.util.histogram.LATENCY_BUCKETS_S` plus one above them.
    """

    stream_id: int
    executor_id: str = ""
    reports: int = 0
    last_report_ms: int = -1
    records: int = 0
    bytes: int = 0
    blocks: int = 0
    blocks_refused: int = 0
    records_refused: int = 0
    input_rate: float = 0.0
    rate_limit: float | None = None
    max_rate: float | None = None
    throttled_s: float = 0.0
    bad_records: int = 0
    bad_record_policy: str = "skip"
    store_memory_bytes: int = 0
    store_disk_bytes: int = 0
    store_blocks: int = 0
    add_block_counts: tuple[int, ...] = (0,) * _BUCKETS
    add_block_sum_s: float = 0.0
    wal_write_counts: tuple[int, ...] = (0,) * _BUCKETS
    wal_write_sum_s: float = 0.0

    def __bool__(self) -> bool:
        """False until the receiver sent a first report."""
        return self.reports > 0

    @property
    def add_block_mean_ms(self) -> float | None:
        """Mean AddBlock round trip seen by the receiver (ms), None before any."""
        n = sum(self.add_block_counts)
        return self.add_block_sum_s * 1000 / n if n else None

    @property
    def wal_write_mean_ms(self) -> float | None:
        """Mean receiver WAL write (ms), None before any."""
        n = sum(self.wal_write_counts)
        return self.wal_write_sum_s * 1000 / n if n else None


_TOTALS = ("records", "bytes", "blocks", "blocks_refused", "records_refused", "bad_records")


@dataclass
class _Stream:
    sessions: dict[int, m.ReportReceiverMetrics] = field(default_factory=dict)
    folded: dict[str, float] = field(default_factory=dict)
    folded_add: list[int] = field(default_factory=lambda: [0] * _BUCKETS)
    folded_wal: list[int] = field(default_factory=lambda: [0] * _BUCKETS)
    reports: int = 0
    last_report_ms: int = -1
    rate: float = 0.0
    last_sample: tuple[int, int, int] | None = None
    """(session, records, time_ms) of the newest report, for the input rate."""


class ReceiverMetricsTracker:
    """Validates and keeps the receivers' metrics reports; see the module doc. Thread-safe."""

    def __init__(self, stream_ids: Iterable[int], clock: Clock) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._streams = {sid: _Stream() for sid in stream_ids}

    def handle(self, report: m.ReportReceiverMetrics) -> None:
        """Keep a report; :class:`RpcError` when it is not one a receiver of ours could send."""
        self._check(report)
        now = self._clock.get_time_ms()
        with self._lock:
            s = self._streams[report.stream_id]
            s.reports += 1
            s.last_report_ms = now
            old = s.sessions.get(report.session)
            if old is None and len(s.sessions) >= MAX_SESSIONS:
                self._fold_oldest(s)
            if old is not None and old.records > report.records:
                return  # an older report of this session arrived late: keep the newer
            s.sessions[report.session] = report
            newest = max(s.sessions)
            if report.session == newest:
                prev = s.last_sample
                if prev is not None and prev[0] == report.session and now > prev[2]:
                    s.rate = (report.records - prev[1]) * 1000.0 / (now - prev[2])
                elif prev is None or prev[0] != report.session:
                    s.rate = 0.0
                s.last_sample = (report.session, report.records, now)

    def _check(self, r: m.ReportReceiverMetrics) -> None:
        if r.stream_id not in self._streams:
            msg = f"unknown stream id {r.stream_id}; known: {sorted(self._streams)}"
            raise RpcError(msg)
        numbers = [getattr(r, name) for name in _TOTALS]
        numbers += [r.store_memory_bytes, r.store_disk_bytes, r.store_blocks, r.throttled_s]
        numbers += [r.add_block_latency.sum_s, r.wal_write_latency.sum_s]
        for h in (r.add_block_latency, r.wal_write_latency):
            if len(h.counts) != _BUCKETS:
                msg = f"a latency histogram needs {_BUCKETS} bucket counts, got {len(h.counts)}"
                raise RpcError(msg)
            numbers += h.counts
        if any(x < 0 for x in numbers) or r.session < 0:
            msg = f"metrics report of stream {r.stream_id} has a negative count"
            raise RpcError(msg)
        if r.bad_record_policy not in _POLICIES:
            msg = f"unknown bad record policy {r.bad_record_policy[:40]!r}"
            raise RpcError(msg)

    @staticmethod
    def _fold_oldest(s: _Stream) -> None:
        oldest = s.sessions.pop(min(s.sessions))
        for name in (*_TOTALS, "throttled_s"):
            s.folded[name] = s.folded.get(name, 0) + getattr(oldest, name)
        s.folded["add_sum"] = s.folded.get("add_sum", 0.0) + oldest.add_block_latency.sum_s
        s.folded["wal_sum"] = s.folded.get("wal_sum", 0.0) + oldest.wal_write_latency.sum_s
        for i, n in enumerate(oldest.add_block_latency.counts):
            s.folded_add[i] += n
        for i, n in enumerate(oldest.wal_write_latency.counts):
            s.folded_wal[i] += n

    def snapshot(self) -> dict[int, ReceiverMetricsInfo]:
        """Every stream's metrics now, by stream id (streams that never reported: zeros)."""
        with self._lock:
            return {sid: _info(sid, s) for sid, s in sorted(self._streams.items())}


def _info(stream_id: int, s: _Stream) -> ReceiverMetricsInfo:
    """Under the lock: the totals of every session, the gauges of the newest."""
    if not s.sessions:
        return ReceiverMetricsInfo(stream_id)
    reports = list(s.sessions.values())
    newest = s.sessions[max(s.sessions)]
    totals = {n: int(s.folded.get(n, 0)) + sum(getattr(r, n) for r in reports) for n in _TOTALS}
    add = list(s.folded_add)
    wal = list(s.folded_wal)
    for r in reports:
        add = [a + b for a, b in zip(add, r.add_block_latency.counts, strict=True)]
        wal = [a + b for a, b in zip(wal, r.wal_write_latency.counts, strict=True)]
    return ReceiverMetricsInfo(
        stream_id=stream_id,
        executor_id=newest.executor_id,
        reports=s.reports,
        last_report_ms=s.last_report_ms,
        input_rate=max(0.0, s.rate),
        rate_limit=newest.rate_limit,
        max_rate=newest.max_rate,
        throttled_s=s.folded.get("throttled_s", 0.0) + sum(r.throttled_s for r in reports),
        bad_record_policy=newest.bad_record_policy,
        store_memory_bytes=newest.store_memory_bytes,
        store_disk_bytes=newest.store_disk_bytes,
        store_blocks=newest.store_blocks,
        add_block_counts=tuple(add),
        add_block_sum_s=s.folded.get("add_sum", 0.0)
        + sum(r.add_block_latency.sum_s for r in reports),
        wal_write_counts=tuple(wal),
        wal_write_sum_s=s.folded.get("wal_sum", 0.0)
        + sum(r.wal_write_latency.sum_s for r in reports),
        **totals,
    )
