"""Unchanged apps on a real Spark standalone cluster, submitted the way users submit them.

One Master and two Workers of the installed pyspark (tests/integration/standalone.py,
started once per session); each app is ``spark-submit --master spark://...``
(or the ``spark-receivers`` CLI) in a process of its own, printing one
``RESULT {json}`` line. Executors run a Python **without** spark_receivers
(tests/integration/envs.py) unless the test says otherwise, and get the package
as users give it: ``--py-files spark_receivers.zip``, ``--archives env.tar.gz#env``,
or shipped by ``start()`` itself. Each test prints a ``CLUSTER`` line with what it
saw (which executors held the receivers; sent/acked/delivered/lost).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from envs import bare_env, package_zip, packed_env
from standalone import StandaloneCluster, spark_home

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "receivers"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "rpc"))
from service_fixtures import redis_url  # noqa: F401
from test_tls import make_cert

pytestmark = [pytest.mark.spark, pytest.mark.timeout(600)]

APPS = Path(__file__).with_name("apps")
TOKEN = re.compile(r"\b\d{13}\.[0-9a-f]{24}\.[0-9a-f]{64}\b")


def cluster_conf(cluster: StandaloneCluster, *, bare_executors: bool = False) -> list[str]:
    conf = {
        "spark.executor.cores": "2",
        "spark.executor.instances": "2",
        "spark.cores.max": "4",
        "spark.executor.memory": "768m",
        "spark.driver.memory": "768m",
        "spark.driver.host": "127.0.0.1",
        "spark.driver.bindAddress": "127.0.0.1",
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        "spark.sql.shuffle.partitions": "4",
    }
    if bare_executors:
        # The tests run every JVM with our worker daemon (tests/conftest.py); executors whose
        # Python lacks spark_receivers cannot run it (docs/deploy.md): Spark's own daemon.
        conf["spark.python.daemon.module"] = "pyspark.daemon"
    return [x for k, v in conf.items() for x in ("--conf", f"{k}={v}")]


def submit_env(cluster: StandaloneCluster, executor_python: str | None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SPARK_", "PYSPARK_"))}
    env.update(
        SPARK_HOME=str(spark_home()),
        SPARK_CONF_DIR=str(cluster.root / "conf"),
        SPARK_LOCAL_IP="127.0.0.1",
        PYSPARK_DRIVER_PYTHON=sys.executable,
        PYSPARK_PYTHON=executor_python or sys.executable,
    )
    return env


def run_app(
    cluster: StandaloneCluster,
    args: list[str],
    executor_python: str | None,
    timeout: float = 300,
) -> tuple[dict, str]:
    """Run ``spark-submit ...args`` against the cluster; its RESULT and its output."""
    submit = [str(spark_home() / "bin" / "spark-submit"), "--master", cluster.master_url]
    bare = executor_python is not None and executor_python != sys.executable
    cmd = [*submit, *cluster_conf(cluster, bare_executors=bare), *args]
    proc = subprocess.run(
        cmd,
        capture_output=True,
        text=True,
        timeout=timeout,
        env=submit_env(cluster, executor_python),
        cwd=cluster.root,
        start_new_session=True,
    )
    output = proc.stdout + "\n" + proc.stderr
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, (
        f"{cmd[:3]} failed ({proc.returncode}):\n{proc.stdout[-4000:]}\n{proc.stderr[-6000:]}"
        f"\n{cluster.tails(15)}"
    )
    return json.loads(lines[-1].removeprefix("RESULT ")), output


def report(name: str, result: dict) -> None:
    """Print what a scenario saw (pytest -s); append it to $SPARK_RECEIVERS_CLUSTER_REPORT."""
    line = f"CLUSTER {name}: {json.dumps(result, default=str)}"
    print("\n" + line, flush=True)
    path = os.environ.get("SPARK_RECEIVERS_CLUSTER_REPORT")
    if path:
        with open(path, "a") as f:
            f.write(line + "\n")


def assert_two_receivers_exactly_once(result: dict) -> None:
    placed = result["receivers"]
    assert set(placed) == {"0", "1"}, result
    assert placed["0"]["executor"] != placed["1"]["executor"], result
    # Each block server advertises the host Spark knows its executor by.
    assert {placed["0"]["host"], placed["1"]["host"]} == {"127.0.0.2", "127.0.0.3"}, result
    for p in placed.values():
        assert p["endpoint"].startswith(p["host"] + ":"), result
    assert result["sent"] == result["delivered"] > 0, result
    assert result["lost"] == result["duplicated"] == result["unexpected"] == 0, result
    assert result["status_records"] == result["sent"], result


def test_custom_receivers_with_py_files_on_executors_without_the_package(standalone, tmp_path):
    """--py-files spark_receivers.zip; the executors' Python has only pyarrow and pandas."""
    bare = str(bare_env())
    zip_path = package_zip(tmp_path)
    result, _ = run_app(
        standalone,
        ["--py-files", str(zip_path), str(APPS / "counting_app.py"), "--records", "2000"],
        bare,
    )
    report("py-files (custom receiver x2)", result)
    assert_two_receivers_exactly_once(result)


