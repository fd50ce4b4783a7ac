"""Arrow Flight transport: authenticated control actions and block streams.

A :class:`FlightEndpoint` is a Flight server bound to one literal address (a name
it is given is resolved once, :func:`~spark_receivers.rpc.hosts.literal_address`;
it never advertises 0.0.0.0) whose every call must carry a token signed for
exactly that call at that endpoint (see :mod:`spark_receivers.rpc.auth`);
control messages are Flight actions named by the message type with a JSON
body, blocks are served by ``do_get``.
:class:`EndpointClient` signs every call it makes for the address it calls.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pyarrow as pa
import pyarrow.flight as flight

from spark_receivers.errors import AuthenticationError, ConfigError, RpcError
from spark_receivers.rpc import codec
from spark_receivers.rpc.auth import AUTH_HEADER, TokenVerifier, sign
from spark_receivers.rpc.hosts import WILDCARD_HOSTS, literal_address
from spark_receivers.rpc.tls import TlsConfig

log = logging.getLogger(__name__)

Handler = Callable[[Any], Any]


_METHODS = {
    flight.FlightMethod.DO_ACTION: "DoAction",
    flight.FlightMethod.DO_GET: "DoGet",
    flight.FlightMethod.DO_PUT: "DoPut",
    flight.FlightMethod.LIST_ACTIONS: "ListActions",
}
"""The Flight methods an endpoint answers, by the name their tokens are signed for."""


class _CallToken(flight.ServerMiddleware):  # type: ignore[misc]
    """The token a call carried, kept until the handler has the body to check it against."""

    def __init__(self, token: str) -> None:
        super().__init__()
        self.token = token


class _AuthMiddlewareFactory(flight.ServerMiddlewareFactory):  # type: ignore[misc]
    """Refuses calls without a well-formed token; the handler checks it against the call."""

    def __init__(self, name: str) -> None:
        super().__init__()
        self._name = name

    def start_call(self, info: Any, headers: dict[str, list[Any]]) -> _CallToken:
        values = headers.get(AUTH_HEADER) or []
        token = values[0] if values else None
        if isinstance(token, bytes):
            token = token.decode("ascii", "replace")
        reason = TokenVerifier.well_formed(token)
        if reason is None and info.method not in _METHODS:
            reason = "method not served"
        if reason is not None:
            log.warning("%s refused a %s call: %s", self._name, info.method, reason)
            msg = f"{self._name}: {reason}"
            raise flight.FlightUnauthenticatedError(msg)
        assert token is not None
        return _CallToken(token)


def _bind(
    name: str,
    host: str,
    location: Callable[[int], str],
    ports: tuple[int, int],
    start: Callable[[str], None],
) -> None:
    """Start the server on ``host`` at the first free port of ``ports`` (``(0, 0)``: any)."""
    first, last = ports
    error: Exception | None = None
    for port in range(first, last + 1):
        try:
            start(location(port))
        except (pa.ArrowException, OSError) as e:  # gRPC says only "did not start properly"
            error = e
            continue
        return
    span = "any port" if first == 0 else f"ports {first}-{last}"
    msg = f"{name} could not bind {host} on {span} (in use?): {error}"
    raise RpcError(msg) from error


@contextlib.contextmanager
def _failure_as_reply() -> Iterator[None]:
    """Any failure of a block read or store is the client's error reply, not the server's."""
    try:
        yield
    except Exception as e:  # noqa: BLE001 - the client gets the error; the server goes on
        raise flight.FlightServerError(str(e)) from None


def host_port(host: str, port: int) -> str:
    """``host:port``, with an IPv6 address in brackets."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


