"""What a receiver does with a record it cannot take: count, report, then fail, skip or set aside.

A bad record is one that is not valid UTF-8, is longer than the receiver's
``max_record_bytes``, or does not fit its schema. Every bad record is counted;
the first ``report_first`` of them, and then one in ``report_every``, are
reported to the driver (listeners and log) with a sample. Then the policy:

* ``skip``: drop it; the records around it are unaffected.
* ``fail``: stop the receiver for good with a :class:`~spark_receivers.errors.BadRecordError`;
  the driver does not restart it (it would meet the record again) and the context
  fails at once, naming the stream and why.
* ``dead_letter``: append it to ``<dead_letter_dir>/stream-<id>-<pid>.jsonl``
  (one JSON object a line: ``time_ms``, ``stream``, ``reason``, ``key`` — where the
  record came from, such as a Redis entry id, when the receiver knows it — and the
  record as ``text``, or as ``base64`` when it is not UTF-8), flushed before the
  receiver goes on (a Redis receiver acks the entry only after that). A record of
  more than :data:`INLINE_DEAD_LETTER_BYTES` goes byte for byte to a file of its own
  beside it, ``stream-<id>-<pid>-<hex>.bin``, which the line names (``file``, ``bytes``).

**How long a record may be.** Every record ends up as one row of a Spark batch,
held whole (and copied several times: Arrow, Spark's rows, the batch cache, the
sink's buffers) in an executor's JVM; one large enough kills it, and with it every
batch. So each built-in receiver refuses a record longer than its
``max_record_bytes`` (by default ``spark.receivers.receiver.maxRecordBytes``,
:data:`DEFAULT_MAX_RECORD_BYTES`; at most
:data:`spark_receivers.config_checks.MAX_RECORD_BYTES_LIMIT`) as a bad
record, before it is stored, and no block carries one whatever receiver stored it:
:func:`oversize_rows` finds them in a block, which is stored without them.
"""

from __future__ import annotations

import base64
import contextlib
import enum
import json
import os
import threading
import time
import uuid
from typing import IO, Any, Protocol

import pyarrow as pa
import pyarrow.compute as pc

from spark_receivers.errors import BadRecordError, ConfigError

DEFAULT_MAX_RECORD_BYTES = 1024 * 1024
"""The longest record (bytes) a built-in receiver takes unless told otherwise (1 MiB)."""
INLINE_DEAD_LETTER_BYTES = 1024 * 1024
"""A dead letter longer than this goes to a file of its own, not into its JSON line."""


def too_long(size: int, limit: int) -> str:
    """The reason of a record of ``size`` bytes above ``limit``."""
    return f"{size:,} bytes, longer than max_record_bytes={limit:,}"


def oversize_rows(table: pa.Table, limit: int) -> pa.ChunkedArray | None:
    """A mask of the rows of ``table`` longer than ``limit`` bytes, or None when there is none.

    A row's length is that of its string and binary values together (what can be
    arbitrarily large; a value of another type is a few bytes). Usually no work at
    all (the columns hold fewer bytes than ``limit`` together), else one vectorized length
    per such column, whose longest values usually show that no row can be too long, and
    only when they do not a per-row total: nothing costs per record in Python.
    """
    columns = [
        column
        for column, field in zip(table.columns, table.schema, strict=True)
        if _variable_length(field.type)
    ]
    if sum(column.nbytes for column in columns) <= limit:
        return None
    # Then the longest value of each column, which bounds every row: kernel calls only, no
    # Python loop over the block's chunks (the pushing thread that runs this shares the
    # GIL with the thread storing records).
    lengths = [pc.binary_length(column) for column in columns]
    if sum(pc.max(n).as_py() or 0 for n in lengths) <= limit:
        return None
    total = pc.fill_null(lengths[0], 0)
    for n in lengths[1:]:
        total = pc.add(total, pc.fill_null(n, 0))
    mask = pc.greater(total, limit)
    return mask if pc.any(mask).as_py() else None


def split_oversize(table: pa.Table, limit: int) -> tuple[pa.Table, list[tuple[Any, int]]]:
    """``table`` without its rows longer than ``limit`` bytes, and those rows with their lengths.

    A row is its value for a one-column table, else a dict of its fields. Usually
    ``(table, [])`` at the cost of :func:`oversize_rows`.
    """
    mask = oversize_rows(table, limit)
    if mask is None:
        return table, []
    bad = table.filter(mask)
    lengths = [0] * bad.num_rows
    for column, field in zip(bad.columns, bad.schema, strict=True):
        if _variable_length(field.type):
            for i, n in enumerate(pc.fill_null(pc.binary_length(column), 0).to_pylist()):
                lengths[i] += n
    if bad.num_columns == 1:
        rows: list[Any] = bad.column(0).to_pylist()
    else:
        rows = bad.to_pylist()
    return table.filter(pc.invert(mask)), list(zip(rows, lengths, strict=True))


