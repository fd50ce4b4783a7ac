"""Receivers through Spark Connect: a real Connect server, the driver's parts in this client.

The server is the installed pyspark's own, ``local[3]``, in a process of its own, stopped
at the end (``spark_receivers.testing.start_connect_server``); the client runs in this
pytest process (tests/integration/connect_server.py says how, and why the environment
is restored after).
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from connect_server import (
    connect_session,
    custom_and_socket_exactly_once,
)
from queries import start_query
from waiting import wait_until

from spark_receivers import GeneratorReceiver, StreamingContext
from spark_receivers.cli.spark_session import spark_settings
from spark_receivers.driver.batches.cache_compression import COMPRESSED_KEY, ConnectCacheSetting
from spark_receivers.driver.tracking.scheduling_policy import ExecutorCacheTaskLocation
from spark_receivers.errors import ConfigError
from spark_receivers.spark.session_kind import ConnectSide, spark_side
from spark_receivers.testing import (
    CONNECT_ENV,
    SequenceReceiver,
    start_connect_server,
    stop_connect_server,
)


@pytest.fixture(scope="module")
def connect_server(tmp_path_factory):
    """The file's one Connect server: its ``sc://`` URL; stopped at the end."""
    log = tmp_path_factory.mktemp("connect") / "server.log"
    proc, port = start_connect_server(log)
    try:
        yield f"sc://127.0.0.1:{port}"
    finally:
        stop_connect_server(proc)


@pytest.fixture(scope="module")
def connect(connect_server):
    """The file's one Connect client session; the process's environment restored after."""
    with connect_session(connect_server) as spark:
        yield spark


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
    custom_and_socket_exactly_once(connect)


def test_batch_caches_turn_compression_off_only_where_the_user_did_not_set_it(connect):
    """The session's setting is off while contexts cache batches, back after the last one;
    a value the user set is left alone (the cache then follows it)."""
    setting = ConnectCacheSetting()
    assert connect.conf.get(COMPRESSED_KEY, None) is None
    assert setting.hold(connect) and setting.hold(connect)  # two contexts, one session
    assert connect.conf.get(COMPRESSED_KEY) == "false"
    setting.release(connect)
    assert connect.conf.get(COMPRESSED_KEY) == "false"  # the other context still runs
    setting.release(connect)
    assert connect.conf.get(COMPRESSED_KEY, None) is None
    connect.conf.set(COMPRESSED_KEY, "true")
    try:
        assert not setting.hold(connect)
        assert connect.conf.get(COMPRESSED_KEY) == "true"
    finally:
        connect.conf.unset(COMPRESSED_KEY)


def test_a_receiver_scheduled_on_a_host_without_executors_runs_on_the_last_try(connect):
    """Two receivers on local[3]: the first gets the driver, the second prefers a host with
    no executor and gets that host alone. Its tries 1-4 are refused where they land; the
    fifth runs there and the tracker accepts it. (The tracker refused it too before, for
    good: a host location always counts as alive, so every restart kept it.)"""
    records = {name: [f"{name}-{i:04d}" for i in range(300)] for name in ("here", "there")}
    ssc = StreamingContext(connect, batch_interval_ms=1000)
    lock = threading.Lock()
    seen: list[str] = []

    def collect(df, batch_time_ms) -> None:
        values = [r.value for r in df.collect()]
        with lock:
            seen.extend(values)

    ssc.receiver_stream(SequenceReceiver(records["here"], chunk=50)).foreach_batch(collect)
    there = SequenceReceiver(records["there"], chunk=50)
    there.preferred_location = "10.255.255.1"  # no executor there
    ssc.receiver_stream(there).foreach_batch(collect)
    ssc.start()
    try:
        assert [str(x) for x in ssc.status().receiver(1).scheduled_locations] == ["10.255.255.1"]
        assert wait_until(lambda: len(seen) >= 600, 120), ssc.status().receivers
        info = ssc.status().receiver(1)
    finally:
        ssc.stop(graceful=True)
    assert info.executor_id == "driver"
    assert sorted(seen) == records["here"] + records["there"]


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


@contextlib.contextmanager
def generated_records_query(connect: Any, total: int, sink: Callable[[Any], Any]) -> Iterator[Any]:
    """A structured stream of ``total`` generated records, read 250 per trigger every 0.5 s
    into ``sink(writeStream)``: its running query; the query and the context stopped after."""
    ssc = StreamingContext(connect, 1000)
    stream = ssc.structured_stream(GeneratorReceiver(rate=300, total=total))
    ssc.start()
    query = None
    try:
        writer = sink(stream.read_stream(max_records_per_trigger=250).writeStream)
        query = start_query(writer.trigger(processingTime="500 milliseconds").start)
        yield query
    finally:
        if query is not None:
            query.stop()
        ssc.stop(graceful=False)
    assert ssc.state.name == "STOPPED"


def test_a_structured_stream_reads_every_record_once_through_a_query_on_connect(connect):
    """The source's planner runs as a Python worker of the Connect server."""
    total = 600

    def memory(writer: Any) -> Any:  # a table on the server that this session reads
        return writer.format("memory").queryName("connect_structured")

    with generated_records_query(connect, total, memory) as query:
        table = "connect_structured"

        def counted() -> int:
            assert query.exception() is None, query.exception()
            return int(connect.sql(f"SELECT count(*) AS n FROM {table}").collect()[0].n)

        assert wait_until(lambda: counted() >= total, 180), query.recentProgress[-3:]
        query.processAllAvailable()
        row = connect.sql(f"SELECT count(*) AS n, count(DISTINCT value) AS d FROM {table}")
        assert tuple(row.collect()[0]) == (total, total)  # every record, none twice
        assert max(p.numInputRows for p in query.recentProgress) <= 250  # the read limit


def test_a_structured_stream_into_a_foreach_batch_sink_on_connect(connect, tmp_path):
    """``foreachBatch`` through Connect: the function runs in a Python process of the
    server, with a session of its own; each epoch's rows go to a file named by its epoch
    (a replayed epoch writes the same file again), so every record is there once."""
    total = 600
    out = tmp_path / "epochs"
    out.mkdir()
    folder = str(out)

    def write_epoch(df, epoch_id):  # runs on the Connect server
        import os

        values = sorted(r.value for r in df.select("value").collect())
        path = os.path.join(folder, f"epoch-{epoch_id:05d}.txt")
        with open(path + ".tmp", "w", encoding="utf-8") as f:
            f.write("".join(v + "\n" for v in values))
        os.replace(path + ".tmp", path)

    def written() -> list[str]:
        return [v for p in sorted(out.glob("epoch-*.txt")) for v in p.read_text().splitlines()]

    with generated_records_query(connect, total, lambda w: w.foreachBatch(write_epoch)) as query:

        def done() -> bool:
            assert query.exception() is None, query.exception()
            return len(written()) >= total

        assert wait_until(done, 180), query.recentProgress[-3:]
        query.processAllAvailable()
        values = written()
        assert len(values) == total and len(set(values)) == total  # every record, none twice


@pytest.mark.timeout(600)
def test_get_or_create_recovers_after_a_kill_9_of_the_connect_client(connect_server, tmp_path):
    """tests/integration/test_driver_crash.py's scenario, its driver a Connect client."""
    from test_driver_crash import crash_and_recover

    crash_and_recover(tmp_path, ("--remote", connect_server))
