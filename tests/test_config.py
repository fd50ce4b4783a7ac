"""StreamingConfig: defaults, Spark keys, and errors that name the key and the value."""

from __future__ import annotations

import pytest

from spark_receivers.config import StreamingConfig
from spark_receivers.errors import ConfigError


def test_defaults_follow_spark():
    cfg = StreamingConfig()
    assert cfg.block_interval_ms == 200
    assert cfg.block_queue_size == 10
    assert cfg.max_rate_or_none is None
    assert cfg.receiver_restart_delay_ms == 2000
    assert cfg.receiver_wal_enabled is False
    assert cfg.block_store_timeout_s == 30.0
    assert cfg.backpressure_enabled is False
    assert cfg.concurrent_jobs == 1
    assert (cfg.backpressure_rate_estimator, cfg.backpressure_pid_min_rate) == ("pid", 100.0)
    assert cfg.backpressure_pid_proportional == 1.0
    assert (cfg.backpressure_pid_integral, cfg.backpressure_pid_derived) == (0.2, 0.0)


def test_read_from_spark_conf_with_units():
    cfg = StreamingConfig.from_spark_conf(
        {
            "spark.streaming.blockInterval": "100ms",
            "spark.streaming.receiver.maxRate": "5000",
            "spark.streaming.receiverRestartDelay": "1s",
            "spark.streaming.receiver.writeAheadLog.enable": "true",
            "spark.streaming.receiver.blockStoreTimeout": "45",
        },
        block_queue_size=3,
    )
    assert cfg.block_interval_ms == 100
    assert cfg.receiver_max_rate == 5000
    assert cfg.receiver_restart_delay_ms == 1000
    assert cfg.receiver_wal_enabled is True
    assert cfg.block_store_timeout_s == 45.0
    assert cfg.block_queue_size == 3


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (
            {"block_interval_ms": -5},
            r"block_interval_ms \(spark.streaming.blockInterval\) must be an integer > 0, got -5",
        ),
        ({"block_queue_size": 0}, "block_queue_size"),
        ({"receiver_max_rate": -1}, "receiver_max_rate"),
        ({"receiver_wal_enabled": "yes"}, "must be True or False, got 'yes'"),
        ({"concurrent_jobs": 1.5}, "concurrent_jobs"),
        ({"no_such_key": 1}, "unknown StreamingConfig key"),
        (
            {"backpressure_rate_estimator": "pi"},
            r"spark.streaming.backpressure.rateEstimator\) must be one of pid; got 'pi'",
        ),
        (
            {"backpressure_pid_integral": -0.1},
            r"backpressure_pid_integral \(spark.streaming.backpressure.pid.integral\) "
            r"must be >= 0, got -0.1",
        ),
        ({"backpressure_pid_min_rate": 0}, "spark.streaming.backpressure.pid.minRate"),
        (
            {"batch_read_partitions": -1},
            r"batch_read_partitions \(spark.receivers.batch.readPartitions\) must be an "
            r"integer >= 0, got -1",
        ),
        ({"ui_port": 70_000}, r"ui_port \(spark.receivers.ui.port\) must be a port 0-65535"),
        ({"ui_host": 7}, r"ui_host \(spark.receivers.ui.host\) must be a host string"),
        ({"metrics_report_interval_ms": 0}, "spark.receivers.metrics.reportInterval"),
        ({"ui_retained_batches": 0}, "spark.streaming.ui.retainedBatches"),
    ],
)
def test_bad_values_name_key_and_value(kwargs, message):
    with pytest.raises(ConfigError, match=message):
        StreamingConfig(**kwargs)


def test_bad_spark_conf_value_names_the_spark_key():
    with pytest.raises(
        ConfigError, match=r"spark.streaming.blockInterval must be a duration.*'fast'"
    ):
        StreamingConfig.from_spark_conf({"spark.streaming.blockInterval": "fast"})


def test_explicit_fields_are_remembered_and_laid_over_a_conf():
    cfg = StreamingConfig(block_queue_size=3)
    assert cfg.explicit == {"block_queue_size"}
    merged = cfg.over(
        {"spark.streaming.blockInterval": "50ms", "spark.streaming.blockQueueSize": "7"}
    )
    assert (merged.block_interval_ms, merged.block_queue_size) == (50, 3)
    assert merged.replace(concurrent_jobs=2).explicit == {"block_queue_size", "concurrent_jobs"}


def test_the_signature_is_typed():
    import inspect

    params = inspect.signature(StreamingConfig).parameters
    assert params["block_interval_ms"].annotation in (int, "int")
    assert params["block_interval_ms"].default == 200
    assert params["block_interval_ms"].kind is inspect.Parameter.KEYWORD_ONLY


def test_old_keys_of_ours_are_read_with_a_deprecation_warning():
    with pytest.warns(DeprecationWarning, match="spark.streaming.checkpointDir is deprecated"):
        cfg = StreamingConfig.from_spark_conf({"spark.streaming.checkpointDir": "/ck"})
    assert cfg.checkpoint_dir == "/ck"
    new = StreamingConfig.from_spark_conf(
        {"spark.receivers.checkpointDir": "/new", "spark.streaming.checkpointDir": "/old"}
    )
    assert new.checkpoint_dir == "/new"


class _Session:
    """What spark_conf_of reads of a SparkSession: the static conf and the runtime conf."""

    def __init__(self, static: dict[str, str], runtime: dict[str, str]) -> None:
        self.sparkContext = self
        self._static, self.conf = static, self
        self._runtime = runtime

    def getConf(self):
        return self

    def getAll(self):
        return list(self._static.items())

    def get(self, key, default=None):
        return self._runtime.get(key, default)


def test_runtime_values_win_over_static_ones_and_static_ones_fill_the_rest():
    from spark_receivers.config import spark_conf_of

    static = {
        "spark.master": "local[2]",
        "spark.streaming.blockInterval": "100ms",
        "spark.streaming.receiver.maxRate": "10",
    }
    runtime = {"spark.streaming.blockInterval": "50ms", "spark.receivers.checkpointDir": "/ck"}
    conf = spark_conf_of(_Session(static, runtime))
    assert conf["spark.streaming.blockInterval"] == "50ms"  # runtime over static
    assert conf["spark.streaming.receiver.maxRate"] == "10"  # static where runtime has none
    assert conf["spark.receivers.checkpointDir"] == "/ck"  # runtime only
    cfg = StreamingConfig(receiver_max_rate=99).over(conf)  # and config= over both
    assert (cfg.block_interval_ms, cfg.receiver_max_rate, cfg.checkpoint_dir) == (50, 99, "/ck")


@pytest.mark.spark
def test_a_context_merges_config_over_the_static_and_runtime_conf(spark):
    from spark_receivers import StreamingContext

    spark.conf.set("spark.streaming.blockInterval", "50ms")
    spark.conf.set("spark.streaming.receiver.maxRate", "1234")
    try:
        ssc = StreamingContext(spark, 1000, config=StreamingConfig(receiver_max_rate=99))
        assert ssc.config.block_interval_ms == 50  # runtime spark.conf.set is read
        assert ssc.config.receiver_max_rate == 99  # the explicit field wins
        plain = StreamingContext(spark, 1000)
        assert (plain.config.block_interval_ms, plain.config.receiver_max_rate) == (50, 1234)
    finally:
        spark.conf.unset("spark.streaming.blockInterval")
        spark.conf.unset("spark.streaming.receiver.maxRate")
