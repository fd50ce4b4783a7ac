"""Exactly once for sources that name their records (issue 33), on real Spark.

* A source position stored with a block survives a driver restart with ``get_or_create``:
  the receiver of the new context asks for it and resumes after it (no record twice).
* kill -9 of the Redis receiver's worker between ``store`` and ``XACK``: after the
  relaunch its own pending entries that the driver had are acked, not stored again.
* HTTP ``Idempotency-Key``: a retry after a kill -9 of the receiver's worker, and every
  key of the window after a kill -9 of the driver (``get_or_create``), stored once.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
import uuid
from collections import Counter
from pathlib import Path

import pytest
from pyspark import cloudpickle

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "receivers"))

from processes import kill_session, port_for_a_later_server, wait_until
from service_fixtures import redis_url  # noqa: F401

from spark_receivers import Receiver, StreamingConfig, StreamingContext, StreamingListener
from spark_receivers.receivers import FileTailReceiver, HttpReceiver, RedisStreamReceiver

cloudpickle.register_pickle_by_value(sys.modules[__name__])  # executors cannot import tests

pytestmark = pytest.mark.spark

BOUND_S = 300  # a bound on waits, never a verdict


class Collected:
    """A sink that writes idempotently by batch time, as docs/receivers.md asks of
    ``foreach_batch``: a batch redone after a driver restart replaces its first run (and
    must hold the same records, checked here), so only a record in two batches counts
    twice."""

    def __init__(self) -> None:
        self.batches: dict[int, list[str]] = {}
        self.cond = threading.Condition()

    def __call__(self, df, batch_time_ms: int) -> None:
        rows = [r.value for r in df.collect()]
        with self.cond:
            earlier = self.batches.get(batch_time_ms)
            if earlier is not None:
                assert Counter(rows) == Counter(earlier), f"batch {batch_time_ms} redone unlike"
            self.batches[batch_time_ms] = rows
            self.cond.notify_all()

    @property
    def values(self) -> list[str]:
        with self.cond:
            return [v for t in sorted(self.batches) for v in self.batches[t]]

    def wait_for(self, n: int) -> list[str]:
        with self.cond:
            assert self.cond.wait_for(lambda: len(set(self.values)) >= n, BOUND_S), len(self.values)
            return self.values


class Numbers(Receiver):
    """Stores ``count`` numbers, ten a block, each block with its last number as position;
    starts after the position the driver accepted."""

    def __init__(self, count: int) -> None:
        super().__init__()
        self.count = count

    def on_start(self) -> None:
        threading.Thread(target=self._run, daemon=True).start()

    def on_stop(self) -> None:
        pass

    def _run(self) -> None:
        accepted = self.accepted_position()
        start = 0 if accepted is None else int(accepted) + 1
        for first in range(start, start + self.count, 10):
            if self.is_stopped():
                return
            block = [str(n) for n in range(first, first + 10)]
            self.store(block, reliable=True, position=block[-1])


class Positions(StreamingListener):
    def __init__(self) -> None:
        self.seen: list[str] = []

    def on_batch_completed(self, info) -> None:
        for inputs in info.stream_input_info.values():
            if inputs.position is not None:
                self.seen.append(inputs.position)


@pytest.mark.timeout(900)
def test_the_accepted_position_survives_a_driver_restart_with_get_or_create(spark, tmp_path):
    ckpt = str(tmp_path / "ckpt")
    config = StreamingConfig(receiver_wal_enabled=True, receiver_start_timeout_s=BOUND_S)
    collected = Collected()
    positions = Positions()

    def create() -> StreamingContext:
        ssc = StreamingContext(spark, 500, checkpoint_dir=ckpt, config=config)
        ssc.receiver_stream(Numbers(100)).foreach_batch(collected)
        return ssc

    first = StreamingContext.get_or_create(ckpt, create)
    first.add_streaming_listener(positions)
    first.start()
    try:
        collected.wait_for(100)
    finally:
        first.stop(graceful=True)
    assert "99" in positions.seen  # the listener's batch events carry the position

    second = StreamingContext.get_or_create(ckpt, create)
    assert second.recovered_from_checkpoint
    second.start()
    try:
        values = collected.wait_for(200)
    finally:
        second.stop(graceful=True)
    counts = Counter(values)
    assert sorted(counts, key=int) == [str(n) for n in range(200)]
    assert [v for v, c in counts.items() if c > 1] == []


class KilledBeforeAck(RedisStreamReceiver):
    """kill -9 of its own worker once, after storing a batch and before its ``XACK``."""

    def __init__(self, *args, marker: str, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.marker = marker

    def _ack(self, client, ids):
        if self.records_stored >= 500 and not os.path.exists(self.marker):
            Path(self.marker).write_text(",".join(ids))
            os.kill(os.getpid(), signal.SIGKILL)  # the batch is stored, not acked
        super()._ack(client, ids)


@pytest.mark.timeout(900)
def test_kill_9_of_the_redis_receiver_between_store_and_xack_stores_nothing_twice(
    spark,
    tmp_path,
    redis_url,  # noqa: F811
):
    import redis

    stream, group = f"exact-{uuid.uuid4().hex[:8]}", "spark"
    client = redis.Redis.from_url(redis_url, decode_responses=True)
    sent = [f"entry {chunk} {i}" for chunk in range(30) for i in range(100)]

    def feed() -> None:
        for chunk in range(30):
            pipe = client.pipeline()
            for value in sent[chunk * 100 : (chunk + 1) * 100]:
                pipe.xadd(stream, {"value": value})
            pipe.execute()
            time.sleep(0.1)

    marker = tmp_path / "killed"
    receiver = KilledBeforeAck(
        stream, group, url=redis_url, block_ms=200, batch=100, marker=str(marker)
    )
    config = StreamingConfig(
        receiver_wal_enabled=True, receiver_restart_delay_ms=300, receiver_drain_timeout_s=10.0
    )
    ssc = StreamingContext(spark, 1000, checkpoint_dir=str(tmp_path / "ckpt"), config=config)
    collected = Collected()
    ssc.receiver_stream(receiver).foreach_batch(collected)
    ssc.start()
    feeder = threading.Thread(target=feed, daemon=True)
    try:
        feeder.start()
        wait_until(marker.exists, BOUND_S, "the kill between store and XACK")
        feeder.join(BOUND_S)
        values = collected.wait_for(len(sent))
        wait_until(lambda: client.xpending(stream, group)["pending"] == 0, 60, "no pending")
        # Everything in batches the context finished: nothing more comes after this.
        ssc.stop(graceful=True)
        values = list(collected.values)
    finally:
        ssc.stop(graceful=True)
        client.close()
    counts = Counter(values)
    assert set(counts) == set(sent)  # nothing lost
    assert [v for v, c in counts.items() if c > 1] == []  # nothing twice
    assert marker.read_text()  # the killed batch was one of those stored once


class TailKilledBeforeSave(FileTailReceiver):
    """kill -9 of its own worker once, after storing a batch and before saving its offset."""

    def __init__(self, *args, marker: str, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.marker = marker

    def _store_at(self, f, lines, offset, skipping):
        super()._store_at(f, lines, offset, skipping)
        if self.lines_stored >= 500 and not os.path.exists(self.marker):
            Path(self.marker).write_text(f"{f.path}:{offset}")
            os.kill(os.getpid(), signal.SIGKILL)  # stored, offset not saved


@pytest.mark.timeout(900)
def test_kill_9_of_the_file_tail_receiver_between_store_and_save_stores_nothing_twice(
    spark, tmp_path
):
    data = tmp_path / "data"
    data.mkdir()
    sent = [f"{name}-{chunk}-{i}" for name in ("a", "b") for chunk in range(20) for i in range(50)]

    def feed() -> None:
        for name in ("a", "b"):
            for chunk in range(20):
                with (data / f"{name}.log").open("a") as f:
                    f.write("".join(f"{name}-{chunk}-{i}\n" for i in range(50)))
                time.sleep(0.1)
        # a rotation after the kill: the old file renamed, a new one under the name
        os.rename(data / "b.log", data / "b.log.1")
        with (data / "b.log").open("a") as f:
            f.write("".join(f"new-{i}\n" for i in range(50)))

    sent += [f"new-{i}" for i in range(50)]
    marker = tmp_path / "killed"
    receiver = TailKilledBeforeSave(str(data), "*.log*", poll_interval_ms=50, marker=str(marker))
    config = StreamingConfig(
        receiver_wal_enabled=True, receiver_restart_delay_ms=300, receiver_drain_timeout_s=10.0
    )
    ssc = StreamingContext(spark, 1000, checkpoint_dir=str(tmp_path / "ckpt"), config=config)
    collected = Collected()
    ssc.receiver_stream(receiver).foreach_batch(collected)
    ssc.start()
    feeder = threading.Thread(target=feed, daemon=True)
    try:
        feeder.start()
        wait_until(marker.exists, BOUND_S, "the kill between store and offsets save")
        feeder.join(BOUND_S)
        collected.wait_for(len(sent))
        ssc.stop(graceful=True)
        values = list(collected.values)
    finally:
        ssc.stop(graceful=True)
    counts = Counter(values)
    assert set(counts) == set(sent)  # nothing lost
    assert [v for v, c in counts.items() if c > 1] == []  # nothing twice


@pytest.mark.timeout(900)
def test_a_batch_redone_after_recovery_has_the_same_batch_id(spark, tmp_path):
    from spark_receivers import StreamingError
    from spark_receivers.testing import SequenceReceiver

    ckpt = str(tmp_path / "ckpt")
    config = StreamingConfig(
        receiver_wal_enabled=True, receiver_start_timeout_s=BOUND_S, warm_up_timeout_s=0
    )
    old = [f"old-{i:04d}" for i in range(300)]
    received = threading.Event()
    failed: list[tuple[int, list[str]]] = []

    class Received(StreamingListener):
        def on_batch_submitted(self, info) -> None:  # every block is in the driver WAL
            if first.status().records_received >= len(old):
                received.set()

    def sink_down(df, batch_time_ms: int, batch_id: int) -> None:
        rows = sorted(r.value for r in df.collect())
        if rows:
            received.wait(BOUND_S)
            failed.append((batch_id, rows))
            raise RuntimeError("the sink is down")

    first = StreamingContext(spark, 500, checkpoint_dir=ckpt, config=config)
    first.receiver_stream(SequenceReceiver(old, mode="list", chunk=100)).foreach_batch(sink_down)
    first.add_streaming_listener(Received())
    first.start()
    with pytest.raises(StreamingError, match="the sink is down"):
        first.await_termination(timeout_s=BOUND_S)
    first.stop(graceful=False)
    assert len(failed) == 1

    redone: dict[int, list[str]] = {}
    done = threading.Condition()

    def keep(df, batch_time_ms: int, batch_id: int) -> None:
        rows = sorted(r.value for r in df.collect())
        with done:
            redone[batch_id] = rows
            done.notify_all()

    def create() -> StreamingContext:
        ssc = StreamingContext(spark, 500, checkpoint_dir=ckpt, config=config)
        ssc.receiver_stream(SequenceReceiver([], mode="list")).foreach_batch(keep)
        return ssc

    second = StreamingContext.get_or_create(ckpt, create)
    second.start()
    try:
        batch_id, rows = failed[0]
        with done:
            assert done.wait_for(lambda: batch_id in redone, BOUND_S), sorted(redone)
    finally:
        second.stop(graceful=True)
    assert redone[batch_id] == rows  # the same id for the same records


@pytest.mark.timeout(900)
def test_a_driver_restarted_with_get_or_create_after_a_kill_between_store_and_xack(
    spark,
    tmp_path,
    redis_url,  # noqa: F811
):
    """The receiver dies between store and XACK and its driver stops at once (as if killed
    with it); the context restarted from the checkpoint acks those entries, stores them
    not again, and redoes or keeps the batches: every entry once. A batch whose output ran
    but whose completion the stopped driver never wrote is redone with its time and its
    records (the sink, idempotent by batch time as docs/receivers.md asks, checks both)."""
    import redis

    stream, group = f"exact-{uuid.uuid4().hex[:8]}", "spark"
    client = redis.Redis.from_url(redis_url, decode_responses=True)
    first_part = [f"first {i}" for i in range(1000)]
    second_part = [f"second {i}" for i in range(500)]
    pipe = client.pipeline()
    for value in first_part:
        pipe.xadd(stream, {"value": value})
    pipe.execute()

    ckpt = str(tmp_path / "ckpt")
    marker = tmp_path / "killed"
    collected = Collected()
    config = StreamingConfig(
        receiver_wal_enabled=True,
        receiver_restart_delay_ms=60_000,  # no relaunch in the first run: its driver "dies"
        receiver_start_timeout_s=BOUND_S,
    )

    def create() -> StreamingContext:
        ssc = StreamingContext(spark, 500, checkpoint_dir=ckpt, config=config)
        receiver = KilledBeforeAck(
            stream, group, url=redis_url, block_ms=200, batch=100, marker=str(marker)
        )
        ssc.receiver_stream(receiver).foreach_batch(collected)
        return ssc

    first = StreamingContext.get_or_create(ckpt, create)
    first.start()
    try:
        wait_until(marker.exists, BOUND_S, "the kill between store and XACK")
    finally:
        first.stop(graceful=False)
    assert client.xpending(stream, group)["pending"] > 0  # the killed batch is not acked

    second = StreamingContext.get_or_create(ckpt, create)
    assert second.recovered_from_checkpoint
    second.start()
    try:
        pipe = client.pipeline()
        for value in second_part:
            pipe.xadd(stream, {"value": value})
        pipe.execute()
        collected.wait_for(len(first_part) + len(second_part))
        wait_until(lambda: client.xpending(stream, group)["pending"] == 0, 60, "no pending")
        second.stop(graceful=True)
        values = list(collected.values)
    finally:
        second.stop(graceful=True)
        client.close()
    counts = Counter(values)
    assert set(counts) == set(first_part + second_part)  # nothing lost
    assert [v for v, c in counts.items() if c > 1] == []  # nothing twice


class HttpKilledBeforeAnswer(HttpReceiver):
    """kill -9 of its own worker once, after storing a request and before answering it."""

    def __init__(self, *args, marker: str, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.marker = marker

    def _store_reliably(self, records, arrived_us, key=None):
        super()._store_reliably(records, arrived_us, key)
        if self.records_stored >= 500 and not os.path.exists(self.marker):
            Path(self.marker).write_text(str(key))
            os.kill(os.getpid(), signal.SIGKILL)  # stored, the client never hears of it


@pytest.mark.timeout(900)
def test_http_retries_with_the_same_key_across_a_kill_9_are_stored_once(spark, tmp_path):
    port = port_for_a_later_server()  # free across the kill and the restart

    def post(body: bytes, key: str) -> tuple[int, dict]:
        request = urllib.request.Request(
            f"http://127.0.0.1:{port}/ingest", data=body, method="POST"
        )
        request.add_header("Idempotency-Key", key)
        try:
            with urllib.request.urlopen(request, timeout=10) as response:
                return response.status, dict(response.headers)
        except urllib.error.HTTPError as e:
            return e.code, dict(e.headers)
        except OSError:
            return 0, {}  # the connection broke, or nobody listens (a relaunch)

    sent: list[str] = []
    replayed: list[str] = []

    def feed() -> None:
        for i in range(30):
            lines = [f"req {i} line {j}" for j in range(50)]
            body = ("\n".join(lines) + "\n").encode()
            deadline = time.monotonic() + BOUND_S
            while True:  # a client retries with the same key until acknowledged
                status, headers = post(body, f"request-{i}")
                if status == 200:
                    if headers.get("Idempotent-Replayed") == "true":
                        replayed.append(f"request-{i}")
                    break
                assert time.monotonic() < deadline, f"request {i} never acknowledged"
                time.sleep(0.2)
            sent.extend(lines)

    marker = tmp_path / "killed"
    receiver = HttpKilledBeforeAnswer(host="127.0.0.1", port=port, marker=str(marker))
    config = StreamingConfig(
        receiver_wal_enabled=True, receiver_restart_delay_ms=300, receiver_drain_timeout_s=10.0
    )
    ssc = StreamingContext(spark, 1000, checkpoint_dir=str(tmp_path / "ckpt"), config=config)
    collected = Collected()
    ssc.receiver_stream(receiver).foreach_batch(collected)
    ssc.start()
    feeder = threading.Thread(target=feed, daemon=True)
    try:
        feeder.start()
        feeder.join(BOUND_S * 2)
        assert not feeder.is_alive(), "the client did not finish"
        collected.wait_for(len(sent))
        ssc.stop(graceful=True)
        values = list(collected.values)
    finally:
        ssc.stop(graceful=True)
    assert marker.exists()
    assert replayed == [marker.read_text()]  # the cut-off request, answered from the driver
    counts = Counter(values)
    assert set(counts) == set(sent)  # nothing lost
    assert [v for v, c in counts.items() if c > 1] == []  # nothing twice


@pytest.mark.timeout(900)
def test_kill_9_of_the_redis_receivers_executor_between_store_and_xack_stores_nothing_twice(
    tmp_path,
    redis_url,  # noqa: F811
):
    import json
    import subprocess

    script = Path(__file__).with_name("redis_executor_kill_scenario.py")
    env = {**os.environ, "SPARK_LOCAL_IP": "127.0.0.1", "PYSPARK_PYTHON": sys.executable}
    proc = subprocess.run(
        [sys.executable, str(script), redis_url, str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=840,
        env=env,
        cwd=Path(__file__).parent,
    )
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, (
        f"scenario failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}"
    )
    result = json.loads(lines[-1].removeprefix("RESULT "))
    assert result["killed"] and result["executor_before"] not in (None, "None")
    assert result["all_arrived"] and result["no_pending"]
    assert result["failure"] is None
    assert (result["missing"], result["duplicated"], result["unexpected"]) == (0, 0, 0)


HTTP_SCENARIO = Path(__file__).with_name("http_driver_kill_scenario.py")


def _post(port: int, body: bytes, key: str | None = None) -> tuple[int, dict]:
    request = urllib.request.Request(f"http://127.0.0.1:{port}/ingest", data=body, method="POST")
    if key is not None:
        request.add_header("Idempotency-Key", key)
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, dict(response.headers)
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers)
    except OSError:
        return 0, {}  # nobody listens yet (a driver starting), or the connection broke


def _post_until_answered(port: int, body: bytes, key: str) -> dict:
    """POST with ``key`` again until a 200 (a client retrying); its headers."""
    deadline = time.monotonic() + BOUND_S
    while True:
        status, headers = _post(port, body, key)
        if status == 200:
            return headers
        assert time.monotonic() < deadline, f"{key} never acknowledged (last {status})"
        time.sleep(0.2)


@pytest.mark.timeout(600)
def test_http_keys_of_the_window_survive_a_driver_kill_9_with_get_or_create(tmp_path):
    """Every key the first driver's receiver stored, retried after its driver was killed
    with kill -9 and restarted from the checkpoint, gets its first answer and stores
    nothing: each line ends in the batches' output once."""
    import json

    port = port_for_a_later_server()  # free across the kill and the restart
    ckpt, out = str(tmp_path / "ckpt"), tmp_path / "out"
    env = dict(os.environ, SPARK_LOCAL_IP="127.0.0.1", PYSPARK_PYTHON=sys.executable)
    cmd = [sys.executable, str(HTTP_SCENARIO), "--checkpoint", ckpt, "--out", str(out)]
    cmd += ["--http-port", str(port)]
    logs = [tmp_path / f"driver{i}.log" for i in (1, 2)]

    def start(i: int) -> subprocess.Popen:
        with logs[i].open("w") as log:
            return subprocess.Popen(
                cmd, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True
            )

    def stored() -> Counter:
        counts: Counter = Counter()
        for path in out.glob("batch-*.json"):
            counts.update(json.loads(path.read_text()))
        return counts

    def listening() -> bool:
        return _post(port, b"")[0] == 200  # no key, no records: stores nothing

    requests = {f"request-{i}": [f"req {i} line {j}" for j in range(10)] for i in range(20)}
    bodies = {key: ("\n".join(lines) + "\n").encode() for key, lines in requests.items()}
    sent = [line for lines in requests.values() for line in lines]
    first = start(0)
    second = None
    try:
        wait_until(listening, 180, "the first driver's HTTP receiver")
        for key, body in bodies.items():
            assert "Idempotent-Replayed" not in _post_until_answered(port, body, key)
        wait_until(lambda: set(stored()) >= set(sent), 120, "every line in a batch")
        kill_session(first)
        assert first.returncode == -signal.SIGKILL

        second = start(1)
        wait_until(lambda: "RECOVERED" in logs[1].read_text(), 180, "the recovered driver")
        wait_until(listening, 180, "the recovered driver's HTTP receiver")
        for key, body in bodies.items():  # every client retries, its answer lost in the kill
            headers = _post_until_answered(port, body, key)
            assert headers.get("Idempotent-Replayed") == "true", key
        after = ["after the restart"]
        headers = _post_until_answered(port, b"after the restart\n", "new")
        assert "Idempotent-Replayed" not in headers
        wait_until(lambda: "after the restart" in stored(), 120, "the new request in a batch")
        second.send_signal(signal.SIGTERM)  # stop_gracefully_on_shutdown
        second.wait(90)
        assert second.returncode == 0, logs[1].read_text()[-3000:]
    finally:
        for proc in (first, second):
            if proc is not None and proc.poll() is None:
                kill_session(proc)
    counts = stored()
    assert set(counts) == set(sent + after)  # nothing lost
    assert [v for v, c in counts.items() if c > 1] == []  # nothing twice
