"""MqttReceiver against a real mosquitto (scripts/services.sh, 127.0.0.1)."""

from __future__ import annotations

import base64
import json
import os
import subprocess
import threading
import uuid
from datetime import UTC, datetime
from pathlib import Path

import paho.mqtt.client as mqtt
import pyarrow as pa
import pytest
from harness import HarnessSupervisor
from waiting import wait_until

from spark_receivers.driver.job_identity import checkpoint_job_id
from spark_receivers.errors import ConfigError
from spark_receivers.receiver.schema import DEFAULT_SCHEMA
from spark_receivers.receiver.source_support import JobName
from spark_receivers.receivers import MqttReceiver
from spark_receivers.receivers.mqtt_records import batch_columns
from spark_receivers.receivers.mqtt_session import Drop, TakeoverDetector


@pytest.fixture
def publisher(mosquitto_port):
    client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=f"pub-{uuid.uuid4().hex}")
    client.connect("127.0.0.1", mosquitto_port)
    client.loop_start()
    yield client
    client.disconnect()
    client.loop_stop()


def publish(client, topic, payloads, qos=1) -> None:
    infos = [client.publish(topic, p, qos=qos) for p in payloads]
    for info in infos:
        info.wait_for_publish(10)


def names() -> tuple[str, str]:
    tag = uuid.uuid4().hex[:8]
    return f"test/{tag}", f"receiver-{tag}"


def start(receiver: MqttReceiver) -> HarnessSupervisor:
    sup = HarnessSupervisor(receiver).start()
    assert receiver.wait_subscribed(10), "receiver did not subscribe"
    return sup


def start_as(receiver: MqttReceiver, job: JobName) -> HarnessSupervisor:
    """Start ``receiver`` as a task of ``job`` (stream 0)."""
    sup = HarnessSupervisor(receiver, job_id=job.job_id, app_id=job.app_id).start()
    assert receiver.wait_subscribed(10), "receiver did not subscribe"
    return sup


def test_published_qos1_messages_all_arrive_in_order_and_are_acked(mosquitto_port, publisher):
    topic, client_id = names()
    receiver = MqttReceiver("127.0.0.1", mosquitto_port, topic, client_id=client_id)
    sup = start(receiver)
    try:
        payloads = [f"m{i}" for i in range(500)]
        publish(publisher, topic, payloads)
        assert sup.wait_for(500) == payloads
        assert wait_until(lambda: receiver.messages_acked == 500, 5)
        assert len(sup.reliable_batches) < 500  # messages were batched into fewer stores
    finally:
        sup.shutdown()


def test_messages_published_while_stopped_arrive_after_restart(mosquitto_port, publisher):
    topic, client_id = names()
    receiver = MqttReceiver("127.0.0.1", mosquitto_port, topic, client_id=client_id)
    sup = start(receiver)
    sup.shutdown()  # the persistent session keeps the subscription
    publish(publisher, topic, ["while away 1", "while away 2"])
    again = MqttReceiver("127.0.0.1", mosquitto_port, topic, client_id=client_id)
    sup2 = start(again)
    try:
        assert sup2.wait_for(2) == ["while away 1", "while away 2"]
    finally:
        sup2.shutdown()


@pytest.mark.parametrize("qos", [1, 2])
def test_a_message_whose_store_failed_is_redelivered(mosquitto_port, publisher, qos):
    """At QoS 2 too (issue 36): paho answers PUBREC before the receiver has the message,
    after which the broker only repeats PUBREL; subscribed at QoS 1 it is redelivered."""
    topic, client_id = names()
    receiver = MqttReceiver("127.0.0.1", mosquitto_port, topic, client_id=client_id, qos=qos)
    sup = start(receiver)
    try:
        sup.fail_stores = OSError("driver unreachable")
        publish(publisher, topic, ["precious"], qos=qos)
        assert wait_until(lambda: sup.restarts, 10)
        assert receiver.messages_acked == 0
        sup.fail_stores = None
        assert sup.wait_for(1, 20) == ["precious"]  # the broker sent it again
    finally:
        sup.shutdown()


