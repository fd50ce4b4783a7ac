"""The driver's parts, their start and stop order, and what fails the context: Spark's JobScheduler.

:class:`JobScheduler` owns the :class:`ReceivedBlockTracker` (and its block logs),
the tracker endpoint, the :class:`ReceiverTracker` with its launcher and outbox,
the :class:`JobGenerator`, the rate controllers, the checkpoint writer and the
listener bus. ``StreamingContext`` is only its public face.

**Construction** makes every part and runs none: the data sources are registered,
the block tracker opened (a recovering driver replays its WAL), the tracker endpoint
bound but not serving (its address goes into the receivers' task specs), then the
launcher, the tracker core, the keepers' registry, the offset endpoint, the rate
controllers and the job generator; :meth:`JobScheduler.status` works from then on.
**Start** and **stop** follow the order docs/architecture.md gives, with its
reasons: start the bus, let the tracker endpoint serve (its handler's parts all
exist), start the rate controllers, write a first checkpoint; then keepers on every
executor, the batch path's warm-up (``driver/batches/batch_reader.py``: its one-time
costs are paid before the first batch time), the receivers and the timer. **Recovering**
from a checkpoint, the batches to redo and those of the down time are allocated first
(from the WAL, before any receiver of this run can add a block), then the receivers are
launched, and the queued batches run once every receiver started or failed to
(``spark.receivers.receiver.startTimeout`` at most): the receivers' tasks get their
task slots and CPU before the redone batches, not after them.
A graceful stop lets receivers that are still starting finish (within
``startTimeout`` of their launch), stops the receivers (they push their last blocks
and deregister), processes every block received, releases the receivers and keepers, then closes
the endpoint, the outbox, the WAL, the controllers and the bus; a stop that is not
graceful waits for no deregistration and drops the queued batches.

**Failure**: a failed batch, a background thread that dies (the timer, a
receiver's launcher), or a receiver failing more than ``maxRestarts`` times
within ``restartWindow`` calls :meth:`JobScheduler.fail`: the first cause is
kept, the context stops at once and ``await_termination`` raises it.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from spark_receivers.config import StreamingConfig
from spark_receivers.driver.backpressure.rate_controller import RateController, rate_controllers_for
from spark_receivers.driver.batches.batch_reader import WARM_UP_JOB_GROUP, BatchReader
from spark_receivers.driver.batches.checkpoint import Checkpoint, CheckpointStore, zero_time_of
from spark_receivers.driver.batches.job_generator import Blocks, JobGenerator, OutputOperation
from spark_receivers.driver.batches.received_block_tracker import open_block_tracker
from spark_receivers.driver.batches.state_store import StateStore
from spark_receivers.driver.batches.stream_graph import StreamGraph
from spark_receivers.driver.observe.listener import (
    BlockLost,
    BlockLostInfo,
    ListenerBus,
    StreamingStarted,
)
from spark_receivers.driver.observe.receiver_metrics import ReceiverMetricsTracker
from spark_receivers.driver.observe.status import StreamingStatus
from spark_receivers.driver.structured import OFFSET_MESSAGES, OffsetEndpoint, describe_streams
from spark_receivers.driver.tracking.block_keepers import (
    KEEPER_TRACKER_MESSAGES,
    BlockKeepers,
    KeeperStarter,
    keeper_starter,
)
from spark_receivers.driver.tracking.receiver_launcher import ReceiverLauncher, task_specs
from spark_receivers.driver.tracking.receiver_outbox import ClientFactory, ReceiverOutbox
from spark_receivers.driver.tracking.receiver_tracker import ReceiverTracker
from spark_receivers.driver.tracking.restart_policy import RestartPolicy
from spark_receivers.errors import RpcError, StateError, WriteAheadLogError
from spark_receivers.rpc import messages as m
from spark_receivers.rpc.hosts import EndpointNetwork
from spark_receivers.rpc.transport import EndpointClient, FlightEndpoint
from spark_receivers.spark import block_source, stream_source
from spark_receivers.spark.block_fetch import lost_blocks_in
from spark_receivers.spark.session_kind import spark_side
from spark_receivers.util.clock import Clock
from spark_receivers.wal.layout import CheckpointLayout

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

log = logging.getLogger(__name__)

__all__ = ["JobScheduler", "LauncherFactory"]

LauncherFactory = Callable[..., ReceiverLauncher]
"""Makes the launcher: ``(side, specs, restart_delay_ms, on_fatal, clock)`` (``side``: the
session's :class:`~spark_receivers.spark.session_kind.SparkSide`)."""

OFFSET_STREAM_DRAIN_S = 0.5
"""How long a structured stream's receiver serves blocks after it stops when its blocks
are also in the receiver WAL (queries read them from there once it is gone)."""


class JobScheduler:
    """Runs the driver side of one streaming context; see the module doc.

    Made whole: every part exists once the constructor returns (nothing runs yet);
    :meth:`start` starts them, once (docs/decisions/0017).
    ``on_failure()`` is called (on the failing thread) once, after the first
    :meth:`fail`; the context stops itself from it. ``launcher_factory`` and
    ``client_factory`` replace the Spark job launcher and the Flight clients of
    the receivers' outbox (tests run the scheduler without receivers' jobs).
    """

    def __init__(
        self,
        spark: SparkSession,
        graph: StreamGraph,
        batch_interval_ms: int,
        config: StreamingConfig,
        secret: str,
        host: str | EndpointNetwork,
        bus: ListenerBus,
        clock: Clock,
        on_failure: Callable[[], None],
        recovery: Checkpoint | None = None,
        launcher_factory: LauncherFactory | None = None,
        client_factory: ClientFactory | None = None,
    ) -> None:
        self._side = spark_side(spark)
        self._graph = graph
        self._interval_ms = batch_interval_ms
        self._config = cfg = config
        self._checkpoint_dir = config.checkpoint_dir or None
        self._layout = CheckpointLayout(self._checkpoint_dir) if self._checkpoint_dir else None
        self._secret = secret
        self._network = EndpointNetwork(host, host) if isinstance(host, str) else host
        self._bus = bus
        self._clock = clock
        self._on_failure = on_failure
        self._recovery = recovery
        self._lock = threading.Lock()
        self._error: BaseException | None = None
        self._started = False
        self._stopped = False
        self._stopping_at_once = False  # a stop with graceful=False has begun
        self._held: dict[int, Blocks] = {}
        """Completed batches whose blocks a window may still read, by batch time."""
        # Every part is made here, in the order each needs the ones before it; none
        # runs a thread or answers a call before start().
        if graph.structured_ids:
            stream_source.register(spark)
        self.block_tracker = open_block_tracker(
            [s.stream_id for s in graph.inputs],
            graph.structured_ids,
            self._layout,
            cfg,
            clock,
            recover=recovery is not None,
        )
        self._outbox = ReceiverOutbox(
            client_factory or (lambda address: EndpointClient(address, secret, tls=config.tls))
        )
        # Bound, so the receivers' task specs can name its address; it answers calls
        # only once start() gives it its handler (FlightEndpoint.serve).
        self._endpoint = FlightEndpoint(
            "receiver-tracker",
            self._network.bind_host,
            secret,
            m.TRACKER_MESSAGES,
            None,
            max_message_bytes=cfg.max_message_bytes,
            tls=cfg.tls,
            **self._network.endpoint_kwargs(),
        )
        address = self._endpoint.address
        # Local mode with batch.parquetSpool on: receivers spool Parquet, read by Spark's
        # own reader (decision 0026).
        parquet_spool = block_source.spark_reads_spool(self._side, cfg)
        self._batches = BatchReader(
            spark,
            secret,
            self._checkpoint_dir,
            block_source.default_read_partitions(
                self._side, len(graph.inputs), config.batch_read_partitions
            ),
            config.batch_cache,
            config.lost_block_policy,
            config.tls,
            # Left to its default, a small batch is read by fewer tasks (batch_reader.py).
            0 if config.batch_read_partitions else BatchReader.ROWS_PER_READ_TASK,
            tracker=address,
            parquet_spool=parquet_spool,
        )
        # A structured stream's blocks are read by its source's Python tasks, which map an
        # Arrow file and would have to decode a Parquet one: they stay Arrow files.
        overrides: dict[int, dict[str, Any]] = {
            s: {"batch_parquet_spool": False} for s in graph.structured_ids
        }
        if cfg.receiver_wal_enabled:
            # A structured stream's blocks are read whenever a query gets to them, from
            # the WAL once the receiver is gone: nothing to keep serving after a stop.
            for s in graph.structured_ids:
                overrides[s]["receiver_drain_timeout_s"] = OFFSET_STREAM_DRAIN_S
        self.launcher = (launcher_factory or ReceiverLauncher)(
            self._side,
            task_specs(
                graph.receivers,
                address,
                secret,
                {**cfg.as_dict(), "batch_parquet_spool": parquet_spool},
                overrides,
                app_id=self._side.app_id,
            ),
            cfg.receiver_restart_delay_ms,
            self.fail,
            clock,
        )
        self.receiver_tracker = ReceiverTracker(
            graph.receivers,
            self.block_tracker,
            bus,
            self.launcher,
            self._outbox,
            clock,
            check_wal_handle=self._check_wal_handle if cfg.receiver_wal_enabled else None,
            restart_policy=RestartPolicy.of(cfg),
            on_fatal=self.fail,
        )
        self.keepers = BlockKeepers(
            bus, self._outbox, self.launcher.alive_executors, self.block_tracker.batch_of, clock
        )
        self._keeper_starter: KeeperStarter | None = None
        if graph.receivers:
            self._keeper_starter = keeper_starter(
                self._side, graph.receivers, cfg, self.keepers, address, secret
            )
        self._offsets = OffsetEndpoint(
            self.block_tracker.logs,
            describe_streams({r.stream_id: r for r in graph.receivers}),
            self._remove_blocks,
        )
        self.receiver_metrics = ReceiverMetricsTracker([s.stream_id for s in graph.inputs], clock)
        self.rate_controllers: dict[int, RateController] = {}
        if cfg.backpressure_enabled:
            self.rate_controllers = rate_controllers_for(
                graph.batched_ids, cfg, batch_interval_ms, self._publish_rate
            )
        self._checkpoints = CheckpointStore(self._layout) if self._layout else None
        self.job_generator = JobGenerator(
            self._side, batch_interval_ms, self.block_tracker, self, bus, clock, cfg.concurrent_jobs
        )
        self.job_generator.remember_ms = graph.remember_ms
        graph.freeze(
            "ACTIVE",
            self._batches.read,
            self._source_options,
            self.block_tracker.get_blocks_of_batch,
            StateStore(self._layout) if self._layout else None,
            (cfg.block_store_budget_bytes, cfg.receiver_wal_enabled),
        )
        # Spark's zeroTime: the batch time before the first batch, kept by a restart.
        self.job_generator.on_first_batch = lambda t: graph.set_zero_time(t - batch_interval_ms)
        if recovery is not None:
            graph.set_zero_time(zero_time_of(recovery))

    @property
    def error(self) -> BaseException | None:
        """The first cause the context failed with, if it did."""
        return self._error

    # --- start ----------------------------------------------------------------

    def start(self) -> None:
        """Start the parts made at construction, in the documented order; returns at once."""
        graph, cfg = self._graph, self._config
        if self._started or self._stopped:
            msg = "cannot start the job scheduler: it was started or stopped already"
            raise StateError(msg)
        self._bus.start()
        self._endpoint.serve(self._dispatch)
        for controller in self.rate_controllers.values():
            controller.start()
            self._bus.add(controller)
        if self._checkpoints is not None and self._recovery is None:
            self.write_checkpoint(-1, [])
        # First on the bus, before any receiver can register.
        self._bus.post(StreamingStarted(self._clock.get_time_ms()))
        if graph.receivers:
            self.launcher.wait_for_executors()
            if self._keeper_starter is not None:
                self._keeper_starter.start()
        if graph.batched_ids:
            self._batches.warm_up(self._network, cfg.warm_up_timeout_s)
        if self._recovery is not None:
            hold = bool(graph.receivers) and cfg.receiver_start_timeout_s > 0
            self.job_generator.start(self._recovery, hold=hold)
            self.receiver_tracker.start()
            if hold:
                threading.Thread(
                    target=self._release_recovered_batches,
                    name="recovered-batches-release",
                    daemon=True,
                ).start()
        else:
            self.receiver_tracker.start()
            self.job_generator.start()
        self._started = True

    def _release_recovered_batches(self) -> None:
        """Let the redone batches run once every receiver started (or failed to)."""
        timeout_s = self._config.receiver_start_timeout_s
        if not self.receiver_tracker.wait_receivers_started(timeout_s):
            log.warning(
                "receivers %s did not start within %.0f s (%s): the batches to redo"
                " run without waiting for them",
                self.receiver_tracker.starting_receivers(),
                timeout_s,
                "spark.receivers.receiver.startTimeout",
            )
        self.job_generator.release()

    def _receiver_start_left_s(self) -> float:
        """What is left of ``startTimeout`` since the receivers were launched."""
        launched = self.receiver_tracker.started_at_ms
        if launched is None:
            return 0.0
        elapsed_s = (self._clock.get_time_ms() - launched) / 1000.0
        return max(0.0, self._config.receiver_start_timeout_s - elapsed_s)

    def _publish_rate(self, stream_id: int, rate: float) -> None:
        if not self._stopped:
            self.receiver_tracker.update_rate_limit(stream_id, rate)

    # --- the endpoint (gRPC threads) ---------------------------------------------

    def _dispatch(self, message: Any) -> Any:
        if isinstance(message, OFFSET_MESSAGES):
            return self._offsets.handle(message)
        if isinstance(message, KEEPER_TRACKER_MESSAGES):
            return self.keepers.handle(message)
        if isinstance(message, m.ReportReceiverMetrics):
            return self.receiver_metrics.handle(message)
        return self.receiver_tracker.handle(message)

    def _check_wal_handle(self, info: m.ReceivedBlockInfo) -> None:
        """Refuse a WAL handle outside ``<checkpoint_dir>/receivedData/<stream id>``.

        Batch readers open the file a handle names: one from the network must not
        point anywhere else (``..``, another stream, another directory).
        """
        assert self._layout is not None
        try:
            self._layout.confine_receiver_handle(info.wal_handle or {}, info.stream_id)
        except WriteAheadLogError as e:
            msg = f"block {info.block_id} has a bad WAL handle: {e}"
            raise RpcError(msg) from None

    def _source_options(self, stream_id: int) -> dict[str, str]:
        options = {
            "tracker": self._endpoint.address,
            block_source.SECRET_OPTION: self._secret,
            "stream_id": str(stream_id),
            "max_partitions": str(self._batches.read_partitions),
            **block_source.tls_options(self._config.tls),
        }
        if self._checkpoint_dir:
            options["checkpoint_dir"] = self._checkpoint_dir
        return options

    # --- batches (BatchHooks, batch threads) ------------------------------------------

    def generate_jobs(self, batch_time_ms: int, blocks: Blocks) -> list[OutputOperation]:
        """The batch's output operations (see :class:`StreamGraph`)."""
        return self._graph.generate_jobs(batch_time_ms, blocks)

    def batch_finished(self, batch_time_ms: int) -> None:
        """Forget the batch's DataFrames and drop the rows they kept."""
        self._graph.forget(batch_time_ms)
        self._batches.release_later(batch_time_ms)

    def batch_failed(self, batch_time_ms: int, error: BaseException) -> None:
        """Report the blocks the batch lost, then fail the context.

        A batch cut short by a stop at once (``graceful=False``: its blocks and
        keepers are released under it) is logged, not a failure of the context.
        """
        if self._stopping_at_once:
            first = str(error).strip().splitlines()[:1]
            log.warning(
                "batch %d did not finish: the context was stopped at once (%s)",
                batch_time_ms,
                first[0] if first else type(error).__name__,
            )
            return
        for block_id, stream_id, records, reason in lost_blocks_in(error):
            log.error(
                "batch %d lost block %s of stream %d (%d records)",
                batch_time_ms,
                block_id,
                stream_id,
                records,
            )
            lost = BlockLostInfo(batch_time_ms, stream_id, block_id, records, reason)
            self._bus.post(BlockLost(lost))
        log.error("batch %d failed; stopping the streaming context", batch_time_ms)
        self.fail(error)

    def clean_after_batch(self, batch_time_ms: int, blocks: Blocks) -> None:
        """Drop the blocks no window needs from their stores; clean the receivers' WALs.

        Without windows these are the batch's blocks; with windows, those of the batches
        older than the graph's ``remember_ms`` (the block tracker forgets the same
        batches, and the receivers' WALs are cleaned below its oldest block).
        """
        remember = self._graph.remember_ms
        if remember <= 0:
            self._remove_blocks([b for bs in blocks.values() for b in bs])
        else:
            with self._lock:
                self._held[batch_time_ms] = blocks
                done = [t for t in self._held if t <= batch_time_ms - remember]
                dropped = [self._held.pop(t) for t in sorted(done)]
            self._remove_blocks([b for d in dropped for bs in d.values() for b in bs])
        if self._config.receiver_wal_enabled:
            self._clean_receivers(batch_time_ms)

    def _remove_blocks(self, blocks: list[m.ReceivedBlockInfo]) -> None:
        if blocks:
            self.receiver_tracker.remove_blocks(blocks)

    def _clean_receivers(self, batch_time_ms: int) -> None:
        """Tell receivers to delete WAL segments no batch can need any more.

        The threshold is the oldest ``generated_ms`` of a block the driver still
        tracks (receivers stamp WAL records no earlier than that, in their own
        clock), capped at one batch interval before the completed batch.
        """
        threshold = batch_time_ms - self._interval_ms
        oldest = self.block_tracker.oldest_generated_ms_in_use()
        if oldest is not None:
            threshold = min(threshold, oldest)
        if threshold > 0:
            self.receiver_tracker.cleanup_old_blocks(threshold)

    def write_checkpoint(self, last_completed_ms: int, pending_ms: list[int]) -> None:
        """Write the checkpoint file (with a checkpoint directory)."""
        if self._checkpoints is None:
            return
        self._checkpoints.write(
            Checkpoint(
                batch_interval_ms=self._interval_ms,
                last_completed_batch_ms=last_completed_ms,
                pending_batch_ms=tuple(pending_ms),
                checkpoint_time_ms=self._clock.get_time_ms(),
                config=self._config.as_dict(),
                zero_time_ms=self._graph.zero_time_ms,
            )
        )

    def timer_died(self, error: BaseException) -> None:
        """No more batches would be generated: fail the context."""
        self.fail(error)

    # --- failure and stop -----------------------------------------------------------

    def fail(self, cause: BaseException) -> None:
        """Fail the context with ``cause`` (the first one wins) and stop it at once."""
        with self._lock:
            first = self._error is None
            if first:
                self._error = cause
        if first:
            log.error("the streaming context fails: %s", cause)
            self._on_failure()

    def stop(self, graceful: bool, timeout_ms: int) -> None:
        """Stop every part in the documented order (see the module doc); once only.

        A scheduler that never started (or whose start failed before the receivers and
        the timer) closes what its construction opened: the endpoint, the outbox, the
        driver WAL.
        """
        with self._lock:
            if self._stopped:
                return
            self._stopped = True
            self._stopping_at_once = not graceful
            started = self._started
        if not started:
            self._batches.close()
            if self._keeper_starter is not None:
                self._keeper_starter.stop()
            self._close()
            return
        self._side.cancel_job_group(WARM_UP_JOB_GROUP)
        tracker = self.receiver_tracker
        left_s = self._receiver_start_left_s() if graceful else 0.0
        if left_s > 0 and not tracker.wait_receivers_started(left_s):
            log.warning("receivers %s still starting at the stop", tracker.starting_receivers())
        tracker.stop_receivers()
        if graceful and not tracker.wait_receivers_stopped(timeout_ms / 1000.0):
            log.warning("receivers did not deregister within %d ms", timeout_ms)
        self.job_generator.stop(graceful, timeout_ms)
        self._batches.close()
        tracker.release_receivers()
        if self._keeper_starter is not None:
            self._keeper_starter.stop()
        self.keepers.release()
        self.launcher.stop(self._config.receiver_stop_timeout_s)
        tracker.stop()
        self._close()

    def _close(self) -> None:
        """The last steps of a stop: close the endpoint, the outbox, the WAL, the bus."""
        self._graph.stopped()
        self._endpoint.close()
        self._outbox.close()
        self.block_tracker.stop()
        for controller in self.rate_controllers.values():
            controller.stop()
        self._bus.stop()

    # --- views -----------------------------------------------------------------------

    def status(self, state: str) -> StreamingStatus:
        """A snapshot of where the stream stands (``state``: the context's)."""
        generator, tracker = self.job_generator, self.receiver_tracker
        error = self._error
        blocks_lost, records_lost = self.keepers.lost()
        return StreamingStatus(
            state=state,
            batch_interval_ms=self._interval_ms,
            receivers=tuple(tracker.receiver_statuses()),
            batches_completed=generator.batches_completed,
            last_completed_batch_ms=generator.last_completed_batch_ms,
            pending_batches_ms=tuple(generator.pending_batches()),
            records_received=tracker.records_received(),
            records_processed=max(0, generator.records_processed_by_batches - records_lost),
            recovered_batches_ms=tuple(generator.recovered_batches),
            tracker_address=None if self._stopped else self._endpoint.address,
            failure=None if error is None else f"{type(error).__name__}: {error}",
            rate_limits={
                s: c.latest_rate for s, c in self.rate_controllers.items() if c.latest_rate
            },
            block_copies=self.keepers.copies(),
            block_keepers=self.keepers.keepers(),
            blocks_lost=blocks_lost,
            records_lost=records_lost,
        )
