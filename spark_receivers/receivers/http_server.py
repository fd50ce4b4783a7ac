"""What keeps the ``HttpReceiver``'s aiohttp server up against slow, many and broken clients.

aiohttp has no header read timeout and no connection cap: a client that opens
connections and sends its headers a byte at a time (slowloris) holds them, and
its sockets, for as long as it likes. :class:`GuardedSite` is an aiohttp site
that listens like ``web.TCPSite`` but hands every connection to a
:class:`_GuardedConnection` wrapped around aiohttp's own protocol, which

* holds at most ``max_connections`` connections. At the cap, a new connection
  takes the place of the one that has waited longest (at least
  :data:`EVICT_AFTER_S`) for a request's headers — an idle keep-alive
  connection, or a slow client's — so that clients which send their request
  at once are served even while slow clients keep opening connections; when
  every connection is busy with a request, or none has waited that long, the
  new one is refused at once with ``503 Service Unavailable`` and
  ``Retry-After`` (then closed);
* closes a connection whose request headers have not all arrived within
  ``header_timeout_s`` of its opening, or of the end of its previous request:
  with ``408 Request Timeout`` when part of a request came, silently when the
  connection was idle (a keep-alive connection nobody reuses).

:func:`expect_handler` answers ``Expect: 100-continue`` only once the request
would be admitted (aiohttp's own answers 500 to an ``Expect`` value that is not
UTF-8).

The request handler tells the guard when a request's headers are complete
(:meth:`ConnectionGuard.request_started`) and when it is answered
(:meth:`ConnectionGuard.request_done`); body read timeouts are the handler's.

:class:`ClientErrorLog` keeps client mistakes out of the log's way: one line
each, no traceback, at most ``burst`` lines per ``window_s`` and then a count.
It is also the logger aiohttp gets, so the 400s of its parser (a bad request
line, a header too long) follow the same rule; anything else it logs keeps its
traceback.

Everything here runs on the server's event loop thread.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import tempfile
import time
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError

log = logging.getLogger(__name__)

__all__ = [
    "ClientErrorLog",
    "ConnectionGuard",
    "GuardedSite",
    "expect_handler",
    "write_address_file",
]

REFUSAL_LINGER_S = 1.0
"""How long a refused connection is kept half-closed so that its client reads the 503."""
MAX_LINGERING = 64
"""Refused connections kept half-closed at once; beyond, a refusal is a reset (a flood of
connections must not hold file descriptors through their 503s)."""
EVICT_AFTER_S = 1.0
"""At the connection cap, a connection that has waited this long for a request's headers
may be closed to admit a new one (capped at the header timeout)."""


def raw_response(status: int, reason: str, message: str, headers: dict[str, str]) -> bytes:
    """A complete ``Connection: close`` HTTP/1.1 response with a JSON ``{"error": ...}`` body."""
    body = json.dumps({"error": message}).encode()
    lines = [f"HTTP/1.1 {status} {reason}", "Content-Type: application/json; charset=utf-8"]
    lines += [f"{k}: {v}" for k, v in headers.items()]
    lines += ["Connection: close", f"Content-Length: {len(body)}", "", ""]
    return "\r\n".join(lines).encode("ascii") + body


class ClientErrorLog:
    """Rate-limited, traceback-free logging of client mistakes; a logger for aiohttp too.

    ``client_error(message)`` logs one warning line, at most ``burst`` per
    ``window_s``; the lines dropped in a window are counted in the next one
    that is logged. ``clock`` (seconds) is injectable for tests.
    """

    def __init__(
        self,
        name: str,
        burst: int = 5,
        window_s: float = 10.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._name = name
        self._burst = burst
        self._window_s = window_s
        self._clock = clock
        self._window_start = -float("inf")
        self._in_window = 0
        self.suppressed = 0
        """Lines not logged since the last one that was."""
        self.total = 0

    def client_error(self, message: str) -> bool:
        """Log a client mistake (one line); False when rate-limited away."""
        self.total += 1
        now = self._clock()
        if now - self._window_start >= self._window_s:
            self._window_start, self._in_window = now, 0
        if self._in_window >= self._burst:
            self.suppressed += 1
            return False
        self._in_window += 1
        dropped, self.suppressed = self.suppressed, 0
        more = f" ({dropped} more client errors not logged)" if dropped else ""
        log.warning("%s: %s%s", self._name, message, more)
        return True

    # --- the logger interface aiohttp's request handler uses ----------------------

    def exception(self, msg: str, *args: Any, exc_info: Any = True, **kwargs: Any) -> None:
        """Log an aiohttp error: a client's malformed request in one line, else with the stack."""
        if isinstance(exc_info, HttpProcessingError):
            self.client_error(f"{msg % args if args else msg}: {exc_info.message or exc_info}")
            return
        logging.getLogger("aiohttp.server").error(msg, *args, exc_info=exc_info, **kwargs)

    def error(self, msg: str, *args: Any, **kwargs: Any) -> None:
        """Forwarded to the ``aiohttp.server`` logger."""
        logging.getLogger("aiohttp.server").error(msg, *args, **kwargs)

    def warning(self, msg: str, *args: Any, **kwargs: Any) -> None:
        """Forwarded to the ``aiohttp.server`` logger."""
        logging.getLogger("aiohttp.server").warning(msg, *args, **kwargs)

    def info(self, msg: str, *args: Any, **kwargs: Any) -> None:
        """Forwarded to the ``aiohttp.server`` logger."""
        logging.getLogger("aiohttp.server").info(msg, *args, **kwargs)

    def debug(self, msg: str, *args: Any, **kwargs: Any) -> None:
        """Forwarded to the ``aiohttp.server`` logger."""
        logging.getLogger("aiohttp.server").debug(msg, *args, **kwargs)