def test_what_is_published_between_the_start_and_the_receivers_connection_waits_for_it(
    mosquitto_port, publisher
):
    """The context opens the session at start (prepare_source, on the driver): a receiver's
    task connects seconds or minutes later, and a broker keeps for a subscriber only what is
    published once its subscription exists (issue 36: a burst right after start was lost)."""
    topic, _ = names()
    job = JobName(job_id=uuid.uuid4().hex[:16])
    receiver = MqttReceiver("127.0.0.1", mosquitto_port, topic)
    receiver._stream_id = 0  # as the context numbers it
    receiver.prepare_source(job)  # StreamingContext.start()
    publish(publisher, topic, [f"early {i}" for i in range(300)])
    sup = start_as(receiver, job)
    try:
        assert sup.wait_for(300) == [f"early {i}" for i in range(300)]
        assert receiver.client_name == f"spark-receivers-{job.job_id}-0"
    finally:
        sup.shutdown()


def test_a_retained_message_is_stored_once_per_job_not_at_every_start(mosquitto_port, publisher):
    """3 starts of one job (its checkpoint's job id) store the retained message once."""
    topic, _ = names()
    publisher.publish(topic, "retained state", qos=1, retain=True).wait_for_publish(10)
    job = JobName(job_id=uuid.uuid4().hex[:16])
    stored = []
    try:
        for run in range(3):
            receiver = MqttReceiver("127.0.0.1", mosquitto_port, topic)
            receiver._stream_id = 0
            receiver.prepare_source(job)  # each start of the job, as the context does
            sup = start_as(receiver, job)
            publish(publisher, topic, [f"run {run}"])
            stored += sup.wait_for(1 if run else 2)
            acked = len(sup.records)  # then shut down: an unacked one would come again
            assert wait_until(lambda r=receiver, n=acked: r.messages_acked == n, 5)
            sup.shutdown()
        assert stored == ["retained state", "run 0", "run 1", "run 2"]
    finally:
        publisher.publish(topic, b"", qos=1, retain=True).wait_for_publish(10)  # clear it


@pytest.fixture(scope="module")
def stock_mosquitto(tmp_path_factory):
    """A mosquitto with its own defaults for the queues: 20 in flight, 1000 queued."""
    root = tmp_path_factory.mktemp("stock-mosquitto")
    (root / "stock.conf").write_text("max_inflight_messages 20\nmax_queued_messages 1000\n")
    env = {
        **os.environ,
        "SPARK_RECEIVERS_SERVICES_DIR": str(root / "services"),
        "SPARK_RECEIVERS_MOSQUITTO_CONF": str(root / "stock.conf"),
    }
    script = Path(__file__).resolve().parents[2] / "scripts" / "services.sh"
    done = subprocess.run(
        ["bash", str(script), "start", "mosquitto"], env=env, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    yield int(done.stdout.split()[-1])
    subprocess.run(["bash", str(script), "stop", "mosquitto"], env=env, capture_output=True)


def test_a_burst_waits_in_flight_for_the_receiver_not_in_the_brokers_queue(stock_mosquitto):
    """mosquitto's defaults keep 20 messages in flight to a client and queue 1000 more,
    dropping the rest. A receiver acks a batch only once it is stored (slower than a
    client that acks on receipt), so a burst piled up in the queue and was dropped past
    it while a control subscriber on the same broker lost nothing (issue 36: 1,560 of
    3,000). The receiver asks for max_batch in flight (MQTT 5 Receive Maximum)."""
    topic, client_id = names()
    receiver = MqttReceiver("127.0.0.1", stock_mosquitto, topic, client_id=client_id)
    sup = start(receiver)
    sup.store_delay_s = 0.3  # a reliable store of a busy job
    got: list[str] = []
    control = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=f"control-{client_id}")
    control.on_message = lambda c, u, m: got.append(m.payload.decode())
    subscribed = threading.Event()
    control.on_subscribe = lambda *_: subscribed.set()
    control.connect("127.0.0.1", stock_mosquitto)
    control.loop_start()
    control.subscribe(topic, 1)
    pub = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=f"pub-{client_id}")
    pub.connect("127.0.0.1", stock_mosquitto)
    pub.loop_start()
    try:
        assert subscribed.wait(10)
        payloads = [f"m{i}" for i in range(1500)]
        publish(pub, topic, payloads)
        assert sup.wait_for(1500, 60) == payloads
        assert wait_until(lambda: len(got) == 1500, 10)
    finally:
        sup.shutdown()
        for client in (control, pub):
            client.disconnect()
            client.loop_stop()


def test_topic_and_payload_columns_under_a_declared_schema(mosquitto_port, publisher):
    topic, client_id = names()
    schema = pa.schema([("topic", pa.string()), ("payload", pa.string())])
    receiver = MqttReceiver(
        "127.0.0.1", mosquitto_port, topic + "/#", client_id=client_id, schema=schema
    )
    sup = start(receiver)
    try:
        publish(publisher, topic + "/a", ["x"])
        assert sup.wait_for(1) == [{"topic": topic + "/a", "payload": "x"}]
    finally:
        sup.shutdown()


