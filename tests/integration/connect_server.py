"""A Spark Connect server for the tests, its client session, and a scenario both files run.

The server is the installed pyspark's own (``SparkConnectServer`` started with its
``bin/spark-submit``), in a process of its own, stopped by PID: started by
``spark_receivers.testing.start_connect_server`` (the benchmarks start theirs with it
too). Its master is ``local[3]`` (tests/integration/test_connect.py) or the tests'
standalone cluster (tests/integration/test_connect_standalone.py). The client
(``pyspark.sql.connect``) runs in the pytest process: it starts no JVM there. It does set
``SPARK_CONNECT_MODE_ENABLED`` for the process (pyspark's functions then build Connect
columns), so :func:`connect_session` restores the environment when it ends: the classic
tests that a worker runs after a Connect file see a classic process again.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from waiting import wait_until

from spark_receivers import LineSource, SocketTextReceiver, StreamingContext
from spark_receivers.driver.batches.cache_compression import COMPRESSED_KEY
from spark_receivers.testing import (
    CONNECT_ENV,
    SequenceReceiver,
    start_connect_server,
    stop_connect_server,
)

__all__ = [
    "CONNECT_ENV",
    "connect_session",
    "custom_and_socket_exactly_once",
    "start_connect_server",
    "stop_connect_server",
]


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
        compressed: set[str | None] = set()  # the session's setting while batches run

        def collect(name):
            def run(df, batch_time_ms):
                n = df.count()  # two actions on one batch: a count, then the rows
                if n:  # a batch with blocks is cached (one without is an empty relation)
                    compressed.add(spark.conf.get(COMPRESSED_KEY, None))
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
    # The batch caches were built uncompressed; the session's setting is back as it was.
    assert compressed == {"false"}
    assert spark.conf.get(COMPRESSED_KEY, None) is None
    ours = [t.name for t in threading.enumerate() if t.name.startswith("receiver-launcher")]
    assert ours == []
    return ssc
