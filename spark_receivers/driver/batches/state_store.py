"""The saved states of stateful streams (windows reduced incrementally, state by key).

One Arrow IPC file per saved state, ``<checkpoint_dir>/state/<name>/state-<time_ms>.arrow``
(``name``: the stream's name in its graph, the same for the same ``create_fn``), written
to a temporary file and renamed over (on object stores: the store's move), so a reader
sees a whole state or none. Spark writes the RDDs of a checkpointed DStream to the
checkpoint directory the same way, and forgets them once a newer checkpoint exists.

Thread-safety: writes and reads of one name are serialised by the caller (the stream).
"""

from __future__ import annotations

import logging
import posixpath
import re
import uuid

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.ipc as ipc

from spark_receivers.errors import CheckpointError
from spark_receivers.wal.layout import CheckpointLayout

log = logging.getLogger(__name__)

_STATE_FILE = re.compile(r"^state-(\d+)\.arrow$")


class StateStore:
    """Saves, lists and loads states under one checkpoint directory (see the module doc)."""

    def __init__(self, layout: CheckpointLayout) -> None:
        self._layout = layout
        self._fs = layout.filesystem

    def _times(self, name: str) -> list[int]:
        directory = self._layout.state_dir(name)
        try:
            infos = self._fs.get_file_info(pafs.FileSelector(directory, allow_not_found=True))
        except OSError as e:
            msg = f"could not list the saved states in {directory}: {e}"
            raise CheckpointError(msg) from e
        found = (_STATE_FILE.match(posixpath.basename(i.path)) for i in infos)
        return sorted(int(m.group(1)) for m in found if m)

    def _path(self, name: str, time_ms: int) -> str:
        return posixpath.join(self._layout.state_dir(name), f"state-{time_ms}.arrow")

    def save(self, name: str, time_ms: int, table: pa.Table, keep_after_ms: int) -> None:
        """Write the state of ``name`` at ``time_ms``; delete those before ``keep_after_ms``."""
        directory = self._layout.state_dir(name)
        tmp = posixpath.join(directory, f".state-{time_ms}.{uuid.uuid4().hex}.tmp")
        try:
            self._fs.create_dir(directory, recursive=True)
            with self._fs.open_output_stream(tmp) as out, ipc.new_file(out, table.schema) as w:
                w.write_table(table)
            self._fs.move(tmp, self._path(name, time_ms))
        except OSError as e:
            msg = f"could not save the state of {name} at {time_ms} in {directory}: {e}"
            raise CheckpointError(msg) from e
        for old in self._times(name):
            if old < keep_after_ms:
                try:
                    self._fs.delete_file(self._path(name, old))
                except OSError:
                    log.warning("could not delete the old state %s", self._path(name, old))

    def latest(self, name: str, at_most_ms: int) -> int | None:
        """The newest time at most ``at_most_ms`` with a saved state of ``name``."""
        times = [t for t in self._times(name) if t <= at_most_ms]
        return times[-1] if times else None

    def load(self, name: str, time_ms: int) -> pa.Table | None:
        """The state of ``name`` saved at ``time_ms``, or None when there is none."""
        path = self._path(name, time_ms)
        try:
            with self._fs.open_input_file(path) as f:
                return ipc.open_file(f).read_all()
        except FileNotFoundError:
            return None
        except (OSError, pa.ArrowInvalid) as e:
            msg = f"the saved state {path} cannot be read: {e}; delete it to recompute the state"
            raise CheckpointError(msg) from e
