"""TLS on the Flight endpoint: calls over TLS work; plaintext and untrusting clients fail."""

from __future__ import annotations

import shutil
import subprocess

import pytest

from spark_receivers.errors import ConfigError, RpcError
from spark_receivers.rpc import messages as m
from spark_receivers.rpc.auth import new_secret
from spark_receivers.rpc.tls import TlsConfig
from spark_receivers.rpc.transport import EndpointClient, FlightEndpoint


def make_cert(directory, name: str) -> tuple[str, str]:
    if shutil.which("openssl") is None:
        pytest.fail("openssl is needed to make test certificates (apt-get install openssl)")
    cert, key = directory / f"{name}.pem", directory / f"{name}.key"
    subprocess.run(
        [
            "openssl",
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "1",
            "-subj",
            "/CN=127.0.0.1",
            "-addext",
            "subjectAltName=IP:127.0.0.1,IP:127.0.0.2,IP:127.0.0.3,DNS:localhost",
            "-keyout",
            str(key),
            "-out",
            str(cert),
        ],
        check=True,
        capture_output=True,
    )
    return str(cert), str(key)


def test_calls_over_tls(tmp_path):
    cert, key = make_cert(tmp_path, "server")
    tls = TlsConfig(cert, key, cert)
    secret = new_secret()
    seen = []
    ep = FlightEndpoint(
        "tls",
        "127.0.0.1",
        secret,
        m.TRACKER_MESSAGES,
        lambda msg: seen.append(msg) or True,
        tls=tls,
    )
    try:
        client = EndpointClient(ep.address, secret, tls=tls)
        assert client.call(m.ReportError(0, "over tls", "")) is True
        client.close()
        # A plaintext client cannot talk to a TLS endpoint.
        plain = EndpointClient(ep.address, secret, timeout_s=5)
        with pytest.raises(RpcError):
            plain.call(m.ReportError(0, "plain", ""))
        # A client that trusts another CA refuses the server.
        other_cert, other_key = make_cert(tmp_path, "other")
        untrusting = EndpointClient(
            ep.address, secret, timeout_s=5, tls=TlsConfig(other_cert, other_key, other_cert)
        )
        with pytest.raises(RpcError):
            untrusting.call(m.ReportError(0, "untrusted", ""))
    finally:
        ep.close()
    assert [x.message for x in seen] == ["over tls"]


def test_missing_certificate_files_fail_clearly(tmp_path):
    tls = TlsConfig(
        str(tmp_path / "nope.pem"), str(tmp_path / "nope.key"), str(tmp_path / "ca.pem")
    )
    with pytest.raises(ConfigError, match=r"TlsConfig\.cert_file: cannot read"):
        FlightEndpoint(
            "tls", "127.0.0.1", new_secret(), m.TRACKER_MESSAGES, lambda msg: True, tls=tls
        )
    with pytest.raises(ConfigError, match="must be a path"):
        TlsConfig("", "k", "c")
