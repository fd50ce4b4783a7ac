"""``SocketTextReceiver``: one record per UTF-8 line read from a TCP server."""

from __future__ import annotations

import contextlib
import logging
import socket
import threading
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from spark_receivers.errors import ReceiverError
from spark_receivers.receiver.receiver import Receiver
from spark_receivers.receiver.schema import is_default

log = logging.getLogger(__name__)


class SocketTextReceiver(Receiver):
    """Connects to ``host:port`` and stores every line (UTF-8, without its newline).

    When the connection drops or cannot be made, the receiver restarts and
    reconnects with a backoff that doubles from 500 ms up to ``max_backoff_ms``.
    A line longer than ``max_record_bytes`` or not valid UTF-8 is a bad record:
    counted, reported to the driver and handled by ``bad_record_policy``
    (``skip`` by default, ``fail`` or ``dead_letter``); the lines around it are
    kept. Other keyword arguments go to :class:`Receiver`.
    """

    def __init__(
        self,
        host: str,
        port: int,
        *,
        max_record_bytes: int = 1024 * 1024,
        max_backoff_ms: int = 30_000,
        read_size: int = 256 * 1024,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.host = host
        self.port = port
        self.max_record_bytes = max_record_bytes
        self.max_backoff_ms = max_backoff_ms
        self.read_size = read_size
        self._failures = 0
        self._sock: socket.socket | None = None
        self._thread: threading.Thread | None = None

    def __getstate__(self) -> dict[str, object]:
        state = super().__getstate__()
        state["_sock"] = None
        state["_thread"] = None
        return state

    def on_start(self) -> None:
        """Start the reading thread."""
        self._thread = threading.Thread(
            target=self._receive, name=f"socket-receiver-{self.stream_id}", daemon=True
        )
        self._thread.start()

    def on_stop(self) -> None:
        """Close the connection; the reading thread ends."""
        sock, self._sock = self._sock, None
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()

    def _backoff_ms(self) -> int:
        self._failures += 1
        base = 500
        return int(min(base * 2 ** min(self._failures - 1, 16), self.max_backoff_ms))

    def _receive(self) -> None:
        try:
            sock = socket.create_connection((self.host, self.port), timeout=10)
        except OSError as e:
            if not self.is_stopped():
                self.restart(
                    f"cannot connect to {self.host}:{self.port}: {e}", e, self._backoff_ms()
                )
            return
        sock.settimeout(None)
        self._sock = sock
        try:
            self._read_lines(sock)
        except OSError as e:
            if not self.is_stopped():
                self.restart(
                    f"error reading from {self.host}:{self.port}: {e}", e, self._backoff_ms()
                )
            return
        except ReceiverError:
            return  # a bad record under the "fail" policy stopped the receiver
        if not self.is_stopped():
            self.restart(f"connection to {self.host}:{self.port} closed", None, self._backoff_ms())

    def _read_lines(self, sock: socket.socket) -> None:
        pending = b""
        skipping = False  # inside a line already reported as too long
        while not self.is_stopped():
            data = sock.recv(self.read_size)
            if not data:
                break
            self._failures = 0
            data = pending + data
            cut = data.rfind(b"\n")
            if cut < 0:
                pending = data
                if len(pending) > self.max_record_bytes:
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
        if pending and not skipping and not self.is_stopped():
            self._store_lines(pending)

    def _store_lines(self, chunk: bytes) -> None:
        if self._arrow_lines:
            lines = _split_lines(chunk, self.max_record_bytes)
            if lines is not None:
                self.store(pa.Table.from_arrays([lines], schema=self.schema))
                return
            self._store_checked(chunk.split(b"\n"))  # a bad line in the chunk
            return
        if len(chunk) > self.max_record_bytes:
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
        self.store(lines)

    @property
    def _arrow_lines(self) -> bool:
        return is_default(self.schema)

    def _store_checked(self, raw_lines: list[bytes]) -> None:
        good: list[str] = []
        for raw in raw_lines:
            if len(raw) <= self.max_record_bytes:
                try:
                    good.append(raw.decode("utf-8").removesuffix("\r"))
                    continue
                except UnicodeDecodeError as e:
                    error: UnicodeDecodeError | None = e
            else:
                error = None
            # Store the good lines before it first, so a "fail" policy costs none of them.
            if good:
                self.store(good)
                good = []
            if error is not None:
                self.handle_bad_record(raw, "line is not valid UTF-8", error)
            else:
                self._too_long(raw)
        if good:
            self.store(good)

    def _too_long(self, raw: bytes) -> None:
        self.handle_bad_record(
            raw[: self.max_record_bytes],
            f"line longer than max_record_bytes={self.max_record_bytes}",
        )


def _split_lines(chunk: bytes, max_record_bytes: int) -> pa.Array | None:
    """The lines of ``chunk`` as an Arrow string array, split and checked in C.

    Each line loses its newline and one trailing carriage return. None when a line is longer
    than ``max_record_bytes`` or not valid UTF-8: the caller then goes line by line.
    No Python object is made per line, which is what makes a socket receiver cheap.
    """
    lines = pc.split_pattern(pa.array([chunk], pa.binary()), b"\n").values
    if len(chunk) > max_record_bytes:
        longest = pc.max(pc.binary_length(lines)).as_py()
        if longest > max_record_bytes:
            return None
    try:
        text = lines.cast(pa.string())  # validates UTF-8
    except pa.ArrowInvalid:
        return None
    if b"\r" in chunk:
        text = pc.replace_substring_regex(text, "\r$", "", max_replacements=1)
    return text
