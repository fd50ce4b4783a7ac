"""``RedisStreamReceiver``: reads a Redis stream through a consumer group, acking after storing.

The order for every batch of entries is: ``XREADGROUP`` → ``store(records,
reliable=True, position=...)`` → ``XACK``. An entry is acknowledged only once it is
stored (and in the write-ahead log when enabled), so a receiver that dies between
the two leaves it pending in the group. The block's position is the range of entry
ids of the batch, ``<first id>..<last id>`` (prefixed with the stream, group and
consumer it was read as, so that a position of another source is never applied):
the driver keeps the newest in its WAL
(:meth:`Receiver.accepted_position`). On every (re)start the receiver first takes
back what is pending:

1. ``XREADGROUP ... 0``: its own pending entries (read before a crash, maybe
   stored, never acked). Those inside the range the driver accepted last were
   stored: they are acked without being stored again; the others are stored and
   acked;
2. ``XAUTOCLAIM`` the group's entries idle for at least ``claim_min_idle_ms``
   (those of consumers that died) and stores and acks them;
3. then reads new entries with ``XREADGROUP ... >``.

So nothing read is lost, and nothing is stored twice: a batch is stored and acked
before the next is read, so at most one batch — the last one stored — can be stored
and still pending, and its own pending entries inside that range are exactly its
entries (the pending list is read in id order; a claimed batch is claimed while the
own pending list is empty). Entries another receiver stored before dying without
acking them are stored again when claimed (its positions are its own): at least once.

With ``field`` set (the default), a batch of good entries becomes one Arrow array at
once: the values are gathered, their lengths checked and UTF-8 validated by Arrow's
kernels, the entries' times (when asked) computed as a column, the ids' range taken from
the first and last id, which Redis gives in order (no ``str`` per entry of ours;
redis-py's reply is what is left per entry). A batch holding a bad entry goes entry by
entry.

Entries are read as bytes and decoded here, so an entry that cannot become a
record (longer than ``max_record_bytes``, a value that is not UTF-8, a missing
field, fields that do not fit the schema) is a bad record, handled by
``bad_record_policy``: ``skip`` acks it,
``dead_letter`` writes its id and raw bytes to the dead-letter file and then
acks it, ``fail`` stores and acks the entries before it and stops the receiver
with the error (the entry stays pending). It never stalls the group.
"""

from __future__ import annotations

import base64
import json
import logging
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.compute as pc

from spark_receivers.errors import ConfigError, ReceiverError
from spark_receivers.receiver.bad_records import BadRecordPolicy, too_long
from spark_receivers.receiver.schema import check_record
from spark_receivers.receiver.threaded_receiver import ThreadedReceiver
from spark_receivers.util.extras import REDIS
from spark_receivers.util.options import require_positive_ints

if TYPE_CHECKING:
    import redis

log = logging.getLogger(__name__)

Entry = tuple[str, dict[bytes, bytes] | None]
"""An entry id and its fields as read (None: deleted while pending)."""


class _BadEntry(Exception):
    def __init__(self, reason: str, raw: bytes | str) -> None:
        super().__init__(reason)
        self.reason = reason
        self.raw = raw


