"""Each built-in receiver on a real local Spark, fed by the real server it talks to.

One receiver per StreamingContext at a time (each running receiver holds a
core of the shared local[4] session). The finer behaviours of each receiver
are tested without Spark in tests/receivers/.
"""

from __future__ import annotations

import json
import socket
import sys
import threading
import urllib.error
import urllib.request
import uuid
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "receivers"))

from harness import free_port
from service_fixtures import amqp_url, mosquitto_port, nats_url, redis_url  # noqa: F401
from waiting import wait_until

from spark_receivers import Receiver, StreamingConfig, StreamingContext, StreamingListener
from spark_receivers.context import StreamingError
from spark_receivers.errors import ReceiverError
from spark_receivers.receivers import (
    AmqpReceiver,
    FileTailReceiver,
    GeneratorReceiver,
    HttpReceiver,
    MqttReceiver,
    NatsReceiver,
    RedisStreamReceiver,
    WebSocketReceiver,
)

pytestmark = pytest.mark.spark


class Collected:
    """The batches of one stream, as lists of values, keyed by batch time."""

    def __init__(self) -> None:
        self.batches: dict[int, list[str]] = {}
        self.lock = threading.Lock()

    def __call__(self, df, batch_time_ms: int) -> None:
        values = [r.value for r in df.collect()]
        with self.lock:
            assert batch_time_ms not in self.batches
            self.batches[batch_time_ms] = values

    def values(self) -> list[str]:
        with self.lock:
            return [v for t in sorted(self.batches) for v in self.batches[t]]

    def count(self) -> int:
        with self.lock:
            return sum(len(v) for v in self.batches.values())


def streaming(spark, receiver: Receiver, batch_interval_ms: int = 1000):
    # 1 s batches: on a loaded 2-core machine even an empty batch can take ~0.5 s, and a
    # shorter interval leaves the batches ever further behind the receiver.
    ssc = StreamingContext(spark, batch_interval_ms=batch_interval_ms)
    collected = Collected()
    ssc.receiver_stream(receiver).foreach_batch(collected)
    ssc.start()
    return ssc, collected


def receiver_running(ssc) -> bool:
    receivers = ssc.status().receivers
    return bool(receivers) and all(r.state == "ACTIVE" for r in receivers)


def test_generator_receiver_delivers_exactly_its_lines(spark):
    receiver = GeneratorReceiver(total=20_000, chunk=2_000)
    ssc, collected = streaming(spark, receiver)
    try:
        assert wait_until(lambda: collected.count() >= 20_000, 120), collected.count()
    finally:
        ssc.stop(graceful=True)
    assert collected.values() == receiver.expected()


def post(port: int, body: bytes, token: str | None = None) -> int:
    request = urllib.request.Request(f"http://127.0.0.1:{port}/ingest", data=body, method="POST")
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status
    except urllib.error.HTTPError as e:
        return e.code


def test_http_receiver_acknowledged_posts_arrive_in_batches(spark):
    port = free_port()
    ssc, collected = streaming(spark, HttpReceiver(port=port, token="t0ken"))
    try:

        def up() -> bool:
            try:
                return post(port, b"", "t0ken") == 200
            except OSError:
                return False

        assert wait_until(up, 60), "the HTTP receiver never listened"
        assert post(port, b"unauthorized\n") == 401
        sent = []
        for i in range(20):
            lines = [f"req {i} line {j}" for j in range(100)]
            assert post(port, ("\n".join(lines) + "\n").encode(), "t0ken") == 200
            sent.extend(lines)
        assert post(port, b"bad \xff\n", "t0ken") == 400
        # every acknowledged line was already stored, so it is in a batch soon
        assert wait_until(lambda: collected.count() >= len(sent), 30), collected.count()
    finally:
        ssc.stop(graceful=True)
    values = collected.values()
    assert values == sent  # sequential requests: in order, each exactly once


def test_file_tail_receiver_follows_appends_and_new_files(spark, tmp_path):
    first = tmp_path / "a.log"
    first.write_text("".join(f"a{i}\n" for i in range(1000)))
    ssc, collected = streaming(spark, FileTailReceiver(str(tmp_path), "*.log", poll_interval_ms=50))
    try:
        assert wait_until(lambda: collected.count() >= 1000, 120), collected.count()
        with first.open("a") as f:
            f.write("".join(f"a{i}\n" for i in range(1000, 1500)) + "partial")
        (tmp_path / "b.log").write_text("".join(f"b{i}\n" for i in range(300)))
        assert wait_until(lambda: collected.count() >= 1800, 30), collected.count()
    finally:
        ssc.stop(graceful=True)
    values = collected.values()
    assert sorted(values) == sorted([f"a{i}" for i in range(1500)] + [f"b{i}" for i in range(300)])
    offsets = json.loads((tmp_path / ".spark-receivers-offsets" / "stream-0.json").read_text())
    assert sorted(f["offset"] for f in offsets["files"].values()) == sorted(
        [(tmp_path / "b.log").stat().st_size, first.stat().st_size - len("partial")]
    )


