"""Probe: the CPU a socket receiver's read loop spends on one line of many megabytes.

A thread sends ``before\\n`` + a line of N MiB + ``\\nafter\\n`` over a loopback socket in
64 KiB writes; ``SocketTextReceiver._read_lines`` reads it (default read size and window,
``max_record_bytes`` 64 MiB) with its stores counted, not kept. Prints the reading thread's
CPU seconds (``time.thread_time``) per size. Run from the repository's root:
``python bench/results/ab-20261130-long-line/long_line.py [MiB ...]`` (default 8 16 32 48).
"""

from __future__ import annotations

import os
import socket
import sys
import threading
import time

sys.path.insert(0, os.getcwd())
from spark_receivers.receivers import SocketTextReceiver


class Probe(SocketTextReceiver):
    """Reads without a supervisor: never stopping, healthy, its stores counted."""

    stopping = False  # type: ignore[assignment]


def measure(mib: int) -> tuple[float, list[int]]:
    payload = b"before\n" + b"y" * (mib << 20) + b"\nafter\n"
    server = socket.create_server(("127.0.0.1", 0))

    def send() -> None:
        conn, _ = server.accept()
        with conn:
            for i in range(0, len(payload), 1 << 16):
                conn.sendall(payload[i : i + (1 << 16)])

    threading.Thread(target=send, daemon=True).start()
    receiver = Probe("127.0.0.1", server.getsockname()[1], max_record_bytes=64 << 20)
    stored: list[int] = []
    receiver._store_lines = lambda chunk, has_cr: stored.append(len(chunk))  # type: ignore[method-assign]
    receiver.mark_healthy = lambda: None  # type: ignore[method-assign]
    sock = socket.create_connection(("127.0.0.1", server.getsockname()[1]))
    c0 = time.thread_time()
    receiver._read_lines(sock)
    cpu = time.thread_time() - c0
    sock.close()
    server.close()
    return cpu, stored


def main() -> None:
    sizes = [int(a) for a in sys.argv[1:]] or [8, 16, 32, 48]
    for mib in sizes:
        cpu, stored = measure(mib)
        print(f"{mib:3d} MiB line: {cpu:.3f} CPU-s in the read loop; stored chunks {stored}")


if __name__ == "__main__":
    main()
