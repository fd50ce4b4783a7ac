"""Fault injection for write-ahead log tests: ENOSPC/EIO on write, close, fsync, open, delete.

:class:`FaultInjector` holds counters of faults to raise ("fail the next 2
writes with ENOSPC"). It plugs into a log in two ways:

* ``injector.filesystem()`` is a ``pyarrow.fs.PyFileSystem`` wrapping a real
  filesystem (default: the local one) whose output streams raise on ``write`` /
  ``close`` and whose ``delete_file`` and ``open_output_stream`` can raise; pass
  it as ``FileBasedWriteAheadLog(..., filesystem=...)``. (``flush`` faults cannot
  be injected this way: pyarrow does not forward ``flush()`` to Python streams;
  a ``write`` fault models the same failure.)
* ``injector.fsync`` can be passed as ``fsync_hook`` to a log on the local
  filesystem; it raises while a fsync fault is armed, else really syncs.

Faults fire on the next N calls of their kind, then the layer behaves normally
again ("the fault is cleared"). Thread-safe. Also usable by other packages'
tests (the receiver's WAL-backed block handler).
"""

from __future__ import annotations

import errno
import os
import threading
from typing import Any

import pyarrow as pa
import pyarrow.fs as pafs

__all__ = ["FaultInjectingHandler", "FaultInjector"]

_KINDS = ("write", "close", "fsync", "open", "delete")


class FaultInjector:
    """Counters of armed faults, by kind: write, close, fsync, open, delete."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._armed: dict[str, list[int]] = {kind: [] for kind in _KINDS}
        self.calls: dict[str, int] = dict.fromkeys(_KINDS, 0)
        self.raised: dict[str, int] = dict.fromkeys(_KINDS, 0)

    def fail_next(self, kind: str, times: int = 1, err: int = errno.EIO) -> None:
        """Make the next ``times`` calls of ``kind`` raise ``OSError(err)``."""
        if kind not in self._armed:
            msg = f"unknown fault kind {kind!r}; expected one of {_KINDS}"
            raise ValueError(msg)
        with self._lock:
            self._armed[kind].extend([err] * times)

    def clear(self) -> None:
        """Disarm every fault."""
        with self._lock:
            for pending in self._armed.values():
                pending.clear()

    def check(self, kind: str, what: str = "") -> None:
        """Count a call of ``kind``; raise its armed fault if there is one."""
        with self._lock:
            self.calls[kind] += 1
            pending = self._armed[kind]
            if not pending:
                return
            err = pending.pop(0)
            self.raised[kind] += 1
        raise OSError(err, f"injected {kind} fault: {os.strerror(err)}", what or None)

    def fsync(self, fd: int) -> None:
        """An ``fsync_hook``: raise an armed fsync fault, else ``os.fsync(fd)``."""
        self.check("fsync")
        os.fsync(fd)

    def filesystem(self, base: pafs.FileSystem | None = None) -> pafs.PyFileSystem:
        """Return a filesystem that forwards to ``base`` and raises armed faults."""
        return pafs.PyFileSystem(FaultInjectingHandler(base or pafs.LocalFileSystem(), self))


class _FaultyOutput:
    """A Python file object over a pyarrow output stream that raises armed faults."""

    def __init__(self, inner: pa.NativeFile, injector: FaultInjector, path: str) -> None:
        self._inner = inner
        self._injector = injector
        self._path = path
        self.closed = False

    def write(self, data: Any) -> int:
        self._injector.check("write", self._path)
        return int(self._inner.write(data))

    def flush(self) -> None:
        self._inner.flush()

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        try:
            self._injector.check("close", self._path)
        finally:
            self._inner.close()

    def tell(self) -> int:
        return int(self._inner.tell())

    def writable(self) -> bool:
        return True

    def readable(self) -> bool:
        return False

    def seekable(self) -> bool:
        return False


class FaultInjectingHandler(pafs.FileSystemHandler):
    """A ``pyarrow.fs.FileSystemHandler`` forwarding to a real filesystem, with faults."""

    def __init__(self, base: pafs.FileSystem, injector: FaultInjector) -> None:
        self._base = base
        self._injector = injector

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, FaultInjectingHandler)
            and other._base.equals(self._base)
            and other._injector is self._injector
        )

    def __ne__(self, other: object) -> bool:
        return not self == other

    __hash__ = None  # type: ignore[assignment]

    def get_type_name(self) -> str:
        """Return the filesystem type name."""
        return "fault-injecting"

    def normalize_path(self, path: str) -> str:
        """Forward."""
        return str(self._base.normalize_path(path))

    def get_file_info(self, paths: list[str]) -> list[pafs.FileInfo]:
        """Forward."""
        return list(self._base.get_file_info(paths))

    def get_file_info_selector(self, selector: pafs.FileSelector) -> list[pafs.FileInfo]:
        """Forward."""
        return list(self._base.get_file_info(selector))

    def create_dir(self, path: str, recursive: bool) -> None:
        """Forward."""
        self._base.create_dir(path, recursive=recursive)

    def delete_dir(self, path: str) -> None:
        """Forward."""
        self._base.delete_dir(path)

    def delete_dir_contents(self, path: str, missing_dir_ok: bool = False) -> None:
        """Forward."""
        self._base.delete_dir_contents(path, missing_dir_ok=missing_dir_ok)

    def delete_root_dir_contents(self) -> None:
        """Refuse: tests never need it and it is too dangerous to forward."""
        msg = "delete_root_dir_contents is not supported by the fault-injecting filesystem"
        raise NotImplementedError(msg)

    def delete_file(self, path: str) -> None:
        """Raise an armed delete fault, else forward."""
        self._injector.check("delete", path)
        self._base.delete_file(path)

    def move(self, src: str, dest: str) -> None:
        """Forward."""
        self._base.move(src, dest)

    def copy_file(self, src: str, dest: str) -> None:
        """Forward."""
        self._base.copy_file(src, dest)

    def open_input_stream(self, path: str) -> pa.NativeFile:
        """Forward."""
        return self._base.open_input_stream(path)

    def open_input_file(self, path: str) -> pa.NativeFile:
        """Forward."""
        return self._base.open_input_file(path)

    def open_output_stream(self, path: str, metadata: dict[str, str] | None) -> pa.NativeFile:
        """Raise an armed open fault, else open a stream whose writes can fail."""
        self._injector.check("open", path)
        inner = self._base.open_output_stream(path, metadata=metadata)
        return pa.PythonFile(_FaultyOutput(inner, self._injector, path), mode="w")

    def open_append_stream(self, path: str, metadata: dict[str, str] | None) -> pa.NativeFile:
        """Raise an armed open fault, else open an append stream whose writes can fail."""
        self._injector.check("open", path)
        inner = self._base.open_append_stream(path, metadata=metadata)
        return pa.PythonFile(_FaultyOutput(inner, self._injector, path), mode="w")
