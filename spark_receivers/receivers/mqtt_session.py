"""The MQTT session of an ``MqttReceiver``: its terms, opened ahead, a takeover from a blip.

A client id is the key of a broker's session: its subscriptions and the
messages queued for it while its client is away. The receiver's is
``spark-receivers-<job>-<stream id>``: the job's id (``spark.receivers.jobId``,
else a random id its checkpoint keeps, read back by every restart from it
wherever it is mounted), else the Spark application id; never a path, which
every pod of a deployment shares. A broker keeps for a subscriber only what is
published once its subscription exists, and a receiver's task connects seconds
(on a busy cluster, a minute) after its job started: so :func:`open_session`
opens the session on the driver when the context starts (connect, subscribe,
disconnect), and what is published from then on waits for the receiver.

The terms (:func:`send_connect`, :func:`subscribe`): a persistent session unless
asked otherwise, with :func:`session_expiry`; under MQTT 5 ``max_batch`` messages
in flight (Receive Maximum: with mosquitto's default window of 20 a burst waited in
the broker's queue, which drops what passes ``max_queued_messages``). QoS 2 is
subscribed as QoS 1: in QoS 2 the subscriber takes a message over with PUBREC,
which paho sends before the message reaches the receiver, so a connection lost (or
a stop) before the store lost it; at QoS 1 it is acked after the store. Retained
messages are asked for only by a new subscription (MQTT 5), so stored once per
session; MQTT 3.1.1 has no such option and the broker sends them again at every
connection.

When a second client connects with the same id, the broker closes the first
one's connection: an MQTT 5 broker may say so (a DISCONNECT with reason code
142, "session taken over"), others just close it (mosquitto 2.0.11, every MQTT
3.1.1 broker). :class:`TakeoverDetector` tells the receiver when that is what
happened: plain state, no threads, called from paho's network thread.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from spark_receivers.errors import ReceiverError

if TYPE_CHECKING:
    import paho.mqtt.client as mqtt

__all__ = [
    "APPLICATION_SESSION_EXPIRY_S",
    "NEVER_EXPIRES",
    "SHORT_CONNECTION_S",
    "SUSPECT_DROPS",
    "Drop",
    "TakeoverDetector",
    "open_session",
    "send_connect",
    "session_expiry",
    "subscribe",
    "takeover_message",
]

SESSION_TAKEN_OVER = 142
"""MQTT 5 reason code of a DISCONNECT: another client connected with this client id."""
KEEPALIVE_TIMEOUT = 141
"""paho's reason code when the broker stopped answering (a network problem, not a takeover)."""
SHORT_CONNECTION_S = 10.0
SUSPECT_DROPS = 3
"""Connections in a row that the broker accepted and then closed within SHORT_CONNECTION_S,
after which a takeover is reported when the broker did not say so itself."""
NEVER_EXPIRES = 0xFFFFFFFF
APPLICATION_SESSION_EXPIRY_S = 3600
"""Session expiry of a client id derived from the application id (no checkpoint): no later
job can resume that session, so the broker may drop it an hour after the job is gone."""


def open_session(
    client: mqtt.Client,
    connect: Callable[[mqtt.Client], None],
    topic: str,
    qos: int,
    v5: bool,
    where: str,
    timeout_s: float = 10.0,
) -> bool:
    """Connect ``client``, subscribe it to ``topic`` at ``qos``, disconnect; return session present.

    The broker then keeps the session (its client id's) with the subscription, and
    queues what is published to ``topic`` for the receiver that connects later with
    that id. ``connect(client)`` sends the CONNECT (with the receiver's session
    settings); ``client`` must acknowledge nothing (``manual_ack``), so that a
    message delivered on this short connection (a retained one under MQTT 3.1.1)
    stays in the session for the receiver. Under MQTT 5 retained messages are not
    sent here (the receiver asks for them when it subscribes). Returns whether the
    session existed before (CONNACK's session present). Raises :class:`ReceiverError`
    naming ``where`` when the broker cannot be reached, refuses, or does not answer
    within ``timeout_s``. Blocks for at most about ``timeout_s``.
    """
    connected, subscribed = threading.Event(), threading.Event()
    answers: dict[str, Any] = {}

    def on_connect(c: Any, userdata: Any, flags: Any, reason_code: Any, props: Any) -> None:
        answers["connack"] = (reason_code, bool(flags.session_present))
        connected.set()
        if reason_code.is_failure:
            return
        if v5:
            from paho.mqtt.subscribeoptions import SubscribeOptions

            options = SubscribeOptions(qos=qos, retainHandling=SubscribeOptions.RETAIN_DO_NOT_SEND)
            c.subscribe(topic, options=options)
        else:
            c.subscribe(topic, qos)

    def on_subscribe(c: Any, userdata: Any, mid: int, reason_codes: Any, props: Any) -> None:
        answers["suback"] = [rc for rc in reason_codes if rc.is_failure]
        subscribed.set()

    client.on_connect = on_connect
    client.on_subscribe = on_subscribe
    client.connect_timeout = timeout_s
    try:
        connect(client)
    except OSError as e:
        msg = f"cannot connect to {where}: {e}"
        raise ReceiverError(msg) from e
    client.loop_start()
    try:
        if not connected.wait(timeout_s):
            msg = f"{where} did not answer the CONNECT within {timeout_s:g}s"
            raise ReceiverError(msg)
        reason_code, present = answers["connack"]
        if reason_code.is_failure:
            msg = f"{where} refused the connection: {reason_code}"
            raise ReceiverError(msg)
        if not subscribed.wait(timeout_s):
            msg = f"{where} did not answer the SUBSCRIBE to {topic!r} within {timeout_s:g}s"
            raise ReceiverError(msg)
        if answers["suback"]:
            msg = f"{where} refused the subscription to {topic!r}: {answers['suback'][0]}"
            raise ReceiverError(msg)
        return bool(present)
    finally:
        client.disconnect()
        client.loop_stop()


