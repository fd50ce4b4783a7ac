"""Every configuration key of spark-receivers, its default, its unit and its check.

``StreamingConfig`` is frozen and validated at construction: a bad value raises
:class:`~spark_receivers.errors.ConfigError` naming the key, the value and what is
allowed. :meth:`StreamingConfig.from_spark_conf` reads the defaults from the Spark
configuration under the same ``spark.streaming.*`` keys Spark Streaming uses, so
``spark-submit --conf`` and ``SparkSession.builder.config`` work as users expect.

Example::

    cfg = StreamingConfig(block_interval_ms=100, receiver_max_rate=50_000)
    ssc = StreamingContext(spark, batch_interval_ms=1000, config=cfg)
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from spark_receivers.errors import ConfigError

UNLIMITED_RATE = 0
"""``receiver_max_rate`` value meaning "no limit" (Spark uses Long.MaxValue)."""

RATE_ESTIMATORS = ("pid",)
"""Names accepted by ``spark.streaming.backpressure.rateEstimator``."""


def _key(spark_key: str, doc: str) -> Any:
    return field(metadata={"spark_key": spark_key, "doc": doc})


@dataclass(frozen=True)
class StreamingConfig:
    """Typed, validated configuration of a :class:`StreamingContext`.

    Durations carry their unit in the name. Defaults follow Spark Streaming's.
    """

    block_interval_ms: int = _key(
        "spark.streaming.blockInterval", "How often received records are cut into a block."
    )
    block_queue_size: int = _key(
        "spark.streaming.blockQueueSize", "Blocks waiting to be pushed before store() blocks."
    )
    receiver_max_rate: float = _key(
        "spark.streaming.receiver.maxRate", "Records/s per receiver; 0 means unlimited."
    )
    receiver_restart_delay_ms: int = _key(
        "spark.streaming.receiverRestartDelay", "Delay before a restarted receiver starts again."
    )
    receiver_wal_enabled: bool = _key(
        "spark.streaming.receiver.writeAheadLog.enable", "Write every block to a WAL first."
    )
    block_store_timeout_s: float = _key(
        "spark.streaming.receiver.blockStoreTimeout", "Max wait for a block store + WAL write."
    )
    backpressure_enabled: bool = _key(
        "spark.streaming.backpressure.enabled", "Adapt receiver rates to processing speed."
    )
    backpressure_initial_rate: float = _key(
        "spark.streaming.backpressure.initialRate", "First rate with backpressure; 0 = max rate."
    )
    backpressure_rate_estimator: str = _key(
        "spark.streaming.backpressure.rateEstimator", "Rate estimator with backpressure: pid."
    )
    backpressure_pid_proportional: float = _key(
        "spark.streaming.backpressure.pid.proportional", "PID gain on the current error (>= 0)."
    )
    backpressure_pid_integral: float = _key(
        "spark.streaming.backpressure.pid.integral", "PID gain on the accumulated error (>= 0)."
    )
    backpressure_pid_derived: float = _key(
        "spark.streaming.backpressure.pid.derived", "PID gain on the error's change (>= 0)."
    )
    backpressure_pid_min_rate: float = _key(
        "spark.streaming.backpressure.pid.minRate", "Lowest rate the estimator sets (> 0)."
    )
    graceful_stop_timeout_ms: int = _key(
        "spark.streaming.gracefulStopTimeout", "Max graceful stop time; 0 = 10 batch intervals."
    )
    concurrent_jobs: int = _key(
        "spark.streaming.concurrentJobs", "Batches processed at the same time."
    )
    receiver_stop_timeout_s: float = _key(
        "spark.streaming.receiver.stopTimeout", "Wait for receivers to deregister on stop."
    )
    max_message_bytes: int = _key(
        "spark.streaming.rpc.maxMessageBytes", "Largest control message accepted."
    )
    receiver_drain_timeout_s: float = _key(
        "spark.streaming.receiver.drainTimeout",
        "After a receiver stops, how long its task serves blocks batches have not read.",
    )
    checkpoint_dir: str = _key(
        "spark.streaming.checkpointDir",
        "Checkpoint directory (path or URI); '' = none. Set by StreamingContext(checkpoint_dir=).",
    )
    receiver_wal_rolling_interval_s: float = _key(
        "spark.streaming.receiver.writeAheadLog.rollingIntervalSecs",
        "Time span of one receiver WAL segment file.",
    )
    receiver_wal_max_failures: int = _key(
        "spark.streaming.receiver.writeAheadLog.maxFailures",
        "Attempts (each on a fresh segment) before a receiver WAL write fails.",
    )
    receiver_wal_close_file_after_write: bool = _key(
        "spark.streaming.receiver.writeAheadLog.closeFileAfterWrite",
        "One object per record in the receiver WAL (needed on S3 and other object stores).",
    )
    receiver_wal_fsync: bool = _key(
        "spark.streaming.receiver.writeAheadLog.fsync",
        "fdatasync every receiver WAL record on a local filesystem before acknowledging it.",
    )
    driver_wal_rolling_interval_s: float = _key(
        "spark.streaming.driver.writeAheadLog.rollingIntervalSecs",
        "Time span of one driver WAL segment file.",
    )
    driver_wal_max_failures: int = _key(
        "spark.streaming.driver.writeAheadLog.maxFailures",
        "Attempts (each on a fresh segment) before a driver WAL write fails.",
    )
    driver_wal_close_file_after_write: bool = _key(
        "spark.streaming.driver.writeAheadLog.closeFileAfterWrite",
        "One object per record in the driver WAL (needed on S3 and other object stores).",
    )
    driver_wal_fsync: bool = _key(
        "spark.streaming.driver.writeAheadLog.fsync",
        "fdatasync every driver WAL record on a local filesystem before acknowledging it.",
    )
    driver_wal_allow_batching: bool = _key(
        "spark.streaming.driver.writeAheadLog.allowBatching",
        "Group concurrent driver WAL writes into one record (one fsync for many AddBlocks).",
    )
    driver_wal_batching_timeout_ms: int = _key(
        "spark.streaming.driver.writeAheadLog.batchingTimeout",
        "Max wait of one driver WAL write when batching.",
    )
    stop_gracefully_on_shutdown: bool = _key(
        "spark.streaming.stopGracefullyOnShutdown",
        "On SIGTERM, stop the StreamingContext gracefully (received == processed).",
    )
    batch_read_partitions: int = _key(
        "spark.streaming.batch.readPartitions",
        "Read tasks per stream and batch; 0 = one wave of the task slots receivers leave free.",
    )

    # The dataclass defaults live here, once, so that `from_spark_conf` and the
    # constructor agree.
    def __init__(self, **overrides: Any) -> None:
        values = dict(_DEFAULTS)
        unknown = sorted(set(overrides) - set(values))
        if unknown:
            allowed = ", ".join(sorted(values))
            msg = f"unknown StreamingConfig key(s) {unknown}; allowed keys: {allowed}"
            raise ConfigError(msg)
        values.update(overrides)
        for name, value in values.items():
            object.__setattr__(self, name, value)
        self._validate()

    def _validate(self) -> None:
        _positive_int(self, "block_interval_ms")
        _positive_int(self, "block_queue_size")
        _non_negative(self, "receiver_max_rate")
        _non_negative(self, "receiver_restart_delay_ms", integral=True)
        _bool(self, "receiver_wal_enabled")
        _positive(self, "block_store_timeout_s")
        _bool(self, "backpressure_enabled")
        _non_negative(self, "backpressure_initial_rate")
        if self.backpressure_rate_estimator not in RATE_ESTIMATORS:
            msg = (
                f"{_describe(self, 'backpressure_rate_estimator')} must be one of "
                f"{', '.join(RATE_ESTIMATORS)}; got {self.backpressure_rate_estimator!r}"
            )
            raise ConfigError(msg)
        _non_negative(self, "backpressure_pid_proportional")
        _non_negative(self, "backpressure_pid_integral")
        _non_negative(self, "backpressure_pid_derived")
        _positive(self, "backpressure_pid_min_rate")
        _non_negative(self, "graceful_stop_timeout_ms", integral=True)
        _positive_int(self, "concurrent_jobs")
        _positive(self, "receiver_stop_timeout_s")
        _positive_int(self, "max_message_bytes")
        _positive(self, "receiver_drain_timeout_s")
        if not isinstance(self.checkpoint_dir, str):
            msg = (
                f"{_describe(self, 'checkpoint_dir')} must be a path or URI string ('' for "
                f"none), got {self.checkpoint_dir!r}"
            )
            raise ConfigError(msg)
        for side in ("receiver", "driver"):
            _positive(self, f"{side}_wal_rolling_interval_s")
            _positive_int(self, f"{side}_wal_max_failures")
            _bool(self, f"{side}_wal_close_file_after_write")
            _bool(self, f"{side}_wal_fsync")
        _bool(self, "driver_wal_allow_batching")
        _positive_int(self, "driver_wal_batching_timeout_ms")
        _bool(self, "stop_gracefully_on_shutdown")
        _non_negative(self, "batch_read_partitions", integral=True)

    def replace(self, **changes: Any) -> StreamingConfig:
        """Return a copy with ``changes`` applied (and validated)."""
        return StreamingConfig(**{**self.as_dict(), **changes})

    def as_dict(self) -> dict[str, Any]:
        """Return the configuration as a plain dict (JSON-friendly)."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}

    @property
    def max_rate_or_none(self) -> float | None:
        """``receiver_max_rate`` as a number, or None when unlimited."""
        return None if self.receiver_max_rate == UNLIMITED_RATE else float(self.receiver_max_rate)

    @classmethod
    def from_spark_conf(cls, conf: Mapping[str, str], **overrides: Any) -> StreamingConfig:
        """Build a config from Spark conf entries (``spark.streaming.*``), then ``overrides``.

        Durations accept Spark's suffixes (``200ms``, ``2s``, ``1min``).
        """
        values: dict[str, Any] = {}
        for f in dataclasses.fields(cls):
            spark_key = f.metadata["spark_key"]
            if spark_key in conf:
                values[f.name] = _parse_spark_value(f.name, spark_key, conf[spark_key])
        values.update(overrides)
        return cls(**values)

    @staticmethod
    def spark_key(name: str) -> str:
        """The ``spark.streaming.*`` key of a field."""
        for f in dataclasses.fields(StreamingConfig):
            if f.name == name:
                return str(f.metadata["spark_key"])
        msg = f"no StreamingConfig field named {name!r}"
        raise KeyError(msg)


