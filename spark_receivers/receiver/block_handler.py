"""How a receiver task stores a block: in its block store, and in a write-ahead log.

Spark's ``ReceivedBlockHandler`` pair:

* :class:`BlockStoreBasedBlockHandler` puts the block in its
  :class:`~spark_receivers.receiver.block_placement.BlockSink` (the block keepers,
  with their replicas, or the task's own block store) and counts its records; a
  failed put raises.
* :class:`WriteAheadLogBasedBlockHandler` serializes the block once as Arrow IPC,
  then puts it in the sink and writes it to the receiver's write-ahead log
  **in parallel** (two threads), waiting for both up to ``block_store_timeout_s``.
  The result carries the WAL record handle, which travels to the driver in the
  block's ``ReceivedBlockInfo`` so that a batch can read the block from the WAL
  when its block stores are gone. If either side fails (or times out), the block
  is removed from the sink and the call raises: the supervisor then sends no
  ``AddBlock`` and a ``store(..., reliable=True)`` raises to the receiver.

The receiver WAL lives in ``<checkpoint_dir>/receivedData/<stream_id>`` on any
``pyarrow.fs`` filesystem (``checkpoint_dir`` may be a URI such as
``s3://bucket/ckpt``; see :class:`~spark_receivers.wal.layout.CheckpointLayout`).
Blocks are written with :func:`~spark_receivers.wal.block_records.encode_block`;
:func:`~spark_receivers.wal.block_records.read_block_from_wal` is the reading side,
used by batch readers on executors.

Thread-safety: ``store_block`` may be called from several threads at once (the
block pushing thread and receiver threads storing reliably); the WAL serialises
its writes.
"""

from __future__ import annotations

import concurrent.futures as cf
import logging
from dataclasses import dataclass
from typing import Any, Protocol

import pyarrow as pa

from spark_receivers.config import StreamingConfig
from spark_receivers.errors import BlockStoreError, ConfigError
from spark_receivers.receiver.block_placement import BlockSink, Placed
from spark_receivers.util import fault_plan
from spark_receivers.util.clock import Clock, SystemClock
from spark_receivers.wal.base import RecordHandle, WriteAheadLog
from spark_receivers.wal.block_records import encode_block
from spark_receivers.wal.file_log import FileBasedWriteAheadLog
from spark_receivers.wal.layout import CheckpointLayout

__all__ = [
    "BlockStoreBasedBlockHandler",
    "BlockStoreResult",
    "ReceivedBlockHandler",
    "WriteAheadLogBasedBlockHandler",
]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class BlockStoreResult:
    """What storing one block produced: size, records, where its copies are, WAL handle."""

    block_id: str
    num_records: int
    size_bytes: int
    wal_handle: dict[str, Any] | None = None
    locations: tuple[str, ...] = ()


class ReceivedBlockHandler(Protocol):
    """Stores blocks for a receiver and cleans what is old."""

    def store_block(self, block_id: str, table: pa.Table, generated_ms: int) -> BlockStoreResult:
        """Store a block; raise :class:`BlockStoreError` if it could not be stored."""
        ...

    def remove_block(self, result: BlockStoreResult) -> None:
        """Drop a stored block from wherever it was put (the driver did not take it)."""
        ...

    def cleanup_old_blocks(self, threshold_ms: int) -> None:
        """Drop stored data older than ``threshold_ms`` (WAL segments)."""
        ...

    def close(self) -> None:
        """Release threads and files; idempotent."""
        ...


class BlockStoreBasedBlockHandler:
    """Puts blocks in a block sink only (no write-ahead log)."""

    def __init__(self, sink: BlockSink) -> None:
        self.sink = sink

    def store_block(self, block_id: str, table: pa.Table, generated_ms: int) -> BlockStoreResult:
        """Put the block in the sink; raise :class:`BlockStoreError` (chained) on failure."""
        try:
            placed = self.sink.put(block_id, table, generated_ms)
        except Exception as e:
            msg = f"could not put block {block_id} ({table.num_rows} records) in the block store"
            raise BlockStoreError(msg) from e
        return BlockStoreResult(
            block_id, table.num_rows, placed.size_bytes, locations=placed.locations
        )

    def remove_block(self, result: BlockStoreResult) -> None:
        """Drop the block from where it was put."""
        self.sink.remove(result.block_id, result.locations)

    def cleanup_old_blocks(self, threshold_ms: int) -> None:
        """Nothing to do: blocks leave the store by id when their batch completed."""

    def close(self) -> None:
        """Release the sink."""
        self.sink.close()


