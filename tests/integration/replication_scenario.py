"""Replicated blocks on a real multi-executor Spark (local-cluster or standalone), the WAL off.

Run as its own process; prints one ``RESULT {json}`` line that
tests/integration/test_replication.py asserts on.

Two receivers store numbered records steadily (unique across restarts: each run
of a receiver numbers under a token of its own) at the default storage level,
``MEMORY_AND_DISK_2``, with no write-ahead log. Then:

1. the executor JVM of receiver 0 is killed with SIGKILL — its block keeper
   goes with it, so the blocks it held are read from their copies on the other
   executor; receiver 0 is restarted elsewhere;
2. the Python worker running receiver 1 is killed with SIGKILL — the blocks are
   in its executor's keeper, which outlives the worker;
3. the context stops gracefully.

Every record the driver accepted must be processed exactly once, and the context
must keep running throughout (no batch fails on a lost block).

``--level MEMORY_AND_DISK --lost-block-policy skip`` is the control: one copy,
so killing the executor loses the blocks its keeper held; the batches run
without them and the losses are reported (step 2 is left out).
"""

from __future__ import annotations

import collections
import json
import os
import signal
import socket
import sys
import tempfile
import threading
import time
import uuid

os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)

from processes import executor_pids, holds_within
from pyspark.sql import SparkSession

from spark_receivers import Receiver, StreamingContext, StreamingListener
from spark_receivers.rpc import messages as m
from spark_receivers.rpc.transport import EndpointClient

RATE = 400  # records/s per receiver
UNREAD_AT_KILL = RATE // 4
"""A kill waits for over this many accepted, unread records of its receiver: two blocks or
more at the default block interval (200 ms, so blocks of RATE // 5 records)."""


