"""A token-bucket rate limiter for one receiver's block generators (Spark's RateLimiter)."""

from __future__ import annotations

import threading
import time


class RateLimiter:
    """Limits how many records per second pass :meth:`acquire`.

    The rate starts at ``min(initial_rate, max_rate)``; None means unlimited.
    :meth:`update_rate` ignores rates ≤ 0 and never goes above ``max_rate``.
    :meth:`acquire` blocks the caller (the receiver's storing thread) until its
    records fit; a burst of up to one second's worth of records passes at once.
    Thread-safe.
    """

    def __init__(self, max_rate: float | None = None, initial_rate: float | None = None) -> None:
        self._max_rate = max_rate if max_rate and max_rate > 0 else None
        start = initial_rate if initial_rate and initial_rate > 0 else None
        if start is None:
            start = self._max_rate
        elif self._max_rate is not None:
            start = min(start, self._max_rate)
        self._lock = threading.Lock()
        self._rate: float | None = start
        self.limited = start is not None
        """False while unlimited: adds skip :meth:`acquire` (a plain attribute: it is hot)."""
        self._tokens = 0.0
        self._last = time.monotonic()
        self._changed = threading.Condition(self._lock)

    @property
    def rate(self) -> float | None:
        """The current limit in records/s, or None when unlimited."""
        return self._rate

    @property
    def max_rate(self) -> float | None:
        """The cap no update can exceed, or None."""
        return self._max_rate

    def update_rate(self, new_rate: float) -> None:
        """Set the limit to ``min(new_rate, max_rate)``; ignore ``new_rate <= 0``."""
        if new_rate <= 0:
            return
        with self._lock:
            self._refill(time.monotonic())
            self._rate = new_rate if self._max_rate is None else min(new_rate, self._max_rate)
            self.limited = True
            self._changed.notify_all()

    def _refill(self, now: float) -> None:
        rate = self._rate
        if rate is not None:
            self._tokens = min(self._tokens + (now - self._last) * rate, max(rate, 1.0))
        self._last = now

    def acquire(self, n: int = 1, cancel: threading.Event | None = None) -> None:
        """Block until ``n`` records may pass (at once when unlimited)."""
        if self._rate is None:
            return
        with self._lock:
            while True:
                rate = self._rate
                if rate is None:
                    return
                now = time.monotonic()
                self._refill(now)
                # A batch larger than the bucket is let through once the bucket is
                # full and then runs a debt, so big Arrow blocks are limited too.
                if self._tokens >= n or self._tokens >= max(rate, 1.0):
                    self._tokens -= n
                    return
                if cancel is not None and cancel.is_set():
                    return
                wait = (min(n, max(rate, 1.0)) - self._tokens) / rate
                self._changed.wait(min(wait, 0.1))
