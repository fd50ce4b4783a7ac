"""Rate estimators: how many records per second a stream should ingest (backpressure).

After every completed batch the rate controller feeds the batch's size and delays to a
:class:`RateEstimator`; a new estimate is published to the stream's receivers as their
rate limit. :func:`create_rate_estimator` builds the estimator named by
``spark.streaming.backpressure.rateEstimator``; the only one, as in Spark, is ``pid``.
"""

from __future__ import annotations

import abc
import logging
import math
import threading

from spark_receivers.errors import ConfigError

__all__ = [
    "ESTIMATOR_KEY",
    "PIDRateEstimator",
    "RateEstimator",
    "create_rate_estimator",
]

log = logging.getLogger(__name__)

ESTIMATOR_KEY = "spark.streaming.backpressure.rateEstimator"
"""The configuration key naming the estimator."""

_PID_KEYS = {
    "proportional": "spark.streaming.backpressure.pid.proportional",
    "integral": "spark.streaming.backpressure.pid.integral",
    "derivative": "spark.streaming.backpressure.pid.derived",
    "min_rate": "spark.streaming.backpressure.pid.minRate",
}


class RateEstimator(abc.ABC):
    """Estimates the ingestion rate of one stream from the batches it completed."""

    @abc.abstractmethod
    def compute(
        self,
        time_ms: int,
        num_elements: int,
        processing_delay_ms: int,
        scheduling_delay_ms: int,
    ) -> float | None:
        """Return the new rate in records/s, or None when there is no new estimate.

        Args:
            time_ms: the time of the batch that just completed.
            num_elements: the records that batch processed.
            processing_delay_ms: how long the batch's jobs took.
            scheduling_delay_ms: how long the batch waited before its jobs started.
        """


