"""``SocketTextReceiver``: one record per UTF-8 line read from a TCP server."""

from __future__ import annotations

import contextlib
import socket
from typing import Any

from spark_receivers.errors import ReceiverError
from spark_receivers.receiver.lines import split_lines
from spark_receivers.receiver.threaded_receiver import ThreadedReceiver


class SocketTextReceiver(ThreadedReceiver):
    """Connects to ``host:port`` and stores every line (UTF-8, without its newline).

    When the connection drops or cannot be made, the receiver restarts and
    reconnects with the backoff of :class:`ThreadedReceiver` (from 500 ms,
    doubling with jitter up to ``max_backoff_ms``; reset once data arrives).
    A line longer than ``max_record_bytes`` or not valid UTF-8 is a bad record:
    counted, reported to the driver and handled by ``bad_record_policy``
    (``skip`` by default, ``fail`` or ``dead_letter``); the lines around it are
    kept. ``include_timestamp=True`` adds when each line was read. Other keyword
    arguments go to :class:`ThreadedReceiver`.

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
        **kwargs: Any,
    ) -> None:
        super().__init__(max_backoff_ms=max_backoff_ms, max_record_bytes=max_record_bytes, **kwargs)
        self.host = host
        self.port = port
        self.read_size = read_size

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
        pending = b""
        skipping = False  # inside a line already reported as too long
        while not self.stopping:
            data = sock.recv(self.read_size)
            if not data:
                break
            self.mark_healthy()
            data = pending + data
            cut = data.rfind(b"\n")
            if cut < 0:
                pending = data
                if len(pending) > self.record_limit:
                    if not skipping:
                        self._too_long(pending)
                    skipping, pending = True, b""
                continue
            pending = data[cut + 1 :]
            chunk = data[:cut]
            if skipping:
                first = chunk.find(b"\n")
                chunk = b"" if first < 0 else chunk[first + 1 :]
                skipping = False
                if first < 0:
                    continue
            self._store_lines(chunk)
        if pending and not skipping and not self.stopping:
            self._store_lines(pending)

    def _store_lines(self, chunk: bytes) -> None:
        if self._arrow_lines:
            lines = split_lines(chunk, self.record_limit)
            if lines is not None:
                self.store_records(lines)
                return
            self._store_checked(chunk.split(b"\n"))  # a bad line in the chunk
            return
        if len(chunk) > self.record_limit:
            self._store_checked(chunk.split(b"\n"))
            return
        try:
            text = chunk.decode("utf-8")
        except UnicodeDecodeError:
            self._store_checked(chunk.split(b"\n"))
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
