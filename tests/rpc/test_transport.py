"""The Flight endpoint refuses strangers and bad messages, and keeps serving."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.flight as flight
import pytest

from spark_receivers.errors import AuthenticationError, ConfigError, RpcError
from spark_receivers.rpc import codec
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


def test_an_endpoint_made_without_a_handler_answers_nothing_until_it_serves():
    """Bound (its address known) before its handler exists; no call reaches a handler."""
    secret = new_secret()
    seen = []
    ep = FlightEndpoint("test", "127.0.0.1", secret, m.TRACKER_MESSAGES, None)
    client = EndpointClient(ep.address, secret)
    try:
        with pytest.raises(RpcError, match="test is not serving yet"):
            client.call(m.ReportError(0, "early", ""))
        with pytest.raises(RpcError, match="not serving yet"):
            client.ping()
        # Without the secret: refused as unauthenticated, before anything else is said.
        stranger = EndpointClient(ep.address, new_secret())
        with pytest.raises(AuthenticationError, match="wrong credentials"):
            stranger.call(m.ReportError(0, "early", ""))
        stranger.close()
        ep.serve(lambda msg: seen.append(msg) or True)
        assert client.call(m.ReportError(0, "x", "")) is True
        assert seen == [m.ReportError(0, "x", "")]
        with pytest.raises(RpcError, match="serving already"):
            ep.serve(lambda msg: None)
    finally:
        client.close()
        ep.close()


def test_unauthenticated_calls_are_refused(endpoint):
    ep, _, seen = endpoint
    raw = flight.FlightClient(f"grpc+tcp://{ep.address}")
    with pytest.raises(flight.FlightUnauthenticatedError, match="no credentials"):
        list(raw.do_action(flight.Action("ReportError", codec.encode(m.ReportError(0, "x", "")))))
    with pytest.raises(flight.FlightUnauthenticatedError):
        raw.do_get(flight.Ticket(b"input-0-1-2")).read_all()
    wrong = EndpointClient(ep.address, new_secret())
    with pytest.raises(AuthenticationError, match="wrong credentials"):
        wrong.call(m.ReportError(0, "x", ""))
    assert seen == []


def _raw_action(address: str, token: str, message) -> list:
    raw = flight.FlightClient(f"grpc+tcp://{address}")
    options = flight.FlightCallOptions(headers=[(AUTH_HEADER.encode(), token.encode())])
    try:
        return list(
            raw.do_action(flight.Action(type(message).__name__, codec.encode(message)), options)
        )
    finally:
        raw.close()


def test_replayed_token_is_refused(endpoint):
    ep, secret, seen = endpoint
    message = m.ReportError(0, "x", "")
    token = sign(secret, ep.address, "DoAction", "ReportError", codec.encode(message))
    _raw_action(ep.address, token, message)
    with pytest.raises(flight.FlightUnauthenticatedError, match="replayed"):
        _raw_action(ep.address, token, message)
    assert len(seen) == 1


def test_a_token_is_refused_with_another_body_or_another_action(endpoint):
    ep, secret, seen = endpoint
    signed = m.ReportError(0, "x", "")
    token = sign(secret, ep.address, "DoAction", "ReportError", codec.encode(signed))
    with pytest.raises(flight.FlightUnauthenticatedError, match="wrong credentials"):
        _raw_action(ep.address, token, m.ReportError(0, "another body", ""))
    with pytest.raises(flight.FlightUnauthenticatedError, match="wrong credentials"):
        _raw_action(ep.address, token, m.DeregisterReceiver(0, "x", ""))
    # A block read token does not open another block.
    read = sign(secret, ep.address, "DoGet", "", b"input-0-1-2")
    raw = flight.FlightClient(f"grpc+tcp://{ep.address}")
    options = flight.FlightCallOptions(headers=[(AUTH_HEADER.encode(), read.encode())])
    with pytest.raises(flight.FlightUnauthenticatedError, match="wrong credentials"):
        raw.do_get(flight.Ticket(b"input-0-1-3"), options=options).read_all()
    raw.close()
    # The untouched call still goes through with that very token: it was never spent.
    _raw_action(ep.address, token, signed)
    assert seen == [signed]


def test_a_token_seen_at_one_endpoint_is_refused_at_another(endpoint):
    """An AddBlock-style call to the tracker, replayed as the same call to a receiver."""
    ep, secret, seen = endpoint
    other_seen = []
    other = FlightEndpoint(
        "receiver-0",
        "127.0.0.1",
        secret,
        m.TRACKER_MESSAGES,
        lambda msg: other_seen.append(msg) or True,
    )
    try:
        message = m.ReportError(0, "x", "")
        token = sign(secret, ep.address, "DoAction", "ReportError", codec.encode(message))
        with pytest.raises(flight.FlightUnauthenticatedError, match="wrong credentials"):
            _raw_action(other.address, token, message)
        assert other_seen == []
        _raw_action(ep.address, token, message)
        assert seen == [message]
    finally:
        other.close()


def test_the_secret_and_tokens_never_reach_refusals_or_logs(endpoint, caplog):
    ep, secret, _ = endpoint
    message = m.ReportError(0, "x", "")
    token = sign(secret, ep.address, "DoAction", "ReportError", codec.encode(message))
    texts = []
    with caplog.at_level("DEBUG"):
        _raw_action(ep.address, token, message)
        for bad in (token, token[:-1] + "0", "1.2.3"):
            try:
                _raw_action(ep.address, bad, m.ReportError(1, "y", ""))
            except flight.FlightUnauthenticatedError as e:
                texts.append(str(e))
        wrong = EndpointClient(ep.address, new_secret())
        with pytest.raises(AuthenticationError) as refused:
            wrong.call(message)
        texts.append(str(refused.value))
        wrong.close()
    assert len(texts) == 4
    everything = "\n".join([*texts, caplog.text])
    assert "refused" in everything
    assert secret not in everything
    assert token.rsplit(".", 1)[1] not in everything
    assert token.split(".")[1] not in everything


def test_ping_is_an_authenticated_list_actions(endpoint):
    ep, secret, _ = endpoint
    client = EndpointClient(ep.address, secret)
    assert client.ping() == len(m.TRACKER_MESSAGES)
    with pytest.raises(AuthenticationError):
        EndpointClient(ep.address, new_secret()).ping()
    client.close()


def test_an_endpoint_binds_a_port_range_and_advertises_another_host():
    secret = new_secret()
    first = FlightEndpoint("a", "127.0.0.1", secret, m.TRACKER_MESSAGES, lambda msg: True)
    port = first.port
    try:
        # The range starts at a taken port: the next free one is used.
        second = FlightEndpoint(
            "b",
            "127.0.0.1",
            secret,
            m.TRACKER_MESSAGES,
            lambda msg: True,
            advertise_host="localhost",
            ports=(port, port + 20),
        )
        try:
            assert port < second.port <= port + 20
            assert second.address == f"127.0.0.1:{second.port}"  # a literal, never a name
            assert EndpointClient(second.address, secret).call(m.ReportError(0, "x", "")) is True
        finally:
            second.close()
        with pytest.raises(RpcError, match=f"ports {port}-{port}"):
            FlightEndpoint(
                "c", "127.0.0.1", secret, m.TRACKER_MESSAGES, lambda msg: True, ports=(port, port)
            )
    finally:
        first.close()


def test_a_name_is_bound_and_advertised_as_one_literal_address():
    # gRPC resolves "localhost" to 127.0.0.1 and ::1; given the name, a server whose
    # port was taken on 127.0.0.1 started on ::1 alone (gRPC only logged "Only 1 addresses
    # added out of total 2 resolved") and its clients reached the other server.
    secret = new_secret()
    taken = FlightEndpoint("taken", "127.0.0.1", secret, m.SUPERVISOR_MESSAGES, lambda msg: True)
    try:
        with pytest.raises(RpcError, match=rf"could not bind 127\.0\.0\.1 on ports {taken.port}"):
            FlightEndpoint(
                "b", "localhost", secret, m.TRACKER_MESSAGES, lambda msg: True,
                ports=(taken.port, taken.port),
            )  # fmt: skip
        free = FlightEndpoint("c", "localhost", secret, m.TRACKER_MESSAGES, lambda msg: True)
        try:
            assert free.address == f"127.0.0.1:{free.port}"
            assert EndpointClient(free.address, secret).ping() == len(m.TRACKER_MESSAGES)
        finally:
            free.close()
    finally:
        taken.close()


def test_an_endpoint_never_advertises_a_wildcard():
    with pytest.raises(ConfigError, match=r"0\.0\.0\.0"):
        FlightEndpoint("w", "0.0.0.0", new_secret(), m.TRACKER_MESSAGES, lambda msg: True)


def test_bad_message_gets_an_error_and_the_server_keeps_going(endpoint):
    ep, secret, _ = endpoint
    client = EndpointClient(ep.address, secret)
    with pytest.raises(RpcError, match="unknown message type"):
        client.call(m.StopReceiver())
    assert client.call(m.ReportError(1, "still here", "")) is True


def test_token_verifier_rules():
    secret = new_secret()
    verifier = TokenVerifier(secret, "h:1", max_skew_ms=1000)

    def token(now_ms: int, endpoint: str = "h:1") -> str:
        return sign(secret, endpoint, "DoAction", "AddBlock", b"{}", now_ms=now_ms)

    assert verifier.verify(token(10_000), "DoAction", "AddBlock", b"{}", now_ms=10_500) is None
    expired = verifier.verify(token(10_000), "DoAction", "AddBlock", b"{}", now_ms=20_000)
    assert expired == "expired credentials"
    assert verifier.verify(token(10_000, "h:2"), "DoAction", "AddBlock", b"{}", now_ms=10_000)
    assert verifier.verify(token(10_000), "DoGet", "AddBlock", b"{}", now_ms=10_000)
    assert verifier.verify("garbage", "DoAction", now_ms=0) == "malformed credentials"
    assert verifier.verify(None, "DoAction") == "no credentials"
