"""What start() settles before anything runs: memory budget, TLS files, the package zip."""

from __future__ import annotations

import zipfile

import pytest

import spark_receivers
from spark_receivers.config import LOCAL_BLOCK_STORE_MEMORY, StreamingConfig
from spark_receivers.driver import deployment
from spark_receivers.driver.deployment import derived_block_store_memory, package_zip
from spark_receivers.errors import ConfigError
from spark_receivers.spark.executor_probe import probe

MiB = 1 << 20


@pytest.mark.parametrize(
    ("conf", "budget"),
    [
        ({}, 192 * MiB),  # 1g executors: overhead max(384m, 10%) = 384m, half of it
        ({"spark.executor.memory": "8g"}, 8192 * MiB // 10 // 2),
        (
            {"spark.executor.memory": "8g", "spark.executor.memoryOverheadFactor": "0.2"},
            8192 * MiB // 5 // 2,
        ),
        ({"spark.executor.memoryOverhead": "2g"}, 1024 * MiB),
        ({"spark.executor.memoryOverhead": "1000"}, 500 * MiB),  # bare numbers are MiB
        (
            {"spark.executor.pyspark.memory": "3g", "spark.executor.memoryOverhead": "1g"},
            1536 * MiB,
        ),
        ({"spark.executor.pyspark.memory": "40m"}, 32 * MiB),  # never below 32 MiB
    ],
)
def test_the_block_budget_is_half_the_python_memory_of_an_executor(conf, budget):
    assert derived_block_store_memory(conf) == budget


def test_a_bad_memory_setting_names_its_key():
    with pytest.raises(ConfigError, match=r"spark\.executor\.memory"):
        derived_block_store_memory({"spark.executor.memory": "lots"})


def test_the_block_budget_key_takes_spark_sizes():
    cfg = StreamingConfig.from_spark_conf({"spark.receivers.receiver.blockStoreMemory": "256m"})
    assert cfg.block_store_memory_bytes == cfg.block_store_budget_bytes == 256 * MiB
    assert StreamingConfig().block_store_budget_bytes == LOCAL_BLOCK_STORE_MEMORY
    with pytest.raises(
        ConfigError, match=r"spark.receivers.receiver.blockStoreMemory must be a size"
    ):
        StreamingConfig.from_spark_conf({"spark.receivers.receiver.blockStoreMemory": "big"})


def test_tls_needs_its_three_files_named_and_readable(tmp_path):
    with pytest.raises(ConfigError, match=r"spark.receivers.rpc.tls.certFile\) must name a PEM"):
        StreamingConfig.from_spark_conf({"spark.receivers.rpc.tls.enabled": "true"})
    cert = tmp_path / "c.pem"
    cert.write_text("x")
    cfg = StreamingConfig(
        rpc_tls_enabled=True,
        rpc_tls_cert_file=str(cert),
        rpc_tls_key_file=str(tmp_path / "missing.key"),
        rpc_tls_ca_file=str(cert),
    )
    assert cfg.tls is not None and cfg.tls.ca_file == str(cert)
    with pytest.raises(ConfigError, match=r"spark.receivers.rpc.tls.keyFile=.*missing.key"):
        deployment._check_tls_files(cfg, "the driver")


def test_ship_package_modes():
    assert StreamingConfig().ship_package == "auto"
    with pytest.raises(ConfigError, match=r"spark.receivers.shipPackage\) must be one of auto"):
        StreamingConfig.from_spark_conf({"spark.receivers.shipPackage": "yes"})


def test_the_package_zip_holds_the_package_and_imports(tmp_path):
    path = package_zip(str(tmp_path))
    with zipfile.ZipFile(path) as z:
        names = z.namelist()
    assert "spark_receivers/__init__.py" in names
    assert "spark_receivers/driver/deployment.py" in names
    assert not [n for n in names if "__pycache__" in n]
    assert package_zip(str(tmp_path)) == path  # same contents, same name


def test_the_probe_reports_what_an_executor_lacks(tmp_path):
    settings = {
        "tls_files": {"spark.receivers.rpc.tls.caFile": str(tmp_path / "nope.pem")},
        "bind_host": "203.0.113.9",
        "ports": [0, 0],
        "driver": ["127.0.0.1", 1],
    }
    (report,) = list(probe(settings, iter([])))
    assert report["package_version"] == spark_receivers.__version__
    assert report["missing"] == []
    assert report["unreadable"] == {"spark.receivers.rpc.tls.caFile": str(tmp_path / "nope.pem")}
    assert "203.0.113.9" in report["bind_error"]
    assert report["driver_error"].startswith("127.0.0.1:1")
    with pytest.raises(ConfigError, match=r"cannot read on executor|cannot be read on executor"):
        deployment._check_reports(
            [{**report, "missing": [], "bind_error": None}], StreamingConfig()
        )
    with pytest.raises(ConfigError, match=r"spark.receivers.executor.bindAddress: block servers"):
        deployment._check_reports(
            [{**report, "unreadable": {}}], StreamingConfig(executor_bind_address="203.0.113.9")
        )
    with pytest.raises(ConfigError, match=r"cannot reach the driver.*spark.receivers.driver.ports"):
        deployment._check_reports(
            [{**report, "unreadable": {}, "bind_error": None}], StreamingConfig()
        )


def test_the_package_message_says_exactly_what_to_pass():
    report = {
        "executor_id": "3",
        "host": "10.0.0.7",
        "python": "/usr/bin/python3",
        "package_origin": None,
        "package_version": None,
    }
    text = deployment._package_message([report], "9.9", shipped=False)
    assert text.startswith(
        "executor 3 (10.0.0.7, Python /usr/bin/python3) cannot import spark_receivers"
    )
    for needed in (
        "--py-files",
        "zip -qr",
        "--archives env.tar.gz#env",
        "spark.pyspark.python=./env/bin/python",
        "spark.receivers.shipPackage=auto",
        "a wheel in --py-files is not put on sys.path",
    ):
        assert needed in text


def test_a_task_spec_never_shows_its_secret():
    from spark_receivers.spark.receiver_task import ReceiverTaskSpec
    from spark_receivers.testing import SequenceReceiver

    spec = ReceiverTaskSpec(SequenceReceiver(["x"]), 0, "h:1", "s3cr3t-value", {}, "app")
    assert "s3cr3t-value" not in repr(spec) and "h:1" in repr(spec)