class RedisStreamReceiver(ThreadedReceiver):
    """Stores the entries of Redis stream ``stream`` read as ``consumer`` of ``group``.

    The group is created when missing (``MKSTREAM``), positioned at
    ``group_start_id`` (``"0"``: the whole stream; ``"$"``: only new entries).
    ``consumer`` defaults to ``spark-receivers-<job>-<stream id>`` (the job: the
    id its checkpoint keeps, else the application id; see
    :meth:`ThreadedReceiver.durable_name`): the same name wherever the receiver
    restarts, so it finds its own pending entries, and not another job's name,
    whose pending entries it would read again.

    Records: the field ``field`` of each entry (default ``"value"``); with
    ``field=None`` the whole entry as JSON ``{"id": ..., "fields": {...}}``
    under the default schema, or the entry's fields as a dict under a declared
    multi-column schema (the string values cast to the schema's types:
    ``"3"`` to an ``int64``). An entry that cannot be a record (its field names and
    values longer than ``max_record_bytes`` together, by default
    ``spark.receivers.receiver.maxRecordBytes``, 1 MiB; not UTF-8; without ``field``;
    not fitting the schema) goes to ``bad_record_policy`` (see the module doc).
    With ``include_timestamp=True`` a ``timestamp`` column holds the time of the
    entry's id (when Redis added it).

    A failure (the server is unreachable, a store fails) restarts the receiver
    with the backoff of :class:`ThreadedReceiver` (``max_backoff_ms`` caps it);
    the backoff resets once a read succeeds.

    Thread contract: one thread (``redis-stream-<stream>``) reads, stores and
    acks; ``on_stop`` waits for it, at most about ``block_ms`` plus one store.
    """

    thread_name_prefix = "redis-stream"
    requires = (REDIS,)  # the [redis] extra
    supports_timestamp = True

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
        require_positive_ints(batch=batch, block_ms=block_ms)
        # on_stop waits out one blocking XREADGROUP plus one store
        kwargs.setdefault("stop_timeout_s", block_ms / 1000.0 + 30)
        super().__init__(max_backoff_ms=max_backoff_ms, **kwargs)
        if claim_min_idle_ms < 0:
            msg = f"claim_min_idle_ms must be >= 0, got {claim_min_idle_ms!r}"
            raise ConfigError(msg)
        if not stream or not group:
            msg = f"stream and group must be non-empty, got stream={stream!r} group={group!r}"
            raise ConfigError(msg)
        if field is not None and not self.default_records:
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
        self.entries_already_stored = 0
        """Own pending entries acked at a restart without storing: the driver had them."""
        self.bad_records = 0
        self._tag = ""
        """:meth:`_source_tag`, taken when :meth:`receive` starts."""

    @property
    def consumer_name(self) -> str:
        """The consumer name used in the group."""
        return self.consumer or self.durable_name()

    # --- the reading thread ---------------------------------------------------

    def receive(self) -> None:
        """Connect, take back what is pending, then read, store and ack until stopped."""
        import redis

        client = redis.Redis.from_url(
            self.url,
            decode_responses=False,  # bytes: a value that is not UTF-8 is a bad record, not a crash
            socket_timeout=self.block_ms / 1000.0 + 10.0,
            socket_connect_timeout=10.0,
        )
        try:
            self._tag = self._source_tag()  # once per life, not per batch
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
        """Take back own pending entries (see the module doc), then dead consumers'."""
        accepted = _id_range(self.accepted_position(), self._tag)
        last = "0"
        while not self.stopping:
            reply = client.xreadgroup(
                self.group, self.consumer_name, {self.stream: last}, count=self.batch
            )
            entries = _entries(reply)
            if not entries:
                break
            stored = [eid for eid, _ in entries if _within(eid, accepted)]
            if stored:  # stored before the crash, never acked: ack, do not store again
                log.info(
                    "receiver %d: acking %d own pending entries the driver already has",
                    self.stream_id,
                    len(stored),
                )
                self._ack(client, stored)
                self.entries_already_stored += len(stored)
            rest = [e for e in entries if not _within(e[0], accepted)]
            if rest:
                log.info(
                    "receiver %d: re-reading %d own pending entries", self.stream_id, len(rest)
                )
                self._store_and_ack(client, rest)
            last = entries[-1][0]
        cursor = "0-0"
        while not self.stopping:
            claim: Any = client.xautoclaim(
                self.stream,
                self.group,
                self.consumer_name,
                self.claim_min_idle_ms,
                start_id=cursor,
                count=self.batch,
            )
            cursor, claimed = _text(claim[0]), claim[1]
            entries = [(_text(eid), fields) for eid, fields in claimed]
            if entries:
                log.info(
                    "receiver %d: claimed %d idle pending entries", self.stream_id, len(entries)
                )
                self._store_and_ack(client, entries)
            if cursor == "0-0":
                break

    def _store_and_ack(self, client: redis.Redis, entries: list[Entry]) -> None:
        """Store the entries' records, then XACK them; bad entries go to the policy first.

        With ``field`` set, a batch of good single-field entries (the usual case) becomes
        one Arrow array at once (:func:`_field_column`); else entry by entry.
        """
        if self.field is not None:
            column = _field_column(entries, self.field.encode(), self.record_limit)
            if column is not None:
                self._store_then_ack(client, column, None, [eid for eid, _ in entries])
                return
        records: list[Any] = []
        times: list[int] = []
        ids: list[str] = []
        for entry_id, fields in entries:
            try:
                record = self._record(entry_id, fields)
            except _BadEntry as bad:
                if self.bad_record_policy is BadRecordPolicy.FAIL:
                    self._store_then_ack(client, records, times, ids)  # keep those before it
                    records, times, ids = [], [], []
                # raises under "fail": the entry stays pending; else it is acked below
                self.handle_bad_record(bad.raw, bad.reason, key=entry_id)
            else:
                if record is not None:
                    records.append(record)
                    times.append(_entry_time_us(entry_id))
            ids.append(entry_id)
        self._store_then_ack(client, records, times, ids)

    def _store_then_ack(
        self,
        client: redis.Redis,
        records: list[Any] | pa.Array,
        times: list[int] | None,
        ids: list[str],
    ) -> None:
        """Store ``records`` (times None: from ``ids``, which are theirs), then ack ``ids``.

        The position is the range ``<first id>..<last id>`` of ``ids`` as they came: Redis
        gives a batch in id order (``XREADGROUP`` of new or of pending entries, and
        ``XAUTOCLAIM``, which walks the pending list from its cursor up), and the entry by
        entry path keeps that order. Nothing is parsed or sorted per batch. Were a batch
        ever out of order, its range would be narrower than its ids (or empty): after a
        restart some entries it stored would be stored again, never one acked unstored.
        """
        if len(records):
            if times is None and self.include_timestamp:
                times_us: Any = _id_times_us(ids)
            else:
                times_us = times
            position = f"{self._tag}{ids[0]}..{ids[-1]}"
            self.store_records(records, reliable=True, times_us=times_us, position=position)
            self.records_stored += len(records)
        if ids:
            self._ack(client, ids)

    def _source_tag(self) -> str:
        """What a position starts with: where its entries were read (JSON, then a space)."""
        where = [self.url.rpartition("@")[2], self.stream, self.group, self.consumer_name]
        return json.dumps(where, separators=(",", ":")) + " "

    def _ack(self, client: redis.Redis, ids: list[str]) -> None:
        """``XACK`` entries (stored, or not to be stored)."""
        client.xack(self.stream, self.group, *ids)
        self.entries_acked += len(ids)

    def _record(self, entry_id: str, fields: dict[bytes, bytes] | None) -> Any:
        """The record of an entry; None when it was deleted; :class:`_BadEntry` when bad."""
        if fields is None:  # deleted (XDEL/XTRIM) while pending: nothing to store
            return None
        where = f"entry {entry_id} of stream {self.stream!r}"
        size = sum(len(k) + len(v) for k, v in fields.items())
        limit = self.record_limit
        if size > limit:  # before decoding it: a 100 MB entry is refused, not copied about
            reason = f"{where} is {too_long(size, limit)} (its field names and values)"
            if self.field is not None and self.field.encode() in fields:
                raise _BadEntry(reason, fields[self.field.encode()])
            raise _BadEntry(reason, _raw_entry(fields))
        if self.field is not None:
            value = fields.get(self.field.encode())
            if value is None:
                names = sorted(_text(k, "replace") for k in fields)
                reason = f"{where} has no field {self.field!r} (fields: {names})"
                raise _BadEntry(reason, _raw_entry(fields))
            try:
                return value.decode("utf-8")
            except UnicodeDecodeError as e:
                reason = f"{where}: field {self.field!r} is not UTF-8 (byte {e.start})"
                raise _BadEntry(reason, value) from None
        try:
            decoded = {k.decode("utf-8"): v.decode("utf-8") for k, v in fields.items()}
        except UnicodeDecodeError:
            msg = f"{where}: a field name or value is not UTF-8"
            raise _BadEntry(msg, _raw_entry(fields)) from None
        if self.default_records:
            return json.dumps({"id": entry_id, "fields": decoded}, sort_keys=True)
        try:
            record = _typed(decoded, self.record_schema)
            check_record(record, self.record_schema)
        except ReceiverError as e:
            msg = f"{where}: {e}"
            raise _BadEntry(msg, _raw_entry(fields)) from None
        return record


