"""``mqtts://`` for ``ingest``: :class:`MqttReceiver` connecting over TLS.

MqttReceiver has no TLS option yet; until it takes one (then this module goes and
``mqtts://`` passes it), this subclass sets TLS up on the paho client before it
connects. Its ``_connect`` is MqttReceiver's with ``tls_set`` added: keep the two
in step. It runs in the receiver's task (executor code): it imports no driver code.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from spark_receivers.receivers.mqtt import MqttReceiver

if TYPE_CHECKING:
    import paho.mqtt.client as mqtt

__all__ = ["MqttTlsReceiver"]


class MqttTlsReceiver(MqttReceiver):
    """An :class:`MqttReceiver` whose connection is TLS (``mqtts://``, port 8883 by default).

    ``ca_certs``: PEM file of the CAs to trust (None: the system's); ``certfile`` and
    ``keyfile``: a client certificate, when the broker asks for one. The broker's
    certificate and host name are always verified.
    """

    def __init__(
        self,
        host: str,
        port: int = 8883,
        topic: str = "#",
        *,
        ca_certs: str | None = None,
        certfile: str | None = None,
        keyfile: str | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(host, port, topic, **kwargs)
        self.ca_certs = ca_certs
        self.certfile = certfile
        self.keyfile = keyfile

    def describe(self) -> str:
        """``MQTT broker <host>:<port> (TLS)``."""
        return f"{super().describe()} (TLS)"

    def _connect(self) -> mqtt.Client:
        import paho.mqtt.client as mqtt

        client = mqtt.Client(
            mqtt.CallbackAPIVersion.VERSION2,
            client_id=self.client_name,
            clean_session=False,
            protocol=mqtt.MQTTv311,
            manual_ack=True,
        )
        client.tls_set(ca_certs=self.ca_certs, certfile=self.certfile, keyfile=self.keyfile)
        if self.username is not None:
            client.username_pw_set(self.username, self.password)
        client.reconnect_delay_set(1, max(1, self.max_backoff_ms // 1000))
        client.on_connect = self._on_connect
        client.on_disconnect = self._on_disconnect
        client.on_message = self._on_message
        client.on_subscribe = self._on_subscribe
        client.connect(self.host, self.port, keepalive=self.keepalive_s)
        return client