class UniqueCounter(Receiver):
    """Stores ``<stream>-<run token>-<n>`` at ``rate`` records/s; writes its worker's pid."""

    def __init__(self, rate: int, pid_dir: str) -> None:
        super().__init__()
        self.rate = rate
        self.pid_dir = pid_dir
        self._thread: threading.Thread | None = None

    def __getstate__(self):
        state = super().__getstate__()
        state["_thread"] = None
        return state

    def on_start(self) -> None:
        with open(os.path.join(self.pid_dir, str(self.stream_id)), "w") as f:
            f.write(str(os.getpid()))
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def on_stop(self) -> None:
        pass

    def _run(self) -> None:
        token, n, per_tick = uuid.uuid4().hex[:8], 0, max(1, self.rate // 20)
        pause = threading.Event()
        while not self.is_stopped():
            try:
                self.store([f"{self.stream_id}-{token}-{i}" for i in range(n, n + per_tick)])
            except Exception:
                return
            n += per_tick
            pause.wait(0.05)


class Events(StreamingListener):
    def __init__(self) -> None:
        self.events: list[list] = []
        self.lock = threading.Lock()

    def _add(self, *event) -> None:
        with self.lock:
            self.events.append(list(event))

    def on_receiver_started(self, info) -> None:
        self._add("started", info.stream_id, info.executor_id)

    def on_receiver_error(self, info) -> None:
        self._add("error", info.stream_id, info.executor_id, info.last_error_message[:200])

    def on_replication_changed(self, info) -> None:
        self._add("replication", info.stream_id, info.achieved, info.wanted)

    def on_block_lost(self, info) -> None:
        self._add("lost", info.stream_id, info.block_id, info.num_records)


class ReadGate:
    """Holds the batches' reads of their blocks, so that a kill surely hits unread blocks.

    ``collect`` is the batches' ``foreach_batch`` function: it counts what it reads. While
    the gate is held, every batch waits before it reads, so the blocks the driver accepted
    since the last read are held only by their keepers: a kill then hits them whatever
    the timing of batches and blocks (without the gate, a kill just after a batch read its
    blocks hit nothing on a fast host: CI of 2026-11-29, stop 50).
    """

    def __init__(self) -> None:
        self._seen: collections.Counter[str] = collections.Counter()
        self._cond = threading.Condition()
        self._held = False
        self._reading = 0

    def collect(self, df, batch_time_ms) -> None:
        with self._cond:
            if not self._cond.wait_for(lambda: not self._held, 120):
                raise RuntimeError("the test held the batches' reads for over 120 s")
            self._reading += 1
        values: list[str] = []
        try:
            values = [r.value for r in df.collect()]
        finally:
            with self._cond:
                self._reading -= 1
                self._seen.update(values)

    def hold(self, status, stream_id: int, unread: int, timeout_s: float) -> int:
        """Hold the reads; return once no read runs and over ``unread`` records of
        ``stream_id`` that the driver accepted (``status()``: the context's) wait unread:
        their number, or 0 when ``timeout_s`` passed first."""
        prefix = f"{stream_id}-"  # UniqueCounter's records start with their stream id
        with self._cond:
            self._held = True
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            received = status().receiver(stream_id).records
            with self._cond:
                read = sum(c for v, c in self._seen.items() if v.startswith(prefix))
                if self._reading == 0 and received - read > unread:
                    return received - read
            time.sleep(0.05)
        return 0

    def release(self) -> None:
        with self._cond:
            self._held = False
            self._cond.notify_all()

    def kill_with_unread_blocks(self, status, stream_id: int, executor_id: str, kill) -> dict:
        """Kill ``executor_id`` (``kill()``) while over :data:`UNREAD_AT_KILL` accepted records
        of ``stream_id`` wait unread; let the reads go on once its keeper refuses connections.

        Returns ``unread`` (those records), ``accepted`` (the driver's count of every record
        just before the kill) and ``keeper_gone``.
        """
        keeper = status().block_keepers.get(executor_id)
        try:
            unread = self.hold(status, stream_id, UNREAD_AT_KILL, 60)
            accepted = status().records_received
            kill()
            gone = keeper is not None and holds_within(lambda: not listening(keeper), 30)
        finally:
            self.release()
        return {"unread": unread, "accepted": accepted, "keeper_gone": gone}

    def totals(self) -> tuple[int, int]:
        """Records read, and how many of them were read more than once."""
        with self._cond:
            seen = self._seen.values()
            return sum(seen), sum(c - 1 for c in seen if c > 1)


def listening(address: str) -> bool:
    """Whether something accepts TCP connections at ``host:port``."""
    host, port = address.rsplit(":", 1)
    try:
        with socket.create_connection((host, int(port)), timeout=2):
            return True
    except OSError:
        return False


def keeper_pids(ssc, secret: str) -> list[int]:
    pids = []
    for endpoint in ssc.status().block_keepers.values():
        client = EndpointClient(endpoint, secret, timeout_s=5)
        try:
            pids.append(int(client.call(m.DescribeKeeper())["pid"]))
        except Exception:
            pass
        finally:
            client.close()
    return pids


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def main() -> int:
    import argparse

    parser = argparse.ArgumentParser()
    parser.add_argument("--level", default="MEMORY_AND_DISK_2")
    parser.add_argument("--lost-block-policy", default="fail")
    parser.add_argument("--master", default="local-cluster[2,2,1024]")
    args = parser.parse_args()
    replicated = args.level.endswith("_2")
    secret = uuid.uuid4().hex
    spark = (
        SparkSession.builder.master(args.master)
        .config("spark.executor.cores", "2")
        .config("spark.cores.max", "4")
        .config("spark.driver.host", "127.0.0.1")
        .appName("spark-receivers-replication-test")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.executor.memory", "512m")
        .config("spark.authenticate.secret", secret)  # the test reads the keepers with it
        .config("spark.receivers.receiver.restartWindow", "10min")
        .config("spark.receivers.lostBlockPolicy", args.lost_block_policy)
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    pid_dir = tempfile.mkdtemp(prefix="replication-pids-")
    out: dict = {}
    ssc = StreamingContext(spark, batch_interval_ms=2000)
    events = Events()
    ssc.add_streaming_listener(events)
    gate = ReadGate()
    for _ in range(2):
        receiver = UniqueCounter(RATE, pid_dir)
        receiver.storage_level = args.level
        ssc.receiver_stream(receiver).foreach_batch(gate.collect)
    ssc.start()

    def status():
        return ssc.status()

    pids: list[int] = []
    want = 2 if replicated else 1
    try:
        out["placed"] = holds_within(
            lambda: (
                all(r.state == "ACTIVE" for r in status().receivers)
                and all(status().block_copies.get(s, (0, 0))[0] == want for s in (0, 1))
            ),
            120,
        )
        out["executors"] = {r.stream_id: r.executor_id for r in status().receivers}
        out["copies_before"] = {s: list(c) for s, c in status().block_copies.items()}
        time.sleep(3)

        # 1. kill -9 of receiver 0's executor JVM, with blocks of it accepted and unread
        # (over UNREAD_AT_KILL records); the reads go on once its keeper is gone.
        victim = out["executors"][0]
        pid = executor_pids(dict(spark.sparkContext.getConf().getAll()))[victim]
        kill = gate.kill_with_unread_blocks(status, 0, victim, lambda: os.kill(pid, signal.SIGKILL))
        out["unread_at_executor_kill"] = kill["unread"]
        out["accepted_before_executor_kill"] = kill["accepted"]
        out["killed_executor"] = victim
        out["keeper_gone"] = kill["keeper_gone"]

        def moved() -> bool:
            r = status().receiver(0)
            return r.state == "ACTIVE" and r.executor_id not in (None, victim)

        out["receiver_0_moved"] = holds_within(moved, 120)
        out["receiver_0_executor_after"] = status().receiver(0).executor_id
        out["replicated_again"] = holds_within(
            lambda: all(status().block_copies.get(s, (0, 0))[0] == want for s in (0, 1)), 90
        )
        time.sleep(3)
        if replicated:
            # 2. kill -9 of receiver 1's Python worker (its executor stays).
            jobs_before = status().receiver(1).jobs
            with open(os.path.join(pid_dir, "1")) as f:
                worker = int(f.read())
            out["accepted_before_worker_kill"] = status().records_received
            os.kill(worker, signal.SIGKILL)
            out["receiver_1_restarted"] = holds_within(
                lambda: (
                    status().receiver(1).jobs > jobs_before
                    and status().receiver(1).state == "ACTIVE"
                ),
                120,
            )
            time.sleep(3)
        out["state_before_stop"] = ssc.state.name
        out["failure_before_stop"] = status().failure
        pids = keeper_pids(ssc, secret)
        out["keepers_before_stop"] = len(pids)
    finally:
        ssc.stop(graceful=True)
    end = ssc.status()
    out["records_received_at_end"] = end.records_received
    out["records_processed_at_end"] = end.records_processed
    out["failure"] = end.failure
    out["blocks_lost"] = end.blocks_lost
    out["records_lost"] = end.records_lost
    out["processed"], out["duplicated"] = gate.totals()
    with events.lock:
        out["events"] = list(events.events)
    holds_within(lambda: not any(alive(p) for p in pids), 30)
    out["keepers_alive_after_stop"] = [p for p in pids if alive(p)]
    print("RESULT " + json.dumps(out), flush=True)
    spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
