"""The storing half of a supervisor: records into blocks, blocks into stores, reports to the driver.

:class:`BlockPusher` is what :meth:`Receiver.store` reaches through the
supervisor: one record, many, or a whole Arrow/pandas block goes to the
:class:`~spark_receivers.receiver.block_generator.BlockGenerator` (cut into a block
per interval) or, reliably or with metadata, straight into a block of its own.
Each block is stored by the block handler (its keepers and replicas, the WAL)
and only then reported to the driver through the
:class:`~spark_receivers.receiver.block_reporter.BlockReporter`, naming every
copy; a block the driver refuses is removed from wherever it was put. No block
carries a record longer than ``max_record_bytes``: such rows are taken out before
the block is stored and handed to ``on_oversize`` (the receiver's bad-record
policy; :mod:`~spark_receivers.receiver.bad_records`).

Threads: the receiver's threads call the ``add_*``/``push_table`` methods;
the generator's pushing thread calls :meth:`BlockPusher.push_cut_block`; the
reporter's thread answers for each block.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

import pyarrow as pa

from spark_receivers.errors import ReceiverError
from spark_receivers.receiver.bad_records import DEFAULT_MAX_RECORD_BYTES, split_oversize
from spark_receivers.receiver.block import Block
from spark_receivers.receiver.block_generator import BlockGenerator
from spark_receivers.receiver.block_handler import BlockStoreResult, ReceivedBlockHandler
from spark_receivers.receiver.block_reporter import BlockReporter
from spark_receivers.receiver.rate_limiter import RateLimiter
from spark_receivers.receiver.schema import check_record, is_default, records_to_table, to_table
from spark_receivers.rpc import messages as m
from spark_receivers.util.clock import Clock

log = logging.getLogger(__name__)

__all__ = ["BlockPusher"]


class BlockPusher:
    """Stores one receiver's records as blocks and reports them; see the module doc.

    ``endpoint()`` names the supervisor's own server (the location of a block
    when the handler did not say where it put it); ``on_error(message, error)``
    is called on the reporter's thread when the driver refused a block the
    pushing thread did not wait for. :attr:`generator` is set by the supervisor
    once it made the block generator (which takes this pusher's block ids).
    """

    def __init__(
        self,
        stream_id: int,
        schema: pa.Schema,
        handler: ReceivedBlockHandler,
        reporter: BlockReporter,
        rate_limiter: RateLimiter,
        clock: Clock,
        endpoint: Callable[[], str],
        on_error: Callable[[str, BaseException], None],
        max_record_bytes: int = DEFAULT_MAX_RECORD_BYTES,
        on_oversize: Callable[[list[tuple[Any, int]], bool], None] | None = None,
    ) -> None:
        self.stream_id = stream_id
        self.max_record_bytes = max_record_bytes
        self._on_oversize = on_oversize
        self.handler = handler
        self.generator: BlockGenerator | None = None
        self._schema = schema
        self._default_schema = is_default(schema)
        self._reporter = reporter
        self._rate_limiter = rate_limiter
        self._clock = clock
        self._endpoint = endpoint
        self._on_error = on_error
        self._session = clock.get_time_ms()
        self._seq = itertools.count()
        self.records_stored = 0
        self.blocks_pushed = 0
        # pyarrow imports pandas on its first conversion of a Python list (~1 s under
        # the GIL): pay that here, not in the first block's push while the receiver stores.
        records_to_table([], schema)

    @property
    def session(self) -> int:
        """The supervisor session's id (its start time in ms): part of every block id."""
        return self._session

    def next_block_id(self) -> m.StreamBlockId:
        """The id of the next block of this supervisor session."""
        return m.StreamBlockId(self.stream_id, self._session, next(self._seq))

    def _gen(self) -> BlockGenerator:
        assert self.generator is not None, "the supervisor sets the block generator"
        return self.generator

    # --- what Receiver.store reaches -----------------------------------------------

    def add_record(
        self, record: Any, metadata: dict[str, Any] | None = None, reliable: bool = False
    ) -> None:
        """Store one record through the block generator (or as its own block if reliable)."""
        if not (self._default_schema and type(record) is str):
            check_record(record, self._schema)
        if reliable:
            self._push_records_now([record], metadata)
        elif metadata is None:
            self._gen().add_data(record)
        else:
            self._gen().add_data_with_callback(record, metadata)

    def add_records(
        self, records: list[Any], metadata: dict[str, Any] | None, reliable: bool
    ) -> None:
        """Store many records (one block of their own if reliable)."""
        if reliable or metadata is not None:
            for r in records:
                check_record(r, self._schema)
            self._push_records_now(records, metadata)
        elif self._default_schema:
            # Converting is the type check (in C); a failure names the bad record.
            self._gen().add_table(records_to_table(records, self._schema))
        else:
            for r in records:
                check_record(r, self._schema)
            self._gen().add_many(records)

    def push_table(self, data: Any, metadata: dict[str, Any] | None, reliable: bool) -> None:
        """Store an Arrow batch/table or a pandas frame.

        Through the block generator (one block per interval, tables joined without
        copying) unless ``reliable`` or with ``metadata``: then a block of its own.
        """
        table = to_table(data, self._schema)
        if table.num_rows == 0:
            return
        if not reliable and metadata is None:
            self._gen().add_table(table)
            return
        self._rate_limiter.acquire(table.num_rows)
        self.push_block(self.next_block_id(), table, metadata, self._clock.get_time_ms())

    def _push_records_now(self, records: list[Any], metadata: dict[str, Any] | None) -> None:
        if not records:
            return
        table = records_to_table(records, self._schema)
        self._rate_limiter.acquire(len(records))
        self.push_block(self.next_block_id(), table, metadata, self._clock.get_time_ms())

    # --- blocks ----------------------------------------------------------------------

    def push_cut_block(self, block: Block) -> None:
        """A block the generator cut: convert its records to Arrow, store and report it."""
        tables = [
            part if isinstance(part, pa.Table) else records_to_table(part, self._schema)
            for part in block.parts
        ]
        table = tables[0] if len(tables) == 1 else pa.concat_tables(tables)
        self.push_block(block.block_id, table, None, block.generated_ms, wait=False)

    def push_block(
        self,
        block_id: m.StreamBlockId,
        table: pa.Table,
        metadata: dict[str, Any] | None,
        generated_ms: int,
        wait: bool = True,
    ) -> None:
        """Store a block, then report it; ``wait``: until the driver accepted it (or raise).

        Without ``wait`` (the pusher) a failed report drops the block from where it
        was put and goes to ``on_error`` on the reporter's thread. Rows longer than
        ``max_record_bytes`` are not stored: they go to ``on_oversize(rows, not wait)``
        after the others (which may raise, under ``fail``, once those are stored).
        """
        table, oversize = split_oversize(table, self.max_record_bytes)
        if table.num_rows:
            self._store_and_report(block_id, table, metadata, generated_ms, wait)
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
    ) -> None:
        name = block_id.name
        # Raises (no AddBlock) when the block store or the WAL failed.
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
        )
        try:
            future = self._reporter.submit(info)
        except Exception:
            self.handler.remove_block(stored)
            raise
        future.add_done_callback(lambda f: self._reported(stored, table.num_rows, f, wait))
        if wait and not future.result():  # raises the call's error
            msg = f"Failed to add block {name} to receiver tracker"
            raise ReceiverError(msg)

    def _reported(
        self, stored: BlockStoreResult, rows: int, future: Future[bool], waited: bool
    ) -> None:
        """The driver answered for block ``stored`` (reporter thread)."""
        name = stored.block_id
        error = future.exception()
        if error is None and future.result():
            self.records_stored += rows
            self.blocks_pushed += 1
            return
        self.handler.remove_block(stored)
        if not waited:  # a waiting store raises the error itself
            why = error or ReceiverError(f"Failed to add block {name} to receiver tracker")
            log.error("block %s was not accepted by the driver: %s", name, why)
            self._on_error(f"Error in block pushing thread: {why}", why)
