"""Receivers through Spark Connect: a real Connect server, the driver's parts in this client.

The server is the installed pyspark's own (``SparkConnectServer`` started with its
``bin/spark-submit``, ``local[3]``), in a process of its own, stopped at the end. The
client (``pyspark.sql.connect``) runs in this pytest process: it starts no JVM here, so it
does not meet the classic session other files share (tests/conftest.py). It does set
``SPARK_CONNECT_MODE_ENABLED`` for the process (pyspark's functions then build Connect
columns), so the fixture restores the environment when the file is done: the classic
tests that a worker runs after this file see a classic process again.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from queries import start_query

from spark_receivers import GeneratorReceiver, LineSource, SocketTextReceiver, StreamingContext
from spark_receivers.cli.spark_session import spark_settings
from spark_receivers.driver.tracking.scheduling_policy import ExecutorCacheTaskLocation
from spark_receivers.errors import ConfigError
from spark_receivers.spark.session_kind import ConnectSide, spark_side
from spark_receivers.testing import SequenceReceiver

CONNECT_ENV = ("SPARK_CONNECT_MODE_ENABLED", "SPARK_REMOTE", "SPARK_LOCAL_REMOTE")
SERVER_CLASS = "org.apache.spark.sql.connect.service.SparkConnectServer"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait_until(predicate, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        threading.Event().wait(0.05)
    return predicate()


def start_connect_server(log: Path, master: str = "local[3]") -> tuple[subprocess.Popen, int]:
    """A Spark Connect server from the installed pyspark on a free loopback port."""
    import pyspark

    home = Path(pyspark.__file__).resolve().parent
    port = _free_port()
    cmd = [
        str(home / "bin" / "spark-submit"),
        "--class",
        SERVER_CLASS,
        "--master",
        master,
        "--name",
        "spark-receivers-connect-tests",
        "--conf",
        f"spark.connect.grpc.binding.port={port}",
        "--conf",
        "spark.connect.grpc.binding.address=127.0.0.1",
        "--conf",
        "spark.driver.bindAddress=127.0.0.1",
        "--conf",
        "spark.ui.enabled=false",
        "--conf",
        "spark.sql.shuffle.partitions=2",
        "--conf",
        f"spark.pyspark.python={sys.executable}",
    ]
    env = {**os.environ, "SPARK_HOME": str(home), "PYSPARK_PYTHON": sys.executable}
    for key in CONNECT_ENV:
        env.pop(key, None)
    out = log.open("wb")
    proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env)

    def listening() -> bool:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return True
        except OSError:
            return False

    if not _wait_until(lambda: listening() or proc.poll() is not None, 180) or not listening():
        proc.kill()
        proc.wait(10)
        raise AssertionError(f"the Connect server did not listen: {log.read_text()[-3000:]}")
    return proc, port


@pytest.fixture(scope="module")
def connect_server(tmp_path_factory):
    """The file's one Connect server: its ``sc://`` URL; stopped at the end."""
    log = tmp_path_factory.mktemp("connect") / "server.log"
    proc, port = start_connect_server(log)
    try:
        yield f"sc://127.0.0.1:{port}"
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


@pytest.fixture(scope="module")
def connect(connect_server):
    """The file's one Connect client session; the process's environment restored after."""
    saved = {key: os.environ.get(key) for key in CONNECT_ENV}
    try:
        from pyspark.sql.connect.session import SparkSession as RemoteSparkSession

        os.environ["SPARK_CONNECT_MODE_ENABLED"] = "1"  # what builder.remote() sets
        spark = RemoteSparkSession.builder.remote(connect_server).getOrCreate()
        try:
            yield spark
        finally:
            spark.stop()
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def test_the_session_is_seen_as_connect(connect):
    side = spark_side(connect)
    assert isinstance(side, ConnectSide)
    assert side.master == "local[3]"
    assert side.app_id.startswith("local-")
    assert side.default_parallelism() == 3
    assert [e for _, e in side.executors()] == ["driver"]


def test_a_task_placed_on_another_executor_is_refused_and_not_run(connect):
    side = spark_side(connect)
    elsewhere = ExecutorCacheTaskLocation("127.0.0.1", "7")  # no such executor

    def task(items):
        for item in items:
            yield item * 10

    assert side.run_located([(4, [elsewhere])], task, strict=True) == ([], [0])
    assert side.run_located([(4, [elsewhere])], task, strict=False) == ([40], [])
    here = ExecutorCacheTaskLocation("localhost", "driver")
    assert side.run_located([(4, [here]), (5, [])], task, strict=True) == ([40, 50], [])


