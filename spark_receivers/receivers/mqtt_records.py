"""What an MQTT message becomes in an ``MqttReceiver``: a record, or the reason it cannot be one.

A message is a record when its payload is at most ``max_record_bytes`` long
(checked before anything is decoded: a 256 MiB payload is refused, not copied
about), is UTF-8, and, under a declared schema, fits it. A batch of good messages becomes
Arrow at once (:func:`batch_columns`); one holding a bad message goes message by message
(:func:`message_record`), so the policy sees which. Plain data and functions; paho's
thread makes the :data:`Arrival` tuples, the receiver's storing thread calls the rest.
"""

from __future__ import annotations

from dataclasses import dataclass
from operator import itemgetter
from typing import Any

import pyarrow as pa

from spark_receivers.errors import ReceiverError
from spark_receivers.receiver.bad_records import too_long
from spark_receivers.receiver.schema import check_record

__all__ = [
    "MESSAGE_FIELDS",
    "QOS",
    "TIME",
    "Arrival",
    "Delivery",
    "batch_columns",
    "delivery",
    "message_record",
]

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


Arrival = tuple[int, int, int, int, bytes | bytearray, str, bool]
"""A message as paho's thread queues it: (connection, arrival µs, mid, qos, payload, topic,
retain)."""
TIME, QOS, PAYLOAD, TOPIC, RETAIN = 1, 3, 4, 5, 6
"""Where an :data:`Arrival` holds what."""


def batch_columns(
    batch: list[Arrival], schema: pa.Schema, default: bool, limit: int
) -> pa.Array | pa.Table | None:
    """The batch's records as one Arrow array (``default``) or table of ``schema``.

    None when a payload is longer than ``limit`` bytes or not UTF-8, a value does not
    convert to its column's type (the same conversion ``check_record`` makes), or a
    column is of a type other than the plain ones (then message by message decides).
    """
    payload_list = list(map(itemgetter(PAYLOAD), batch))
    if max(map(len, payload_list), default=0) > limit:
        return None  # checked before the copy into Arrow: a huge payload is not copied
    data = pa.array(payload_list, pa.binary())
    try:
        payloads = data.cast(pa.string())  # validates UTF-8
    except pa.ArrowInvalid:
        return None
    if default:
        return payloads
    arrays = []
    for f in schema:
        if f.name == "payload":
            if not pa.types.is_string(f.type):
                return None
            arrays.append(payloads)
            continue
        if f.name == "topic" and pa.types.is_string(f.type):
            values: list[Any] = list(map(itemgetter(TOPIC), batch))
        elif f.name == "qos" and pa.types.is_integer(f.type):
            values = list(map(itemgetter(QOS), batch))
        elif f.name == "retain" and pa.types.is_boolean(f.type):
            values = list(map(itemgetter(RETAIN), batch))
        else:
            return None
        try:
            arrays.append(pa.array(values, f.type))
        except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError):
            return None
    return pa.Table.from_arrays(arrays, schema=schema)


def delivery(arrival: Arrival) -> Delivery:
    """An :data:`Arrival` as a :class:`Delivery` (the message-by-message path)."""
    connection, arrived_us, mid, qos, payload, topic, retain = arrival
    return Delivery(connection, mid, qos, topic, bytes(payload), retain, arrived_us)