def _entries(reply: Any) -> list[Entry]:
    """Flatten an XREADGROUP reply (``[[stream, [(id, fields), ...]]]``) to ``[(id, fields)]``."""
    if not reply:
        return []
    return [(_text(eid), fields) for _, messages in reply for eid, fields in messages]


def _field_column(entries: list[Entry], key: bytes, limit: int) -> pa.Array | None:
    """The ``key`` values of ``entries`` as one Arrow string array, checked by Arrow's kernels.

    None when an entry is not a plain good one — deleted, with another field than ``key``
    or none, longer than ``limit`` (name and value), or not UTF-8 — so the caller goes
    entry by entry, where the bad-record policy sees which entry and why.
    """
    values = [f.get(key) if f is not None and len(f) == 1 else None for _, f in entries]
    column = pa.array(values, pa.binary())
    if column.null_count or not len(column):
        return None
    if pc.max(pc.binary_length(column)).as_py() + len(key) > limit:
        return None
    try:
        return column.cast(pa.string())  # validates UTF-8
    except pa.ArrowInvalid:
        return None


def _id_times_us(ids: list[str]) -> pa.Array:
    """The times Redis gave entries ``<ms>-<seq>`` (or ``<ms>``), in µs, as one Arrow column."""
    ms = pc.list_element(pc.split_pattern(pa.array(ids, pa.string()), "-", max_splits=1), 0)
    return pc.multiply(ms.cast(pa.uint64()), 1000)


