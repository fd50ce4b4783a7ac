"""``NatsReceiver``: a durable pull consumer of a NATS JetStream stream, acking after storing.

nats-py on an asyncio loop of the receiver's one thread. The receiver fetches
up to one batch (at most ``max_batch`` and the consumer's ``max_ack_pending``),
stores it with ``store(records, reliable=True)`` (in the write-ahead log when
it is on), then acks every message (``+ACK``) and flushes, so the server has
the acks before the next fetch. A message whose store failed, or that was not
acked when the receiver or its connection died, is delivered again by the
server once its ``AckWait`` (``ack_wait_s``) passed, up to ``max_deliver``
times: at least once, nothing acknowledged is lost. A store must end within
``AckWait``, or the server delivers the batch again meanwhile (duplicates).

The durable consumer (``durable``, default: unique to the job's stream, the same
across restarts) is created on the driver when the context starts
(:meth:`NatsReceiver.prepare_source`) or by the receiver, with explicit acks,
``ack_wait_s``, ``max_deliver``, ``max_ack_pending``, ``deliver`` (``all``: the
stream from its first message; ``new``: from the consumer's creation) and the
optional ``subject`` filter. An existing consumer is used as it is.

A message that cannot become a record (longer than ``max_record_bytes``, not
UTF-8, not fitting a declared schema) is a bad record, handled by
``bad_record_policy``: ``skip`` and ``dead_letter`` (which also writes it to the
dead-letter folder) terminate it (``+TERM``: never delivered again; the server
publishes a ``$JS.EVENT.ADVISORY.CONSUMER.MSG_TERMINATED`` advisory); ``fail``
stores and acks the messages before it and stops the receiver for good (the
bad one is delivered again after ``AckWait`` to the next consumer).
"""

from __future__ import annotations

import asyncio
import logging
import re
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote, urlsplit

from spark_receivers.errors import ConfigError, ReceiverError
from spark_receivers.receiver.bad_records import BadRecordPolicy, too_long
from spark_receivers.receiver.schema import check_record
from spark_receivers.receiver.source_support import JobName, now_us
from spark_receivers.receiver.threaded_receiver import ThreadedReceiver
from spark_receivers.receivers.amqp import redact as _redact_password
from spark_receivers.util.extras import NATS
from spark_receivers.util.options import require_positive_ints, require_positive_numbers

if TYPE_CHECKING:
    import nats.aio.client
    import nats.aio.msg
    import nats.js

log = logging.getLogger(__name__)

__all__ = ["MESSAGE_FIELDS", "NatsReceiver", "redact"]

MESSAGE_FIELDS = ("payload", "subject", "redelivered", "num_delivered", "stream_seq")
"""The fields a declared schema may take from a message."""
DURABLE_PREFIX = "spark-receivers"


