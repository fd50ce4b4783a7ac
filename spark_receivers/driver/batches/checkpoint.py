"""The driver's checkpoint: which batches completed, which were pending, the config.

Written after every generated and every completed batch as one small JSON file,
``<checkpoint_dir>/checkpoint.json``, atomically: the new content goes to a
temporary file (fsynced on a local disk), which is then renamed over the old
one (and the directory fsynced), so a reader sees the old or the new checkpoint,
never a mix. On object stores the rename is the store's move (copy + delete):
the old object stays readable until the new one is complete.

What a checkpoint does not hold: blocks and allocations (they are in the driver
WAL, ``receivedBlockMetadata``) and the pipeline (Python code: ``get_or_create``
rebuilds it with the user's ``create_fn``).

Format (``version`` 1)::

    {"version": 1, "batch_interval_ms": 1000, "checkpoint_time_ms": ...,
     "last_completed_batch_ms": 41000, "pending_batch_ms": [42000, 43000],
     "config": {...StreamingConfig.as_dict()...}, "zero_time_ms": 40000}

``zero_time_ms`` (absent in older files: -1) is the batch time before the run's first
batch; windowed streams slide from it, so a restarted driver keeps their grid.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import threading
from dataclasses import dataclass, field
from typing import Any

import pyarrow.fs as pafs

from spark_receivers.errors import CheckpointError, WriteAheadLogError
from spark_receivers.wal.layout import CheckpointLayout

log = logging.getLogger(__name__)

VERSION = 1


@dataclass(frozen=True)
class Checkpoint:
    """One checkpoint of the batch side (see the module doc)."""

    batch_interval_ms: int
    last_completed_batch_ms: int
    pending_batch_ms: tuple[int, ...]
    checkpoint_time_ms: int
    config: dict[str, Any] = field(default_factory=dict)
    zero_time_ms: int = -1
    """The batch time before the run's first batch (windows slide from it); -1: not known."""

    def to_json(self) -> bytes:
        """Serialize (sorted keys, one line)."""
        body = {
            "version": VERSION,
            "batch_interval_ms": self.batch_interval_ms,
            "checkpoint_time_ms": self.checkpoint_time_ms,
            "last_completed_batch_ms": self.last_completed_batch_ms,
            "pending_batch_ms": list(self.pending_batch_ms),
            "config": self.config,
            "zero_time_ms": self.zero_time_ms,
        }
        return json.dumps(body, sort_keys=True, separators=(",", ":")).encode()

    @staticmethod
    def from_json(data: bytes, where: str) -> Checkpoint:
        """Parse and validate; raise :class:`CheckpointError` naming ``where`` otherwise."""
        try:
            body = json.loads(data.decode("utf-8"))
            if not isinstance(body, dict):
                msg = f"a JSON object expected, got {type(body).__name__}"
                raise TypeError(msg)  # noqa: TRY301 - reported below with the file name
            version = body["version"]
            if version != VERSION:
                msg = f"unsupported checkpoint version {version!r} (this build reads {VERSION})"
                raise ValueError(msg)  # noqa: TRY301 - reported below with the file name
            cp = Checkpoint(
                batch_interval_ms=_int(body, "batch_interval_ms"),
                last_completed_batch_ms=_int(body, "last_completed_batch_ms"),
                pending_batch_ms=tuple(int(t) for t in body["pending_batch_ms"]),
                checkpoint_time_ms=_int(body, "checkpoint_time_ms"),
                config=dict(body.get("config") or {}),
                zero_time_ms=int(body.get("zero_time_ms", -1)),
            )
        except (UnicodeDecodeError, ValueError, KeyError, TypeError) as e:
            msg = (
                f"checkpoint {where} is corrupt or not a spark-receivers checkpoint: {e}. "
                "Delete it to start afresh, or pass create_on_error=True to get_or_create"
            )
            raise CheckpointError(msg) from e
        if cp.batch_interval_ms <= 0:
            msg = f"checkpoint {where} has batch_interval_ms={cp.batch_interval_ms}; must be > 0"
            raise CheckpointError(msg)
        return cp