def _text(value: bytes | str, errors: str = "strict") -> str:
    return value.decode("utf-8", errors) if isinstance(value, bytes) else value


def _typed(fields: dict[str, str], schema: pa.Schema) -> dict[str, Any]:
    """Redis values are strings: cast those of non-string fields (``"3"`` → 3) with Arrow."""
    out: dict[str, Any] = dict(fields)
    for field in schema:
        text = fields.get(field.name)
        if text is None or pa.types.is_string(field.type) or pa.types.is_large_string(field.type):
            continue
        try:
            out[field.name] = pa.scalar(text).cast(field.type).as_py()
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as e:
            msg = f"field {field.name!r} ({field.type}) cannot hold value {text!r:.100}: {e}"
            raise ReceiverError(msg) from None
    return out


def _id_key(entry_id: str) -> tuple[int, int]:
    """An entry id ``<ms>-<seq>`` as numbers, in the order Redis gives ids."""
    ms, _, seq = entry_id.partition("-")
    return int(ms), int(seq or 0)


def _id_text(key: tuple[int, int]) -> str:
    return f"{key[0]}-{key[1]}"


def _id_range(position: str | None, tag: str) -> tuple[tuple[int, int], tuple[int, int]] | None:
    """The entry ids ``<first>..<last>`` of a position stored as ``tag`` (None: none)."""
    if position is None:
        return None
    if not position.startswith(tag):
        log.warning("ignoring accepted position %r: not read as %s", position, tag.strip())
        return None
    first, sep, last = position[len(tag) :].partition("..")
    try:
        if sep:
            return _id_key(first), _id_key(last)
    except ValueError:
        pass
    log.warning("ignoring accepted position %r: not a range of entry ids", position)
    return None


def _within(entry_id: str, accepted: tuple[tuple[int, int], tuple[int, int]] | None) -> bool:
    if accepted is None:
        return False
    return accepted[0] <= _id_key(entry_id) <= accepted[1]


def _entry_time_us(entry_id: str) -> int:
    """The time Redis gave an entry, from its id ``<ms>-<seq>``, in microseconds."""
    return int(entry_id.partition("-")[0]) * 1000


def _raw_entry(fields: dict[bytes, bytes]) -> str:
    """Every field of an entry, names and values base64, as JSON: nothing is lost."""
    pairs = [
        [base64.b64encode(k).decode(), base64.b64encode(v).decode()] for k, v in fields.items()
    ]
    return json.dumps({"fields_base64": pairs})


def _redact(url: str) -> str:
    """The URL without its password."""
    if "@" not in url:
        return url
    scheme, _, rest = url.partition("://")
    return f"{scheme}://***@{rest.rpartition('@')[2]}"
