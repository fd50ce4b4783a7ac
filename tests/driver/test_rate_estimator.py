"""PIDRateEstimator (Spark's PIDRateEstimatorSuite, plus a bounds property)."""

from __future__ import annotations

import math
import random
import threading
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from spark_receivers.driver.backpressure.rate_estimator import (
    ESTIMATOR_KEY,
    PIDRateEstimator,
    RateEstimator,
    create_rate_estimator,
)
from spark_receivers.errors import ConfigError


def default_estimator() -> PIDRateEstimator:
    return PIDRateEstimator(20, 1.0, 0.0, 0.0, 10)


def run(estimator: RateEstimator, times, elements, proc, sched) -> list[float | None]:
    return [
        estimator.compute(t, n, p, s)
        for t, n, p, s in zip(times, elements, proc, sched, strict=True)
    ]


# --- creation -------------------------------------------------------------------------


def test_the_pid_estimator_is_created_by_name():
    estimator = create_rate_estimator("pid", 1000, 1.0, 0.2, 0.0, 100.0)
    assert isinstance(estimator, PIDRateEstimator)
    assert (estimator.proportional, estimator.integral, estimator.derivative) == (1.0, 0.2, 0.0)
    assert estimator.min_rate == 100.0


def test_defaults_are_sparks():
    estimator = PIDRateEstimator(1000)
    assert (estimator.proportional, estimator.integral, estimator.derivative) == (1.0, 0.2, 0.0)
    assert estimator.min_rate == 100.0


def test_an_unknown_estimator_name_is_a_config_error():
    with pytest.raises(ConfigError) as info:
        create_rate_estimator("fuzzy", 1000, 1.0, 0.2, 0.0, 100.0)
    message = str(info.value)
    assert ESTIMATOR_KEY in message
    assert "'fuzzy'" in message
    assert "pid" in message


@pytest.mark.parametrize(
    ("kwargs", "names"),
    [
        ({"batch_interval_ms": 0}, ["batch_interval_ms", "0"]),
        ({"batch_interval_ms": -5}, ["batch_interval_ms", "-5"]),
        ({"proportional": -1}, ["proportional", "pid.proportional", "-1"]),
        ({"integral": -1}, ["integral", "pid.integral", "-1"]),
        ({"derivative": -1}, ["derivative", "pid.derived", "-1"]),
        ({"min_rate": 0}, ["min_rate", "pid.minRate", "0"]),
        ({"min_rate": -10}, ["min_rate", "pid.minRate", "-10"]),
        ({"proportional": math.nan}, ["proportional", "nan"]),
        ({"integral": math.inf}, ["integral", "inf"]),
        ({"min_rate": math.inf}, ["min_rate", "inf"]),
    ],
)
def test_estimator_checks_ranges(kwargs, names):
    args: dict[str, Any] = {
        "batch_interval_ms": 100,
        "proportional": 0.0,
        "integral": 0.0,
        "derivative": 0.0,
        "min_rate": 10.0,
    }
    args.update(kwargs)
    with pytest.raises(ConfigError) as info:
        PIDRateEstimator(**args)
    for name in names:
        assert name in str(info.value)


def test_zero_gains_are_allowed():
    PIDRateEstimator(100, 0.0, 0.0, 0.0, 10.0)


def test_create_checks_ranges_too():
    with pytest.raises(ConfigError, match="derived"):
        create_rate_estimator("pid", 1000, 1.0, 0.2, -0.5, 100.0)


# --- estimates ------------------------------------------------------------------------


def test_first_estimate_is_none():
    assert default_estimator().compute(0, 10, 10, 0) is None


def test_second_estimate_is_1000_per_second():
    p = default_estimator()
    p.compute(0, 10, 10, 0)
    assert p.compute(10, 10, 10, 0) == 1000.0


def test_no_estimate_without_time_difference():
    p = default_estimator()
    p.compute(0, 10, 10, 0)
    assert p.compute(10, 10, 10, 0) is not None
    assert p.compute(10, 10, 10, 0) is None
    assert p.compute(5, 10, 10, 0) is None


def test_no_estimate_without_records():
    p = default_estimator()
    p.compute(0, 10, 10, 0)
    assert p.compute(10, 0, 10, 0) is None
    assert p.compute(20, -10, 10, 0) is None


def test_no_estimate_without_processing_delay():
    p = default_estimator()
    p.compute(0, 10, 10, 0)
    assert p.compute(10, 10, 0, 0) is None
    assert p.compute(20, 10, -10, 0) is None


def test_skipped_calls_do_not_seed_the_first_rate():
    p = default_estimator()
    assert p.compute(0, 0, 10, 0) is None
    assert p.compute(10, 10, 10, 0) is None  # this is the first real batch
    assert p.compute(20, 10, 10, 0) == 1000.0


