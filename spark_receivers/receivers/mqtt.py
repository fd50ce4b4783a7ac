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
from spark_receivers.receiver.receiver import Receiver
from spark_receivers.receiver.schema import is_default

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


class MqttReceiver(Receiver):
    """Stores the payloads (UTF-8) of the messages published on ``topic``.

    ``topic`` may hold wildcards (``sensors/+/temp``, ``logs/#``). ``client_id``
    defaults to ``spark-receivers-<stream id>``: the broker keeps the session
    (subscription and unacked messages) under it across restarts. Under a
    declared multi-column schema a record is a dict of the schema's fields
    among ``topic``, ``payload``, ``qos`` and ``retain``. A payload that is not
    UTF-8 is skipped, reported and acked.

    Thread contract: paho's network thread only queues messages; one thread
    (``mqtt-receiver-<stream>``) stores and acks them. ``on_stop`` disconnects
    and waits for it.
    """

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
        super().__init__(**kwargs)
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
        self.max_backoff_ms = max_backoff_ms
        self.records_stored = 0
        self.messages_acked = 0
        self.bad_records = 0
        self._failures = 0
        self._reset_runtime()

    def _reset_runtime(self) -> None:
        self._client: mqtt.Client | None = None
        self._queue: queue.Queue[_Delivery] = queue.Queue()
        self._stop = threading.Event()
        self._subscribed = threading.Event()
        self._thread: threading.Thread | None = None
        self._connection = 0

    def __getstate__(self) -> dict[str, Any]:
        state = super().__getstate__()
        for key in ("_client", "_queue", "_stop", "_subscribed", "_thread"):
            state[key] = None
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._reset_runtime()

    @property
    def client_name(self) -> str:
        """The MQTT client id (the key of the broker's persistent session)."""
        return self.client_id or f"spark-receivers-{self.stream_id}"

    # --- lifecycle ----------------------------------------------------------

    def on_start(self) -> None:
        """Start the connecting and storing thread."""
        self._reset_runtime()
        self._thread = threading.Thread(
            target=self._run, name=f"mqtt-receiver-{self.stream_id}", daemon=True
        )
        self._thread.start()

    def on_stop(self) -> None:
        """Disconnect (unacked messages stay with the broker) and wait for the thread."""
        self._stop.set()
        client = self._client
        if client is not None:
            client.disconnect()
            client.loop_stop()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(30)
            if thread.is_alive():
                log.warning("receiver %d: MQTT storing thread did not stop", self.stream_id)

    def _backoff_ms(self) -> int:
        self._failures += 1
        return int(min(500 * 2 ** min(self._failures - 1, 16), self.max_backoff_ms))

    def _run(self) -> None:
        try:
            client = self._connect()
            self._client = client
            client.loop_start()
            if self._stop.is_set():  # on_stop ran before the client was published
                client.disconnect()
                client.loop_stop()
                return
            while not self._stop.is_set():
                batch = self._next_batch()
                if batch:
                    self._store_and_ack(client, batch)
        except Exception as e:
            if self._stop.is_set() or self.is_stopped():
                log.info("receiver %d: stopped while receiving: %s", self.stream_id, e)
                return
            log.warning(
                "receiver %d: MQTT %s:%s failed",
                self.stream_id,
                self.host,
                self.port,
                exc_info=True,
            )
            self.restart(f"MQTT broker {self.host}:{self.port} failed: {e}", e, self._backoff_ms())

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
        self._failures = 0
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
        if not self._stop.is_set():
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
