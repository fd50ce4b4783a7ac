"""A recurring timer on an injected clock (Spark's RecurringTimer)."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from spark_receivers.util.clock import Clock

log = logging.getLogger(__name__)


class RecurringTimer:
    """Calls ``callback(time_ms)`` at every multiple of ``period_ms`` on its own thread.

    The first call is at the first multiple of the period after :meth:`start`
    (or at ``start_ms`` when given). :meth:`stop` with ``final_tick=True`` makes
    the thread run one last callback, at the current time, before it exits, so a
    block generator cuts its last block without waiting for the next period.

    When ``callback`` raises, the timer thread dies. With ``on_error`` the cause
    is logged with its stack, kept in :attr:`failure`, and ``on_error(exc)`` is
    called once, on the dying timer thread (it may not block for long; an
    exception it raises is logged), so that the owner can fail instead of
    waiting for ticks that will never come. Without ``on_error`` the cause is
    logged and re-raised (it reaches ``threading.excepthook``).
    """

    def __init__(
        self,
        clock: Clock,
        period_ms: int,
        callback: Callable[[int], None],
        name: str,
        *,
        on_error: Callable[[BaseException], None] | None = None,
    ) -> None:
        self._clock = clock
        self._period_ms = period_ms
        self._callback = callback
        self._name = name
        self._on_error = on_error
        self._cancel = threading.Event()
        self._final_tick = False
        self._thread: threading.Thread | None = None
        self.next_time_ms = -1
        self.failure: BaseException | None = None
        """What killed the timer thread, or None."""

    def start(self, start_ms: int | None = None) -> int:
        """Start ticking; return the time of the first tick."""
        if self._thread is not None:
            msg = f"timer {self._name} already started"
            raise RuntimeError(msg)
        if start_ms is None:
            now = self._clock.get_time_ms()
            start_ms = (now // self._period_ms + 1) * self._period_ms
        self.next_time_ms = start_ms
        self._thread = threading.Thread(target=self._loop, name=self._name, daemon=True)
        self._thread.start()
        return start_ms

    def stop(self, final_tick: bool = False, timeout_s: float | None = None) -> None:
        """Stop the timer and join its thread; idempotent (returns at once if it died)."""
        self._final_tick = final_tick
        self._cancel.set()
        wake = getattr(self._clock, "wake_all", None)
        if wake is not None:
            wake()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout_s)

    def _loop(self) -> None:
        try:
            while not self._cancel.is_set():
                self._clock.wait_till_time(self.next_time_ms, self._cancel)
                if self._cancel.is_set():
                    break
                self._callback(self.next_time_ms)
                self.next_time_ms += self._period_ms
            if self._final_tick:
                self._callback(self._clock.get_time_ms())
        except BaseException as e:
            self.failure = e
            log.exception("timer %s died", self._name)
            if self._on_error is None:
                raise
            try:
                self._on_error(e)
            except Exception:
                log.exception("timer %s: on_error raised", self._name)