def test_custom_and_socket_receivers_deliver_every_record_once(connect):
    records = [f"record-{i:05d}" for i in range(3_000)]
    with LineSource(rate=2_000) as source:
        ssc = StreamingContext(connect, batch_interval_ms=1000)
        custom = ssc.receiver_stream(SequenceReceiver(records, mode="mixed", chunk=100))
        lines = ssc.receiver_stream(SocketTextReceiver(source.host, source.port))
        lock = threading.Lock()
        seen: dict[str, list[str]] = {"custom": [], "socket": []}
        counted: dict[str, int] = {"custom": 0, "socket": 0}

        def collect(name):
            def run(df, batch_time_ms):
                n = df.count()  # two actions on one batch: a count, then the rows
                values = [r.value for r in df.collect()]
                assert n == len(values)
                with lock:
                    counted[name] += n
                    seen[name].extend(values)

            return run

        custom.foreach_batch(collect("custom"))
        lines.foreach_batch(collect("socket"))
        ssc.start()
        try:
            assert _wait_until(lambda: source.lines_sent >= 3_000, 90), "the socket got nothing"
            sent = source.finish()
            assert _wait_until(lambda: ssc.status().records_received >= sent + len(records), 90)
        finally:
            ssc.stop(graceful=True)
    assert ssc.status().state == "STOPPED"
    assert sorted(seen["custom"]) == records  # each record once, none in two batches
    numbers = sorted(int(v.split(" ", 1)[0]) for v in seen["socket"])
    assert numbers == list(range(sent))
    assert counted == {"custom": len(records), "socket": sent}
    ours = [t.name for t in threading.enumerate() if t.name.startswith("receiver-launcher")]
    assert ours == []


def test_the_demo_runs_through_connect(connect_server):
    """``spark-receivers demo --remote``: its own Connect client in a process of its own."""
    cli = Path(sys.executable).parent / "spark-receivers"
    env = {k: v for k, v in os.environ.items() if k not in CONNECT_ENV}
    done = subprocess.run(
        [
            *(str(cli), "demo", "--remote", connect_server, "--no-ui", "--json"),
            *("--seconds", "4s", "--rate", "2000"),  # a few batches show it
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=240,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    assert summary["ok"] is True
    assert summary["records_processed"] == summary["records_sent"] > 0


def test_remote_flags_are_checked_without_spark():
    settings = spark_settings("x", None, ["spark.receivers.batch.cache=false"], remote="sc://h:1")
    assert settings.remote == settings.master == "sc://h:1"
    assert settings.conf_dict["spark.receivers.batch.cache"] == "false"
    with pytest.raises(ConfigError, match="sc://HOST:PORT"):
        spark_settings("x", None, [], remote="h:15002")
    with pytest.raises(ConfigError, match="--master"):
        spark_settings("x", "spark://m:7077", [], remote="sc://h:1")


def test_a_structured_stream_reads_every_record_once_through_a_query_on_connect(connect):
    """The source's planner runs as a Python worker of the Connect server."""
    total = 600
    ssc = StreamingContext(connect, 1000)
    stream = ssc.structured_stream(GeneratorReceiver(rate=300, total=total))
    ssc.start()
    query = None
    try:
        writer = (
            stream.read_stream(max_records_per_trigger=250)
            .writeStream.format("memory")  # a table on the server that this session reads
            .queryName("connect_structured")
            .trigger(processingTime="500 milliseconds")
        )
        query = start_query(writer.start)
        table = "connect_structured"

        def counted() -> int:
            assert query.exception() is None, query.exception()
            return int(connect.sql(f"SELECT count(*) AS n FROM {table}").collect()[0].n)

        assert _wait_until(lambda: counted() >= total, 180), query.recentProgress[-3:]
        query.processAllAvailable()
        row = connect.sql(f"SELECT count(*) AS n, count(DISTINCT value) AS d FROM {table}")
        assert tuple(row.collect()[0]) == (total, total)  # every record, none twice
        assert max(p.numInputRows for p in query.recentProgress) <= 250  # the read limit
    finally:
        if query is not None:
            query.stop()
        ssc.stop(graceful=False)
    assert ssc.state.name == "STOPPED"


@pytest.mark.timeout(600)
def test_get_or_create_recovers_after_a_kill_9_of_the_connect_client(connect_server, tmp_path):
    """tests/integration/test_driver_crash.py's scenario, its driver a Connect client."""
    from test_driver_crash import crash_and_recover

    crash_and_recover(tmp_path, ("--remote", connect_server))