class FlightEndpoint(flight.FlightServerBase):  # type: ignore[misc]
    """A Flight server with call-bound token authentication on every call.

    ``handler(message)`` answers control actions (run on gRPC threads, may block
    briefly); ``block_reader(ticket_bytes)`` returns a :class:`pyarrow.Table` for
    ``do_get``; ``block_writer(command_bytes, table)`` takes a table sent by
    ``do_put`` (its return is the acknowledgement; raising refuses it; the token
    covers the command, the data is covered by TLS when on). Messages are decoded
    against ``accepted`` only.

    Made with ``handler=None``, the endpoint is bound (its :attr:`address` is known)
    but answers no call until :meth:`serve` gives it its handler: a call before that
    is refused as unavailable, by the transport, and reaches no handler. That is how
    a part whose address others must know when they are made (the driver's tracker
    endpoint: the receivers' task specs name it) still never answers before the part
    that handles its calls exists.

    The server binds ``host`` (``0.0.0.0`` binds every interface) on the first
    free port of ``ports`` (inclusive; ``(0, 0)`` or ``port`` for one port) and
    advertises ``advertise_host`` (default ``host``) with that port: that address
    is what clients connect to and what their tokens are signed for. Both are one
    literal address: a name is resolved once (the advertised one to the bound
    address when it resolves to it), so the server never binds part of what a name
    resolves to, nor advertises a name its clients could resolve to another
    server. A port taken on that address refuses the start (:class:`RpcError`
    naming the address). With ``tls`` it serves TLS only; with ``tls.client_auth`` it
    also refuses, at the TLS handshake, a client without a certificate its CA signed.
    """

    def __init__(
        self,
        name: str,
        host: str,
        secret: str,
        accepted: tuple[type, ...],
        handler: Handler | None,
        block_reader: Callable[[bytes], pa.Table] | None = None,
        max_message_bytes: int = 4 * 1024 * 1024,
        port: int = 0,
        tls: TlsConfig | None = None,
        *,
        advertise_host: str | None = None,
        ports: tuple[int, int] | None = None,
        block_writer: Callable[[bytes, pa.Table], None] | None = None,
    ) -> None:
        self._name = name
        self._block_writer = block_writer
        self._accepted = accepted
        self._handler = handler
        self._serving = threading.Event()
        if handler is not None:
            self._serving.set()
        self._block_reader = block_reader
        self._max_message_bytes = max_message_bytes
        if (advertise_host or host) in WILDCARD_HOSTS:
            msg = (
                f"{name} would advertise {advertise_host or host!r}, which no client can "
                "connect to: give it the host name or address clients reach it by"
            )
            raise ConfigError(msg)
        bind = literal_address(host, f"the bind address of {name}")
        self.host = literal_address(
            advertise_host or host,
            f"the advertised host of {name}",
            prefer=None if bind in WILDCARD_HOSTS else bind,
        )
        scheme = "grpc+tls" if tls is not None else "grpc+tcp"
        certificates = (
            [flight.CertKeyPair(tls.cert_pem(), tls.key_pem())] if tls is not None else []
        )
        self._verifier = TokenVerifier(secret)
        factory = _AuthMiddlewareFactory(name)

        mutual = tls is not None and tls.client_auth
        client_ca = tls.ca_pem() if tls is not None and mutual else None

        def start(location: str) -> None:
            super(FlightEndpoint, self).__init__(
                location=location,
                middleware={"auth": factory},
                tls_certificates=certificates,
                verify_client=mutual,
                root_certificates=client_ca,
            )

        location = lambda p: f"{scheme}://{host_port(bind, p)}"  # noqa: E731
        _bind(name, bind or "every interface", location, ports or (port, port), start)
        self._verifier.endpoint = self.address
        self._closed = threading.Event()

    def serve(self, handler: Handler) -> None:
        """Start answering calls, each control action with ``handler``; once only."""
        if self._serving.is_set():
            msg = f"{self._name} is serving already"
            raise RpcError(msg)
        self._handler = handler
        self._serving.set()

    def _check(self, context: Any, method: str, name: str, body: bytes) -> None:
        """Refuse the call unless its token was signed for exactly this call here, and serving.

        Authentication first: a client without the secret learns nothing, not even
        whether the endpoint serves yet.
        """
        found = context.get_middleware("auth")
        token = found.token if isinstance(found, _CallToken) else None
        reason = self._verifier.verify(token, method, name, body)
        if reason is not None:
            log.warning("%s refused a %s %s call: %s", self._name, method, name[:80], reason)
            msg = f"{self._name}: {reason}"
            raise flight.FlightUnauthenticatedError(msg)
        if not self._serving.is_set():
            msg = f"{self._name} is not serving yet"
            raise flight.FlightUnavailableError(msg)

    @property
    def address(self) -> str:
        """``host:port`` clients should connect to (one literal address)."""
        return host_port(self.host, self.port)

    def do_action(self, context: Any, action: flight.Action) -> Iterator[flight.Result]:
        """Decode, validate and dispatch one control message."""
        kind = action.type
        body = action.body.to_pybytes() if action.body is not None else b""
        self._check(context, "DoAction", kind, body)
        try:
            message = codec.decode(kind, body, self._accepted, self._max_message_bytes)
        except RpcError as e:
            log.warning("%s refused a bad %s message: %s", self._name, kind[:80], e)
            raise flight.FlightServerError(str(e)) from None
        handler = self._handler
        assert handler is not None  # _check refuses calls until serve() set it
        try:
            reply = handler(message)
        except RpcError as e:
            raise flight.FlightServerError(str(e)) from None
        except Exception as e:
            log.exception("%s failed to handle %s", self._name, kind)
            msg = f"{self._name} failed to handle {kind}: {e}"
            raise flight.FlightServerError(msg) from None
        yield flight.Result(pa.py_buffer(codec.json_reply(reply)))

    def do_get(self, context: Any, ticket: flight.Ticket) -> flight.RecordBatchStream:
        """Stream the block named by ``ticket``."""
        self._check(context, "DoGet", "", ticket.ticket)
        if self._block_reader is None:
            msg = f"{self._name} serves no blocks"
            raise flight.FlightServerError(msg)
        with _failure_as_reply():
            table = self._block_reader(ticket.ticket)
        return flight.RecordBatchStream(table)

    def do_put(
        self,
        context: Any,
        descriptor: flight.FlightDescriptor,
        reader: flight.MetadataRecordBatchReader,
        writer: flight.FlightMetadataWriter,
    ) -> None:
        """Take the table a client sends; returning normally acknowledges it."""
        command = descriptor.command or b""
        self._check(context, "DoPut", "", command)
        if self._block_writer is None:
            msg = f"{self._name} takes no blocks"
            raise flight.FlightServerError(msg)
        if len(command) > self._max_message_bytes:
            msg = f"{self._name}: a put descriptor of {len(command)} bytes is too large"
            raise flight.FlightServerError(msg)
        table = reader.read_all()
        with _failure_as_reply():
            self._block_writer(command, table)

    def list_actions(self, context: Any) -> list[tuple[str, str]]:
        """The control messages this endpoint accepts (a cheap authenticated ping)."""
        self._check(context, "ListActions", "", b"")
        return [(c.__name__, (c.__doc__ or "").strip()) for c in self._accepted]

    def close(self) -> None:
        """Stop serving; idempotent."""
        if not self._closed.is_set():
            self._closed.set()
            self.shutdown()