class ConnectionGuard:
    """Counts connections and watches their header deadlines (see the module doc)."""

    def __init__(
        self,
        max_connections: int,
        header_timeout_s: float,
        retry_after_s: int,
        errors: ClientErrorLog,
    ) -> None:
        self.max_connections = max_connections
        self.header_timeout_s = header_timeout_s
        self.retry_after_s = retry_after_s
        self.errors = errors
        self.open = 0
        self.refused = 0
        self.timed_out = 0
        self.evicted = 0
        self.lingering = 0
        self._by_handler: dict[object, _GuardedConnection] = {}
        self._waiting: dict[_GuardedConnection, float] = {}
        """Admitted connections waiting for a request's headers, oldest first: since when."""

    def protocol_factory(self, server: Callable[[], asyncio.Protocol]) -> Callable[[], Any]:
        """Wrap aiohttp's per-connection protocol factory."""
        return lambda: _GuardedConnection(self, server())

    def request_started(self, request: web.BaseRequest) -> None:
        """The request's headers are complete: its connection's header deadline is off."""
        conn = self._by_handler.get(request.protocol)
        if conn is not None:
            conn.busy += 1
            conn.partial = False
            conn.cancel_deadline()
            self._waiting.pop(conn, None)

    def request_done(self, request: web.BaseRequest) -> None:
        """The request is answered: the next one's headers are due within the timeout."""
        conn = self._by_handler.get(request.protocol)
        if conn is not None:
            conn.busy -= 1
            if conn.busy == 0:
                conn.start_deadline()

    def make_room(self, now: float) -> bool:
        """At the cap: close the connection waiting longest for headers; False if none may go."""
        if not self._waiting:
            return False  # every connection is busy with a request
        conn, since = next(iter(self._waiting.items()))
        if now - since < min(EVICT_AFTER_S, self.header_timeout_s):
            return False  # the oldest waited too little: so did the others
        conn.close_waiting("another client needed its place at max_connections")
        self.evicted += 1
        return True


