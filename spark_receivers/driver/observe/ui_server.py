"""The driver's status page, its JSON API and Prometheus ``/metrics``, served by aiohttp.

Routes (all ``GET``):

* ``/``: the status page (``driver/observe/ui/status.html`` and ``status.js``, no CDN:
  its charts are SVG drawn by that small script from the JSON API);
* ``/api/v1/statistics``, ``/api/v1/streams``, ``/api/v1/receivers``,
  ``/api/v1/batches[?limit=N]``: see :mod:`spark_receivers.driver.observe.status_api`;
* ``/metrics``: the context's Prometheus registry, text exposition format.

Bound like the Spark UI: to ``spark.receivers.ui.host``, else ``SPARK_LOCAL_IP``,
else every interface; from ``spark.receivers.ui.port`` on, trying the next port
when one is taken, ``spark.port.maxRetries`` times (16). When the application
has a secret (``spark.authenticate.secret``, the one its receivers and readers
use), every request must carry it: ``Authorization: Bearer <secret>`` (what
Prometheus' ``authorization`` setting sends) or HTTP Basic with the secret as
password (what a browser asks for); anything else gets ``401``.

Threads: aiohttp runs on an event loop thread of its own; handlers take the
driver's snapshots (short locks, no network) and never block the stream.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import errno
import hmac
import logging
import threading
from importlib import resources
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from spark_receivers.driver.observe.status_api import StatusApi
from spark_receivers.errors import ConfigError
from spark_receivers.util.extras import AIOHTTP, require

log = logging.getLogger(__name__)

__all__ = ["StatusServer"]

START_TIMEOUT_S = 30.0
_SECURITY_HEADERS = {
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "no-referrer",
    "Content-Security-Policy": "default-src 'self'; style-src 'self' 'unsafe-inline'; "
    "img-src 'self' data:; frame-ancestors 'none'",
}


def _asset(name: str) -> bytes:
    return (resources.files("spark_receivers.driver.observe") / "ui" / name).read_bytes()


class StatusServer:
    """Serves one context's status page; see the module doc.

    ``start()`` binds (raising :class:`ConfigError` naming the key when no port of
    the range is free, :class:`~spark_receivers.errors.MissingDependencyError`
    when aiohttp is not installed) and returns once it serves; ``stop()`` is
    idempotent.
    """

    def __init__(
        self,
        api: StatusApi,
        registry: CollectorRegistry,
        host: str,
        port: int,
        *,
        max_retries: int = 16,
        secret: str | None = None,
        advertised_host: str | None = None,
    ) -> None:
        self._api = api
        self._registry = registry
        self.host = host
        self._first_port = port
        self._max_retries = max(0, max_retries)
        self._secret = secret
        self._advertised = advertised_host or host
        self.port: int | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._runner: Any = None
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._page = _asset("status.html")
        self._script = _asset("status.js")

    @property
    def url(self) -> str:
        """``http://host:port/`` of the page (the advertised host when bound to every one)."""
        host = self._advertised
        if ":" in host and not host.startswith("["):
            host = f"[{host}]"
        return f"http://{host}:{self.port}/"

    def start(self) -> str:
        """Bind and serve on a thread of its own; return :attr:`url`."""
        require(AIOHTTP, "the status page")  # MissingDependencyError naming the package
        from aiohttp import web

        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._run, args=(web,), name="status-page-server", daemon=True
        )
        self._thread.start()
        if not self._ready.wait(START_TIMEOUT_S):
            msg = f"the status page did not start within {START_TIMEOUT_S:.0f}s"
            raise ConfigError(msg)
        if self._error is not None:
            self._thread.join(5)
            raise self._error
        log.info("status page at %s", self.url)
        return self.url

    def stop(self) -> None:
        """Stop serving and end the thread; idempotent."""
        loop, thread = self._loop, self._thread
        if loop is None or thread is None:
            return
        self._loop = None
        if loop.is_running():
            loop.call_soon_threadsafe(loop.stop)
        thread.join(10)

    # --- the loop thread --------------------------------------------------------------

    def _run(self, web: Any) -> None:
        loop = self._loop
        assert loop is not None
        asyncio.set_event_loop(loop)
        try:
            loop.run_until_complete(self._bind(web))
        except BaseException as e:  # noqa: BLE001 - handed to start() on its thread
            self._error = e
        finally:
            self._ready.set()
        try:
            if self._error is None:
                loop.run_forever()
        finally:
            if self._runner is not None:
                loop.run_until_complete(self._runner.cleanup())
            loop.close()

    async def _bind(self, web: Any) -> None:
        app = web.Application(middlewares=[self._guard(web)])
        app.router.add_get("/", self._index)
        app.router.add_get("/static/status.js", self._js)
        app.router.add_get("/metrics", self._metrics)
        app.router.add_get("/api/v1/statistics", self._json(self._api.statistics))
        app.router.add_get("/api/v1/streams", self._json(self._api.streams))
        app.router.add_get("/api/v1/receivers", self._json(self._api.receivers))
        app.router.add_get("/api/v1/batches", self._batches)
        self._runner = web.AppRunner(app, access_log=None, handle_signals=False)
        await self._runner.setup()
        ports = [0] if self._first_port == 0 else range(
            self._first_port, min(65535, self._first_port + self._max_retries) + 1
        )  # fmt: skip
        last: OSError | None = None
        for port in ports:
            site = web.TCPSite(self._runner, self.host, port, reuse_address=True)
            try:
                await site.start()
            except OSError as e:
                last = e
                if e.errno in (errno.EADDRINUSE, errno.EACCES):
                    continue
                break
            self.port = self._runner.addresses[-1][1]
            return
        first, end = self._first_port, ports[-1]
        msg = (
            f"the status page cannot listen on {self.host} ports {first}-{end} "
            f"(spark.receivers.ui.port, spark.port.maxRetries): {last}; pick another port, "
            "0 for any free one, or spark.receivers.ui.enabled=false"
        )
        raise ConfigError(msg)

    def _guard(self, web: Any) -> Any:
        secret = self._secret

        @web.middleware
        async def guard(request: Any, handler: Any) -> Any:
            if secret is not None and not _authorized(request.headers.get("Authorization"), secret):
                return web.Response(
                    status=401,
                    text="401: this status page needs the application secret\n",
                    headers={"WWW-Authenticate": 'Basic realm="spark-receivers"'},
                )
            response = await handler(request)
            response.headers.update(_SECURITY_HEADERS)
            return response

        return guard

    async def _index(self, request: Any) -> Any:
        from aiohttp import web

        return web.Response(body=self._page, content_type="text/html", charset="utf-8")

    async def _js(self, request: Any) -> Any:
        from aiohttp import web

        return web.Response(body=self._script, content_type="text/javascript", charset="utf-8")

    async def _metrics(self, request: Any) -> Any:
        from aiohttp import web

        body = generate_latest(self._registry)
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

    def _json(self, build: Any) -> Any:
        async def handler(request: Any) -> Any:
            from aiohttp import web

            return web.json_response(build(), headers={"Cache-Control": "no-store"})

        return handler

    async def _batches(self, request: Any) -> Any:
        from aiohttp import web

        raw = request.query.get("limit")
        if raw is not None and not raw.isdigit():
            error = {"error": f"limit must be a count, got {raw[:20]!r}"}
            return web.json_response(error, status=400)
        limit = int(raw) if raw is not None else None
        return web.json_response(self._api.batches(limit), headers={"Cache-Control": "no-store"})


def _authorized(header: str | None, secret: str) -> bool:
    """True when ``header`` carries ``secret`` as a bearer token or a Basic password."""
    if not header:
        return False
    scheme, _, value = header.partition(" ")
    value = value.strip()
    if scheme.lower() == "bearer":
        return hmac.compare_digest(value.encode(), secret.encode())
    if scheme.lower() == "basic":
        try:
            decoded = base64.b64decode(value, validate=True).decode("utf-8")
        except (binascii.Error, UnicodeDecodeError):
            return False
        _, _, password = decoded.partition(":")
        return hmac.compare_digest(password.encode(), secret.encode())
    return False
