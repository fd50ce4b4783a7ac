"""Runs one receiver inside its Spark task: blocks, block server, driver reports.

Spark's ReceiverSupervisor(Impl). States ``INITIALIZED`` → ``STARTED`` →
``STOPPED`` (the supervisor) and the same three for the receiver, which may
cycle between Started and Stopped while it restarts.

* ``start()``: start the block generator and the block server, register with
  the driver (a refusal stops the supervisor with the driver's message), then
  ``on_start`` (an exception there stops it with that error).
* ``stop(message, error)``: ``on_stop``, ``DeregisterReceiver``, drain the block
  generator (its last blocks are pushed), keep serving the blocks that batches
  have not read yet — until the driver removed them all, the driver sends
  ``ReleaseReceiver`` (no batch will read them), or ``receiver_drain_timeout_s``
  passes — then release :meth:`await_termination`, which re-raises the
  stopping error.

Its :class:`~spark_receivers.receiver.block_server.BlockServer` answers the
driver (``StopReceiver``, ``ReleaseReceiver``, ``CleanupOldBlocks``,
``RemoveBlocks``, ``UpdateRateLimit``) and serves blocks to batch readers
(Arrow Flight, authenticated).

Blocks are stored through a :mod:`~spark_receivers.receiver.block_handler`
into a :mod:`~spark_receivers.receiver.block_placement` sink — the block keeper
of this executor and, for a ``_2`` storage level, one on another executor (the
task's own block store when ``spark.receivers.blockKeeper.enabled`` is false) —
and into the receiver write-ahead log in parallel when ``receiver_wal_enabled``
(replication then drops to 1, as in Spark). A block whose storing failed is
never reported to the driver; ``AddBlock`` names every copy.
"""

from __future__ import annotations

import enum
import itertools
import logging
import threading
import traceback
from collections.abc import Callable
from typing import Any

import pyarrow as pa

from spark_receivers.config import StreamingConfig
from spark_receivers.errors import ReceiverError, StateError
from spark_receivers.receiver.block_generator import Block, BlockGenerator
from spark_receivers.receiver.block_handler import (
    BlockStoreBasedBlockHandler,
    ReceivedBlockHandler,
    WriteAheadLogBasedBlockHandler,
)
from spark_receivers.receiver.block_placement import (
    BlockSink,
    InProcessSink,
    KeeperSink,
    effective_level,
    keeper_sink,
)
from spark_receivers.receiver.block_server import BlockServer, server_settings
from spark_receivers.receiver.block_store import BlockStore
from spark_receivers.receiver.rate_limiter import RateLimiter
from spark_receivers.receiver.receiver import Receiver
from spark_receivers.receiver.schema import check_record, is_default, records_to_table, to_table
from spark_receivers.rpc import messages as m
from spark_receivers.rpc.transport import EndpointClient
from spark_receivers.util import fault_plan
from spark_receivers.util.clock import Clock, SystemClock

log = logging.getLogger(__name__)


class SupervisorState(enum.Enum):
    """Lifecycle of a supervisor (and of its receiver)."""

    INITIALIZED = 0
    STARTED = 1
    STOPPED = 2


def describe_error(error: BaseException | None) -> str:
    """The text of an error with its stack, as sent to the driver ('' for None)."""
    if error is None:
        return ""
    return "".join(traceback.format_exception(error)).strip()


