"""A token-bucket rate limiter for one receiver's block generators (Spark's RateLimiter)."""

from __future__ import annotations

import threading

from spark_receivers.util.clock import Clock, SystemClock


class RateLimiter:
    """Limits how many records per second pass :meth:`acquire`.

    The rate starts at ``min(initial_rate, max_rate)``; None means unlimited.
    :meth:`update_rate` ignores rates ≤ 0 and never goes above ``max_rate``.

    The bucket holds up to one second's worth of records (at least 1) and starts
    empty; it fills at the rate on ``clock.monotonic_s()``. So over any stretch of
    time, the records let through stay within ``rate * elapsed`` plus what one
    call takes beyond the bucket: a batch larger than the bucket passes once the
    bucket is full and leaves a debt that later calls wait for, so big Arrow
    blocks are limited too.

    :meth:`acquire` blocks the caller (a receiver's storing thread) until its
    records fit. It wakes when tokens are due on the clock, when
    :meth:`update_rate` changes the rate, and when :meth:`wake_waiters` is called
    (set the ``cancel`` event first: the waiter then returns without tokens).
    Thread-safe.

    Example::

        limiter = RateLimiter(max_rate=1000, clock=ManualClock())
        limiter.try_acquire(1)   # False: the bucket starts empty
    """

    def __init__(
        self,
        max_rate: float | None = None,
        initial_rate: float | None = None,
        clock: Clock | None = None,
    ) -> None:
        self._max_rate = max_rate if max_rate and max_rate > 0 else None
        start = initial_rate if initial_rate and initial_rate > 0 else None
        if start is None:
            start = self._max_rate
        elif self._max_rate is not None:
            start = min(start, self._max_rate)
        self._clock: Clock = clock if clock is not None else SystemClock()
        # Bound once: for SystemClock this is time.monotonic itself (no extra call).
        self._now = self._clock.monotonic_s
        self._lock = threading.Lock()
        self._rate: float | None = start
        self.limited = start is not None
        """False while unlimited: adds skip :meth:`acquire` (a plain attribute: it is hot)."""
        self._tokens = 0.0
        self._last = self._now()
        self._changed = threading.Condition(self._lock)
        self._waited_s = 0.0

    @property
    def waited_s(self) -> float:
        """Seconds callers of :meth:`acquire` spent waiting for tokens, in all (metrics)."""
        return self._waited_s

    @property
    def rate(self) -> float | None:
        """The current limit in records/s, or None when unlimited."""
        return self._rate

    @property
    def max_rate(self) -> float | None:
        """The cap no update can exceed, or None."""
        return self._max_rate

    def update_rate(self, new_rate: float) -> None:
        """Set the limit to ``min(new_rate, max_rate)``; ignore ``new_rate <= 0``.

        Tokens earned so far are kept (at the old rate); waiters re-check at once.
        """
        if new_rate <= 0:
            return
        with self._lock:
            self._refill(self._now())
            self._rate = new_rate if self._max_rate is None else min(new_rate, self._max_rate)
            self.limited = True
            self._changed.notify_all()

    def wake_waiters(self) -> None:
        """Wake every thread blocked in :meth:`acquire` so it re-checks its cancel event."""
        with self._lock:
            self._changed.notify_all()

    def _refill(self, now: float) -> None:
        rate = self._rate
        if rate is not None:
            self._tokens = min(self._tokens + (now - self._last) * rate, max(rate, 1.0))
        self._last = now

    def _take(self, n: int, rate: float) -> float | None:
        """Under the lock: take ``n`` tokens and return None, or return the seconds to wait.

        Inlined by hand (no min/max, one clock read): it runs once per ``acquire``,
        which a receiver storing records with metadata calls per record.
        """
        now = self._now()
        bucket = rate if rate > 1.0 else 1.0
        tokens = self._tokens + (now - self._last) * rate
        if tokens > bucket:
            tokens = bucket
        self._last = now
        # A microsecond's worth of slack: float rounding of clock differences must
        # not leave a waiter 1e-13 tokens short at its deadline (with ManualClock it
        # would then wait for the next advance).
        enough = tokens + rate * 1e-6
        if enough >= n or enough >= bucket:
            self._tokens = tokens - n
            return None
        self._tokens = tokens
        return ((n if n < bucket else bucket) - tokens) / rate

    def try_acquire(self, n: int = 1) -> bool:
        """Take ``n`` records' tokens if they are there now; never blocks."""
        if self._rate is None:
            return True
        with self._lock:
            rate = self._rate
            return rate is None or self._take(n, rate) is None

    def acquire(self, n: int = 1, cancel: threading.Event | None = None) -> None:
        """Block until ``n`` records may pass (at once when unlimited).

        Returns without taking tokens once ``cancel`` is set and a wake-up came
        (:meth:`wake_waiters`, a rate update, or tokens due).
        """
        if self._rate is None:
            return
        with self._lock:
            waiting_since: float | None = None
            try:
                while True:
                    rate = self._rate
                    if rate is None:
                        return
                    wait_s = self._take(n, rate)
                    if wait_s is None:
                        return
                    if cancel is not None and cancel.is_set():
                        return
                    if waiting_since is None:
                        waiting_since = self._last
                    self._clock.wait_on(self._changed, self._last + wait_s)
            finally:
                if waiting_since is not None:
                    self._waited_s += self._now() - waiting_since
