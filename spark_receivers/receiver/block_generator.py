"""Cuts the records a receiver stores into blocks, one per block interval.

Spark's BlockGenerator, with one weakness fixed: memory stays bounded. When the
push queue is full the timer cannot hand over its cut block, and instead of
letting the current buffer grow without limit (as Spark's does), ``add_data``
blocks the receiver until the pushing thread makes room. Arrow tables are joined
into a block without copying, so a receiver can store them far faster than any
store can take them: once the tables of the current block reach
``max_block_bytes`` (64 MiB), ``add_table`` cuts the block at once, and a full
queue holds the receiver as it does at the timer's cut.

States, in order: ``INITIALIZED`` → ``ACTIVE`` → ``STOPPED_ADDING_DATA`` →
``STOPPED_GENERATING_BLOCKS`` → ``STOPPED_ALL``.

Threads: ``add_data*`` run on the receiver's threads; the timer thread cuts
blocks and calls ``on_generate_block`` under the generator's lock (it must not
block); the pushing thread calls ``on_push_block`` (it may block: it stores the
block and reports it to the driver) and ``on_error``.

No thread dies silently (aiokafka's sender fails every pending waiter). An
``Exception`` from ``on_push_block`` fails that block only (``on_error``); anything
else that kills the pushing thread or the timer thread **fails the generator**:
:attr:`BlockGenerator.failure` holds the cause, every waiter wakes (``add_data*``
waiting for room or for rate-limit tokens raise :class:`ReceiverError` chained to
the cause, the timer waiting for room in the queue returns, ``stop()`` returns),
queued blocks and buffered records are dropped (logged with their counts), and
``on_fatal`` is called once. The owner is expected to stop (the supervisor stops
its receiver with the cause, so its task ends with the error).
"""

from __future__ import annotations

import enum
import logging
import threading
from collections import deque
from collections.abc import Callable, Iterable
from typing import Any, Protocol

import pyarrow as pa

from spark_receivers.errors import ReceiverError, StateError
from spark_receivers.receiver.block import Block
from spark_receivers.receiver.rate_limiter import RateLimiter
from spark_receivers.rpc.messages import StreamBlockId
from spark_receivers.util.clock import Clock, SystemClock
from spark_receivers.util.timer import RecurringTimer

log = logging.getLogger(__name__)


class BlockGeneratorState(enum.Enum):
    """Lifecycle of a :class:`BlockGenerator`, in order."""

    INITIALIZED = 0
    ACTIVE = 1
    STOPPED_ADDING_DATA = 2
    STOPPED_GENERATING_BLOCKS = 3
    STOPPED_ALL = 4


class BlockGeneratorListener(Protocol):
    """Callbacks of a :class:`BlockGenerator` (see the module doc for threads)."""

    def on_add_data(self, data: Any, metadata: Any) -> None:
        """A record was added with :meth:`BlockGenerator.add_data_with_callback`."""

    def on_generate_block(self, block_id: StreamBlockId) -> None:
        """A block was cut (timer thread, under the generator lock: do not block)."""

    def on_push_block(self, block: Block) -> None:
        """Store and report ``block`` (pushing thread; may block; raise on failure)."""

    def on_own_block(
        self,
        block_id: StreamBlockId,
        table: pa.Table,
        metadata: dict[str, Any] | None,
        generated_ms: int,
        wait: bool,
        position: str | None,
    ) -> None:
        """Store and report a block of its own (the adding thread; ``wait``: until accepted)."""

    def on_error(self, message: str, error: BaseException) -> None:
        """Pushing a block failed; the generator goes on with the next one (pushing thread)."""

    def on_fatal(self, message: str, error: BaseException) -> None:
        """The generator failed for good: its pushing or timer thread died of ``error``.

        Called once, on the dying thread, outside the generator's lock. Must not
        block for long and must not call :meth:`BlockGenerator.stop` on this
        thread (it joins the pushing thread): hand the stop to another thread.
        """


MAX_BLOCK_BYTES = 64 * 1024 * 1024
"""Arrow bytes at which ``add_table`` cuts a block before the interval ends."""


def _records_in(parts: Iterable[list[Any] | pa.Table]) -> int:
    return sum(p.num_rows if isinstance(p, pa.Table) else len(p) for p in parts)


