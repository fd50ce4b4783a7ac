"""Reports stored blocks to the driver, several per call when the driver is slow.

A supervisor's pusher stores a block, then hands its :class:`ReceivedBlockInfo` to
:meth:`BlockReporter.submit` and goes on with the next block. The reporter's one
thread sends what is pending as one ``AddBlocks`` call, in submission order, one
call in flight at a time: when the driver answers within a block interval every
call carries one block (no delay is added to wait for company), and when it is
slow the blocks that piled up meanwhile go together in the next call, so the
driver's per-call cost (gRPC, authentication, dispatch) is shared by all of them.
This is how 1,000 receivers fit in one driver process (issue 20; Kafka producers
batch the same way).

Memory stays bounded: :meth:`submit` blocks while ``max_pending`` blocks are
submitted but not yet answered, so a driver that stops answering stops the pusher,
which fills the block generator's queue, which blocks ``store()`` — the same
backpressure as when every block waited for its own ``AddBlock``.

Each submission returns a :class:`~concurrent.futures.Future` resolved with the
driver's answer for that block (True: accepted), or failed with the call's error;
``store(..., reliable=True)`` waits on it. A reporter whose thread died fails every
pending future with the cause (nothing waits forever).

Threads: ``submit`` from the pusher and from reliable stores; the reporter thread
calls the driver and resolves the futures (their callbacks run on it).
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

from spark_receivers.errors import ReceiverError, StateError
from spark_receivers.rpc import messages as m

log = logging.getLogger(__name__)

__all__ = ["BlockReporter"]

MAX_BLOCKS_PER_CALL = 256
"""At most this many blocks in one ``AddBlocks`` (a few hundred bytes each)."""


class BlockReporter:
    """Sends ``AddBlocks`` for submitted blocks, in order; see the module doc. Thread-safe.

    ``call(message)`` sends one message to the driver and returns its reply (the
    supervisor's tracker client); ``max_pending`` bounds the blocks submitted but not
    yet answered.
    """

    def __init__(
        self, call: Callable[[Any], Any], max_pending: int = 20, name: str = "block-reporter"
    ) -> None:
        if max_pending < 1:
            msg = f"max_pending must be >= 1, got {max_pending}"
            raise ValueError(msg)
        self._call = call
        self._max_pending = max_pending
        self._cond = threading.Condition()
        self._queue: deque[tuple[m.ReceivedBlockInfo, Future[bool]]] = deque()
        self._sending: list[tuple[m.ReceivedBlockInfo, Future[bool]]] = []
        self._closed = False
        self._failure: BaseException | None = None
        self.calls = 0
        """``AddBlocks`` calls made (for tests and benchmarks)."""
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def submit(self, info: m.ReceivedBlockInfo) -> Future[bool]:
        """Queue ``info`` for the next call; blocks while ``max_pending`` are unanswered.

        Raises :class:`StateError` after :meth:`close`, :class:`ReceiverError` when the
        reporter's thread died.
        """
        future: Future[bool] = Future()
        with self._cond:
            while (
                len(self._queue) + len(self._sending) >= self._max_pending
                and not self._closed
                and self._failure is None
            ):
                self._cond.wait()
            self._raise_if_unusable()
            self._queue.append((info, future))
            self._cond.notify_all()
        return future

    def _raise_if_unusable(self) -> None:
        if self._failure is not None:
            msg = "the block reporter's thread died; no block can be reported"
            raise ReceiverError(msg) from self._failure
        if self._closed:
            msg = "the block reporter is closed: no more blocks can be reported"
            raise StateError(msg)

    def flush(self, timeout_s: float | None = None) -> bool:
        """Wait until every submitted block is answered; False on timeout."""
        with self._cond:
            return self._cond.wait_for(
                lambda: (not self._queue and not self._sending) or self._failure is not None,
                timeout_s,
            )

    def close(self, timeout_s: float | None = None) -> None:
        """Report what is pending (up to ``timeout_s``), then stop; idempotent."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        self._thread.join(timeout_s)

    def _run(self) -> None:
        try:
            while True:
                with self._cond:
                    while not self._queue and not self._closed:
                        self._cond.wait()
                    if not self._queue:
                        return  # closed and drained
                    batch = [
                        self._queue.popleft()
                        for _ in range(min(len(self._queue), MAX_BLOCKS_PER_CALL))
                    ]
                    self._sending = batch
                self._send(batch)
                with self._cond:
                    self._sending = []
                    self._cond.notify_all()
        except BaseException as e:  # noqa: BLE001 - fail every waiter with the cause
            self._die(e)

    def _send(self, batch: list[tuple[m.ReceivedBlockInfo, Future[bool]]]) -> None:
        self.calls += 1
        try:
            reply = self._call(m.AddBlocks(tuple(info for info, _ in batch)))
        except Exception as e:  # noqa: BLE001 - the error goes to every block of the call
            for _, future in batch:
                future.set_exception(e)
            return
        if not isinstance(reply, list) or len(reply) != len(batch):
            msg = f"AddBlocks of {len(batch)} blocks got a malformed reply {reply!r:.100}"
            for _, future in batch:
                future.set_exception(ReceiverError(msg))
            return
        for (_, future), ok in zip(batch, reply, strict=True):
            future.set_result(ok is True)

    def _die(self, error: BaseException) -> None:
        log.error("the block reporter's thread died", exc_info=error)
        with self._cond:
            self._failure = error
            pending = [*self._sending, *self._queue]
            self._queue.clear()
            self._sending = []
            self._cond.notify_all()
        for _, future in pending:
            if not future.done():
                future.set_exception(error)
