"""Clocks: every piece of time in spark-receivers goes through one of these.

``SystemClock`` reads the wall clock; ``ManualClock`` (re-exported from
``spark_receivers.testing``) only moves when a test advances it, so timers,
block generators and estimators can be tested without sleeping.
"""

from __future__ import annotations

import threading
import time
from typing import Protocol


class Clock(Protocol):
    """The time source used by timers and generators (milliseconds)."""

    def get_time_ms(self) -> int:
        """Return the current time in milliseconds."""
        ...

    def wait_till_time(self, target_ms: int, cancel: threading.Event | None = None) -> int:
        """Block until the clock reaches ``target_ms`` or ``cancel`` is set.

        Returns the clock's time when it returns.
        """
        ...


class SystemClock:
    """The wall clock (``time.time``), in milliseconds."""

    def get_time_ms(self) -> int:
        """Return the current wall-clock time in milliseconds."""
        return int(time.time() * 1000)

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
    and :meth:`wake_all` is called (timers call it when they stop).
    """

    def __init__(self, start_ms: int = 0) -> None:
        self._time = start_ms
        self._cond = threading.Condition()

    def get_time_ms(self) -> int:
        """Return the manual time."""
        with self._cond:
            return self._time

    def set_time(self, time_ms: int) -> None:
        """Set the time and wake every waiter."""
        with self._cond:
            self._time = time_ms
            self._cond.notify_all()

    def advance(self, delta_ms: int) -> None:
        """Move the time forward by ``delta_ms`` and wake every waiter."""
        with self._cond:
            self._time += delta_ms
            self._cond.notify_all()

    def wake_all(self) -> None:
        """Wake waiters so that they can re-check their cancel events."""
        with self._cond:
            self._cond.notify_all()

    def wait_till_time(self, target_ms: int, cancel: threading.Event | None = None) -> int:
        """Block until the manual time reaches ``target_ms`` or ``cancel`` is set."""
        with self._cond:
            while self._time < target_ms and not (cancel is not None and cancel.is_set()):
                self._cond.wait(0.05 if cancel is not None else None)
            return self._time
