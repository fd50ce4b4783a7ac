"""Runs one receiver inside its Spark task: blocks, block server, driver reports.

Spark's ReceiverSupervisor(Impl). States ``INITIALIZED`` → ``STARTED`` →
``STOPPED`` (the supervisor) and the same three for the receiver, which may
cycle between Started and Stopped while it restarts.

* ``start()``: start the block generator and the block server, register with
  the driver (a refusal stops the supervisor with the driver's message), then
  ``on_start`` (an exception there stops it with that error).
* ``stop(message, error)``: ``on_stop``, drain the block generator (its last
  blocks are pushed and reported), ``DeregisterReceiver`` (so a driver that saw every
  receiver deregister has every block), keep serving the blocks that batches
  have not read yet — until the driver removed them all, the driver sends
  ``ReleaseReceiver`` (no batch will read them), or ``receiver_drain_timeout_s``
  passes — then release :meth:`await_termination`, which re-raises the
  stopping error.

Its :class:`~spark_receivers.receiver.block_server.BlockServer` answers the
driver (``StopReceiver``, ``ReleaseReceiver``, ``CleanupOldBlocks``,
``RemoveBlocks``, ``UpdateRateLimit``) and serves blocks to batch readers
(Arrow Flight, authenticated).

Storing is its :class:`~spark_receivers.receiver.block_pusher.BlockPusher`'s job:
blocks go through a :mod:`~spark_receivers.receiver.block_handler` into a
:mod:`~spark_receivers.receiver.block_placement` sink — the block keeper of this
executor and, for a ``_2`` storage level, one on another executor (the task's own
block store when ``spark.receivers.blockKeeper.enabled`` is false) — and into the
receiver write-ahead log in parallel when ``receiver_wal_enabled`` (replication then
drops to 1, as in Spark). A block whose storing failed is never reported to the
driver; ``AddBlock`` names every copy.
"""

from __future__ import annotations

import contextlib
import enum
import json
import logging
import threading
import traceback
from collections.abc import Callable
from typing import Any

