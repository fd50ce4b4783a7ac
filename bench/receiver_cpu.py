"""CPU-seconds per million 100-byte lines of a built-in receiver's read-decode-store path.

Each receiver runs under a real :class:`~spark_receivers.receiver.supervisor.ReceiverSupervisor`
(blocks kept in the task's own store, keepers off) that reports to the minimal tracker of
``bench/store_bench.py`` in another process. The lines come from outside this process, so
that this process's CPU time (``time.process_time()``: every thread of it) from handing them
over until the driver accepted the last one is the receiver's alone — reading, splitting and
checking the lines, building the blocks, storing and reporting them:

- ``socket``: a child process serves the N lines over TCP (``SocketTextReceiver``), flat
  out, once told to start (its CPU is not counted); ``socket_1m``: the same receiver reading
  up to 1 MiB per ``recv`` instead of its default;
- ``file_tail``: a file of N lines is hard-linked into the followed directory (written
  beforehand, outside the measured time);
- ``http_lines``: a child process POSTs the lines in bodies of 10,000 lines, one request after
  the other on one connection (its CPU is not counted); ``http_json``: the same with
  ``format="json"`` and 100-byte JSON objects (``{"n": <int>, "user": "<text>", "ok": true}``),
  stored as their text (the default schema); ``http_json_schema``: the same objects into
  the declared schema ``n bigint, user string, ok boolean`` (three columns);
- ``redis``: a child process adds the lines with ``XADD`` (field ``value``, 99 bytes) to a
  redis-server started for the run; the receiver reads them as they come, up to 1,000 an
  ``XREADGROUP``; ``redis_no_positions``: the same receiver storing no position with its
  batches (``bench/redis_positions.py``), what issue 33's positions cost it;
- ``mqtt``: a child process publishes the lines at QoS 1 to a mosquitto started for the
  run (no in-flight or queue limit); the receiver subscribes at QoS 1 and acks each
  message after its batch is stored.

Run: ``python -m bench.receiver_cpu --receivers file_tail,http_lines --lines 1000000``; each
receiver is measured ``--repeats`` times (fresh supervisor each time) and the lowest figure
is printed with the median and the others (the machine is shared: the lowest is the least
disturbed).
"""

from __future__ import annotations

import argparse
import functools
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

from bench.store_bench import StoreDriver

__all__ = ["RECEIVERS", "measure"]

LINE_BYTES = 100  # with its newline
BODY_LINES = 10_000
WAIT_S = 300.0


def _lines(n: int) -> bytes:
    filler = "x" * (LINE_BYTES - 12)
    return "".join(f"{i:010d} {filler}\n" for i in range(n)).encode()


def _supervised(receiver: Any, driver: StoreDriver, secret: str) -> Any:
    from spark_receivers.config import StreamingConfig
    from spark_receivers.receiver.supervisor import ReceiverSupervisor

    config = StreamingConfig(block_keeper_enabled=False, receiver_drain_timeout_s=5.0)
    return ReceiverSupervisor(receiver, 0, driver.address, secret, config, "127.0.0.1", "bench")


def _wait_stored(sup: Any, n: int) -> None:
    deadline = time.monotonic() + WAIT_S
    while sup.records_stored < n:
        if time.monotonic() > deadline:
            msg = f"only {sup.records_stored} of {n} lines stored after {WAIT_S} s"
            raise RuntimeError(msg)
        time.sleep(0.005)  # a file or another process feeds it: nothing to wait on (bench)


def _cpu_to_store(sup: Any, n: int, feed: Any) -> float:
    """This process's CPU seconds from ``feed()`` (which hands the source its lines) until
    ``sup`` stored ``n`` records; then the supervisor is stopped."""
    try:
        t0 = time.process_time()
        feed()
        _wait_stored(sup, n)
        return time.process_time() - t0
    finally:
        sup.stop("benchmark over")


def _feeder(cmd: list[str]) -> Any:
    """A ``feed`` that runs a child process (the source's client) to its end."""
    return lambda: subprocess.run(cmd, check=True, timeout=WAIT_S)


def _file_tail(n: int, data: bytes, driver: StoreDriver, secret: str) -> float:
    from spark_receivers.receivers.file_tail import FileTailReceiver

    root = tempfile.mkdtemp(prefix="bench-tail-")
    try:
        staged = os.path.join(root, "lines.log")
        with open(staged, "wb") as f:
            f.write(data)
        followed = os.path.join(root, "followed")
        os.mkdir(followed)
        receiver = FileTailReceiver(
            followed, "*.log", poll_interval_ms=20, storage_level="MEMORY_AND_DISK"
        )
        sup = _supervised(receiver, driver, secret)
        sup.start()
        return _cpu_to_store(sup, n, lambda: os.link(staged, os.path.join(followed, "app.log")))
    finally:
        shutil.rmtree(root, ignore_errors=True)


