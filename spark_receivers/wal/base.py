"""The write-ahead log interface, its record handle, and handle validation.

A write-ahead log (WAL) stores opaque byte records, each stamped with a time in
milliseconds, so that they survive the loss of the process that wrote them.
``write`` returns a :class:`RecordHandle` once the record is durable; the handle
can be sent to another process (as ``to_dict()``) and read back there with
``read``. ``read_all`` replays every record in time order; ``clean`` deletes
records older than a threshold.

Used by both sides of the wire: receivers log blocks, the driver logs block
events. Spark's ``WriteAheadLog`` / ``WriteAheadLogRecordHandle`` are the model.
"""

from __future__ import annotations

import os
import posixpath
from abc import ABC, abstractmethod
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from spark_receivers.errors import WriteAheadLogError

__all__ = ["RecordHandle", "WriteAheadLog", "confine_handle"]


@dataclass(frozen=True, slots=True)
class RecordHandle:
    """Where one record lives: a file, the offset of its frame, its payload length.

    ``path`` is a path on the log's filesystem (not a URI), ``offset`` is the byte
    offset of the record's frame header in that file and ``length`` is the length
    of the payload (not of the frame). Immutable and JSON-friendly.
    """

    path: str
    offset: int
    length: int

    def to_dict(self) -> dict[str, Any]:
        """Return a JSON-friendly dict: ``{"path": str, "offset": int, "length": int}``."""
        return {"path": self.path, "offset": self.offset, "length": self.length}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> RecordHandle:
        """Build a handle from :meth:`to_dict` output, validating every field.

        Raises :class:`WriteAheadLogError` naming the field when a key is missing,
        has the wrong type, or an integer is negative. Booleans are not integers here.
        """
        if not isinstance(data, Mapping):
            msg = f"a record handle must be a mapping, got {type(data).__name__}"
            raise WriteAheadLogError(msg)
        for key in ("path", "offset", "length"):
            if key not in data:
                msg = f"record handle field {key!r} is missing (got keys {sorted(data)!r})"
                raise WriteAheadLogError(msg)
        path = data["path"]
        if not isinstance(path, str) or not path or "\x00" in path:
            msg = f"record handle field 'path' must be a non-empty string, got {path!r}"
            raise WriteAheadLogError(msg)
        values: dict[str, int] = {}
        for key in ("offset", "length"):
            value = data[key]
            if isinstance(value, bool) or not isinstance(value, int):
                msg = (
                    f"record handle field {key!r} must be an int, "
                    f"got {type(value).__name__} {value!r}"
                )
                raise WriteAheadLogError(msg)
            if value < 0:
                msg = f"record handle field {key!r} must be >= 0, got {value}"
                raise WriteAheadLogError(msg)
            values[key] = value
        return cls(path=path, offset=values["offset"], length=values["length"])


def confine_handle(
    handle: RecordHandle, root_dir: str, *, resolve_symlinks: bool = False
) -> RecordHandle:
    """Return ``handle`` if its path lies strictly inside ``root_dir``; raise otherwise.

    Both paths are normalised (``posixpath.normpath``; a ``file://`` prefix is
    stripped) and the handle's path is rejected if it contains a ``..`` component
    at all, is relative while the root is absolute, or does not start with the
    root followed by a separator. Use it on handles that arrive over the network
    before reading them. With ``resolve_symlinks=True`` (local paths only) both
    are also passed through :func:`os.path.realpath`, so a symlink inside the
    root that points outside it is refused too.

    Raises :class:`WriteAheadLogError` naming both paths.
    """
    raw = handle.path
    root = _strip_file_scheme(root_dir)
    path = _strip_file_scheme(raw)
    if "\x00" in path or ".." in path.replace("\\", "/").split("/"):
        msg = f"record handle path {raw!r} contains '..' or NUL; refused (root {root_dir!r})"
        raise WriteAheadLogError(msg)
    if posixpath.isabs(root) != posixpath.isabs(path):
        msg = f"record handle path {raw!r} is not inside the log directory {root_dir!r}"
        raise WriteAheadLogError(msg)
    norm_root = posixpath.normpath(root)
    norm_path = posixpath.normpath(path)
    if resolve_symlinks:
        norm_root = os.path.realpath(norm_root)
        norm_path = os.path.realpath(norm_path)
    prefix = norm_root if norm_root.endswith("/") else norm_root + "/"
    if not norm_path.startswith(prefix) or norm_path == norm_root:
        msg = f"record handle path {raw!r} is not inside the log directory {root_dir!r}"
        raise WriteAheadLogError(msg)
    return handle


def _strip_file_scheme(path: str) -> str:
    return path[len("file://") :] if path.startswith("file://") else path


class WriteAheadLog(ABC):
    """A durable, append-only log of byte records stamped with times (ms).

    Implementations are thread-safe: ``write`` may be called from many threads.
    ``write`` blocks until the record is durable (as durable as the filesystem
    allows) and must never return a handle for a record that was not written.
    """

    @abstractmethod
    def write(self, data: bytes | bytearray | memoryview, time_ms: int) -> RecordHandle:
        """Durably append ``data`` stamped with ``time_ms``; return its handle.

        Blocks until written. ``data`` may be any contiguous byte buffer; it may be
        written from without a copy, so it must not change until ``write`` returns.
        Raises :class:`WriteAheadLogError` on failure.
        """

    @abstractmethod
    def read(self, handle: RecordHandle) -> bytes:
        """Read the record at ``handle``, verifying its checksum."""

    @abstractmethod
    def read_all(self) -> Iterator[bytes]:
        """Yield every record in the log, oldest segment first."""

    @abstractmethod
    def clean(self, threshold_time_ms: int, wait: bool) -> None:
        """Delete records older than ``threshold_time_ms``.

        When ``wait`` is false the deletion runs in the background. Deletion
        errors are logged, never raised.
        """

    @abstractmethod
    def close(self) -> None:
        """Close the log; idempotent. Writes after close raise."""

    def __enter__(self) -> WriteAheadLog:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
