"""A receiver's pipe on the executor, built once: the stages in order, each given the next.

::

    Receiver.store(x)
      └─ Intake            tells the forms apart by the schema, checks them    (intake.py)
          └─ BlockGenerator  a block per interval, or a block of its own;   (block_generator.py)
              │              names blocks; rate limit; a full queue holds the receiver
              └─ BlockWriter   one Arrow table; stored by its block handler: (block_writer.py,
                               keeper put (+ replica) and WAL, in parallel    block_placement.py)
                  └─ BlockReporter  AddBlocks to the driver, several per call (block_reporter.py)

Data flows one way: each stage calls only the next, and no stage calls back into an
earlier one (a block the driver refused is removed by the writer, on the reporter's
answer). :class:`ReceiverPipe` builds the stages for one receiver and gives the supervisor
what it needs for the lifecycle only: start, drain on stop, close, the driver's commands
(``UpdateRateLimit``, ``CleanupOldBlocks``) and the metrics. The receiver is attached to
the intake; the supervisor never touches a stage (``tests/receiver/test_pipe.py`` checks
it imports none).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from spark_receivers.config import StreamingConfig
from spark_receivers.receiver.bad_records import OversizeRecords
from spark_receivers.receiver.block_generator import BlockGenerator
from spark_receivers.receiver.block_placement import (
    BlockSink,
    InProcessSink,
    KeeperHoldings,
    KeeperSink,
    effective_level,
    keeper_sink,
)
from spark_receivers.receiver.block_reporter import BlockReporter
from spark_receivers.receiver.block_store import BlockStore
from spark_receivers.receiver.block_writer import (
    BlockStoreBasedBlockHandler,
    BlockWriter,
    ReceivedBlockHandler,
    WriteAheadLogBasedBlockHandler,
)
from spark_receivers.receiver.intake import Intake
from spark_receivers.receiver.metrics import ReceiverMetrics, meter_wal
from spark_receivers.receiver.rate_limiter import RateLimiter
from spark_receivers.rpc import messages as m
from spark_receivers.util.clock import Clock

if TYPE_CHECKING:
    from spark_receivers.receiver.receiver import Receiver

__all__ = ["ReceiverPipe"]


class ReceiverPipe:
    """The stages of one receiver's pipe (see the module doc), for its supervisor.

    Built for ``receiver``: its schema, storage level, longest record and bad-record
    policy (records too long for a block go to it: ``bad_records.OversizeRecords``).
    ``tracker`` is the supervisor's client of the driver (``tracker.call(message)``);
    ``endpoint()`` is the supervisor's block server, which serves :attr:`block_store` (the
    task's own store, where blocks go with keepers off); ``on_error`` / ``on_fatal`` go to
    the supervisor (report an error to the driver / stop with the generator's cause).
    """

    def __init__(
        self,
        receiver: Receiver,
        stream_id: int,
        config: StreamingConfig,
        *,
        tracker: Any,
        endpoint: Callable[[], str],
        identity: tuple[str, str, str],
        metrics: ReceiverMetrics,
        clock: Clock,
        on_error: Callable[[str, BaseException], None],
        on_fatal: Callable[[str, BaseException], None],
    ) -> None:
        executor_id, host, secret = identity
        schema = receiver.schema
        level = receiver.storage_level
        self.storage_level = level = effective_level(level, config, stream_id, executor_id)
        """The level blocks are kept at (one copy with the receiver WAL on, as Spark)."""
        self.block_store = BlockStore(level, config.block_store_budget_bytes)
        sink: BlockSink = InProcessSink(self.block_store, endpoint)
        if config.block_keeper_enabled:
            sink = keeper_sink(stream_id, executor_id, host, secret, level, tracker, config)
        self._sink = sink
        self.handler: ReceivedBlockHandler
        if config.receiver_wal_enabled:
            self.handler = WriteAheadLogBasedBlockHandler(
                sink, stream_id, config.checkpoint_dir, config, clock
            )
        else:
            self.handler = BlockStoreBasedBlockHandler(sink)
        meter_wal(self.handler, metrics, clock)
        self.session = clock.get_time_ms()
        """The supervisor session's id (its start time in ms): part of every block id."""
        seq = itertools.count()

        def next_block_id() -> m.StreamBlockId:
            return m.StreamBlockId(stream_id, self.session, next(seq))

        max_record_bytes = (
            getattr(receiver, "max_record_bytes", None) or config.receiver_max_record_bytes
        )
        # Blocks are reported several per call when the driver is slow (block_reporter.py).
        self._reporter = BlockReporter(
            tracker.call, 2 * config.block_queue_size, name=f"block-reporter-{stream_id}"
        )
        self.writer = BlockWriter(
            stream_id,
            schema,
            self.handler,
            self._reporter,
            endpoint,
            on_error,
            on_fatal,
            max_record_bytes=max_record_bytes,
            on_oversize=OversizeRecords(receiver, max_record_bytes, f"receiver-{stream_id}-stop"),
        )
        initial = config.backpressure_initial_rate if config.backpressure_enabled else None
        self.rate_limiter = RateLimiter(config.max_rate_or_none, initial, clock=clock)
        generator = BlockGenerator(
            self.writer,
            next_block_id,
            config.block_interval_ms,
            config.block_queue_size,
            self.rate_limiter,
            clock,
            name=f"block-generator-{stream_id}",
        )
        self._generator = generator  # started and drained here; fed by the intake only
        self.intake = Intake(schema, generator)

    @property
    def uses_keepers(self) -> bool:
        """True when blocks go to block keepers (not the task's own store)."""
        return isinstance(self._sink, KeeperSink)

    def start_keeper(self) -> None:
        """Find or start this executor's block keeper (keepers on); raises if it cannot."""
        if isinstance(self._sink, KeeperSink):
            self._sink.start()

    def start(self) -> None:
        """Start cutting blocks (the generator's timer and pushing thread)."""
        self._generator.start()

    def stopping(self) -> None:
        """The supervisor stops: the last blocks go where they can, no new keeper starts."""
        if isinstance(self._sink, KeeperSink):
            self._sink.stopping()

    def drain(self, timeout_s: float) -> None:
        """Cut and write the last blocks, wait for the driver's answers; idempotent."""
        self._generator.stop()
        self._reporter.close(timeout_s)

    def close(self) -> None:
        """Release the handler's threads and files, and the sink's; idempotent."""
        self.handler.close()

    def update_rate(self, rate: float) -> None:
        """The driver's new rate limit."""
        self.intake.update_rate(rate)

    def cleanup_old_blocks(self, threshold_ms: int) -> None:
        """The driver's ``CleanupOldBlocks``: WAL segments older than ``threshold_ms``."""
        self.handler.cleanup_old_blocks(threshold_ms)

    def held(self) -> KeeperHoldings | None:
        """What this executor's keeper holds (keepers on), else None (the task's store)."""
        return self._sink.held() if isinstance(self._sink, KeeperSink) else None

    @property
    def waited_for_room_s(self) -> float:
        """Seconds stores were held by a full push queue, in all."""
        return self.intake.waited_for_room_s

    @property
    def records_stored(self) -> int:
        """Records in the blocks the driver accepted."""
        return self.writer.records_stored

    @property
    def blocks_pushed(self) -> int:
        """Blocks the driver accepted."""
        return self.writer.blocks_pushed
