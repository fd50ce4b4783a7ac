"""The writing stage of a receiver's pipe: a block into its stores, then reported to the driver.

``Receiver.store → Intake → BlockGenerator → BlockWriter → BlockReporter`` (``receiver/pipe.py``).

A :class:`BlockWriter` is the generator's listener: the generator's pushing thread hands it
each cut block, which it turns into one Arrow table (lists of records converted once per
block, tables joined without copying), stores through its block handler — the keeper put
of this executor and, for a ``_2`` level, another's, and the receiver write-ahead log,
in parallel (``receiver/block_handler.py``) — and, once stored, hands to the
:class:`~spark_receivers.receiver.block_reporter.BlockReporter` naming every copy. A block
whose storing failed is never reported; a block the driver refuses is removed from
wherever it was put. No block carries a record longer than ``max_record_bytes``: such rows
are taken out before the block is stored and handed to ``on_oversize`` (the receiver's
bad-record policy; :mod:`~spark_receivers.receiver.bad_records`). The
:class:`~spark_receivers.receiver.intake.Intake` also gives it the blocks of reliable stores
and stores with metadata, and waits for their answer.

Threads: :meth:`BlockWriter.write_cut` (``on_push_block``) on the generator's pushing
thread; :meth:`BlockWriter.write` also on receivers' storing threads; the answers come on
the reporter's thread. ``on_error(message, error)`` is told (on the reporter's or pushing
thread) of a block that failed without anyone waiting for it; ``on_fatal`` of the
generator's death.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

import pyarrow as pa

from spark_receivers.errors import ReceiverError
from spark_receivers.receiver.bad_records import DEFAULT_MAX_RECORD_BYTES, split_oversize
from spark_receivers.receiver.block import Block
from spark_receivers.receiver.block_handler import BlockStoreResult, ReceivedBlockHandler
from spark_receivers.receiver.block_reporter import BlockReporter
from spark_receivers.receiver.schema import records_to_table
from spark_receivers.rpc import messages as m

log = logging.getLogger(__name__)

__all__ = ["BlockWriter"]


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
