"""``AmqpReceiver``: consumes an AMQP 0-9-1 queue (RabbitMQ), acking after the reliable store.

pika's ``BlockingConnection`` on the receiver's one thread, manual acks only.
Deliveries are gathered for up to ``batch_wait_ms`` (at most one prefetch
window), stored with ``store(records, reliable=True)`` (in the write-ahead log
when it is on), and only then acknowledged with one ``basic.ack multiple``. A
delivery whose store failed, or that was not yet acked when the connection or
the receiver died, is unacked: the broker requeues it and delivers it again
(flagged ``redelivered``): at least once, nothing acknowledged is lost.

The prefetch window (``basic.qos``) is bounded so that the deliveries held
unacked, each at most ``max_record_bytes``, fit the executor's block store
budget (``spark.receivers.receiver.blockStoreMemory``; :func:`prefetch_for`).

A delivery that cannot become a record (longer than ``max_record_bytes``, not
UTF-8, not fitting a declared schema) is a bad record, handled by
``bad_record_policy``: ``skip`` and ``dead_letter`` (which also writes it to
the dead-letter folder) reject it without requeueing (``basic.reject
requeue=false``), so the queue's dead-letter exchange, when it has one
(``x-dead-letter-exchange``), gets it; ``fail`` stores and acks the
deliveries before it and stops the receiver for good (the delivery is
requeued by the broker).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote, urlsplit

from spark_receivers.errors import ConfigError, ReceiverError
from spark_receivers.receiver.bad_records import BadRecordPolicy, too_long
from spark_receivers.receiver.schema import check_record
from spark_receivers.receiver.source_support import now_us
from spark_receivers.receiver.threaded_receiver import ThreadedReceiver
from spark_receivers.util.extras import PIKA
from spark_receivers.util.options import require_positive_ints

if TYPE_CHECKING:
    import pika.adapters.blocking_connection

log = logging.getLogger(__name__)

__all__ = ["MESSAGE_FIELDS", "AmqpReceiver", "prefetch_for", "redact"]

MESSAGE_FIELDS = ("payload", "routing_key", "exchange", "redelivered", "message_id")
"""The fields a declared schema may take from a delivery."""
MAX_PREFETCH = 65535  # basic.qos prefetch-count is a short


@dataclass(frozen=True)
class _Delivery:
    tag: int
    redelivered: bool
    routing_key: str
    exchange: str
    message_id: str | None
    body: bytes
    arrived_us: int


class AmqpReceiver(ThreadedReceiver):
    """Stores the bodies (UTF-8) of the messages of AMQP queue ``queue`` at ``url``.

    ``url``: ``amqp://user:password@host:5672/vhost`` (``amqps://`` for TLS; the
    vhost percent-encoded, ``%2F`` for ``/``). The queue must exist (declare it
    durable, with its dead-letter exchange if you want one); a missing queue, a
    refused login or an unreachable broker is a failure that restarts the
    receiver with backoff, its message naming the cause (the password never).

    Records: the body as a string, or under a declared schema a dict of its
    fields among :data:`MESSAGE_FIELDS` (``redelivered`` is True for a delivery the
    broker made before: it may have been stored already). ``max_batch`` and
    ``batch_wait_ms`` bound one store; ``prefetch`` (default: :func:`prefetch_for`)
    the unacked deliveries; ``heartbeat_s`` the AMQP heartbeat. See the module doc
    for acks, redelivery and bad records.

    Thread contract: one thread (``amqp-<stream>``) connects, consumes, stores and
    acks; ``on_stop`` waits for it, at most about ``batch_wait_ms`` plus one store.
    """

    thread_name_prefix = "amqp"
    requires = (PIKA,)  # the [amqp] extra
    supports_timestamp = True

    def __init__(
        self,
        url: str,
        queue: str,
        *,
        max_batch: int = 1000,
        batch_wait_ms: int = 100,
        prefetch: int | None = None,
        heartbeat_s: int = 30,
        connect_timeout_s: float = 10.0,
        max_backoff_ms: int = 30_000,
        **kwargs: Any,
    ) -> None:
        kwargs.setdefault("stop_timeout_s", batch_wait_ms / 1000.0 + 40)
        super().__init__(max_backoff_ms=max_backoff_ms, **kwargs)
        require_positive_ints(
            max_batch=max_batch, batch_wait_ms=batch_wait_ms, heartbeat_s=heartbeat_s
        )
        if prefetch is not None and not 1 <= prefetch <= MAX_PREFETCH:
            msg = (
                f"prefetch must be in 1-{MAX_PREFETCH} or None (from the budget), got {prefetch!r}"
            )
            raise ConfigError(msg)
        if not queue:
            msg = "queue must be a non-empty queue name"
            raise ConfigError(msg)
        parts = _split_url(url)
        if not self.default_records and not set(self.record_schema.names) <= set(MESSAGE_FIELDS):
            msg = (
                f"a declared schema may only have fields among {MESSAGE_FIELDS}, "
                f"got {self.record_schema.names}"
            )
            raise ConfigError(msg)
        self.url = url
        self.queue = queue
        self.max_batch = max_batch
        self.batch_wait_ms = batch_wait_ms
        self.prefetch = prefetch
        self.heartbeat_s = heartbeat_s
        self.connect_timeout_s = connect_timeout_s
        self._where = parts.display
        self.records_stored = 0
        self.messages_acked = 0
        self.messages_rejected = 0
        self.redelivered = 0

    @property
    def prefetch_count(self) -> int:
        """The ``basic.qos`` prefetch: ``prefetch``, else :func:`prefetch_for` the budget."""
        if self.prefetch is not None:
            return self.prefetch
        config = getattr(self._supervisor, "config", None)
        budget = getattr(config, "block_store_budget_bytes", None)
        if budget is None:  # no context's config (a bare harness): the batch bounds it
            return min(self.max_batch, MAX_PREFETCH)
        return prefetch_for(int(budget), self.record_limit, self.max_batch)

    def describe(self) -> str:
        """``consuming AMQP queue <queue> at <url without its password>``."""
        return f"consuming AMQP queue {self.queue!r} at {self._where}"

    # --- the consuming thread -----------------------------------------------------

    def receive(self) -> None:
        """Connect, check the queue, then consume, store and ack until stopped."""
        connection = self._connect()
        try:
            channel = connection.channel()
            self._check_queue(channel)
            prefetch = self.prefetch_count
            channel.basic_qos(prefetch_count=prefetch)
            self._consume(channel, min(self.max_batch, prefetch))
            if channel.is_open:
                channel.cancel()  # what was delivered and not acked goes back to the queue
        finally:
            if connection.is_open:
                try:
                    connection.close()
                except Exception:  # noqa: BLE001 - closing a broken connection
                    log.debug("receiver %d: closing the AMQP connection failed", self.stream_id)

    def _connect(self) -> pika.BlockingConnection:
        import pika
        import pika.exceptions

        parts = _split_url(self.url)
        params = pika.ConnectionParameters(
            host=parts.host,
            port=parts.port,
            virtual_host=parts.vhost,
            credentials=pika.PlainCredentials(parts.user, parts.password, erase_on_connect=False),
            heartbeat=self.heartbeat_s,
            socket_timeout=self.connect_timeout_s,
            stack_timeout=self.connect_timeout_s + 5,
            blocked_connection_timeout=300,
            connection_attempts=1,
            ssl_options=_ssl_options(parts.host) if parts.tls else None,
            client_properties={"connection_name": f"spark-receivers {self.queue}"},
        )
        try:
            return pika.BlockingConnection(params)
        except (
            pika.exceptions.ProbableAuthenticationError,
            pika.exceptions.AuthenticationError,
        ):
            msg = (
                f"the AMQP broker at {self._where} refused the login of user {parts.user!r}: "
                "check the user and password in the URL"
            )
            raise ReceiverError(msg) from None
        except pika.exceptions.ProbableAccessDeniedError:
            msg = (
                f"the AMQP broker at {self._where} refused user {parts.user!r} access to vhost "
                f"{parts.vhost!r}: check the vhost and the user's permissions"
            )
            raise ReceiverError(msg) from None
        except pika.exceptions.AMQPConnectionError as e:
            msg = f"cannot connect to the AMQP broker at {self._where}: {_reason(e, parts)}"
            raise ReceiverError(msg) from None

    def _check_queue(self, channel: Any) -> None:
        import pika.exceptions

        try:
            channel.queue_declare(self.queue, passive=True)
        except pika.exceptions.ChannelClosedByBroker as e:
            if e.reply_code == 404:
                msg = (
                    f"AMQP queue {self.queue!r} does not exist at {self._where}: declare it "
                    "first (durable, with x-dead-letter-exchange for the bad records)"
                )
            else:
                msg = f"AMQP queue {self.queue!r} at {self._where}: {e.reply_text}"
            raise ReceiverError(msg) from None

    def _consume(self, channel: Any, batch_limit: int) -> None:
        wait_s = self.batch_wait_ms / 1000.0
        batch: list[_Delivery] = []
        flush_at = 0.0
        for method, props, body in channel.consume(
            self.queue, auto_ack=False, inactivity_timeout=wait_s
        ):
            if method is not None:
                if not batch:
                    flush_at = time.monotonic() + wait_s
                batch.append(
                    _Delivery(
                        method.delivery_tag,
                        bool(method.redelivered),
                        method.routing_key,
                        method.exchange,
                        props.message_id,
                        body,
                        now_us(),
                    )
                )
            if batch and (
                method is None or len(batch) >= batch_limit or time.monotonic() >= flush_at
            ):
                self._store_and_ack(channel, batch)
                batch = []
                self.mark_healthy()
            if self.stopping:
                break
        # unacked deliveries left in ``batch`` are requeued by the broker when we close

    def _store_and_ack(self, channel: Any, batch: list[_Delivery]) -> None:
        records: list[Any] = []
        times: list[int] = []
        last_good: int | None = None
        for d in batch:
            if d.redelivered:
                self.redelivered += 1
            try:
                record = self._record(d)
            except ReceiverError as bad:
                if self.bad_record_policy is BadRecordPolicy.FAIL:
                    self._store_then_ack(channel, records, times, last_good)
                    records, times, last_good = [], [], None
                # raises under "fail": the delivery stays unacked and is requeued on close
                self.handle_bad_record(d.body, str(bad), key=f"delivery {d.tag}")
                channel.basic_reject(d.tag, requeue=False)  # to the dead-letter exchange, if any
                self.messages_rejected += 1
            else:
                records.append(record)
                times.append(d.arrived_us)
                last_good = d.tag
        self._store_then_ack(channel, records, times, last_good)

    def _store_then_ack(
        self, channel: Any, records: list[Any], times: list[int], last_tag: int | None
    ) -> None:
        if not records or last_tag is None:
            return
        self.store_records(records, reliable=True, times_us=times)
        self.records_stored += len(records)
        channel.basic_ack(last_tag, multiple=True)
        self.messages_acked += len(records)

    def _record(self, d: _Delivery) -> Any:
        where = f"message {d.tag} of queue {self.queue!r}"
        limit = self.record_limit
        if len(d.body) > limit:
            msg = f"{where} is {too_long(len(d.body), limit)}"
            raise ReceiverError(msg)
        try:
            payload = d.body.decode("utf-8")
        except UnicodeDecodeError as e:
            msg = f"{where} is not UTF-8 ({len(d.body)} bytes, byte {e.start})"
            raise ReceiverError(msg) from None
        if self.default_records:
            return payload
        values = {
            "payload": payload,
            "routing_key": d.routing_key,
            "exchange": d.exchange,
            "redelivered": d.redelivered,
            "message_id": d.message_id,
        }
        record = {name: values[name] for name in self.record_schema.names}
        try:
            check_record(record, self.record_schema)
        except ReceiverError as e:
            msg = f"{where}: {e}"
            raise ReceiverError(msg) from None
        return record


def prefetch_for(budget_bytes: int, record_limit: int, max_batch: int) -> int:
    """The prefetch whose unacked deliveries, each at most ``record_limit``, fit the budget.

    At least 1, at most ``max_batch`` (no store takes more) and 65535 (AMQP's limit).

    >>> prefetch_for(512 * 2**20, 2**20, 1000)
    512
    >>> prefetch_for(512 * 2**20, 4096, 1000)
    1000
    """
    return max(1, min(max_batch, MAX_PREFETCH, budget_bytes // max(1, record_limit)))


@dataclass(frozen=True)
class _UrlParts:
    tls: bool
    host: str
    port: int
    vhost: str
    user: str
    password: str
    display: str


def _split_url(url: str) -> _UrlParts:
    """The parts of an ``amqp[s]://user:password@host:port/vhost`` URL; ConfigError if bad."""
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as e:
        msg = f"AMQP url {redact(url)} is not valid: {e}"
        raise ConfigError(msg) from None
    if parts.scheme not in ("amqp", "amqps") or not parts.hostname:
        msg = f"AMQP url must be amqp[s]://user:password@host[:port]/vhost, got {redact(url)}"
        raise ConfigError(msg)
    tls = parts.scheme == "amqps"
    vhost = unquote(parts.path[1:]) if len(parts.path) > 1 else "/"
    return _UrlParts(
        tls=tls,
        host=parts.hostname,
        port=port or (5671 if tls else 5672),
        vhost=vhost,
        user=unquote(parts.username) if parts.username is not None else "guest",
        password=unquote(parts.password) if parts.password is not None else "guest",
        display=redact(url),
    )


def _ssl_options(host: str) -> Any:
    import ssl

    import pika

    return pika.SSLOptions(ssl.create_default_context(), server_hostname=host)


def _reason(error: BaseException, parts: _UrlParts) -> str:
    """The reason in pika's nested connection error, shortened, without the password."""
    text = str(error) or type(error).__name__
    if "last_exception" in text:  # AMQPConnectionWorkflowFailed: the last attempt says why
        text = text.split("last_exception - ", 1)[1].split("; first_exception", 1)[0]
    if parts.password:
        text = text.replace(parts.password, "***")
    return text


def redact(url: str) -> str:
    """``url`` with its password replaced by ``***`` (the password runs to the last '@').

    >>> redact("amqp://app:s3cr@t@host:5672/%2F")
    'amqp://app:***@host:5672/%2F'
    """
    scheme, sep, rest = url.partition("://")
    end = min((i for i in (rest.find("/"), rest.find("?")) if i >= 0), default=len(rest))
    netloc, tail = rest[:end], rest[end:]
    if not sep or "@" not in netloc:
        return url
    userinfo, _, hostport = netloc.rpartition("@")
    if ":" not in userinfo:
        return url
    return f"{scheme}://{userinfo.split(':', 1)[0]}:***@{hostport}{tail}"
