"""WebSocketReceiver against real WebSocket servers on 127.0.0.1, started in the test.

The feed is the websockets library's own server (a real server of the protocol,
not a stand-in for a part of ours); the silent peer of the ping test is a raw
socket that completes the handshake and then never answers.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import queue
import socket
import threading

import pyarrow as pa
import pytest
from harness import HarnessSupervisor, free_port
from waiting import wait_until
from websockets.exceptions import ConnectionClosed
from websockets.sync.server import ServerConnection, serve

from spark_receivers.errors import ConfigError
from spark_receivers.receivers import WebSocketReceiver


class Feed:
    """A WebSocket server that sends what the test queues and keeps what clients send."""

    def __init__(self) -> None:
        self.port = free_port()
        self.outbox: queue.Queue[str | bytes] = queue.Queue()
        self.received: list[tuple[int, str | bytes]] = []  # (connection, message)
        self.connections = 0
        self._lock = threading.Lock()
        self._open: list[ServerConnection] = []
        self._start()

    def _handler(self, ws: ServerConnection) -> None:
        with self._lock:
            self.connections += 1
            n = self.connections
            self._open.append(ws)
        try:
            while True:
                # what the client sends (its subscription) ...
                with contextlib.suppress(TimeoutError):
                    self.received.append((n, ws.recv(timeout=0.01)))
                # ... and what the test queued
                try:
                    item = self.outbox.get(timeout=0.02)
                except queue.Empty:
                    continue
                try:
                    ws.send(item)
                except ConnectionClosed:
                    self.outbox.put(item)  # never sent: the next connection gets it
                    raise
        except ConnectionClosed:
            pass

    def _start(self) -> None:
        self.server = serve(self._handler, "127.0.0.1", self.port, max_size=None)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def stop(self) -> None:
        self.server.shutdown()
        with self._lock:
            for ws in self._open:
                ws.close()
            self._open.clear()
        self.thread.join(10)

    def restart(self) -> None:
        self.stop()
        self._start()

    def send(self, *items: str | bytes) -> None:
        for item in items:
            self.outbox.put(item)


@pytest.fixture
def feed():
    f = Feed()
    yield f
    f.stop()


def start(receiver) -> HarnessSupervisor:
    return HarnessSupervisor(receiver).start()


def test_messages_arrive_after_the_subscription_is_sent(feed):
    schema = pa.schema([("payload", pa.string()), ("binary", pa.bool_())])
    receiver = WebSocketReceiver(
        f"ws://127.0.0.1:{feed.port}/feed",
        subscribe=['{"op": "subscribe", "channel": "ticks"}', "second"],
        schema=schema,
        batch_wait_ms=50,
    )
    sup = start(receiver)
    try:
        assert wait_until(lambda: len(feed.received) == 2, 10)
        assert feed.received == [(1, '{"op": "subscribe", "channel": "ticks"}'), (1, "second")]
        feed.send(*[f"tick {i}" for i in range(500)], "ü".encode())
        records = sup.wait_for(501)
        assert records[:500] == [{"payload": f"tick {i}", "binary": False} for i in range(500)]
        assert records[500] == {"payload": "ü", "binary": True}
        assert all(len(batch) <= 1000 for batch in sup.reliable_batches)
    finally:
        sup.shutdown()


def test_it_reconnects_after_the_server_restarts_and_subscribes_again(feed):
    receiver = WebSocketReceiver(
        f"ws://127.0.0.1:{feed.port}/",
        subscribe="sub",
        batch_wait_ms=50,
        backoff_base_ms=100,
        max_backoff_ms=500,
    )
    sup = start(receiver)
    try:
        feed.send("one", "two")
        assert sup.wait_for(2) == ["one", "two"]
        feed.restart()
        assert wait_until(lambda: sup.restarts, 10)
        assert "the WebSocket connection to ws://127.0.0.1" in sup.restarts[0]
        feed.send("three")
        assert sup.wait_for(3) == ["one", "two", "three"]
        # the subscription went out on each connection, first thing
        assert wait_until(lambda: feed.connections >= 2, 5)
        assert [c for c, m in feed.received if m == "sub"] == list(range(1, feed.connections + 1))
    finally:
        sup.shutdown()


@pytest.mark.parametrize("policy", ["skip", "dead_letter"])
def test_oversize_and_binary_messages_go_by_the_policy_and_the_rest_arrive(feed, tmp_path, policy):
    receiver = WebSocketReceiver(
        f"ws://127.0.0.1:{feed.port}/",
        batch_wait_ms=50,
        max_record_bytes=1024,
        backoff_base_ms=100,
        max_backoff_ms=500,
        bad_record_policy=policy,
        dead_letter_dir=str(tmp_path) if policy == "dead_letter" else None,
    )
    sup = start(receiver)
    try:
        feed.send("before", b"x\xff")
        assert sup.wait_for(1) == ["before"]
        assert "is not UTF-8" in sup.wait_for_errors(1)[0]
        feed.send("z" * 4096)
        errors = sup.wait_for_errors(2)
        assert "longer than max_record_bytes (1,024 bytes): refused as it arrived" in errors[1]
        feed.send("after")  # on the next connection
        assert sup.wait_for(2) == ["before", "after"]
        assert receiver.bad_records == 2
    finally:
        sup.shutdown()
    if policy == "dead_letter":
        assert len(list(tmp_path.glob("stream-0-*.jsonl"))) == 1


def test_a_bad_message_under_fail_stops_the_receiver(feed):
    # A batch that waits 5 s: "before" is still in it when the bad message comes, and it
    # is stored before the receiver stops (it was stored after the stop, which a test
    # beside a CPU hog saw first, 2026-11-28).
    receiver = WebSocketReceiver(
        f"ws://127.0.0.1:{feed.port}/", batch_wait_ms=5_000, bad_record_policy="fail"
    )
    sup = start(receiver)
    feed.send("before", b"x\xff", "after")
    assert wait_until(lambda: sup.stopped_with is not None, 10)
    assert "not UTF-8" in sup.stopped_with
    assert sup.records == ["before"]


class SilentPeer:
    """Completes the WebSocket handshake, then never reads or answers a ping."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.accepted: list[socket.socket] = []
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        with contextlib.suppress(OSError):
            while True:
                conn, _ = self.sock.accept()
                self.accepted.append(conn)
                request = b""
                while b"\r\n\r\n" not in request:
                    request += conn.recv(4096)
                key = next(
                    line.split(b":", 1)[1].strip()
                    for line in request.split(b"\r\n")
                    if line.lower().startswith(b"sec-websocket-key:")
                )
                magic = b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11"
                accept = base64.b64encode(hashlib.sha1(key + magic).digest())
                conn.sendall(
                    b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n"
                    b"Connection: Upgrade\r\nSec-WebSocket-Accept: " + accept + b"\r\n\r\n"
                )

    def close(self) -> None:
        self.sock.close()
        for conn in self.accepted:
            conn.close()


