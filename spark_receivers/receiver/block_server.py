"""The server of one receiver task: answers the driver, serves blocks, lingers after a stop.

An authenticated Arrow Flight endpoint bound to the executor's host. It answers
the driver's ``StopReceiver``, ``ReleaseReceiver``, ``RemoveBlocks``,
``CleanupOldBlocks`` and ``UpdateRateLimit`` (through callbacks to the
supervisor) and serves the blocks of its :class:`BlockStore` to batch readers
(``do_get``). Blocks live in this task, so after the receiver stops the server
keeps serving them (:meth:`BlockServer.linger`) until every one was removed,
the driver releases the task, or the drain timeout passes.

Threads: gRPC threads run the handlers; the callbacks must return quickly
(stopping runs on a thread of its own).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

import pyarrow as pa

from spark_receivers.errors import ReceiverError, StateError
from spark_receivers.receiver.block_store import BlockStore
from spark_receivers.rpc import messages as m
from spark_receivers.rpc.hosts import EndpointNetwork
from spark_receivers.rpc.tls import TlsConfig
from spark_receivers.rpc.transport import FlightEndpoint

log = logging.getLogger(__name__)

__all__ = ["BlockServer", "server_settings"]


def server_settings(config: Any, host: str) -> dict[str, Any]:
    """The network and TLS keyword arguments of a :class:`BlockServer` advertising ``host``.

    ``config`` is the receiver's :class:`~spark_receivers.config.StreamingConfig`
    (``spark.receivers.executor.bindAddress`` / ``.ports``, ``spark.receivers.rpc.tls.*``).
    """
    from spark_receivers.config_checks import parse_ports

    ports = parse_ports(config.executor_ports, "spark.receivers.executor.ports")
    return {
        "network": EndpointNetwork(config.executor_bind_address or host, host, ports),
        "tls": config.tls,
    }


class BlockServer:
    """Serves one receiver's blocks and control messages; see the module doc.

    ``stop(message)`` is called (on a thread of its own) for ``StopReceiver`` and
    ``ReleaseReceiver``; ``cleanup(threshold_ms)`` for ``CleanupOldBlocks``;
    ``update_rate(rate)`` for ``UpdateRateLimit``.
    """

    def __init__(
        self,
        stream_id: int,
        host: str,
        secret: str,
        block_store: BlockStore,
        stop: Callable[[str], None],
        cleanup: Callable[[int], None],
        update_rate: Callable[[float], None],
        max_message_bytes: int,
        *,
        network: EndpointNetwork | None = None,
        tls: TlsConfig | None = None,
        refuse: Callable[[str], None] | None = None,
    ) -> None:
        """``host`` is advertised; ``network`` (default: bind ``host``, any port) and ``tls``.

        ``refuse(call)``, when given, runs before each control message and may raise
        (a testing aid: :func:`spark_receivers.util.fault_plan.cut_check`).
        """
        network = network or EndpointNetwork(host, host)
        self.stream_id = stream_id
        self.block_store = block_store
        self._stop = stop
        self._cleanup = cleanup
        self._update_rate = update_rate
        self._refuse = refuse
        self._changed = threading.Condition()
        self._released = False
        self._endpoint = FlightEndpoint(
            f"receiver-{stream_id}",
            network.bind_host,
            secret,
            m.SUPERVISOR_MESSAGES,
            self._handle,
            self._read_block,
            max_message_bytes,
            tls=tls,
            **network.endpoint_kwargs(),
        )

    @property
    def address(self) -> str:
        """``host:port`` readers and the driver connect to."""
        return self._endpoint.address

    def remove(self, names: list[str] | tuple[str, ...]) -> int:
        """Drop blocks from the store; return how many were there."""
        n = self.block_store.remove(names)
        with self._changed:
            self._changed.notify_all()
        return n

    def linger(self, timeout_s: float) -> None:
        """Keep serving until no block is left, the driver released us, or ``timeout_s``."""
        with self._changed:
            done = self._changed.wait_for(
                lambda: self._released or len(self.block_store) == 0, timeout_s
            )
        left = len(self.block_store)
        if self._released and left:
            log.info(
                "receiver %s released by the driver with %d unread block(s)", self.stream_id, left
            )
        elif not done:
            log.warning(
                "receiver %s stops with %d unread block(s) after %.0fs",
                self.stream_id,
                left,
                timeout_s,
            )

    def close(self) -> None:
        """Stop serving; idempotent."""
        self._endpoint.close()

    def _stop_soon(self, message: str) -> None:
        threading.Thread(
            target=self._stop, args=(message,), name=f"receiver-{self.stream_id}-stop", daemon=True
        ).start()

    def _handle(self, message: m.SupervisorMessage) -> Any:
        if self._refuse is not None:
            self._refuse(type(message).__name__)
        match message:
            case m.StopReceiver():
                self._stop_soon("Stopped by driver")
                return True
            case m.ReleaseReceiver():
                with self._changed:
                    self._released = True
                    self._changed.notify_all()
                self._stop_soon("Released by driver")
                return True
            case m.RemoveBlocks(block_ids=ids):
                return self.remove(ids)
            case m.CleanupOldBlocks(threshold_ms=threshold):
                # As Spark: only the WAL is cleaned by age. In-memory blocks leave by
                # id (RemoveBlocks), since a block cut before a batch time may still
                # belong to a later batch (docs/decisions/0001).
                self._cleanup(threshold)
                return True
            case m.UpdateRateLimit(rate=rate):
                self._update_rate(rate)
                return True
        msg = f"unexpected message {message!r}"
        raise StateError(msg)

    def _read_block(self, ticket: bytes) -> pa.Table:
        name = ticket.decode("ascii", "replace")
        block_id = m.StreamBlockId.parse(name)
        if block_id.stream_id != self.stream_id:
            msg = f"block {name} does not belong to stream {self.stream_id}"
            raise ReceiverError(msg)
        return self.block_store.get(name)
