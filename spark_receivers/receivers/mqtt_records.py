"""What an MQTT message becomes in an ``MqttReceiver``: a record, or the reason it cannot be one.

A message is a record when its payload is at most ``max_record_bytes`` long
(checked before anything is decoded: a 256 MiB payload is refused, not copied
about), is UTF-8, and, under a declared schema, fits it. Plain data and
functions; the receiver's storing thread calls them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from spark_receivers.errors import ReceiverError
from spark_receivers.receiver.bad_records import too_long
from spark_receivers.receiver.schema import check_record

__all__ = ["MESSAGE_FIELDS", "Delivery", "message_record"]

MESSAGE_FIELDS = ("topic", "payload", "qos", "retain")
"""The fields a declared schema may take from a message."""


@dataclass(frozen=True)
class Delivery:
    """A received message and the connection it came on (acks are per connection)."""

    connection: int
    mid: int
    qos: int
    topic: str
    payload: bytes
    retain: bool
    arrived_us: int


def message_record(d: Delivery, schema: pa.Schema, default: bool, limit: int) -> Any:
    """The record of ``d``: its payload (``default``), else a dict of ``schema``'s fields.

    Raises :class:`ReceiverError` naming the topic and why it cannot be one: longer
    than ``limit`` bytes, not UTF-8, or not fitting ``schema``.
    """
    if len(d.payload) > limit:
        msg = f"message on {d.topic!r} is {too_long(len(d.payload), limit)}"
        raise ReceiverError(msg)
    try:
        payload = d.payload.decode("utf-8")
    except UnicodeDecodeError as e:
        msg = f"message on {d.topic!r} is not UTF-8 ({len(d.payload)} bytes, byte {e.start})"
        raise ReceiverError(msg) from None
    if default:
        return payload
    values = {"topic": d.topic, "payload": payload, "qos": d.qos, "retain": d.retain}
    record = {name: values[name] for name in schema.names}
    try:
        check_record(record, schema)
    except ReceiverError as e:
        msg = f"message on {d.topic!r}: {e}"
        raise ReceiverError(msg) from None
    return record