def test_all_four_columns_of_a_declared_schema_arrive_as_arrow(mosquitto_port, publisher):
    topic, client_id = names()
    schema = pa.schema(
        [
            ("topic", pa.string()),
            ("payload", pa.string()),
            ("qos", pa.int8()),
            ("retain", pa.bool_()),
        ]
    )
    receiver = MqttReceiver(
        "127.0.0.1", mosquitto_port, topic + "/#", client_id=client_id, schema=schema
    )
    sup = start(receiver)
    try:
        publish(publisher, topic + "/a", [f"m{i}" for i in range(50)])
        rows = sup.wait_for(50)
        assert rows == [
            {"topic": topic + "/a", "payload": f"m{i}", "qos": 1, "retain": False}
            for i in range(50)
        ]
        assert wait_until(lambda: receiver.messages_acked == 50, 5)
    finally:
        sup.shutdown()


def _arrivals(*messages: tuple[bytes, bytes, int, bool]) -> list:
    """What the receiver's paho callback queues for these (payload, topic, qos, retain)."""
    receiver = MqttReceiver("127.0.0.1", 1883, "t/#")
    for i, (payload, topic, qos, retain) in enumerate(messages):
        message = mqtt.MQTTMessage(i + 1, topic)  # as paho makes it for a PUBLISH it read
        message.payload, message.qos, message.retain = payload, qos, retain
        receiver._on_message(None, None, message)
    return list(receiver._arrivals)


def test_a_batch_of_payloads_is_one_arrow_array_checked_by_arrow():
    good = [(b"a", b"t/a", 1, False), ("é".encode(), b"t/a", 1, False)]
    default = DEFAULT_SCHEMA
    assert batch_columns(_arrivals(*good), default, True, 100).to_pylist() == ["a", "é"]
    bad_utf8 = _arrivals(*good, (b"x\xff", b"t/a", 1, False))
    assert batch_columns(bad_utf8, default, True, 100) is None
    too_long = _arrivals(*good, (b"y" * 101, b"t/a", 1, False))
    assert batch_columns(too_long, default, True, 100) is None
    schema = pa.schema([("retain", pa.bool_()), ("qos", pa.int64()), ("topic", pa.string())])
    table = batch_columns(_arrivals((b"a", b"t/b", 0, True)), schema, False, 100)
    assert table.to_pylist() == [{"retain": True, "qos": 0, "topic": "t/b"}]
    # a type the per-message check decides: message by message, which names the message
    odd = pa.schema([("qos", pa.string())])
    assert batch_columns(_arrivals(*good), odd, False, 100) is None


@pytest.mark.parametrize(
    ("topic", "rule"),
    [
        ("a/#/b", "'#' must be the last level"),
        ("logs#", "'#' must stand alone in its level"),
        ("sensors/a+/temp", "'+' must stand alone in a level"),
        ("+a", "'+' must stand alone in a level"),
        ("", "non-empty"),
        ("a/\x00", "U+0000"),
        ("x" * 65_536, "longer than 65,535 bytes"),
        ("$share//t", "a shared subscription"),
        ("$share/g", "needs a filter after the group"),
        ("$share/g+/t", "a shared subscription"),
        ("$share/g/a/#/b", "'#' must be the last level"),
    ],
)
def test_an_invalid_topic_filter_is_refused_when_the_receiver_is_made(topic, rule):
    with pytest.raises(ConfigError, match="invalid MQTT topic filter") as refused:
        MqttReceiver("127.0.0.1", 1883, topic)
    assert rule in str(refused.value)


@pytest.mark.parametrize("topic", ["#", "a/#", "+", "+/+/#", "a/+/b", "/a//b/", "$share/g/a/+"])
def test_valid_topic_filters_are_taken(topic):
    assert MqttReceiver("127.0.0.1", 1883, topic).topic == topic


def test_bad_options_are_refused():
    with pytest.raises(ConfigError, match="qos"):
        MqttReceiver("h", 1883, "t", qos=3)
    with pytest.raises(ConfigError, match="fields among"):
        MqttReceiver("h", 1883, "t", schema=pa.schema([("nope", pa.string())]))


# --- the session: whose it is, and what happens when two clients want it ----------------


