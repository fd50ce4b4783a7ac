"""A local TCP line server: the source of the demo, of the docs' examples and of the benchmarks.

:class:`LineSource` offers the lines of ``lines.py`` (100 bytes each, a 10-digit sequence
number, then words) at a paced rate to one client at a time. The sequence number (0, 1,
2, ... per server, across reconnects) lets a consumer compute end-to-end latency: the
receive (or batch completion) time minus :meth:`LineSource.send_time_of` that number.

Example::

    with LineSource(rate=5_000) as source:     # serves until stopped
        ssc.receiver_stream(SocketTextReceiver(source.host, source.port))
        ...
        sent = source.finish()                 # exactly the lines the client was sent

    with LineSource(rate=50_000, seconds=30) as server:   # a benchmark's window
        connect_consumer(server.port)
        server.wait_finished(timeout_s=120)
        info = server.info()                   # info.lines_sent is exact

Times are ``time.monotonic()`` seconds: CLOCK_MONOTONIC, one clock for every process on a
Linux host, so a child process can be compared against :meth:`LineSource.send_time_of`.
``python -m bench.loadgen`` runs one from a shell.
"""

from __future__ import annotations

import bisect
import contextlib
import enum
import logging
import math
import select
import selectors
import socket
import threading
import time
from array import array
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from spark_receivers.errors import ConfigError, StateError
from spark_receivers.receivers.lines import BLOCK_LINES, LINE_BYTES, LinePool

__all__ = ["LineSource", "LineSourceInfo", "LineSourceState"]

log = logging.getLogger(__name__)

_MAX_SECONDS = 3600.0  # bounds the per-chunk timestamp record (~16 B per chunk)


class LineSourceState(enum.Enum):
    """Lifecycle of a :class:`LineSource`, in order; FINISHED is reached from any state."""

    INITIALIZED = 0  # constructed, not bound
    LISTENING = 1  # bound, waiting for the first client (the clock has not started)
    SENDING = 2  # the send window is open
    FINISHED = 3  # window over or stopped; every socket closed; counters final


@dataclass(frozen=True)
class LineSourceInfo:
    """A snapshot of a :class:`LineSource`'s counters (final once it is FINISHED)."""

    rate: float | None
    seconds: float | None  # None: open-ended, until stopped
    lines_sent: int
    bytes_sent: int
    connections: int
    disconnects: int
    started_at_s: float | None  # monotonic time the first client connected: the clock's zero
    ended_at_s: float | None
    torn_line: bool  # the window closed mid-line and the line could not be completed
    error: str | None

    @property
    def elapsed_s(self) -> float:
        """Seconds from the first client's connection to the end (0 before both)."""
        if self.started_at_s is None or self.ended_at_s is None:
            return 0.0
        return self.ended_at_s - self.started_at_s

    @property
    def achieved_rate(self) -> float:
        """Lines per second over :attr:`elapsed_s`."""
        return self.lines_sent / self.elapsed_s if self.elapsed_s > 0 else 0.0


class _Disconnected(Exception):
    def __init__(self, written: int) -> None:
        super().__init__(written)
        self.written = written


