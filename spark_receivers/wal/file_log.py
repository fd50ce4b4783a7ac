"""A write-ahead log stored as time-rolled segment files on any filesystem.

Layout: a directory of segment files named ``log-<start_ms>-<end_ms>`` (plus a
``.<n>`` suffix when that name is taken), each a concatenation of frames (see
:mod:`spark_receivers.wal.framing`). ``start_ms`` is the ``time_ms`` of the write
that opened the segment and ``end_ms = start_ms + rolling interval``; a write
whose time is ``>= end_ms`` rolls to a new segment. ``read_all`` replays
segments sorted by ``(start_ms, end_ms, n)``; ``clean(t)`` deletes segments whose
``end_ms < t``.

Rules that make recovery safe:

* A segment is created exclusively and written only by the writer that created
  it, never reopened for append: after a write failure, after a restart, or if
  the last segment ends in a torn record, the next write goes to a new file, so
  no record ever follows garbage in a file.
* A failed write never returns a handle. It is retried up to ``max_failures``
  times, each time on a fresh segment; on a local filesystem the partial frame is
  truncated away first. A record whose write or fsync failed may still be found
  by ``read_all`` (the bytes can reach disk even though the call failed): replay
  is at-least-once for unacknowledged records, exactly-once for acknowledged ones.
* ``close_file_after_write=True`` (needed for S3 and other stores without append)
  puts every record in its own object, so an object is complete once its
  upload finishes on close; recovery then reads objects in parallel.
"""

from __future__ import annotations

import concurrent.futures as cf
import logging
import re
import threading
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import pyarrow.fs as pafs

from spark_receivers.errors import WriteAheadLogError
from spark_receivers.util.clock import Clock, SystemClock
from spark_receivers.wal._storage import ArrowStorage, LocalStorage, SegmentWriter, Storage
from spark_receivers.wal.base import RecordHandle, WriteAheadLog, confine_handle
from spark_receivers.wal.framing import (
    DEFAULT_MAX_RECORD_BYTES,
    FrameDecoder,
    encode_header,
    read_frame_at,
)
from spark_receivers.wal.layout import resolve_filesystem

__all__ = ["FileBasedWriteAheadLog", "SegmentInfo", "list_segments"]

_log = logging.getLogger(__name__)

_SEGMENT_NAME = re.compile(r"^log-(\d+)-(\d+)(?:\.(\d+))?$")


@dataclass(frozen=True, slots=True, order=True)
class SegmentInfo:
    """One segment file: its time range, collision suffix and path (sorts in replay order)."""

    start_ms: int
    end_ms: int
    seq: int
    path: str

    @staticmethod
    def name_for(start_ms: int, end_ms: int, seq: int) -> str:
        """Return the file name of a segment."""
        base = f"log-{start_ms}-{end_ms}"
        return base if seq == 0 else f"{base}.{seq}"


def list_segments(storage: Storage) -> list[SegmentInfo]:
    """Return the segments in ``storage``'s directory in replay order; other files are ignored."""
    segments = []
    for name in storage.list_names():
        match = _SEGMENT_NAME.match(name)
        if match is None:
            continue
        start, end, seq = match.groups()
        segments.append(SegmentInfo(int(start), int(end), int(seq or 0), storage.join(name)))
    segments.sort()
    return segments