def test_two_jobs_at_once_and_one_restarted_each_get_exactly_their_own(
    mosquitto_port, publisher, tmp_path
):
    """Two ``ingest`` jobs, both stream 0, each with its checkpoint: two sessions, not one."""
    tag = uuid.uuid4().hex[:8]
    topic_a, topic_b = f"jobs/{tag}/a", f"jobs/{tag}/b"
    ck_a, ck_b = str(tmp_path / "ck-a"), str(tmp_path / "ck-b")

    def job(topic, checkpoint):
        receiver = MqttReceiver("127.0.0.1", mosquitto_port, topic)
        sup = HarnessSupervisor(receiver, checkpoint_dir=checkpoint).start()
        assert receiver.wait_subscribed(10)
        return receiver, sup

    a, sup_a = job(topic_a, ck_a)
    b, sup_b = job(topic_b, ck_b)
    try:
        assert a.client_name != b.client_name
        assert a.client_name.startswith("spark-receivers-") and a.client_name.endswith("-0")
        publish(publisher, topic_a, [f"a{i}" for i in range(300)])
        publish(publisher, topic_b, [f"b{i}" for i in range(300)])
        assert sup_a.wait_for(300) == [f"a{i}" for i in range(300)]
        assert sup_b.wait_for(300) == [f"b{i}" for i in range(300)]
        # job A goes down; what is published meanwhile waits in A's session only
        sup_a.shutdown()
        publish(publisher, topic_a, [f"while down {i}" for i in range(200)])
        publish(publisher, topic_b, [f"b more {i}" for i in range(50)])
        again, sup_again = job(topic_a, ck_a)  # restarted from the same checkpoint
        assert again.client_name == a.client_name
        assert sup_again.wait_for(200) == [f"while down {i}" for i in range(200)]
        assert sup_b.wait_for(350)[300:] == [f"b more {i}" for i in range(50)]
        assert wait_until(lambda: again.messages_acked == 200, 5)
        publisher.publish(topic_a, "last", qos=1).wait_for_publish(10)
        assert sup_again.wait_for(201)[-1] == "last"
        assert len(sup_again.records) == 201 and len(sup_b.records) == 350  # nothing extra
        assert sup_a.errors == sup_b.errors == sup_again.errors == []
        sup_again.shutdown()
    finally:
        sup_a.shutdown()
        sup_b.shutdown()


def test_two_pods_with_their_own_checkpoint_at_the_same_path_keep_their_own_sessions(
    mosquitto_port, publisher, tmp_path
):
    """Every pod of a deployment mounts its own volume at one path (issue 36): two jobs.

    Simulated with one path string and two directories: pod A's volume is made at the
    path, moved aside, and pod B's is made at the same path. Named after the path, both
    jobs had one client id, kicked each other off the broker and lost acked messages.
    """
    tag = uuid.uuid4().hex[:8]
    mount = tmp_path / "ckpt"
    mount.mkdir()
    id_a = checkpoint_job_id(str(mount))  # pod A's first start writes its id
    mount.rename(tmp_path / "volume-a")
    mount.mkdir()  # pod B's volume, at the same path
    id_b = checkpoint_job_id(str(mount))
    assert id_a != id_b

    def job(topic, job_id):
        receiver = MqttReceiver("127.0.0.1", mosquitto_port, topic)
        sup = HarnessSupervisor(receiver, checkpoint_dir=str(mount), job_id=job_id).start()
        assert receiver.wait_subscribed(10)
        return receiver, sup

    a, sup_a = job(f"pods/{tag}/a", id_a)
    b, sup_b = job(f"pods/{tag}/b", id_b)
    try:
        assert a.client_name == f"spark-receivers-{id_a}-0" != b.client_name
        publish(publisher, f"pods/{tag}/a", [f"a{i}" for i in range(600)])
        publish(publisher, f"pods/{tag}/b", [f"b{i}" for i in range(600)])
        assert sup_a.wait_for(600) == [f"a{i}" for i in range(600)]
        assert sup_b.wait_for(600) == [f"b{i}" for i in range(600)]
        assert wait_until(lambda: a.messages_acked == 600 and b.messages_acked == 600, 10)
        assert sup_a.errors == sup_b.errors == [] and sup_a.restarts == sup_b.restarts == []
    finally:
        sup_a.shutdown()
        sup_b.shutdown()
    # pod A restarted: its volume mounted again (here, read where it is): its own id
    assert checkpoint_job_id(str(tmp_path / "volume-a")) == id_a