class EndpointClient:
    """A client of a :class:`FlightEndpoint` that signs every call for that endpoint.

    ``address`` must be the ``host:port`` the endpoint advertises: tokens are
    signed for it. Thread-safe (gRPC channels are); ``timeout_s`` bounds every
    call. With ``tls`` the server is checked against its CA (and
    ``tls.server_name`` when set); with ``tls.client_auth`` the client presents the
    node's certificate (``tls.cert_file``/``key_file``).
    """

    def __init__(
        self, address: str, secret: str, timeout_s: float = 30.0, tls: TlsConfig | None = None
    ) -> None:
        self.address = address
        self._secret = secret
        self._timeout_s = timeout_s
        if tls is None:
            self._client = flight.FlightClient(f"grpc+tcp://{address}")
        else:
            mine = {"cert_chain": tls.cert_pem(), "private_key": tls.key_pem()}
            self._client = flight.FlightClient(
                f"grpc+tls://{address}",
                tls_root_certs=tls.ca_pem(),
                override_hostname=tls.server_name,
                **(mine if tls.client_auth else {}),
            )

    def _options(
        self, method: str, name: str, body: bytes, timeout_s: float | None = None
    ) -> flight.FlightCallOptions:
        token = sign(self._secret, self.address, method, name, body).encode()
        return flight.FlightCallOptions(
            timeout=timeout_s or self._timeout_s, headers=[(AUTH_HEADER.encode(), token)]
        )

    @contextlib.contextmanager
    def _errors_as_ours(self, what: str) -> Iterator[None]:
        """Flight's errors of one call as ours, the one mapping of every client call.

        Refused credentials become an :class:`AuthenticationError`, any other failure an
        :class:`RpcError` naming ``what``.
        """
        try:
            yield
        except flight.FlightUnauthenticatedError as e:
            msg = f"{self.address} refused our credentials: {e}"
            raise AuthenticationError(msg) from e
        except (flight.FlightError, OSError) as e:
            msg = f"{what} failed: {e}"
            raise RpcError(msg) from e

    def call(self, message: Any, timeout_s: float | None = None) -> Any:
        """Send a control message and return its decoded JSON reply."""
        kind, body = type(message).__name__, codec.encode(message)
        action = flight.Action(kind, body)
        options = self._options("DoAction", kind, body, timeout_s)
        with self._errors_as_ours(f"{kind} to {self.address}"):
            results = list(self._client.do_action(action, options=options))
        return codec.json_unreply(results[0].body.to_pybytes()) if results else None

    def ping(self, timeout_s: float | None = None) -> int:
        """An authenticated ``ListActions`` call; return how many actions the endpoint lists."""
        with self._errors_as_ours(f"reaching {self.address}"):
            actions = self._client.list_actions(
                options=self._options("ListActions", "", b"", timeout_s)
            )
        return len(actions)

    def read_table(self, ticket: bytes, timeout_s: float | None = None) -> pa.Table:
        """Read a whole stream served by ``do_get``."""
        with self._errors_as_ours(f"reading {ticket[:100]!r} from {self.address}"):
            options = self._options("DoGet", "", ticket, timeout_s)
            reader = self._client.do_get(flight.Ticket(ticket), options=options)
            return reader.read_all()

    def put_table(self, command: bytes, table: pa.Table, timeout_s: float | None = None) -> None:
        """Send ``table`` with ``do_put``; return once the server took it, else raise."""
        descriptor = flight.FlightDescriptor.for_command(command)
        with self._errors_as_ours(f"putting {command[:100]!r} to {self.address}"):
            options = self._options("DoPut", "", command, timeout_s)
            writer, _ = self._client.do_put(descriptor, table.schema, options)
            try:
                writer.write_table(table)
            finally:
                writer.close()

    def close(self) -> None:
        """Close the channel."""
        self._client.close()
