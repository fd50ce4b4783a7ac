"""Built-in receivers.

``HttpReceiver`` needs ``aiohttp``, ``RedisStreamReceiver`` needs ``redis``,
``MqttReceiver`` needs ``paho-mqtt`` (2.x), ``AmqpReceiver`` needs ``pika``,
``NatsReceiver`` needs ``nats-py`` and ``WebSocketReceiver`` needs ``websockets``;
each is imported only when the receiver starts, so the others work without them.
"""

from spark_receivers.receivers.amqp import AmqpReceiver
from spark_receivers.receivers.file_tail import FileTailReceiver
from spark_receivers.receivers.generator import GeneratorReceiver
from spark_receivers.receivers.http import HttpReceiver
from spark_receivers.receivers.line_source import LineSource
from spark_receivers.receivers.mqtt import MqttReceiver
from spark_receivers.receivers.nats_jetstream import NatsReceiver
from spark_receivers.receivers.redis_stream import RedisStreamReceiver
from spark_receivers.receivers.socket_text import SocketTextReceiver
from spark_receivers.receivers.websocket import WebSocketReceiver

__all__ = [
    "AmqpReceiver",
    "FileTailReceiver",
    "GeneratorReceiver",
    "HttpReceiver",
    "LineSource",
    "MqttReceiver",
    "NatsReceiver",
    "RedisStreamReceiver",
    "SocketTextReceiver",
    "WebSocketReceiver",
]
