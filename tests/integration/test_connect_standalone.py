"""Receivers through Spark Connect whose server's master is the tests' standalone cluster.

The Connect server (``spark_receivers.testing.start_connect_server``) is started with ``--master
spark://...`` of the session's standalone cluster (tests/integration/standalone.py:
a Master, two Workers on 127.0.0.2 and 127.0.0.3), executors of one core and 512m each;
the client, and so the driver's parts (tracker, job generator, block tracker), run in
this pytest process on 127.0.0.1. The executors find the client at the address the
server's driver advertises (``spark.driver.host``).
"""

from __future__ import annotations

import os
import signal
import time

import pytest
import replication_scenario as scenario
from connect_server import (
    connect_session,
    custom_and_socket_exactly_once,
)
from processes import executor_pids
from pyspark import cloudpickle
from standalone import WORKER_HOSTS, StandaloneCluster
from waiting import wait_until

from spark_receivers import StorageLevel, StreamingConfig, StreamingContext
from spark_receivers.driver.tracking.scheduling_policy import ExecutorCacheTaskLocation
from spark_receivers.errors import ConfigError
from spark_receivers.spark.session_kind import ConnectSide, spark_side
from spark_receivers.testing import SequenceReceiver, start_connect_server, stop_connect_server

pytestmark = [pytest.mark.spark, pytest.mark.timeout(600)]

EXECUTORS = 3
SERVER_CONF = {
    "spark.executor.cores": "1",
    "spark.executor.memory": "512m",
    "spark.cores.max": str(EXECUTORS),  # so three executors of one core
    "spark.driver.memory": "768m",
    "spark.driver.host": "127.0.0.1",
    "spark.ui.showConsoleProgress": "false",
}


def server_env(cluster: StandaloneCluster) -> dict[str, str]:
    """The server's environment: none of the user's Spark settings, the cluster's conf dir."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SPARK_", "PYSPARK_"))}
    env.update(SPARK_CONF_DIR=str(cluster.root / "conf"), SPARK_LOCAL_IP="127.0.0.1")
    return env


@pytest.fixture(scope="module")
def connect_server(standalone, tmp_path_factory):
    """A Connect server in front of the standalone cluster: its ``sc://`` URL."""
    log = tmp_path_factory.mktemp("connect-standalone") / "server.log"
    proc, port = start_connect_server(
        log, master=standalone.master_url, conf=SERVER_CONF, env=server_env(standalone)
    )
    try:
        yield f"sc://127.0.0.1:{port}"
    finally:
        stop_connect_server(proc)


@pytest.fixture(scope="module")
def connect(connect_server):
    with connect_session(connect_server) as spark:
        yield spark


def test_the_client_sees_the_clusters_executors(connect, standalone):
    side = spark_side(connect)
    assert isinstance(side, ConnectSide)
    assert side.master == standalone.master_url
    assert side.app_id.startswith("app-")
    # A small job finds the executors that run its tasks: all three once they registered.
    assert wait_until(lambda: len(side.executors()) == EXECUTORS, 120), side.executors()
    assert {host for host, _ in side.executors()} == set(WORKER_HOSTS)


def test_a_task_retried_after_its_executor_died_is_not_refused(connect):
    """Spark retries a task whose executor died on another executor: that retry runs (a
    receiver's returns at once and the tracker places it again) instead of being refused,
    which had the launcher relaunch a receiver for the dead executor up to 5 times."""

    def kill_my_executor_on_the_first_attempt(items):
        """A ``run_located`` task: its first attempt kills its own executor JVM (SIGKILL), the
        retry yields ``(item, attempt, executor id)``."""
        from pyspark import TaskContext

        from spark_receivers.rpc.hosts import executor_jvm
        from spark_receivers.spark.receiver_task import executor_id

        attempt = TaskContext.get().attemptNumber()
        if attempt == 0:
            jvm = executor_jvm()
            assert jvm is not None
            os.kill(jvm.pid, signal.SIGKILL)
            time.sleep(60)  # ends with its executor
        for item in items:
            yield (item, attempt, executor_id())

    side = spark_side(connect)
    assert wait_until(lambda: len(side.executors()) == EXECUTORS, 120), side.executors()
    host, victim = side.executors()[0]
    there = [(7, [ExecutorCacheTaskLocation(host, victim)])]
    for _ in range(40):  # Connect puts the task anywhere: until it lands on the victim
        outputs, refused = side.run_located(there, kill_my_executor_on_the_first_attempt, True)
        if not refused or victim not in executor_pids(side.conf()):
            break
    assert victim not in executor_pids(side.conf()), "no first attempt landed on the victim"
    assert refused == [], "the retry on another executor was refused"
    assert len(outputs) == 1 and outputs[0][:2] == (7, 1), outputs
    assert outputs[0][2] != victim, outputs  # the retry ran elsewhere, and ran


def test_custom_and_socket_receivers_deliver_every_record_once_on_the_cluster(connect):
    custom_and_socket_exactly_once(connect)


