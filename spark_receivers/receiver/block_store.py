"""The block store of one receiver task: blocks kept in memory, spilled to local disk.

Blocks are Arrow tables. With a level that uses disk (``MEMORY_AND_DISK``,
``MEMORY_AND_DISK_2``) a block that does not fit in ``memory_budget_bytes`` is
written to an Arrow IPC file in a local directory; with ``MEMORY_ONLY`` the
budget is not enforced. Thread-safe: the
pushing thread puts, Flight threads read, the control endpoint removes.
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
import threading
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.ipc as ipc

from spark_receivers.errors import BlockNotFoundError
from spark_receivers.receiver.block_spool import read_block_file
from spark_receivers.receiver.storage_level import StorageLevel

log = logging.getLogger(__name__)


@dataclass
class _Entry:
    table: pa.Table | None
    path: str | None
    generated_ms: int
    size_bytes: int
    num_rows: int
    owns_file: bool = True


class BlockStore:
    """Blocks by name, in memory or spilled to ``spill_dir``."""

    def __init__(
        self,
        storage_level: StorageLevel = StorageLevel.MEMORY_AND_DISK,
        memory_budget_bytes: int = 512 * 1024 * 1024,
        spill_dir: str | None = None,
    ) -> None:
        self._level = storage_level
        self._budget = memory_budget_bytes
        self._spill_root = spill_dir
        self._spill_dir: str | None = None
        self._blocks: dict[str, _Entry] = {}
        self._memory_bytes = 0
        self._disk_bytes = 0
        self._lock = threading.Lock()

    @property
    def memory_bytes(self) -> int:
        """Bytes of blocks held in memory."""
        return self._memory_bytes

    @property
    def disk_bytes(self) -> int:
        """Bytes of blocks spilled to local disk."""
        return self._disk_bytes

    def __len__(self) -> int:
        return len(self._blocks)

    def __contains__(self, name: object) -> bool:
        return name in self._blocks

    def put(
        self,
        name: str,
        table: pa.Table,
        generated_ms: int,
        use_disk: bool | None = None,
        file: str | None = None,
    ) -> int:
        """Store a block; return the bytes of memory it holds.

        ``use_disk`` overrides the store's level for this block (a keeper holds the
        blocks of receivers with different levels). A buffer the table references
        several times (a receiver storing slices of one batch, or the same batch
        twice) is counted once: this is the memory the block keeps alive, which is
        what the budget bounds. ``file``: an Arrow IPC file holding ``table`` already (a
        keeper's spool file), which its caller owns: a block that does not fit is kept
        as that file instead of being written again, and is not deleted with the block.
        """
        size = table.get_total_buffer_size()
        spill_ok = self._level.use_disk if use_disk is None else use_disk
        spill = spill_ok and self._memory_bytes + size > self._budget
        if spill and file is not None:
            entry = _Entry(None, file, generated_ms, size, table.num_rows, owns_file=False)
        elif spill:
            path = self._spill(name, table)
            entry = _Entry(None, path, generated_ms, size, table.num_rows)
        else:
            entry = _Entry(table, None, generated_ms, size, table.num_rows)
        self._insert(name, entry)
        return size

    def put_file(
        self, name: str, file: str, num_rows: int, size_bytes: int, generated_ms: int
    ) -> None:
        """Keep a block as ``file`` (a spool file its caller owns), decoded only when read.

        Counted with the bytes on disk: the store holds none of it in memory.
        """
        self._insert(name, _Entry(None, file, generated_ms, size_bytes, num_rows, owns_file=False))

    def get(self, name: str) -> pa.Table:
        """Return a block; raise :class:`BlockNotFoundError` when it is not here."""
        with self._lock:
            entry = self._blocks.get(name)
        if entry is None:
            msg = f"block {name} is not in this block store (already removed, or never stored)"
            raise BlockNotFoundError(msg)
        if entry.table is not None:
            return entry.table
        assert entry.path is not None
        return read_block_file(entry.path)

    def remove(self, names: list[str] | tuple[str, ...]) -> int:
        """Drop blocks by name; return how many were here."""
        n = 0
        with self._lock:
            for name in names:
                entry = self._blocks.pop(name, None)
                if entry is not None:
                    self._drop(entry)
                    n += 1
        return n

    def remove_older_than(self, threshold_ms: int) -> int:
        """Drop blocks generated before ``threshold_ms``; return how many."""
        with self._lock:
            old = [n for n, e in self._blocks.items() if e.generated_ms < threshold_ms]
        return self.remove(old)

    def clear(self) -> None:
        """Drop every block and the spill directory."""
        with self._lock:
            self._blocks.clear()
            self._memory_bytes = 0
            self._disk_bytes = 0
            spill, self._spill_dir = self._spill_dir, None
        if spill:
            shutil.rmtree(spill, ignore_errors=True)

    def _insert(self, name: str, entry: _Entry) -> None:
        """Keep ``entry`` as block ``name``, dropping a block of that name first; count it."""
        with self._lock:
            old = self._blocks.pop(name, None)
            if old is not None:
                self._drop(old)
            self._blocks[name] = entry
            if entry.table is not None:
                self._memory_bytes += entry.size_bytes
            else:
                self._disk_bytes += entry.size_bytes

    def _drop(self, entry: _Entry) -> None:
        if entry.table is not None:
            self._memory_bytes -= entry.size_bytes
            return
        self._disk_bytes -= entry.size_bytes
        if entry.path and entry.owns_file:
            try:
                os.remove(entry.path)
            except OSError:
                log.warning("could not remove spilled block file %s", entry.path, exc_info=True)

    def _spill(self, name: str, table: pa.Table) -> str:
        with self._lock:  # several threads may spill at once (a keeper's puts)
            if self._spill_dir is None:
                self._spill_dir = tempfile.mkdtemp(
                    prefix="spark-receivers-blocks-", dir=self._spill_root
                )
            spill_dir = self._spill_dir
        path = os.path.join(spill_dir, f"{name}.arrow")
        with pa.OSFile(path, "wb") as sink, ipc.new_file(sink, table.schema) as writer:
            writer.write_table(table)
        return path
