"""kill -9 of each reliable built-in receiver's worker mid-stream, on real Spark (issue 9).

Each test runs the receiver with the receiver WAL on, feeds its real source while the
receiver's Python worker is killed with SIGKILL once records flow, and checks that at
the end every message the source holds (every line of the files, every entry of the
Redis stream, every QoS 1 message, every message an AMQP queue or a JetStream stream
confirmed, every acknowledged POST) is in some batch's output:
at least once. The tracker relaunches the receiver; batches read the blocks of the dead
worker from the WAL.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "receivers"))

from harness import free_port
from processes import wait_until
from service_fixtures import amqp_url, mosquitto_port, nats_url, redis_url  # noqa: F401

from spark_receivers import Receiver, StreamingConfig, StreamingContext
from spark_receivers.receivers import (
    AmqpReceiver,
    FileTailReceiver,
    HttpReceiver,
    MqttReceiver,
    NatsReceiver,
    RedisStreamReceiver,
)

pytestmark = pytest.mark.spark


class Collected:
    def __init__(self) -> None:
        self.values: list[str] = []
        self.lock = threading.Lock()

    def __call__(self, df, batch_time_ms: int) -> None:
        rows = [r.value for r in df.collect()]
        with self.lock:
            self.values.extend(rows)

    def distinct(self) -> set[str]:
        with self.lock:
            return set(self.values)


def listening_pid(port: int) -> int | None:
    """The process with a socket listening on 127.0.0.1:``port`` (from /proc)."""
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(OSError), open(table) as f:
            for line in f.read().splitlines()[1:]:
                fields = line.split()
                if int(fields[1].rsplit(":", 1)[1], 16) == port and fields[3] == "0A":
                    inodes.add(f"socket:[{fields[9]}]")
    for pid in filter(str.isdigit, os.listdir("/proc")):
        with contextlib.suppress(OSError):
            for fd in os.listdir(f"/proc/{pid}/fd"):
                with contextlib.suppress(OSError):
                    if os.readlink(f"/proc/{pid}/fd/{fd}") in inodes:
                        return int(pid)
    return None


def kill_receiver_worker(ssc: StreamingContext) -> int:
    """SIGKILL the Python worker running stream 0's receiver (it serves its blocks)."""
    endpoint = ssc.status().receiver(0).endpoint
    assert endpoint, "the receiver has not registered"
    pid = listening_pid(int(endpoint.rsplit(":", 1)[1]))
    assert pid is not None and pid != os.getpid(), f"no worker serving {endpoint}"
    os.kill(pid, signal.SIGKILL)
    return pid


def run_with_a_kill(
    spark,
    tmp_path,
    receiver: Receiver,
    feed: Callable[[Collected], set[str]],
    enough: int,
) -> tuple[set[str], Collected]:
    """Start ``receiver`` (WAL on), run ``feed(collected)`` on a thread, kill the worker
    after ``enough`` records arrived, wait for everything ``feed`` returns, stop."""
    config = StreamingConfig(
        receiver_wal_enabled=True, receiver_restart_delay_ms=300, receiver_drain_timeout_s=10.0
    )
    ssc = StreamingContext(spark, 1000, checkpoint_dir=str(tmp_path / "ckpt"), config=config)
    collected = Collected()
    ssc.receiver_stream(receiver).foreach_batch(collected)
    ssc.start()
    fed: list[set[str]] = []
    feeder = threading.Thread(target=lambda: fed.append(feed(collected)), daemon=True)
    try:
        feeder.start()
        wait_until(lambda: len(collected.distinct()) >= enough, 120, f"{enough} records")
        jobs = ssc.status().receiver(0).jobs
        kill_receiver_worker(ssc)
        wait_until(lambda: ssc.status().receiver(0).jobs > jobs, 60, "a relaunch")
        feeder.join(180)
        assert fed, "the feeder did not finish"
        expected = fed[0]
        wait_until(lambda: expected <= collected.distinct(), 120, "every message in a batch")
    finally:
        ssc.stop(graceful=True)
    return expected, collected


def test_file_tail_receiver_survives_kill_9(spark, tmp_path):
    data = tmp_path / "data"
    data.mkdir()

    def feed(_: Collected) -> set[str]:
        lines = set()
        for name in ("a.log", "b.log"):
            with (data / name).open("a") as f:
                for chunk in range(20):
                    batch = [f"{name}-{chunk}-{i}" for i in range(100)]
                    f.write("".join(x + "\n" for x in batch))
                    f.flush()
                    lines.update(batch)
                    time.sleep(0.1)
        return lines

    receiver = FileTailReceiver(str(data), "*.log", poll_interval_ms=50)
    expected, _ = run_with_a_kill(spark, tmp_path, receiver, feed, enough=500)
    assert len(expected) == 4000


def test_redis_stream_receiver_survives_kill_9(spark, tmp_path, redis_url):  # noqa: F811
    import redis

    stream, group = f"kill-{uuid.uuid4().hex[:8]}", "spark"
    client = redis.Redis.from_url(redis_url, decode_responses=True)

    def feed(_: Collected) -> set[str]:
        sent = set()
        for chunk in range(30):
            pipe = client.pipeline()
            for i in range(100):
                pipe.xadd(stream, {"value": f"entry {chunk} {i}"})
                sent.add(f"entry {chunk} {i}")
            pipe.execute()
            time.sleep(0.1)
        return sent

    receiver = RedisStreamReceiver(stream, group, url=redis_url, block_ms=200)
    try:
        expected, _ = run_with_a_kill(spark, tmp_path, receiver, feed, enough=500)
        assert len(expected) == 3000
        # Everything stored was acknowledged in the end (pending entries were claimed).
        wait_until(lambda: client.xpending(stream, group)["pending"] == 0, 30, "no pending")
    finally:
        client.close()


