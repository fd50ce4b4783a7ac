"""The writing stage of a receiver's pipe: a block into its stores, then reported to the driver.

``Receiver.store → Intake → BlockGenerator → BlockWriter → BlockReporter`` (``receiver/pipe.py``).

A :class:`BlockWriter` is the generator's listener: the generator's pushing thread hands it
each cut block, which it turns into one Arrow table (lists of records converted once per
block, tables joined without copying), stores through its block handler and, once stored,
hands to the :class:`~spark_receivers.receiver.block_reporter.BlockReporter` naming every
copy. A block whose storing failed is never reported; a block the driver refuses is removed
from wherever it was put. No block carries a record longer than ``max_record_bytes``: such
rows are taken out before the block is stored and handed to ``on_oversize`` (the receiver's
bad-record policy: :class:`~spark_receivers.receiver.bad_records.OversizeRecords`). The
generator also hands it, on the storing thread, the blocks of their own (reliable stores,
stores with metadata or a position), and a reliable store waits for the driver's answer.

**Storing, one step with the writer.** The writer is given its handler at construction,
one of Spark's ``ReceivedBlockHandler`` pair:

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
  is removed from the sink and the call raises: the writer then sends no
  ``AddBlock`` and a ``store(..., reliable=True)`` raises to the receiver.

The receiver WAL lives in ``<checkpoint_dir>/receivedData/<stream_id>`` on any
``pyarrow.fs`` filesystem (``checkpoint_dir`` may be a URI such as
``s3://bucket/ckpt``; see :class:`~spark_receivers.wal.layout.CheckpointLayout`).
Blocks are written with :func:`~spark_receivers.wal.block_records.encode_block`;
:func:`~spark_receivers.wal.block_records.read_block_from_wal` is the reading side,
used by batch readers on executors.

Threads: :meth:`BlockWriter.write_cut` (``on_push_block``) on the generator's pushing
thread; :meth:`BlockWriter.write` (``on_own_block``) also on receivers' storing threads, so
a handler's ``store_block`` may run on several threads at once (the WAL serialises its
writes); the answers come on the reporter's thread. ``on_error(message, error)`` is told
(on the reporter's or pushing thread) of a block that failed without anyone waiting for it;
``on_fatal`` of the generator's death.
"""

from __future__ import annotations

import concurrent.futures as cf
import logging
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any, Protocol

import pyarrow as pa

from spark_receivers.config import StreamingConfig
from spark_receivers.errors import BlockStoreError, ConfigError, ReceiverError
from spark_receivers.receiver.bad_records import DEFAULT_MAX_RECORD_BYTES, split_oversize
from spark_receivers.receiver.block import Block
from spark_receivers.receiver.block_placement import BlockSink, Placed
from spark_receivers.receiver.block_reporter import BlockReporter
from spark_receivers.receiver.schema import records_to_table
from spark_receivers.rpc import messages as m
from spark_receivers.util import fault_plan
from spark_receivers.util.clock import Clock, SystemClock
from spark_receivers.wal.base import RecordHandle, WriteAheadLog
from spark_receivers.wal.block_records import encode_block
from spark_receivers.wal.file_log import FileBasedWriteAheadLog
from spark_receivers.wal.layout import CheckpointLayout

log = logging.getLogger(__name__)

__all__ = [
    "BlockStoreBasedBlockHandler",
    "BlockStoreResult",
    "BlockWriter",
    "ReceivedBlockHandler",
    "WriteAheadLogBasedBlockHandler",
]


@dataclass(frozen=True)
class BlockStoreResult:
    """What storing one block produced: size, records, where its copies are, WAL handle."""

    block_id: str
    num_records: int
    size_bytes: int
    wal_handle: dict[str, Any] | None = None
    locations: tuple[str, ...] = ()
    local_file: str | None = None


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
            block_id,
            table.num_rows,
            placed.size_bytes,
            locations=placed.locations,
            local_file=placed.local_file,
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
                direct_io=config.receiver_wal_direct_io,
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
            block_id,
            table.num_rows,
            placed.size_bytes,
            handle.to_dict(),
            placed.locations,
            placed.local_file,
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


