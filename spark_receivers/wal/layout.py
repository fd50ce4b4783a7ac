"""Every path under a checkpoint directory, and how a path or URI becomes a filesystem.

The one place that knows what a checkpoint directory holds (Spark's
``Checkpoint.checkpointFile`` and ``ReceivedBlockTracker.checkpointDirToLogDir``
together)::

    <checkpoint_dir>/
        checkpoint.json                      the driver's batch state (CheckpointStore)
        .checkpoint.json.<hex>.tmp           a checkpoint being written (renamed over it)
        checkpoint.json.corrupt-<id>         a corrupt checkpoint moved aside
        job-id                               the job's random id, written once (job_identity)
        receivedBlockMetadata/               the driver WAL (block events)
        receivedData/<stream_id>/            the receiver WAL of one stream (Arrow blocks)
        state/<name>/state-<time_ms>.arrow   a stateful stream's state (driver/batches/state_store)

Both WAL directories hold segment files ``log-<start_ms>-<end_ms>[.<n>]``
(:mod:`spark_receivers.wal.file_log`).

``checkpoint_dir`` is a local path or a URI that ``pyarrow.fs.FileSystem.from_uri``
understands (``file:///ckpt``, ``s3://bucket/ckpt?endpoint_override=...``;
``s3a://`` and ``s3n://`` are read as ``s3://``, with a log line; ``hdfs://``
needs libhdfs, found through ``HADOOP_HOME`` or ``ARROW_LIBHDFS_DIR``, on every node). It is
resolved **once**, and every path below is joined on the resolved path, so a URI's
query string never ends up in the middle of a path. Paths returned by
:class:`CheckpointLayout` are paths on :attr:`CheckpointLayout.filesystem`, the same
form as the ``path`` of a :class:`~spark_receivers.wal.base.RecordHandle`; open a log
there with ``FileBasedWriteAheadLog(path, filesystem=layout.filesystem)``.

Used on both sides of the wire: the driver (checkpoint file, driver WAL, checking
the WAL handles receivers report), receiver tasks (their WAL) and batch read tasks
(reading blocks back from a receiver WAL).
"""

from __future__ import annotations

import functools
import logging
import os
import posixpath
import re
import uuid
from collections.abc import Mapping
from typing import Any

import pyarrow.fs as pafs

from spark_receivers.errors import WriteAheadLogError
from spark_receivers.wal.base import RecordHandle, confine_handle

__all__ = [
    "CHECKPOINT_FILE",
    "RECEIVED_BLOCK_METADATA",
    "RECEIVED_DATA",
    "CheckpointLayout",
    "resolve_filesystem",
]

log = logging.getLogger(__name__)

S3_ALIASES = ("s3a://", "s3n://")
"""Hadoop's names for S3 (what Spark users write): read as ``s3://``."""

CHECKPOINT_FILE = "checkpoint.json"
RECEIVED_BLOCK_METADATA = "receivedBlockMetadata"
STATE = "state"
RECEIVED_DATA = "receivedData"
JOB_ID_FILE = "job-id"


def resolve_filesystem(path_or_uri: str, what: str = "location") -> tuple[pafs.FileSystem, str]:
    """Return the ``pyarrow.fs`` filesystem of a local path or a URI, and the path on it.

    A string without ``://`` is a local path (made absolute); anything else goes
    through ``pyarrow.fs.FileSystem.from_uri``. ``what`` names the location in the
    error. Raises :class:`WriteAheadLogError` (chained) when the URI cannot be
    resolved, and for an empty string. Does no I/O for local paths; for a remote
    URI it builds a filesystem client (cheap, but not free: resolve once, reuse).
    """
    if not path_or_uri:
        msg = f"the {what} must be a non-empty path or URI, got {path_or_uri!r}"
        raise WriteAheadLogError(msg)
    if "://" not in path_or_uri:
        return pafs.LocalFileSystem(), os.path.abspath(path_or_uri)
    if path_or_uri.startswith(S3_ALIASES):
        path_or_uri = "s3://" + path_or_uri.split("://", 1)[1]
        _say_alias(re.sub(r"//[^/@]*@", "//", path_or_uri.split("?", 1)[0]))
    try:
        fs, path = pafs.FileSystem.from_uri(path_or_uri)
    except (ValueError, OSError) as e:  # pa.ArrowInvalid is a ValueError
        msg = f"cannot resolve the {what} {path_or_uri!r}: {e}"
        if path_or_uri.startswith("hdfs://"):
            msg += (
                "; HDFS needs libhdfs on the driver and every executor: set HADOOP_HOME "
                "(or ARROW_LIBHDFS_DIR) and CLASSPATH=$(hadoop classpath --glob) there "
                "(docs/deploy.md)"
            )
        raise WriteAheadLogError(msg) from e
    return fs, path