_DEFAULTS: dict[str, Any] = {
    "block_interval_ms": 200,
    "block_queue_size": 10,
    "receiver_max_rate": UNLIMITED_RATE,
    "receiver_restart_delay_ms": 2000,
    "receiver_wal_enabled": False,
    "block_store_timeout_s": 30.0,
    "backpressure_enabled": False,
    "backpressure_initial_rate": 0.0,
    "backpressure_rate_estimator": "pid",
    "backpressure_pid_proportional": 1.0,
    "backpressure_pid_integral": 0.2,
    "backpressure_pid_derived": 0.0,
    "backpressure_pid_min_rate": 100.0,
    "graceful_stop_timeout_ms": 0,
    "concurrent_jobs": 1,
    "receiver_stop_timeout_s": 10.0,
    "max_message_bytes": 4 * 1024 * 1024,
    "receiver_drain_timeout_s": 120.0,
    "checkpoint_dir": "",
    "receiver_wal_rolling_interval_s": 60.0,
    "receiver_wal_max_failures": 3,
    "receiver_wal_close_file_after_write": False,
    "receiver_wal_fsync": True,
    "driver_wal_rolling_interval_s": 60.0,
    "driver_wal_max_failures": 3,
    "driver_wal_close_file_after_write": False,
    "driver_wal_fsync": True,
    "driver_wal_allow_batching": True,
    "driver_wal_batching_timeout_ms": 5000,
    "stop_gracefully_on_shutdown": False,
    "batch_read_partitions": 0,
}