def test_redis_stream_receiver_stores_then_acks_every_entry(spark, redis_url):  # noqa: F811
    import redis

    stream, group = f"it-{uuid.uuid4().hex[:8]}", "spark"
    client = redis.Redis.from_url(redis_url, decode_responses=True)
    receiver = RedisStreamReceiver(stream, group, url=redis_url, block_ms=200)
    ssc, collected = streaming(spark, receiver)
    try:
        sent = [f"entry {i}" for i in range(3000)]
        pipe = client.pipeline()
        for v in sent:
            pipe.xadd(stream, {"value": v})
        pipe.execute()
        assert wait_until(lambda: collected.count() >= len(sent), 120), collected.count()
        assert wait_until(lambda: client.xpending(stream, group)["pending"] == 0, 10)
    finally:
        ssc.stop(graceful=True)
        client.close()
    assert collected.values() == sent


def test_mqtt_receiver_delivers_every_qos1_message(spark, mosquitto_port):  # noqa: F811
    import paho.mqtt.client as mqtt

    topic = f"it/{uuid.uuid4().hex[:8]}"
    receiver = MqttReceiver("127.0.0.1", mosquitto_port, topic, client_id=f"it-{topic}")
    ssc, collected = streaming(spark, receiver)
    publisher = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2)
    publisher.connect("127.0.0.1", mosquitto_port)
    publisher.loop_start()
    try:
        assert wait_until(lambda: receiver_running(ssc), 60)

        # the subscription is made from the executor once connected: probe until one arrives
        def probe_arrived() -> bool:
            publisher.publish(topic, "probe", qos=1).wait_for_publish(5)
            return wait_until(lambda: "probe" in collected.values(), 1.5)

        assert wait_until(probe_arrived, 60), "the MQTT receiver never subscribed"
        sent = [f"msg {i}" for i in range(1000)]
        for info in [publisher.publish(topic, v, qos=1) for v in sent]:
            info.wait_for_publish(10)
        assert wait_until(
            lambda: len([v for v in collected.values() if v != "probe"]) >= len(sent), 60
        )
    finally:
        ssc.stop(graceful=True)
        publisher.disconnect()
        publisher.loop_stop()
    assert [v for v in collected.values() if v != "probe"] == sent


def test_amqp_receiver_stores_then_acks_every_message(spark, amqp_url):  # noqa: F811
    import pika

    queue = f"it-{uuid.uuid4().hex[:8]}"
    with pika.BlockingConnection(pika.URLParameters(amqp_url)) as conn:
        conn.channel().queue_declare(queue, durable=True)
    receiver = AmqpReceiver(amqp_url, queue, batch_wait_ms=50)
    ssc, collected = streaming(spark, receiver)
    sent = [f"msg {i}" for i in range(2000)]
    try:
        with pika.BlockingConnection(pika.URLParameters(amqp_url)) as conn:
            ch = conn.channel()
            ch.confirm_delivery()
            for v in sent:
                ch.basic_publish("", queue, v.encode(), pika.BasicProperties(delivery_mode=2))
        assert wait_until(lambda: collected.count() >= len(sent), 120), collected.count()
    finally:
        ssc.stop(graceful=True)
    assert collected.values() == sent
    with pika.BlockingConnection(pika.URLParameters(amqp_url)) as conn:
        assert conn.channel().queue_declare(queue, passive=True).method.message_count == 0


def test_nats_receiver_stores_then_acks_every_message(spark, nats_url):  # noqa: F811
    import asyncio

    import nats

    stream = f"it-{uuid.uuid4().hex[:8]}"
    creds, server = nats_url.split("//")[1].split("@")
    user, password = creds.split(":")

    async def publish(values: list[str]) -> None:
        nc = await nats.connect(f"nats://{server}", user=user, password=password)
        try:
            js = nc.jetstream()
            await js.add_stream(name=stream, subjects=[f"{stream}.>"])
            for v in values:
                await js.publish(f"{stream}.a", v.encode())
        finally:
            await nc.close()

    sent = [f"msg {i}" for i in range(2000)]
    asyncio.run(publish(sent[:1000]))  # before the start: the durable consumer reads them
    receiver = NatsReceiver(nats_url, stream, fetch_wait_ms=100)
    ssc, collected = streaming(spark, receiver)
    try:
        asyncio.run(publish(sent[1000:]))
        assert wait_until(lambda: collected.count() >= len(sent), 120), collected.count()
    finally:
        ssc.stop(graceful=True)
    assert collected.values() == sent