class BlockGenerator:
    """Buffers records and pushes a block every ``block_interval_ms``.

    ``next_block_id()`` gives each block its id (the supervisor's counter, so
    ids stay unique across generators and restarts). At most
    ``block_queue_size`` cut blocks wait for the pushing thread; when the queue
    is full, adding blocks the caller. If the generator fails (see the module
    doc), adding raises :class:`ReceiverError` chained to :attr:`failure`.

    Example::

        gen = BlockGenerator(listener, next_block_id, block_interval_ms=200)
        gen.start(); gen.add_data("x"); gen.stop()   # stop pushes "x" first
    """

    def __init__(
        self,
        listener: BlockGeneratorListener,
        next_block_id: Callable[[], StreamBlockId],
        block_interval_ms: int = 200,
        block_queue_size: int = 10,
        rate_limiter: RateLimiter | None = None,
        clock: Clock | None = None,
        name: str = "block-generator",
        max_block_bytes: int = MAX_BLOCK_BYTES,
    ) -> None:
        if block_interval_ms <= 0:
            msg = f"block_interval_ms must be > 0, got {block_interval_ms}"
            raise ValueError(msg)
        self._listener = listener
        self._next_block_id = next_block_id
        self.block_interval_ms = block_interval_ms
        self.rate_limiter = rate_limiter or RateLimiter()
        self._clock = clock or SystemClock()
        self._name = name
        self._lock = threading.Lock()
        self._room = threading.Condition(self._lock)
        self._buffer: list[Any] = []
        self._parts: list[list[Any] | pa.Table] = []
        self._max_block_bytes = max_block_bytes
        self._table_bytes = 0  # of the Arrow tables in _parts
        self._waiting_for_room = False
        self.waited_for_room_s = 0.0
        """Seconds adds were held because the push queue was full, in all (metrics)."""
        # Records the rate limiter already let through for add_data, spent under the lock
        # (taking a token per record from the limiter would cost more than the append).
        self._metered = False
        self._credit = 0
        # True while ACTIVE, not waiting for room, and unmetered or with credit left:
        # the one flag add_data checks on its fast path.
        self._open = False
        # Cut blocks waiting for the pushing thread; under _lock. The timer waits on
        # _space when it is full, the pushing thread on _not_empty when it is empty.
        self._queue: deque[Block] = deque()
        self._queue_size = block_queue_size
        self._space = threading.Condition(self._lock)
        self._not_empty = threading.Condition(self._lock)
        self._stop_pushing = False
        self._failure: BaseException | None = None
        self._timer = RecurringTimer(
            self._clock,
            block_interval_ms,
            self._cut_block,
            f"{name}-timer",
            on_error=lambda e: self._fail(e, "timer thread"),
        )
        self._pusher = threading.Thread(
            target=self._keep_pushing, name=f"{name}-pusher", daemon=True
        )
        self._state = BlockGeneratorState.INITIALIZED
        # Set when adding must stop waiting for rate-limit tokens (stop or failure).
        self._interrupt = threading.Event()

    @property
    def state(self) -> BlockGeneratorState:
        """The current lifecycle state."""
        return self._state

    @property
    def waiting_for_room(self) -> bool:
        """True while a cut block waits for room in the full queue (adds block)."""
        return self._waiting_for_room

    @property
    def failure(self) -> BaseException | None:
        """What killed the pushing or timer thread (the generator then failed), or None."""
        return self._failure

    def start(self) -> None:
        """Start the timer and the pushing thread; only from ``INITIALIZED``."""
        with self._lock:
            if self._state is not BlockGeneratorState.INITIALIZED:
                msg = f"cannot start BlockGenerator {self._name} in state {self._state.name}"
                raise StateError(msg)
            self._state = BlockGeneratorState.ACTIVE
            self._metered = self.rate_limiter.limited
            self._reopen()
        self._timer.start()
        self._pusher.start()

    def stop(self) -> None:
        """Stop adding, cut the last block, push every queued block, join; idempotent.

        Records added before ``stop`` are all pushed before it returns, unless
        the generator failed: then it returns without pushing (what was dropped
        is logged). Adders blocked for room or tokens wake and raise
        :class:`StateError`. Must not be called from ``on_push_block``.
        """
        with self._lock:
            if self._state is not BlockGeneratorState.ACTIVE:
                if self._state is BlockGeneratorState.INITIALIZED:
                    self._state = BlockGeneratorState.STOPPED_ALL
                return
            self._state = BlockGeneratorState.STOPPED_ADDING_DATA
            self._open = False
            self._room.notify_all()
        self._interrupt.set()
        self.rate_limiter.wake_waiters()
        # The final tick may wait for room in the queue: the pushing thread makes
        # it, or a failure releases it.
        self._timer.stop(final_tick=True)
        with self._lock:
            self._state = BlockGeneratorState.STOPPED_GENERATING_BLOCKS
            self._stop_pushing = True
            self._not_empty.notify_all()
        if self._pusher is not threading.current_thread():
            self._pusher.join()
        with self._lock:
            self._state = BlockGeneratorState.STOPPED_ALL
        log.debug("%s stopped", self._name)

    def add_data(self, record: Any) -> None:
        """Add one record to the current buffer (blocks under rate limit or a full queue)."""
        with self._lock:
            if self._open:
                self._buffer.append(record)
                if self._metered:
                    self._credit -= 1
                    if self._credit <= 0:
                        self._open = False
                return
        self._add_data_slowly(record)

    def _add_data_slowly(self, record: Any) -> None:
        """``add_data`` when it must wait: for room, for tokens, or to raise when stopped."""
        while True:
            with self._lock:
                self._wait_until_open()  # raises unless ACTIVE
                if not self._metered or self._credit > 0:
                    self._buffer.append(record)
                    if self._metered:
                        self._credit -= 1
                    self._reopen()
                    return
            # Out of credit: take ~10 ms worth of tokens at once, outside the lock.
            rate = self.rate_limiter.rate
            chunk = max(1, int((rate or 0) / 100))
            self.rate_limiter.acquire(chunk, self._interrupt)
            with self._lock:
                self._credit += chunk
                self._metered = self.rate_limiter.limited

    def _reopen(self) -> None:
        """Under the lock: recompute the fast-path flag of ``add_data``."""
        self._open = (
            self._state is BlockGeneratorState.ACTIVE
            and not self._waiting_for_room
            and (not self._metered or self._credit > 0)
            and self._failure is None
        )

    def add_many(self, records: Iterable[Any]) -> int:
        """Add many records in one call; return how many were added."""
        items = records if isinstance(records, list) else list(records)
        n = len(items)
        if n == 0:
            return 0
        if self.rate_limiter.limited:
            self.rate_limiter.acquire(n, self._interrupt)
        with self._lock:
            if not self._open:
                self._wait_until_open()
            self._buffer.extend(items)
        return n

    def add_table(self, table: pa.Table) -> int:
        """Add an Arrow table's rows (kept as Arrow: the cut concatenates without copying)."""
        n = table.num_rows
        if n == 0:
            return 0
        if self.rate_limiter.limited:
            self.rate_limiter.acquire(n, self._interrupt)
        with self._lock:
            if not self._open:
                self._wait_until_open()
            if self._buffer:
                self._parts.append(self._buffer)
                self._buffer = []
            self._parts.append(table)
            self._table_bytes += table.nbytes
            if self._table_bytes < self._max_block_bytes:
                return n
            block, failed = self._cut_locked(self._clock.get_time_ms())
        if failed:
            self._log_dropped(block)
        return n

    def add_own_block(
        self,
        table: pa.Table,
        metadata: dict[str, Any] | None = None,
        wait: bool = False,
        position: str | None = None,
    ) -> None:
        """Rows that make a block of their own: named and rate-limited, then written at once.

        A ``reliable`` store (``wait``), one with metadata or a source position: handed to
        ``on_own_block`` on this thread, not queued behind the cut blocks and not held by a
        full queue.
        """
        self.rate_limiter.acquire(table.num_rows)
        self._listener.on_own_block(
            self._next_block_id(), table, metadata, self._clock.get_time_ms(), wait, position
        )

    def add_data_with_callback(self, record: Any, metadata: Any) -> None:
        """Add one record and call ``on_add_data(record, metadata)`` under the lock."""
        if self.rate_limiter.limited:
            self.rate_limiter.acquire(1, self._interrupt)
        with self._lock:
            if not self._open:
                self._wait_until_open()
            self._buffer.append(record)
            self._listener.on_add_data(record, metadata)

    def update_rate(self, rate: float) -> None:
        """Change the rate limit (ignored when ≤ 0; capped at the max rate)."""
        self.rate_limiter.update_rate(rate)
        with self._lock:
            self._metered = self.rate_limiter.limited
            self._reopen()

    def _wait_until_open(self) -> None:
        """Under the lock: wait while a cut block waits for room; raise unless ACTIVE.

        Raises :class:`ReceiverError` (chained) once the generator failed.
        """
        while (
            self._waiting_for_room
            and self._state is BlockGeneratorState.ACTIVE
            and self._failure is None
        ):
            self._room.wait()
        if self._failure is not None:
            msg = (
                f"Cannot add data as BlockGenerator {self._name} failed: "
                f"{self._failure!r}; the receiver must stop"
            )
            raise ReceiverError(msg) from self._failure
        if self._state is not BlockGeneratorState.ACTIVE:
            self._not_active()

    def _not_active(self) -> None:
        msg = (
            f"Cannot add data as BlockGenerator {self._name} has not been started or has "
            f"been stopped (state {self._state.name})"
        )
        raise StateError(msg)

    def _cut_block(self, time_ms: int) -> None:
        with self._lock:
            block, failed = self._cut_locked(time_ms)
        if failed:
            self._log_dropped(block)

    def _cut_locked(self, time_ms: int) -> tuple[Block | None, bool]:
        """Under the lock: cut the current block and queue it, waiting for room.

        Returns the block and whether the generator failed while it waited (the
        block is then dropped; the caller logs it outside the lock).
        """
        if self._failure is not None:
            return None, False
        if self._buffer:
            self._parts.append(self._buffer)
            self._buffer = []
        if not self._parts:
            return None, False
        parts, self._parts, self._table_bytes = tuple(self._parts), [], 0
        block = Block(self._next_block_id(), parts, time_ms - self.block_interval_ms)
        self._listener.on_generate_block(block.block_id)
        if len(self._queue) >= self._queue_size:
            # Adds wait too (memory stays bounded) until the pushing thread
            # makes room, or the generator fails.
            self._waiting_for_room = True
            self._open = False
            since = self._clock.monotonic_s()
            while len(self._queue) >= self._queue_size and self._failure is None:
                self._space.wait()
            self.waited_for_room_s += self._clock.monotonic_s() - since
            self._waiting_for_room = False
            self._reopen()
            self._room.notify_all()
        failed = self._failure is not None
        if not failed:
            self._queue.append(block)
            self._not_empty.notify()
        return block, failed

    def _log_dropped(self, block: Block | None) -> None:
        if block is not None:
            log.error(
                "%s failed while block %s (%d records) waited for room; dropped",
                self._name,
                block.block_id,
                _records_in(block.parts),
            )

    def _keep_pushing(self) -> None:
        try:
            while True:
                with self._lock:
                    while not (self._queue or self._stop_pushing or self._failure is not None):
                        self._not_empty.wait()
                    if self._failure is not None or not self._queue:
                        return  # failed, or stopped and drained
                    block = self._queue.popleft()
                    self._space.notify()
                self._push(block)
        except BaseException as e:  # noqa: BLE001 - the generator fails with the cause
            self._fail(e, "pushing thread")

    def _push(self, block: Block) -> None:
        """Push one block; an ``Exception`` fails this block only (reported to ``on_error``)."""
        try:
            self._listener.on_push_block(block)
        except Exception as e:
            log.exception("%s failed to push block %s", self._name, block.block_id)
            try:
                self._listener.on_error(f"Error in block pushing thread: {e}", e)
            except Exception:
                log.exception("%s: on_error raised", self._name)

    def _fail(self, error: BaseException, where: str) -> None:
        """Fail the generator with ``error``: wake every waiter, drop what is pending, tell."""
        with self._lock:
            if self._failure is not None:
                return
            self._failure = error
            self._open = False
            dropped = list(self._queue)
            self._queue.clear()
            buffered = _records_in([*self._parts, self._buffer])
            self._parts, self._buffer = [], []
            self._room.notify_all()
            self._space.notify_all()
            self._not_empty.notify_all()
        self._interrupt.set()
        self.rate_limiter.wake_waiters()
        message = f"BlockGenerator {self._name} failed: its {where} died of {error!r}"
        log.error(
            "%s; dropped %d queued block(s) (%d records) and %d buffered record(s)",
            message,
            len(dropped),
            _records_in(p for b in dropped for p in b.parts),
            buffered,
            exc_info=error,
        )
        try:
            self._listener.on_fatal(message, error)
        except Exception:
            log.exception("%s: on_fatal raised", self._name)