MAX_RECEIVE = 65_535
"""The largest MQTT 5 Receive Maximum (messages in flight to the client)."""


def send_connect(
    client: mqtt.Client,
    host: str,
    port: int,
    keepalive_s: int,
    v5: bool,
    clean: bool,
    expiry: int,
    in_flight: int,
) -> None:
    """Send the CONNECT of a receiver's session (OSError when the broker is unreachable).

    MQTT 5: a clean start only if ``clean``, the session expiry ``expiry`` and a
    Receive Maximum of ``in_flight`` (a batch's worth). MQTT 3.1.1: the client's
    own clean-session flag.
    """
    if not v5:
        client.connect(host, port, keepalive=keepalive_s)
        return
    from paho.mqtt.packettypes import PacketTypes
    from paho.mqtt.properties import Properties

    properties = Properties(PacketTypes.CONNECT)
    properties.SessionExpiryInterval = expiry
    properties.ReceiveMaximum = min(in_flight, MAX_RECEIVE)
    client.connect(host, port, keepalive=keepalive_s, clean_start=clean, properties=properties)


def subscribe(client: mqtt.Client, topic: str, qos: int, v5: bool, retained: bool) -> None:
    """Subscribe at ``qos``; under MQTT 5 retained messages only for a new subscription.

    ``retained``: ask for them anyway (the receiver's first subscription, when the
    session opened at start was new: that one asked for none).
    """
    if not v5:
        client.subscribe(topic, qos)
        return
    from paho.mqtt.subscribeoptions import SubscribeOptions

    handling = (
        SubscribeOptions.RETAIN_SEND_ON_SUBSCRIBE
        if retained
        else SubscribeOptions.RETAIN_SEND_IF_NEW_SUB
    )
    client.subscribe(topic, options=SubscribeOptions(qos=qos, retainHandling=handling))


def session_expiry(
    clean_session: bool, session_expiry_s: int | None, client_id: str | None, scope: str
) -> int:
    """The MQTT 5 session expiry interval to send on CONNECT, in seconds.

    0 for a clean session; ``session_expiry_s`` when given; else an hour for a
    client id derived from the application id (``scope`` ``"application"``: no later
    job can resume it), and "never" for one given explicitly or derived from the
    job's id (a job restarted from its checkpoint resumes it).
    """
    if clean_session:
        return 0
    if session_expiry_s is not None:
        return session_expiry_s
    derived = client_id is None and scope == "application"
    return APPLICATION_SESSION_EXPIRY_S if derived else NEVER_EXPIRES


@dataclass(frozen=True)
class Drop:
    """What a lost connection was: a takeover (said by the broker, or suspected) or not."""

    takeover: bool
    certain: bool
    lasted: bool
    """The connection lasted SHORT_CONNECTION_S or more: the source worked for a while."""


class TakeoverDetector:
    """Counts the connections the broker accepted and soon closed (see the module doc).

    Keep one per receiver, across its runs. Not thread-safe: paho's network thread
    calls :meth:`connected` and :meth:`dropped`; :meth:`connect_failed` comes from
    the receiver's thread between runs.
    """

    def __init__(self) -> None:
        self.short_drops = 0
        self._connected_at: float | None = None

    def connected(self, now_s: float) -> None:
        """The broker accepted a connection (a successful CONNACK)."""
        self._connected_at = now_s

    def connect_failed(self) -> None:
        """A connection could not be made: the broker is not simply handing the session around."""
        self.short_drops = 0
        self._connected_at = None

    def dropped(self, now_s: float, reason_code: int | None) -> Drop:
        """A connection ended without the receiver asking: say what it was."""
        connected_at, self._connected_at = self._connected_at, None
        lasted = connected_at is not None and now_s - connected_at >= SHORT_CONNECTION_S
        if lasted:
            self.short_drops = 0
        elif connected_at is not None and reason_code != KEEPALIVE_TIMEOUT:
            self.short_drops += 1
        if reason_code == SESSION_TAKEN_OVER:
            return Drop(takeover=True, certain=True, lasted=lasted)
        return Drop(takeover=self.short_drops == SUSPECT_DROPS, certain=False, lasted=lasted)


def takeover_message(host: str, port: int, client_id: str, certain: bool) -> str:
    """What to tell the driver about a takeover of ``client_id``'s session."""
    how = (
        "the broker said so (MQTT reason code 142, session taken over)"
        if certain
        else f"the broker accepted and then closed {SUSPECT_DROPS} connections in a row "
        f"within {SHORT_CONNECTION_S:g}s each"
    )
    return (
        f"another client connected to {host}:{port} with client id {client_id!r} and took "
        f"this receiver's session over ({how}): a client id must be used by one receiver "
        "only; give each job its own client_id (or leave it unset: derived per job and stream)"
    )
