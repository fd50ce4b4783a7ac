"""The driver's parts, their start and stop order, and what fails the context: Spark's JobScheduler.

:class:`JobScheduler` owns the :class:`ReceivedBlockTracker` (and its block logs),
the tracker endpoint, the :class:`ReceiverTracker` with its launcher and outbox,
the :class:`JobGenerator`, the rate controllers, the checkpoint writer and the
listener bus. ``StreamingContext`` is only its public face.

**Start**, in this order:

1. the data sources are registered; the block tracker is built (a recovering
   driver replays its WAL; a fresh start drops the events of an older run);
2. the listener bus starts;
3. the tracker endpoint (Arrow Flight, authenticated) starts, with the tracker
   core, the launcher and the outbox behind it;
4. rate controllers join the bus (backpressure);
5. the job generator is built; a fresh start writes a first checkpoint;
6. ``on_streaming_started`` is posted;
7. the receivers are launched, then the timer starts — or, when recovering, the
   timer starts first (the batches to run again are allocated before any
   receiver runs, so they hold exactly what was logged), then the receivers;
8. the block reader is warmed up off the batch path.

**Stop**, graceful: (1) the receivers are told to stop; they push their last
blocks and deregister (waited for); (2) the job generator allocates every block
received, stops its timer and processes every queued batch; (3) the receivers
are released (they drop their blocks and their tasks end; a job that does not
end is cancelled); (4) the endpoint, the outbox, the block tracker's WAL, the
rate controllers and the bus close. Not graceful: the same, but nothing waits for
deregistration and queued batches are dropped.

**Failure**: a failed batch, a background thread that dies (the timer, a
receiver's launcher), or a receiver that failed more often than the restart
policy allows (``spark.receivers.receiver.maxRestarts`` within
``restartWindow``) calls :meth:`JobScheduler.fail`: the first cause is kept
and the context stops at once (``on_failure``), so ``await_termination``
raises it instead of the stream going quiet.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from spark_receivers.config import StreamingConfig
from spark_receivers.driver.block_log import OFFSET_MESSAGES, OffsetEndpoint, describe_streams
from spark_receivers.driver.checkpoint import Checkpoint, CheckpointStore
from spark_receivers.driver.job_generator import Blocks, JobGenerator, OutputOperation
from spark_receivers.driver.listener import BlockLostInfo, ListenerBus
from spark_receivers.driver.rate_controller import RateController
from spark_receivers.driver.rate_estimator import create_rate_estimator
from spark_receivers.driver.received_block_tracker import ReceivedBlockTracker, create_driver_wal
from spark_receivers.driver.receiver_launcher import ReceiverLauncher, task_specs
from spark_receivers.driver.receiver_metrics import ReceiverMetricsTracker
from spark_receivers.driver.receiver_outbox import ClientFactory, ReceiverOutbox
from spark_receivers.driver.receiver_tracker import ReceiverTracker
from spark_receivers.driver.restart_policy import RestartPolicy
from spark_receivers.driver.status import StreamingStatus
from spark_receivers.driver.stream_graph import StreamGraph
from spark_receivers.errors import RpcError, WriteAheadLogError
from spark_receivers.rpc import messages as m
from spark_receivers.rpc.transport import EndpointClient, FlightEndpoint
from spark_receivers.spark import block_source, stream_source
from spark_receivers.spark.block_fetch import lost_blocks_in
from spark_receivers.stream import ReceiverInputStream
from spark_receivers.util.clock import Clock
from spark_receivers.wal.layout import CheckpointLayout

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

log = logging.getLogger(__name__)

__all__ = ["JobScheduler", "LauncherFactory"]

LauncherFactory = Callable[..., ReceiverLauncher]
"""Makes the launcher: ``(sc, specs, restart_delay_ms, on_fatal, clock)``."""

WARM_UP_JOB_GROUP = "spark-receivers-warm-up"
OFFSET_STREAM_DRAIN_S = 0.5
"""How long a structured stream's receiver serves blocks after it stops when its blocks
are also in the receiver WAL (queries read them from there once it is gone)."""


class JobScheduler:
    """Runs the driver side of one streaming context; see the module doc.

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
        host: str,
        bus: ListenerBus,
        clock: Clock,
        on_failure: Callable[[], None],
        recovery: Checkpoint | None = None,
        launcher_factory: LauncherFactory | None = None,
        client_factory: ClientFactory | None = None,
    ) -> None:
        self._spark = spark
        self._launcher_factory = launcher_factory or ReceiverLauncher
        self._client_factory = client_factory or (lambda a: EndpointClient(a, self._secret))
        self._graph = graph
        self._interval_ms = batch_interval_ms
        self._config = config
        self._checkpoint_dir = config.checkpoint_dir or None
        self._layout = CheckpointLayout(self._checkpoint_dir) if self._checkpoint_dir else None
        self._secret = secret
        self._host = host
        self._bus = bus
        self._clock = clock
        self._on_failure = on_failure
        self._recovery = recovery
        self._lock = threading.Lock()
        self._error: BaseException | None = None
        self._empty: dict[int, DataFrame] = {}
        self._read_partitions = block_source.default_read_partitions(
            spark.sparkContext, len(graph.inputs), config.batch_read_partitions
        )
        self._started = False
        self._stopped = False
        self.rate_controllers: dict[int, RateController] = {}
        self.receiver_metrics = ReceiverMetricsTracker([s.stream_id for s in graph.inputs], clock)

    @property
    def error(self) -> BaseException | None:
        """The first cause the context failed with, if it did."""
        return self._error

    # --- start ----------------------------------------------------------------

    def start(self) -> None:
        """Start every part in the documented order; returns at once."""
        graph, cfg = self._graph, self._config
        block_source.register(self._spark)
        if graph.structured_ids:
            stream_source.register(self._spark)
        self.block_tracker = self._create_block_tracker()
        self._bus.start()
        self._outbox = ReceiverOutbox(self._client_factory)
        self._offsets = OffsetEndpoint(
            self.block_tracker.logs,
            describe_streams({r.stream_id: r for r in graph.receivers}),
            self._remove_blocks,
        )
        self._endpoint = FlightEndpoint(
            "receiver-tracker",
            self._host,
            self._secret,
            m.TRACKER_MESSAGES,
            self._dispatch,
            max_message_bytes=cfg.max_message_bytes,
        )
        overrides = {}
        if cfg.receiver_wal_enabled:
            # A structured stream's blocks are read whenever a query gets to them, from
            # the WAL once the receiver is gone: nothing to keep serving after a stop.
            overrides = {
                s: {"receiver_drain_timeout_s": OFFSET_STREAM_DRAIN_S} for s in graph.structured_ids
            }
        self.launcher = self._launcher_factory(
            self._spark.sparkContext,
            task_specs(
                graph.receivers,
                self._endpoint.address,
                self._secret,
                cfg.as_dict(),
                overrides,
                app_id=self._spark.sparkContext.applicationId,
            ),
            cfg.receiver_restart_delay_ms,
            self.fail,
            self._clock,
        )
        self.receiver_tracker = ReceiverTracker(
            graph.receivers,
            self.block_tracker,
            self._bus,
            self.launcher,
            self._outbox,
            self._clock,
            check_wal_handle=self._check_wal_handle if cfg.receiver_wal_enabled else None,
            restart_policy=RestartPolicy.of(cfg),
            on_fatal=self.fail,
        )
        if cfg.backpressure_enabled:
            self._start_rate_controllers()
        self._checkpoints = CheckpointStore(self._layout) if self._layout else None
        self.job_generator = JobGenerator(
            self._spark.sparkContext,
            self._interval_ms,
            self.block_tracker,
            self,
            self._bus,
            self._clock,
            cfg.concurrent_jobs,
        )
        graph.freeze("ACTIVE", self._read_batch, self._source_options)
        if self._checkpoints is not None and self._recovery is None:
            self.write_checkpoint(-1, [])
        # First on the bus, before any receiver can register.
        self._bus.post("on_streaming_started", self._clock.get_time_ms())
        if graph.receivers:
            self.launcher.wait_for_executors()
        if self._recovery is not None:
            self.job_generator.start(self._recovery)
            self.receiver_tracker.start()
        else:
            self.receiver_tracker.start()
            self.job_generator.start()
        self._started = True
        threading.Thread(
            target=self._warm_up_block_reader, name="block-reader-warm-up", daemon=True
        ).start()

    def _create_block_tracker(self) -> ReceivedBlockTracker:
        ids, offset_ids = [s.stream_id for s in self._graph.inputs], self._graph.structured_ids
        if not self._checkpoint_dir:
            return ReceivedBlockTracker(ids, clock=self._clock, offset_stream_ids=offset_ids)
        assert self._layout is not None
        wal = create_driver_wal(self._layout, self._config, self._clock)
        recover = self._recovery is not None
        if not recover:
            # A fresh start must not later replay the events of an older run: drop them.
            wal.clean(2**62, wait=True)
        return ReceivedBlockTracker(
            ids, wal, self._clock, recover=recover, offset_stream_ids=offset_ids
        )

    def _start_rate_controllers(self) -> None:
        cfg = self._config
        for stream_id in self._graph.batched_ids:
            estimator = create_rate_estimator(
                cfg.backpressure_rate_estimator,
                self._interval_ms,
                cfg.backpressure_pid_proportional,
                cfg.backpressure_pid_integral,
                cfg.backpressure_pid_derived,
                cfg.backpressure_pid_min_rate,
            )
            controller = RateController(
                stream_id, estimator, self._publish_rate, cfg.max_rate_or_none
            )
            self.rate_controllers[stream_id] = controller
            self._bus.add(controller)

    def _publish_rate(self, stream_id: int, rate: float) -> None:
        if not self._stopped:
            self.receiver_tracker.update_rate_limit(stream_id, rate)

    def _warm_up_block_reader(self) -> None:
        """Start the block reader's Python workers before the first batch needs them."""
        sc = self._spark.sparkContext
        try:
            sc.setJobGroup(WARM_UP_JOB_GROUP, "spark-receivers: warm up the block reader", True)
            block_source.warm_up(self._spark, self._read_partitions)
        except Exception as e:  # noqa: BLE001 - only a head start: batches work without it
            log.debug("block reader warm-up did not finish: %s", e)

    # --- the endpoint (gRPC threads) ---------------------------------------------

    def _dispatch(self, message: Any) -> Any:
        if isinstance(message, OFFSET_MESSAGES):
            return self._offsets.handle(message)
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
            "max_partitions": str(self._read_partitions),
        }
        if self._checkpoint_dir:
            options["checkpoint_dir"] = self._checkpoint_dir
        return options

    # --- batches (BatchHooks, batch threads) ------------------------------------------

    def _read_batch(
        self, stream: ReceiverInputStream, blocks: list[m.ReceivedBlockInfo]
    ) -> DataFrame:
        from pyspark.sql.pandas.types import from_arrow_schema

        if not blocks:
            df = self._empty.get(stream.stream_id)
            if df is None:
                schema = from_arrow_schema(stream.receiver.schema)
                df = self._empty[stream.stream_id] = self._spark.createDataFrame([], schema)
            return df
        return block_source.blocks_dataframe(
            self._spark,
            blocks,
            from_arrow_schema(stream.receiver.schema),
            self._secret,
            self._checkpoint_dir,
            self._read_partitions,
        )

    def generate_jobs(self, batch_time_ms: int, blocks: Blocks) -> list[OutputOperation]:
        """The batch's output operations (see :class:`StreamGraph`)."""
        return self._graph.generate_jobs(batch_time_ms, blocks)

    def batch_finished(self, batch_time_ms: int) -> None:
        """Forget the batch's DataFrames."""
        self._graph.forget(batch_time_ms)

    def batch_failed(self, batch_time_ms: int, error: BaseException) -> None:
        """Report the blocks the batch lost, then fail the context."""
        for block_id, stream_id, records, reason in lost_blocks_in(error):
            log.error(
                "batch %d lost block %s of stream %d (%d records)",
                batch_time_ms,
                block_id,
                stream_id,
                records,
            )
            self._bus.post(
                "on_block_lost", BlockLostInfo(batch_time_ms, stream_id, block_id, records, reason)
            )
        log.error("batch %d failed; stopping the streaming context", batch_time_ms)
        self.fail(error)

    def clean_after_batch(self, batch_time_ms: int, blocks: Blocks) -> None:
        """Drop the batch's blocks from their stores; clean the receivers' WALs."""
        self._remove_blocks([b for bs in blocks.values() for b in bs])
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
        """Stop every part in the documented order (see the module doc); once only."""
        with self._lock:
            if self._stopped or not self._started:
                self._stopped = True
                return
            self._stopped = True
        sc = self._spark.sparkContext
        sc.cancelJobGroup(WARM_UP_JOB_GROUP)
        tracker = self.receiver_tracker
        tracker.stop_receivers()
        if graceful and not tracker.wait_receivers_stopped(timeout_ms / 1000.0):
            log.warning("receivers did not deregister within %d ms", timeout_ms)
        self.job_generator.stop(graceful, timeout_ms)
        tracker.release_receivers()
        self.launcher.stop(self._config.receiver_stop_timeout_s)
        tracker.stop()
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
        return StreamingStatus(
            state=state,
            batch_interval_ms=self._interval_ms,
            receivers=tuple(tracker.receiver_statuses()),
            batches_completed=generator.batches_completed,
            last_completed_batch_ms=generator.last_completed_batch_ms,
            pending_batches_ms=tuple(generator.pending_batches()),
            records_received=tracker.records_received(),
            records_processed=generator.records_processed_by_batches,
            recovered_batches_ms=tuple(generator.recovered_batches),
            tracker_address=None if self._stopped else self._endpoint.address,
            failure=None if error is None else f"{type(error).__name__}: {error}",
            rate_limits={
                s: c.latest_rate for s, c in self.rate_controllers.items() if c.latest_rate
            },
        )
