"""``WebSocketReceiver``: the messages of a WebSocket feed (``ws://``, ``wss://``), at most once.

The WebSocket protocol has no acknowledgements: a server sends and forgets.
What the server sent while the receiver was away (a restart, a reconnect, a
crash) or what was received but not yet stored when the receiver died is lost,
and the receiver cannot tell. **At most once**, whatever the write-ahead log:
the log only keeps what was stored.

The websockets library's client (its threaded, synchronous API) on the
receiver's one thread. On every connection the receiver sends the
subscription messages (``subscribe``: one text message or a list, sent in
order right after the handshake, as market-data and IoT feeds want), then
gathers messages for up to ``batch_wait_ms`` (at most ``max_batch``) and stores
them. It pings the server every ``ping_interval_s``; no pong within
``ping_timeout_s`` (a dead peer, a cut network) closes the connection. Any
closed connection ends the run and the receiver reconnects with the capped,
jittered backoff of :class:`ThreadedReceiver` (``backoff_base_ms``,
``max_backoff_ms``), reset once a batch is stored or a connection lasted 10 s.

A message longer than ``max_record_bytes`` is refused by the client as it
arrives (close code 1009, nothing of it buffered beyond the limit) and is a bad
record (``bad_record_policy``; its bytes are not kept, so ``dead_letter``
records only why), then the receiver reconnects. A binary message that is not
UTF-8, or one not fitting a declared schema, is a bad record too.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from spark_receivers.errors import ConfigError, ReceiverError
from spark_receivers.receiver.bad_records import too_long
from spark_receivers.receiver.schema import check_record
from spark_receivers.receiver.source_support import now_us
from spark_receivers.receiver.threaded_receiver import ThreadedReceiver
from spark_receivers.receivers.amqp import redact
from spark_receivers.util.extras import WEBSOCKETS
from spark_receivers.util.options import require_positive_ints, require_positive_numbers

if TYPE_CHECKING:
    from websockets.sync.client import ClientConnection

log = logging.getLogger(__name__)

__all__ = ["MESSAGE_FIELDS", "WebSocketReceiver"]

MESSAGE_FIELDS = ("payload", "binary", "connection")
"""The fields a declared schema may take from a message (``connection``: its number)."""
HEALTHY_AFTER_S = 10.0
MESSAGE_TOO_BIG = 1009


class WebSocketReceiver(ThreadedReceiver):
    """Stores the messages (text, or UTF-8 binary) a WebSocket server at ``url`` sends.

    ``url``: ``ws://host[:port]/path`` or ``wss://`` (TLS; ``ca_certs``: a CA file
    to trust instead of the system's). ``subscribe``: text message(s) sent on
    every connection; ``headers``: extra handshake headers (an ``Authorization``,
    a token). At most once: see the module doc.

    Thread contract: one thread (``websocket-<stream>``) connects, receives and
    stores; ``on_stop`` closes the connection and waits for it.
    """

    thread_name_prefix = "websocket"
    requires = (WEBSOCKETS,)  # the [websocket] extra
    transient_attrs = ("_ws",)
    supports_timestamp = True
    _ws: ClientConnection | None = None

    def __init__(
        self,
        url: str,
        *,
        subscribe: str | list[str] | None = None,
        headers: dict[str, str] | None = None,
        ca_certs: str | None = None,
        max_batch: int = 1000,
        batch_wait_ms: int = 100,
        ping_interval_s: float = 20.0,
        ping_timeout_s: float = 20.0,
        open_timeout_s: float = 10.0,
        max_backoff_ms: int = 30_000,
        **kwargs: Any,
    ) -> None:
        super().__init__(max_backoff_ms=max_backoff_ms, **kwargs)
        parts = urlsplit(url)
        if parts.scheme not in ("ws", "wss") or not parts.hostname:
            msg = f"url must be ws://host[:port]/path or wss://..., got {redact(url)}"
            raise ConfigError(msg)
        require_positive_ints(max_batch=max_batch, batch_wait_ms=batch_wait_ms)
        require_positive_numbers(
            ping_interval_s=ping_interval_s,
            ping_timeout_s=ping_timeout_s,
            open_timeout_s=open_timeout_s,
        )
        messages = [subscribe] if isinstance(subscribe, str) else list(subscribe or [])
        if not all(isinstance(m, str) for m in messages):
            msg = "subscribe must be a text message or a list of them"
            raise ConfigError(msg)
        if not self.default_records and not set(self.record_schema.names) <= set(MESSAGE_FIELDS):
            msg = (
                f"a declared schema may only have fields among {MESSAGE_FIELDS}, "
                f"got {self.record_schema.names}"
            )
            raise ConfigError(msg)
        self.url = url
        self.subscribe = messages
        self.headers = dict(headers or {})
        self.ca_certs = ca_certs
        self.max_batch = max_batch
        self.batch_wait_ms = batch_wait_ms
        self.ping_interval_s = ping_interval_s
        self.ping_timeout_s = ping_timeout_s
        self.open_timeout_s = open_timeout_s
        self._where = redact(url)
        self.connections = 0
        self.records_stored = 0

    def describe(self) -> str:
        """``reading WebSocket <url without its password>``."""
        return f"reading WebSocket {self._where}"

    def reset_runtime(self) -> None:
        """No connection yet: each run connects anew."""
        self._ws = None

    def interrupt(self) -> None:
        """Close the connection: wakes a blocked ``recv``."""
        ws = self._ws
        if ws is not None:
            try:
                ws.close()
            except Exception:  # noqa: BLE001 - already closed or broken
                log.debug("receiver %d: closing the WebSocket failed", self.stream_id)

    # --- the receiving thread --------------------------------------------------------

    def receive(self) -> None:
        """Connect, subscribe, then receive and store until stopped or disconnected."""
        from websockets.exceptions import ConnectionClosed

        ws = self._connect()
        self._ws = ws
        self.connections += 1
        connection = self.connections
        opened = time.monotonic()
        batch: list[Any] = []
        times: list[int] = []
        try:
            if self.stopping:
                return
            for message in self.subscribe:
                ws.send(message)
            wait_s = self.batch_wait_ms / 1000.0
            flush_at = time.monotonic() + wait_s
            while not self.stopping:
                timeout_s = max(0.0, flush_at - time.monotonic()) if batch else wait_s
                try:
                    data = ws.recv(timeout=timeout_s)
                except TimeoutError:
                    data = None
                if data is not None:
                    if not batch:
                        flush_at = time.monotonic() + wait_s
                    try:
                        record = self._checked_record(data, connection)
                    except ReceiverError as bad:
                        # What came before is stored first: under "fail" the policy stops
                        # the receiver, and whoever sees the stop must find it stored. (It
                        # was stored after the stop, in the finally below: beside a CPU hog
                        # a test saw the stop and not it, 2026-11-28.)
                        self._store(batch, times)
                        batch, times = [], []
                        self.handle_bad_record(data, str(bad), key=f"connection {connection}")
                        record = None
                    if record is not None:
                        batch.append(record)
                        times.append(now_us())
                if batch and (
                    data is None or len(batch) >= self.max_batch or time.monotonic() >= flush_at
                ):
                    self._store(batch, times)
                    batch, times = [], []
                if time.monotonic() - opened >= HEALTHY_AFTER_S:
                    self.mark_healthy()
        except ConnectionClosed as e:
            self._store(batch, times)  # what arrived before the close
            batch, times = [], []
            if self.stopping:
                return
            sent = e.sent.code if e.sent is not None else None
            if sent == MESSAGE_TOO_BIG:
                limit = self.record_limit
                self.handle_bad_record(
                    b"",
                    f"a message from {self._where} was longer than max_record_bytes ({limit:,} "
                    "bytes): refused as it arrived (close code 1009), its bytes not kept",
                    key="oversize message",
                )
            msg = f"the WebSocket connection to {self._where} closed: {_close_reason(e)}"
            raise ReceiverError(msg) from None
        finally:
            self._store(batch, times)
            try:
                ws.close()
            except Exception:  # noqa: BLE001 - already closed or broken
                log.debug("receiver %d: closing the WebSocket failed", self.stream_id)

    def _connect(self) -> ClientConnection:
        from websockets.exceptions import InvalidHandshake, InvalidURI
        from websockets.sync.client import connect

        ssl_context = None
        if self.url.startswith("wss:"):
            import ssl

            ssl_context = ssl.create_default_context(cafile=self.ca_certs)
        try:
            connection: ClientConnection = connect(  # type: ignore[call-overload]
                self.url,
                ssl=ssl_context,
                additional_headers=self.headers or None,
                open_timeout=self.open_timeout_s,
                ping_interval=self.ping_interval_s,
                ping_timeout=self.ping_timeout_s,
                close_timeout=5,
                max_size=self.record_limit,
                proxy=None,
                **_legacy(connect),
            )
        except (OSError, TimeoutError, InvalidHandshake, InvalidURI) as e:
            reason = str(e) or type(e).__name__
            msg = f"cannot connect to the WebSocket server at {self._where}: {reason}"
            raise ReceiverError(msg) from None
        return connection

    def _checked_record(self, data: str | bytes, connection: int) -> Any:
        binary = isinstance(data, bytes)
        raw = data if isinstance(data, bytes) else data.encode("utf-8")
        limit = self.record_limit
        if len(raw) > limit:  # the client's max_size counts a text frame's characters
            msg = f"a message from {self._where} is {too_long(len(raw), limit)}"
            raise ReceiverError(msg)
        if isinstance(data, bytes):
            try:
                text = data.decode("utf-8")
            except UnicodeDecodeError as e:
                msg = f"a binary message from {self._where} is not UTF-8 (byte {e.start})"
                raise ReceiverError(msg) from None
        else:
            text = data
        if self.default_records:
            return text
        values = {"payload": text, "binary": binary, "connection": connection}
        record = {name: values[name] for name in self.record_schema.names}
        check_record(record, self.record_schema)
        return record

    def _store(self, batch: list[Any], times: list[int]) -> None:
        if batch:
            self.store_records(batch, times_us=times)
            self.records_stored += len(batch)
            self.mark_healthy()


def _legacy(connect: Any) -> dict[str, bool]:
    """``legacy=True`` where connect() takes it (websockets 17: a connection, not an iterator)."""
    import inspect

    return {"legacy": True} if "legacy" in inspect.signature(connect).parameters else {}


def _close_reason(e: Any) -> str:
    """The close frames of a ``ConnectionClosed`` (or that there was none), in words."""
    frame = e.rcvd or e.sent
    if frame is None:
        return "no close frame (the connection dropped)"
    origin = "the server" if e.rcvd is not None else "the client"
    reason = f": {frame.reason}" if frame.reason else ""
    return f"{origin} sent close code {frame.code}{reason}"