@pytest.fixture(scope="module")
def shipped(standalone, tmp_path_factory) -> tuple[dict, str, list[str]]:
    """One bare-executor app: a context of shipPackage=check fails to start, then one of the
    default (auto) ships the package itself, mutual TLS on. Its RESULT, output and secrets."""
    tmp_path = tmp_path_factory.mktemp("shipped")
    bare = str(bare_env())
    cert, key = make_cert(tmp_path, "cluster")
    secret_file = tmp_path / "secret"
    tls = {
        "spark.receivers.rpc.tls.enabled": "true",
        "spark.receivers.rpc.tls.certFile": cert,
        "spark.receivers.rpc.tls.keyFile": key,
        "spark.receivers.rpc.tls.caFile": cert,
        "spark.receivers.rpc.tls.clientAuth": "true",
        "spark.executorEnv.SPARK_RECEIVERS_LOG_LEVEL": "DEBUG",
    }
    conf = [x for k, v in tls.items() for x in ("--conf", f"{k}={v}")]
    args = [*conf, str(APPS / "counting_app.py"), "--records", "2000", "--check-first"]
    result, output = run_app(standalone, [*args, "--secret-file", str(secret_file)], bare)
    report("shipPackage=check, then auto-shipped + mutual TLS (custom receiver x2)", result)
    return result, output, secret_file.read_text().split()


def test_start_ships_the_package_itself_and_tls_keeps_the_secret_out_of_logs(standalone, shipped):
    """No --py-files: start() ships its own zip. Mutual TLS on (every endpoint asks every
    client for its certificate: tracker, block servers, keepers, readers); no context's
    secret is in any log."""
    result, output, secrets = shipped
    assert "start_error" not in result, result
    assert_two_receivers_exactly_once(result)
    assert "shipped spark_receivers-" in output  # the driver's one log line about it
    assert len(secrets) == 2 and all(len(secret) == 64 for secret in secrets), secrets
    logs = output + "\n" + standalone.logs()
    assert "spark_receivers" in logs
    assert not [secret for secret in secrets if secret in logs]
    assert not TOKEN.findall(logs)


def test_start_fails_naming_what_to_pass_when_shipping_is_off(shipped):
    """Executors without the package and shipPackage=check: start() refuses, and says how."""
    result, _, _ = shipped
    error = result["check_error"]
    assert error is not None, result
    assert error.startswith("ConfigError: executor "), error
    assert "cannot import spark_receivers" in error
    assert "--py-files" in error and "--archives env.tar.gz#env" in error


def test_structured_query_with_a_venv_pack_archive(standalone):
    """--archives env.tar.gz#env with spark.pyspark.python=./env/bin/python (venv-pack)."""
    archive = packed_env()
    # Client mode: the driver plans Python data sources with ./env/bin/python too, so the
    # archive is unpacked in its working directory as docs/deploy.md says.
    env_dir = standalone.root / "env"
    if not (env_dir / "bin" / "python").exists():
        env_dir.mkdir(exist_ok=True)
        subprocess.run(["tar", "-xzf", str(archive), "-C", str(env_dir)], check=True, timeout=300)
    result, _ = run_app(
        standalone,
        [
            "--archives",
            f"{archive}#env",
            "--conf",
            "spark.pyspark.python=./env/bin/python",
            "--conf",  # client mode: the driver's own Python (spark.pyspark.python wins otherwise)
            f"spark.pyspark.driver.python={sys.executable}",
            str(APPS / "structured_app.py"),
            "--records",
            "4000",
        ],
        None,
    )
    report("archives (structured query)", result)
    assert result["receiver"]["host"] in ("127.0.0.2", "127.0.0.3"), result
    assert result["query_exception"] is None, result
    assert result["sent"] == result["delivered"] > 0, result
    assert result["lost"] == result["duplicated"] == 0, result


def test_demo_word_count_on_the_cluster(standalone):
    """`spark-receivers demo --master spark://...`: every line exactly once."""
    bare = str(bare_env())
    cli = str(Path(sys.executable).with_name("spark-receivers"))
    conf = cluster_conf(standalone, bare_executors=True)
    cmd = [cli, "demo", "--master", standalone.master_url, *conf, "--no-ui"]
    cmd += ["--seconds", "4", "--rate", "500", "--json"]
    proc = subprocess.run(
        cmd,
        capture_output=True,
        text=True,
        timeout=300,
        env=submit_env(standalone, bare),
        cwd=standalone.root,
        start_new_session=True,
    )
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    assert lines, f"no summary ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}"
    summary = json.loads(lines[-1])
    report("demo word count", summary)
    assert summary["ok"], summary
    assert summary["records_sent"] == summary["records_processed"] > 0
    assert proc.returncode == 0


def test_kill_9_of_an_executor_loses_no_acknowledged_record(standalone, tmp_path, redis_url):  # noqa: F811
    """Both WALs on, a Redis stream source; the receiver's executor JVM gets SIGKILL."""
    checkpoint = tmp_path / "checkpoint"
    result, _ = run_app(
        standalone,
        [
            str(APPS / "redis_kill_app.py"),
            "--redis-url",
            redis_url,
            "--checkpoint",
            str(checkpoint),
            "--records",
            "1500",
            "--rate",
            "300",
        ],
        None,
        timeout=420,
    )
    report("kill -9 executor (redis, both WALs)", result)
    assert result["killed"]["pid"] is not None, result
    assert result["moved"], result
    assert result["after"]["executor"] != result["before"]["executor"], result
    assert result["all_acked"] and result["pending"] == 0, result
    assert result["acked"] == result["sent"] == 1500, result
    assert result["lost"] == 0, result
    assert result["delivered"] == result["sent"], result
    assert result["failure"] is None, result
    shutil.rmtree(checkpoint, ignore_errors=True)