def test_a_second_client_with_the_same_id_is_detected_and_reported(mosquitto_port, publisher):
    topic, client_id = names()
    first = MqttReceiver("127.0.0.1", mosquitto_port, topic, client_id=client_id)
    second = MqttReceiver("127.0.0.1", mosquitto_port, topic, client_id=client_id)
    sup1 = start(first)
    sup2 = HarnessSupervisor(second, stream_id=1).start()
    try:
        # mosquitto 2.0.11 just closes the first connection (no MQTT 5 reason code 142):
        # reported once the broker accepted and soon closed 3 connections in a row
        error = sup1.wait_for_errors(1, timeout_s=30)[0]
        assert f"with client id {client_id!r} and took this receiver's session over" in error
        assert first.takeovers >= 1
        # not a silent kick-off loop: every lost connection is a restart the driver sees,
        # with a growing backoff (a connection that is soon closed does not reset it)
        assert wait_until(
            lambda: any("took this receiver's session over" in r for r in sup1.restarts), 5
        )
        assert first.consecutive_failures >= 3
    finally:
        sup2.shutdown()
        sup1.shutdown()


def test_the_default_client_id_is_per_job_and_stream(tmp_path):
    receiver = MqttReceiver("h", 1883, "t")
    HarnessSupervisor(receiver, stream_id=3, app_id="app-20240101-0007")
    assert receiver.client_name == "spark-receivers-app-20240101-0007-3"
    assert receiver.session_expiry == 3600  # no later job can resume an application's session
    with_ck = MqttReceiver("h", 1883, "t")
    HarnessSupervisor(with_ck, stream_id=3, app_id="app-x", checkpoint_dir=str(tmp_path / "ck"))
    same_ck = MqttReceiver("h", 1883, "t")
    HarnessSupervisor(same_ck, stream_id=3, app_id="app-y", checkpoint_dir=str(tmp_path / "ck/"))
    other_ck = MqttReceiver("h", 1883, "t")
    HarnessSupervisor(other_ck, stream_id=3, checkpoint_dir=str(tmp_path / "other"))
    assert with_ck.client_name == same_ck.client_name != other_ck.client_name
    assert with_ck.session_expiry == 0xFFFFFFFF
    explicit = MqttReceiver("h", 1883, "t", client_id="mine", clean_session=True)
    HarnessSupervisor(explicit, app_id="app-x")
    assert explicit.client_name == "mine" and explicit.session_expiry == 0


def test_a_clean_session_does_not_keep_what_was_published_while_away(mosquitto_port, publisher):
    topic, client_id = names()
    receiver = MqttReceiver("127.0.0.1", mosquitto_port, topic, client_id=client_id)
    start(receiver).shutdown()  # a persistent session now holds the subscription
    clean = MqttReceiver(
        "127.0.0.1", mosquitto_port, topic, client_id=client_id, clean_session=True
    )
    start(clean).shutdown()  # ... which a clean session drops
    publish(publisher, topic, ["lost while away"])
    sup = start(MqttReceiver("127.0.0.1", mosquitto_port, topic, client_id=client_id))
    try:
        publish(publisher, topic, ["after"])
        assert sup.wait_for(1) == ["after"]
    finally:
        sup.shutdown()


def test_mqtt_311_keeps_a_persistent_session_too(mosquitto_port, publisher):
    topic, client_id = names()
    kwargs = {"client_id": client_id, "protocol": "3.1.1"}
    start(MqttReceiver("127.0.0.1", mosquitto_port, topic, **kwargs)).shutdown()
    publish(publisher, topic, ["while away"])
    sup = start(MqttReceiver("127.0.0.1", mosquitto_port, topic, **kwargs))
    try:
        assert sup.wait_for(1) == ["while away"]
    finally:
        sup.shutdown()


# --- poison payloads: the bad-record policy ------------------------------------------


@pytest.mark.parametrize("policy", ["skip", "dead_letter"])
def test_a_binary_payload_is_skipped_or_dead_lettered_and_acked(
    mosquitto_port, publisher, tmp_path, policy
):
    topic, client_id = names()
    receiver = MqttReceiver(
        "127.0.0.1",
        mosquitto_port,
        topic,
        client_id=client_id,
        bad_record_policy=policy,
        dead_letter_dir=str(tmp_path) if policy == "dead_letter" else None,
    )
    sup = start(receiver)
    try:
        publish(
            publisher, topic, [b"before", b"x\xff", *[f"later {i}".encode() for i in range(100)]]
        )
        assert sup.wait_for(101) == ["before"] + [f"later {i}" for i in range(100)]
        assert wait_until(lambda: receiver.messages_acked == 102, 5)  # the bad one too
        assert "is not UTF-8" in sup.wait_for_errors(1)[0]
        assert sup.restarts == [] and receiver.bad_records == 1
    finally:
        sup.shutdown()
    if policy == "dead_letter":
        (path,) = tmp_path.glob("stream-0-*.jsonl")
        (letter,) = [json.loads(line) for line in path.read_text().splitlines()]
        assert letter["key"] == f"topic {topic}"
        assert base64.b64decode(letter["base64"]) == b"x\xff"


