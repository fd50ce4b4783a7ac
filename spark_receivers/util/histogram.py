"""A latency histogram with fixed bucket bounds, shared by receivers and the driver.

Receivers time their ``AddBlock`` calls and their write-ahead log writes with a
:class:`LatencyHistogram` and send :meth:`LatencyHistogram.counts` to the driver
in their periodic metrics report; the driver adds the counts of every receiver
up and serves them as a Prometheus histogram. The bounds are fixed in this one
place so that both sides agree without sending them.

Thread-safe: any thread may :meth:`~LatencyHistogram.observe`; a snapshot is
taken under the same short lock.
"""

from __future__ import annotations

import bisect
import threading
from collections.abc import Sequence

__all__ = ["LATENCY_BUCKETS_S", "LatencyHistogram", "cumulative"]

LATENCY_BUCKETS_S: tuple[float, ...] = (
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
)  # fmt: skip
"""Upper bounds (seconds) of the buckets; one more bucket holds what is above the last."""


class LatencyHistogram:
    """Counts of observed durations per bucket of :data:`LATENCY_BUCKETS_S`, and their sum.

    Example::

        h = LatencyHistogram()
        h.observe(0.003)
        h.counts()   # (0, 0, 1, 0, ..., 0): one per bucket, then one for "above 10 s"
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts = [0] * (len(LATENCY_BUCKETS_S) + 1)
        self._sum_s = 0.0
        self._max_s = 0.0

    def observe(self, seconds: float) -> None:
        """Count one duration (negative ones count as 0)."""
        seconds = max(0.0, seconds)
        i = bisect.bisect_left(LATENCY_BUCKETS_S, seconds)
        with self._lock:
            self._counts[i] += 1
            self._sum_s += seconds
            if seconds > self._max_s:
                self._max_s = seconds

    def counts(self) -> tuple[int, ...]:
        """Observations per bucket (not cumulative), the last one above every bound."""
        with self._lock:
            return tuple(self._counts)

    @property
    def sum_s(self) -> float:
        """The sum of every observed duration, in seconds."""
        with self._lock:
            return self._sum_s

    @property
    def max_s(self) -> float:
        """The longest observed duration, in seconds (0 before any)."""
        with self._lock:
            return self._max_s

    @property
    def count(self) -> int:
        """How many durations were observed."""
        with self._lock:
            return sum(self._counts)


def cumulative(counts: Sequence[int]) -> list[tuple[str, int]]:
    """Prometheus buckets from per-bucket counts: ``[(le, count so far), ..., ("+Inf", n)]``.

    Raises ``ValueError`` when ``counts`` does not have one entry per bucket plus one.
    """
    if len(counts) != len(LATENCY_BUCKETS_S) + 1:
        msg = f"expected {len(LATENCY_BUCKETS_S) + 1} bucket counts, got {len(counts)}"
        raise ValueError(msg)
    out, total = [], 0
    for bound, n in zip((*(repr(b) for b in LATENCY_BUCKETS_S), "+Inf"), counts, strict=True):
        total += n
        out.append((bound, total))
    return out
