"""``FileTailReceiver``: follows the files of a directory, one record per line.

Reliable, exactly once: every batch of lines is stored with ``store(...,
reliable=True, position=...)`` and only then is the read offset saved (an atomic
write-then-rename of a JSON file), so a restarted receiver goes on exactly after
the last stored line. The position names the file (``st_dev:st_ino`` and path), the
offset after the batch and the number of the commit (saved with the offsets): a
receiver killed between the store and the save finds, at its restart, that the
driver's accepted position is the commit after its saved one, and moves that file's
offset to it instead of storing the batch again (also after a driver restart with
``get_or_create``, which keeps the position in its WAL). A position that is not the
next commit (already saved, or of an older life) changes nothing.

Files are known by ``(st_dev, st_ino)``, not by name, and each one followed is
held open. So:

* appends: the new complete lines are read at the next poll; a last line
  without its newline waits until it is completed;
* new files matching ``pattern``: followed from their first byte;
* rotation (``app.log`` renamed ``app.log.1``, a new ``app.log`` created):
  the old inode is still followed under its new name (or, if deleted, through
  the open handle) until it has been idle for ``finish_after_ms``; then its
  unterminated last line, if any, is stored and the file is forgotten;
* truncation (size below the offset, as ``copytruncate`` does): reading
  restarts at 0 and the receiver reports an error to the driver.

A line that is not valid UTF-8, or longer than ``max_record_bytes``, is a bad
record, handled by ``bad_record_policy``: ``skip`` and ``dead_letter`` (the raw
bytes, keyed ``<path>:<offset>``) go on after it; ``fail`` stores the lines
before it, saves the offset of its start and stops the receiver with the
error (a restart meets the same line again).
"""

from __future__ import annotations

import contextlib
import fnmatch
import json
import logging
import os
import stat
import tempfile
import time
from dataclasses import dataclass, field
from typing import IO, Any

import pyarrow as pa

from spark_receivers.errors import ConfigError
from spark_receivers.receiver.bad_records import BadRecordPolicy
from spark_receivers.receiver.lines import split_lines
from spark_receivers.receiver.threaded_receiver import ThreadedReceiver

log = logging.getLogger(__name__)

OFFSETS_DIR_NAME = ".spark-receivers-offsets"
START_AT = ("beginning", "end")


@dataclass
class _Followed:
    """One followed file: its identity, where it was last seen, how far it was stored."""

    key: str
    path: str
    offset: int
    skipping: bool = False  # inside a line longer than max_record_bytes: drop up to its end
    handle: IO[bytes] | None = None
    last_change: float = field(default_factory=time.monotonic)


def _key(st: os.stat_result) -> str:
    return f"{st.st_dev}:{st.st_ino}"