@functools.lru_cache(maxsize=16)
def _say_alias(uri: str) -> None:
    log.info("reading the s3a:// location as %s (pyarrow's S3 filesystem, not Hadoop's)", uri)


class CheckpointLayout:
    """The paths of one checkpoint directory, resolved once (see the module doc).

    Immutable after construction and thread-safe. Construction resolves the
    directory (no I/O for a local path; :class:`WriteAheadLogError` when a URI
    cannot be resolved); nothing is created on the filesystem.

    Example::

        layout = CheckpointLayout("s3://bucket/ckpt")
        log = FileBasedWriteAheadLog(layout.receiver_wal_dir(3), filesystem=layout.filesystem)
        handle = layout.confine_receiver_handle(info.wal_handle, 3)   # from the network
    """

    def __init__(self, checkpoint_dir: str, filesystem: pafs.FileSystem | None = None) -> None:
        """Resolve ``checkpoint_dir``; with ``filesystem`` it is taken as a path on it."""
        if not isinstance(checkpoint_dir, str) or not checkpoint_dir:
            msg = f"checkpoint_dir must be a non-empty path or URI, got {checkpoint_dir!r}"
            raise WriteAheadLogError(msg)
        self.checkpoint_dir = checkpoint_dir
        """The directory as given (a path or a URI)."""
        if filesystem is None:
            filesystem, root = resolve_filesystem(checkpoint_dir, "checkpoint directory")
        else:
            root = checkpoint_dir
        self.filesystem: pafs.FileSystem = filesystem
        """Where every path of this layout lives."""
        self.root: str = root.rstrip("/") or "/"
        """The checkpoint directory as a path on :attr:`filesystem`."""
        self.is_local: bool = isinstance(filesystem, pafs.LocalFileSystem)
        """True on the local filesystem (``os`` calls, fsync and atomic rename work)."""

    def __repr__(self) -> str:
        return f"CheckpointLayout({self.checkpoint_dir!r})"

    def _join(self, *parts: str) -> str:
        return posixpath.join(self.root, *parts)

    # --- the driver -------------------------------------------------------------

    @property
    def checkpoint_file(self) -> str:
        """``<root>/checkpoint.json``: the driver's batch state."""
        return self._join(CHECKPOINT_FILE)

    def checkpoint_temp_file(self) -> str:
        """A fresh ``<root>/.checkpoint.json.<hex>.tmp`` to write a checkpoint to, then rename."""
        return self._join(f".{CHECKPOINT_FILE}.{uuid.uuid4().hex}.tmp")

    def corrupt_checkpoint_file(self) -> str:
        """A fresh ``<root>/checkpoint.json.corrupt-<id>`` to move a corrupt checkpoint to."""
        return f"{self.checkpoint_file}.corrupt-{uuid.uuid4().hex[:8]}"

    @property
    def job_id_file(self) -> str:
        """``<root>/job-id``: the job's random id, written once (``driver/job_identity.py``)."""
        return self._join(JOB_ID_FILE)

    @property
    def driver_wal_dir(self) -> str:
        """``<root>/receivedBlockMetadata``: the driver WAL (block events)."""
        return self._join(RECEIVED_BLOCK_METADATA)

    def state_dir(self, name: str) -> str:
        """``<root>/state/<name>``: the saved states of one stateful stream."""
        if not name or "/" in name or name.startswith("."):
            msg = f"a state name must be a plain file name, got {name!r}"
            raise WriteAheadLogError(msg)
        return self._join(STATE, name)

    # --- the receivers --------------------------------------------------------------

    @property
    def received_data_dir(self) -> str:
        """``<root>/receivedData``: the parent of every receiver WAL."""
        return self._join(RECEIVED_DATA)

    def receiver_wal_dir(self, stream_id: int) -> str:
        """``<root>/receivedData/<stream_id>``: the receiver WAL of one stream."""
        if isinstance(stream_id, bool) or not isinstance(stream_id, int) or stream_id < 0:
            msg = f"stream_id must be an int >= 0, got {stream_id!r}"
            raise WriteAheadLogError(msg)
        return self._join(RECEIVED_DATA, str(stream_id))

    def confine_receiver_handle(
        self, handle: RecordHandle | Mapping[str, Any], stream_id: int
    ) -> RecordHandle:
        """Return the handle if it lies inside the receiver WAL of ``stream_id``; raise otherwise.

        For handles that came over the network (an ``AddBlock``, a batch's block
        list): batch readers open the file a handle names, so it must not point
        anywhere else (``..``, another stream, another directory). ``handle`` may
        be a :class:`RecordHandle` or its ``to_dict()`` form (validated first).
        Raises :class:`WriteAheadLogError` naming the path and the directory.
        """
        if not isinstance(handle, RecordHandle):
            handle = RecordHandle.from_dict(handle)
        return confine_handle(handle, self.receiver_wal_dir(stream_id))