class PIDRateEstimator(RateEstimator):
    """A proportional-integral-derivative controller on the processing rate.

    The error is the difference between the rate estimated for the previous batch and the
    rate at which this batch was processed (records / processing delay). The scheduling
    delay stands in for the accumulated (integral) error: a delay ``s`` means about
    ``s * rate`` records overflowed earlier batches, which would be worked off at
    ``s * rate / batch_interval`` records/s. The new rate is::

        max(latest_rate - kp * error - ki * historical_error - kd * d_error, min_rate)

    where ``d_error`` is the change of the error per second since the last estimate.

    The first batch only seeds the latest rate and returns None; so does any batch that
    did not move time forward, processed no records or took no time.

    Thread-safe: :meth:`compute` holds a lock, so batches may be reported from any thread.
    It never blocks on anything else.

    Example::

        pid = PIDRateEstimator(batch_interval_ms=1000)
        pid.compute(1000, 5000, 500, 0)    # None: first batch seeds 10,000 records/s
        pid.compute(2000, 5000, 1000, 0)   # 5000.0 records/s

    Raises:
        ConfigError: ``batch_interval_ms`` ≤ 0, a gain < 0 or ``min_rate`` ≤ 0 (or any of
            them not a finite number), naming the parameter, its key and the value.
    """

    def __init__(
        self,
        batch_interval_ms: int,
        proportional: float = 1.0,
        integral: float = 0.2,
        derivative: float = 0.0,
        min_rate: float = 100.0,
    ) -> None:
        if not (math.isfinite(batch_interval_ms) and batch_interval_ms > 0):
            msg = f"batch_interval_ms must be > 0, got {batch_interval_ms!r}"
            raise ConfigError(msg)
        for name, gain in (
            ("proportional", proportional),
            ("integral", integral),
            ("derivative", derivative),
        ):
            if not (math.isfinite(gain) and gain >= 0):
                msg = f"{name} ({_PID_KEYS[name]}) must be a finite number >= 0, got {gain!r}"
                raise ConfigError(msg)
        if not (math.isfinite(min_rate) and min_rate > 0):
            msg = (
                f"min_rate ({_PID_KEYS['min_rate']}) must be a finite number > 0 so that "
                f"some data always arrives to estimate from, got {min_rate!r}"
            )
            raise ConfigError(msg)

        self.batch_interval_ms = batch_interval_ms
        self.proportional = float(proportional)
        self.integral = float(integral)
        self.derivative = float(derivative)
        self.min_rate = float(min_rate)

        self._lock = threading.Lock()
        self._first_run = True
        self._latest_time_ms = -1
        self._latest_rate = 0.0  # seeded by the first batch
        self._latest_error = 0.0
        log.info(
            "Created PIDRateEstimator: proportional=%s, integral=%s, derivative=%s, "
            "min rate=%s records/s",
            self.proportional,
            self.integral,
            self.derivative,
            self.min_rate,
        )

    def compute(
        self,
        time_ms: int,
        num_elements: int,
        processing_delay_ms: int,
        scheduling_delay_ms: int,
    ) -> float | None:
        """Return the new rate in records/s, or None (first batch, or nothing to learn).

        See :class:`PIDRateEstimator` for the formula. Holds the estimator's lock.
        """
        with self._lock:
            if not (
                time_ms > self._latest_time_ms and num_elements > 0 and processing_delay_ms > 0
            ):
                log.debug(
                    "Rate estimation skipped: time=%s, records=%s, processing delay=%s ms",
                    time_ms,
                    num_elements,
                    processing_delay_ms,
                )
                return None

            processing_rate = num_elements / processing_delay_ms * 1000
            if self._first_run:
                self._first_run = False
                self._latest_time_ms = time_ms
                self._latest_rate = processing_rate
                self._latest_error = 0.0
                log.debug("First batch: rate seeded with %s records/s", processing_rate)
                return None

            # Seconds since the last estimate; close to the batch interval.
            dt_s = (time_ms - self._latest_time_ms) / 1000
            # The desired rate is the one estimated for the previous batch.
            error = self._latest_rate - processing_rate
            historical_error = scheduling_delay_ms * processing_rate / self.batch_interval_ms
            d_error = (error - self._latest_error) / dt_s
            new_rate = max(
                self._latest_rate
                - self.proportional * error
                - self.integral * historical_error
                - self.derivative * d_error,
                self.min_rate,
            )

            if not math.isfinite(new_rate):
                # Only reachable with absurd inputs; keep the last good state rather than
                # publish (and then build on) an infinite or NaN rate.
                log.warning(
                    "Rate estimate is not finite (%s) for time=%s, records=%s, processing "
                    "delay=%s ms, scheduling delay=%s ms; keeping %s records/s",
                    new_rate,
                    time_ms,
                    num_elements,
                    processing_delay_ms,
                    scheduling_delay_ms,
                    self._latest_rate,
                )
                return None
            self._latest_time_ms = time_ms
            self._latest_rate = new_rate
            self._latest_error = error
            log.debug(
                "New rate %s records/s (error=%s, historical error=%s, d_error=%s)",
                new_rate,
                error,
                historical_error,
                d_error,
            )
            return new_rate


def create_rate_estimator(
    name: str,
    batch_interval_ms: int,
    proportional: float = 1.0,
    integral: float = 0.2,
    derived: float = 0.0,
    min_rate: float = 100.0,
) -> RateEstimator:
    """Build the estimator named by ``spark.streaming.backpressure.rateEstimator``.

    ``derived`` is the derivative gain, named after its key
    ``spark.streaming.backpressure.pid.derived``.

    >>> type(create_rate_estimator("pid", batch_interval_ms=1000)).__name__
    'PIDRateEstimator'

    Raises:
        ConfigError: ``name`` is not a known estimator, or a PID parameter is out of range.
    """
    if name == "pid":
        return PIDRateEstimator(batch_interval_ms, proportional, integral, derived, min_rate)
    msg = f"{ESTIMATOR_KEY} must be one of: pid; got unknown rate estimator {name!r}"
    raise ConfigError(msg)