_UNITS_MS = {"ms": 1, "s": 1000, "sec": 1000, "m": 60_000, "min": 60_000, "h": 3_600_000}
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([a-z]*)\s*$")


def _parse_duration(spark_key: str, raw: str, default_unit: str, out_unit: str) -> float:
    m = _DURATION.match(raw.lower())
    if not m or (m.group(2) and m.group(2) not in _UNITS_MS):
        msg = f"{spark_key} must be a duration such as 200ms or 2s, got {raw!r}"
        raise ConfigError(msg)
    unit = m.group(2) or default_unit
    return float(m.group(1)) * _UNITS_MS[unit] / _UNITS_MS[out_unit]


def _parse_spark_value(name: str, spark_key: str, raw: str) -> Any:
    default = _DEFAULTS[name]
    if isinstance(default, str):
        return raw.strip()
    if name.endswith("_ms"):
        return int(_parse_duration(spark_key, raw, "ms", "ms"))
    if name.endswith("_s"):
        return _parse_duration(spark_key, raw, "s", "s")
    if isinstance(default, bool):
        if raw.strip().lower() in ("true", "false"):
            return raw.strip().lower() == "true"
        msg = f"{spark_key} must be true or false, got {raw!r}"
        raise ConfigError(msg)
    try:
        return type(default)(float(raw)) if isinstance(default, int) else float(raw)
    except ValueError:
        msg = f"{spark_key} must be a number, got {raw!r}"
        raise ConfigError(msg) from None


def _describe(cfg: StreamingConfig, name: str) -> str:
    return f"{name} ({StreamingConfig.spark_key(name)})"


def _number(cfg: StreamingConfig, name: str) -> float:
    value = getattr(cfg, name)
    if isinstance(value, bool) or not isinstance(value, int | float) or value != value:
        msg = f"{_describe(cfg, name)} must be a number, got {value!r}"
        raise ConfigError(msg)
    return float(value)


def _positive_int(cfg: StreamingConfig, name: str) -> None:
    value = getattr(cfg, name)
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        msg = f"{_describe(cfg, name)} must be an integer > 0, got {value!r}"
        raise ConfigError(msg)


def _positive(cfg: StreamingConfig, name: str) -> None:
    if _number(cfg, name) <= 0:
        msg = f"{_describe(cfg, name)} must be > 0, got {getattr(cfg, name)!r}"
        raise ConfigError(msg)


def _non_negative(cfg: StreamingConfig, name: str, *, integral: bool = False) -> None:
    value = _number(cfg, name)
    if value < 0 or (integral and not isinstance(getattr(cfg, name), int)):
        kind = "an integer >= 0" if integral else ">= 0"
        msg = f"{_describe(cfg, name)} must be {kind}, got {getattr(cfg, name)!r}"
        raise ConfigError(msg)


def _bool(cfg: StreamingConfig, name: str) -> None:
    if not isinstance(getattr(cfg, name), bool):
        msg = f"{_describe(cfg, name)} must be True or False, got {getattr(cfg, name)!r}"
        raise ConfigError(msg)
