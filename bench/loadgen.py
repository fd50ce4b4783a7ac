"""The benchmarks' load from a shell: the package's line server, and how fast it goes.

The server is :class:`spark_receivers.receivers.line_source.LineSource`, the one the demo
and the docs' examples use; the benchmarks run it with its default words (1,000 seeded words of
2-9 letters) and a window (``seconds``)::

    python -m bench.loadgen --rate 50000 --seconds 30 --port 9999
    python -m bench.loadgen --measure --seconds 3     # flat-out lines/s over loopback
"""

from __future__ import annotations

import argparse
import json
import socket
import subprocess
import sys
import time
from dataclasses import asdict

from spark_receivers.receivers.line_source import LineSource, LineSourceInfo
from spark_receivers.receivers.lines import BLOCK_LINES, LINE_BYTES, LinePool

__all__ = ["main", "measure_generator", "measure_loopback"]


# -- CLI ---------------------------------------------------------------------------------------


def _drain(host: str, port: int) -> None:
    """Read a server's stream to EOF as fast as possible; print ``bytes lines`` (for --measure)."""
    total = 0
    buf = bytearray(1 << 20)
    with socket.create_connection((host, port), timeout=30) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
        while k := s.recv_into(buf):
            total += k
    print(total, total // LINE_BYTES, flush=True)


def measure_generator(lines: int = 2_000_000) -> float:
    """Lines/s the pool alone can hand out (no socket): the generator's ceiling."""
    pool = LinePool()
    t = time.perf_counter()
    touched = 0
    for index in range(lines // BLOCK_LINES):
        touched += len(pool.block(index))
    elapsed = time.perf_counter() - t
    assert touched == (lines // BLOCK_LINES) * BLOCK_LINES * LINE_BYTES
    return lines / elapsed


def measure_loopback(seconds: float = 3.0) -> LineSourceInfo:
    """Flat-out lines/s over loopback to a reader in another process."""
    with LineSource(None, seconds) as server:
        reader = subprocess.Popen(
            [sys.executable, "-m", "bench.loadgen", "--drain", str(server.port)],
            stdout=subprocess.PIPE,
            text=True,
        )
        server.wait_finished(seconds + 60)
        out, _ = reader.communicate(timeout=30)
    info = server.info()
    received = int(out.split()[1])
    if received != info.lines_sent:
        raise RuntimeError(f"reader got {received} lines, server sent {info.lines_sent}")
    return info


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.loadgen", description=__doc__.split("\n")[0])
    p.add_argument("--rate", type=int, default=None, help="lines/s; omit for flat out")
    p.add_argument("--seconds", type=float, default=30.0)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--accept-timeout", type=float, default=300.0)
    p.add_argument("--measure", action="store_true", help="report flat-out lines/s and exit")
    p.add_argument("--drain", type=int, metavar="PORT", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.drain is not None:
        _drain(args.host, args.drain)
        return 0
    if args.measure:
        gen = measure_generator()
        info = measure_loopback(args.seconds)
        print(
            json.dumps(
                {
                    "generator_only_lines_per_s": round(gen),
                    "loopback_lines_per_s": round(info.achieved_rate),
                    "loopback_mb_per_s": round(info.achieved_rate * LINE_BYTES / 1e6, 1),
                    "seconds": round(info.elapsed_s, 3),
                    "lines_sent": info.lines_sent,
                }
            )
        )
        return 0
    with LineSource(
        args.rate,
        args.seconds,
        host=args.host,
        port=args.port,
        accept_timeout_s=args.accept_timeout,
    ) as server:
        print(f"listening {server.host} {server.port}", flush=True)
        try:
            server.wait_finished(args.accept_timeout + args.seconds + 10)
        except KeyboardInterrupt:
            server.stop()
    info = server.info()
    print(json.dumps({**asdict(info), "achieved_rate": round(info.achieved_rate)}), flush=True)
    return 0 if info.error is None else 1


if __name__ == "__main__":
    sys.exit(main())
