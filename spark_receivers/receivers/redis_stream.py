"""``RedisStreamReceiver``: reads a Redis stream through a consumer group, acking after storing.

The order for every batch of entries is: ``XREADGROUP`` → ``store(records,
reliable=True)`` → ``XACK``. An entry is acknowledged only once it is stored
(and in the write-ahead log when enabled), so a receiver that dies between
the two leaves it pending in the group. On every (re)start the receiver first
takes back what is pending:

1. ``XAUTOCLAIM`` the group's entries idle for at least ``claim_min_idle_ms``
   (those of consumers that died) and stores and acks them;
2. ``XREADGROUP ... 0`` its own pending entries (read before a crash, maybe
   stored, never acked) and stores and acks them;
3. then reads new entries with ``XREADGROUP ... >``.

So nothing read is lost; an entry stored but not yet acked when the receiver
died is stored again (at least once).
"""

from __future__ import annotations

import json
import logging
from typing import TYPE_CHECKING, Any

from spark_receivers.errors import ConfigError, ReceiverError
from spark_receivers.receiver.schema import is_default
from spark_receivers.receiver.threaded_receiver import ThreadedReceiver
from spark_receivers.util.extras import REDIS

if TYPE_CHECKING:
    import redis

log = logging.getLogger(__name__)

Entry = tuple[str, dict[str, str] | None]