_POSTER = """
import http.client, sys
host, port, lines, per, size, kind = sys.argv[1], *map(int, sys.argv[2:6]), sys.argv[6]
filler = "x" * (size - 12)
json_filler = "x" * (size - 42)
conn = http.client.HTTPConnection(host, port)
sent = 0
while sent < lines:
    k = min(per, lines - sent)
    if kind == "json":
        body = "".join(
            f'{{"n": {i:10d}, "user": "{json_filler}", "ok": true}}\\n'
            for i in range(sent, sent + k)
        ).encode()
    else:
        body = "".join(f"{i:010d} {filler}\\n" for i in range(sent, sent + k)).encode()
    conn.request("POST", "/ingest", body, {"Content-Type": "text/plain"})
    answer = conn.getresponse()
    answer.read()
    if answer.status != 200:
        sys.exit(f"answer {answer.status}")
    sent += k
"""


def _http(
    n: int, data: bytes, driver: StoreDriver, secret: str, *, format: str = "lines", **kwargs: Any
) -> float:
    from spark_receivers.receivers.http import HttpReceiver

    receiver = HttpReceiver(
        "127.0.0.1",
        0,
        format=format,
        idempotency_window_s=0,
        storage_level="MEMORY_AND_DISK",
        **kwargs,
    )
    sup = _supervised(receiver, driver, secret)
    sup.start()
    deadline = time.monotonic() + 30
    while receiver.bound_port is None and time.monotonic() < deadline:
        time.sleep(0.01)
    cmd = [sys.executable, "-c", _POSTER, "127.0.0.1", str(receiver.bound_port)]
    args = [str(n), str(BODY_LINES), str(LINE_BYTES), format]
    return _cpu_to_store(sup, n, _feeder([*cmd, *args]))


_SERVER = """
import socket, sys
lines, size = map(int, sys.argv[1:3])
filler = b"x" * (size - 12)
data = b"".join(b"%010d " % i + filler + b"\\n" for i in range(lines))
with socket.create_server(("127.0.0.1", 0)) as server:
    print(server.getsockname()[1], flush=True)
    conn, _ = server.accept()
    sys.stdin.readline()  # the benchmark's start
    conn.sendall(data)
    conn.shutdown(socket.SHUT_WR)
    conn.recv(1)  # until the receiver closes
    conn.close()
"""


