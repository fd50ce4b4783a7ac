"""Turns time into batches: allocate blocks, run the output operations, clean up.

Spark's JobGenerator (the job scheduler around it is ``driver/job_scheduler.py``).
A timer on the injected clock ticks at every multiple of the batch interval;
each tick allocates the received blocks to a batch and queues it;
``concurrent_jobs`` threads (1 by default) run the queued batches in order.
What a batch is made of and what happens around it is asked of the
:class:`BatchHooks` (the job scheduler): its output operations, what to do when
it failed, the cleanup after it (its blocks dropped from the receivers' stores,
old receiver WAL segments deleted) and the checkpoint. When a batch completes
the block tracker forgets it.

Threads: the timer thread allocates and queues; batch threads run the user's
output operations (which submit Spark jobs); listener events go to the bus. If
the timer thread dies, :meth:`BatchHooks.timer_died` is told the cause (batches
would otherwise silently stop).

Checkpoints are written after every batch is generated and after every batch
completes, before its cleanup, so a
recovered driver never takes a completed batch for pending nor cleans what a
pending batch needs. :meth:`JobGenerator.start` with a checkpoint restarts as
Spark's JobGenerator does: the batches that were pending and those that were
allocated but not completed run again (allocation is a no-op for them, so they
keep their logged blocks), then the batches of the down time, then the timer
continues on the grid. Every one of them is allocated in :meth:`JobGenerator.start`,
before any receiver of the new run exists, so none gets a block of the new run; with
``hold=True`` they then wait, queued, until :meth:`JobGenerator.release` (the job
scheduler releases them once the receivers started: the receivers' tasks do not wait
behind them for a task slot and CPU).
"""

from __future__ import annotations

import logging
import threading
import time
import traceback
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, replace
from typing import Any, Protocol

from spark_receivers.driver.batches.checkpoint import Checkpoint
from spark_receivers.driver.batches.received_block_tracker import ReceivedBlockTracker
from spark_receivers.driver.observe.listener import (
    MAX_METADATA_PER_STREAM,
    BatchCompleted,
    BatchInfo,
    BatchStarted,
    BatchSubmitted,
    ListenerBus,
    OutputOperationCompleted,
    OutputOperationInfo,
    OutputOperationStarted,
    StreamInputInfo,
)
from spark_receivers.rpc.messages import ReceivedBlockInfo
from spark_receivers.spark.session_kind import SparkSide, spark_side
from spark_receivers.util.clock import Clock
from spark_receivers.util.timer import RecurringTimer

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class OutputOperation:
    """One output operation of a batch: ``run()`` submits its Spark jobs."""

    id: int
    name: str
    run: Callable[[], None]


Blocks = dict[int, list[ReceivedBlockInfo]]


class BatchHooks(Protocol):
    """What the job generator asks of its owner (the job scheduler) around each batch.

    Every hook runs on a batch thread but ``write_checkpoint`` (also the timer
    thread) and ``timer_died`` (the dying timer thread); none may raise except
    ``generate_jobs`` (a raise fails the batch).
    """

    def generate_jobs(self, batch_time_ms: int, blocks: Blocks) -> list[OutputOperation]:
        """The batch's output operations, bound to its DataFrames."""
        ...

    def batch_failed(self, batch_time_ms: int, error: BaseException) -> None:
        """An output operation (or building the batch) failed with ``error``."""
        ...

    def batch_finished(self, batch_time_ms: int) -> None:
        """The batch ended (completed or failed): forget its DataFrames."""
        ...

    def clean_after_batch(self, batch_time_ms: int, blocks: Blocks) -> None:
        """The batch completed: drop its blocks from their stores, clean old WAL data."""
        ...

    def write_checkpoint(self, last_completed_ms: int, pending_ms: list[int]) -> None:
        """Record which batches completed and which are pending (may do nothing)."""
        ...

    def timer_died(self, error: BaseException) -> None:
        """The timer thread dies of ``error``: no more batches will be generated."""
        ...


