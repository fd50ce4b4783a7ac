"""``SocketTextReceiver``: one record per UTF-8 line read from a TCP server."""

from __future__ import annotations

import contextlib
import select
import socket
import time
from typing import Any

from spark_receivers.errors import ConfigError, ReceiverError
from spark_receivers.receiver.lines import split_lines
from spark_receivers.receiver.threaded_receiver import ThreadedReceiver

COALESCE_BYTES = 4 << 20
"""A read buffer holding this much is stored at once, before its window ends."""

WAKE_BYTES = 1 << 20
"""While a window is open, the reader wakes when this much has arrived or the window ends."""


class SocketTextReceiver(ThreadedReceiver):
    """Connects to ``host:port`` and stores every line (UTF-8, without its newline).

    When the connection drops or cannot be made, the receiver restarts and
    reconnects with the backoff of :class:`ThreadedReceiver` (from 500 ms,
    doubling with jitter up to ``max_backoff_ms``; reset once data arrives).
    A line longer than ``max_record_bytes`` or not valid UTF-8 is a bad record:
    counted, reported to the driver and handled by ``bad_record_policy``
    (``skip`` by default, ``fail`` or ``dead_letter``); the lines around it are
    kept. ``include_timestamp=True`` adds when each line was stored. Other keyword
    arguments go to :class:`ThreadedReceiver`.

    Reads go into one buffer whose lines are stored together, ``coalesce_ms`` (50)
    after its first byte not yet stored (sooner once it holds 4 MiB): a line is stored
    at most that long after it was read, and at 300,000 lines/s the receiver's task
    used a quarter to two fifths less CPU than when it stored every read
    (``docs/decisions/0024``). Within the window the socket wakes the reader only
    once 1 MiB has arrived or the window ends (``SO_RCVLOWAT``), so a source that
    sends every few milliseconds costs a wake-up a window, not one a send.
    ``coalesce_ms=0`` stores each read at once. ``read_size`` is the most one read takes.

    Thread contract: one thread (``socket-receiver-<stream>``) connects, reads
    and stores; ``on_stop`` shuts the socket down, which ends its read.
    """

    thread_name_prefix = "socket-receiver"
    transient_attrs = ("_sock",)
    supports_timestamp = True
    _sock: socket.socket | None = None

    def __init__(
        self,
        host: str,
        port: int,
        *,
        max_record_bytes: int | None = None,
        max_backoff_ms: int = 30_000,
        read_size: int = 256 * 1024,
        coalesce_ms: float = 50,
        **kwargs: Any,
    ) -> None:
        super().__init__(max_backoff_ms=max_backoff_ms, max_record_bytes=max_record_bytes, **kwargs)
        if read_size < 1:
            msg = f"read_size must be at least 1 byte, got {read_size}"
            raise ConfigError(msg)
        if not 0 <= coalesce_ms <= 1000:
            msg = f"coalesce_ms must be between 0 and 1000 (0: store every read), got {coalesce_ms}"
            raise ConfigError(msg)
        self.host = host
        self.port = port
        self.read_size = read_size
        self.coalesce_ms = coalesce_ms

    def receive(self) -> None:
        """Connect, then store the lines read until the connection ends or the receiver stops."""
        try:
            sock = socket.create_connection((self.host, self.port), timeout=10)
        except OSError as e:
            msg = f"cannot connect to {self.host}:{self.port}: {e}"
            raise ReceiverError(msg) from e
        sock.settimeout(None)
        self._sock = sock
        try:
            if not self.stopping:  # else interrupt() ran before _sock was set
                self._read_lines(sock)
        except OSError as e:
            msg = f"error reading from {self.host}:{self.port}: {e}"
            raise ReceiverError(msg) from e
        finally:
            self._sock = None
            sock.close()

    def interrupt(self) -> None:
        """Shut the connection down: the blocked read returns."""
        sock = self._sock
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)

    def restart_message(self, error: Exception | None) -> str:
        """``connection to <host>:<port> closed`` when the server ended the connection."""
        if error is None:
            return f"connection to {self.host}:{self.port} closed"
        return super().restart_message(error)

    def _read_lines(self, sock: socket.socket) -> None:
        """Read into one reused buffer; store its whole lines every ``coalesce_ms``.

        The first byte not yet stored starts a window; reads go on until it ends
        or the buffer holds :data:`COALESCE_BYTES`, then the buffer's whole lines are
        split and stored at once and the unfinished line moves to its front. The split
        copies every line into Arrow's own buffers, so nothing stored points into the
        buffer that the next reads overwrite.

        While a window is open the socket wakes the reader only once
        :data:`WAKE_BYTES` have arrived (``SO_RCVLOWAT``) or the window ends; then it
        takes everything queued without waiting. A source that sends every few
        milliseconds thus costs one wake-up per window, not one per send. A stop ends an
        open window the same way: the bytes queued in the socket are read and stored.
        """
        size = self.read_size
        buf = bytearray(max(size, COALESCE_BYTES) + size)
        view = memoryview(buf)
        filled = 0  # bytes in buf: whole lines, then the start of an unfinished one
        clean = 0  # bytes at buf's front known to hold no newline: all left by a store
        skipping = False  # inside a line already reported as too long
        window_s = self.coalesce_ms / 1000
        due = 0.0  # when the bytes read since the last store are stored (0: none are)
        queued = False  # bytes may be waiting in the socket: read on without a poll
        closing = False  # the window is over: read what is queued, then store
        wake = _WakeThreshold(sock, WAKE_BYTES if window_s > 0 else 1)
        poller = select.poll()
        poller.register(sock, select.POLLIN)
        while True:
            if self.stopping:
                if not due:
                    break
                closing = True  # a stop ends the window: what is queued is read and stored
            if due and not queued and not closing:
                wait_ms = (due - time.monotonic()) * 1000
                if wait_ms <= 0 or not poller.poll(wait_ms):
                    closing = True
            if len(buf) - filled < size:  # an unfinished line fills the buffer: a larger one
                grown = bytearray(2 * len(buf))
                grown[:filled] = view[:filled]
                view.release()
                buf, view = grown, memoryview(grown)
            try:  # in a window, never wait: the poll above waited
                flags = socket.MSG_DONTWAIT if due else 0
                n = sock.recv_into(view[filled : filled + size], size, flags)
            except BlockingIOError:
                n = -1
            if not n:
                break
            if n > 0:
                self.mark_healthy()
                filled += n
                queued = n == size
                if not due:
                    due = time.monotonic() + window_s
                    wake.set_high()
            else:
                queued = False
            # A short read while closing: the socket held no more when it was taken.
            if filled >= COALESCE_BYTES or window_s <= 0 or (closing and n < size):
                filled, skipping = self._store_whole_lines(buf, view, filled, clean, skipping)
                clean, due, queued, closing = filled, 0.0, False, False
                wake.set_low()
        if filled:  # what was read is stored, also when stopping
            filled, skipping = self._store_whole_lines(buf, view, filled, clean, skipping)
        if filled and not skipping and not self.stopping:  # the last line, without its newline
            self._store_lines(view[:filled], buf.find(b"\r", 0, filled) >= 0)

    def _store_whole_lines(
        self, buf: bytearray, view: memoryview, filled: int, clean: int, skipping: bool
    ) -> tuple[int, bool]:
        """Store the whole lines of ``buf[:filled]``, whose first ``clean`` bytes hold no newline.

        Returns the bytes left at its front (the start of an unfinished line, with no
        newline) and skipping. Only the bytes read since the last call are searched: a line
        of many megabytes arriving in many reads is searched once, not once per read.
        """
        cut = buf.rfind(b"\n", clean, filled)
        if cut < 0:
            if filled <= self.record_limit:
                return filled, skipping
            if not skipping:
                self._too_long(bytes(view[: self.record_limit]))
            return 0, True
        start = 0
        if skipping:  # the too-long line ends at the first newline
            start = buf.find(b"\n", clean, cut + 1) + 1
            skipping = False
        if start <= cut:
            self._store_lines(view[start:cut], buf.find(b"\r", start, cut) >= 0)
        rest = filled - cut - 1
        buf[:rest] = bytes(view[cut + 1 : filled])  # a copy: the two ranges may overlap
        return rest, skipping

    def _store_lines(self, chunk: memoryview, has_cr: bool) -> None:
        """Store the lines of ``chunk`` (a view of the read buffer, without its last newline)."""
        if self._arrow_lines:
            lines = split_lines(chunk, self.record_limit, has_cr)
            if lines is not None:
                self.store_records(lines)
                return
            self._store_checked(bytes(chunk).split(b"\n"))  # a bad line in the chunk
            return
        raw = bytes(chunk)
        if len(raw) > self.record_limit:
            self._store_checked(raw.split(b"\n"))
            return
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError:
            self._store_checked(raw.split(b"\n"))
            return
        lines = text.split("\n")
        if "\r" in text:
            lines = [line.removesuffix("\r") for line in lines]
        self.store_records(lines)

    @property
    def _arrow_lines(self) -> bool:
        return self.default_records

    def _store_checked(self, raw_lines: list[bytes]) -> None:
        good: list[str] = []
        for raw in raw_lines:
            if len(raw) <= self.record_limit:
                try:
                    good.append(raw.decode("utf-8").removesuffix("\r"))
                    continue
                except UnicodeDecodeError as e:
                    error: UnicodeDecodeError | None = e
            else:
                error = None
            # Store the good lines before it first, so a "fail" policy costs none of them.
            if good:
                self.store_records(good)
                good = []
            if error is not None:
                self.handle_bad_record(raw, "line is not valid UTF-8", error)
            else:
                self._too_long(raw)
        if good:
            self.store_records(good)

    def _too_long(self, raw: bytes) -> None:
        self.handle_bad_record(
            raw[: self.record_limit],
            f"line longer than max_record_bytes={self.record_limit}",
        )


class _WakeThreshold:
    """A socket's ``SO_RCVLOWAT``: raised while a window is open, 1 between windows.

    Raised, a ``poll`` on the socket returns only once that many bytes are queued (or
    the connection ends, or fails); a blocking read between windows must see the
    first byte at once, hence 1 there. Where the option is missing every byte wakes
    the reader, as before.
    """

    def __init__(self, sock: socket.socket, high: int) -> None:
        self._sock = sock
        self._high = high if hasattr(socket, "SO_RCVLOWAT") else 1
        self._raised = False

    def set_high(self) -> None:
        if self._high > 1 and not self._raised:
            try:
                self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVLOWAT, self._high)
            except OSError:  # not settable on this socket: wake on every byte
                self._high = 1
                return
            self._raised = True

    def set_low(self) -> None:
        if self._raised:
            self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVLOWAT, 1)
            self._raised = False
