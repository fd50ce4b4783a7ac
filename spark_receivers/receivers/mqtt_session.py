"""The MQTT session of an ``MqttReceiver``: its expiry, and telling a takeover from a blip.

A client id is the key of a broker's session. When a second client connects
with the same id, the broker closes the first one's connection: an MQTT 5
broker may say so (a DISCONNECT with reason code 142, "session taken over"),
others just close it (mosquitto 2.0.11, every MQTT 3.1.1 broker).
:class:`TakeoverDetector` tells the receiver when that is what happened.

Plain state, no threads: the receiver calls it from paho's network thread.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from spark_receivers.receiver.source_support import durable_scope

__all__ = [
    "APPLICATION_SESSION_EXPIRY_S",
    "NEVER_EXPIRES",
    "SHORT_CONNECTION_S",
    "SUSPECT_DROPS",
    "Drop",
    "TakeoverDetector",
    "session_expiry",
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


def session_expiry(
    clean_session: bool, session_expiry_s: int | None, client_id: str | None, supervisor: Any
) -> int:
    """The MQTT 5 session expiry interval to send on CONNECT, in seconds.

    0 for a clean session; ``session_expiry_s`` when given; else an hour for a
    client id derived from the application id, and "never" for one given
    explicitly or derived from a checkpoint directory (a restarted job resumes it).
    """
    if clean_session:
        return 0
    if session_expiry_s is not None:
        return session_expiry_s
    derived = client_id is None and durable_scope(supervisor) == "application"
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
