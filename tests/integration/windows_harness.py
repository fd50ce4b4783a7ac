"""A deterministic feed for windowed and stateful streams: known lines per batch, a manual clock.

The test sends a round of lines to a :class:`SocketTextReceiver` over a local TCP socket,
waits until the driver got every one of them (``records_received``), then moves the
context's :class:`ManualClock` one batch interval: that batch holds exactly that round.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable, Sequence

from spark_receivers import StreamingContext
from spark_receivers.util.clock import ManualClock

WAIT_S = 120.0


class LineFeed:
    """A TCP server on loopback that sends lines to the one receiver that connects."""

    def __init__(self) -> None:
        self._server = socket.create_server(("127.0.0.1", 0))
        self.port = self._server.getsockname()[1]
        self._conn: socket.socket | None = None
        self._connected = threading.Event()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self._server.accept()
            except OSError:
                return
            self._conn = conn
            self._connected.set()

    def send(self, lines: Sequence[str]) -> None:
        assert self._connected.wait(WAIT_S), "the receiver never connected"
        assert self._conn is not None
        self._conn.sendall("".join(f"{line}\n" for line in lines).encode())

    def reconnected(self) -> None:
        """Expect a new connection (a restarted receiver)."""
        self._connected.clear()

    def close(self) -> None:
        self._server.close()
        if self._conn is not None:
            self._conn.close()


def wait_until(predicate: Callable[[], bool], what: str, timeout_s: float = WAIT_S) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


class Rounds:
    """Feeds one round of lines per batch and runs that batch (see the module doc)."""

    def __init__(self, ssc: StreamingContext, clock: ManualClock, feed: LineFeed) -> None:
        self.ssc, self.clock, self.feed = ssc, clock, feed
        self.interval = ssc.batch_interval_ms
        self.sent = ssc.status().records_received

    def run(self, lines: Sequence[str]) -> int:
        """Send ``lines``, wait for them, run the next batch; return its time."""
        if lines:
            self.feed.send(lines)
        self.sent += len(lines)
        wait_until(lambda: self.ssc.status().records_received >= self.sent, "the records")
        t = (self.clock.get_time_ms() // self.interval + 1) * self.interval
        self.clock.set_time(t)
        wait_until(lambda: self.ssc.status().last_completed_batch_ms >= t, f"batch {t}")
        failure = self.ssc.status().failure
        assert failure is None, failure
        return t


def drive(
    ssc: StreamingContext,
    clock: ManualClock,
    feed: LineFeed,
    rounds: Sequence[Sequence[str]],
    *,
    close_feed: bool = True,
) -> list[int]:
    """Start ``ssc``, run one batch per round of lines, stop it (and close the feed unless
    a restarted driver reads it next); the batch times."""
    ssc.start()
    try:
        runner = Rounds(ssc, clock, feed)
        return [runner.run(lines) for lines in rounds]
    finally:
        ssc.stop(graceful=False)
        if close_feed:
            feed.close()
