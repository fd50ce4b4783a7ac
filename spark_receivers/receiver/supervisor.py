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

The supervisor keeps the lifecycle only: what ``Receiver.store`` hands over flows
through the receiver's :class:`~spark_receivers.receiver.pipe.ReceiverPipe` —
intake, block generator, block writer (keeper put and WAL), block reporter — which the
supervisor starts, drains and closes, and never calls into otherwise. A block whose
storing failed is never reported to the driver; ``AddBlock`` names every copy.
"""

from __future__ import annotations

import enum
import logging
import threading
import traceback
from collections.abc import Callable
from typing import Any

from spark_receivers.config import StreamingConfig
from spark_receivers.errors import BadRecordError, ReceiverError, StateError
from spark_receivers.receiver.block_server import BlockServer, server_settings
from spark_receivers.receiver.metrics import MeteredTrackerClient, MetricsReporter, ReceiverMetrics
from spark_receivers.receiver.pipe import ReceiverPipe
from spark_receivers.receiver.receiver import Receiver
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

    Thread-safe. What the receiver stores does not pass here: :meth:`Receiver.store` hands
    it to the pipe's :class:`~spark_receivers.receiver.intake.Intake`.
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
        # Metrics are counted around the pipe, not in it (receiver/metrics.py).
        self.metrics = ReceiverMetrics()
        self._tracker = MeteredTrackerClient(
            fault_plan.cut_client(
                EndpointClient(tracker_address, secret, tls=config.tls), config, stream_id
            ),
            self.metrics,
            self._clock,
        )
        self.pipe = pipe = ReceiverPipe(
            receiver,
            stream_id,
            config,
            tracker=self._tracker,
            endpoint=lambda: self.endpoint,
            identity=(executor_id, host, secret),
            metrics=self.metrics,
            clock=self._clock,
            on_error=self.report_error,
            on_fatal=self._on_fatal,
        )
        self.rate_limiter = pipe.rate_limiter
        self.storage_level = pipe.storage_level
        self.block_store = pipe.block_store
        self._server = BlockServer(
            stream_id,
            host,
            secret,
            self.block_store,
            stop=lambda message: self.stop(message, None),
            cleanup=pipe.cleanup_old_blocks,
            update_rate=pipe.update_rate,
            max_message_bytes=config.max_message_bytes,
            refuse=fault_plan.cut_check(config, stream_id),
            **server_settings(config, host),
        )
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
        # The receiver stores into the pipe's intake; it asks this supervisor for its lifecycle.
        receiver._attach(self, stream_id, pipe.intake)

    @property
    def block_handler(self) -> Any:
        """How blocks are stored (the pipe's writer stage): keepers or the task's store, WAL."""
        return self.pipe.handler

    # --- lifecycle ----------------------------------------------------------

    @property
    def records_stored(self) -> int:
        """Records in the blocks the driver accepted."""
        return self.pipe.records_stored

    @property
    def blocks_pushed(self) -> int:
        """Blocks the driver accepted."""
        return self.pipe.blocks_pushed

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
        try:
            self.pipe.start_keeper()
        except Exception as e:  # noqa: BLE001 - the supervisor stops with the cause
            threading.Thread(
                target=self.stop, args=("Could not start the block keeper", e), daemon=True
            ).start()
            return
        self.pipe.start()
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
        self.pipe.stopping()
        # Every block reported before the deregistration: a driver stopping gracefully
        # processes what its receivers reported once they have all deregistered.
        self._stop_receiver(message, error, drain=self._drain)
        self._drain()  # a receiver that never started did not drain above
        self._metrics_reporter.stop()  # the final totals, with the last blocks
        self._server.linger(self.config.receiver_drain_timeout_s)
        self._server.close()
        self.block_store.clear()
        self.pipe.close()
        self._tracker.close()
        self._terminated.set()

    def _drain(self) -> None:
        """Write the pipe's last blocks and wait for the driver's answers; idempotent."""
        self.pipe.drain(self.config.receiver_drain_timeout_s)

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

    def accepted_position(self) -> str | None:
        """Ask the driver for the last source position it accepted for this stream."""
        reply = self._tracker.call(m.GetAcceptedPosition(self.stream_id))
        if reply is not None and not isinstance(reply, str):
            msg = f"GetAcceptedPosition got a malformed reply {reply!r:.100}"
            raise ReceiverError(msg)
        return reply

    def _metrics_report(self) -> m.ReportReceiverMetrics:
        # With block keepers the blocks are in this executor's keeper (shared by its
        # receivers), not in the task's own store.
        held = self.pipe.held()
        return self.metrics.report(
            self.stream_id,
            self.pipe.session,
            self.executor_id,
            self.rate_limiter,
            self.pipe.waited_for_room_s,
            self.receiver,
            held if held is not None else self.block_store,
        )

    def _on_fatal(self, message: str, error: BaseException) -> None:
        """The pipe's block generator died: stop with its cause (the task fails, is relaunched).

        Runs on the generator's dying thread; the stop runs on a thread of its own (it
        joins the generator's threads).
        """
        threading.Thread(
            target=self.stop,
            args=(message, error),
            name=f"receiver-{self.stream_id}-stop",
            daemon=True,
        ).start()
