"""A local TCP line server: the built-in source of the demo and of the benchmarks.

It serves one client at a time with lines of words (``<seq> word word ...``,
about ``line_bytes`` long) at ``rate`` lines/s (flat out when None), and counts
exactly the lines it wrote.
"""

from __future__ import annotations

import contextlib
import logging
import random
import socket
import threading
import time

log = logging.getLogger(__name__)

VOCABULARY = [
    "spark",
    "stream",
    "receiver",
    "block",
    "batch",
    "driver",
    "executor",
    "record",
    "python",
    "arrow",
    "flight",
    "window",
    "state",
    "delay",
    "rate",
    "limit",
    "tracker",
    "supervisor",
    "generator",
    "buffer",
    "queue",
    "write",
    "ahead",
    "log",
    "replay",
    "offset",
    "commit",
    "source",
    "sink",
    "table",
    "frame",
    "column",
    "value",
    "schema",
    "cluster",
    "task",
    "job",
    "stage",
    "shuffle",
    "partition",
    "memory",
    "disk",
    "network",
    "socket",
    "packet",
    "latency",
    "throughput",
]


class LineSource:
    """Serves numbered lines of words on ``host:port`` (port 0 picks a free one).

    Use as a context manager or call :meth:`start`/:meth:`stop`. ``lines_sent``
    counts lines whose bytes were fully written to the client. :meth:`finish`
    stops sending and closes the connection so the client sees the end.
    """

    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = 0,
        rate: float | None = 1000.0,
        line_bytes: int = 100,
        seed: int = 7,
    ) -> None:
        self.rate = rate
        self.lines_sent = 0
        self._rng = random.Random(seed)
        self._line_bytes = line_bytes
        self._server = socket.create_server((host, port))
        self._server.settimeout(0.2)
        self.host, self.port = self._server.getsockname()[:2]
        self._finish = threading.Event()
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._serve, name="line-source", daemon=True)
        self._tails = [self._words() for _ in range(997)]

    def _words(self) -> str:
        words: list[str] = []
        length = 10
        while length < self._line_bytes - 8:
            w = self._rng.choice(VOCABULARY)
            words.append(w)
            length += len(w) + 1
        return " ".join(words)

    def start(self) -> LineSource:
        """Start serving in a background thread."""
        self._thread.start()
        return self

    def __enter__(self) -> LineSource:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def finish(self, timeout_s: float = 10.0) -> int:
        """Stop sending, close the client connection, and return ``lines_sent``."""
        self._finish.set()
        self._done.wait(timeout_s)
        return self.lines_sent

    def stop(self) -> None:
        """Stop everything and close the server socket."""
        self.finish()
        self._thread.join(5)
        self._server.close()

    def _serve(self) -> None:
        try:
            while not self._finish.is_set():
                try:
                    conn, _ = self._server.accept()
                except TimeoutError:
                    continue
                except OSError:
                    return
                with conn:
                    self._send(conn)
        finally:
            self._done.set()

    def _chunk(self, n: int) -> bytes:
        start = self.lines_sent
        tails = self._tails
        k = len(tails)
        return "".join(f"{seq} {tails[seq % k]}\n" for seq in range(start, start + n)).encode()

    def _send(self, conn: socket.socket) -> None:
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        started = time.monotonic()
        tick = 0.01
        try:
            while not self._finish.is_set():
                if self.rate is None:
                    n = 2000
                else:
                    due = int((time.monotonic() - started) * self.rate) - self.lines_sent
                    if due <= 0:
                        self._finish.wait(tick)
                        continue
                    n = min(due, 50_000)
                conn.sendall(self._chunk(n))
                self.lines_sent += n
        except OSError as e:
            log.info("line source client went away: %s", e)
        finally:
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_WR)