def test_a_peer_that_stops_answering_pings_is_left_and_reconnected():
    peer = SilentPeer()
    receiver = WebSocketReceiver(
        f"ws://127.0.0.1:{peer.port}/",
        ping_interval_s=0.3,
        ping_timeout_s=0.3,
        backoff_base_ms=100,
        max_backoff_ms=200,
    )
    sup = start(receiver)
    try:
        assert wait_until(lambda: len(sup.restarts) >= 2, 15)
        assert "keepalive ping timeout" in sup.restarts[0], sup.restarts[0]
        assert len(peer.accepted) >= 2  # it connected again
    finally:
        sup.shutdown()
        peer.close()


def test_an_unreachable_server_says_so_without_the_password():
    port = free_port()  # nothing listens there
    receiver = WebSocketReceiver(
        f"ws://user:s3cret@127.0.0.1:{port}/feed", backoff_base_ms=60_000, max_backoff_ms=60_000
    )
    sup = start(receiver)
    try:
        assert wait_until(lambda: sup.restarts, 15)
        assert sup.restarts[0].startswith(
            f"cannot connect to the WebSocket server at ws://user:***@127.0.0.1:{port}/feed: "
        ), sup.restarts[0]
        assert "s3cret" not in sup.restarts[0] and "s3cret" not in receiver.describe()
    finally:
        sup.shutdown()


def test_bad_options_are_refused():
    with pytest.raises(ConfigError, match=r"url must be ws://host\[:port\]/path"):
        WebSocketReceiver("http://h/")
    with pytest.raises(ConfigError, match="ping_timeout_s must be a number > 0"):
        WebSocketReceiver("ws://h/", ping_timeout_s=0)
    with pytest.raises(ConfigError, match="subscribe must be a text message"):
        WebSocketReceiver("ws://h/", subscribe=[b"x"])  # type: ignore[list-item]
