"""Where segment files live: a local directory or any pyarrow filesystem.

Internal to :mod:`spark_receivers.wal`. Two backends with the same small
surface, so that :class:`~spark_receivers.wal.file_log.FileBasedWriteAheadLog`
does not care where it writes:

* :class:`LocalStorage` uses ``os.open``/``os.write``/``os.fsync`` because
  pyarrow's output streams cannot fsync. New files and new directories are made
  durable by syncing their parent directory. With ``direct_io`` it opens segments
  with ``O_DIRECT`` and writes each frame from a reused page-aligned buffer,
  zero-padded to :data:`DIRECT_IO_ALIGN` (the framing's readers skip the padding):
  the record goes from that buffer to the disk without a page-cache copy. On this
  project's VMs a buffered write of a large block cost 0.02-0.2 CPU-seconds per
  100 MB in the kernel (page-cache pages first touched after the host took them
  back), the direct write 0.004-0.011 (decision 0021). A filesystem that refuses
  ``O_DIRECT`` (``EINVAL``, e.g. an old tmpfs) at open, or at a segment's first
  write, gets the buffered write from then on.
* :class:`ArrowStorage` uses ``pyarrow.fs`` streams; "sync" means ``flush()``
  (and, in close-after-write mode, closing the object: on S3 the object only
  exists once its upload completes on close).

Every segment file is created exclusively and written only by the writer that
created it; nothing ever appends to a file it did not create.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import logging
import mmap
import os
import posixpath
from collections.abc import Callable
from typing import Protocol

import pyarrow as pa
import pyarrow.fs as pafs

from spark_receivers.wal.framing import DIRECT_IO_ALIGN, CachedSource, RandomAccessSource

_log = logging.getLogger(__name__)

_O_DIRECT = getattr(os, "O_DIRECT", 0)
_MIB = 1 << 20

FsyncHook = Callable[[int], None]


def _default_fsync(fd: int) -> None:
    # fdatasync also persists the file size, which is all a reader needs.
    sync = getattr(os, "fdatasync", os.fsync)
    sync(fd)


class SegmentWriter(Protocol):
    """An open segment file that accepts frames."""

    path: str
    size: int

    def append(self, header: bytes, payload: bytes | memoryview) -> int:
        """Write one frame, sync it, return its offset. On error the file is dropped."""
        ...

    def finish(self) -> None:
        """Close the file and raise if that fails (object stores commit on close)."""
        ...

    def close(self) -> None:
        """Close the file; never raises."""
        ...


class Storage(Protocol):
    """The file operations the log needs."""

    root: str

    def join(self, name: str) -> str:
        """Return the path of ``name`` inside the root."""
        ...

    def list_names(self) -> list[str]:
        """Names of the files directly inside the root; empty if it does not exist."""
        ...

    def exists(self, path: str) -> bool:
        """Whether ``path`` exists."""
        ...

    def create(self, path: str, sync: bool) -> SegmentWriter:
        """Create ``path`` exclusively (FileExistsError if it exists) and open it."""
        ...

    def open_source(
        self, path: str, window: int = 1 << 20
    ) -> tuple[RandomAccessSource, Callable[[], None]]:
        """Open ``path`` for reading with a read-ahead ``window``; return it and its closer."""
        ...

    def delete(self, path: str) -> None:
        """Delete ``path``."""
        ...


class _AlignedFrames:
    """A page-aligned buffer, reused for every frame of a log's direct writes.

    Reused rather than allocated per frame: freshly mapped pages cost a fault each on
    first touch, which is the kernel time direct writes are there to avoid. Grows to
    the largest frame written so far.
    """

    def __init__(self) -> None:
        self._map: mmap.mmap | None = None

    def frame(self, header: bytes, payload: bytes | memoryview) -> memoryview:
        """Copy header and payload in, zero the padding; return the padded frame."""
        size = len(header) + len(payload)
        padded = -(-size // DIRECT_IO_ALIGN) * DIRECT_IO_ALIGN
        if self._map is None or len(self._map) < padded:
            # A quarter more than asked, in whole MiB: blocks of a steady stream differ a
            # little in size, and each growth maps (and faults in) fresh pages. The old
            # map is dropped, not closed: a view of it may still be alive.
            grown = -(-(padded + padded // 4) // _MIB) * _MIB
            self._map = mmap.mmap(-1, grown)
        view = memoryview(self._map)
        view[: len(header)] = header
        view[len(header) : size] = payload
        view[size:padded] = bytes(padded - size)
        return view[:padded]


class _LocalWriter:
    def __init__(
        self,
        path: str,
        fd: int,
        sync: bool,
        fsync: FsyncHook,
        frames: _AlignedFrames | None,
        on_refused: Callable[[str, OSError], None],
    ) -> None:
        self.path = path
        self.size = 0
        self._fd: int | None = fd
        self._sync = sync
        self._fsync = fsync
        self._frames = frames
        self._on_refused = on_refused

    def append(self, header: bytes, payload: bytes | memoryview) -> int:
        fd = self._fd
        if fd is None:
            msg = f"segment {self.path} is closed"
            raise OSError(errno.EBADF, msg)
        offset = self.size
        try:
            if self._frames is not None:
                end = self._write_aligned(fd, self._frames.frame(header, payload), offset)
            else:
                _write_all(fd, header)
                _write_all(fd, payload)
                end = offset + len(header) + len(payload)
            if self._sync:
                self._fsync(fd)
        except BaseException:
            # Cut the partial frame off so that a later reader sees the file end
            # exactly where the last acknowledged record ends. Best effort: after a
            # failed fsync the page cache may not be trustworthy, so the file is
            # also never written again (the caller opens a new one).
            with contextlib.suppress(OSError):
                os.ftruncate(fd, offset)
            raise
        self.size = end
        return offset

    def _write_aligned(self, fd: int, frame: memoryview, offset: int) -> int:
        try:
            written = os.pwrite(fd, frame, offset)
        except OSError as e:
            if e.errno != errno.EINVAL:
                raise
            # The filesystem opened the file with O_DIRECT but refuses the write (some
            # FUSE and network filesystems): the same padded frame, through the cache.
            self._on_refused(self.path, e)
            fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) & ~_O_DIRECT)
            written = os.pwrite(fd, frame, offset)
        while written < len(frame):
            written += os.pwrite(fd, frame[written:], offset + written)
        return offset + len(frame)

    def finish(self) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)

    def close(self) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            try:
                os.close(fd)
            except OSError:
                _log.warning("closing WAL segment %s failed", self.path, exc_info=True)


def _write_all(fd: int, data: bytes | memoryview) -> None:
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        view = view[written:]


class LocalStorage:
    """Segments in a local directory, written with ``os`` calls so they can be fsynced.

    ``direct_io`` asks for ``O_DIRECT`` segments (module doc); where the platform or
    the filesystem has none, segments are written buffered.
    """

    def __init__(
        self, root: str, fsync_hook: FsyncHook | None = None, *, direct_io: bool = False
    ) -> None:
        self.root = os.path.abspath(root)
        self._fsync = fsync_hook if fsync_hook is not None else _default_fsync
        self._dir_ready = False
        self._frames = _AlignedFrames() if direct_io and _O_DIRECT else None

    def join(self, name: str) -> str:
        """Return the absolute path of ``name`` in the log directory."""
        return os.path.join(self.root, name)

    def list_names(self) -> list[str]:
        """List the directory; empty if it does not exist yet."""
        try:
            return os.listdir(self.root)
        except FileNotFoundError:
            return []

    def exists(self, path: str) -> bool:
        """Whether ``path`` exists."""
        return os.path.exists(path)

    def _ensure_dir(self, sync: bool) -> None:
        if self._dir_ready:
            return
        missing = []
        cur = self.root
        while not os.path.isdir(cur):
            missing.append(cur)
            cur = os.path.dirname(cur)
        os.makedirs(self.root, exist_ok=True)
        if sync:
            # A new directory entry is durable only once its parent is synced.
            for created in reversed(missing):
                self._sync_dir(os.path.dirname(created))
        self._dir_ready = True

    def _sync_dir(self, path: str) -> None:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
        try:
            self._fsync(fd)
        finally:
            os.close(fd)

    def create(self, path: str, sync: bool) -> SegmentWriter:
        """Create ``path`` with ``O_EXCL``; sync the directory so the name survives."""
        self._ensure_dir(sync)
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0)
        fd = self._open_direct(path, flags) if self.direct_io else None
        if fd is None:
            fd = os.open(path, flags, 0o644)
        if sync:
            try:
                self._sync_dir(self.root)
            except BaseException:
                os.close(fd)
                with contextlib.suppress(OSError):
                    os.unlink(path)
                raise
        return _LocalWriter(path, fd, sync, self._fsync, self._frames, self._direct_write_refused)

    @property
    def direct_io(self) -> bool:
        """Whether new segments are opened with ``O_DIRECT`` (False once refused)."""
        return self._frames is not None

    def _direct_write_refused(self, path: str, error: OSError) -> None:
        """A segment's direct write was refused: it and every later one go buffered."""
        if self._frames is not None:  # once, though open writers may each report it
            _log.info(
                "WAL segment %s: direct write refused (%s); writing this and later segments"
                " buffered",
                path,
                error,
            )
        self._frames = None

    def _open_direct(self, path: str, flags: int) -> int | None:
        """Create ``path`` with ``O_DIRECT``; None (and buffered from now on) if refused."""
        try:
            return os.open(path, flags | _O_DIRECT, 0o644)
        except OSError as e:
            if e.errno != errno.EINVAL:
                raise
        # EINVAL: the filesystem has no direct I/O. Did the refused open leave the file?
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
        _log.info("WAL directory %s: no O_DIRECT on this filesystem; writing buffered", self.root)
        self._frames = None
        return None

    def open_source(
        self, path: str, window: int = 1 << 20
    ) -> tuple[RandomAccessSource, Callable[[], None]]:
        """Open ``path`` read-only with ``pread`` under a read-ahead window."""
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
        try:
            size = os.fstat(fd).st_size
        except BaseException:
            os.close(fd)
            raise

        def read_at(offset: int, length: int) -> bytes:
            chunks = []
            while length > 0:
                chunk = os.pread(fd, length, offset)
                if not chunk:
                    break
                chunks.append(chunk)
                offset += len(chunk)
                length -= len(chunk)
            return b"".join(chunks)

        return CachedSource(read_at, size, window), lambda: os.close(fd)

    def delete(self, path: str) -> None:
        """Unlink ``path``."""
        os.unlink(path)