class JobGenerator:
    """Generates and runs one batch per batch interval; see the module doc."""

    def __init__(
        self,
        sc: SparkSide | Any,
        batch_interval_ms: int,
        block_tracker: ReceivedBlockTracker,
        hooks: BatchHooks,
        bus: ListenerBus,
        clock: Clock,
        concurrent_jobs: int = 1,
    ) -> None:
        self._side = spark_side(sc)
        self.batch_interval_ms = batch_interval_ms
        self._block_tracker = block_tracker
        self._hooks = hooks
        self._bus = bus
        self._clock = clock
        self._checkpoint_lock = threading.Lock()
        self.recovered_batches: list[int] = []
        self._timer = RecurringTimer(
            clock, batch_interval_ms, self._generate, "job-generator", on_error=hooks.timer_died
        )
        self._executor = ThreadPoolExecutor(concurrent_jobs, thread_name_prefix="streaming-batch")
        self._lock = threading.Condition()
        self._pending: dict[int, Future[None]] = {}
        self._released = threading.Event()
        self._released.set()
        self._dropping = False  # a stop at once: held batches are dropped, not run
        self._last_completed_ms = -1
        self._failed: set[int] = set()
        """Batches that failed in this run: pending for the checkpoint and for cleanup, so
        that a restart runs them again even when later batches completed."""
        self.drain_timeout_s = 3600.0
        self.batches_completed = 0
        self.records_processed_by_batches = 0
        self.remember_ms = 0
        """How long completed batches stay allocated for windows (Spark's rememberDuration)."""
        self.on_first_batch: Callable[[int], None] | None = None
        """Told the time of the first batch of a fresh start, before the timer starts."""

    @property
    def last_completed_batch_ms(self) -> int:
        """The newest batch time whose processing completed (-1 before any)."""
        return self._last_completed_ms

    def start(self, recovery: Checkpoint | None = None, hold: bool = False) -> int:
        """Start the timer; return the first batch time (on the batch grid).

        With ``recovery`` (a checkpoint read back by ``get_or_create``) first
        allocate and queue the batches to run again and those of the down time (see
        the module doc); the timer then starts at the first grid time after now.
        ``hold``: queued batches run only after :meth:`release` (or a stop).
        """
        if hold:
            self._released.clear()
        if recovery is None:
            now = self._clock.get_time_ms()
            first_ms = (now // self.batch_interval_ms + 1) * self.batch_interval_ms
            if self.on_first_batch is not None:
                self.on_first_batch(first_ms)
            return self._timer.start(first_ms)
        interval = self.batch_interval_ms
        now = self._clock.get_time_ms()
        restart_ms = (now // interval + 1) * interval
        last_completed = recovery.last_completed_batch_ms
        self._last_completed_ms = last_completed
        allocated = self._block_tracker.allocated_batch_times()
        # Every batch pending at the checkpoint (one that failed may be older than the
        # last completed one: later batches completed while the context was failing).
        rerun = set(recovery.pending_batch_ms)
        rerun.update(t for t in allocated if t > last_completed)
        # Every grid time after the newest batch the checkpoint or the WAL knows.
        known = max([last_completed, *recovery.pending_batch_ms, *allocated])
        if known < 0:  # no batch ever ran: the down time starts at the checkpoint
            known = recovery.checkpoint_time_ms // interval * interval
        first_down = (known // interval + 1) * interval
        down = list(range(first_down, restart_ms, interval))
        times = sorted(rerun | set(down))
        log.info(
            "restarting batches: %d to run again %s, %d for the down time, timer from %d",
            len(rerun),
            sorted(rerun),
            len(down),
            restart_ms,
        )
        self.recovered_batches = times
        for t in times:
            self._generate(t)
        return self._timer.start(restart_ms)

    def release(self) -> None:
        """Let the queued batches run (after ``start(hold=True)``); idempotent."""
        self._released.set()

    def _write_checkpoint(self) -> None:
        with self._checkpoint_lock:
            with self._lock:
                last = self._last_completed_ms
                pending = sorted(self._pending.keys() | self._failed)
            try:
                self._hooks.write_checkpoint(last, pending)
            except Exception:
                log.exception("could not write the checkpoint (last completed batch %d)", last)

    def _generate(self, batch_time_ms: int) -> None:
        try:
            self._block_tracker.allocate_blocks_to_batch(batch_time_ms)
            blocks = self._block_tracker.get_blocks_of_batch(batch_time_ms)
        except Exception:
            log.exception("could not allocate blocks to batch %d", batch_time_ms)
            return
        inputs = {s: stream_input_info(s, bs) for s, bs in blocks.items()}
        info = BatchInfo(
            batch_time_ms=batch_time_ms,
            num_records_per_stream={s: i.num_records for s, i in inputs.items()},
            submission_time_ms=self._clock.get_time_ms(),
            stream_input_info=inputs,
        )
        self._bus.post(BatchSubmitted(info))
        with self._lock:
            self._pending[batch_time_ms] = self._executor.submit(self._run_batch, info, blocks)
        self._write_checkpoint()

    def _run_batch(self, info: BatchInfo, blocks: dict[int, list[ReceivedBlockInfo]]) -> None:
        t = info.batch_time_ms
        self._released.wait()
        if self._dropping:
            with self._lock:
                self._pending.pop(t, None)
                self._lock.notify_all()
            log.info("batch %d dropped: the context stopped at once before it ran", t)
            return
        info = replace(info, processing_start_time_ms=self._clock.get_time_ms())
        self._bus.post(BatchStarted(info))
        failure: BaseException | None = None
        op_infos: dict[int, OutputOperationInfo] = {}
        self._side.set_job_group(f"spark-receivers-batch-{t}", describe_batch(t))
        try:
            operations = self._hooks.generate_jobs(t, blocks)
        except Exception as e:
            operations = []
            failure = e
            log.exception("could not build batch %d", t)
        for op in operations:
            op_info = OutputOperationInfo(t, op.id, op.name, op.name, self._clock.get_time_ms())
            self._bus.post(OutputOperationStarted(op_info))
            self._side.set_job_description(describe_batch(t, op.name))
            try:
                op.run()
            except Exception as e:
                log.exception("output operation %d (%s) of batch %d failed", op.id, op.name, t)
                failure = failure or e
                op_info = replace(op_info, failure_reason="".join(traceback.format_exception(e)))
            op_info = replace(op_info, end_time_ms=self._clock.get_time_ms())
            op_infos[op.id] = op_info
            self._bus.post(OutputOperationCompleted(op_info))
            if failure is not None:
                break
        info = replace(
            info, processing_end_time_ms=self._clock.get_time_ms(), output_operations=op_infos
        )
        if failure is not None:
            self._finish(t, info, blocks, succeeded=False)
            self._hooks.batch_failed(t, failure)
            return
        self._finish(t, info, blocks, succeeded=True)

    def _finish(
        self, t: int, info: BatchInfo, blocks: dict[int, list[ReceivedBlockInfo]], succeeded: bool
    ) -> None:
        with self._lock:
            self._pending.pop(t, None)
            if not succeeded:
                self._failed.add(t)
            threshold = min([*self._pending, *self._failed], default=t + 1)
            if succeeded:
                self._last_completed_ms = max(self._last_completed_ms, t)
                self.batches_completed += 1
                self.records_processed_by_batches += info.num_records
            self._lock.notify_all()
        self._hooks.batch_finished(t)
        self._bus.post(BatchCompleted(info))
        if succeeded:
            # Checkpoint first: cleanup must never run ahead of what a restart knows.
            self._write_checkpoint()
            self._block_tracker.cleanup_old_batches(threshold - self.remember_ms)
            try:
                self._hooks.clean_after_batch(t, blocks)
            except Exception:
                log.exception("could not clean up after batch %d", t)

    def pending_batches(self) -> list[int]:
        """Times of the batches queued or running."""
        with self._lock:
            return sorted(self._pending)

    def stop(self, graceful: bool, timeout_ms: int) -> bool:
        """Stop generating batches. Return False if a graceful stop timed out.

        Graceful: keep generating until every received block is allocated (within
        ``timeout_ms``), stop the timer, then wait for every queued batch to be
        processed (up to ``drain_timeout_s``, an hour by default, as Spark).
        Otherwise stop the timer now and drop the batches not started.
        """
        deadline = self._clock.get_time_ms() + timeout_ms
        completed = True
        self._dropping = not graceful
        self._released.set()  # a graceful stop runs the held batches; a stop at once drops them
        if graceful:
            with self._block_tracker.allocation_changed:
                while self._block_tracker.has_unallocated_blocks():
                    remaining_ms = deadline - self._clock.get_time_ms()
                    if remaining_ms <= 0:
                        completed = False
                        log.warning("graceful stop timed out with unallocated blocks")
                        break
                    self._block_tracker.allocation_changed.wait(min(remaining_ms, 500) / 1000.0)
        self._timer.stop()
        if graceful:
            with self._lock:
                if not self._lock.wait_for(lambda: not self._pending, self.drain_timeout_s):
                    completed = False
                    log.warning(
                        "graceful stop timed out with batches %s pending", sorted(self._pending)
                    )
        self._executor.shutdown(wait=graceful and completed, cancel_futures=True)
        return completed


def describe_batch(batch_time_ms: int, operation: str | None = None) -> str:
    """The Spark UI description of a batch's jobs: ``Streaming batch 10:00:01 [output op x]``.

    Local time, as Spark's Streaming tab shows batch times; milliseconds only when
    the batch time has some (intervals under a second).
    """
    seconds, ms = divmod(batch_time_ms, 1000)
    when = time.strftime("%H:%M:%S", time.localtime(seconds)) + (f".{ms:03d}" if ms else "")
    return f"Streaming batch {when}" + (f" [output op {operation}]" if operation else "")


def stream_input_info(stream_id: int, blocks: list[ReceivedBlockInfo]) -> StreamInputInfo:
    """What a stream's blocks bring to a batch: records, blocks, bytes, ``store()`` metadata."""
    metadata = [b.metadata for b in blocks if b.metadata is not None]
    kept = metadata
    if len(metadata) > MAX_METADATA_PER_STREAM:  # keep the last: it is the end offset
        kept = [*metadata[: MAX_METADATA_PER_STREAM - 1], metadata[-1]]
    return StreamInputInfo(
        stream_id,
        sum(b.num_records for b in blocks),
        len(blocks),
        sum(b.size_bytes for b in blocks),
        tuple(kept),
        len(metadata) - len(kept),
        next((b.position for b in reversed(blocks) if b.position is not None), None),
    )
