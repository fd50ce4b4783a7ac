"""``MqttReceiver``: subscribes to an MQTT topic and acks each message after storing it.

paho-mqtt 2.x with ``manual_ack=True`` and a persistent session
(``clean_session=False``, a stable client id). Messages are gathered for up to
``batch_wait_ms`` (at most ``max_batch`` of them), stored together with
``store(payloads, reliable=True)``, and only then acknowledged (``PUBACK``),
in the order they arrived. A message whose store failed, or that arrived on
a connection that has since dropped, is never acked: the broker delivers it
again when the session reconnects (at least once, never lost).

How many unacknowledged messages the broker sends at once is the broker's
in-flight window (mosquitto's ``max_inflight_messages``, 20 by default): it
bounds a batch, and so the throughput of one receiver.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from spark_receivers.errors import ConfigError
from spark_receivers.receiver.schema import is_default
from spark_receivers.receiver.threaded_receiver import ThreadedReceiver
from spark_receivers.util.extras import PAHO_MQTT

if TYPE_CHECKING:
    import paho.mqtt.client as mqtt

log = logging.getLogger(__name__)

MESSAGE_FIELDS = ("topic", "payload", "qos", "retain")


@dataclass(frozen=True)
class _Delivery:
    """A received message and the connection it came on (acks are per connection)."""

    connection: int
    mid: int
    qos: int
    topic: str
    payload: bytes
    retain: bool


class MqttReceiver(ThreadedReceiver):
    """Stores the payloads (UTF-8) of the messages published on ``topic``.

    ``topic`` may hold wildcards (``sensors/+/temp``, ``logs/#``). ``client_id``
    defaults to ``spark-receivers-<stream id>``: the broker keeps the session
    (subscription and unacked messages) under it across restarts. Under a
    declared multi-column schema a record is a dict of the schema's fields
    among ``topic``, ``payload``, ``qos`` and ``retain``. A payload that is not
    UTF-8 is skipped, reported and acked.

    A failure (the broker cannot be reached, a store fails) restarts the
    receiver with the backoff of :class:`ThreadedReceiver` (``max_backoff_ms``
    caps it, and paho's own reconnect delay); the backoff resets on every
    accepted connection.

    Thread contract: paho's network thread only queues messages; one thread
    (``mqtt-receiver-<stream>``) stores and acks them. ``on_stop`` disconnects
    and waits for it.
    """

    thread_name_prefix = "mqtt-receiver"
    requires = (PAHO_MQTT,)  # the [mqtt] extra
    transient_attrs = ("_client", "_client_lock", "_queue", "_subscribed")

    def __init__(
        self,
        host: str,
        port: int = 1883,
        topic: str = "#",
        *,
        qos: int = 1,
        client_id: str | None = None,
        username: str | None = None,
        password: str | None = None,
        keepalive_s: int = 30,
        max_batch: int = 1000,
        batch_wait_ms: int = 50,
        max_backoff_ms: int = 30_000,
        **kwargs: Any,
    ) -> None:
        super().__init__(max_backoff_ms=max_backoff_ms, **kwargs)
        if qos not in (0, 1, 2):
            msg = f"qos must be 0, 1 or 2, got {qos!r}"
            raise ConfigError(msg)
        for key, value in (
            ("max_batch", max_batch),
            ("keepalive_s", keepalive_s),
            ("batch_wait_ms", batch_wait_ms),
        ):
            if value <= 0:
                msg = f"{key} must be > 0, got {value!r}"
                raise ConfigError(msg)
        if not topic:
            msg = "topic must be non-empty, got ''"
            raise ConfigError(msg)
        if not is_default(self.schema) and not set(self.schema.names) <= set(MESSAGE_FIELDS):
            msg = (
                f"a declared schema may only have fields among {MESSAGE_FIELDS}, "
                f"got {self.schema.names}"
            )
            raise ConfigError(msg)
        self.host = host
        self.port = port
        self.topic = topic
        self.qos = qos
        self.client_id = client_id
        self.username = username
        self.password = password
        self.keepalive_s = keepalive_s
        self.max_batch = max_batch
        self.batch_wait_ms = batch_wait_ms
        self.records_stored = 0
        self.messages_acked = 0
        self.bad_records = 0
        self.reset_runtime()

    def reset_runtime(self) -> None:
        """A new queue and subscription event, no client: each run connects anew."""
        self._client: mqtt.Client | None = None
        self._client_lock = threading.Lock()  # exactly one of worker and interrupt disconnects
        self._queue: queue.Queue[_Delivery] = queue.Queue()
        self._subscribed = threading.Event()
        self._connection = 0

    @property
    def client_name(self) -> str:
        """The MQTT client id (the key of the broker's persistent session)."""
        return self.client_id or f"spark-receivers-{self.stream_id}"

    # --- the storing thread ---------------------------------------------------

    def receive(self) -> None:
        """Connect, then store and ack the queued messages in batches until stopped."""
        client = self._connect()
        client.loop_start()
        with self._client_lock:
            self._client = client
        try:
            while not self.stopping:  # also when interrupt() ran before _client was set
                batch = self._next_batch()
                if batch:
                    self._store_and_ack(client, batch)
        finally:
            self._disconnect()

    def interrupt(self) -> None:
        """Disconnect (unacked messages stay with the broker) and stop paho's thread."""
        self._disconnect()

    def _disconnect(self) -> None:
        with self._client_lock:
            client, self._client = self._client, None
        if client is not None:
            client.disconnect()
            client.loop_stop()

    def describe(self) -> str:
        """``MQTT broker <host>:<port>``, as restart messages name the work."""
        return f"MQTT broker {self.host}:{self.port}"

    def _connect(self) -> mqtt.Client:
        import paho.mqtt.client as mqtt

        client = mqtt.Client(
            mqtt.CallbackAPIVersion.VERSION2,
            client_id=self.client_name,
            clean_session=False,
            protocol=mqtt.MQTTv311,
            manual_ack=True,
        )
        if self.username is not None:
            client.username_pw_set(self.username, self.password)
        client.reconnect_delay_set(1, max(1, self.max_backoff_ms // 1000))
        client.on_connect = self._on_connect
        client.on_disconnect = self._on_disconnect
        client.on_message = self._on_message
        client.on_subscribe = self._on_subscribe
        client.connect(self.host, self.port, keepalive=self.keepalive_s)
        return client

    # --- paho callbacks (network thread: must not block) ---------------------------

    def _on_connect(
        self, client: mqtt.Client, userdata: Any, flags: Any, reason_code: Any, properties: Any
    ) -> None:
        if reason_code.is_failure:
            log.warning("receiver %d: MQTT connection refused: %s", self.stream_id, reason_code)
            return
        self._connection += 1
        self._subscribed.clear()
        self.mark_healthy()
        log.info(
            "receiver %d: connected to %s:%s (session present: %s)",
            self.stream_id,
            self.host,
            self.port,
            flags.session_present,
        )
        client.subscribe(self.topic, self.qos)

    def _on_subscribe(
        self, client: mqtt.Client, userdata: Any, mid: int, reason_codes: Any, properties: Any
    ) -> None:
        failed = [rc for rc in reason_codes if rc.is_failure]
        if failed:
            message = f"subscribing to {self.topic!r} was refused: {failed[0]}"
            log.warning("receiver %d: %s", self.stream_id, message)
            self.report_error(message)
            return
        self._subscribed.set()

    def wait_subscribed(self, timeout_s: float | None = None) -> bool:
        """Wait until the broker confirmed the subscription of the current connection."""
        return self._subscribed.wait(timeout_s)

    def _on_disconnect(
        self, client: mqtt.Client, userdata: Any, flags: Any, reason_code: Any, properties: Any
    ) -> None:
        if not self.stopping:
            log.warning(
                "receiver %d: disconnected from %s:%s: %s; reconnecting",
                self.stream_id,
                self.host,
                self.port,
                reason_code,
            )

    def _on_message(self, client: mqtt.Client, userdata: Any, message: mqtt.MQTTMessage) -> None:
        self._queue.put(
            _Delivery(
                self._connection,
                message.mid,
                message.qos,
                message.topic,
                bytes(message.payload),
                bool(message.retain),
            )
        )

    # --- storing ------------------------------------------------------------------

    def _next_batch(self) -> list[_Delivery]:
        try:
            first = self._queue.get(timeout=0.2)
        except queue.Empty:
            return []
        batch = [first]
        deadline = time.monotonic() + self.batch_wait_ms / 1000.0
        while len(batch) < self.max_batch:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            try:
                batch.append(self._queue.get(timeout=remaining))
            except queue.Empty:
                break
        return batch

    def _store_and_ack(self, client: mqtt.Client, batch: list[_Delivery]) -> None:
        records = [r for r in (self._record(d) for d in batch) if r is not None]
        if records:
            self.store(records, reliable=True)
            self.records_stored += len(records)
        current = self._connection
        for d in batch:
            if d.qos == 0:
                continue
            if d.connection != current:
                # Its connection dropped: the broker will send it again on this session.
                continue
            client.ack(d.mid, d.qos)
            self.messages_acked += 1

    def _record(self, d: _Delivery) -> Any:
        try:
            payload = d.payload.decode("utf-8")
        except UnicodeDecodeError as e:
            self.bad_records += 1
            message = f"message on {d.topic!r} is not UTF-8 ({len(d.payload)} bytes): skipped"
            log.warning("receiver %d: %s", self.stream_id, message)
            self.report_error(message, e)
            return None
        if is_default(self.schema):
            return payload
        values = {"topic": d.topic, "payload": payload, "qos": d.qos, "retain": d.retain}
        return {name: values[name] for name in self.schema.names}
