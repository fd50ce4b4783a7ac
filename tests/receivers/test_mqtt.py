"""MqttReceiver against a real mosquitto (scripts/services.sh, 127.0.0.1)."""

from __future__ import annotations

import uuid

import paho.mqtt.client as mqtt
import pyarrow as pa
import pytest
from harness import HarnessSupervisor, wait_until

from spark_receivers.errors import ConfigError
from spark_receivers.receivers import MqttReceiver


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


def test_a_message_whose_store_failed_is_redelivered(mosquitto_port, publisher):
    topic, client_id = names()
    receiver = MqttReceiver("127.0.0.1", mosquitto_port, topic, client_id=client_id)
    sup = start(receiver)
    try:
        sup.fail_stores = OSError("driver unreachable")
        publish(publisher, topic, ["precious"])
        assert wait_until(lambda: sup.restarts, 10)
        assert receiver.messages_acked == 0
        sup.fail_stores = None
        assert sup.wait_for(1, 20) == ["precious"]  # the broker sent it again
    finally:
        sup.shutdown()


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


def test_bad_options_are_refused():
    with pytest.raises(ConfigError, match="qos"):
        MqttReceiver("h", 1883, "t", qos=3)
    with pytest.raises(ConfigError, match="fields among"):
        MqttReceiver("h", 1883, "t", schema=pa.schema([("nope", pa.string())]))