def _socket(
    n: int, data: bytes, driver: StoreDriver, secret: str, *, read_size: int | None = None
) -> float:
    from spark_receivers.receivers.socket_text import SocketTextReceiver

    server = subprocess.Popen(
        [sys.executable, "-c", _SERVER, str(n), str(LINE_BYTES)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert server.stdin is not None and server.stdout is not None
    try:
        port = int(server.stdout.readline())
        kwargs = {} if read_size is None else {"read_size": read_size}
        receiver = SocketTextReceiver("127.0.0.1", port, storage_level="MEMORY_AND_DISK", **kwargs)
        sup = _supervised(receiver, driver, secret)
        sup.start()

        def feed() -> None:
            assert server.stdin is not None
            server.stdin.write("go\n")
            server.stdin.flush()

        return _cpu_to_store(sup, n, feed)
    finally:
        server.kill()
        server.wait(10)


_ADDER = """
import redis, sys
port, lines, size = map(int, sys.argv[1:4])
filler = b"x" * (size - 12)
client = redis.Redis(port=port)
pipe = client.pipeline(transaction=False)
for i in range(lines):
    pipe.xadd("lines", {b"value": b"%010d " % i + filler})
    if i % 10_000 == 9_999:
        pipe.execute()
pipe.execute()
"""


def _redis(
    n: int, data: bytes, driver: StoreDriver, secret: str, *, positions: bool = True
) -> float:
    from bench.redis_positions import RedisStreamReceiverWithoutPositions
    from spark_receivers.receivers.redis_stream import RedisStreamReceiver

    kind = RedisStreamReceiver if positions else RedisStreamReceiverWithoutPositions
    port = _free_port()
    root = tempfile.mkdtemp(prefix="bench-redis-")
    options = ["--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--dir", root]
    server = subprocess.Popen(
        ["redis-server", "--port", str(port), *options], stdout=subprocess.DEVNULL
    )
    try:
        url = f"redis://127.0.0.1:{port}/0"
        receiver = kind("lines", "bench", url=url, block_ms=100, storage_level="MEMORY_AND_DISK")
        sup = _supervised(receiver, driver, secret)
        deadline = time.monotonic() + 30
        while not _ping(port) and time.monotonic() < deadline:
            time.sleep(0.05)
        sup.start()
        cmd = [sys.executable, "-c", _ADDER, str(port), str(n), str(LINE_BYTES - 1)]
        return _cpu_to_store(sup, n, _feeder(cmd))
    finally:
        server.terminate()
        server.wait(10)
        shutil.rmtree(root, ignore_errors=True)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _ping(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1) as s:
            s.sendall(b"PING\r\n")
            return s.recv(16).startswith(b"+PONG")
    except OSError:
        return False


_PUBLISHER = """
import paho.mqtt.client as mqtt, sys
port, lines, size = map(int, sys.argv[1:4])
filler = b"x" * (size - 12)
client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id="bench-publisher")
client.max_inflight_messages_set(1000)
client.connect("127.0.0.1", port)
client.loop_start()
for start in range(0, lines, 1000):
    sent = [
        client.publish("bench/lines", b"%010d " % i + filler, qos=1)
        for i in range(start, min(lines, start + 1000))
    ]
    for info in sent:
        info.wait_for_publish(300)
client.disconnect()
client.loop_stop()
"""


def _mqtt(n: int, data: bytes, driver: StoreDriver, secret: str) -> float:
    from spark_receivers.receivers.mqtt import MqttReceiver

    port = _free_port()
    root = tempfile.mkdtemp(prefix="bench-mqtt-")
    conf = os.path.join(root, "mosquitto.conf")
    with open(conf, "w") as f:
        f.write(f"listener {port} 127.0.0.1\nallow_anonymous true\npersistence false\n")
        f.write("max_inflight_messages 0\nmax_queued_messages 0\n")
    server = subprocess.Popen(
        ["mosquitto", "-c", conf], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        deadline = time.monotonic() + 30
        while not _listening(port) and time.monotonic() < deadline:
            time.sleep(0.05)
        receiver = MqttReceiver("127.0.0.1", port, "bench/#", storage_level="MEMORY_AND_DISK")
        sup = _supervised(receiver, driver, secret)
        sup.start()
        try:
            receiver.wait_subscribed(30)
        except BaseException:
            sup.stop("benchmark over")
            raise
        cmd = [sys.executable, "-c", _PUBLISHER, str(port), str(n), str(LINE_BYTES - 1)]
        return _cpu_to_store(sup, n, _feeder(cmd))
    finally:
        server.terminate()
        server.wait(10)
        shutil.rmtree(root, ignore_errors=True)


def _listening(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1):
            return True
    except OSError:
        return False


RECEIVERS: dict[str, Callable[[int, bytes, StoreDriver, str], float]] = {
    "mqtt": _mqtt,
    "socket": _socket,
    "socket_1m": functools.partial(_socket, read_size=1 << 20),
    "file_tail": _file_tail,
    "http_lines": _http,
    "http_json": functools.partial(_http, format="json"),
    "http_json_schema": functools.partial(
        _http, format="json", schema="n bigint, user string, ok boolean"
    ),
    "redis": _redis,
    # the same storing no positions (bench/redis_positions.py): what positions cost it
    "redis_no_positions": functools.partial(_redis, positions=False),
}


def measure(names: list[str], n: int, repeats: int) -> dict[str, list[float]]:
    """CPU-seconds per million lines, ``repeats`` figures per receiver."""
    from spark_receivers.rpc.auth import new_secret

    secret = new_secret()
    data = _lines(n)
    out: dict[str, list[float]] = {}
    with StoreDriver(secret) as driver:
        for name in names:
            run = RECEIVERS[name]
            run(min(n, 20_000), data[: min(n, 20_000) * LINE_BYTES], driver, secret)  # warm up
            out[name] = [run(n, data, driver, secret) * 1e6 / n for _ in range(repeats)]
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m bench.receiver_cpu", description=(__doc__ or "").split("\n")[0]
    )
    p.add_argument("--receivers", default=",".join(RECEIVERS))
    p.add_argument("--lines", type=int, default=1_000_000)
    p.add_argument("--repeats", type=int, default=3)
    args = p.parse_args(argv)
    names = [r for r in args.receivers.split(",") if r]
    for name, figures in measure(names, args.lines, args.repeats).items():
        each = ", ".join(f"{x:.3f}" for x in figures)
        print(
            f"{name:12} {min(figures):.3f} CPU-s per million lines, median "
            f"{statistics.median(figures):.3f}  (runs: {each})"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