def test_mqtt_receiver_survives_kill_9(spark, tmp_path, mosquitto_port):  # noqa: F811
    import paho.mqtt.client as mqtt

    topic = f"kill/{uuid.uuid4().hex[:8]}"
    publisher = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2)
    publisher.connect("127.0.0.1", mosquitto_port)
    publisher.loop_start()

    def feed(collected: Collected) -> set[str]:
        # The subscription is made from the executor: probe until one arrives.
        deadline = time.monotonic() + 90
        while "probe" not in collected.distinct():
            assert time.monotonic() < deadline, "the MQTT receiver never subscribed"
            publisher.publish(topic, "probe", qos=1).wait_for_publish(5)
            time.sleep(1.0)
        sent = set()
        for chunk in range(30):
            infos = [publisher.publish(topic, f"msg {chunk} {i}", qos=1) for i in range(50)]
            for info in infos:
                info.wait_for_publish(10)
            sent.update(f"msg {chunk} {i}" for i in range(50))
            time.sleep(0.1)
        return sent

    receiver = MqttReceiver("127.0.0.1", mosquitto_port, topic, client_id=f"kill-{topic}")
    try:
        expected, _ = run_with_a_kill(spark, tmp_path, receiver, feed, enough=300)
        assert len(expected) == 1500
    finally:
        publisher.loop_stop()
        publisher.disconnect()


def test_http_receiver_acknowledged_posts_survive_kill_9(spark, tmp_path):
    port = free_port()

    def post(body: bytes) -> int:
        request = urllib.request.Request(
            f"http://127.0.0.1:{port}/ingest", data=body, method="POST"
        )
        request.add_header("Authorization", "Bearer k1ll")
        try:
            with urllib.request.urlopen(request, timeout=10) as response:
                return response.status
        except urllib.error.HTTPError as e:
            return e.code
        except OSError:
            return 0  # not listening (the receiver is restarting)

    def feed(_: Collected) -> set[str]:
        acked = set()
        for i in range(60):
            lines = [f"req {i} line {j}" for j in range(50)]
            body = ("\n".join(lines) + "\n").encode()
            deadline = time.monotonic() + 90
            while post(body) != 200:  # a client retries until acknowledged
                assert time.monotonic() < deadline, f"request {i} never acknowledged"
                time.sleep(0.2)
            acked.update(lines)
            time.sleep(0.05)
        return acked

    receiver = HttpReceiver(port=port, token="k1ll")
    expected, _ = run_with_a_kill(spark, tmp_path, receiver, feed, enough=500)
    assert len(expected) == 3000


def test_amqp_receiver_survives_kill_9(spark, tmp_path, amqp_url):  # noqa: F811
    import pika

    queue = f"kill-{uuid.uuid4().hex[:8]}"
    with pika.BlockingConnection(pika.URLParameters(amqp_url)) as conn:
        conn.channel().queue_declare(queue, durable=True)

    def feed(_: Collected) -> set[str]:
        sent = set()
        with pika.BlockingConnection(pika.URLParameters(amqp_url)) as conn:
            ch = conn.channel()
            ch.confirm_delivery()  # each message is the broker's before the next
            for chunk in range(30):
                for i in range(100):
                    body = f"msg {chunk} {i}"
                    ch.basic_publish(
                        "", queue, body.encode(), pika.BasicProperties(delivery_mode=2)
                    )
                    sent.add(body)
                conn.sleep(0.1)
        return sent

    receiver = AmqpReceiver(amqp_url, queue, batch_wait_ms=50)
    expected, _ = run_with_a_kill(spark, tmp_path, receiver, feed, enough=500)
    assert len(expected) == 3000

    def queue_empty() -> bool:
        with pika.BlockingConnection(pika.URLParameters(amqp_url)) as conn:
            ok = conn.channel().queue_declare(queue, passive=True)
            return ok.method.message_count == 0

    # what the killed worker had unacked was requeued, delivered again and acked
    wait_until(queue_empty, 30, "an empty queue")


def test_nats_receiver_survives_kill_9(spark, tmp_path, nats_url):  # noqa: F811
    import asyncio

    import nats

    stream = f"kill-{uuid.uuid4().hex[:8]}"
    creds, server = nats_url.split("//")[1].split("@")
    user, password = creds.split(":")

    async def publish_all() -> set[str]:
        nc = await nats.connect(f"nats://{server}", user=user, password=password)
        sent = set()
        try:
            js = nc.jetstream()
            await js.add_stream(name=stream, subjects=[f"{stream}.>"])
            for chunk in range(30):
                for i in range(100):
                    await js.publish(f"{stream}.a", f"msg {chunk} {i}".encode())  # stored
                    sent.add(f"msg {chunk} {i}")
                await asyncio.sleep(0.1)
        finally:
            await nc.close()
        return sent

    # AckWait of 2 s: what the killed worker fetched and never acked comes again soon
    receiver = NatsReceiver(nats_url, stream, durable="kill", fetch_wait_ms=100, ack_wait_s=2.0)
    expected, _ = run_with_a_kill(
        spark, tmp_path, receiver, lambda _: asyncio.run(publish_all()), enough=500
    )
    assert len(expected) == 3000