class _ArrowWriter:
    def __init__(self, path: str, stream: pa.NativeFile, sync: bool) -> None:
        self.path = path
        self.size = 0
        self._stream = stream
        self._sync = sync
        self._closed = False

    def append(self, header: bytes, payload: bytes | memoryview) -> int:
        if self._closed:
            msg = f"segment {self.path} is closed"
            raise OSError(errno.EBADF, msg)
        offset = self.size
        self._stream.write(header)
        self._stream.write(payload)
        if self._sync:
            self._stream.flush()
        self.size = offset + len(header) + len(payload)
        return offset

    def finish(self) -> None:
        """Close the stream and let errors through (object stores commit on close)."""
        self._closed = True
        self._stream.close()

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            self._stream.close()
        except Exception:  # noqa: BLE001 - a failing close of a dropped writer is only logged
            _log.warning("closing WAL segment %s failed", self.path, exc_info=True)


class ArrowStorage:
    """Segments on a ``pyarrow.fs.FileSystem`` (S3, GCS, HDFS, a fault-injecting wrapper)."""

    def __init__(self, fs: pafs.FileSystem, root: str) -> None:
        self.fs = fs
        self.root = root.rstrip("/") or "/"
        self._dir_ready = False

    def join(self, name: str) -> str:
        """Return the filesystem path of ``name`` in the log directory."""
        return posixpath.join(self.root, name)

    def list_names(self) -> list[str]:
        """List the directory; empty if it does not exist yet."""
        selector = pafs.FileSelector(self.root, allow_not_found=True, recursive=False)
        return [
            posixpath.basename(info.path)
            for info in self.fs.get_file_info(selector)
            if info.type == pafs.FileType.File
        ]

    def exists(self, path: str) -> bool:
        """Whether ``path`` exists."""
        return bool(self.fs.get_file_info(path).type != pafs.FileType.NotFound)

    def create(self, path: str, sync: bool) -> SegmentWriter:
        """Open a new output stream; refuse to overwrite an existing object."""
        if not self._dir_ready:
            self.fs.create_dir(self.root, recursive=True)
            self._dir_ready = True
        # Object stores have no exclusive create; the existence check plus unique
        # names per writer is what keeps two segments from sharing a name.
        if self.exists(path):
            raise FileExistsError(errno.EEXIST, "segment exists", path)
        return _ArrowWriter(path, self.fs.open_output_stream(path), sync)

    def open_source(
        self, path: str, window: int = 1 << 20
    ) -> tuple[RandomAccessSource, Callable[[], None]]:
        """Open ``path`` as a random-access file under a read-ahead window."""
        f = self.fs.open_input_file(path)
        try:
            size = f.size()
        except BaseException:
            f.close()
            raise
        return CachedSource(lambda off, n: f.read_at(n, off), size, window), f.close

    def delete(self, path: str) -> None:
        """Delete ``path``."""
        self.fs.delete_file(path)
