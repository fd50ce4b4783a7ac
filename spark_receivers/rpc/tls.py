"""Optional TLS for every endpoint: certificates from PEM files.

``TlsConfig`` holds paths, not contents, so it ships with a receiver's task
as it is; the files must exist where the endpoint or client runs (the usual
way: the same path on every node, or ``--files`` with a relative path).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from spark_receivers.errors import ConfigError


@dataclass(frozen=True)
class TlsConfig:
    """Server certificate and key (PEM) and the CA that signed them (PEM).

    Every endpoint serves ``cert_file``/``key_file``; every client checks the
    server against ``ca_file`` (the certificate itself when it is self-signed).
    ``server_name`` overrides the name checked when certificates carry a fixed
    name rather than each host's address. With ``client_auth`` (mutual TLS) every
    endpoint also asks each client for a certificate signed by ``ca_file`` and
    refuses the connection without one, and every client presents
    ``cert_file``/``key_file``: the node's one certificate serves both ends.
    """

    cert_file: str
    key_file: str
    ca_file: str
    server_name: str | None = None
    client_auth: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.client_auth, bool):
            msg = f"TlsConfig.client_auth must be true or false, got {self.client_auth!r}"
            raise ConfigError(msg)
        for name in ("cert_file", "key_file", "ca_file"):
            value = getattr(self, name)
            if not isinstance(value, str) or not value:
                msg = f"TlsConfig.{name} must be a path to a PEM file, got {value!r}"
                raise ConfigError(msg)

    def _read(self, name: str) -> bytes:
        path = getattr(self, name)
        try:
            return Path(path).read_bytes()
        except OSError as e:
            msg = f"TlsConfig.{name}: cannot read {path!r}: {e.strerror or e}"
            raise ConfigError(msg) from e

    def cert_pem(self) -> bytes:
        """The server certificate chain."""
        return self._read("cert_file")

    def key_pem(self) -> bytes:
        """The server's private key."""
        return self._read("key_file")

    def ca_pem(self) -> bytes:
        """The certificates clients trust."""
        return self._read("ca_file")
