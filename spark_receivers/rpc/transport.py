"""Arrow Flight transport: authenticated control actions and block streams.

A :class:`FlightEndpoint` is a Flight server bound to the host it is given
(never 0.0.0.0 by default) whose every call must carry a valid signed token
(see :mod:`spark_receivers.rpc.auth`); control messages are Flight actions
named by the message type with a JSON body, blocks are served by ``do_get``.
:class:`EndpointClient` signs every call it makes.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pyarrow as pa
import pyarrow.flight as flight

from spark_receivers.errors import AuthenticationError, RpcError
from spark_receivers.rpc import messages
from spark_receivers.rpc.auth import AUTH_HEADER, TokenVerifier, sign
from spark_receivers.rpc.hosts import local_host
from spark_receivers.rpc.tls import TlsConfig

log = logging.getLogger(__name__)

Handler = Callable[[Any], Any]


class _AuthMiddlewareFactory(flight.ServerMiddlewareFactory):  # type: ignore[misc]
    def __init__(self, verifier: TokenVerifier, name: str) -> None:
        super().__init__()
        self._verifier = verifier
        self._name = name

    def start_call(self, info: Any, headers: dict[str, list[Any]]) -> None:
        values = headers.get(AUTH_HEADER) or []
        token = values[0] if values else None
        if isinstance(token, bytes):
            token = token.decode("ascii", "replace")
        reason = self._verifier.verify(token)
        if reason is not None:
            log.warning("%s refused a %s call: %s", self._name, info.method, reason)
            msg = f"{self._name}: {reason}"
            raise flight.FlightUnauthenticatedError(msg)


class FlightEndpoint(flight.FlightServerBase):  # type: ignore[misc]
    """A Flight server with signed-token authentication on every call.

    ``handler(message)`` answers control actions (run on gRPC threads, may block
    briefly); ``block_reader(ticket_bytes)`` returns a :class:`pyarrow.Table` for
    ``do_get``; ``block_writer(command_bytes, table)`` takes a table sent by
    ``do_put`` (its return is the acknowledgement; raising refuses it). Messages
    are decoded against ``accepted`` only.
    """

    def __init__(
        self,
        name: str,
        host: str,
        secret: str,
        accepted: tuple[type, ...],
        handler: Handler,
        block_reader: Callable[[bytes], pa.Table] | None = None,
        max_message_bytes: int = 4 * 1024 * 1024,
        port: int = 0,
        tls: TlsConfig | None = None,
        block_writer: Callable[[bytes, pa.Table], None] | None = None,
    ) -> None:
        self._name = name
        self._block_writer = block_writer
        self._accepted = accepted
        self._handler = handler
        self._block_reader = block_reader
        self._max_message_bytes = max_message_bytes
        self.host = host
        scheme = "grpc+tls" if tls is not None else "grpc+tcp"
        certificates = (
            [flight.CertKeyPair(tls.cert_pem(), tls.key_pem())] if tls is not None else []
        )
        super().__init__(
            location=f"{scheme}://{host}:{port}",
            middleware={"auth": _AuthMiddlewareFactory(TokenVerifier(secret), name)},
            tls_certificates=certificates,
        )
        self._closed = threading.Event()

    @property
    def address(self) -> str:
        """``host:port`` clients should connect to."""
        return f"{self.host}:{self.port}"

    def do_action(self, context: Any, action: flight.Action) -> Iterator[flight.Result]:
        """Decode, validate and dispatch one control message."""
        kind = action.type
        body = action.body.to_pybytes() if action.body is not None else b""
        try:
            message = messages.decode(kind, body, self._accepted, self._max_message_bytes)
        except RpcError as e:
            log.warning("%s refused a bad %s message: %s", self._name, kind[:80], e)
            raise flight.FlightServerError(str(e)) from None
        try:
            reply = self._handler(message)
        except RpcError as e:
            raise flight.FlightServerError(str(e)) from None
        except Exception as e:
            log.exception("%s failed to handle %s", self._name, kind)
            msg = f"{self._name} failed to handle {kind}: {e}"
            raise flight.FlightServerError(msg) from None
        yield flight.Result(pa.py_buffer(messages.json_reply(reply)))

    def do_get(self, context: Any, ticket: flight.Ticket) -> flight.RecordBatchStream:
        """Stream the block named by ``ticket``."""
        if self._block_reader is None:
            msg = f"{self._name} serves no blocks"
            raise flight.FlightServerError(msg)
        try:
            table = self._block_reader(ticket.ticket)
        except Exception as e:  # noqa: BLE001 - any read failure is the client's error reply
            raise flight.FlightServerError(str(e)) from None
        return flight.RecordBatchStream(table)

    def do_put(
        self,
        context: Any,
        descriptor: flight.FlightDescriptor,
        reader: flight.MetadataRecordBatchReader,
        writer: flight.FlightMetadataWriter,
    ) -> None:
        """Take the table a client sends; returning normally acknowledges it."""
        if self._block_writer is None:
            msg = f"{self._name} takes no blocks"
            raise flight.FlightServerError(msg)
        command = descriptor.command or b""
        if len(command) > self._max_message_bytes:
            msg = f"{self._name}: a put descriptor of {len(command)} bytes is too large"
            raise flight.FlightServerError(msg)
        table = reader.read_all()
        try:
            self._block_writer(command, table)
        except Exception as e:  # noqa: BLE001 - any store failure is the client's error reply
            raise flight.FlightServerError(str(e)) from None

    def list_actions(self, context: Any) -> list[tuple[str, str]]:
        """The control messages this endpoint accepts."""
        return [(c.__name__, (c.__doc__ or "").strip()) for c in self._accepted]

    def close(self) -> None:
        """Stop serving; idempotent."""
        if not self._closed.is_set():
            self._closed.set()
            self.shutdown()


class EndpointClient:
    """A client of a :class:`FlightEndpoint` that signs every call.

    Thread-safe (gRPC channels are); ``timeout_s`` bounds every call.
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
            self._client = flight.FlightClient(
                f"grpc+tls://{address}",
                tls_root_certs=tls.ca_pem(),
                override_hostname=tls.server_name,
            )

    def _options(self, timeout_s: float | None = None) -> flight.FlightCallOptions:
        token = sign(self._secret).encode()
        return flight.FlightCallOptions(
            timeout=timeout_s or self._timeout_s, headers=[(AUTH_HEADER.encode(), token)]
        )

    def call(self, message: Any, timeout_s: float | None = None) -> Any:
        """Send a control message and return its decoded JSON reply."""
        action = flight.Action(type(message).__name__, messages.encode(message))
        try:
            results = list(self._client.do_action(action, options=self._options(timeout_s)))
        except flight.FlightUnauthenticatedError as e:
            msg = f"{self.address} refused our credentials: {e}"
            raise AuthenticationError(msg) from e
        except (flight.FlightError, OSError) as e:
            msg = f"{type(message).__name__} to {self.address} failed: {e}"
            raise RpcError(msg) from e
        return messages.json_unreply(results[0].body.to_pybytes()) if results else None

    def read_table(self, ticket: bytes, timeout_s: float | None = None) -> pa.Table:
        """Read a whole stream served by ``do_get``."""
        try:
            reader = self._client.do_get(flight.Ticket(ticket), options=self._options(timeout_s))
            return reader.read_all()
        except flight.FlightUnauthenticatedError as e:
            msg = f"{self.address} refused our credentials: {e}"
            raise AuthenticationError(msg) from e
        except (flight.FlightError, OSError) as e:
            msg = f"reading {ticket[:100]!r} from {self.address} failed: {e}"
            raise RpcError(msg) from e

    def put_table(self, command: bytes, table: pa.Table, timeout_s: float | None = None) -> None:
        """Send ``table`` with ``do_put``; return once the server took it, else raise."""
        descriptor = flight.FlightDescriptor.for_command(command)
        try:
            writer, _ = self._client.do_put(descriptor, table.schema, self._options(timeout_s))
            try:
                writer.write_table(table)
            finally:
                writer.close()
        except flight.FlightUnauthenticatedError as e:
            msg = f"{self.address} refused our credentials: {e}"
            raise AuthenticationError(msg) from e
        except (flight.FlightError, OSError) as e:
            msg = f"putting {command[:100]!r} to {self.address} failed: {e}"
            raise RpcError(msg) from e

    def close(self) -> None:
        """Close the channel."""
        self._client.close()


def local_bind_host(spark_conf: dict[str, str] | None = None) -> str:
    """The host our servers bind to and advertise: :func:`spark_receivers.rpc.hosts.local_host`.

    Kept for callers not moved yet; new code calls :func:`~spark_receivers.rpc.hosts.local_host`.
    """
    return local_host(spark_conf)