@pytest.mark.parametrize("policy", ["skip", "dead_letter"])
def test_a_payload_over_max_record_bytes_goes_by_the_policy_and_the_others_arrive(
    mosquitto_port, publisher, tmp_path, policy
):
    """A 3 MiB message among small ones (issue 36: one of 100 MB was PUBACKed and the
    driver's JVM died; nothing reached the sink)."""
    topic, client_id = names()
    receiver = MqttReceiver(
        "127.0.0.1",
        mosquitto_port,
        topic,
        client_id=client_id,
        bad_record_policy=policy,
        dead_letter_dir=str(tmp_path) if policy == "dead_letter" else None,
    )
    sup = start(receiver)
    big = b"z" * (3 * 1024 * 1024)
    try:
        publish(publisher, topic, [b"before", big, b"after"])
        assert sup.wait_for(2) == ["before", "after"]
        assert wait_until(lambda: receiver.messages_acked == 3, 5)  # the big one too
        (error,) = sup.wait_for_errors(1)
        assert f"message on '{topic}' is 3,145,728 bytes, longer than max_record_bytes" in error
        assert sup.restarts == [] and receiver.bad_records == 1
    finally:
        sup.shutdown()
    if policy == "dead_letter":
        (path,) = tmp_path.glob("stream-0-*.jsonl")
        (letter,) = [json.loads(line) for line in path.read_text().splitlines()]
        assert letter["key"] == f"topic {topic}" and letter["bytes"] == len(big)
        assert (tmp_path / letter["file"]).read_bytes() == big


def test_a_binary_payload_under_fail_stops_and_is_not_acked(mosquitto_port, publisher):
    topic, client_id = names()
    receiver = MqttReceiver(
        "127.0.0.1", mosquitto_port, topic, client_id=client_id, bad_record_policy="fail"
    )
    sup = start(receiver)
    publish(publisher, topic, [b"before", b"x\xff", b"after"])
    assert wait_until(lambda: sup.stopped_with is not None, 10)
    assert "not UTF-8" in sup.stopped_with
    assert sup.records == ["before"] and receiver.messages_acked == 1
    # the broker still holds the bad message (and the one after it) for this session
    again = MqttReceiver("127.0.0.1", mosquitto_port, topic, client_id=client_id)
    sup2 = start(again)
    try:
        assert sup2.wait_for(1) == ["after"]
        assert again.bad_records == 1
    finally:
        sup2.shutdown()


def test_include_timestamp_is_the_arrival_time(mosquitto_port, publisher):
    topic, client_id = names()
    receiver = MqttReceiver(
        "127.0.0.1", mosquitto_port, topic, client_id=client_id, include_timestamp=True
    )
    assert receiver.schema.names == ["value", "timestamp"]
    sup = start(receiver)
    try:
        before = datetime.now(UTC)
        publish(publisher, topic, ["m"])
        (row,) = sup.wait_for(1)
        assert row["value"] == "m" and before <= row["timestamp"] <= datetime.now(UTC)
    finally:
        sup.shutdown()


def test_takeover_detector_tells_a_takeover_from_a_blip():
    d = TakeoverDetector()
    d.connected(0.0)
    assert d.dropped(1.0, 142) == Drop(takeover=True, certain=True, lasted=False)
    verdicts = []
    for t in (10.0, 20.0, 30.0, 40.0):  # accepted, then closed 1 s later, again and again
        d.connected(t)
        verdicts.append(d.dropped(t + 1.0, 128).takeover)
    assert verdicts == [False, True, False, False]  # the 3rd in a row (with the 142 one)
    d.connect_failed()  # the broker is down: not a takeover
    for t in (50.0, 60.0):
        d.connected(t)
        assert not d.dropped(t + 1.0, 141).takeover  # keep-alive timeouts do not count
    d.connected(70.0)
    assert d.dropped(90.0, 128) == Drop(takeover=False, certain=False, lasted=True)
    assert d.short_drops == 0