from spark_receivers.config import StreamingConfig
from spark_receivers.errors import BadRecordError, ReceiverError, StateError
from spark_receivers.receiver.bad_records import BadRecordPolicy, too_long
from spark_receivers.receiver.block import Block
from spark_receivers.receiver.block_generator import BlockGenerator
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
from spark_receivers.receiver.block_pusher import BlockPusher
from spark_receivers.receiver.block_reporter import BlockReporter
from spark_receivers.receiver.block_server import BlockServer, server_settings
from spark_receivers.receiver.block_store import BlockStore
from spark_receivers.receiver.metrics import (
    MeteredTrackerClient,
    MetricsReporter,
    ReceiverMetrics,
    meter_wal,
)
from spark_receivers.receiver.rate_limiter import RateLimiter
from spark_receivers.receiver.receiver import Receiver
from spark_receivers.receiver.schema import is_default
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

    Thread-safe. ``add_record``/``add_records``/``push_table`` (its
    :class:`~spark_receivers.receiver.block_pusher.BlockPusher`'s) are called by the
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
        self.storage_level = effective_level(receiver.storage_level, config, stream_id, executor_id)
        self.block_store = BlockStore(self.storage_level, config.block_store_budget_bytes)
        # Metrics are counted around the push path, not in it (receiver/metrics.py).
        self.metrics = ReceiverMetrics()
        self._tracker = MeteredTrackerClient(
            fault_plan.cut_client(
                EndpointClient(tracker_address, secret, tls=config.tls), config, stream_id
            ),
            self.metrics,
            self._clock,
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
        # Blocks are reported several per call when the driver is slow (block_reporter.py).
        self._reporter = BlockReporter(
            self._tracker.call, 2 * config.block_queue_size, name=f"block-reporter-{stream_id}"
        )
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
        self._pusher = pusher = BlockPusher(
            stream_id,
            receiver.schema,
            self.block_handler,
            self._reporter,
            self.rate_limiter,
            self._clock,
            lambda: self.endpoint,
            self.on_error,
            getattr(receiver, "max_record_bytes", None) or config.receiver_max_record_bytes,
            self._oversize,
        )
        self._generator = pusher.generator = BlockGenerator(
            self,
            pusher.next_block_id,
            config.block_interval_ms,
            config.block_queue_size,
            self.rate_limiter,
            self._clock,
            name=f"block-generator-{stream_id}",
        )
        meter_wal(self.block_handler, self.metrics, self._clock)
        interval_ms = config.metrics_report_interval_ms if config.metrics_enabled else 0
        self._metrics_reporter = MetricsReporter(
            self._metrics_report, self._tracker.call, interval_ms, self._clock,
            name=f"receiver-{stream_id}-metrics",
        )  # fmt: skip
        self._lock = threading.RLock()
        self._state = SupervisorState.INITIALIZED
        self._receiver_state = SupervisorState.INITIALIZED
        self._terminated = threading.Event()
        self._stopping_error: BaseException | None = None
        self._stop_message = ""
        # What Receiver.store reaches (block_pusher.py); one str with the default schema
        # goes straight to the generator.
        self.add_record = pusher.add_record
        self.add_records = pusher.add_records
        self.push_table = pusher.push_table
        self.add_text: Callable[[str], None] | None = (
            self._generator.add_data if is_default(receiver.schema) else None
        )
        receiver._attach(self, stream_id)

    # --- lifecycle ----------------------------------------------------------

    @property
    def records_stored(self) -> int:
        """Records in the blocks the driver accepted."""
        return self._pusher.records_stored

    @property
    def blocks_pushed(self) -> int:
        """Blocks the driver accepted."""
        return self._pusher.blocks_pushed

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
        self._metrics_reporter.start()
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

    def _stop_receiver(
        self,
        message: str,
        error: BaseException | None,
        drain: Callable[[], None] | None = None,
    ) -> None:
        """``on_stop``, then ``drain()`` if given, then ``DeregisterReceiver``."""
        with self._lock:
            if self._receiver_state is not SupervisorState.STARTED:
                return
            self._receiver_state = SupervisorState.STOPPED
        log.info("stopping receiver %s: %s", self.stream_id, message)
        try:
            self.receiver.on_stop()
        except Exception:
            log.exception("receiver %s failed in on_stop", self.stream_id)
        if drain is not None:
            drain()
        try:
            bad = isinstance(error, BadRecordError)  # for good: a restart would meet it again
            self._tracker.call(
                m.DeregisterReceiver(self.stream_id, message, describe_error(error), bad)
            )
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
        # Every block reported before the deregistration: a driver stopping gracefully
        # processes what its receivers reported once they have all deregistered.
        self._stop_receiver(message, error, drain=self._drain)
        self._drain()  # a receiver that never started did not drain above
        self._metrics_reporter.stop()  # the final totals, with the last blocks
        self._server.linger(self.config.receiver_drain_timeout_s)
        self._server.close()
        self.block_store.clear()
        self.block_handler.close()
        self._tracker.close()
        self._terminated.set()

    def _drain(self) -> None:
        """Push the generator's last blocks and wait for the driver's answers; idempotent."""
        self._generator.stop()
        self._reporter.close(self.config.receiver_drain_timeout_s)

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

    def _metrics_report(self) -> m.ReportReceiverMetrics:
        # With block keepers the blocks are in this executor's keeper (shared by its
        # receivers), not in the task's own store.
        sink = self._sink
        held = sink.held() if isinstance(sink, KeeperSink) else self.block_store
        return self.metrics.report(
            self.stream_id,
            self._pusher.session,
            self.executor_id,
            self.rate_limiter,
            self._generator.waited_for_room_s,
            self.receiver,
            held,
        )

    def _oversize(self, rows: list[tuple[Any, int]], pushing_thread: bool) -> None:
        """Records too long for a block: the receiver's bad-record policy, one by one.

        On the pushing thread a ``fail`` must not stop the receiver there (stopping
        drains the generator, which waits for that very thread): it runs on its own.
        """
        limit = self._pusher.max_record_bytes
        for record, size in rows:
            value = record if isinstance(record, str | bytes) else json.dumps(record, default=str)
            reason = f"a record of {too_long(size, limit)}"
            if pushing_thread and self.receiver.bad_record_policy is BadRecordPolicy.FAIL:
                name = f"receiver-{self.stream_id}-stop"
                threading.Thread(
                    target=self._fail_on, args=(value, reason), name=name, daemon=True
                ).start()
                return
            self.receiver.handle_bad_record(value, reason)  # raises under "fail"

    def _fail_on(self, value: str | bytes, reason: str) -> None:
        with contextlib.suppress(BadRecordError):
            self.receiver.handle_bad_record(value, reason)  # stops the receiver for good

    # --- BlockGeneratorListener -------------------------------------------------

    def on_add_data(self, data: Any, metadata: Any) -> None:
        """Records added with metadata need no per-record callback here."""

    def on_generate_block(self, block_id: m.StreamBlockId) -> None:
        """Nothing to do when a block is cut."""

    def on_push_block(self, block: Block) -> None:
        """Store and report a cut block (the pusher thread)."""
        self._pusher.push_cut_block(block)

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
