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


def test_mutual_tls_refuses_a_client_without_a_certificate_its_ca_signed(tmp_path):
    """clientAuth: the node's certificate serves both ends; no certificate, or another CA's, is
    refused at the handshake, before any token is looked at."""
    cert, key = make_cert(tmp_path, "node")
    mutual = TlsConfig(cert, key, cert, client_auth=True)
    secret = new_secret()
    seen = []
    ep = FlightEndpoint(
        "mtls", "127.0.0.1", secret, m.TRACKER_MESSAGES, lambda msg: seen.append(msg) or True,
        tls=mutual,
    )  # fmt: skip
    try:
        client = EndpointClient(ep.address, secret, tls=mutual)
        assert client.call(m.ReportError(0, "with a certificate", "")) is True
        client.close()
        # Trusts the server, presents nothing: refused.
        no_cert = EndpointClient(ep.address, secret, timeout_s=5, tls=TlsConfig(cert, key, cert))
        with pytest.raises(RpcError):
            no_cert.call(m.ReportError(0, "without a certificate", ""))
        # Presents a certificate the endpoint's CA did not sign: refused.
        other_cert, other_key = make_cert(tmp_path, "other")
        stranger = EndpointClient(
            ep.address,
            secret,
            timeout_s=5,
            tls=TlsConfig(other_cert, other_key, cert, client_auth=True),
        )
        with pytest.raises(RpcError):
            stranger.call(m.ReportError(0, "another CA's certificate", ""))
    finally:
        ep.close()
    assert [x.message for x in seen] == ["with a certificate"]


def test_without_client_auth_a_tls_endpoint_asks_for_no_certificate(tmp_path):
    cert, key = make_cert(tmp_path, "node")
    secret = new_secret()
    ep = FlightEndpoint(
        "tls", "127.0.0.1", secret, m.TRACKER_MESSAGES, lambda msg: True,
        tls=TlsConfig(cert, key, cert),
    )  # fmt: skip
    try:
        client = EndpointClient(ep.address, secret, timeout_s=5, tls=TlsConfig(cert, key, cert))
        assert client.call(m.ReportError(0, "no client certificate needed", "")) is True
        client.close()
    finally:
        ep.close()


def test_client_auth_needs_tls_and_a_boolean():
    from spark_receivers.config import StreamingConfig

    with pytest.raises(ConfigError, match=r"clientAuth.*tls\.enabled is false"):
        StreamingConfig(rpc_tls_client_auth=True)
    with pytest.raises(ConfigError, match="client_auth must be true or false"):
        TlsConfig("c", "k", "ca", client_auth="yes")  # type: ignore[arg-type]
    cfg = StreamingConfig(
        rpc_tls_enabled=True,
        rpc_tls_cert_file="c.pem",
        rpc_tls_key_file="k.pem",
        rpc_tls_ca_file="ca.pem",
        rpc_tls_client_auth=True,
    )
    assert cfg.tls is not None and cfg.tls.client_auth
