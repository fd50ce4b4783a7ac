"""What a receiver does with a record it cannot take: count, report, then fail, skip or set aside.

A bad record is one that is not valid UTF-8, is longer than the receiver's
``max_record_bytes``, or does not fit its schema. Every bad record is counted;
the first ``report_first`` of them, and then one in ``report_every``, are
reported to the driver (listeners and log) with a sample. Then the policy:

* ``skip``: drop it; the records around it are unaffected.
* ``fail``: stop the receiver with the error (its task fails visibly).
* ``dead_letter``: append it to ``<dead_letter_dir>/stream-<id>-<pid>.jsonl``
  (one JSON object a line: ``time_ms``, ``stream``, ``reason``, ``key`` — where the
  record came from, such as a Redis entry id, when the receiver knows it — and the
  record as ``text``, or as ``base64`` when it is not UTF-8), flushed before the
  receiver goes on (a Redis receiver acks the entry only after that).
"""

from __future__ import annotations

import base64
import enum
import json
import os
import threading
import time
from typing import IO

from spark_receivers.errors import ConfigError


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
        """Append one bad record (``key``: where it came from, if known)."""
        entry: dict[str, object] = {
            "time_ms": int(time.time() * 1000),
            "stream": self._stream_id,
            "reason": reason,
        }
        if key is not None:
            entry["key"] = key
        if isinstance(record, bytes):
            try:
                entry["text"] = record.decode("utf-8")
            except UnicodeDecodeError:
                entry["base64"] = base64.b64encode(record).decode("ascii")
        else:
            entry["text"] = record
        line = json.dumps(entry) + "\n"
        with self._lock:
            if self._file is None:
                os.makedirs(os.path.dirname(self.path), exist_ok=True)
                self._file = open(self.path, "a", encoding="utf-8")  # noqa: SIM115 - kept open
            self._file.write(line)
            self._file.flush()

    def close(self) -> None:
        """Close the file."""
        with self._lock:
            if self._file is not None:
                self._file.close()
                self._file = None
