"""``MqttReceiver``: subscribes to an MQTT topic and acks each message after storing it.

paho-mqtt 2.x with ``manual_ack=True`` and, by default, a persistent session
under a client id of this job's stream. Messages are gathered for up to
``batch_wait_ms`` (at most ``max_batch`` of them), stored together with
``store(payloads, reliable=True)``, and only then acknowledged (``PUBACK``),
in the order they arrived. A message whose store failed, or that arrived on
a connection that has since dropped, is never acked: the broker delivers it
again when the session reconnects (at least once, never lost).

The session, its client id (from the job's id, never a path), its opening when the
context starts, QoS 2 received as 1, retained messages once per session, the window
asked of the broker and takeovers: :mod:`spark_receivers.receivers.mqtt_session`.
docs/receivers.md says which broker settings lose nothing.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from operator import itemgetter
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from spark_receivers.errors import ConfigError, ReceiverError
from spark_receivers.receiver.bad_records import BadRecordPolicy
from spark_receivers.receiver.source_support import JobName, durable_scope, now_us
from spark_receivers.receiver.threaded_receiver import ThreadedReceiver
from spark_receivers.receivers.mqtt_records import (
    MESSAGE_FIELDS,
    QOS,
    TIME,
    Arrival,
    batch_columns,
    delivery,
    message_record,
)
from spark_receivers.receivers.mqtt_session import (
    NEVER_EXPIRES,
    TakeoverDetector,
    open_session,
    send_connect,
    session_expiry,
    subscribe,
    takeover_message,
)
from spark_receivers.receivers.mqtt_topics import check_topic_filter
from spark_receivers.util.extras import PAHO_MQTT
from spark_receivers.util.options import require_positive_ints

if TYPE_CHECKING:
    import paho.mqtt.client as mqtt

log = logging.getLogger(__name__)

PROTOCOLS = ("5", "3.1.1")
CLIENT_PREFIX = "spark-receivers"


class MqttReceiver(ThreadedReceiver):
    """Stores the payloads (UTF-8) of the messages published on ``topic``.

    ``topic`` is an MQTT topic filter and may hold wildcards (``sensors/+/temp``,
    ``logs/#``); an invalid one (``a/#/b``, ``a+/b``) is a :class:`ConfigError` here.
    Under a declared multi-column schema a record is a dict of the schema's fields
    among ``topic``, ``payload``, ``qos`` and ``retain``. A payload longer than
    ``max_record_bytes`` (default ``spark.receivers.receiver.maxRecordBytes``, 1 MiB),
    not UTF-8, or not fitting the schema is a bad record, handled by
    ``bad_record_policy``: ``skip`` and ``dead_letter`` ack it, ``fail`` acks the
    messages before it and stops the receiver for good with the error (the driver
    fails the context). ``include_timestamp=True`` adds when each message arrived.

    The session (:mod:`~spark_receivers.receivers.mqtt_session`): ``client_id``
    (default: unique to the job's stream, :attr:`client_name`);
    ``clean_session=False`` (default) keeps it on the broker across reconnects and
    restarts, so what is published while the receiver is away waits for it;
    ``True`` starts afresh on every connection, losing that. ``session_expiry_s``
    (MQTT 5): how long the broker keeps the session of a client that went away
    (:func:`~spark_receivers.receivers.mqtt_session.session_expiry`). ``protocol``:
    ``"5"`` (default; detects takeovers, stores retained messages once) or
    ``"3.1.1"``. ``qos``: 0, or 1 (default); 2 is received as 1.

    Any lost connection ends the run: the receiver restarts with the backoff
    of :class:`ThreadedReceiver` (``max_backoff_ms`` caps it), and the driver
    sees it; the backoff resets once a batch is stored or a connection lasted
    a while (10 s).

    Thread contract: paho's network thread only queues messages; one thread
    (``mqtt-receiver-<stream>``) stores and acks them. ``on_stop`` disconnects
    and waits for it.
    """

    thread_name_prefix = "mqtt-receiver"
    requires = (PAHO_MQTT,)  # the [mqtt] extra
    transient_attrs = ("_client", "_client_lock", "_arrivals", "_arrived", "_subscribed", "_lost")
    supports_timestamp = True
    retained_wanted = False
    """Set on the driver when the session opened at start was new: the receiver's first
    subscription (MQTT 5) then asks the broker for the retained messages."""

    def __init__(
        self,
        host: str,
        port: int = 1883,
        topic: str = "#",
        *,
        qos: int = 1,
        client_id: str | None = None,
        clean_session: bool = False,
        session_expiry_s: int | None = None,
        protocol: str = "5",
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
        require_positive_ints(
            max_batch=max_batch, keepalive_s=keepalive_s, batch_wait_ms=batch_wait_ms
        )
        check_topic_filter(topic)
        if client_id is not None and not client_id:
            msg = "client_id must be a non-empty string or None (derived), got ''"
            raise ConfigError(msg)
        if protocol not in PROTOCOLS:
            msg = f"protocol must be one of {PROTOCOLS}, got {protocol!r}"
            raise ConfigError(msg)
        if session_expiry_s is not None and not 0 <= session_expiry_s <= NEVER_EXPIRES:
            msg = (
                f"session_expiry_s must be in [0, {NEVER_EXPIRES}] or None, got {session_expiry_s}"
            )
            raise ConfigError(msg)
        if not self.default_records and not set(self.record_schema.names) <= set(MESSAGE_FIELDS):
            msg = (
                f"a declared schema may only have fields among {MESSAGE_FIELDS}, "
                f"got {self.record_schema.names}"
            )
            raise ConfigError(msg)
        self.host = host
        self.port = port
        self.topic = topic
        self.qos = qos
        self.client_id = client_id
        self.clean_session = clean_session
        self.session_expiry_s = session_expiry_s
        self.protocol = protocol
        self.username = username
        self.password = password
        self.keepalive_s = keepalive_s
        self.max_batch = max_batch
        self.batch_wait_ms = batch_wait_ms
        self.records_stored = 0
        self.messages_acked = 0
        self.takeovers = 0
        self._drops = TakeoverDetector()  # across runs
        self.reset_runtime()

    def reset_runtime(self) -> None:
        """A new queue and subscription event, no client: each run connects anew."""
        self._client: mqtt.Client | None = None
        self._client_lock = threading.Lock()  # exactly one of worker and interrupt disconnects
        self._arrivals: deque[Arrival] = deque()
        """What paho's thread received, in order (see :data:`.Arrival`)."""
        self._arrived = threading.Event()
        """Set by paho's thread when the first message waits, or ``max_batch`` of them."""
        self._subscribed = threading.Event()
        self._lost: str | None = None  # why the connection ended, set by paho's thread
        self._connection = 0

    @property
    def client_name(self) -> str:
        """The MQTT client id: ``client_id``, else :meth:`durable_name` (on the executor)."""
        return self.client_id or self.durable_name(CLIENT_PREFIX)

    @property
    def session_expiry(self) -> int:
        """The MQTT 5 session expiry interval sent on CONNECT (s; 0 for a clean session)."""
        scope = durable_scope(self._supervisor)
        return session_expiry(self.clean_session, self.session_expiry_s, self.client_id, scope)

    @property
    def subscription_qos(self) -> int:
        """The QoS the receiver subscribes at: ``qos``, 2 taken as 1 (see the module doc)."""
        return min(self.qos, 1)

    # --- on the driver, when the context starts -----------------------------------

    def prepare_source(self, job: JobName) -> None:
        """Open this job's session on the broker now, so what is published from now on waits.

        Connects as the client id the receiver will use, subscribes, disconnects (at
        most about 10 s). Nothing to do for a clean session (the receiver's own
        connection starts afresh). Raises :class:`ReceiverError` when the broker
        cannot be reached (the context logs it and starts all the same).
        """
        if self.clean_session:
            return
        name = self.client_id or job.durable_name(self.stream_id, CLIENT_PREFIX)
        expiry = session_expiry(
            self.clean_session, self.session_expiry_s, self.client_id, job.scope
        )
        client = self._new_client(name)
        present = open_session(
            client,
            lambda c: self._send_connect(c, expiry),
            self.topic,
            self.subscription_qos,
            self.protocol == "5",
            f"the MQTT broker {self.host}:{self.port}",
        )
        self.retained_wanted = not present
        log.info(
            "receiver %d: opened the MQTT session of client id %r on %s:%s for topic %r%s",
            self.stream_id,
            name,
            self.host,
            self.port,
            self.topic,
            " (it was there already)" if present else "",
        )

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
                lost = self._lost
                if lost is not None and not self.stopping:
                    self._keep_qos0(client)
                    raise ReceiverError(lost)
        finally:
            self._disconnect()

    def _keep_qos0(self, client: mqtt.Client) -> None:
        """The connection is gone: store its QoS 0 messages; the broker sends the others again."""
        arrivals = self._arrivals
        left = [arrivals.popleft() for _ in range(len(arrivals))]
        if any(a[QOS] == 0 for a in left):
            self._store_and_ack(client, [a for a in left if a[QOS] == 0])

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

    def _new_client(self, client_id: str) -> mqtt.Client:
        """A paho client of ``client_id``, configured (credentials, TLS), not connected."""
        import paho.mqtt.client as mqtt

        v5 = self.protocol == "5"
        client = mqtt.Client(
            mqtt.CallbackAPIVersion.VERSION2,
            client_id=client_id,
            clean_session=None if v5 else self.clean_session,
            protocol=mqtt.MQTTv5 if v5 else mqtt.MQTTv311,
            manual_ack=True,
            reconnect_on_failure=False,  # a lost connection ends the run: restarted with backoff
        )
        self._configure(client)
        return client

    def _send_connect(self, client: mqtt.Client, expiry: int) -> None:
        """Send the CONNECT (see :func:`send_connect`); OSError when unreachable."""
        v5 = self.protocol == "5"
        settings = (self.keepalive_s, v5, self.clean_session, expiry, self.max_batch)
        send_connect(client, self.host, self.port, *settings)

    def _connect(self) -> mqtt.Client:
        client = self._new_client(self.client_name)
        client.on_connect = self._on_connect
        client.on_disconnect = self._on_disconnect
        client.on_message = self._on_message
        client.on_subscribe = self._on_subscribe
        log.info(
            "receiver %d: connecting to %s:%s as client id %r (%s session, MQTT %s)",
            self.stream_id,
            self.host,
            self.port,
            self.client_name,
            "clean" if self.clean_session else "persistent",
            self.protocol,
        )
        try:
            self._send_connect(client, self.session_expiry)
        except OSError as e:
            self._drops.connect_failed()
            msg = f"cannot connect to the MQTT broker {self.host}:{self.port}: {e}"
            raise ReceiverError(msg) from e
        return client

    def _configure(self, client: mqtt.Client) -> None:
        """Set the client up before it connects (credentials; a subclass adds TLS)."""
        if self.username is not None:
            client.username_pw_set(self.username, self.password)

    # --- paho callbacks (network thread: must not block) ---------------------------

    def _on_connect(
        self, client: mqtt.Client, userdata: Any, flags: Any, reason_code: Any, properties: Any
    ) -> None:
        if reason_code.is_failure:
            self._drops.connect_failed()
            self._lost = (
                f"the MQTT broker {self.host}:{self.port} refused the connection of client id "
                f"{self.client_name!r}: {reason_code}"
            )
            log.warning("receiver %d: %s", self.stream_id, self._lost)
            return
        self._connection += 1
        self._drops.connected(time.monotonic())
        self._subscribed.clear()
        log.info(
            "receiver %d: connected to %s:%s as %r (session present: %s)",
            self.stream_id,
            self.host,
            self.port,
            self.client_name,
            flags.session_present,
        )
        v5 = self.protocol == "5"
        subscribe(client, self.topic, self.subscription_qos, v5, self.retained_wanted)

    def _on_subscribe(
        self, client: mqtt.Client, userdata: Any, mid: int, reason_codes: Any, properties: Any
    ) -> None:
        failed = [rc for rc in reason_codes if rc.is_failure]
        if failed:
            message = f"subscribing to {self.topic!r} was refused: {failed[0]}"
            log.warning("receiver %d: %s", self.stream_id, message)
            self.report_error(message)
            return
        self.retained_wanted = False  # asked for once
        self._subscribed.set()

    def wait_subscribed(self, timeout_s: float | None = None) -> bool:
        """Wait until the broker confirmed the subscription of the current connection."""
        return self._subscribed.wait(timeout_s)

    def _on_disconnect(
        self, client: mqtt.Client, userdata: Any, flags: Any, reason_code: Any, properties: Any
    ) -> None:
        if self.stopping:
            return
        drop = self._drops.dropped(time.monotonic(), getattr(reason_code, "value", None))
        if drop.lasted:
            self.mark_healthy()  # it worked for a while: the next failure waits little
        if drop.takeover:
            self.takeovers += 1
            message = takeover_message(self.host, self.port, self.client_name, drop.certain)
            log.error("receiver %d: %s", self.stream_id, message)
            self.report_error(message, ReceiverError(message))
        else:
            message = (
                f"lost the connection to the MQTT broker {self.host}:{self.port}: {reason_code}"
            )
            log.warning("receiver %d: %s", self.stream_id, message)
        if self._lost is None:
            self._lost = message

    def _on_message(self, client: mqtt.Client, userdata: Any, message: mqtt.MQTTMessage) -> None:
        # paho's thread, per message: one tuple appended (not paho's message: a thousand of
        # those kept alive make Python's garbage collector scan them again and again); the
        # storing thread is woken for the first message waiting and at max_batch.
        arrivals = self._arrivals
        arrivals.append(
            (
                self._connection,
                now_us(),
                message.mid,
                message.qos,
                message.payload,
                message.topic,
                bool(message.retain),
            )
        )
        n = len(arrivals)
        if n == 1 or n >= self.max_batch:
            self._arrived.set()

    # --- storing ------------------------------------------------------------------

    def _next_batch(self) -> list[Arrival]:
        """The messages waiting: up to ``max_batch``, gathered for up to ``batch_wait_ms``."""
        arrivals, arrived = self._arrivals, self._arrived
        arrived.clear()  # then look: a message appended since is seen, or sets it again
        if not arrivals and not arrived.wait(0.2):
            return []
        deadline = time.monotonic() + self.batch_wait_ms / 1000.0
        while len(arrivals) < self.max_batch:
            arrived.clear()
            remaining = deadline - time.monotonic()
            if remaining <= 0 or len(arrivals) >= self.max_batch:
                break
            arrived.wait(remaining)
        return [arrivals.popleft() for _ in range(min(len(arrivals), self.max_batch))]

    def _store_and_ack(self, client: mqtt.Client, batch: list[Arrival]) -> None:
        """Store the batch's records, then ack its messages; bad ones go to the policy first.

        The payloads become one Arrow array at once (length and UTF-8 checked by Arrow),
        under a declared schema one table (:func:`.batch_columns`); a batch with a bad message
        goes message by message, where the policy sees which message.
        """
        columns = batch_columns(batch, self.record_schema, self.default_records, self.record_limit)
        if columns is not None:
            times = pa.array(list(map(itemgetter(TIME), batch)), pa.int64())
            self._store_then_ack(client, columns, times, batch)
            return
        records: list[Any] = []
        times_us: list[int] = []
        done: list[Arrival] = []
        limit = self.record_limit
        for arrival in batch:
            d = delivery(arrival)
            try:
                record = message_record(d, self.record_schema, self.default_records, limit)
            except ReceiverError as e:
                if self.bad_record_policy is BadRecordPolicy.FAIL:
                    self._store_then_ack(client, records, times_us, done)  # keep those before it
                    records, times_us, done = [], [], []
                # raises under "fail": the message is not acked; else it is acked below
                self.handle_bad_record(d.payload, str(e), key=f"topic {d.topic}")
            else:
                records.append(record)
                times_us.append(d.arrived_us)
            done.append(arrival)
        self._store_then_ack(client, records, times_us, done)

    def _store_then_ack(
        self,
        client: mqtt.Client,
        records: list[Any] | pa.Array,
        times: list[int] | pa.Array,
        done: list[Arrival],
    ) -> None:
        if len(records):
            self.store_records(records, reliable=True, times_us=times)
            self.records_stored += len(records)
            self.mark_healthy()
        current = self._connection
        acked = 0
        for connection, _, mid, qos, *_ in done:
            if qos == 0:
                continue
            if connection != current:
                # Its connection dropped: the broker will send it again on this session.
                continue
            client.ack(mid, qos)
            acked += 1
        self.messages_acked += acked