def test_start_refuses_executors_that_cannot_reach_the_client(connect):
    """The start-up probe, through Connect: the client (the driver's parts) advertises an
    address no executor reaches (the endpoint binds 127.0.0.1, executors are told
    127.0.0.9, where nothing listens); ``start()`` fails with one ConfigError naming the
    setting, before any receiver is launched, and the session still works after it."""
    config = StreamingConfig(driver_host="127.0.0.9", driver_bind_address="127.0.0.1")
    ssc = StreamingContext(connect, 1000, config=config)
    ssc.receiver_stream(SequenceReceiver(["a", "b"])).foreach_batch(lambda df, t: df.count())
    with pytest.raises(ConfigError) as caught:
        ssc.start()
    message = str(caught.value)
    assert "cannot reach the driver at 127.0.0.9:" in message, message
    assert "spark.receivers.driver.host" in message, message
    assert not any(r.state == "ACTIVE" for r in ssc.status().receivers), ssc.status()
    ssc.stop()
    assert connect.range(5).count() == 5  # the client session is unharmed


def kill_the_receivers_executor(spark, pid_dir: str, level: str, **config) -> dict:
    """One receiver of replication_scenario.py at ``level``, the WAL off; SIGKILL of its
    executor JVM once its blocks have every copy; a graceful stop once it runs again
    elsewhere and stored more. What happened, as a dict."""
    cloudpickle.register_pickle_by_value(scenario)  # executors cannot import it by name
    side = spark_side(spark)
    ssc = StreamingContext(spark, 2000, config=StreamingConfig(**config))
    events = scenario.Events()
    ssc.add_streaming_listener(events)
    gate = scenario.ReadGate()
    receiver = scenario.UniqueCounter(scenario.RATE, pid_dir)
    receiver.storage_level = level
    ssc.receiver_stream(receiver).foreach_batch(gate.collect)
    copies = StorageLevel.of(level).replication
    out: dict = {}
    ssc.start()
    status = ssc.status
    try:
        assert wait_until(
            lambda: (
                status().receiver(0).state == "ACTIVE"
                and status().block_copies.get(0, (0, 0))[0] == copies
            ),
            180,
        ), status()
        victim = status().receiver(0).executor_id
        pids = executor_pids(side.conf())
        assert victim in pids, (victim, pids)
        time.sleep(3)  # blocks stored and copied
        # Blocks accepted and unread when the executor dies; the reads go on once its
        # keeper is gone (see ReadGate).
        kill = gate.kill_with_unread_blocks(
            status, 0, victim, lambda: os.kill(pids[victim], signal.SIGKILL)
        )
        out["unread_at_kill"] = kill["unread"]
        out["accepted_before_kill"] = kill["accepted"]
        out["killed_executor"] = victim
        out["keeper_gone"] = kill["keeper_gone"]

        def moved() -> bool:
            r = status().receiver(0)
            return r.state == "ACTIVE" and r.executor_id not in (None, victim)

        out["moved"] = wait_until(moved, 180)
        out["executor_after"] = status().receiver(0).executor_id
        after = status().records_received
        out["stored_after_move"] = wait_until(
            lambda: status().records_received > after + scenario.RATE, 60
        )
        out["failure_before_stop"] = status().failure
        out["state_before_stop"] = ssc.state.name
    finally:
        ssc.stop(graceful=True)
    end = ssc.status()
    out.update(
        failure=end.failure,
        received=end.records_received,
        processed_at_end=end.records_processed,
        blocks_lost=end.blocks_lost,
        records_lost=end.records_lost,
    )
    with events.lock:
        out["events"] = list(events.events)
    out["processed"], out["duplicated"] = gate.totals()
    print(f"\nCONNECT-STANDALONE {level}: {out}", flush=True)
    return out


def test_kill_9_of_a_receivers_executor_with_replicated_blocks_loses_nothing(connect, tmp_path):
    """MEMORY_AND_DISK_2: each block has a copy on another executor's keeper. Every record
    the driver accepted is processed once; the receiver registers again elsewhere."""
    out = kill_the_receivers_executor(connect, str(tmp_path), "MEMORY_AND_DISK_2")
    assert out["unread_at_kill"] > 0 and out["keeper_gone"], out
    assert out["moved"] and out["stored_after_move"], out
    assert out["state_before_stop"] == "ACTIVE", out
    assert out["failure_before_stop"] is None and out["failure"] is None, out
    assert out["blocks_lost"] == out["records_lost"] == 0, out
    assert not [e for e in out["events"] if e[0] == "lost"], out
    started = [e for e in out["events"] if e[0] == "started"]
    assert len(started) >= 2 and started[-1][2] == out["executor_after"], started
    assert out["duplicated"] == 0, out
    assert out["processed"] == out["received"] == out["processed_at_end"], out
    assert out["accepted_before_kill"] < out["processed"], out


def test_one_copy_loses_the_killed_executors_blocks_and_skip_reports_them(connect, tmp_path):
    """The control: MEMORY_AND_DISK keeps one copy, so the same kill loses blocks
    (lostBlockPolicy=skip runs on without them): the kill above did hit held blocks."""
    out = kill_the_receivers_executor(
        connect, str(tmp_path), "MEMORY_AND_DISK", lost_block_policy="skip"
    )
    assert out["unread_at_kill"] > 0 and out["keeper_gone"], out
    assert out["moved"] and out["stored_after_move"], out
    assert out["failure"] is None and out["state_before_stop"] == "ACTIVE", out
    # Every record unread at the kill was held by the killed executor's keeper alone.
    assert out["records_lost"] >= out["unread_at_kill"] and out["blocks_lost"] > 0, out
    assert len([e for e in out["events"] if e[0] == "lost"]) == out["blocks_lost"], out
    assert out["duplicated"] == 0, out
    assert out["processed"] + out["records_lost"] == out["received"], out
