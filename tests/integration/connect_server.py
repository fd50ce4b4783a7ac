"""A Spark Connect server for the tests, its client session, and a scenario both files run.

The server is the installed pyspark's own (``SparkConnectServer`` started with its
``bin/spark-submit``), in a process of its own, stopped by PID. Its master is
``local[3]`` (tests/integration/test_connect.py) or the tests' standalone cluster
(tests/integration/test_connect_standalone.py). The client (``pyspark.sql.connect``)
runs in the pytest process: it starts no JVM there. It does set
``SPARK_CONNECT_MODE_ENABLED`` for the process (pyspark's functions then build Connect
columns), so :func:`connect_session` restores the environment when it ends: the classic
tests that a worker runs after a Connect file see a classic process again.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from spark_receivers import LineSource, SocketTextReceiver, StreamingContext
from spark_receivers.testing import SequenceReceiver

CONNECT_ENV = ("SPARK_CONNECT_MODE_ENABLED", "SPARK_REMOTE", "SPARK_LOCAL_REMOTE")
SERVER_CLASS = "org.apache.spark.sql.connect.service.SparkConnectServer"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_until(predicate, timeout_s: float) -> bool:
    """Poll ``predicate`` until it holds or ``timeout_s`` passes; whether it held."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        threading.Event().wait(0.05)
    return bool(predicate())


def start_connect_server(
    log: Path,
    master: str = "local[3]",
    conf: Mapping[str, str] | None = None,
    env: Mapping[str, str] | None = None,
) -> tuple[subprocess.Popen, int]:
    """A Spark Connect server from the installed pyspark on a free loopback port.

    ``conf``: more ``--conf`` entries of its ``spark-submit``; ``env``: its environment
    (this process's by default).
    """
    import pyspark

    home = Path(pyspark.__file__).resolve().parent
    port = free_port()
    confs = {
        "spark.connect.grpc.binding.port": str(port),
        "spark.connect.grpc.binding.address": "127.0.0.1",
        "spark.driver.bindAddress": "127.0.0.1",
        "spark.ui.enabled": "false",
        "spark.sql.shuffle.partitions": "2",
        "spark.pyspark.python": sys.executable,
        **(conf or {}),
    }
    cmd = [str(home / "bin" / "spark-submit"), "--class", SERVER_CLASS, "--master", master]
    cmd += ["--name", "spark-receivers-connect-tests"]
    cmd += [x for key, value in confs.items() for x in ("--conf", f"{key}={value}")]
    environ = {
        **(os.environ if env is None else env),
        "SPARK_HOME": str(home),
        "PYSPARK_PYTHON": sys.executable,
    }
    for key in CONNECT_ENV:
        environ.pop(key, None)
    with log.open("wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=environ)

    def listening() -> bool:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return True
        except OSError:
            return False

    if not wait_until(lambda: listening() or proc.poll() is not None, 180) or not listening():
        stop_connect_server(proc)
        raise AssertionError(f"the Connect server did not listen: {log.read_text()[-3000:]}")
    return proc, port


def stop_connect_server(proc: subprocess.Popen) -> None:
    """SIGTERM the server by its PID; SIGKILL after 30 s."""
    proc.terminate()
    try:
        proc.wait(30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(10)


@contextmanager
def connect_session(url: str) -> Iterator[Any]:
    """A Connect client session of ``url``; the process's environment restored after."""
    saved = {key: os.environ.get(key) for key in CONNECT_ENV}
    try:
        from pyspark.sql.connect.session import SparkSession as RemoteSparkSession

        os.environ["SPARK_CONNECT_MODE_ENABLED"] = "1"  # what builder.remote() sets
        spark = RemoteSparkSession.builder.remote(url).getOrCreate()
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


def custom_and_socket_exactly_once(spark: Any, records: int = 3_000) -> StreamingContext:
    """A custom receiver and the socket receiver, each batch read by two actions.

    Asserts that every record arrives exactly once and the graceful stop ends every
    launcher thread; returns the stopped context.
    """
    expected = [f"record-{i:05d}" for i in range(records)]
    with LineSource(rate=2_000) as source:
        ssc = StreamingContext(spark, batch_interval_ms=1000)
        custom = ssc.receiver_stream(SequenceReceiver(expected, mode="mixed", chunk=100))
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
            assert wait_until(lambda: source.lines_sent >= records, 120), "the socket got nothing"
            sent = source.finish()
            assert wait_until(lambda: ssc.status().records_received >= sent + records, 120), (
                ssc.status()
            )
        finally:
            ssc.stop(graceful=True)
    assert ssc.status().state == "STOPPED"
    assert sorted(seen["custom"]) == expected  # each record once, none in two batches
    numbers = sorted(int(v.split(" ", 1)[0]) for v in seen["socket"])
    assert numbers == list(range(sent))
    assert counted == {"custom": records, "socket": sent}
    ours = [t.name for t in threading.enumerate() if t.name.startswith("receiver-launcher")]
    assert ours == []
    return ssc