def zero_time_of(checkpoint: Checkpoint) -> int:
    """The zero time windows slide from after a restart from ``checkpoint``.

    Its ``zero_time_ms``; for a checkpoint without one (no batch ran, or an older
    version), the batch time before the first batch the restart can run.
    """
    if checkpoint.zero_time_ms >= 0:
        return checkpoint.zero_time_ms
    interval = checkpoint.batch_interval_ms
    known = checkpoint.checkpoint_time_ms // interval * interval
    return max(known, checkpoint.last_completed_batch_ms)


def _int(body: dict[str, Any], key: str) -> int:
    value = body[key]
    if isinstance(value, bool) or not isinstance(value, int):
        msg = f"{key} must be an integer, got {value!r}"
        raise TypeError(msg)
    return value


class CheckpointStore:
    """Reads and atomically writes the checkpoint file of a checkpoint directory.

    Thread-safe: writes are serialised, and a write never leaves a partial file
    under the checkpoint's name. ``checkpoint_dir`` is a path, a URI or its
    :class:`~spark_receivers.wal.layout.CheckpointLayout`; a URI that cannot be
    resolved raises :class:`CheckpointError`.
    """

    def __init__(self, checkpoint_dir: str | CheckpointLayout) -> None:
        if isinstance(checkpoint_dir, CheckpointLayout):
            layout = checkpoint_dir
        else:
            try:
                layout = CheckpointLayout(checkpoint_dir)
            except WriteAheadLogError as e:
                raise CheckpointError(str(e)) from e
        self.layout = layout
        self.checkpoint_dir = layout.checkpoint_dir
        self._fs, self._root, self._local = layout.filesystem, layout.root, layout.is_local
        self.path = layout.checkpoint_file
        self._lock = threading.Lock()
        self.writes = 0

    def exists(self) -> bool:
        """Whether a checkpoint file is present."""
        if self._local:
            return os.path.exists(self.path)
        return bool(self._fs.get_file_info(self.path).type != pafs.FileType.NotFound)

    def read(self) -> Checkpoint | None:
        """The checkpoint, None when there is none; :class:`CheckpointError` if corrupt."""
        try:
            if self._local:
                with open(self.path, "rb") as f:
                    data = f.read()
            else:
                with self._fs.open_input_stream(self.path) as f:
                    data = f.read()
        except FileNotFoundError:
            return None
        except OSError as e:
            msg = f"could not read the checkpoint {self.path}: {e}"
            raise CheckpointError(msg) from e
        return Checkpoint.from_json(data, self.path)

    def write(self, checkpoint: Checkpoint) -> None:
        """Write ``checkpoint`` atomically (temporary file, then rename)."""
        data = checkpoint.to_json()
        tmp = self.layout.checkpoint_temp_file()
        with self._lock:
            try:
                if self._local:
                    self._write_local(tmp, data)
                else:
                    self._fs.create_dir(self._root, recursive=True)
                    with self._fs.open_output_stream(tmp) as f:
                        f.write(data)
                    self._fs.move(tmp, self.path)
            except OSError as e:
                with contextlib.suppress(OSError):
                    if self._local:
                        os.unlink(tmp)
                    else:
                        self._fs.delete_file(tmp)
                msg = f"could not write the checkpoint {self.path}: {e}"
                raise CheckpointError(msg) from e
            self.writes += 1

    def _write_local(self, tmp: str, data: bytes) -> None:
        os.makedirs(self._root, exist_ok=True)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, self.path)
        dir_fd = os.open(self._root, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)

    def quarantine(self) -> str | None:
        """Rename a corrupt checkpoint aside (``checkpoint.json.corrupt-<id>``); return its path."""
        if not self.exists():
            return None
        target = self.layout.corrupt_checkpoint_file()
        try:
            if self._local:
                os.replace(self.path, target)
            else:
                self._fs.move(self.path, target)
        except OSError:
            log.warning("could not move the corrupt checkpoint %s aside", self.path, exc_info=True)
            return None
        return target

    def recover(self, create_on_error: bool = False) -> Checkpoint | None:
        """The checkpoint to restart from, or None for a fresh start.

        A corrupt checkpoint raises :class:`CheckpointError`, or, with
        ``create_on_error``, is moved aside (logged) for a fresh start.
        """
        try:
            return self.read()
        except CheckpointError:
            if not create_on_error:
                raise
            moved = self.quarantine()
            log.warning(
                "corrupt checkpoint in %s moved to %s; starting afresh", self.checkpoint_dir, moved
            )
            return None