class BlockWriter:
    """Stores blocks, then reports them; see the module doc. Thread-safe.

    ``endpoint()`` names the supervisor's own server, the location of a block when the
    handler did not say where it put it.
    """

    def __init__(
        self,
        stream_id: int,
        schema: pa.Schema,
        handler: ReceivedBlockHandler,
        reporter: BlockReporter,
        endpoint: Callable[[], str],
        on_error: Callable[[str, BaseException], None],
        on_fatal: Callable[[str, BaseException], None],
        *,
        max_record_bytes: int = DEFAULT_MAX_RECORD_BYTES,
        on_oversize: Callable[[list[tuple[Any, int]], bool], None] | None = None,
    ) -> None:
        self.stream_id = stream_id
        self.max_record_bytes = max_record_bytes
        self._on_oversize = on_oversize
        self.handler = handler
        self._schema = schema
        self._reporter = reporter
        self._endpoint = endpoint
        self._on_error = on_error
        self._on_fatal = on_fatal
        self.records_stored = 0
        """Records in the blocks the driver accepted."""
        self.blocks_pushed = 0
        """Blocks the driver accepted."""

    # --- BlockGeneratorListener ------------------------------------------------------------

    def on_add_data(self, data: Any, metadata: Any) -> None:
        """Nothing to do per record."""

    def on_generate_block(self, block_id: m.StreamBlockId) -> None:
        """Nothing to do when a block is cut."""

    def on_push_block(self, block: Block) -> None:
        """A block the generator cut (its pushing thread): :meth:`write_cut`."""
        self.write_cut(block)

    def on_own_block(
        self,
        block_id: m.StreamBlockId,
        table: pa.Table,
        metadata: dict[str, Any] | None,
        generated_ms: int,
        wait: bool,
        position: str | None,
    ) -> None:
        """A block of its own (the storing thread): :meth:`write`."""
        self.write(block_id, table, metadata, generated_ms, wait, position)

    def on_error(self, message: str, error: BaseException) -> None:
        """A cut block could not be stored: tell the driver."""
        self._on_error(message, error)

    def on_fatal(self, message: str, error: BaseException) -> None:
        """The generator died: the supervisor stops with its cause."""
        self._on_fatal(message, error)

    # --- blocks ------------------------------------------------------------------------------

    def write_cut(self, block: Block) -> None:
        """Convert a cut block to one Arrow table, store it and report it (no waiting)."""
        schema = self._schema
        tables = [
            part if isinstance(part, pa.Table) else records_to_table(part, schema)
            for part in block.parts
        ]
        table = tables[0] if len(tables) == 1 else pa.concat_tables(tables)
        self.write(block.block_id, table, None, block.generated_ms, wait=False)

    def write(
        self,
        block_id: m.StreamBlockId,
        table: pa.Table,
        metadata: dict[str, Any] | None,
        generated_ms: int,
        wait: bool = True,
        position: str | None = None,
    ) -> None:
        """Store a block, then report it; ``wait``: until the driver accepted it (or raise).

        ``position``: the source position the block's records cover (``store(position=...)``),
        reported with it.

        Raises when the block could not be stored (nothing is reported). Without ``wait`` a
        refused block is removed from where it was put and goes to ``on_error``. Rows longer
        than ``max_record_bytes`` are not stored: they go to ``on_oversize(rows, not wait)``
        after the others (which may raise, under ``fail``, once those are stored).
        """
        oversize: list[tuple[Any, int]] = []
        if table.nbytes > self.max_record_bytes:  # a smaller table holds no longer row
            table, oversize = split_oversize(table, self.max_record_bytes)
        if table.num_rows:
            self._store_and_report(block_id, table, metadata, generated_ms, wait, position)
        if oversize:
            if self._on_oversize is None:
                msg = f"{len(oversize)} record(s) longer than {self.max_record_bytes} bytes"
                raise ReceiverError(msg)
            self._on_oversize(oversize, not wait)

    def _store_and_report(
        self,
        block_id: m.StreamBlockId,
        table: pa.Table,
        metadata: dict[str, Any] | None,
        generated_ms: int,
        wait: bool,
        position: str | None,
    ) -> None:
        name = block_id.name
        stored = self.handler.store_block(name, table, generated_ms)
        first, *replicas = stored.locations or (self._endpoint(),)
        info = m.ReceivedBlockInfo(
            stream_id=self.stream_id,
            block_id=name,
            num_records=stored.num_records,
            generated_ms=generated_ms,
            store_endpoint=first,
            size_bytes=stored.size_bytes,
            wal_handle=stored.wal_handle,
            metadata=metadata,
            replica_endpoints=tuple(replicas),
            position=position,
            local_file=stored.local_file,
        )
        try:
            future = self._reporter.submit(info)
        except Exception:
            self.handler.remove_block(stored)
            raise
        future.add_done_callback(lambda f: self._settle(stored, f, wait))
        if wait and not future.result():  # raises the call's error
            msg = f"Failed to add block {name} to receiver tracker"
            raise ReceiverError(msg)

    def _settle(self, stored: BlockStoreResult, future: Future[bool], waited: bool) -> None:
        """The driver answered for block ``stored`` (the reporter's thread)."""
        error = future.exception()
        if error is None and future.result():
            self.records_stored += stored.num_records
            self.blocks_pushed += 1
            return
        self.handler.remove_block(stored)
        if not waited:  # a waiting store raises the error itself
            name = stored.block_id
            why = error or ReceiverError(f"Failed to add block {name} to receiver tracker")
            log.error("block %s was not accepted by the driver: %s", name, why)
            self._on_error(f"Error in block pushing thread: {why}", why)
