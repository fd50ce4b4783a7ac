"""RecurringTimer on a manual clock: ticks, the final tick, and a callback that raises."""

from __future__ import annotations

import threading

from spark_receivers.util.clock import ManualClock
from spark_receivers.util.timer import RecurringTimer

WAIT_S = 10


class Ticks:
    def __init__(self, fail_at: int | None = None) -> None:
        self.cond = threading.Condition()
        self.times: list[int] = []
        self.errors: list[BaseException] = []
        self.fail_at = fail_at

    def __call__(self, time_ms: int) -> None:
        with self.cond:
            self.times.append(time_ms)
            self.cond.notify_all()
        if time_ms == self.fail_at:
            raise RuntimeError(f"tick {time_ms} failed")

    def on_error(self, error: BaseException) -> None:
        with self.cond:
            self.errors.append(error)
            self.cond.notify_all()

    def wait_for(self, predicate) -> None:
        with self.cond:
            assert self.cond.wait_for(predicate, WAIT_S)


def test_ticks_on_the_period_and_a_final_tick_on_stop():
    clock = ManualClock(50)
    ticks = Ticks()
    timer = RecurringTimer(clock, 100, ticks, "t")
    assert timer.start() == 100
    clock.advance(50)
    ticks.wait_for(lambda: ticks.times == [100])
    clock.advance(100)
    ticks.wait_for(lambda: ticks.times == [100, 200])
    clock.advance(30)
    timer.stop(final_tick=True)
    assert ticks.times == [100, 200, 230]
    assert timer.failure is None


def test_a_raising_callback_calls_on_error_once_and_the_timer_stops_ticking():
    clock = ManualClock()
    ticks = Ticks(fail_at=200)
    timer = RecurringTimer(clock, 100, ticks, "t", on_error=ticks.on_error)
    timer.start()
    clock.advance(100)
    ticks.wait_for(lambda: ticks.times == [100])
    clock.advance(100)
    ticks.wait_for(lambda: len(ticks.errors) == 1)
    (error,) = ticks.errors
    assert isinstance(error, RuntimeError) and "tick 200" in str(error)
    assert timer.failure is error
    clock.advance(500)
    timer.stop(final_tick=True)  # returns: the thread is gone, no final tick
    assert ticks.times == [100, 200]
    assert len(ticks.errors) == 1


def test_on_error_sees_base_exceptions_and_its_own_errors_are_only_logged():
    class Fatal(BaseException):
        pass

    clock = ManualClock()
    seen: list[BaseException] = []
    died = threading.Event()

    def tick(_: int) -> None:
        raise Fatal

    def on_error(error: BaseException) -> None:
        seen.append(error)
        died.set()
        raise ValueError("owner failed too")

    timer = RecurringTimer(clock, 100, tick, "t", on_error=on_error)
    timer.start()
    clock.advance(100)
    assert died.wait(WAIT_S)
    timer.stop()
    assert len(seen) == 1 and isinstance(seen[0], Fatal)
