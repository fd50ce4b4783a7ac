"""Every configuration key of spark-receivers, its default, its unit and its check.

:class:`StreamingConfig` is a frozen dataclass with a typed field per key, validated
at construction: a bad value raises :class:`~spark_receivers.errors.ConfigError`
naming the field, its Spark key, the value and what is allowed. Keys Spark
Streaming also has keep Spark's names (``spark.streaming.blockInterval``,
``spark.streaming.receiver.maxRate``, ...); keys of our own live under
``spark.receivers.*`` (the names we used before under ``spark.streaming.*`` are
still read, with a deprecation warning).

Where a context's configuration comes from, last one wins:

1. the defaults below (Spark Streaming's);
2. the Spark conf the application started with (``spark-submit --conf``,
   ``SparkSession.builder.config``);
3. values set at runtime with ``spark.conf.set(...)`` (all a notebook user has);
4. the fields set explicitly in ``StreamingContext(..., config=StreamingConfig(...))``.

Example::

    cfg = StreamingConfig(block_interval_ms=100, receiver_max_rate=50_000)
    ssc = StreamingContext(spark, batch_interval_ms=1000, config=cfg)
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from spark_receivers.config_checks import RATE_ESTIMATORS, parse, validate
from spark_receivers.config_deploy import LOCAL_BLOCK_STORE_MEMORY, DeploymentKeys, key
from spark_receivers.errors import ConfigError
from spark_receivers.receiver.bad_records import DEFAULT_MAX_RECORD_BYTES
from spark_receivers.rpc.tls import TlsConfig

log = logging.getLogger(__name__)

UNLIMITED_RATE = 0
"""``receiver_max_rate`` value meaning "no limit" (Spark uses Long.MaxValue)."""


@dataclass(frozen=True, kw_only=True)
class StreamingConfig(DeploymentKeys):
    """Typed, validated configuration of a :class:`StreamingContext` (see the module doc).

    Durations carry their unit in the name. Defaults follow Spark Streaming's.
    """

    block_interval_ms: int = key(
        200, "spark.streaming.blockInterval", "How often received records are cut into a block."
    )
    block_queue_size: int = key(
        10, "spark.streaming.blockQueueSize", "Blocks waiting to be pushed before store() blocks."
    )
    receiver_max_rate: float = key(
        UNLIMITED_RATE,
        "spark.streaming.receiver.maxRate",
        "Records/s per receiver; 0 means unlimited.",
    )
    receiver_restart_delay_ms: int = key(
        2000, "spark.streaming.receiverRestartDelay", "Delay before a restarted receiver starts."
    )
    receiver_wal_enabled: bool = key(
        False, "spark.streaming.receiver.writeAheadLog.enable", "Write every block to a WAL first."
    )
    block_store_timeout_s: float = key(
        30.0, "spark.streaming.receiver.blockStoreTimeout", "Max wait to store a block (+ WAL)."
    )
    backpressure_enabled: bool = key(
        False, "spark.streaming.backpressure.enabled", "Adapt receiver rates to processing speed."
    )
    backpressure_initial_rate: float = key(
        0.0, "spark.streaming.backpressure.initialRate", "First rate with backpressure; 0 = max."
    )
    backpressure_rate_estimator: str = key(
        "pid", "spark.streaming.backpressure.rateEstimator", "Rate estimator: pid."
    )
    backpressure_pid_proportional: float = key(
        1.0, "spark.streaming.backpressure.pid.proportional", "PID gain on the error (>= 0)."
    )
    backpressure_pid_integral: float = key(
        0.2, "spark.streaming.backpressure.pid.integral", "PID gain on the summed error (>= 0)."
    )
    backpressure_pid_derived: float = key(
        0.0, "spark.streaming.backpressure.pid.derived", "PID gain on the error's change (>= 0)."
    )
    backpressure_pid_min_rate: float = key(
        100.0, "spark.streaming.backpressure.pid.minRate", "Lowest rate the estimator sets (> 0)."
    )
    graceful_stop_timeout_ms: int = key(
        0, "spark.streaming.gracefulStopTimeout", "Max graceful stop time; 0 = 10 intervals."
    )
    concurrent_jobs: int = key(
        1, "spark.streaming.concurrentJobs", "Batches processed at the same time."
    )
    stop_gracefully_on_shutdown: bool = key(
        False,
        "spark.streaming.stopGracefullyOnShutdown",
        "On SIGTERM, stop the StreamingContext gracefully (received == processed).",
    )
    receiver_wal_rolling_interval_s: float = key(
        60.0,
        "spark.streaming.receiver.writeAheadLog.rollingIntervalSecs",
        "Time span of one receiver WAL segment file.",
    )
    receiver_wal_max_failures: int = key(
        3,
        "spark.streaming.receiver.writeAheadLog.maxFailures",
        "Attempts (each on a fresh segment) before a receiver WAL write fails.",
    )
    receiver_wal_close_file_after_write: bool = key(
        False,
        "spark.streaming.receiver.writeAheadLog.closeFileAfterWrite",
        "One object per record in the receiver WAL (needed on S3 and other object stores).",
    )
    receiver_wal_direct_io: bool = key(
        True,
        "spark.receivers.receiver.writeAheadLog.directIO",
        "Write the receiver WAL on a local disk with O_DIRECT, each block padded to 4 KiB: "
        "no page-cache copy (a filesystem without direct I/O is written buffered).",
    )
    driver_wal_rolling_interval_s: float = key(
        60.0,
        "spark.streaming.driver.writeAheadLog.rollingIntervalSecs",
        "Time span of one driver WAL segment file.",
    )
    driver_wal_max_failures: int = key(
        3,
        "spark.streaming.driver.writeAheadLog.maxFailures",
        "Attempts (each on a fresh segment) before a driver WAL write fails.",
    )
    driver_wal_close_file_after_write: bool = key(
        False,
        "spark.streaming.driver.writeAheadLog.closeFileAfterWrite",
        "One object per record in the driver WAL (needed on S3 and other object stores).",
    )
    driver_wal_allow_batching: bool = key(
        True,
        "spark.streaming.driver.writeAheadLog.allowBatching",
        "Group concurrent driver WAL writes into one record (one fsync for many AddBlocks).",
    )
    driver_wal_batching_timeout_ms: int = key(
        5000,
        "spark.streaming.driver.writeAheadLog.batchingTimeout",
        "Max wait of one driver WAL write when batching.",
    )
    # --- keys of our own: spark.receivers.* ------------------------------------------
    checkpoint_dir: str = key(
        "",
        "spark.receivers.checkpointDir",
        "Checkpoint directory (path or URI); '' = none. Set by StreamingContext(checkpoint_dir=).",
        old="spark.streaming.checkpointDir",
    )
    receiver_max_record_bytes: int = key(
        DEFAULT_MAX_RECORD_BYTES,
        "spark.receivers.receiver.maxRecordBytes",
        "The longest record a built-in receiver takes (512k, 1m, at most 64m); a longer one "
        "is a bad record (its receiver's bad_record_policy), and no block carries one: a "
        "row that large could kill the executor's JVM. A receiver's max_record_bytes wins.",
    )
    job_id: str = key(
        "",
        "spark.receivers.jobId",
        "The job's id in durable source names (MQTT client ids, Redis consumers): the same "
        "for every restart of one job, different for every other job (letters, digits, '-', "
        "'_', '.'); '' = a random id written once into the checkpoint directory, else the "
        "Spark application id.",
    )
    receiver_stop_timeout_s: float = key(
        10.0,
        "spark.receivers.receiver.stopTimeout",
        "After a stop, how long a receiver's job may take to end before it is cancelled.",
        old="spark.streaming.receiver.stopTimeout",
    )
    receiver_start_timeout_s: float = key(
        60.0,
        "spark.receivers.receiver.startTimeout",
        "How long a receiver may take to start, from its job's launch to its registration: "
        "after a restart from a checkpoint the batches to redo wait up to this for the "
        "receivers to start (or fail), and a graceful stop waits up to this for receivers "
        "still starting; 0 = neither waits.",
    )
    receiver_drain_timeout_s: float = key(
        120.0,
        "spark.receivers.receiver.drainTimeout",
        "After a receiver stops, how long its task serves blocks batches have not read.",
        old="spark.streaming.receiver.drainTimeout",
    )
    max_message_bytes: int = key(
        4 * 1024 * 1024,
        "spark.receivers.rpc.maxMessageBytes",
        "Largest control message accepted (bytes).",
        old="spark.streaming.rpc.maxMessageBytes",
    )
    receiver_wal_fsync: bool = key(
        True,
        "spark.receivers.receiver.writeAheadLog.fsync",
        "fdatasync every receiver WAL record on a local filesystem before acknowledging it.",
        old="spark.streaming.receiver.writeAheadLog.fsync",
    )
    driver_wal_fsync: bool = key(
        True,
        "spark.receivers.driver.writeAheadLog.fsync",
        "fdatasync every driver WAL record on a local filesystem before acknowledging it.",
        old="spark.streaming.driver.writeAheadLog.fsync",
    )
    batch_read_partitions: int = key(
        0,
        "spark.receivers.batch.readPartitions",
        "Read tasks per stream and batch; 0 = one per 250,000 rows of the batch, at most one "
        "wave of the task slots receivers leave free.",
        old="spark.streaming.batch.readPartitions",
    )
    # --- batches as users write them (issue 20) ---
    batch_cache: bool = key(
        True,
        "spark.receivers.batch.cache",
        "Keep a batch's rows (uncompressed) on the executors that read them, from the first "
        "action to the end of the batch, so further actions read no block again, when the "
        "stream's previous batch was read three times or more (decided per batch; two reads "
        "of the blocks cost less than building the cache; the first batch of a stream is not "
        "cached); false: no batch is cached, every action reads the blocks again (decisions "
        "0008, 0011, 0013, 0023).",
    )
    batch_parquet_spool: bool = key(
        False,
        "spark.receivers.batch.parquetSpool",
        "In local mode (a classic session), receivers write each block's spool file as "
        "Parquet and a batch reads those blocks with Spark's own Parquet reader, with no "
        "Python read task: cheaper for a line count, dearer for a word count (decision "
        "0026). Ignored on a cluster, on Spark Connect, with blockKeeper.spool off and for "
        "a schema Spark would not read back as it is; false: Arrow files read by Python "
        "read tasks (mapInArrow).",
    )
    warm_up_timeout_s: float = key(
        60.0,
        "spark.receivers.warmUp.timeout",
        "How long start() may spend paying the batch path's one-time costs before the first "
        "batch; 0 = no warm-up.",
    )
    receiver_max_restarts: int = key(
        20,
        "spark.receivers.receiver.maxRestarts",
        "Restarts of one receiver within restartWindow before the context fails with the "
        "cause; -1 = no limit (Spark's behaviour).",
    )
    receiver_restart_window_s: float = key(
        600.0,
        "spark.receivers.receiver.restartWindow",
        "The window in which maxRestarts restarts of one receiver fail the context.",
    )
    # --- testing aids (off by default)
    fault_plan: str = key(
        "",
        "spark.receivers.testing.faultPlan",
        "Testing aid: path of a fault-plan file (JSON) whose windows cut receivers off from "
        "the driver or fail their WAL's fsync with ENOSPC/EIO (docs/testing.md); '' = off.",
    )

    def __post_init__(self) -> None:
        validate(self)

    @property
    def block_store_budget_bytes(self) -> int:
        """``block_store_memory_bytes``, or :data:`LOCAL_BLOCK_STORE_MEMORY` when it is 0."""
        return self.block_store_memory_bytes or LOCAL_BLOCK_STORE_MEMORY

    @property
    def tls(self) -> TlsConfig | None:
        """The TLS settings of every endpoint and client (None when TLS is off)."""
        if not self.rpc_tls_enabled:
            return None
        return TlsConfig(
            self.rpc_tls_cert_file,
            self.rpc_tls_key_file,
            self.rpc_tls_ca_file,
            self.rpc_tls_server_name or None,
            self.rpc_tls_client_auth,
        )

    # --- building --------------------------------------------------------------

    @property
    def explicit(self) -> frozenset[str]:
        """The fields given explicitly at construction (they win over the Spark conf)."""
        return self.__dict__.get("_explicit", frozenset())

    def replace(self, **changes: Any) -> StreamingConfig:
        """A copy with ``changes`` applied, validated; the changed fields count as explicit."""
        new = StreamingConfig(**{**self.as_dict(), **changes})
        return _with_explicit(new, self.explicit | frozenset(changes))

    def over(self, conf: Mapping[str, str]) -> StreamingConfig:
        """The explicit fields of this config laid over ``conf``: what a context uses."""
        return StreamingConfig.from_spark_conf(
            conf, **{name: getattr(self, name) for name in self.explicit}
        )

    def as_dict(self) -> dict[str, Any]:
        """The configuration as a plain dict (JSON-friendly)."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}

    @property
    def max_rate_or_none(self) -> float | None:
        """``receiver_max_rate`` as a number, or None when unlimited."""
        return None if self.receiver_max_rate == UNLIMITED_RATE else float(self.receiver_max_rate)

    @classmethod
    def from_spark_conf(cls, conf: Mapping[str, str], **overrides: Any) -> StreamingConfig:
        """A config from Spark conf entries, then ``overrides`` (which count as explicit).

        Durations accept Spark's suffixes (``200ms``, ``2s``, ``1min``); an old key
        of ours is read with a deprecation warning when its new key is not set.
        """
        values: dict[str, Any] = {}
        for f in dataclasses.fields(cls):
            key, old = f.metadata["spark_key"], f.metadata["old_key"]
            if key in conf:
                values[f.name] = parse(f, key, conf[key])
            elif old is not None and old in conf:
                message = f"the Spark conf key {old} is deprecated: use {key}"
                warnings.warn(message, DeprecationWarning, stacklevel=2)
                log.warning("%s", message)
                values[f.name] = parse(f, old, conf[old])
        config = cls(**{**values, **overrides})
        return _with_explicit(config, frozenset(overrides))

    @staticmethod
    def spark_key(name: str) -> str:
        """The Spark conf key of a field."""
        for f in dataclasses.fields(StreamingConfig):
            if f.name == name:
                return str(f.metadata["spark_key"])
        msg = f"no StreamingConfig field named {name!r}"
        raise KeyError(msg)

    @staticmethod
    def spark_keys() -> list[str]:
        """Every Spark conf key a config reads, old names included."""
        out = []
        for f in dataclasses.fields(StreamingConfig):
            out.append(f.metadata["spark_key"])
            if f.metadata["old_key"]:
                out.append(f.metadata["old_key"])
        return out