class LineSource:
    """Serves paced lines to one TCP client at a time, for a window or until stopped.

    The window (``seconds``; None: until :meth:`stop` or :meth:`finish`) starts when the
    first client connects. If that client goes away
    inside the window, the next client is accepted and the sequence continues, so the counters
    stay those of one stream. At the end of the window the connection and the listening socket
    are closed, so the consumer reads EOF.

    ``rate`` is lines per second, paced open-loop every ``tick_s``: the target is
    ``rate * elapsed`` and each tick sends the shortfall, so a consumer that pushes back over
    TCP receives bursts afterwards, and one that cannot keep up ends the window with
    ``lines_sent`` below ``rate * seconds``. ``rate=None`` sends flat out.

    ``steps`` (instead of ``rate`` and ``seconds``) offers rising rates one after the other on
    the same connection, ``[(rate, seconds), ...]``: the target is the integral of the rate so
    far, so each step starts at its own rate without catching up on an earlier one's
    shortfall. :meth:`lines_sent_by` tells how many lines had been sent at a given time, which
    splits the counters by step.

    ``lines_sent`` counts exactly the lines the kernel accepted in full. The writer never
    leaves a torn line at the end of the window: it gives the last line ``close_grace_s`` to
    complete (see ``LineSourceInfo.torn_line``). A reset connection may lose bytes the kernel
    had accepted; that is counted in ``disconnects``.

    ``accept_timeout_s`` bounds the wait for the first client (default: 60 s with a
    window, no bound without one). ``words`` are the lines' words (see :class:`LinePool`;
    the demo's are :data:`LINE_WORDS`). With a window, every chunk's send time is kept
    (:meth:`send_time_of`, :meth:`lines_sent_by`); an open-ended source keeps none.

    Threads: :meth:`start` binds synchronously and runs the server on one daemon thread;
    every other method may be called from any thread and none blocks beyond its timeout.
    """

    def __init__(
        self,
        rate: float | None = 1000.0,
        seconds: float | None = None,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        accept_timeout_s: float | None = None,
        tick_s: float = 0.01,
        close_grace_s: float = 2.0,
        vocab_size: int = 1000,
        seed: int = 0,
        steps: Sequence[tuple[int, float]] = (),
        words: Sequence[str] | None = None,
    ) -> None:
        if steps:
            if rate is not None or seconds != sum(d for _, d in steps):
                msg = "with steps, pass rate=None and seconds=sum of the steps' seconds"
                raise ConfigError(msg)
            for step_rate, step_s in steps:
                if step_rate <= 0 or step_s <= 0:
                    msg = f"every step needs rate > 0 and seconds > 0, got {(step_rate, step_s)}"
                    raise ConfigError(msg)
        if rate is not None and rate <= 0:
            msg = f"rate must be > 0 lines/s or None (flat out), got {rate}"
            raise ConfigError(msg)
        if seconds is not None and not 0 < seconds <= _MAX_SECONDS:
            msg = f"seconds must be in (0, {_MAX_SECONDS}] or None (until stopped), got {seconds}"
            raise ConfigError(msg)
        if accept_timeout_s is None and seconds is not None:
            accept_timeout_s = 60.0
        if accept_timeout_s is not None and accept_timeout_s <= 0:
            msg = f"accept_timeout_s must be > 0, got {accept_timeout_s}"
            raise ConfigError(msg)
        if tick_s <= 0:
            msg = f"tick_s must be > 0, got {tick_s}"
            raise ConfigError(msg)
        self.rate = rate
        self.seconds = seconds
        self.steps = tuple(steps)
        # Step k runs from _step_ends[k-1] to _step_ends[k] (seconds after the clock's zero);
        # _step_lines[k] lines are due at the start of step k.
        self._step_ends: list[float] = []
        self._step_lines: list[float] = []
        end = due = 0.0
        for step_rate, step_s in self.steps:
            self._step_lines.append(due)
            end += step_s
            due += step_rate * step_s
            self._step_ends.append(end)
        self._host, self._port = host, port
        self._accept_timeout_s = accept_timeout_s
        self._tick_s = tick_s
        self._close_grace_s = close_grace_s
        self._pool = LinePool(vocab_size=vocab_size, seed=seed, words=words)
        self._cond = threading.Condition()
        self._state = LineSourceState.INITIALIZED
        self._stop_requested = threading.Event()
        self._waker_r, self._waker_w = socket.socketpair()
        self._listener: socket.socket | None = None
        self._thread: threading.Thread | None = None
        # Counters: written by the server thread only.
        self._next_seq = 0
        self._connections = 0
        self._disconnects = 0
        self._started_at: float | None = None
        self._ended_at: float | None = None
        self._torn = False
        self._error: str | None = None
        self._chunk_seq = array("q")
        self._chunk_time = array("d")
        self._keep_chunks = seconds is not None  # an open-ended source would grow them forever

    # -- lifecycle -------------------------------------------------------------------------

    @property
    def state(self) -> LineSourceState:
        """Where the source is in its lifecycle."""
        return self._state

    @property
    def port(self) -> int:
        """The bound port (the chosen one when constructed with ``port=0``)."""
        if self._listener is None:
            msg = f"LineSource has no port in state {self._state.name}; start() it"
            raise StateError(msg)
        return int(self._listener.getsockname()[1])

    @property
    def host(self) -> str:
        """The address it listens on (the bound one once started: a name resolved)."""
        if self._listener is None:
            return self._host
        return str(self._listener.getsockname()[0])

    def start(self) -> LineSource:
        """Bind, listen and start the server thread. Raises unless INITIALIZED."""
        with self._cond:
            if self._state is not LineSourceState.INITIALIZED:
                msg = f"LineSource.start() needs INITIALIZED, state is {self._state.name}"
                raise StateError(msg)
            listener = socket.create_server((self._host, self._port), backlog=4)
            self._listener = listener
            self._state = LineSourceState.LISTENING
        self._thread = threading.Thread(target=self._run, name="line-source", daemon=True)
        self._thread.start()
        return self

    def stop(self, timeout_s: float = 10.0) -> None:
        """End the window now, close every socket and join the thread. Idempotent."""
        self._stop_requested.set()
        with contextlib.suppress(OSError):  # closed by an earlier stop(): nothing to wake
            self._waker_w.send(b"x")
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout_s)
        elif self._thread is None:
            self._finish()

    def finish(self, timeout_s: float = 10.0) -> int:
        """Stop sending, close the client's connection (it reads EOF); return :attr:`lines_sent`."""
        self.stop(timeout_s)
        self.wait_finished(timeout_s)
        return self.lines_sent

    @property
    def lines_sent(self) -> int:
        """Lines written to clients in full so far (exact once finished)."""
        return self._next_seq

    def __enter__(self) -> LineSource:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def wait_connected(self, timeout_s: float | None = None) -> bool:
        """Block until the first client connected or the server finished; True if connected."""
        with self._cond:
            self._cond.wait_for(
                lambda: self._state.value >= LineSourceState.SENDING.value, timeout_s
            )
            return self._started_at is not None

    def wait_finished(self, timeout_s: float | None = None) -> bool:
        """Block until the window is over and the sockets are closed; True if finished."""
        with self._cond:
            return self._cond.wait_for(lambda: self._state is LineSourceState.FINISHED, timeout_s)

    def info(self) -> LineSourceInfo:
        """A snapshot of the counters; exact once :meth:`wait_finished` returned True."""
        return LineSourceInfo(
            rate=self.rate,
            seconds=self.seconds,
            lines_sent=self._next_seq,
            bytes_sent=self._next_seq * LINE_BYTES,
            connections=self._connections,
            disconnects=self._disconnects,
            started_at_s=self._started_at,
            ended_at_s=self._ended_at,
            torn_line=self._torn,
            error=self._error,
        )

    @classmethod
    def stepped(cls, steps: Sequence[tuple[int, float]], **kwargs: Any) -> LineSource:
        """A server offering ``steps`` = ``[(lines/s, seconds), ...]`` one after the other."""
        return cls(None, sum(d for _, d in steps), steps=steps, **kwargs)

    def step_window(self, index: int) -> tuple[float, float]:
        """``(start, end)`` of step ``index`` in seconds after the clock's zero."""
        if not 0 <= index < len(self.steps):
            msg = f"index must be in [0, {len(self.steps)}), got {index}"
            raise ConfigError(msg)
        return (self._step_ends[index - 1] if index else 0.0), self._step_ends[index]

    def lines_sent_by(self, t: float) -> int:
        """Lines whose chunk started to be written before monotonic time ``t``.

        Exact at a step boundary: a chunk is written in one go, at one rate.
        """
        i = bisect.bisect_left(self._chunk_time, t)
        return self._chunk_seq[i] if i < len(self._chunk_seq) else self._next_seq

    def _due(self, elapsed: float) -> tuple[float, float | None]:
        """Lines due ``elapsed`` seconds after the clock's zero, and the rate then."""
        if not self.steps:
            return (0.0 if self.rate is None else self.rate * elapsed), self.rate
        k = min(bisect.bisect_right(self._step_ends, elapsed), len(self.steps) - 1)
        start = self._step_ends[k - 1] if k else 0.0
        rate = self.steps[k][0]
        return self._step_lines[k] + rate * (elapsed - start), rate

    def send_time_of(self, seq: int) -> float:
        """Monotonic time the chunk holding line ``seq`` started to be written.

        Raises :class:`ConfigError` for a line that was not sent, :class:`StateError` for an
        open-ended source (it keeps no send times).
        """
        if not 0 <= seq < self._next_seq:
            msg = f"seq must be in [0, {self._next_seq}) (lines sent), got {seq}"
            raise ConfigError(msg)
        if not self._keep_chunks:
            msg = "an open-ended LineSource (seconds=None) keeps no send times"
            raise StateError(msg)
        i = bisect.bisect_right(self._chunk_seq, seq) - 1
        return self._chunk_time[i]

    def chunk_times(self) -> list[tuple[int, float]]:
        """Every ``(first_seq, monotonic time)`` chunk record, oldest first."""
        return list(zip(self._chunk_seq, self._chunk_time, strict=True))

    # -- server thread ---------------------------------------------------------------------

    def _run(self) -> None:
        try:
            self._serve()
        except Exception as e:
            log.exception("the line source failed")
            self._error = f"{type(e).__name__}: {e}"
        finally:
            self._finish()

    def _finish(self) -> None:
        with self._cond:
            if self._listener is not None:
                self._listener.close()
            self._waker_r.close()
            self._waker_w.close()
            if self._ended_at is None:
                self._ended_at = time.monotonic()
            self._state = LineSourceState.FINISHED
            self._cond.notify_all()

    def _accept(self, deadline: float) -> socket.socket | None:
        assert self._listener is not None
        with selectors.DefaultSelector() as sel:
            sel.register(self._listener, selectors.EVENT_READ)
            sel.register(self._waker_r, selectors.EVENT_READ)
            while not self._stop_requested.is_set():
                timeout = _left(deadline)
                if timeout is not None and timeout <= 0:
                    return None
                for key, _ in sel.select(timeout):
                    if key.fileobj is self._listener:
                        conn, _addr = self._listener.accept()
                        return conn
        return None

    def _serve(self) -> None:
        wait = self._accept_timeout_s
        conn = self._accept(math.inf if wait is None else time.monotonic() + wait)
        if conn is None:
            if not self._stop_requested.is_set():
                self._error = (
                    f"no client connected within accept_timeout_s={self._accept_timeout_s}"
                )
            return
        t0 = time.monotonic()
        with self._cond:
            self._started_at = t0
            self._state = LineSourceState.SENDING
            self._cond.notify_all()
        window_end = math.inf if self.seconds is None else t0 + self.seconds
        while conn is not None:
            self._connections += 1
            try:
                self._send_window(conn, t0, window_end)
            except _Disconnected:
                self._disconnects += 1
                log.warning("client went away after %d lines; accepting the next", self._next_seq)
            finally:
                conn.close()
            if self._stop_requested.is_set() or time.monotonic() >= window_end:
                break
            conn = self._accept(window_end)
        self._ended_at = min(time.monotonic(), window_end)

    def _send_window(self, conn: socket.socket, t0: float, window_end: float) -> None:
        conn.setblocking(False)
        with selectors.DefaultSelector() as sel:
            sel.register(conn, selectors.EVENT_WRITE)
            sel.register(self._waker_r, selectors.EVENT_READ)
            while not self._stop_requested.is_set():
                now = time.monotonic()
                if now >= window_end:
                    return
                due, rate = self._due(now - t0)
                if rate is None:
                    deficit = min_chunk = BLOCK_LINES
                else:
                    deficit = int(due) - self._next_seq
                    # At least a tick's worth of lines (up to a block) at a time.
                    min_chunk = max(1, min(BLOCK_LINES, int(rate * self._tick_s)))
                if deficit < min_chunk:
                    # Sleep to the next tick boundary: the rate stays smooth at tick granularity.
                    # Sending whatever few lines fell due while the last send ran would turn
                    # the loop into a busy one of tiny sends at high rates (a core of CPU at
                    # 400,000 lines/s, taken from the system under test).
                    ticks = int((now - t0) / self._tick_s) + 1
                    self._stop_requested.wait(min(t0 + ticks * self._tick_s, window_end) - now)
                    continue
                n = min(deficit, BLOCK_LINES)
                if self._keep_chunks:
                    self._chunk_seq.append(self._next_seq)
                    self._chunk_time.append(now)
                if not self._send_lines(conn, sel, n, window_end):
                    return

    def _send_lines(
        self, conn: socket.socket, sel: selectors.BaseSelector, n: int, deadline: float
    ) -> bool:
        """Send lines ``next_seq .. next_seq+n-1``; False if the deadline or stop cut it short."""
        while n > 0:
            index, pos = divmod(self._next_seq, BLOCK_LINES)
            k = min(n, BLOCK_LINES - pos)
            view = self._pool.block(index)[pos * LINE_BYTES : (pos + k) * LINE_BYTES]
            try:
                written = self._write(conn, sel, view, deadline)
                full, partial = divmod(written, LINE_BYTES)
                if partial:
                    # Finish the torn line so the consumer never reads half a line before EOF.
                    rest = view[written : (full + 1) * LINE_BYTES]
                    grace = time.monotonic() + self._close_grace_s
                    if self._write(conn, sel, rest, grace, ignore_stop=True) == len(rest):
                        full += 1
                    else:
                        self._torn = True
            except _Disconnected as e:
                self._next_seq += e.written // LINE_BYTES
                raise
            self._next_seq += full
            if full < k:
                return False
            n -= k
        return True

    def _write(
        self,
        conn: socket.socket,
        sel: selectors.BaseSelector,
        view: memoryview,
        deadline: float,
        *,
        ignore_stop: bool = False,
    ) -> int:
        total = 0
        size = len(view)
        while total < size:
            try:
                total += conn.send(view[total:])
                continue
            except BlockingIOError:
                pass
            except OSError as e:  # reset, broken pipe: the consumer is gone
                raise _Disconnected(total) from e
            timeout = _left(deadline)
            if timeout is not None and timeout <= 0:
                break
            if ignore_stop:
                # Not the selector: its waker stays readable after stop() and would spin.
                select.select([], [conn], [], timeout)
            elif self._stop_requested.is_set():
                break
            else:
                sel.select(timeout)
        return total


def _left(deadline: float) -> float | None:
    """Seconds left until ``deadline`` (monotonic); None when it is infinite (no bound)."""
    return None if math.isinf(deadline) else deadline - time.monotonic()