class FileTailReceiver(ThreadedReceiver):
    r"""Stores every complete line appended to the files of ``directory`` matching ``pattern``.

    ``start_at="end"`` skips what the files hold when the receiver first starts
    without saved offsets (files created later are read from their start).
    ``offsets_dir`` defaults to ``<directory>/.spark-receivers-offsets``; the
    offsets of stream N live in ``stream-N.json`` there (``offsets_name``
    overrides the name). Lines are decoded as UTF-8, without their ``\n`` or
    ``\r\n``; one that is not UTF-8 or longer than ``max_record_bytes`` goes to
    ``bad_record_policy`` (see the module doc). Hidden files (``.name``) are
    ignored unless ``pattern`` starts with a dot. ``include_timestamp=True``
    adds when each line was read.

    A failure (the offsets cannot be saved, a store fails) restarts the
    receiver with the backoff of :class:`ThreadedReceiver`; it goes on from
    the saved offsets.

    Thread contract: one polling thread (``file-tail-<stream>``) reads and
    stores; it waits on an event between polls, so ``on_stop`` returns within
    one store. The followed files are opened and closed on that thread only.
    """

    thread_name_prefix = "file-tail"
    transient_attrs = ("_files",)
    supports_timestamp = True

    def __init__(
        self,
        directory: str,
        pattern: str = "*",
        *,
        offsets_dir: str | None = None,
        offsets_name: str | None = None,
        poll_interval_ms: int = 200,
        start_at: str = "beginning",
        max_batch_bytes: int = 4 * 1024 * 1024,
        max_record_bytes: int | None = None,
        finish_after_ms: int = 2000,
        **kwargs: Any,
    ) -> None:
        super().__init__(max_record_bytes=max_record_bytes, **kwargs)
        if start_at not in START_AT:
            msg = f"start_at must be one of {START_AT}, got {start_at!r}"
            raise ConfigError(msg)
        for key, value in (
            ("poll_interval_ms", poll_interval_ms),
            ("max_batch_bytes", max_batch_bytes),
        ):
            if value <= 0:
                msg = f"{key} must be > 0, got {value!r}"
                raise ConfigError(msg)
        if finish_after_ms < 0:
            msg = f"finish_after_ms must be >= 0, got {finish_after_ms!r}"
            raise ConfigError(msg)
        self.directory = os.path.abspath(directory)
        self.pattern = pattern
        self.offsets_dir = offsets_dir or os.path.join(self.directory, OFFSETS_DIR_NAME)
        self.offsets_name = offsets_name
        self.poll_interval_ms = poll_interval_ms
        self.start_at = start_at
        self.max_batch_bytes = max_batch_bytes
        self.finish_after_ms = finish_after_ms
        self.lines_stored = 0
        self.bad_records = 0
        self.resumed_from_driver = 0
        """Restarts that took a file's offset from the driver's accepted position."""
        self.reset_runtime()

    def reset_runtime(self) -> None:
        """Forget the followed files (a run starts from the saved offsets)."""
        self._files: dict[str, _Followed] = {}
        self._commits = 0

    @property
    def offsets_path(self) -> str:
        """The JSON file that holds the saved offsets of this stream."""
        name = self.offsets_name or f"stream-{self.stream_id}.json"
        return os.path.join(self.offsets_dir, name)

    # --- the polling thread ------------------------------------------------

    def receive(self) -> None:
        """Load the saved offsets, then poll every ``poll_interval_ms`` until stopped."""
        try:
            first_start = self._load_offsets()
            if self._resume(self.accepted_position()):
                first_start = False
            self._poll(skip_existing=first_start and self.start_at == "end")
            self.mark_healthy()
            while not self.wait(self.poll_interval_ms / 1000.0):
                self._poll()
                self.mark_healthy()
        finally:
            self._close_all()

    def describe(self) -> str:
        """``tailing <directory>``, as restart messages name the work."""
        return f"tailing {self.directory}"

    def _close_all(self) -> None:
        for f in self._files.values():
            if f.handle is not None:
                with contextlib.suppress(OSError):
                    f.handle.close()
                f.handle = None

    # --- offsets --------------------------------------------------------------

    def _load_offsets(self) -> bool:
        """Load saved offsets; True when there were none (the very first start)."""
        try:
            with open(self.offsets_path, encoding="utf-8") as f:
                saved = json.load(f)
        except FileNotFoundError:
            return True
        self._commits = int(saved.get("commits", 0))
        for key, entry in saved.get("files", {}).items():
            self._files[key] = _Followed(
                key, entry["path"], int(entry["offset"]), bool(entry.get("skipping", False))
            )
        return False

    def _resume(self, position: str | None) -> bool:
        """Apply the driver's position if it is the commit after the saved one (module doc)."""
        if position is None:
            return False
        try:
            at = json.loads(position)
            commit, key, path = int(at["commit"]), str(at["file"]), str(at["path"])
            offset, skipping = int(at["offset"]), bool(at["skipping"])
        except (ValueError, KeyError, TypeError):
            log.warning("receiver %d: ignoring accepted position %r", self.stream_id, position)
            return False
        if commit != self._commits + 1 or at.get("directory") != self.directory:
            return False  # saved already, not this life's, or of another directory
        followed = self._files.get(key)
        if followed is None:
            followed = self._files[key] = _Followed(key, path, offset)
        log.info(
            "receiver %d: %s was stored up to byte %d before the offsets were saved; "
            "going on from there",
            self.stream_id,
            path,
            offset,
        )
        followed.offset = offset
        followed.skipping = skipping
        self._commits = commit
        self._save_offsets()
        self.resumed_from_driver += 1
        return True

    def _save_offsets(self) -> None:
        os.makedirs(self.offsets_dir, exist_ok=True)
        content = {
            "version": 1,
            "directory": self.directory,
            "commits": self._commits,
            "files": {
                k: {"path": f.path, "offset": f.offset, "skipping": f.skipping}
                for k, f in self._files.items()
            },
        }
        fd, tmp = tempfile.mkstemp(dir=self.offsets_dir, prefix=".offsets-", suffix=".tmp")
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as out:
                json.dump(content, out)
                out.flush()
                os.fsync(out.fileno())
            os.replace(tmp, self.offsets_path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise

    # --- polling ----------------------------------------------------------------

    def _scan(self) -> dict[str, tuple[str, os.stat_result]]:
        found: dict[str, tuple[str, os.stat_result]] = {}
        try:
            entries = list(os.scandir(self.directory))
        except FileNotFoundError:
            return found
        for entry in entries:
            try:
                st = entry.stat(follow_symlinks=True)
            except OSError:
                continue  # removed between the listing and the stat
            if stat.S_ISREG(st.st_mode):
                found[_key(st)] = (entry.path, st)
        return found

    def _matches(self, path: str) -> bool:
        name = os.path.basename(path)
        if name.startswith(".") and not self.pattern.startswith("."):
            return False
        return fnmatch.fnmatch(name, self.pattern)

    def _poll(self, skip_existing: bool = False) -> None:
        found = self._scan()
        changed = False
        for key, (path, st) in found.items():
            if key not in self._files and self._matches(path):
                self._files[key] = _Followed(key, path, st.st_size if skip_existing else 0)
                changed = True
        if skip_existing:
            self._save_offsets()
        # Old (rotated) inodes first, so that a file's lines come before its successor's.
        order = sorted(
            self._files.values(),
            key=lambda f: (self._matches(found[f.key][0]) if f.key in found else False, f.path),
        )
        for followed in order:
            if self.stopping:
                return
            changed |= self._follow(followed, found.get(followed.key))
        if changed:
            self._save_offsets()

    def _follow(self, f: _Followed, seen: tuple[str, os.stat_result] | None) -> bool:
        """Store what is new in one file; True when the offsets changed without a save."""
        if seen is not None:
            f.path = seen[0]
        if f.handle is None:
            if seen is None:  # gone while we were not running: nothing left to read
                log.warning("receiver %d: %s (%s) is gone", self.stream_id, f.path, f.key)
                del self._files[f.key]
                return True
            try:
                handle = open(f.path, "rb")  # noqa: SIM115 - held open across polls
            except OSError as e:
                log.warning("receiver %d: cannot open %s: %s", self.stream_id, f.path, e)
                return False
            if _key(os.fstat(handle.fileno())) != f.key:  # replaced between scan and open
                handle.close()
                return False
            f.handle = handle
        size = os.fstat(f.handle.fileno()).st_size
        if size < f.offset:
            message = (
                f"{f.path} was truncated to {size} bytes below the read offset {f.offset}; "
                "reading it again from its start"
            )
            log.warning("receiver %d: %s", self.stream_id, message)
            self.report_error(message)
            f.offset = 0
            f.skipping = False
            f.last_change = time.monotonic()
            self._save_offsets()
        progressed = False
        while size > f.offset and not self.stopping:
            if not self._read_some(f, size):
                break
            progressed = True
        if progressed:
            f.last_change = time.monotonic()
            return False
        finished = seen is None or not self._matches(seen[0])
        idle_ms = (time.monotonic() - f.last_change) * 1000.0
        if finished and idle_ms >= self.finish_after_ms:
            self._finish(f, size)
            return True
        return False

    def _read_some(self, f: _Followed, size: int) -> bool:
        """Store the next complete lines of ``f``; False when only a partial line is left."""
        assert f.handle is not None
        f.handle.seek(f.offset)
        # A chunk holds at least one whole record of the longest length taken.
        chunk = f.handle.read(min(max(self.max_batch_bytes, self.record_limit), size - f.offset))
        if not chunk:
            return False
        if f.skipping:  # drop the rest of an over-long line, up to its newline
            nl = chunk.find(b"\n")
            end = len(chunk) if nl < 0 else nl + 1
            self._commit(f, f.offset + end, [], skipping=nl < 0)
            return True
        cut = chunk.rfind(b"\n")
        if cut < 0:
            if len(chunk) >= self.record_limit:
                # raises under "fail": the offset stays at the start of the line
                self.handle_bad_record(
                    chunk[: self.record_limit],
                    f"{f.path}: line at byte {f.offset} longer than "
                    f"max_record_bytes={self.record_limit}",
                    key=f"{f.path}:{f.offset}",
                )
                self._commit(f, f.offset + len(chunk), [], skipping=True)
                return True
            return False
        lines = self._decode(f, chunk[:cut])
        self._commit(f, f.offset + cut + 1, lines, skipping=False)
        return True

    def _decode(self, f: _Followed, data: bytes) -> pa.Array | list[str]:
        """The lines of ``data`` (read at ``f.offset``); bad ones go to the policy.

        All good (the usual case): one Arrow array, split and checked by Arrow's kernels
        (:func:`~spark_receivers.receiver.lines.split_lines`), no Python object per line.
        Else line by line, each bad line reported with its file offset; under ``fail``
        the lines before a bad one are committed (its start saved as the offset) before
        :meth:`handle_bad_record` raises.
        """
        if self.default_records:
            lines = split_lines(data, self.record_limit)
            if lines is not None:
                return lines
        limit = self.record_limit
        good: list[str] = []
        offset = f.offset
        for raw in data.split(b"\n"):
            if len(raw) > limit:
                reason = f"{f.path}: line at byte {offset} longer than max_record_bytes={limit}"
            else:
                try:
                    good.append(raw.decode("utf-8").removesuffix("\r"))
                    offset += len(raw) + 1
                    continue
                except UnicodeDecodeError as e:
                    reason = f"{f.path}: line at byte {offset} is not UTF-8 (byte {e.start})"
            if self.bad_record_policy is BadRecordPolicy.FAIL:
                self._commit(f, offset, good, skipping=False)  # keep those before it
                good = []
            self.handle_bad_record(raw[:limit], reason, key=f"{f.path}:{offset}")
            offset += len(raw) + 1
        return good

    def _commit(
        self, f: _Followed, offset: int, lines: pa.Array | list[str], skipping: bool
    ) -> None:
        """Store ``lines`` reliably, then move and save the offset (in that order)."""
        if len(lines):
            self._store_at(f, lines, offset, skipping)
        f.offset = offset
        f.skipping = skipping
        self._save_offsets()

    def _store_at(
        self, f: _Followed, lines: pa.Array | list[str], offset: int, skipping: bool
    ) -> None:
        """Store ``lines`` as the next commit, ``f`` read up to ``offset`` (the position)."""
        commit = self._commits + 1
        position = json.dumps(
            {
                "commit": commit,
                "directory": self.directory,
                "file": f.key,
                "path": f.path,
                "offset": offset,
                "skipping": skipping,
            },
            separators=(",", ":"),
        )
        self.store_records(lines, reliable=True, position=position)
        self._commits = commit
        self.lines_stored += len(lines)

    def _finish(self, f: _Followed, size: int) -> None:
        """Store the unterminated last line of a rotated-away file and forget it."""
        if f.handle is not None and size > f.offset and not f.skipping:
            f.handle.seek(f.offset)
            tail = f.handle.read(size - f.offset)
            lines = self._decode(f, tail)
            if len(lines):
                self._store_at(f, lines, size, skipping=False)
                f.offset = size
                self._save_offsets()
        log.info("receiver %d: finished %s (%s)", self.stream_id, f.path, f.key)
        if f.handle is not None:
            f.handle.close()
        del self._files[f.key]
