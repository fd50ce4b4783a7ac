"""``HttpReceiver``: an HTTP ingestion endpoint that acknowledges only stored records.

Clients POST newline-delimited text (``format="lines"``) or JSON lines
(``format="json"``) to ``http://<host>:<port><path>``. The answer tells the
client exactly what happened to its request:

=====  ==================================================================
200    every line of the body was stored with ``store(..., reliable=True)``
       (and so is in the write-ahead log when it is enabled); body
       ``{"stored": <n>}``
400    the body is not valid UTF-8 / a line is not valid JSON / a JSON line
       does not fit the schema; the message names the line; nothing stored
401    a token is configured and the request has no or a wrong bearer token
413    the body is longer than ``max_body_bytes``
429    back off (``Retry-After``): the rate limit would hold the request
       longer than ``max_store_wait_s``, too many requests are being stored
       at once, or the store did not finish within ``max_store_wait_s``
       (in that last case the records may still be stored: retrying can
       duplicate them, never lose them)
503    the receiver is stopping, or the store failed (``Retry-After``)
=====  ==================================================================

The server is aiohttp, run on an event loop of its own in a thread started by
``on_start``; the blocking reliable stores run on a small thread pool so that
the loop keeps answering.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import logging
import os
import tempfile
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

from spark_receivers.errors import ConfigError, ReceiverError
from spark_receivers.receiver.schema import check_record, is_default
from spark_receivers.receiver.threaded_receiver import ThreadedReceiver
from spark_receivers.util.extras import AIOHTTP

if TYPE_CHECKING:
    from aiohttp import web

log = logging.getLogger(__name__)

FORMATS = ("lines", "json")


class BadRequestError(ReceiverError, ValueError):
    """A request body that cannot be stored; the message names the line."""


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

    When the server fails (the port is taken, the loop dies), the receiver
    restarts with the backoff of :class:`ThreadedReceiver` (``max_backoff_ms``
    caps it); the backoff resets once the server listens.

    Thread contract: ``on_start`` returns at once; the server runs on the thread
    ``http-receiver-<stream>``; ``on_stop`` closes the listening socket, lets the
    requests being stored finish (up to ``shutdown_timeout_s``) and returns.
    """

    thread_name_prefix = "http-receiver"
    requires = (AIOHTTP,)  # the [http] extra
    transient_attrs = ("_loop", "_server_stop", "_pool", "_count_lock")

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
        address_file: str | None = None,
        max_backoff_ms: int = 30_000,
        **kwargs: Any,
    ) -> None:
        for key, value in (
            ("max_body_bytes", max_body_bytes),
            ("max_store_wait_s", max_store_wait_s),
            ("max_concurrent_stores", max_concurrent_stores),
            ("shutdown_timeout_s", shutdown_timeout_s),
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
        if format == "lines" and not is_default(self.schema):
            msg = (
                f"format='lines' stores strings: it needs the default schema (one string "
                f"column 'value'), got {self.schema.names}; use format='json' for a "
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
        self.host = host
        self.port = port
        self.path = path
        self.format = format
        self.max_body_bytes = max_body_bytes
        self.max_store_wait_s = max_store_wait_s
        self.max_concurrent_stores = max_concurrent_stores
        self.retry_after_s = retry_after_s
        self.shutdown_timeout_s = shutdown_timeout_s
        self.address_file = address_file
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
        self._count_lock = threading.Lock()

    # --- the server thread ----------------------------------------------------

    def receive(self) -> None:
        """Run the server on an event loop of this thread until the receiver stops."""
        loop = asyncio.new_event_loop()
        pool = ThreadPoolExecutor(
            self.max_concurrent_stores, thread_name_prefix=f"http-receiver-{self.stream_id}-store"
        )
        self._loop, self._server_stop, self._pool = loop, asyncio.Event(), pool
        asyncio.set_event_loop(loop)
        try:
            if not self.stopping:  # else interrupt() ran before the loop was set
                loop.run_until_complete(self._run_server())
        finally:
            pool.shutdown(wait=False, cancel_futures=True)
            loop.close()

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

        assert self._server_stop is not None
        app = web.Application(client_max_size=self.max_body_bytes)
        app.router.add_post(self.path, self._handle)
        runner = web.AppRunner(
            app, handle_signals=False, access_log=None, shutdown_timeout=self.shutdown_timeout_s
        )
        await runner.setup()
        host = self._bind_host()
        site = web.TCPSite(runner, host, self.port)
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
        directory = os.path.dirname(os.path.abspath(self.address_file))
        try:
            fd, tmp = tempfile.mkstemp(dir=directory, prefix=".address-")
            with os.fdopen(fd, "w") as f:
                f.write(f"{host}:{port}\n")
            os.replace(tmp, self.address_file)
        except OSError as e:
            message = f"cannot write address_file {self.address_file!r}: {e}"
            log.warning("receiver %d: %s", self.stream_id, message)
            self.report_error(message, e)

    # --- requests -------------------------------------------------------------

    def _refuse(self, status: int, message: str, retry: bool = False) -> web.Response:
        from aiohttp import web

        self.requests_refused += 1
        headers = {"Retry-After": str(self.retry_after_s)} if retry else {}
        if status == 401:
            headers["WWW-Authenticate"] = 'Bearer realm="spark-receivers"'
        return web.json_response({"error": message}, status=status, headers=headers)

    def _authorized(self, request: web.Request) -> bool:
        if self._token is None:
            return True
        scheme, _, given = request.headers.get("Authorization", "").partition(" ")
        # compare_digest runs in time independent of where the tokens differ
        ok = hmac.compare_digest(given.strip().encode(), self._token)
        return ok and scheme.lower() == "bearer"

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        from aiohttp import web

        if self._closing or self.is_stopped():
            return self._refuse(503, "receiver is stopping", retry=True)
        if not self._authorized(request):
            return self._refuse(401, "missing or wrong bearer token")
        if request.content_length is not None and request.content_length > self.max_body_bytes:
            return self._refuse(
                413,
                f"body of {request.content_length} bytes > max_body_bytes={self.max_body_bytes}",
            )
        try:
            body = await request.read()
        except web.HTTPRequestEntityTooLarge:
            return self._refuse(413, f"body longer than max_body_bytes={self.max_body_bytes}")
        try:
            records = self.parse(body)
        except BadRequestError as e:
            return self._refuse(400, str(e))
        if not records:
            return web.json_response({"stored": 0})
        refusal = self._back_pressure(len(records))
        if refusal is not None:
            return self._refuse(429, refusal, retry=True)
        return await self._store(records)

    def _back_pressure(self, n: int) -> str | None:
        if self._in_flight >= self.max_concurrent_stores:
            return f"{self._in_flight} requests are being stored; retry later"
        limiter = getattr(self._supervisor, "rate_limiter", None)
        rate = getattr(limiter, "rate", None)
        if rate is not None and n / rate > self.max_store_wait_s:
            return (
                f"{n} records at the current rate limit of {rate:.0f} records/s would wait "
                f"longer than max_store_wait_s={self.max_store_wait_s}"
            )
        return None

    async def _store(self, records: list[Any]) -> web.StreamResponse:
        from aiohttp import web

        loop = asyncio.get_running_loop()
        self._in_flight += 1
        future = loop.run_in_executor(self._pool, self._store_reliably, records)

        def done(_: object) -> None:
            self._in_flight -= 1

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
                "receiver %d: store of %d records failed",
                self.stream_id,
                len(records),
                exc_info=True,
            )
            return self._refuse(503, f"records could not be stored: {e}", retry=True)
        return web.json_response({"stored": len(records)})

    def _store_reliably(self, records: list[Any]) -> None:
        if self.is_stopped():
            msg = "receiver is stopping"
            raise ReceiverError(msg)
        self.store(records, reliable=True)
        with self._count_lock:
            self.records_stored += len(records)

    def parse(self, body: bytes) -> list[Any]:
        """The records of a request body; :class:`BadRequestError` naming the bad line."""
        try:
            text = body.decode("utf-8")
        except UnicodeDecodeError as e:
            line = body.count(b"\n", 0, e.start) + 1
            msg = f"line {line} is not valid UTF-8 (byte {e.start})"
            raise BadRequestError(msg) from None
        if not text:
            return []
        lines = text.split("\n")
        if text.endswith("\n"):
            lines.pop()
        if "\r" in text:
            lines = [line.removesuffix("\r") for line in lines]
        if self.format == "lines":
            return lines
        as_objects = not is_default(self.schema)
        records: list[Any] = []
        for number, text_line in enumerate(lines, 1):
            raw = text_line.strip()
            if not raw:
                continue
            try:
                value = json.loads(raw)
            except json.JSONDecodeError as e:
                msg = f"line {number} is not valid JSON: {e.msg} at column {e.colno}"
                raise BadRequestError(msg) from None
            if not as_objects:
                records.append(raw)
                continue
            if not isinstance(value, dict):
                msg = (
                    f"line {number} is a JSON {type(value).__name__}, not an object with "
                    f"the fields {self.schema.names}"
                )
                raise BadRequestError(msg)
            try:
                check_record(value, self.schema)
            except ReceiverError as e:
                msg = f"line {number}: {e}"
                raise BadRequestError(msg) from None
            records.append(value)
        return records