def _variable_length(t: pa.DataType) -> bool:
    return (
        pa.types.is_string(t)
        or pa.types.is_large_string(t)
        or pa.types.is_binary(t)
        or pa.types.is_large_binary(t)
    )


class BadRecordPolicy(enum.Enum):
    """How a receiver handles a bad record."""

    SKIP = "skip"
    FAIL = "fail"
    DEAD_LETTER = "dead_letter"

    @staticmethod
    def parse(value: str | BadRecordPolicy, dead_letter_dir: str | None) -> BadRecordPolicy:
        """Validate a policy name (and that ``dead_letter`` has a directory)."""
        try:
            policy = value if isinstance(value, BadRecordPolicy) else BadRecordPolicy(value)
        except ValueError:
            allowed = ", ".join(p.value for p in BadRecordPolicy)
            msg = f"bad_record_policy must be one of {allowed}, got {value!r}"
            raise ConfigError(msg) from None
        if policy is BadRecordPolicy.DEAD_LETTER and not dead_letter_dir:
            msg = (
                "bad_record_policy='dead_letter' needs dead_letter_dir=<a directory on the "
                "executors>"
            )
            raise ConfigError(msg)
        return policy


class DeadLetterWriter:
    """Appends bad records to a JSON-lines file; thread-safe, flushed per record."""

    def __init__(self, directory: str, stream_id: int) -> None:
        self.path = os.path.join(directory, f"stream-{stream_id}-{os.getpid()}.jsonl")
        self._stream_id = stream_id
        self._lock = threading.Lock()
        self._file: IO[str] | None = None

    def write(self, record: bytes | str, reason: str, key: str | None = None) -> None:
        """Append one bad record (``key``: where it came from, if known).

        A record longer than :data:`INLINE_DEAD_LETTER_BYTES` is written, byte for
        byte, to a file of its own that the line names (``file``, ``bytes``).
        """
        entry: dict[str, object] = {
            "time_ms": int(time.time() * 1000),
            "stream": self._stream_id,
            "reason": reason,
        }
        if key is not None:
            entry["key"] = key
        with self._lock:
            if self._file is None:
                os.makedirs(os.path.dirname(self.path), exist_ok=True)
                self._file = open(self.path, "a", encoding="utf-8")  # noqa: SIM115 - kept open
            if len(record) > INLINE_DEAD_LETTER_BYTES:
                side = f"{self.path.removesuffix('.jsonl')}-{uuid.uuid4().hex[:12]}.bin"
                data = record.encode("utf-8") if isinstance(record, str) else record
                with open(side, "wb") as f:
                    f.write(data)
                    f.flush()
                    os.fsync(f.fileno())
                entry["file"] = os.path.basename(side)
                entry["bytes"] = len(data)
            elif isinstance(record, bytes):
                try:
                    entry["text"] = record.decode("utf-8")
                except UnicodeDecodeError:
                    entry["base64"] = base64.b64encode(record).decode("ascii")
            else:
                entry["text"] = record
            self._file.write(json.dumps(entry) + "\n")
            self._file.flush()

    def close(self) -> None:
        """Close the file."""
        with self._lock:
            if self._file is not None:
                self._file.close()
                self._file = None


class _PolicyHolder(Protocol):
    """A receiver, as :class:`OversizeRecords` sees it."""

    bad_record_policy: BadRecordPolicy

    def handle_bad_record(self, record: bytes | str, reason: str) -> None: ...


class OversizeRecords:
    """Rows a block writer took out as too long, each handed to the receiver's policy.

    ``oversize(rows, pushing_thread)`` with ``rows`` as :func:`split_oversize` returns
    them. A receiver's ``handle_bad_record`` stops it under ``fail``, and stopping drains
    the block generator, which waits for its pushing thread: on that thread a ``fail``
    runs on a thread of its own (and the rest of the rows are not looked at). Elsewhere
    ``handle_bad_record`` raises :class:`BadRecordError` to the storing caller.
    """

    def __init__(self, receiver: _PolicyHolder, limit: int, name: str) -> None:
        self.limit = limit
        self._receiver = receiver
        self._name = name

    def __call__(self, rows: list[tuple[Any, int]], pushing_thread: bool) -> None:
        """Each of ``rows`` (record, length) to the receiver's policy; see the class doc."""
        receiver = self._receiver
        for record, size in rows:
            value = record if isinstance(record, str | bytes) else json.dumps(record, default=str)
            reason = f"a record of {too_long(size, self.limit)}"
            if pushing_thread and receiver.bad_record_policy is BadRecordPolicy.FAIL:
                threading.Thread(
                    target=self._fail_on, args=(value, reason), name=self._name, daemon=True
                ).start()
                return
            receiver.handle_bad_record(value, reason)  # raises under "fail"

    def _fail_on(self, value: str | bytes, reason: str) -> None:
        with contextlib.suppress(BadRecordError):
            self._receiver.handle_bad_record(value, reason)  # stops the receiver for good
