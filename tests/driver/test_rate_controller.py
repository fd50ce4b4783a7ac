"""RateController: order, concurrency correction, max rate, publishing."""

from __future__ import annotations

import threading

from spark_receivers.driver.backpressure.rate_controller import RateController
from spark_receivers.driver.backpressure.rate_estimator import PIDRateEstimator, RateEstimator
from spark_receivers.driver.observe.listener import BatchInfo


class Recording(RateEstimator):
    def __init__(self, rate: float | None = 500.0) -> None:
        self.calls: list[tuple[int, int, int, int]] = []
        self.rate = rate

    def compute(self, time_ms, num_elements, processing_delay_ms, scheduling_delay_ms):
        self.calls.append((time_ms, num_elements, processing_delay_ms, scheduling_delay_ms))
        return self.rate


def batch(t: int, records: int, start: int, end: int, submitted: int | None = None) -> BatchInfo:
    return BatchInfo(t, {0: records}, submitted if submitted is not None else t, start, end)


class Published:
    def __init__(self) -> None:
        self.rates: list[tuple[int, float]] = []
        self.cond = threading.Condition()

    def __call__(self, stream_id: int, rate: float) -> None:
        with self.cond:
            self.rates.append((stream_id, rate))
            self.cond.notify_all()

    def wait(self, n: int) -> None:
        with self.cond:
            assert self.cond.wait_for(lambda: len(self.rates) >= n, 10)


def test_publishes_estimates_capped_at_max_rate():
    published = Published()
    controller = RateController(0, Recording(5000.0), published, max_rate=1000.0).start()
    controller.on_batch_completed(batch(1000, 100, 1000, 1200))
    published.wait(1)
    controller.stop()
    assert published.rates == [(0, 1000.0)]
    assert controller.latest_rate == 1000.0


def test_completions_reach_the_estimator_in_batch_order():
    estimator = Recording()
    published = Published()
    controller = RateController(0, estimator, published).start()
    for t in (1000, 2000, 3000):
        controller.on_batch_submitted(batch(t, 10, t, t))
    controller.on_batch_completed(batch(2000, 20, 2000, 2500))  # held: 1000 is still running
    controller.on_batch_completed(batch(3000, 30, 3000, 3400))
    controller.on_batch_completed(batch(1000, 10, 1000, 2600))
    published.wait(3)
    controller.stop()
    assert [c[1] for c in estimator.calls] == [10, 20, 30]


def test_overlapping_batches_are_charged_their_wall_time():
    estimator = Recording()
    published = Published()
    controller = RateController(0, estimator, published).start()
    # Two batches ran side by side, each 1000 ms, ending 100 ms apart.
    controller.on_batch_completed(batch(1000, 1000, 1000, 2000))
    controller.on_batch_completed(batch(1100, 1000, 1100, 2100))
    published.wait(2)
    controller.stop()
    assert estimator.calls[0][2] == 1000
    assert estimator.calls[1][2] == 100  # not 1000: the pipeline finished it in 100 ms


def test_with_the_pid_estimator_the_rate_follows_processing_speed():
    published = Published()
    controller = RateController(0, PIDRateEstimator(1000), published).start()
    # One batch a second, 1000 records each, each taking 2 s one after the other:
    # the pipeline does 500 records/s and batches queue up.
    for i in range(1, 8):
        t = i * 1000
        start = 1000 + (i - 1) * 2000
        controller.on_batch_completed(batch(t, 1000, start, start + 2000, submitted=t))
    published.wait(6)
    controller.stop()
    assert 100 <= published.rates[-1][1] <= 600
