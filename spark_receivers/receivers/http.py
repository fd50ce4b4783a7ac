"""``HttpReceiver``: an HTTP ingestion endpoint that acknowledges only stored records.

Clients POST newline-delimited text (``format="lines"``) or JSON lines
(``format="json"``) to ``http://<host>:<port><path>``. The answer tells the
client exactly what happened to its request:

=====  ==================================================================
200    every line of the body was stored with ``store(..., reliable=True)``
       (and so is in the write-ahead log when it is enabled); body
       ``{"stored": <n>}``
400    a malformed request: the body is not valid UTF-8 / a line is not
       valid JSON (``NaN``, ``Infinity``, numbers out of range, integers
       over 4300 digits and nesting deeper than Python's recursion limit
       included) / a JSON line does not fit the schema (the message names
       the line; nothing stored); or a request aiohttp cannot parse
401    a token is configured and the request has no or a wrong bearer token
       (any bytes in the header, compared in constant time)
408    the request headers (``header_timeout_s``) or body
       (``body_timeout_s``) did not arrive in time; the connection closes
413    the body is longer than ``max_body_bytes``, or a line of it longer than
       ``max_record_bytes`` (the message names the line; nothing stored)
429    back off (``Retry-After``): the rate limit would hold the request
       longer than ``max_store_wait_s``, too many requests are being stored
       at once, or the store did not finish within ``max_store_wait_s``
       (in that last case the records may still be stored: retrying can
       duplicate them, never lose them)
503    back off (``Retry-After``): the receiver is stopping, the store
       failed, ``max_pending_requests`` requests are already being handled,
       or ``max_connections`` connections are open and none has waited
       long for headers (answered as the connection opens, then closed)
409    a request with the same ``Idempotency-Key`` is being stored; retry
       (``Retry-After``)
=====  ==================================================================

A request with an ``Idempotency-Key`` header (at most 255 characters) that repeats one
already stored within ``idempotency_window_s`` gets the first answer again (with the
header ``Idempotent-Replayed: true``) and stores nothing, also after a restart of the
receiver, its executor or the driver (``get_or_create``): the window's keys travel with
the blocks as their source position, up to ``idempotency_position_bytes`` of the newest;
keyed requests stored at once are grouped into one block for that
(:mod:`.http_keyed_stores`). See :mod:`.http_idempotency`.

No client mistake gets a 5xx or a traceback in the log: refusals are logged one line
each, at most a few per ten seconds (:mod:`.http_server`). The server is aiohttp on an
event loop of its own (a thread started by ``on_start``) behind a connection guard (a
connection cap, a header read timeout); reliable stores run on a small thread pool.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hmac
import logging
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

from spark_receivers.errors import ConfigError, ReceiverError
from spark_receivers.receiver.source_support import now_us
from spark_receivers.receiver.threaded_receiver import ThreadedReceiver
from spark_receivers.receivers.http_body import FORMATS, BadRequestError, parse_body
from spark_receivers.receivers.http_idempotency import MAX_KEY_LENGTH, IdempotencyKeys
from spark_receivers.receivers.http_keyed_stores import KeyedStores
from spark_receivers.util.extras import AIOHTTP

if TYPE_CHECKING:
    import pyarrow as pa
    from aiohttp import web

    from spark_receivers.receivers.http_server import ClientErrorLog, ConnectionGuard

log = logging.getLogger(__name__)

__all__ = ["FORMATS", "BadRequestError", "HttpReceiver"]


class HttpReceiver(ThreadedReceiver):
    r"""Stores the lines POSTed to ``path``, answering 200 only once they are stored.

    ``host`` defaults to the executor's address (``SPARK_LOCAL_IP`` or the host
    name's address); ``port=0`` picks a free port inside the executor, which is
    then only known there (:attr:`bound_port`, the log, and ``address_file`` if
    given): pass a fixed port when clients must find the receiver.

    With ``format="json"`` each non-blank line must be a JSON value; the record
    is the line itself (a JSON string) under the default schema, or the decoded
    object (a dict checked against the schema) when the receiver declares a
    multi-column schema. With ``format="lines"`` every line is a record (a
    trailing newline does not make an empty record; ``\r\n`` ends a line too).

    Against slow, many or broken clients: ``header_timeout_s`` (10) for a
    request's headers to arrive (from the connection's opening or its previous
    request), ``body_timeout_s`` (60) for its body, both answered 408;
    ``max_connections`` (256) open connections and ``max_pending_requests``
    (128) requests being handled, beyond which a 503 with ``Retry-After``
    answers at once. ``include_timestamp=True`` adds when each request arrived.

    When the server fails (the port is taken, the loop dies), the receiver
    restarts with the backoff of :class:`ThreadedReceiver` (``max_backoff_ms``
    caps it); the backoff resets once the server listens. A port that stays
    taken ends in the driver's restart policy failing the context.

    Thread contract: ``on_start`` returns at once; the server runs on the thread
    ``http-receiver-<stream>``; ``on_stop`` closes the listening socket, lets the
    requests being stored finish (up to ``shutdown_timeout_s``) and returns.
    """

    thread_name_prefix = "http-receiver"
    requires = (AIOHTTP,)  # the [http] extra
    transient_attrs = (
        "_loop",
        "_server_stop",
        "_pool",
        "_count_lock",
        "_guard",
        "_errors",
        "_idempotency",
        "_keyed_stores",
    )
    supports_timestamp = True

    def __init__(
        self,
        host: str | None = None,
        port: int = 0,
        *,
        path: str = "/ingest",
        token: str | None = None,
        format: str = "lines",
        max_body_bytes: int = 16 * 1024 * 1024,
        max_store_wait_s: float = 10.0,
        max_concurrent_stores: int = 8,
        retry_after_s: int = 1,
        shutdown_timeout_s: float = 10.0,
        header_timeout_s: float = 10.0,
        body_timeout_s: float = 60.0,
        max_connections: int = 256,
        max_pending_requests: int = 128,
        address_file: str | None = None,
        max_backoff_ms: int = 30_000,
        idempotency_window_s: float = 600.0,
        max_idempotency_keys: int = 100_000,
        idempotency_position_bytes: int = 16_384,
        **kwargs: Any,
    ) -> None:
        for key, value in (
            ("max_body_bytes", max_body_bytes),
            ("max_store_wait_s", max_store_wait_s),
            ("max_concurrent_stores", max_concurrent_stores),
            ("shutdown_timeout_s", shutdown_timeout_s),
            ("header_timeout_s", header_timeout_s),
            ("body_timeout_s", body_timeout_s),
            ("max_connections", max_connections),
            ("max_pending_requests", max_pending_requests),
            ("max_idempotency_keys", max_idempotency_keys),
            ("idempotency_position_bytes", idempotency_position_bytes),
        ):
            if value <= 0:
                msg = f"{key} must be > 0, got {value!r}"
                raise ConfigError(msg)
        # on_stop waits for the requests being stored, then for the loop to close
        kwargs.setdefault("stop_timeout_s", shutdown_timeout_s + 5)
        super().__init__(max_backoff_ms=max_backoff_ms, **kwargs)
        if format not in FORMATS:
            msg = f"format must be one of {FORMATS}, got {format!r}"
            raise ConfigError(msg)
        if format == "lines" and not self.default_records:
            msg = (
                f"format='lines' stores strings: it needs the default schema (one string "
                f"column 'value'), got {self.record_schema.names}; use format='json' for a "
                "multi-column schema"
            )
            raise ConfigError(msg)
        if isinstance(port, bool) or not isinstance(port, int) or not 0 <= port <= 65535:
            msg = f"port must be an integer in [0, 65535], got {port!r}"
            raise ConfigError(msg)
        if not path.startswith("/"):
            msg = f"path must start with '/', got {path!r}"
            raise ConfigError(msg)
        if token is not None and not token:
            msg = "token must be a non-empty string or None, got ''"
            raise ConfigError(msg)
        if retry_after_s < 0:
            msg = f"retry_after_s must be >= 0, got {retry_after_s!r}"
            raise ConfigError(msg)
        if isinstance(idempotency_window_s, bool) or not idempotency_window_s >= 0:
            msg = (
                f"idempotency_window_s must be >= 0 (0: Idempotency-Key ignored), "
                f"got {idempotency_window_s!r}"
            )
            raise ConfigError(msg)
        self.host = host
        self.port = port
        self.path = path
        self.format = format
        self.max_body_bytes = max_body_bytes
        self.max_store_wait_s = max_store_wait_s
        self.max_concurrent_stores = max_concurrent_stores
        self.retry_after_s = retry_after_s
        self.shutdown_timeout_s = shutdown_timeout_s
        self.header_timeout_s = header_timeout_s
        self.body_timeout_s = body_timeout_s
        self.max_connections = max_connections
        self.max_pending_requests = max_pending_requests
        self.address_file = address_file
        self.idempotency_window_s = idempotency_window_s
        self.max_idempotency_keys = max_idempotency_keys
        self.idempotency_position_bytes = idempotency_position_bytes
        self._token = token.encode() if token is not None else None
        self.bound_port: int | None = None
        self.records_stored = 0
        self.requests_refused = 0
        self.reset_runtime()

    def reset_runtime(self) -> None:
        """No loop and no pool yet (the server thread makes them), not closing."""
        self._loop: asyncio.AbstractEventLoop | None = None
        self._server_stop: asyncio.Event | None = None
        self._pool: ThreadPoolExecutor | None = None
        self._closing = False
        self._in_flight = 0
        self._pending = 0
        self._count_lock = threading.Lock()
        self._storing: set[str] = set()
        """Idempotency keys whose store runs (the store, not the answer, settles them)."""
        self._guard: ConnectionGuard | None = None
        self._errors: ClientErrorLog | None = None
        self._idempotency = IdempotencyKeys(self.idempotency_window_s, self.max_idempotency_keys)
        self._keyed_stores = KeyedStores(
            self._idempotency, self._store_group, self.idempotency_position_bytes
        )

    # --- the server thread ----------------------------------------------------

    def receive(self) -> None:
        """Run the server on an event loop of this thread until the receiver stops."""
        loop = asyncio.new_event_loop()
        pool = ThreadPoolExecutor(
            self.max_concurrent_stores, thread_name_prefix=f"http-receiver-{self.stream_id}-store"
        )
        self._loop, self._server_stop, self._pool = loop, asyncio.Event(), pool
        asyncio.set_event_loop(loop)
        if self.idempotency_window_s > 0:
            # The window's keys an earlier life (or driver) stored: their retries stored once.
            kept = self._idempotency.remember_position(self.accepted_position())
            if kept:
                log.info("receiver %d: remembering %d idempotency keys", self.stream_id, kept)
        try:
            if not self.stopping:  # else interrupt() ran before the loop was set
                loop.run_until_complete(self._run_server())
        finally:
            pool.shutdown(wait=False, cancel_futures=True)
            loop.close()

    @property
    def idempotency(self) -> IdempotencyKeys:
        """The ``Idempotency-Key`` memory (a restart gets the window's keys from the driver)."""
        return self._idempotency

    def interrupt(self) -> None:
        """Refuse new requests (503) and tell the server to close."""
        self._closing = True
        loop, server_stop = self._loop, self._server_stop
        if loop is not None and server_stop is not None:
            with contextlib.suppress(RuntimeError):  # the loop already closed
                loop.call_soon_threadsafe(server_stop.set)

    def describe(self) -> str:
        """``HTTP server``, as restart messages name the work."""
        return "HTTP server"

    @property
    def bound_address(self) -> str | None:
        """``host:port`` the server listens on (on the executor), None before it binds."""
        if self.bound_port is None:
            return None
        return f"{self._bind_host()}:{self.bound_port}"

    def _bind_host(self) -> str:
        if self.host is not None:
            return self.host
        from spark_receivers.spark.receiver_task import executor_host

        return executor_host()

    async def _run_server(self) -> None:
        from aiohttp import web

        from spark_receivers.receivers.http_server import (
            ClientErrorLog,
            ConnectionGuard,
            GuardedSite,
            expect_handler,
        )

        assert self._server_stop is not None
        errors = ClientErrorLog(f"receiver {self.stream_id} (HTTP)")
        guard = ConnectionGuard(
            self.max_connections, self.header_timeout_s, self.retry_after_s, errors
        )
        self._errors, self._guard = errors, guard
        app = web.Application(client_max_size=self.max_body_bytes)
        admit = functools.partial(self._admit, counted=False)
        app.router.add_post(self.path, self._handle, expect_handler=expect_handler(admit))
        runner = web.AppRunner(
            app,
            handle_signals=False,
            access_log=None,
            shutdown_timeout=self.shutdown_timeout_s,
            logger=errors,  # aiohttp's 400s for unparsable requests: one line, rate-limited
            lingering_time=min(10.0, self.body_timeout_s),
        )
        await runner.setup()
        host = self._bind_host()
        site = GuardedSite(runner, host, self.port, guard, backlog=min(self.max_connections, 1024))
        try:
            await site.start()
        except OSError as e:
            await runner.cleanup()
            msg = f"cannot listen on {host}:{self.port}: {e}"
            raise ReceiverError(msg) from e
        try:
            port = int(runner.addresses[0][1])
            self._write_address_file(host, port)
            self.bound_port = port  # published last: whoever sees it finds the file written
            self.mark_healthy()
            log.info(
                "receiver %d: HTTP server on http://%s:%d%s", self.stream_id, host, port, self.path
            )
            await self._server_stop.wait()
        finally:
            self._closing = True
            await runner.cleanup()

    def _write_address_file(self, host: str, port: int) -> None:
        if self.address_file is None:
            return
        from spark_receivers.receivers.http_server import write_address_file

        try:
            write_address_file(self.address_file, host, port)
        except OSError as e:
            message = f"cannot write address_file {self.address_file!r}: {e}"
            log.warning("receiver %d: %s", self.stream_id, message)
            self.report_error(message, e)

    # --- requests -------------------------------------------------------------

    def _refuse(
        self,
        status: int,
        message: str,
        retry: bool = False,
        close: bool = False,
        request: web.BaseRequest | None = None,
    ) -> web.Response:
        """A refusal, logged one line (rate-limited, no traceback); ``close``: no keep-alive."""
        from aiohttp import web

        self.requests_refused += 1
        if self._errors is not None:
            remote = request.remote if request is not None else "?"
            self._errors.client_error(f"{status} to {remote}: {message}")
        headers = {"Retry-After": str(self.retry_after_s)} if retry else {}
        if status == 401:
            headers["WWW-Authenticate"] = 'Bearer realm="spark-receivers"'
        response = web.json_response({"error": message}, status=status, headers=headers)
        if close:
            response.force_close()
        return response

    def _authorized(self, request: web.BaseRequest) -> bool:
        if self._token is None:
            return True
        scheme, _, given = request.headers.get("Authorization", "").partition(" ")
        try:  # aiohttp keeps bytes that are not UTF-8 as surrogates: give them back
            given_bytes = given.strip().encode("utf-8", "surrogateescape")
        except UnicodeEncodeError:
            return False
        # compare_digest runs in time independent of where the tokens differ
        ok = hmac.compare_digest(given_bytes, self._token)
        return ok and scheme.lower() == "bearer"

    async def _handle(self, request: web.BaseRequest) -> web.StreamResponse:
        """One request: counted as pending, its connection's header deadline off meanwhile."""
        guard = self._guard
        if guard is not None:
            guard.request_started(request)
        self._pending += 1
        try:
            return await self._answer(request)
        finally:
            self._pending -= 1
            if guard is not None:
                guard.request_done(request)

    async def _answer(self, request: web.BaseRequest) -> web.StreamResponse:
        from aiohttp import web

        arrived_us = now_us()
        refusal = self._admit(request, counted=True)
        if refusal is not None:
            return refusal
        key = request.headers.get("Idempotency-Key") if self.idempotency_window_s > 0 else None
        if key is None:
            return await self._answer_body(request, arrived_us, None)
        if not key or len(key) > MAX_KEY_LENGTH:
            message = f"Idempotency-Key must be 1 to {MAX_KEY_LENGTH} characters, got {len(key)}"
            return self._refuse(400, message, request=request)
        seen = self._idempotency.begin(key)
        if seen is not None:
            if seen.busy:
                message = "a request with this Idempotency-Key is being stored; retry later"
                return self._refuse(409, message, retry=True, request=request)
            return web.json_response(seen.answer, headers={"Idempotent-Replayed": "true"})
        stored = False
        try:
            response = await self._answer_body(request, arrived_us, key)
            stored = response.status == 200 or key in self._storing
            return response
        finally:
            if not stored:
                self._idempotency.abandon(key)

    async def _answer_body(
        self, request: web.BaseRequest, arrived_us: int, key: str | None
    ) -> web.StreamResponse:
        """Read, parse and store a request's body (``key``: its Idempotency-Key, if any)."""
        from aiohttp import web
        from aiohttp.http_exceptions import HttpProcessingError
        from aiohttp.web_protocol import RequestPayloadError

        try:
            body = await asyncio.wait_for(request.read(), self.body_timeout_s)
        except TimeoutError:
            message = f"request body not received within body_timeout_s={self.body_timeout_s}"
            return self._refuse(408, message, close=True, request=request)
        except web.HTTPRequestEntityTooLarge:
            message = f"body longer than max_body_bytes={self.max_body_bytes}"
            return self._refuse(413, message, close=True, request=request)
        except (RequestPayloadError, HttpProcessingError) as e:
            return self._refuse(400, f"malformed body: {e}", close=True, request=request)
        try:
            records = self.parse(body)
        except BadRequestError as e:  # 400, or 413 for a line over max_record_bytes
            return self._refuse(e.status, str(e), request=request)
        if len(records) == 0:
            if key is not None:
                self._idempotency.finish(key, {"stored": 0})
            return web.json_response({"stored": 0})
        too_much = self._back_pressure(len(records))
        if too_much is not None:
            return self._refuse(429, too_much, retry=True, request=request)
        return await self._store(records, arrived_us, key)

    def _admit(self, request: web.BaseRequest, counted: bool) -> web.Response | None:
        """The refusal of a request before its body is read, or None (also for ``Expect``)."""
        pending = self._pending if counted else self._pending + 1
        if self._closing or self.is_stopped():
            return self._refuse(503, "receiver is stopping", True, True, request)
        if pending > self.max_pending_requests:
            message = (
                f"{pending - 1} requests are being handled "
                f"(max_pending_requests={self.max_pending_requests}); retry later"
            )
            return self._refuse(503, message, True, True, request)
        if not self._authorized(request):
            return self._refuse(401, "missing or wrong bearer token", close=True, request=request)
        if request.content_length is not None and request.content_length > self.max_body_bytes:
            message = (
                f"body of {request.content_length} bytes > max_body_bytes={self.max_body_bytes}"
            )
            return self._refuse(413, message, close=True, request=request)
        return None

    def _back_pressure(self, n: int) -> str | None:
        if self._in_flight >= self.max_concurrent_stores:
            return f"{self._in_flight} requests are being stored; retry later"
        limiter = getattr(self._intake, "rate_limiter", None)
        rate = getattr(limiter, "rate", None)
        if rate is not None and n / rate > self.max_store_wait_s:
            return (
                f"{n} records at the current rate limit of {rate:.0f} records/s would wait "
                f"longer than max_store_wait_s={self.max_store_wait_s}"
            )
        return None

    async def _store(
        self, records: list[Any] | pa.Array | pa.Table, arrived_us: int, key: str | None = None
    ) -> web.StreamResponse:
        from aiohttp import web

        loop = asyncio.get_running_loop()
        self._in_flight += 1
        future = loop.run_in_executor(self._pool, self._store_reliably, records, arrived_us, key)
        if key is not None:
            self._storing.add(key)  # the key's fate is the store's, even past a 429

        def done(f: asyncio.Future[None]) -> None:
            self._in_flight -= 1
            if key is None:
                return
            self._storing.discard(key)
            if f.cancelled() or f.exception() is not None:
                self._idempotency.abandon(key)
            # else its group remembered it, before the next group took its position

        future.add_done_callback(done)
        try:
            await asyncio.wait_for(asyncio.shield(future), self.max_store_wait_s)
        except TimeoutError:
            return self._refuse(
                429,
                f"store did not finish within max_store_wait_s={self.max_store_wait_s}; "
                "the records may still be stored",
                retry=True,
            )
        except Exception as e:
            log.warning(
                "receiver %d: store of %d records failed: %s",
                self.stream_id,
                len(records),
                e,
                exc_info=log.isEnabledFor(logging.DEBUG),  # the store's own log has the stack
            )
            return self._refuse(503, f"records could not be stored: {e}", retry=True)
        return web.json_response({"stored": len(records)})

    def _store_reliably(
        self, records: list[Any] | pa.Array | pa.Table, arrived_us: int, key: str | None = None
    ) -> None:
        if self.is_stopped():
            msg = "receiver is stopping"
            raise ReceiverError(msg)
        if key is None:
            self.store_records(records, reliable=True, times_us=arrived_us)
        else:  # grouped with the keyed requests being stored at once, the keys remembered
            self._keyed_stores.store(key, records, arrived_us)
        with self._count_lock:
            self.records_stored += len(records)

    def _store_group(
        self, records: list[Any] | pa.Array | pa.Table, times_us: Any, position: str
    ) -> None:
        """One block of a group of keyed requests (:class:`KeyedStores`' store)."""
        self.store_records(records, reliable=True, times_us=times_us, position=position)

    def parse(self, body: bytes) -> list[Any] | pa.Array | pa.Table:
        """The records of a request body; :class:`BadRequestError` naming the bad line."""
        return parse_body(body, self.format, self.record_schema, self.record_limit)