class _GuardedConnection(asyncio.Protocol):
    """aiohttp's protocol for one connection, behind a connection cap and a header deadline."""

    def __init__(self, guard: ConnectionGuard, inner: asyncio.Protocol) -> None:
        self.guard = guard
        self.inner = inner
        self.transport: asyncio.Transport | None = None
        self.admitted = False  # handed to aiohttp's protocol
        self.counted = False  # holds one of max_connections
        self.lingers = False  # refused, half-closed until REFUSAL_LINGER_S
        self.busy = 0
        self.partial = False  # bytes of a request whose headers are not complete yet
        self._deadline: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        guard = self.guard
        loop = asyncio.get_running_loop()
        if guard.open >= guard.max_connections and not guard.make_room(loop.time()):
            guard.refused += 1
            peer = transport.get_extra_info("peername")
            guard.errors.client_error(
                f"refused a connection from {peer}: {guard.open} open, "
                f"max_connections={guard.max_connections} (503)"
            )
            message = f"too many connections (max_connections={guard.max_connections}); retry later"
            retry = {"Retry-After": str(guard.retry_after_s)}
            transport.write(raw_response(503, "Service Unavailable", message, retry))
            if guard.lingering >= MAX_LINGERING or not transport.can_write_eof():
                transport.close()
                return
            transport.write_eof()  # half-close: the client still reads the 503
            guard.lingering += 1
            self.lingers = True
            loop.call_later(REFUSAL_LINGER_S, transport.close)
            return
        self.admitted = self.counted = True
        guard.open += 1
        guard._by_handler[self.inner] = self
        self.inner.connection_made(transport)
        self.start_deadline()

    def data_received(self, data: bytes) -> None:
        if self.admitted:
            self.partial = self.partial or not self.busy
            self.inner.data_received(data)

    def eof_received(self) -> bool | None:
        return self.inner.eof_received() if self.admitted else None

    def pause_writing(self) -> None:
        if self.admitted:
            self.inner.pause_writing()

    def resume_writing(self) -> None:
        if self.admitted:
            self.inner.resume_writing()

    def connection_lost(self, exc: Exception | None) -> None:
        self.cancel_deadline()
        self._uncount()
        if self.lingers:
            self.lingers = False
            self.guard.lingering -= 1
        if not self.admitted:
            return
        self.admitted = False
        self.guard._by_handler.pop(self.inner, None)
        self.inner.connection_lost(exc)

    def _uncount(self) -> None:
        if self.counted:
            self.counted = False
            self.guard.open -= 1
        self.guard._waiting.pop(self, None)

    def start_deadline(self) -> None:
        """Request headers are due within the header timeout (from now)."""
        self.cancel_deadline()
        loop = asyncio.get_running_loop()
        self._deadline = loop.call_later(self.guard.header_timeout_s, self._expired)
        self.guard._waiting.pop(self, None)
        self.guard._waiting[self] = loop.time()  # the newest waiter goes last

    def cancel_deadline(self) -> None:
        """A request is being handled: no header deadline meanwhile."""
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def _expired(self) -> None:
        self._deadline = None
        if not self.busy:
            self.guard.timed_out += 1
            self.close_waiting(f"no complete request headers within {self.guard.header_timeout_s}s")

    def close_waiting(self, why: str) -> None:
        """Close a connection waiting for headers: 408 if part of a request came, else silently.

        Its place under ``max_connections`` is free at once.
        """
        self.cancel_deadline()
        self._uncount()
        transport = self.transport
        if transport is None or transport.is_closing():
            return
        if self.partial:
            self.guard.errors.client_error(
                f"closed a connection from {transport.get_extra_info('peername')}: {why} (408)"
            )
            message = f"request headers not received in time: {why}"
            transport.write(raw_response(408, "Request Timeout", message, {}))
        transport.close()


class GuardedSite(web.BaseSite):
    """``web.TCPSite`` with every connection behind a :class:`ConnectionGuard`."""

    def __init__(
        self, runner: web.BaseRunner, host: str, port: int, guard: ConnectionGuard, backlog: int
    ) -> None:
        super().__init__(runner, backlog=backlog)
        self._host = host
        self._port = port
        self._guard = guard

    @property
    def name(self) -> str:
        """``http://host:port`` as asked (port 0 until bound: see ``runner.addresses``)."""
        return f"http://{self._host}:{self._port}"

    async def start(self) -> None:
        """Listen; raises OSError when the address cannot be bound."""
        await super().start()
        server = self._runner.server
        assert server is not None
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(
            self._guard.protocol_factory(server),
            self._host,
            self._port,
            backlog=self._backlog,
            reuse_address=True,
        )


def expect_handler(
    admit: Callable[[web.BaseRequest], web.StreamResponse | None],
) -> Callable[[web.Request], Awaitable[web.StreamResponse | None]]:
    """An aiohttp ``expect_handler``: ``100 Continue`` if ``admit(request)`` refuses nothing.

    ``admit`` returns the refusal (401, 413, 503...) to answer instead. Any
    ``Expect`` value but ``100-continue`` is a 417 whatever its bytes.
    """
    from aiohttp import HttpVersion11

    async def handle(request: web.Request) -> web.StreamResponse | None:
        if request.version != HttpVersion11:
            return None
        expect = request.headers.get("Expect", "")
        if expect.lower() != "100-continue":
            raise web.HTTPExpectationFailed(text=f"unknown Expect: {ascii(expect)[:100]}")
        refusal = admit(request)
        if refusal is not None:
            return refusal
        await request.writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        request.writer.output_size = 0  # the response proper has not started (as aiohttp does)
        return None

    return handle


def write_address_file(path: str, host: str, port: int) -> None:
    """Write ``host:port`` to ``path`` atomically (a temporary file renamed over it)."""
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(os.path.abspath(path)), prefix=".address-")
    with os.fdopen(fd, "w") as f:
        f.write(f"{host}:{port}\n")
    os.replace(tmp, path)