def _with_explicit(config: StreamingConfig, explicit: frozenset[str]) -> StreamingConfig:
    object.__setattr__(config, "_explicit", explicit)
    return config


def _record_explicit(init: Any) -> Any:
    """Wrap the dataclass ``__init__`` so a config remembers which fields it was given."""

    @functools.wraps(init)
    def __init__(self: StreamingConfig, **kwargs: Any) -> None:
        unknown = sorted(set(kwargs) - {f.name for f in dataclasses.fields(StreamingConfig)})
        if unknown:
            allowed = ", ".join(f.name for f in dataclasses.fields(StreamingConfig))
            msg = f"unknown StreamingConfig key(s) {unknown}; allowed keys: {allowed}"
            raise ConfigError(msg)
        init(self, **kwargs)
        object.__setattr__(self, "_explicit", frozenset(kwargs))

    return __init__


StreamingConfig.__init__ = _record_explicit(StreamingConfig.__init__)  # type: ignore[method-assign]


def spark_conf_of(spark: Any) -> dict[str, str]:
    """The Spark conf a context reads: the static conf, then runtime ``spark.conf`` values.

    Runtime values (``spark.conf.set``) win over the static conf the application
    started with; only our keys are asked for. A Spark Connect session has no
    SparkContext: its session conf, which holds the static conf too, is read instead
    (``spark_receivers/spark/session_kind.py``).
    """
    if type(spark).__module__.startswith("pyspark.sql.connect"):
        conf = {str(k): str(v) for k, v in spark.conf.getAll.items()}
    else:
        conf = dict(spark.sparkContext.getConf().getAll())
    runtime = spark.conf
    for conf_key in StreamingConfig.spark_keys():
        try:
            value = runtime.get(conf_key, None)
        except Exception:  # a key the runtime conf cannot read: keep the static value
            log.debug("could not read %s from the runtime conf", conf_key, exc_info=True)
            continue
        if value is not None:
            conf[conf_key] = value
    return conf


__all__ = [
    "LOCAL_BLOCK_STORE_MEMORY",
    "RATE_ESTIMATORS",
    "UNLIMITED_RATE",
    "StreamingConfig",
    "spark_conf_of",
]