def test_estimate_is_never_below_min_rate():
    min_rate = 5.0
    p = PIDRateEstimator(20, 1.0, 1.0, 0.0, min_rate)
    # One batch every 20 ms, 1 record in 20 ms of processing, and a steady scheduling
    # delay: the estimator wants to go down, but never below min_rate.
    times = [i * 20 for i in range(50)]
    res = run(p, times, [1] * 50, [20] * 50, [100] * 50)
    assert res[0] is None
    assert res[1:] == [min_rate] * 49


def test_follows_increasing_processing_speed_without_accumulated_error():
    p = PIDRateEstimator(20, 1.0, 1.0, 0.0, 10)
    # Constant processing time, more records each batch, no scheduling delay: even with
    # an integral gain, only the proportional term acts and the estimate follows the speed.
    times = [i * 20 for i in range(50)]
    elements = [(i + 1) * 20 for i in range(50)]
    res = run(p, times, elements, [20] * 50, [0] * 50)
    assert res[0] is None
    assert res[1:] == [(i + 1) * 1000.0 for i in range(1, 50)]


def test_follows_decreasing_processing_speed_without_accumulated_error():
    p = PIDRateEstimator(20, 1.0, 1.0, 0.0, 10)
    times = [i * 20 for i in range(50)]
    elements = [(50 - i) * 20 for i in range(50)]
    res = run(p, times, elements, [20] * 50, [0] * 50)
    assert res[0] is None
    assert res[1:] == [(50 - i) * 1000.0 for i in range(1, 50)]


def _assert_stays_below_processing_speed(elements: list[int], sched: list[int]) -> None:
    p = PIDRateEstimator(20, 1.0, 0.01, 0.0, 10)
    proc_delay_ms = 20
    times = [i * 20 for i in range(len(elements))]
    speeds = [n / proc_delay_ms * 1000 for n in elements]
    res = run(p, times, elements, [proc_delay_ms] * len(elements), sched)
    assert res[0] is None
    for n in range(1, len(elements)):
        estimate = res[n]
        if elements[n] > 0:
            assert estimate is not None
            if sched[n] > 0:
                assert estimate < speeds[n]
        else:
            assert estimate is None


@pytest.mark.parametrize("seed", range(20))
def test_stays_below_processing_speed_with_accumulated_error(seed):
    rng = random.Random(seed)
    # As in Spark's suite, but with at least one record per batch: a batch with none
    # yields no estimate (checked above).
    elements = [rng.randrange(1, 1000) for _ in range(50)]
    sched = [rng.randrange(19) for _ in range(50)]
    _assert_stays_below_processing_speed(elements, sched)


@given(
    batches=st.lists(st.tuples(st.integers(1, 999), st.integers(0, 18)), min_size=1, max_size=50)
)
def test_stays_below_processing_speed_property(batches):
    _assert_stays_below_processing_speed([n for n, _ in batches], [s for _, s in batches])


def test_derivative_term_uses_seconds_since_the_last_estimate():
    p = PIDRateEstimator(1000, proportional=0.0, integral=0.0, derivative=1.0, min_rate=1.0)
    assert p.compute(1000, 1000, 1000, 0) is None  # seeds 1000/s, error 0
    # 500/s: error = 1000 - 500 = 500; d_error = (500 - 0) / 2 s = 250.
    assert p.compute(3000, 500, 1000, 0) == 750.0


def test_concurrent_compute_calls_are_serialized():
    p = PIDRateEstimator(20, 1.0, 0.0, 0.0, 10)
    p.compute(0, 10, 10, 0)
    results: list[float | None] = []
    lock = threading.Lock()

    def report(t: int) -> None:
        r = p.compute(t, 10, 10, 0)
        with lock:
            results.append(r)

    threads = [threading.Thread(target=report, args=(10,)) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    # Only one of the reports for the same batch time gets an estimate.
    assert sorted(results, key=lambda r: r is None) == [1000.0] + [None] * 7


# --- properties -----------------------------------------------------------------------


@given(
    gains=st.tuples(st.floats(0, 10), st.floats(0, 10), st.floats(0, 10), st.floats(0.001, 1e6)),
    batch_interval_ms=st.integers(1, 100_000),
    calls=st.lists(
        st.tuples(
            st.integers(-1000, 10**9),  # time_ms
            st.integers(-10, 10**9),  # num_elements
            st.integers(-10, 10**7),  # processing_delay_ms
            st.integers(0, 10**7),  # scheduling_delay_ms
        ),
        max_size=60,
    ),
)
def test_estimate_is_none_or_a_finite_rate_at_least_min_rate(gains, batch_interval_ms, calls):
    kp, ki, kd, min_rate = gains
    p = PIDRateEstimator(batch_interval_ms, kp, ki, kd, min_rate)
    for time_ms, n, proc, sched in calls:
        estimate = p.compute(time_ms, n, proc, sched)
        assert estimate is None or (math.isfinite(estimate) and estimate >= min_rate)