class FileBasedWriteAheadLog(WriteAheadLog):
    """A rolling, checksummed, file-based write-ahead log (Spark's ``FileBasedWriteAheadLog``).

    ``log_dir`` is a local path or a URI (``s3://bucket/dir``, ``file:///tmp/wal``)
    resolved with :func:`~spark_receivers.wal.layout.resolve_filesystem` unless
    ``filesystem`` is given, in which case ``log_dir`` is a path on it (what
    :class:`~spark_receivers.wal.layout.CheckpointLayout` hands out). Nothing is created until the
    first write.

    Durability: with ``fsync=True`` on a local filesystem every record is
    ``fdatasync``-ed before ``write`` returns, and the directory is synced when a
    segment is created (``fsync_hook(fd)`` replaces the sync call, to inject
    faults in tests). Other filesystems cannot fsync: the stream is flushed, and
    with ``close_file_after_write`` the object is closed (committed) per write.
    ``direct_io=True`` writes local segments with ``O_DIRECT``, each frame padded to
    a disk block (for large records: the receiver's blocks; a filesystem without it
    is written buffered; :mod:`spark_receivers.wal.framing` on the padding).

    Handles: ``RecordHandle(path, offset of the frame header, payload length)``.
    ``read`` only accepts handles inside ``log_dir``.

    Thread-safety: every method may be called from any thread; writes are
    serialised by a lock. ``clean(wait=False)`` deletes on a background thread
    (see :meth:`wait_for_cleanups`). Reads are allowed after ``close``.

    ``clock`` only times writes for the slow-write log; segment times always come
    from the ``time_ms`` passed to :meth:`write`.
    """

    def __init__(
        self,
        log_dir: str,
        filesystem: pafs.FileSystem | None = None,
        rolling_interval_s: float = 60,
        max_failures: int = 3,
        close_file_after_write: bool = False,
        fsync: bool = True,
        clock: Clock | None = None,
        *,
        fsync_hook: Callable[[int], None] | None = None,
        max_record_bytes: int = DEFAULT_MAX_RECORD_BYTES,
        recovery_threads: int = 8,
        slow_write_warn_ms: int = 1000,
        direct_io: bool = False,
    ) -> None:
        if not rolling_interval_s > 0:
            msg = f"rolling_interval_s must be > 0, got {rolling_interval_s!r}"
            raise WriteAheadLogError(msg)
        if max_failures < 1:
            msg = f"max_failures must be >= 1, got {max_failures!r}"
            raise WriteAheadLogError(msg)
        if max_record_bytes <= 0:
            msg = f"max_record_bytes must be > 0, got {max_record_bytes!r}"
            raise WriteAheadLogError(msg)
        if recovery_threads < 1:
            msg = f"recovery_threads must be >= 1, got {recovery_threads!r}"
            raise WriteAheadLogError(msg)
        self._storage = _make_storage(log_dir, filesystem, fsync_hook, direct_io)
        self._log_dir = log_dir
        self._rolling_ms = max(1, round(rolling_interval_s * 1000))
        self._max_failures = max_failures
        self._close_after_write = close_file_after_write
        self._fsync = fsync
        self._clock: Clock = clock if clock is not None else SystemClock()
        self._max_record_bytes = max_record_bytes
        self._recovery_threads = recovery_threads
        self._slow_write_warn_ms = slow_write_warn_ms
        self._lock = threading.Lock()
        self._writer: SegmentWriter | None = None
        self._writer_end_ms = 0
        self._last_base: tuple[int, int] | None = None
        self._last_seq = -1
        self._closed = False
        self._cleaner: cf.ThreadPoolExecutor | None = None
        self._cleanups: list[cf.Future[None]] = []

    @property
    def root(self) -> str:
        """The log directory as a path on its filesystem (handles live under it)."""
        return self._storage.root

    def __repr__(self) -> str:
        return f"FileBasedWriteAheadLog({self._log_dir!r})"

    # ------------------------------------------------------------------ writes

    def write(self, data: bytes | bytearray | memoryview, time_ms: int) -> RecordHandle:
        """Append ``data`` in the segment for ``time_ms``; return its handle once synced.

        Blocks for the write (and fsync). Retries on a fresh segment up to
        ``max_failures`` times, then raises :class:`WriteAheadLogError` chained to
        the last cause. Raises immediately after :meth:`close`.
        """
        if not isinstance(data, bytes | bytearray | memoryview):
            msg = f"WAL data must be bytes, got {type(data).__name__}"
            raise TypeError(msg)
        if isinstance(time_ms, bool) or not isinstance(time_ms, int) or time_ms < 0:
            msg = f"time_ms must be an int >= 0, got {time_ms!r}"
            raise WriteAheadLogError(msg)
        # No copy of a large record: the write is synchronous, so a view is enough.
        payload = data if isinstance(data, bytes) else _byte_view(data)
        if len(payload) > self._max_record_bytes:
            msg = (
                f"record of {len(payload)} bytes is above max_record_bytes="
                f"{self._max_record_bytes}; split it or raise the limit"
            )
            raise WriteAheadLogError(msg)
        header = encode_header(payload)
        started = self._clock.get_time_ms()
        with self._lock:
            if self._closed:
                msg = f"write to {self!r} at time {time_ms} after close()"
                raise WriteAheadLogError(msg)
            last_error: BaseException | None = None
            for attempt in range(1, self._max_failures + 1):
                writer: SegmentWriter | None = None
                try:
                    writer = self._writer_for(time_ms)
                    offset = writer.append(header, payload)
                    if self._close_after_write:
                        self._writer = None
                        writer.finish()
                except Exception as exc:  # noqa: BLE001 - any fs error is retried, then raised
                    last_error = exc
                    _log.warning(
                        "WAL write attempt %d/%d to %s failed: %s",
                        attempt,
                        self._max_failures,
                        self._log_dir,
                        exc,
                        exc_info=True,
                    )
                    self._abandon(writer)
                    continue
                elapsed = self._clock.get_time_ms() - started
                if elapsed >= self._slow_write_warn_ms:
                    _log.warning("WAL write to %s took %d ms", writer.path, elapsed)
                return RecordHandle(writer.path, offset, len(payload))
        msg = (
            f"failed to write a {len(payload)}-byte record at time {time_ms} to "
            f"{self._log_dir} after {self._max_failures} attempts: {last_error}"
        )
        raise WriteAheadLogError(msg) from last_error

    def _writer_for(self, time_ms: int) -> SegmentWriter:
        writer = self._writer
        if writer is not None and time_ms < self._writer_end_ms:
            return writer
        self._drop_writer()
        start, end = time_ms, time_ms + self._rolling_ms
        seq = self._last_seq + 1 if self._last_base == (start, end) else 0
        while True:
            path = self._storage.join(SegmentInfo.name_for(start, end, seq))
            try:
                writer = self._storage.create(path, self._fsync)
            except FileExistsError:
                seq += 1
                continue
            break
        self._last_base, self._last_seq = (start, end), seq
        self._writer, self._writer_end_ms = writer, end
        return writer

    def _drop_writer(self) -> None:
        writer, self._writer = self._writer, None
        if writer is not None:
            writer.close()

    def _abandon(self, writer: SegmentWriter | None) -> None:
        """Drop a writer whose write failed; the next attempt opens a new segment."""
        if writer is None:  # creating the segment failed; nothing to drop
            return
        if self._writer is writer:
            self._writer = None
        writer.close()
        if writer.size == 0 or self._close_after_write:
            # Holds no acknowledged record: remove it rather than leave a torn file.
            try:
                self._storage.delete(writer.path)
            except Exception:  # noqa: BLE001 - recovery cuts a leftover torn file anyway
                _log.warning("could not remove failed WAL segment %s", writer.path, exc_info=True)

    # ------------------------------------------------------------------- reads

    def read(self, handle: RecordHandle) -> bytes:
        """Return the record at ``handle`` after verifying its checksums.

        Raises :class:`WriteAheadLogError` if the handle is outside the log
        directory or its file is missing, :class:`CorruptRecordError` (naming path
        and offset) if the frame is cut, corrupt, or not of the handle's length.
        """
        confine_handle(handle, self._storage.root)
        try:
            # No read-ahead: read_frame_at asks for exactly header + payload.
            source, close = self._storage.open_source(handle.path, window=0)
        except FileNotFoundError as exc:
            msg = (
                f"WAL segment {handle.path} does not exist (record at offset "
                f"{handle.offset}); was it cleaned?"
            )
            raise WriteAheadLogError(msg) from exc
        except OSError as exc:
            msg = f"could not open WAL segment {handle.path} for offset {handle.offset}: {exc}"
            raise WriteAheadLogError(msg) from exc
        try:
            return read_frame_at(
                source,
                handle.path,
                handle.offset,
                handle.length,
                max_record_bytes=self._max_record_bytes,
            )
        finally:
            close()

    def read_all(self) -> Iterator[bytes]:
        """Yield every record, segment by segment in time order.

        A torn tail is cut with a warning naming the file and offset; a segment
        that vanished (cleaned meanwhile) is skipped. Mid-file corruption raises
        :class:`CorruptRecordError`. In close-after-write mode segments are read
        by ``recovery_threads`` threads, a bounded window ahead, order preserved.
        """
        segments = list_segments(self._storage)
        if self._close_after_write and self._recovery_threads > 1 and len(segments) > 1:
            return self._read_parallel(segments)
        return self._read_sequential(segments)

    def _read_sequential(self, segments: list[SegmentInfo]) -> Iterator[bytes]:
        for segment in segments:
            yield from self._iter_segment(segment.path)

    def _read_parallel(self, segments: list[SegmentInfo]) -> Iterator[bytes]:
        window = self._recovery_threads * 2
        with cf.ThreadPoolExecutor(
            self._recovery_threads, thread_name_prefix="wal-recovery"
        ) as pool:
            pending: deque[cf.Future[list[bytes]]] = deque()
            todo = iter(segments)
            try:
                for segment in todo:
                    pending.append(pool.submit(self._read_segment, segment.path))
                    if len(pending) >= window:
                        yield from pending.popleft().result()
                while pending:
                    yield from pending.popleft().result()
            finally:
                for future in pending:
                    future.cancel()

    def _read_segment(self, path: str) -> list[bytes]:
        return list(self._iter_segment(path))

    def _iter_segment(self, path: str) -> Iterator[bytes]:
        try:
            source, close = self._storage.open_source(path)
        except FileNotFoundError:
            _log.warning("WAL segment %s vanished before it could be read; skipped", path)
            return
        except OSError as exc:
            msg = f"could not open WAL segment {path} for recovery: {exc}"
            raise WriteAheadLogError(msg) from exc
        try:
            decoder = FrameDecoder(source, path, max_record_bytes=self._max_record_bytes)
            for _, payload in decoder:
                yield payload
            if decoder.torn:
                _log.warning(
                    "WAL segment %s: cut torn tail at offset %d (%d bytes dropped): %s",
                    path,
                    decoder.valid_end,
                    source.size - decoder.valid_end,
                    decoder.torn_reason,
                )
        finally:
            close()

    # ---------------------------------------------------------------- cleanup

    def clean(self, threshold_time_ms: int, wait: bool) -> None:
        """Delete every segment whose end time is < ``threshold_time_ms``.

        The segment currently open for writing is never deleted. With
        ``wait=False`` the deletion runs on a background thread. Errors are logged
        with their stack and never raised; other segments are unaffected.
        """
        with self._lock:
            active = self._writer.path if self._writer is not None else None
            closed = self._closed
            if not closed and not wait and self._cleaner is None:
                self._cleaner = cf.ThreadPoolExecutor(1, thread_name_prefix="wal-clean")
            cleaner = self._cleaner
        if wait or closed or cleaner is None:
            self._delete_old(threshold_time_ms, active)
            return
        future = cleaner.submit(self._delete_old, threshold_time_ms, active)
        with self._lock:
            self._cleanups = [f for f in self._cleanups if not f.done()]
            self._cleanups.append(future)

    def wait_for_cleanups(self, timeout_s: float | None = None) -> bool:
        """Block until background cleanups have finished; return False on timeout."""
        with self._lock:
            futures = list(self._cleanups)
        _, not_done = cf.wait(futures, timeout=timeout_s)
        return not not_done

    def _delete_old(self, threshold_time_ms: int, active: str | None) -> None:
        try:
            segments = list_segments(self._storage)
        except Exception:  # noqa: BLE001 - cleanup errors are logged, never raised
            _log.warning("could not list WAL directory %s to clean it", self.root, exc_info=True)
            return
        old = [s for s in segments if s.end_ms < threshold_time_ms and s.path != active]
        for segment in old:
            try:
                self._storage.delete(segment.path)
            except FileNotFoundError:
                continue
            except Exception:  # noqa: BLE001 - cleanup errors are logged, never raised
                _log.warning("could not delete old WAL segment %s", segment.path, exc_info=True)
        if old:
            _log.debug("cleaned %d WAL segments older than %d", len(old), threshold_time_ms)

    # ------------------------------------------------------------------- close

    def close(self) -> None:
        """Close the open segment and wait for background cleanups; idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            writer, self._writer = self._writer, None
            cleaner, self._cleaner = self._cleaner, None
        if writer is not None:
            try:
                writer.finish()
            except Exception:  # noqa: BLE001 - every record in it was already synced
                _log.warning("closing WAL segment %s failed", writer.path, exc_info=True)
        if cleaner is not None:
            cleaner.shutdown(wait=True)


def _make_storage(
    log_dir: str,
    filesystem: pafs.FileSystem | None,
    fsync_hook: Callable[[int], None] | None,
    direct_io: bool = False,
) -> Storage:
    if not log_dir:
        msg = "log_dir must be a non-empty path or URI"
        raise WriteAheadLogError(msg)
    if filesystem is None:
        filesystem, path = resolve_filesystem(log_dir, "WAL directory")
    else:
        path = log_dir
    if isinstance(filesystem, pafs.LocalFileSystem):
        return LocalStorage(path, fsync_hook, direct_io=direct_io)
    return ArrowStorage(filesystem, path)


def _byte_view(data: bytearray | memoryview) -> memoryview:
    """``data`` as a flat view of unsigned bytes, without copying."""
    view = memoryview(data)
    if not view.c_contiguous:
        msg = "WAL data must be a contiguous buffer; pass bytes(data) for a strided view"
        raise TypeError(msg)
    if view.format == "B" and view.ndim == 1:
        return view
    return view.cast("B")