class NatsReceiver(ThreadedReceiver):
    """Stores the payloads (UTF-8) of JetStream stream ``stream`` at ``url``.

    ``url``: ``nats://user:password@host:4222`` (``nats://token@host:4222`` or
    ``token=`` for a token; ``tls://`` for TLS). The stream must exist; an unreachable server, a
    refused login or a missing stream is a failure that restarts the receiver with
    backoff, its message naming the cause (never the password).

    Records: the payload as a string, or under a declared schema a dict of its
    fields among :data:`MESSAGE_FIELDS` (``redelivered``: delivered before, so maybe
    stored already; ``num_delivered``: the server's delivery count). See the module
    doc for the consumer, acks, ``AckWait`` and bad records.

    Thread contract: one thread (``nats-<stream>``) runs an asyncio loop that
    connects, fetches, stores and acks; ``on_stop`` waits for it, at most about
    ``fetch_wait_ms`` plus one store.
    """

    thread_name_prefix = "nats"
    requires = (NATS,)  # the [nats] extra
    supports_timestamp = True

    def __init__(
        self,
        url: str,
        stream: str,
        *,
        durable: str | None = None,
        subject: str | None = None,
        token: str | None = None,
        deliver: str = "all",
        max_batch: int = 1000,
        fetch_wait_ms: int = 500,
        ack_wait_s: float = 30.0,
        max_deliver: int = -1,
        max_ack_pending: int = 1000,
        connect_timeout_s: float = 5.0,
        max_backoff_ms: int = 30_000,
        **kwargs: Any,
    ) -> None:
        kwargs.setdefault("stop_timeout_s", fetch_wait_ms / 1000.0 + 40)
        super().__init__(max_backoff_ms=max_backoff_ms, **kwargs)
        require_positive_ints(
            max_batch=max_batch, fetch_wait_ms=fetch_wait_ms, max_ack_pending=max_ack_pending
        )
        require_positive_numbers(ack_wait_s=ack_wait_s)
        if max_deliver == 0 or max_deliver < -1:
            msg = f"max_deliver must be -1 (no limit) or > 0, got {max_deliver!r}"
            raise ConfigError(msg)
        if deliver not in ("all", "new"):
            msg = f"deliver must be 'all' or 'new', got {deliver!r}"
            raise ConfigError(msg)
        for key, name in (("stream", stream), ("durable", durable)):
            if name is not None and not re.fullmatch(r"[A-Za-z0-9_-]+", name):
                msg = f"{key} must be letters, digits, '-' and '_' only, got {name!r}"
                raise ConfigError(msg)
        _split_url(url)
        if not self.default_records and not set(self.record_schema.names) <= set(MESSAGE_FIELDS):
            msg = (
                f"a declared schema may only have fields among {MESSAGE_FIELDS}, "
                f"got {self.record_schema.names}"
            )
            raise ConfigError(msg)
        self.url = url
        self.token = token
        self.stream = stream
        self.durable = durable
        self.subject = subject
        self.deliver = deliver
        self.max_batch = max_batch
        self.fetch_wait_ms = fetch_wait_ms
        self.ack_wait_s = ack_wait_s
        self.max_deliver = max_deliver
        self.max_ack_pending = max_ack_pending
        self.connect_timeout_s = connect_timeout_s
        self._where = redact(url)
        self.records_stored = 0
        self.messages_acked = 0
        self.messages_terminated = 0
        self.redelivered = 0

    @property
    def consumer_name(self) -> str:
        """The durable consumer: ``durable``, else :meth:`durable_name` (on the executor)."""
        return self.durable or _consumer_safe(self.durable_name(DURABLE_PREFIX))

    def describe(self) -> str:
        """``consuming NATS JetStream stream <stream> at <url without its password>``."""
        return f"consuming NATS JetStream stream {self.stream!r} at {self._where}"

    # --- on the driver, when the context starts ------------------------------------

    def prepare_source(self, job: JobName) -> None:
        """Create the durable consumer now, so what is published from now on waits for it."""
        name = self.durable or _consumer_safe(job.durable_name(self.stream_id, DURABLE_PREFIX))

        async def prepare() -> None:
            nc = await self._connect()
            try:
                await self._ensure_consumer(nc.jetstream(), name)
            finally:
                await nc.close()

        asyncio.run(asyncio.wait_for(prepare(), self.connect_timeout_s + 5))

    # --- the consuming thread -------------------------------------------------------

    def receive(self) -> None:
        """Run the asyncio loop of :meth:`_run` until stopped."""
        asyncio.run(self._run())

    async def _run(self) -> None:
        nc = await self._connect()
        try:
            js = nc.jetstream()
            name = self.consumer_name
            await self._ensure_consumer(js, name)
            sub = await js.pull_subscribe_bind(durable=name, stream=self.stream)
            batch_limit = min(self.max_batch, self.max_ack_pending)
            wait_s = self.fetch_wait_ms / 1000.0
            while not self.stopping:
                if nc.is_closed:
                    msg = f"lost the connection to the NATS server at {self._where}"
                    raise ReceiverError(msg)
                try:
                    msgs = await sub.fetch(batch_limit, timeout=wait_s)
                except TimeoutError:
                    # Nothing to fetch within fetch_wait_ms. nats-py raises its own
                    # TimeoutError or, from one path of a pull fetch, asyncio's (the builtin
                    # since 3.11): the second was taken for a failure and restarted the
                    # receiver with a growing back-off (ft37, 2026-11-29).
                    continue
                if msgs:
                    await self._store_and_ack(nc, msgs)
                    self.mark_healthy()
        finally:
            if not nc.is_closed:
                await nc.close()

    async def _connect(self) -> nats.aio.client.Client:
        import nats
        import nats.errors

        server, user, password, token = _split_url(self.url)
        token = self.token or token
        errors: list[str] = []

        async def on_error(e: Exception) -> None:
            errors.append(str(e) or type(e).__name__)

        try:
            connect = nats.connect(
                servers=[server],
                user=user,
                password=password,
                token=token,
                connect_timeout=max(1, round(self.connect_timeout_s)),
                # One attempt, then the run ends and the receiver restarts with its backoff.
                # (allow_reconnect=False or 0 attempts retry a refused first connect forever.)
                allow_reconnect=True,
                max_reconnect_attempts=1,
                reconnect_time_wait=0,
                error_cb=on_error,
                name=f"spark-receivers {self.stream}",
            )
            return await asyncio.wait_for(connect, self.connect_timeout_s + 5)
        except Exception as e:  # noqa: BLE001 - every connect failure becomes one clear line
            reason = "; ".join(dict.fromkeys([*errors, str(e) or type(e).__name__]))
            if "authorization" in reason.lower():
                msg = (
                    f"the NATS server at {self._where} refused the login"
                    f"{f' of user {user!r}' if user else ''}: check the credentials in the URL"
                )
            else:
                msg = f"cannot connect to the NATS server at {self._where}: {reason}"
            for secret in (password, token):
                if secret:
                    msg = msg.replace(secret, "***")
            raise ReceiverError(msg) from None

    async def _ensure_consumer(self, js: nats.js.JetStreamContext, name: str) -> None:
        import nats.js.api as api
        import nats.js.errors as jserrors

        try:
            await js.stream_info(self.stream)
        except jserrors.NotFoundError:
            msg = (
                f"NATS JetStream stream {self.stream!r} does not exist at {self._where}: "
                "create it first (nats stream add)"
            )
            raise ReceiverError(msg) from None
        try:
            await js.consumer_info(self.stream, name)
        except jserrors.NotFoundError:
            pass
        else:
            return  # an existing consumer is used as it is
        config = api.ConsumerConfig(
            durable_name=name,
            ack_policy=api.AckPolicy.EXPLICIT,
            ack_wait=self.ack_wait_s,
            max_deliver=self.max_deliver,
            max_ack_pending=self.max_ack_pending,
            deliver_policy=api.DeliverPolicy.ALL
            if self.deliver == "all"
            else api.DeliverPolicy.NEW,
            filter_subject=self.subject,
        )
        await js.add_consumer(self.stream, config)
        log.info(
            "receiver %d: created durable consumer %s on %s", self.stream_id, name, self.stream
        )

    async def _store_and_ack(self, nc: Any, msgs: list[nats.aio.msg.Msg]) -> None:
        records: list[Any] = []
        times: list[int] = []
        good: list[Any] = []
        for m in msgs:
            delivered = int(m.metadata.num_delivered or 1)
            if delivered > 1:
                self.redelivered += 1
            try:
                record = self._record(m, delivered)
            except ReceiverError as bad:
                if self.bad_record_policy is BadRecordPolicy.FAIL:
                    await self._store_then_ack(nc, records, times, good)
                    records, times, good = [], [], []
                # raises under "fail": the message is delivered again after AckWait
                seq = m.metadata.sequence.stream if m.metadata.sequence else "?"
                self.handle_bad_record(m.data, str(bad), key=f"stream seq {seq}")
                await m.term()
                self.messages_terminated += 1
            else:
                records.append(record)
                times.append(now_us())
                good.append(m)
        await self._store_then_ack(nc, records, times, good)
        await nc.flush()  # the server has every ack and term before the next fetch

    async def _store_then_ack(
        self, nc: Any, records: list[Any], times: list[int], good: list[Any]
    ) -> None:
        if not good:
            return
        # the store blocks (reliable: until kept); the loop has nothing else to do meanwhile
        self.store_records(records, reliable=True, times_us=times)
        self.records_stored += len(records)
        for m in good:
            await m.ack()
        await nc.flush()
        self.messages_acked += len(good)

    def _record(self, m: Any, delivered: int) -> Any:
        seq = m.metadata.sequence.stream if m.metadata.sequence else None
        where = f"message {seq} of stream {self.stream!r} (subject {m.subject!r})"
        limit = self.record_limit
        if len(m.data) > limit:
            msg = f"{where} is {too_long(len(m.data), limit)}"
            raise ReceiverError(msg)
        try:
            payload = m.data.decode("utf-8")
        except UnicodeDecodeError as e:
            msg = f"{where} is not UTF-8 ({len(m.data)} bytes, byte {e.start})"
            raise ReceiverError(msg) from None
        if self.default_records:
            return payload
        values = {
            "payload": payload,
            "subject": m.subject,
            "redelivered": delivered > 1,
            "num_delivered": delivered,
            "stream_seq": seq,
        }
        record = {name: values[name] for name in self.record_schema.names}
        try:
            check_record(record, self.record_schema)
        except ReceiverError as e:
            msg = f"{where}: {e}"
            raise ReceiverError(msg) from None
        return record


