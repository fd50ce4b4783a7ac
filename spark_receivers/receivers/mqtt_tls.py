"""``MqttTlsReceiver``: :class:`MqttReceiver` over TLS (``mqtts://``)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from spark_receivers.receivers.mqtt import MqttReceiver

if TYPE_CHECKING:
    import paho.mqtt.client as mqtt

__all__ = ["MqttTlsReceiver"]


class MqttTlsReceiver(MqttReceiver):
    """An :class:`MqttReceiver` whose connection is TLS (port 8883 by default).

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

    def _configure(self, client: mqtt.Client) -> None:
        """Credentials, then TLS with the broker's certificate and host name verified."""
        super()._configure(client)
        client.tls_set(ca_certs=self.ca_certs, certfile=self.certfile, keyfile=self.keyfile)
