"""Every built-in receiver travels to the executor by cloudpickle, without runtime state."""

from __future__ import annotations

import pytest
from pyspark import cloudpickle

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


@pytest.mark.parametrize(
    "receiver",
    [
        HttpReceiver(port=8080, token="t"),
        FileTailReceiver("/tmp/logs", "*.log"),
        RedisStreamReceiver("s", "g"),
        MqttReceiver("127.0.0.1", 1883, "t/#"),
        GeneratorReceiver(rate=10, total=5),
        AmqpReceiver("amqp://u:p@127.0.0.1:5672/%2F", "q"),
        NatsReceiver("nats://u:p@127.0.0.1:4222", "S", subject="S.>"),
        WebSocketReceiver("ws://127.0.0.1:9000/feed", subscribe="sub"),
    ],
    ids=lambda r: type(r).__name__,
)
def test_round_trip_keeps_options_and_drops_threads(receiver):
    copy = cloudpickle.loads(cloudpickle.dumps(receiver))
    assert type(copy) is type(receiver)
    assert copy._thread is None
    assert copy._supervisor is None
    public = {k: v for k, v in vars(receiver).items() if not k.startswith("_")}
    assert {k: v for k, v in vars(copy).items() if not k.startswith("_")} == public
