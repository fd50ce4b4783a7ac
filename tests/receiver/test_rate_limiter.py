"""RateLimiter on a manual clock (Spark's RateLimiterSuite, plus the rate bound as a law)."""

from __future__ import annotations

import threading

from hypothesis import given, settings
from hypothesis import strategies as st

from spark_receivers.receiver.rate_limiter import RateLimiter
from spark_receivers.testing import ManualClock

WAIT_S = 10


def test_no_max_rate_means_unlimited():
    limiter = RateLimiter(clock=ManualClock())
    assert limiter.rate is None and not limiter.limited
    limiter.acquire(10**9)  # returns at once
    assert limiter.try_acquire(10**9)
    limiter.update_rate(100)
    assert limiter.rate == 100 and limiter.limited


def test_update_below_max_rate():
    limiter = RateLimiter(max_rate=1000)
    assert limiter.rate == 1000
    limiter.update_rate(500)
    assert limiter.rate == 500


def test_update_clamps_at_max_rate():
    limiter = RateLimiter(max_rate=1000)
    limiter.update_rate(5000)
    assert limiter.rate == 1000


def test_non_positive_updates_are_ignored():
    limiter = RateLimiter(max_rate=1000)
    limiter.update_rate(0)
    limiter.update_rate(-5)
    assert limiter.rate == 1000


def test_initial_rate_is_capped_by_max_rate():
    assert RateLimiter(max_rate=100, initial_rate=50).rate == 50
    assert RateLimiter(max_rate=100, initial_rate=500).rate == 100
    assert RateLimiter(initial_rate=70).rate == 70


def test_the_bucket_starts_empty_fills_at_the_rate_and_holds_one_second():
    clock = ManualClock(5_000)
    limiter = RateLimiter(max_rate=100, clock=clock)
    assert not limiter.try_acquire(1)
    clock.advance(10)  # 1 token
    assert limiter.try_acquire(1)
    assert not limiter.try_acquire(1)
    clock.advance(60_000)  # a minute idle still gives one second's worth
    assert limiter.try_acquire(100)
    assert not limiter.try_acquire(1)


def test_a_batch_larger_than_the_bucket_passes_when_full_and_leaves_a_debt():
    clock = ManualClock()
    limiter = RateLimiter(max_rate=10, clock=clock)
    clock.advance(999)
    assert not limiter.try_acquire(50)
    clock.advance(1)  # bucket full (10)
    assert limiter.try_acquire(50)  # 40 in debt
    clock.advance(4_099)
    assert not limiter.try_acquire(1)
    clock.advance(1)  # 41 tokens earned since: the debt is paid and one is left
    assert limiter.try_acquire(1)


def start_acquire(limiter, n, cancel=None):
    done = threading.Event()

    def run():
        limiter.acquire(n, cancel)
        done.set()

    threading.Thread(target=run, daemon=True).start()
    return done


def test_acquire_waits_for_the_clock():
    clock = ManualClock()
    limiter = RateLimiter(max_rate=100, clock=clock)
    done = start_acquire(limiter, 10)  # needs 100 ms
    assert clock.wait_for_waiters(1, WAIT_S)
    clock.advance(99)
    assert clock.wait_for_waiters(1, WAIT_S)  # saw 99 ms and waits again
    assert not done.is_set()
    clock.advance(1)
    assert done.wait(WAIT_S)
    assert not limiter.try_acquire(1)  # the 10 tokens were taken


def test_acquire_wakes_on_a_rate_update():
    clock = ManualClock()
    limiter = RateLimiter(initial_rate=1, clock=clock)
    clock.advance(100)  # 0.1 token at 1/s
    done = start_acquire(limiter, 1)
    assert clock.wait_for_waiters(1, WAIT_S)
    limiter.update_rate(100)  # 100 ms at 1/s earned 0.1; now 9 ms more at 100/s
    assert clock.wait_for_waiters(1, WAIT_S)
    assert not done.is_set()
    clock.advance(9)
    assert done.wait(WAIT_S)


def test_acquire_returns_on_cancel_when_woken():
    clock = ManualClock()
    limiter = RateLimiter(max_rate=1, clock=clock)
    cancel = threading.Event()
    done = start_acquire(limiter, 1, cancel)
    assert clock.wait_for_waiters(1, WAIT_S)
    cancel.set()
    limiter.wake_waiters()
    assert done.wait(WAIT_S)
    clock.advance(1000)
    assert limiter.try_acquire(1)  # the cancelled call took no tokens


def test_many_waiters_are_served_in_turn():
    clock = ManualClock()
    limiter = RateLimiter(max_rate=10, clock=clock)
    dones = [start_acquire(limiter, 1) for _ in range(3)]
    assert clock.wait_for_waiters(3, WAIT_S)
    clock.advance(100)  # one token: exactly one waiter passes
    assert clock.wait_for_waiters(2, WAIT_S)
    assert sum(d.is_set() for d in dones) == 1
    clock.advance(200)
    for d in dones:
        assert d.wait(WAIT_S)


ops = st.lists(
    st.one_of(
        st.tuples(st.just("take"), st.integers(1, 300)),
        st.tuples(st.just("advance"), st.integers(0, 2_000)),
        st.tuples(st.just("rate"), st.floats(-10, 500, allow_nan=False)),
    ),
    max_size=60,
)


@settings(max_examples=200, deadline=None)
@given(max_rate=st.one_of(st.none(), st.integers(1, 400)), initial=st.integers(1, 400), ops=ops)
def test_records_passed_stay_within_rate_times_elapsed(max_rate, initial, ops):
    """Law: before any call passes, the records passed so far plus what the call takes
    up to the bucket size stay within the tokens earned, ∫ rate dt; so in total
    passed ≤ ∫ rate dt + the largest excess of one call over the bucket.

    (Up to float rounding: the limiter allows a microsecond's worth of tokens.)
    """
    clock = ManualClock(1_000)
    limiter = RateLimiter(max_rate=max_rate, initial_rate=initial, clock=clock)
    earned = 0.0
    passed = 0
    largest_excess = 0.0
    for op, value in ops:
        rate = limiter.rate
        assert rate is not None
        tolerance = 1e-6 * (1 + earned + rate)
        if op == "advance":
            clock.advance(value)
            earned += rate * value / 1000
        elif op == "rate":
            limiter.update_rate(value)
            if max_rate is not None:
                assert limiter.rate <= max_rate
        elif limiter.try_acquire(value):
            bucket = max(rate, 1.0)
            assert passed + min(value, bucket) <= earned + tolerance
            passed += value
            largest_excess = max(largest_excess, value - bucket)
        assert passed <= earned + largest_excess + tolerance


@settings(max_examples=50, deadline=None)
@given(rate=st.integers(1, 1000), n=st.integers(1, 1000))
def test_a_call_passes_once_enough_time_has_passed(rate, n):
    clock = ManualClock()
    limiter = RateLimiter(max_rate=rate, clock=clock)
    bucket = max(rate, 1)
    needed_ms = -(-1000 * min(n, bucket) // rate)  # ceil
    clock.advance(needed_ms - 1)
    assert not limiter.try_acquire(n)
    clock.advance(1)
    assert limiter.try_acquire(n)