class ReceiverSupervisor:
    """Supervises one receiver in its task; see the module doc for the lifecycle.

    Thread-safe. ``add_record``/``add_records``/``push_table`` are called by the
    receiver's threads through :meth:`Receiver.store`.
    """

    def __init__(
        self,
        receiver: Receiver,
        stream_id: int,
        tracker_address: str,
        secret: str,
        config: StreamingConfig,
        host: str,
        executor_id: str,
        clock: Clock | None = None,
        app_id: str = "",
    ) -> None:
        self.receiver = receiver
        self.app_id = app_id
        """The Spark application id ('' if unknown): with the config, what names the job."""
        self.stream_id = stream_id
        self.config = config
        self.executor_id = executor_id
        self.host = host
        self._clock = clock or SystemClock()
        self._session = self._clock.get_time_ms()
        self._seq = itertools.count()
        self._schema = receiver.schema
        self._default_schema = is_default(self._schema)
        self.storage_level = effective_level(receiver.storage_level, config, stream_id)
        self.block_store = BlockStore(self.storage_level, config.block_store_budget_bytes)
        self._tracker = fault_plan.cut_client(
            EndpointClient(tracker_address, secret, tls=config.tls), config, stream_id
        )
        sink: BlockSink = InProcessSink(self.block_store, lambda: self.endpoint)
        if config.block_keeper_enabled:
            sink = keeper_sink(
                stream_id, executor_id, host, secret, self.storage_level, self._tracker, config
            )
        self._sink = sink
        self.block_handler: ReceivedBlockHandler
        if config.receiver_wal_enabled:
            self.block_handler = WriteAheadLogBasedBlockHandler(
                sink, stream_id, config.checkpoint_dir, config, self._clock
            )
        else:
            self.block_handler = BlockStoreBasedBlockHandler(sink)
        self._server = BlockServer(
            stream_id,
            host,
            secret,
            self.block_store,
            stop=lambda message: self.stop(message, None),
            cleanup=self.block_handler.cleanup_old_blocks,
            update_rate=lambda rate: self._generator.update_rate(rate),
            max_message_bytes=config.max_message_bytes,
            refuse=fault_plan.cut_check(config, stream_id),
            **server_settings(config, host),
        )
        initial = config.backpressure_initial_rate if config.backpressure_enabled else None
        self.rate_limiter = RateLimiter(config.max_rate_or_none, initial, clock=self._clock)
        self._generator = BlockGenerator(
            self,
            self._next_block_id,
            config.block_interval_ms,
            config.block_queue_size,
            self.rate_limiter,
            self._clock,
            name=f"block-generator-{stream_id}",
        )
        self._lock = threading.RLock()
        self._state = SupervisorState.INITIALIZED
        self._receiver_state = SupervisorState.INITIALIZED
        self._terminated = threading.Event()
        self._stopping_error: BaseException | None = None
        self._stop_message = ""
        self.records_stored = 0
        self.blocks_pushed = 0
        # Receiver.store of one str with the default schema goes straight here.
        self.add_text: Callable[[str], None] | None = (
            self._generator.add_data if self._default_schema else None
        )
        # pyarrow imports pandas on its first conversion of a Python list (~1 s under
        # the GIL): pay that here, not in the first block's push while the receiver stores.
        records_to_table([], self._schema)
        receiver._attach(self, stream_id)

    # --- lifecycle ----------------------------------------------------------

    @property
    def endpoint(self) -> str:
        """``host:port`` of this supervisor's block/control server."""
        return self._server.address

    def start(self) -> None:
        """Start generators, register, start the receiver (see the module doc)."""
        with self._lock:
            if self._state is not SupervisorState.INITIALIZED:
                msg = (
                    f"cannot start the supervisor of stream {self.stream_id} "
                    f"in state {self._state.name}"
                )
                raise StateError(msg)
            self._state = SupervisorState.STARTED
        if isinstance(self._sink, KeeperSink):
            try:
                self._sink.start()
            except Exception as e:  # noqa: BLE001 - the supervisor stops with the cause
                threading.Thread(
                    target=self.stop, args=("Could not start the block keeper", e), daemon=True
                ).start()
                return
        self._generator.start()
        self._start_receiver()

    def _start_receiver(self) -> None:
        with self._lock:
            if self._state is SupervisorState.STOPPED:
                return
            try:
                ok = self._tracker.call(
                    m.RegisterReceiver(
                        self.stream_id,
                        type(self.receiver).__name__,
                        self.host,
                        self.executor_id,
                        self.endpoint,
                    )
                )
            except Exception as e:  # noqa: BLE001 - the supervisor stops with the cause
                threading.Thread(
                    target=self.stop, args=("Error registering receiver", e), daemon=True
                ).start()
                return
            if not ok:
                msg = (
                    "Registered unsuccessfully because Driver refused to start receiver "
                    f"{self.stream_id}"
                )
                threading.Thread(target=self.stop, args=(msg, None), daemon=True).start()
                return
            self._receiver_state = SupervisorState.STARTED
        log.info("starting receiver %s (%s)", self.stream_id, type(self.receiver).__name__)
        try:
            self.receiver._import_requirements()  # a missing library: MissingDependencyError
            self.receiver.on_start()
        except Exception as e:
            log.exception("receiver %s failed in on_start", self.stream_id)
            threading.Thread(
                target=self.stop, args=("Error starting receiver", e), daemon=True
            ).start()

    def _stop_receiver(self, message: str, error: BaseException | None) -> None:
        with self._lock:
            if self._receiver_state is not SupervisorState.STARTED:
                return
            self._receiver_state = SupervisorState.STOPPED
        log.info("stopping receiver %s: %s", self.stream_id, message)
        try:
            self.receiver.on_stop()
        except Exception:
            log.exception("receiver %s failed in on_stop", self.stream_id)
        try:
            self._tracker.call(m.DeregisterReceiver(self.stream_id, message, describe_error(error)))
        except Exception:
            log.warning("could not deregister receiver %s", self.stream_id, exc_info=True)

    def stop(self, message: str, error: BaseException | None = None) -> None:
        """Stop for good: the receiver, then the generator (drained), then the task."""
        with self._lock:
            if self._state is SupervisorState.STOPPED:
                return
            self._state = SupervisorState.STOPPED
            self._stopping_error = error
            self._stop_message = message
        if isinstance(self._sink, KeeperSink):
            self._sink.stopping()
        self._stop_receiver(message, error)
        self._generator.stop()
        self._server.linger(self.config.receiver_drain_timeout_s)
        self._server.close()
        self.block_store.clear()
        self.block_handler.close()
        self._tracker.close()
        self._terminated.set()

    def restart_receiver(
        self, message: str, error: BaseException | None, delay_ms: int | None
    ) -> None:
        """Stop the receiver, wait, start it again; returns at once."""
        delay = self.config.receiver_restart_delay_ms if delay_ms is None else delay_ms

        def run() -> None:
            self._stop_receiver(message, error)
            if not self._terminated.wait(delay / 1000.0):
                self._start_receiver()

        threading.Thread(target=run, name=f"receiver-{self.stream_id}-restart", daemon=True).start()

    def await_termination(self, timeout_s: float | None = None) -> bool:
        """Wait until stopped; re-raise the stopping error. Return False on timeout."""
        if not self._terminated.wait(timeout_s):
            return False
        if self._stopping_error is not None:
            msg = f"receiver {self.stream_id} stopped: {self._stop_message}"
            raise ReceiverError(msg) from self._stopping_error
        return True

    def is_receiver_started(self) -> bool:
        """True while the receiver is started."""
        return self._receiver_state is SupervisorState.STARTED

    def is_receiver_stopped(self) -> bool:
        """True once the receiver stopped (also during a restart's delay)."""
        return self._receiver_state is SupervisorState.STOPPED

    def report_error(self, message: str, error: BaseException | None) -> None:
        """Send ``ReportError`` to the driver (logged if the driver cannot be reached)."""
        try:
            self._tracker.call(m.ReportError(self.stream_id, message, describe_error(error)))
        except Exception:
            log.warning(
                "could not report error of receiver %s: %s", self.stream_id, message, exc_info=True
            )

    # --- storing --------------------------------------------------------------

    def add_record(
        self, record: Any, metadata: dict[str, Any] | None = None, reliable: bool = False
    ) -> None:
        """Store one record through the block generator (or as its own block if reliable)."""
        if not (self._default_schema and type(record) is str):
            check_record(record, self._schema)
        if reliable:
            self._push_records_now([record], metadata)
        elif metadata is None:
            self._generator.add_data(record)
        else:
            self._generator.add_data_with_callback(record, metadata)

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
            table = records_to_table(records, self._schema)
            self._generator.add_table(table)
        else:
            for r in records:
                check_record(r, self._schema)
            self._generator.add_many(records)

    def push_table(self, data: Any, metadata: dict[str, Any] | None, reliable: bool) -> None:
        """Store an Arrow batch/table or a pandas frame.

        Through the block generator (one block per interval, tables joined without
        copying) unless ``reliable`` or with ``metadata``: then a block of its own.
        """
        table = to_table(data, self._schema)
        if table.num_rows == 0:
            return
        if not reliable and metadata is None:
            self._generator.add_table(table)
            return
        self.rate_limiter.acquire(table.num_rows)
        self._push_block(self._next_block_id(), table, metadata, self._clock.get_time_ms())

    def _push_records_now(self, records: list[Any], metadata: dict[str, Any] | None) -> None:
        if not records:
            return
        table = records_to_table(records, self._schema)
        self.rate_limiter.acquire(len(records))
        self._push_block(self._next_block_id(), table, metadata, self._clock.get_time_ms())

    def _next_block_id(self) -> m.StreamBlockId:
        return m.StreamBlockId(self.stream_id, self._session, next(self._seq))

    def _push_block(
        self,
        block_id: m.StreamBlockId,
        table: pa.Table,
        metadata: dict[str, Any] | None,
        generated_ms: int,
    ) -> None:
        name = block_id.name
        # Raises (no AddBlock) when the block store or the WAL failed.
        stored = self.block_handler.store_block(name, table, generated_ms)
        first, *replicas = stored.locations or (self.endpoint,)
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
            ok = self._tracker.call(m.AddBlock(info))
        except Exception:
            self.block_handler.remove_block(stored)
            raise
        if not ok:
            self.block_handler.remove_block(stored)
            msg = f"Failed to add block {name} to receiver tracker"
            raise ReceiverError(msg)
        self.records_stored += table.num_rows
        self.blocks_pushed += 1

    # --- BlockGeneratorListener -------------------------------------------------

    def on_add_data(self, data: Any, metadata: Any) -> None:
        """Records added with metadata need no per-record callback here."""

    def on_generate_block(self, block_id: m.StreamBlockId) -> None:
        """Nothing to do when a block is cut."""

    def on_push_block(self, block: Block) -> None:
        """Convert the cut records to Arrow, store and report them."""
        tables = [
            part if isinstance(part, pa.Table) else records_to_table(part, self._schema)
            for part in block.parts
        ]
        table = tables[0] if len(tables) == 1 else pa.concat_tables(tables)
        self._push_block(block.block_id, table, None, block.generated_ms)

    def on_error(self, message: str, error: BaseException) -> None:
        """A block could not be pushed: tell the driver."""
        self.report_error(message, error)

    def on_fatal(self, message: str, error: BaseException) -> None:
        """The block generator died: stop with its cause, so the task fails and is relaunched.

        Runs on the generator's dying thread; the stop runs on a thread of its own
        (it joins the generator's threads).
        """
        threading.Thread(
            target=self.stop,
            args=(message, error),
            name=f"receiver-{self.stream_id}-stop",
            daemon=True,
        ).start()
