"""Clocks: every piece of time in spark-receivers goes through one of these.

``SystemClock`` reads the wall clock; ``ManualClock`` (re-exported from
``spark_receivers.testing``) only moves when a test advances it, so timers,
block generators, rate limiters and estimators can be tested without sleeping.

Two readings: :meth:`Clock.get_time_ms` is the time of day in milliseconds (block
and batch times, WAL record times), :meth:`Clock.monotonic_s` is a float of
seconds that never goes back, for measuring intervals (rates, timeouts). Two
ways to wait: :meth:`Clock.wait_till_time` sleeps until a time of day;
:meth:`Clock.wait_on` waits on a :class:`threading.Condition` until it is notified
or a monotonic deadline passes, so a waiter also wakes when another thread
changes what it waits for (a rate limiter whose rate was raised).
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from typing import Protocol


class Clock(Protocol):
    """The time source used by timers, generators and rate limiters."""

    def get_time_ms(self) -> int:
        """Return the current time in milliseconds."""
        ...

    def wait_till_time(self, target_ms: int, cancel: threading.Event | None = None) -> int:
        """Block until the clock reaches ``target_ms`` or ``cancel`` is set.

        Returns the clock's time when it returns.
        """
        ...

    def monotonic_s(self) -> float:
        """Return seconds on a clock that never goes back (only differences mean anything)."""
        ...

    def wait_on(self, condition: threading.Condition, deadline_s: float) -> None:
        """Wait on ``condition`` until notified or until :meth:`monotonic_s` reaches ``deadline_s``.

        The caller holds ``condition``'s lock (as for ``Condition.wait``). May
        return early or spuriously: call it in a loop that re-checks its predicate.
        Returns at once when the deadline has passed.
        """
        ...


class SystemClock:
    """The wall clock (``time.time``) in milliseconds; ``time.monotonic`` for intervals."""

    # The builtin itself, not a method wrapping it: rate limiters read it per acquire.
    monotonic_s = staticmethod(time.monotonic)

    def get_time_ms(self) -> int:
        """Return the current wall-clock time in milliseconds."""
        return int(time.time() * 1000)

    def wait_on(self, condition: threading.Condition, deadline_s: float) -> None:
        """``condition.wait`` for the time left until ``deadline_s`` (``time.monotonic``)."""
        remaining = deadline_s - time.monotonic()
        if remaining > 0:
            condition.wait(remaining)

    def wait_till_time(self, target_ms: int, cancel: threading.Event | None = None) -> int:
        """Sleep until ``target_ms`` (or until ``cancel`` is set)."""
        while True:
            now = self.get_time_ms()
            remaining = target_ms - now
            if remaining <= 0:
                return now
            if cancel is not None:
                if cancel.wait(remaining / 1000.0):
                    return self.get_time_ms()
            else:
                time.sleep(remaining / 1000.0)


class ManualClock:
    """A clock that only moves when told to; for tests.

    Threads blocked in :meth:`wait_till_time` wake when :meth:`advance` or
    :meth:`set_time` reaches their target, or when their cancel event is set
    and :meth:`wake_all` is called (timers call it when they stop). Threads in
    :meth:`wait_on` wake whenever the time is set or advanced (and on
    :meth:`wake_all`), besides their condition's own notifications.
    :meth:`monotonic_s` is the manual time in seconds.

    :meth:`wait_for_waiters` lets a test wait until its threads are blocked on
    the clock at the current time, instead of sleeping and hoping they are.
    """

    def __init__(self, start_ms: int = 0) -> None:
        self._time = start_ms
        lock = threading.Lock()
        self._cond = threading.Condition(lock)
        # Notified when a thread starts waiting (for wait_for_waiters), apart from
        # _cond so that a new waiter does not wake the others waiting for a time.
        self._waiters_changed = threading.Condition(lock)
        # Bumped whenever waiters are woken; a waiter registers under the epoch it
        # saw, so "waiting at the current epoch" means "saw the current time, waits".
        self._epoch = 0
        self._waiting: Counter[int] = Counter()
        # Conditions threads wait on in wait_on (a count per condition: several
        # threads may wait on one). Notified after the time moved, outside the lock.
        self._waited_on: Counter[threading.Condition] = Counter()

    def get_time_ms(self) -> int:
        """Return the manual time."""
        with self._cond:
            return self._time

    def monotonic_s(self) -> float:
        """Return the manual time in seconds."""
        with self._cond:
            return self._time / 1000.0

    def set_time(self, time_ms: int) -> None:
        """Set the time and wake every waiter."""
        with self._cond:
            self._time = time_ms
            waited_on = self._wake_locked()
        _notify(waited_on)

    def advance(self, delta_ms: int) -> None:
        """Move the time forward by ``delta_ms`` and wake every waiter."""
        with self._cond:
            self._time += delta_ms
            waited_on = self._wake_locked()
        _notify(waited_on)

    def wake_all(self) -> None:
        """Wake waiters so that they can re-check their cancel events."""
        with self._cond:
            waited_on = self._wake_locked()
        _notify(waited_on)

    def _wake_locked(self) -> list[threading.Condition]:
        self._epoch += 1
        self._cond.notify_all()
        return list(self._waited_on)

    def _register_locked(self) -> int:
        epoch = self._epoch
        self._waiting[epoch] += 1
        self._waiters_changed.notify_all()
        return epoch

    def _unregister_locked(self, epoch: int) -> None:
        self._waiting[epoch] -= 1
        if self._waiting[epoch] <= 0:
            del self._waiting[epoch]

    def wait_for_waiters(self, count: int = 1, timeout_s: float = 10.0) -> bool:
        """Block until ``count`` threads wait on this clock having seen its current time.

        A thread counts from the moment it is blocked in :meth:`wait_till_time` or
        :meth:`wait_on` after the latest :meth:`advance`/:meth:`set_time`/
        :meth:`wake_all`. Returns False after ``timeout_s`` of real time (a test
        failure, not a way to pace a test).
        """
        with self._waiters_changed:
            return self._waiters_changed.wait_for(
                lambda: self._waiting[self._epoch] >= count, timeout_s
            )

    def wait_on(self, condition: threading.Condition, deadline_s: float) -> None:
        """Wait on ``condition`` (lock held) until notified or the time moved.

        Returns at once if the manual time is at or past ``deadline_s`` (seconds);
        otherwise waits, with no real-time limit, until ``condition`` is notified
        or the time is set or advanced (the caller re-checks its deadline).
        """
        with self._cond:
            # Checked and registered under the lock that advance() holds while it
            # moves the time and snapshots the waiters: no wake-up is lost.
            if self._time / 1000.0 >= deadline_s:
                return
            self._waited_on[condition] += 1
            epoch = self._register_locked()
        try:
            condition.wait()
        finally:
            with self._cond:
                self._unregister_locked(epoch)
                self._waited_on[condition] -= 1
                if self._waited_on[condition] <= 0:
                    del self._waited_on[condition]

    def wait_till_time(self, target_ms: int, cancel: threading.Event | None = None) -> int:
        """Block until the manual time reaches ``target_ms`` or ``cancel`` is set."""
        with self._cond:
            while self._time < target_ms and not (cancel is not None and cancel.is_set()):
                epoch = self._register_locked()
                try:
                    self._cond.wait(0.05 if cancel is not None else None)
                finally:
                    self._unregister_locked(epoch)
            return self._time


def _notify(conditions: list[threading.Condition]) -> None:
    # Each notify takes that condition's lock, which its waiter released in wait():
    # never called under ManualClock's lock, so no lock-order cycle with wait_on.
    for condition in conditions:
        with condition:
            condition.notify_all()