class WriteAheadLogBasedBlockHandler:
    """Stores every block in the block store and the receiver WAL in parallel.

    ``wal`` replaces the log built from ``config`` (tests inject faulty ones).
    Records are stamped with the receiver's clock at write time, which is never
    before the block's ``generated_ms``, so that cleaning with a threshold at or
    below the oldest ``generated_ms`` the driver still needs keeps every needed
    record.
    """

    def __init__(
        self,
        sink: BlockSink,
        stream_id: int,
        checkpoint_dir: str,
        config: StreamingConfig,
        clock: Clock | None = None,
        wal: WriteAheadLog | None = None,
    ) -> None:
        if not checkpoint_dir:
            msg = (
                "Cannot enable receiver write-ahead log without checkpoint directory set: "
                "pass checkpoint_dir=... to StreamingContext"
            )
            raise ConfigError(msg)
        self.sink = sink
        self.stream_id = stream_id
        self.layout = CheckpointLayout(checkpoint_dir)
        self.log_dir = self.layout.receiver_wal_dir(stream_id)
        """The receiver WAL directory, a path on ``layout.filesystem``."""
        self._timeout_s = config.block_store_timeout_s
        self._clock = clock or SystemClock()
        if wal is None:
            wal = FileBasedWriteAheadLog(
                self.log_dir,
                filesystem=self.layout.filesystem,
                rolling_interval_s=config.receiver_wal_rolling_interval_s,
                max_failures=config.receiver_wal_max_failures,
                close_file_after_write=config.receiver_wal_close_file_after_write,
                fsync=config.receiver_wal_fsync,
                clock=self._clock,
                fsync_hook=fault_plan.wal_fsync_hook(config, stream_id),
            )
        self.wal = wal
        # Two workers: the store put and the WAL write of one block run side by side.
        # More concurrent blocks queue here; the WAL serialises its writes anyway.
        self._pool = cf.ThreadPoolExecutor(2, thread_name_prefix=f"receiver-{stream_id}-wal")
        self.blocks_stored = 0
        self.bytes_logged = 0

    def store_block(self, block_id: str, table: pa.Table, generated_ms: int) -> BlockStoreResult:
        """Store in the block store and the WAL in parallel; wait for both.

        Raises :class:`BlockStoreError` naming the block when either side failed
        or did not finish within ``block_store_timeout_s`` (the block is then
        removed from the store, so nothing half-stored is served or reported).
        """
        payload = encode_block(table)
        store_future: cf.Future[Placed] = self._pool.submit(
            self.sink.put, block_id, table, generated_ms
        )
        wal_future: cf.Future[RecordHandle] = self._pool.submit(
            self.wal.write, payload, max(generated_ms, self._clock.get_time_ms())
        )
        futures: list[cf.Future[Any]] = [store_future, wal_future]
        _, not_done = cf.wait(futures, timeout=self._timeout_s)
        failure: BaseException | None = None
        what = ""
        if not_done:
            what = f"not stored within block_store_timeout_s={self._timeout_s}"
            for f in not_done:
                f.cancel()
        else:
            for name, future in (("block store", store_future), ("write-ahead log", wal_future)):
                error = future.exception()
                if error is not None:
                    failure, what = error, f"the {name} failed: {error}"
                    break
        if what:
            self._discard(block_id, store_future)
            msg = f"block {block_id} ({table.num_rows} records) of stream {self.stream_id}: {what}"
            raise BlockStoreError(msg) from failure
        handle = wal_future.result()
        placed = store_future.result()
        self.blocks_stored += 1
        self.bytes_logged += len(payload)
        return BlockStoreResult(
            block_id, table.num_rows, placed.size_bytes, handle.to_dict(), placed.locations
        )

    def _discard(self, block_id: str, store_future: cf.Future[Placed]) -> None:
        def remove(future: cf.Future[Placed]) -> None:
            if future.cancelled() or future.exception() is not None:
                return
            try:
                self.sink.remove(block_id, future.result().locations)
            except Exception:
                log.warning("could not remove half-stored block %s", block_id, exc_info=True)

        # Removes now if the put finished, else as soon as it does.
        store_future.add_done_callback(remove)

    def remove_block(self, result: BlockStoreResult) -> None:
        """Drop the block from where it was put (its WAL record is cleaned by age)."""
        self.sink.remove(result.block_id, result.locations)

    def cleanup_old_blocks(self, threshold_ms: int) -> None:
        """Delete WAL segments whose records are all older than ``threshold_ms`` (async)."""
        self.wal.clean(threshold_ms, wait=False)

    def close(self) -> None:
        """Drop queued work, close the WAL (it waits for a write in progress); idempotent."""
        self._pool.shutdown(wait=False, cancel_futures=True)
        self.wal.close()
        self.sink.close()
