"""The Flight endpoint refuses strangers and bad messages, and keeps serving."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.flight as flight
import pytest

from spark_receivers.errors import AuthenticationError, RpcError
from spark_receivers.rpc import messages as m
from spark_receivers.rpc.auth import AUTH_HEADER, TokenVerifier, new_secret, sign
from spark_receivers.rpc.transport import EndpointClient, FlightEndpoint


@pytest.fixture
def endpoint():
    secret = new_secret()
    seen = []

    def handler(msg):
        seen.append(msg)
        return True

    ep = FlightEndpoint(
        "test",
        "127.0.0.1",
        secret,
        m.TRACKER_MESSAGES,
        handler,
        lambda ticket: pa.table({"value": [ticket.decode()]}),
    )
    yield ep, secret, seen
    ep.close()


def test_authenticated_calls_work(endpoint):
    ep, secret, seen = endpoint
    client = EndpointClient(ep.address, secret)
    assert client.call(m.ReportError(0, "x", "")) is True
    assert client.read_table(b"input-0-1-2").column("value").to_pylist() == ["input-0-1-2"]
    assert seen == [m.ReportError(0, "x", "")]
    client.close()


def test_unauthenticated_calls_are_refused(endpoint):
    ep, _, seen = endpoint
    raw = flight.FlightClient(f"grpc+tcp://{ep.address}")
    with pytest.raises(flight.FlightUnauthenticatedError, match="no credentials"):
        list(raw.do_action(flight.Action("ReportError", m.encode(m.ReportError(0, "x", "")))))
    with pytest.raises(flight.FlightUnauthenticatedError):
        raw.do_get(flight.Ticket(b"input-0-1-2")).read_all()
    wrong = EndpointClient(ep.address, new_secret())
    with pytest.raises(AuthenticationError, match="wrong credentials"):
        wrong.call(m.ReportError(0, "x", ""))
    assert seen == []


def test_replayed_token_is_refused(endpoint):
    ep, secret, seen = endpoint
    token = sign(secret).encode()
    raw = flight.FlightClient(f"grpc+tcp://{ep.address}")
    options = flight.FlightCallOptions(headers=[(AUTH_HEADER.encode(), token)])
    action = flight.Action("ReportError", m.encode(m.ReportError(0, "x", "")))
    list(raw.do_action(action, options=options))
    with pytest.raises(flight.FlightUnauthenticatedError, match="replayed"):
        list(raw.do_action(action, options=options))
    assert len(seen) == 1


def test_bad_message_gets_an_error_and_the_server_keeps_going(endpoint):
    ep, secret, _ = endpoint
    client = EndpointClient(ep.address, secret)
    with pytest.raises(RpcError, match="unknown message type"):
        client.call(m.StopReceiver())
    assert client.call(m.ReportError(1, "still here", "")) is True


def test_token_verifier_rules():
    secret = new_secret()
    verifier = TokenVerifier(secret, max_skew_ms=1000)
    assert verifier.verify(sign(secret, now_ms=10_000), now_ms=10_500) is None
    assert verifier.verify(sign(secret, now_ms=10_000), now_ms=20_000) == "expired credentials"
    assert verifier.verify("garbage", now_ms=0) == "malformed credentials"
    assert verifier.verify(None) == "no credentials"