def test_websocket_receiver_delivers_what_the_feed_sends(spark):
    from websockets.sync.server import serve

    subscribed = threading.Event()
    sent = [f"tick {i}" for i in range(2000)]

    def handler(ws) -> None:
        if ws.recv() == "subscribe":  # the receiver's first message on the connection
            subscribed.set()
            for v in sent:
                ws.send(v)
            ws.recv()  # until the receiver goes

    port = free_port()
    server = serve(handler, "127.0.0.1", port)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    receiver = WebSocketReceiver(f"ws://127.0.0.1:{port}/", subscribe="subscribe")
    ssc, collected = streaming(spark, receiver)
    try:
        assert subscribed.wait(120)
        assert wait_until(lambda: collected.count() >= len(sent), 120), collected.count()
    finally:
        ssc.stop(graceful=True)
        server.shutdown()
    assert collected.values() == sent


def test_mqtt_job_restarted_from_its_checkpoint_gets_what_was_published_while_down(
    spark,
    mosquitto_port,  # noqa: F811
    tmp_path,
):
    """No client_id given: the id comes from the job id the checkpoint keeps, through the
    launcher and the supervisor on the executor, so the restarted job resumes its own
    persistent session, even moved to another path (issue 36: named after the path, two
    pods' jobs shared one); and its retained message is stored once, not at every start."""
    import paho.mqtt.client as mqtt

    topic = f"it/{uuid.uuid4().hex[:8]}"
    publisher = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2)
    publisher.connect("127.0.0.1", mosquitto_port)
    publisher.loop_start()
    publisher.publish(topic, "retained state", qos=1, retain=True).wait_for_publish(10)

    def run_job(checkpoint: str) -> tuple[StreamingContext, Collected]:
        ssc = StreamingContext(spark, batch_interval_ms=1000, checkpoint_dir=checkpoint)
        collected = Collected()
        ssc.receiver_stream(MqttReceiver("127.0.0.1", mosquitto_port, topic)).foreach_batch(
            collected
        )
        ssc.start()
        assert wait_until(lambda: receiver_running(ssc), 60)
        return ssc, collected

    def subscribed(collected: Collected) -> bool:
        publisher.publish(topic, "probe", qos=1).wait_for_publish(5)
        return wait_until(lambda: "probe" in collected.values(), 1.5)

    runs: list[list[str]] = []
    checkpoint = tmp_path / "ck"
    try:
        ssc, collected = run_job(str(checkpoint))
        try:
            assert wait_until(lambda: subscribed(collected), 60), "never subscribed"
        finally:
            ssc.stop(graceful=True)
        runs.append(collected.values())
        sent = [f"while down {i}" for i in range(100)]
        for info in [publisher.publish(topic, v, qos=1) for v in sent]:
            info.wait_for_publish(10)
        moved = tmp_path / "moved" / "ck"  # the job's volume, mounted elsewhere
        moved.parent.mkdir()
        checkpoint.rename(moved)
        ssc, collected = run_job(str(moved))
        try:
            assert wait_until(lambda: collected.count() >= len(sent), 60), collected.values()
        finally:
            ssc.stop(graceful=True)
        runs.append(collected.values())
        ssc, collected = run_job(str(moved))  # a third start: no retained message again
        try:
            assert wait_until(lambda: subscribed(collected), 60), "never subscribed"
        finally:
            ssc.stop(graceful=True)
        runs.append(collected.values())
    finally:
        publisher.publish(topic, b"", qos=1, retain=True).wait_for_publish(10)
        publisher.disconnect()
        publisher.loop_stop()
    assert [v for v in runs[1] if v != "probe"] == sent
    everything = [v for run in runs for v in run if v != "probe"]
    assert everything.count("retained state") == 1, runs


def test_a_receiver_that_always_fails_fails_the_context_with_the_cause(spark):
    """An HTTP receiver on a port already in use: not a restart loop for ever, but a
    failed context whose error names the cause, also reported in the listener."""
    taken = socket.create_server(("127.0.0.1", 0))
    port = taken.getsockname()[1]
    errors: list[str] = []

    class Errors(StreamingListener):
        def on_receiver_error(self, info) -> None:
            errors.append(info.last_error_message)

    config = StreamingConfig(receiver_max_restarts=2, receiver_restart_window_s=120.0)
    ssc = StreamingContext(spark, batch_interval_ms=1000, config=config)
    ssc.add_streaming_listener(Errors())
    receiver = HttpReceiver("127.0.0.1", port, backoff_base_ms=100, max_backoff_ms=200)
    ssc.receiver_stream(receiver).foreach_batch(lambda df, t: None)
    try:
        ssc.start()
        with pytest.raises(StreamingError) as failed:
            ssc.await_termination(timeout_s=180)  # bounded; returns False only if it never fails
    finally:
        ssc.stop(graceful=False)
        taken.close()
    text = str(failed.value)
    assert f"cannot listen on 127.0.0.1:{port}" in text
    assert "failed 3 times" in text and "spark.receivers.receiver.maxRestarts=2" in text
    assert isinstance(failed.value.__cause__, ReceiverError)
    assert any("is not restarted again" in e for e in errors)
    assert ssc.status().failure is not None
