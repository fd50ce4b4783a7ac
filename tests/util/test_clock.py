"""Clocks: ManualClock's waits wake when the time moves; SystemClock's respect deadlines."""

from __future__ import annotations

import threading

from spark_receivers.util.clock import ManualClock, SystemClock

WAIT_S = 10


def waiter(clock, cond, deadline_s, results):
    def run():
        with cond:
            clock.wait_on(cond, deadline_s)
            results.append(clock.monotonic_s())

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t


def test_manual_monotonic_is_the_manual_time_in_seconds():
    clock = ManualClock(1_500)
    assert clock.monotonic_s() == 1.5
    clock.advance(250)
    assert clock.monotonic_s() == 1.75


def test_manual_wait_on_returns_at_once_past_the_deadline():
    clock = ManualClock(2_000)
    cond = threading.Condition()
    with cond:
        clock.wait_on(cond, 2.0)  # does not block


def test_manual_wait_on_wakes_when_the_time_moves():
    clock = ManualClock()
    cond = threading.Condition()
    results: list[float] = []
    t = waiter(clock, cond, 1.0, results)
    assert clock.wait_for_waiters(1, WAIT_S)
    clock.advance(10)  # wakes it even before the deadline: the caller re-checks
    t.join(WAIT_S)
    assert results == [0.01]


def test_manual_wait_on_wakes_on_a_notify_and_on_wake_all():
    clock = ManualClock()
    cond = threading.Condition()
    results: list[float] = []
    t = waiter(clock, cond, 1.0, results)
    assert clock.wait_for_waiters(1, WAIT_S)
    with cond:
        cond.notify_all()
    t.join(WAIT_S)
    t = waiter(clock, cond, 1.0, results)
    assert clock.wait_for_waiters(1, WAIT_S)
    clock.wake_all()
    t.join(WAIT_S)
    assert results == [0.0, 0.0]


def test_wait_for_waiters_counts_threads_that_saw_the_current_time():
    clock = ManualClock()
    done = threading.Event()

    def timer():
        clock.wait_till_time(100)
        done.set()

    threading.Thread(target=timer, daemon=True).start()
    assert clock.wait_for_waiters(1, WAIT_S)
    clock.advance(50)
    assert clock.wait_for_waiters(1, WAIT_S)  # woke, saw 50, waits again
    assert not done.is_set()
    clock.advance(50)
    assert done.wait(WAIT_S)
    assert not clock.wait_for_waiters(1, timeout_s=0)


def test_system_clock_wait_on_honours_a_past_deadline():
    clock = SystemClock()
    cond = threading.Condition()
    before = clock.monotonic_s()
    with cond:
        clock.wait_on(cond, before - 1)  # returns at once
    assert clock.monotonic_s() >= before