class RedisStreamReceiver(ThreadedReceiver):
    """Stores the entries of Redis stream ``stream`` read as ``consumer`` of ``group``.

    The group is created when missing (``MKSTREAM``), positioned at
    ``group_start_id`` (``"0"``: the whole stream; ``"$"``: only new entries).
    ``consumer`` defaults to ``spark-receivers-<stream id>``, the same name
    wherever the receiver restarts, so it finds its own pending entries.

    Records: the field ``field`` of each entry (default ``"value"``); with
    ``field=None`` the whole entry as JSON ``{"id": ..., "fields": {...}}``
    under the default schema, or the entry's fields as a dict under a declared
    multi-column schema. An entry without ``field`` is skipped, reported and
    acked (it would never fit).

    A failure (the server is unreachable, a store fails) restarts the receiver
    with the backoff of :class:`ThreadedReceiver` (``max_backoff_ms`` caps it);
    the backoff resets once a read succeeds.

    Thread contract: one thread (``redis-stream-<stream>``) reads, stores and
    acks; ``on_stop`` waits for it, at most about ``block_ms`` plus one store.
    """

    thread_name_prefix = "redis-stream"
    requires = (REDIS,)  # the [redis] extra

    def __init__(
        self,
        stream: str,
        group: str,
        *,
        url: str = "redis://127.0.0.1:6379/0",
        consumer: str | None = None,
        field: str | None = "value",
        batch: int = 1000,
        block_ms: int = 1000,
        claim_min_idle_ms: int = 60_000,
        group_start_id: str = "0",
        max_backoff_ms: int = 30_000,
        **kwargs: Any,
    ) -> None:
        for key, value in (("batch", batch), ("block_ms", block_ms)):
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                msg = f"{key} must be an integer > 0, got {value!r}"
                raise ConfigError(msg)
        # on_stop waits out one blocking XREADGROUP plus one store
        kwargs.setdefault("stop_timeout_s", block_ms / 1000.0 + 30)
        super().__init__(max_backoff_ms=max_backoff_ms, **kwargs)
        if claim_min_idle_ms < 0:
            msg = f"claim_min_idle_ms must be >= 0, got {claim_min_idle_ms!r}"
            raise ConfigError(msg)
        if not stream or not group:
            msg = f"stream and group must be non-empty, got stream={stream!r} group={group!r}"
            raise ConfigError(msg)
        if field is not None and not is_default(self.schema):
            msg = (
                f"field={field!r} stores strings: it needs the default schema; "
                f"use field=None to store entries as dicts of schema {self.schema.names}"
            )
            raise ConfigError(msg)
        self.url = url
        self.stream = stream
        self.group = group
        self.consumer = consumer
        self.field = field
        self.batch = batch
        self.block_ms = block_ms
        self.claim_min_idle_ms = claim_min_idle_ms
        self.group_start_id = group_start_id
        self.records_stored = 0
        self.entries_acked = 0
        self.bad_records = 0

    @property
    def consumer_name(self) -> str:
        """The consumer name used in the group."""
        return self.consumer or f"spark-receivers-{self.stream_id}"

    # --- the reading thread ---------------------------------------------------

    def receive(self) -> None:
        """Connect, take back what is pending, then read, store and ack until stopped."""
        import redis

        client = redis.Redis.from_url(
            self.url,
            decode_responses=True,
            socket_timeout=self.block_ms / 1000.0 + 10.0,
            socket_connect_timeout=10.0,
        )
        try:
            self._ensure_group(client)
            self._recover(client)
            while not self.stopping:
                reply = client.xreadgroup(
                    self.group,
                    self.consumer_name,
                    {self.stream: ">"},
                    count=self.batch,
                    block=self.block_ms,
                )
                self.mark_healthy()
                entries = _entries(reply)
                if entries:
                    self._store_and_ack(client, entries)
        finally:
            client.close()

    def describe(self) -> str:
        """``reading Redis stream <stream> at <url without its password>``."""
        return f"reading Redis stream {self.stream!r} at {_redact(self.url)}"

    # --- the protocol -----------------------------------------------------------

    def _ensure_group(self, client: redis.Redis) -> None:
        import redis

        try:
            client.xgroup_create(self.stream, self.group, id=self.group_start_id, mkstream=True)
            log.info("receiver %d: created group %s on %s", self.stream_id, self.group, self.stream)
        except redis.ResponseError as e:
            if "BUSYGROUP" not in str(e):
                raise

    def _recover(self, client: redis.Redis) -> None:
        """Store and ack the entries dead consumers left, then this consumer's own."""
        cursor = "0-0"
        while not self.stopping:
            reply: Any = client.xautoclaim(
                self.stream,
                self.group,
                self.consumer_name,
                self.claim_min_idle_ms,
                start_id=cursor,
                count=self.batch,
            )
            cursor, claimed = reply[0], reply[1]
            entries = [(eid, fields) for eid, fields in claimed]
            if entries:
                log.info(
                    "receiver %d: claimed %d idle pending entries", self.stream_id, len(entries)
                )
                self._store_and_ack(client, entries)
            if cursor == "0-0":
                break
        last = "0"
        while not self.stopping:
            reply = client.xreadgroup(
                self.group, self.consumer_name, {self.stream: last}, count=self.batch
            )
            entries = _entries(reply)
            if not entries:
                break
            log.info("receiver %d: re-reading %d own pending entries", self.stream_id, len(entries))
            self._store_and_ack(client, entries)
            last = entries[-1][0]

    def _store_and_ack(self, client: redis.Redis, entries: list[Entry]) -> None:
        records = []
        for entry_id, fields in entries:
            record = self._record(entry_id, fields)
            if record is not None:
                records.append(record)
        if records:
            self.store(records, reliable=True)
            self.records_stored += len(records)
        ids = [entry_id for entry_id, _ in entries]
        client.xack(self.stream, self.group, *ids)
        self.entries_acked += len(ids)

    def _record(self, entry_id: str, fields: dict[str, str] | None) -> Any:
        if fields is None:  # deleted (XDEL/XTRIM) while pending: nothing to store
            return None
        if self.field is None:
            if is_default(self.schema):
                return json.dumps({"id": entry_id, "fields": fields}, sort_keys=True)
            return fields
        value = fields.get(self.field)
        if value is None:
            self.bad_records += 1
            message = (
                f"entry {entry_id} of stream {self.stream!r} has no field {self.field!r} "
                f"(fields: {sorted(fields)}): skipped and acked"
            )
            log.warning("receiver %d: %s", self.stream_id, message)
            self.report_error(message, ReceiverError(message))
            return None
        return value


def _entries(reply: Any) -> list[Entry]:
    """Flatten an XREADGROUP reply (``[[stream, [(id, fields), ...]]]``) to ``[(id, fields)]``."""
    if not reply:
        return []
    return [(eid, fields) for _, messages in reply for eid, fields in messages]


def _redact(url: str) -> str:
    """The URL without its password."""
    if "@" not in url:
        return url
    scheme, _, rest = url.partition("://")
    return f"{scheme}://***@{rest.rpartition('@')[2]}"