def redact(url: str) -> str:
    """``url`` without its password, or its token (``nats://***@host``).

    >>> redact("nats://s3cret@host:4222")
    'nats://***@host:4222'
    >>> redact("nats://app:s3cret@host:4222")
    'nats://app:***@host:4222'
    """
    scheme, sep, rest = url.partition("://")
    netloc = rest.split("/", 1)[0].split("?", 1)[0]
    if sep and "@" in netloc and ":" not in netloc.rpartition("@")[0]:
        return f"{scheme}://***@{rest.split('@')[-1]}" if rest.count("@") else url
    return _redact_password(url)


def _consumer_safe(name: str) -> str:
    """A durable name NATS takes: no '.', '*', '>' or spaces."""
    return re.sub(r"[^A-Za-z0-9_-]", "_", name)


def _split_url(url: str) -> tuple[str, str | None, str | None, str | None]:
    """``(server without credentials, user, password, token)``; ConfigError when bad."""
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as e:
        msg = f"NATS url {redact(url)} is not valid: {e}"
        raise ConfigError(msg) from None
    if parts.scheme not in ("nats", "tls") or not parts.hostname:
        msg = f"NATS url must be nats://[user:password@]host[:port], got {redact(url)}"
        raise ConfigError(msg)
    host = f"[{parts.hostname}]" if ":" in parts.hostname else parts.hostname
    server = f"{parts.scheme}://{host}:{port or 4222}"
    user = unquote(parts.username) if parts.username else None
    password = unquote(parts.password) if parts.password is not None else None
    if user is not None and password is None:  # nats://token@host
        return server, None, None, user
    return server, user, password, None
