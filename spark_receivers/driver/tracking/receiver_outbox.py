"""Messages from the driver to the receivers' supervisors, sent off every lock.

Spark's tracker endpoint sends its commands to receivers one way
(``endpoint.send``) from its single message loop; a slow receiver never holds
up the loop. :class:`ReceiverOutbox` does the same for our Flight calls:
:meth:`ReceiverOutbox.send` queues a message for a supervisor's endpoint and
returns a future at once, and a small pool of threads delivers the queued
messages **in order per endpoint, one call at a time per endpoint**. So a
receiver whose server never answers delays only its own messages (each call is
bounded by ``timeout_s``), and nobody who holds a lock ever waits on the network.

A full pool (every worker inside a call that hangs) delays the other endpoints'
messages until a call times out; ``workers`` bounds that, and the queue of one
endpoint is capped at ``max_queued`` messages (the oldest is dropped, its future
failed, and a warning logged).
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict, deque
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Protocol

from spark_receivers.errors import RpcError, StateError

log = logging.getLogger(__name__)

__all__ = ["ClientFactory", "ReceiverOutbox"]


class _SupervisorClient(Protocol):
    def call(self, message: Any, timeout_s: float | None = None) -> Any: ...

    def close(self) -> None: ...


ClientFactory = Callable[[str], _SupervisorClient]


class ReceiverOutbox:
    """Delivers messages to supervisor endpoints; see the module doc. Thread-safe.

    ``client_factory(address)`` makes a client for an endpoint (an
    :class:`~spark_receivers.rpc.transport.EndpointClient` signing with the
    application secret); clients are kept per endpoint until :meth:`forget`.
    """

    def __init__(
        self,
        client_factory: ClientFactory,
        timeout_s: float = 30.0,
        workers: int = 8,
        max_queued: int = 1000,
        max_clients: int = 4096,
    ) -> None:
        self._client_factory = client_factory
        self._timeout_s = timeout_s
        self._max_queued = max_queued
        self._max_clients = max_clients
        self._pool = ThreadPoolExecutor(workers, thread_name_prefix="receiver-outbox")
        self._lock = threading.Lock()
        self._queues: dict[str, deque[tuple[Any, Future[Any]]]] = {}
        self._draining: set[str] = set()
        self._clients: OrderedDict[str, _SupervisorClient] = OrderedDict()
        self._idle = threading.Condition(self._lock)
        self._closed = False

    def send(self, endpoint: str, message: Any) -> Future[Any]:
        """Queue ``message`` for ``endpoint``; the future holds the reply or the error.

        Never blocks. A failed delivery is logged at info level (receivers come and
        go) and its future holds the :class:`RpcError`.
        """
        future: Future[Any] = Future()
        with self._lock:
            if self._closed:
                future.set_exception(StateError("the receiver outbox is closed"))
                return future
            queue = self._queues.setdefault(endpoint, deque())
            if len(queue) >= self._max_queued:
                dropped, dropped_future = queue.popleft()
                log.warning(
                    "receiver endpoint %s is not keeping up: dropped %s",
                    endpoint,
                    type(dropped).__name__,
                )
                dropped_future.set_exception(RpcError(f"dropped: {endpoint} is not keeping up"))
            queue.append((message, future))
            if endpoint not in self._draining:
                self._draining.add(endpoint)
                self._pool.submit(self._drain, endpoint)
        return future

    def forget(self, endpoint: str) -> None:
        """Close the client of an endpoint that is gone (queued messages still go out)."""
        with self._lock:
            client = None if endpoint in self._draining else self._clients.pop(endpoint, None)
        if client is not None:
            client.close()

    def pending(self) -> int:
        """Messages queued or being delivered."""
        with self._lock:
            return sum(len(q) for q in self._queues.values()) + len(self._draining)

    def flush(self, timeout_s: float) -> bool:
        """Wait until every queued message was delivered or failed; False on timeout."""
        with self._idle:
            return self._idle.wait_for(lambda: not self._draining, timeout_s)

    def close(self, timeout_s: float = 5.0) -> None:
        """Deliver what is queued (up to ``timeout_s``), then close every client."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        flushed = self.flush(timeout_s)
        if not flushed:
            log.warning("receiver outbox closed with %d message(s) undelivered", self.pending())
        # Idle pool threads end at once: wait for them then (no thread of ours outlives stop);
        # a call still running is bounded by its timeout and not waited for.
        self._pool.shutdown(wait=flushed, cancel_futures=True)
        with self._lock:
            clients = list(self._clients.values())
            self._clients.clear()
        for client in clients:
            client.close()

    def _client(self, endpoint: str) -> _SupervisorClient:
        with self._lock:
            client = self._clients.pop(endpoint, None)
            evicted = None
            if client is None:
                client = self._client_factory(endpoint)
                if len(self._clients) >= self._max_clients:
                    _, evicted = self._clients.popitem(last=False)
            self._clients[endpoint] = client
        if evicted is not None:
            evicted.close()
        return client

    def _drain(self, endpoint: str) -> None:
        """Deliver the queue of one endpoint, one message at a time (a pool thread)."""
        while True:
            with self._lock:
                queue = self._queues.get(endpoint)
                if not queue:
                    self._queues.pop(endpoint, None)
                    self._draining.discard(endpoint)
                    self._idle.notify_all()
                    return
                message, future = queue.popleft()
            if not future.set_running_or_notify_cancel():
                continue
            try:
                reply = self._client(endpoint).call(message, self._timeout_s)
            except Exception as e:  # noqa: BLE001 - the future carries it; receivers come and go
                log.info("could not send %s to %s: %s", type(message).__name__, endpoint, e)
                future.set_exception(e)
            else:
                future.set_result(reply)
