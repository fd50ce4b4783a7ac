"""RateLimiter (Spark's RateLimiterSuite, plus bounds)."""

from __future__ import annotations

import time

from spark_receivers.receiver.rate_limiter import RateLimiter


def test_no_max_rate_means_unlimited():
    limiter = RateLimiter()
    assert limiter.rate is None
    limiter.acquire(10**9)  # returns at once
    limiter.update_rate(100)
    assert limiter.rate == 100


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


def test_acquire_paces_records():
    limiter = RateLimiter(max_rate=200)
    started = time.monotonic()
    for _ in range(40):
        limiter.acquire(1)
    # 40 records at 200/s need about 0.2 s; a generous lower bound only.
    assert time.monotonic() - started >= 0.1
