"""SocketTextReceiver under a real supervisor: lines, reconnects, bad records per policy."""

from __future__ import annotations

import json
import socket
import threading

import pytest

from spark_receivers import SocketTextReceiver
from spark_receivers.errors import ConfigError, ReceiverError
from spark_receivers.rpc import messages as m
from spark_receivers.testing import StandInTracker, supervise

GOOD_BEFORE = [f"good {i}" for i in range(50)]
GOOD_AFTER = [f"after {i}" for i in range(50)]
PAYLOAD = (
    "\n".join(GOOD_BEFORE).encode()
    + b"\nbad \xff\xfe utf8\n"
    + b"x" * 5000
    + b"\nwindows line\r\n"
    + "\n".join(GOOD_AFTER).encode()
    + b"\n"
)


class OneShotServer:
    """Sends ``payload`` to each client, then closes the connection."""

    def __init__(self, payload: bytes) -> None:
        self.payload = payload
        self.server = socket.create_server(("127.0.0.1", 0))
        self.port = self.server.getsockname()[1]
        self.connections = 0
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.server.accept()
            except OSError:
                return
            self.connections += 1
            with conn:
                conn.sendall(self.payload)

    def close(self) -> None:
        self.server.close()


class ScriptedServer:
    """Accepts one client and runs ``script(conn)`` on its own thread; the connection
    stays open until :meth:`close`."""

    def __init__(self, script) -> None:
        self.server = socket.create_server(("127.0.0.1", 0))
        self.port = self.server.getsockname()[1]
        self.held: list[socket.socket] = []
        threading.Thread(target=self._serve, args=(script,), daemon=True).start()

    def _serve(self, script) -> None:
        conn, _ = self.server.accept()
        self.held.append(conn)
        script(conn)

    def close(self) -> None:
        for conn in self.held:
            conn.close()
        self.server.close()


@pytest.fixture
def tracker():
    t = StandInTracker()
    yield t
    t.close()


def run(tracker, receiver, expected_records: int):
    sup = supervise(tracker, receiver, receiver_restart_delay_ms=10_000)
    sup.start()
    tracker.wait_for(lambda: tracker.records() >= expected_records)
    values = tracker.stored_table(sup).column("value").to_pylist()
    sup.stop("test over")
    sup.await_termination(15)
    return values


def test_bad_lines_are_skipped_counted_and_reported_the_rest_kept(tracker):
    server = OneShotServer(PAYLOAD)
    try:
        receiver = SocketTextReceiver("127.0.0.1", server.port, max_record_bytes=1000)
        values = run(tracker, receiver, len(GOOD_BEFORE) + len(GOOD_AFTER) + 1)
    finally:
        server.close()
    assert values == [*GOOD_BEFORE, "windows line", *GOOD_AFTER]
    assert receiver.bad_records == 2
    reports = [r.message for r in tracker.of(m.ReportError) if "bad record" in r.message]
    assert any("not valid UTF-8" in r and "\\xff" in r for r in reports)
    assert any("longer than max_record_bytes=1000" in r for r in reports)


@pytest.mark.parametrize("coalesce_ms", [0, 50])
@pytest.mark.parametrize("read_size", [7, 64, 1001, 4096])
def test_lines_split_across_reads_come_whole_and_in_order(tracker, read_size, coalesce_ms):
    """The receiver reads into one reused buffer: lines, bad ones and a too-long one
    straddle reads, and a last line without its newline is kept when the server closes."""
    server = OneShotServer(PAYLOAD + b"no newline at the end")
    try:
        receiver = SocketTextReceiver(
            "127.0.0.1",
            server.port,
            max_record_bytes=1000,
            read_size=read_size,
            coalesce_ms=coalesce_ms,
        )
        values = run(tracker, receiver, len(GOOD_BEFORE) + len(GOOD_AFTER) + 2)
    finally:
        server.close()
    assert values == [*GOOD_BEFORE, "windows line", *GOOD_AFTER, "no newline at the end"]
    assert receiver.bad_records == 2


def test_lines_are_stored_when_the_window_ends_though_the_connection_stays_open(tracker):
    """Coalescing waits for the window, not for more data: a quiet source's lines come."""
    # Sends, then nothing, and the connection stays open.
    server = ScriptedServer(lambda conn: conn.sendall(b"one\ntwo\nunfinished"))
    receiver = SocketTextReceiver("127.0.0.1", server.port, coalesce_ms=200)
    sup = supervise(tracker, receiver, receiver_restart_delay_ms=10_000)
    try:
        sup.start()
        tracker.wait_for(lambda: tracker.records() >= 2)
        assert tracker.stored_table(sup).column("value").to_pylist() == ["one", "two"]
        server.held[0].sendall(b" line\n")
        tracker.wait_for(lambda: tracker.records() >= 3)
        assert tracker.stored_table(sup).column("value").to_pylist()[-1] == "unfinished line"
    finally:
        sup.stop("test over")
        sup.await_termination(15)
        server.close()


def test_a_line_longer_than_the_read_buffer_grows_it(tracker):
    """An allowed line may outgrow the 4 MiB buffer (max_record_bytes is larger)."""
    long_line = b"y" * (5 << 20)
    server = OneShotServer(b"before\n" + long_line + b"\nafter\n")
    try:
        receiver = SocketTextReceiver("127.0.0.1", server.port, max_record_bytes=8 << 20)
        values = run(tracker, receiver, 3)
    finally:
        server.close()
    assert values == ["before", long_line.decode(), "after"]


def test_dead_letter_policy_sets_bad_lines_aside(tracker, tmp_path):
    server = OneShotServer(PAYLOAD)
    try:
        receiver = SocketTextReceiver(
            "127.0.0.1",
            server.port,
            max_record_bytes=1000,
            bad_record_policy="dead_letter",
            dead_letter_dir=str(tmp_path),
        )
        values = run(tracker, receiver, len(GOOD_BEFORE) + len(GOOD_AFTER) + 1)
    finally:
        server.close()
    assert len(values) == len(GOOD_BEFORE) + len(GOOD_AFTER) + 1
    (dead,) = list(tmp_path.glob("stream-0-*.jsonl"))
    entries = [json.loads(line) for line in dead.read_text().splitlines()]
    assert [e["reason"] for e in entries] == [
        "line is not valid UTF-8",
        "line longer than max_record_bytes=1000",
    ]
    assert "base64" in entries[0]
    assert entries[1]["text"] == "x" * 1000


def test_fail_policy_stops_the_receiver_with_the_error(tracker):
    server = OneShotServer(PAYLOAD)
    try:
        receiver = SocketTextReceiver("127.0.0.1", server.port, bad_record_policy="fail")
        sup = supervise(tracker, receiver)
        sup.start()
        with pytest.raises(ReceiverError, match="bad record: line is not valid UTF-8"):
            sup.await_termination(15)
    finally:
        server.close()
    (dereg,) = tracker.of(m.DeregisterReceiver)
    assert dereg.message == "bad record: line is not valid UTF-8"
    assert "UnicodeDecodeError" in dereg.error
    assert dereg.bad_record  # for good: the driver fails the context, no restart
    assert tracker.records() == len(GOOD_BEFORE)  # the lines before it were kept


def test_reconnects_after_the_connection_drops(tracker):
    server = OneShotServer(b"one\ntwo\n")
    try:
        receiver = SocketTextReceiver("127.0.0.1", server.port)
        sup = supervise(tracker, receiver, receiver_restart_delay_ms=10)
        sup.start()
        tracker.wait_for(lambda: tracker.records() >= 4)  # two connections' worth
        assert server.connections >= 2
        assert len(tracker.of(m.RegisterReceiver)) >= 2
        sup.stop("test over")
        sup.await_termination(15)
    finally:
        server.close()


def test_bad_policy_configuration_fails_clearly():
    with pytest.raises(ConfigError, match="must be one of skip, fail, dead_letter, got 'drop'"):
        SocketTextReceiver("127.0.0.1", 1, bad_record_policy="drop")
    with pytest.raises(ConfigError, match="needs dead_letter_dir"):
        SocketTextReceiver("127.0.0.1", 1, bad_record_policy="dead_letter")
    with pytest.raises(ConfigError, match="coalesce_ms must be between 0 and 1000"):
        SocketTextReceiver("127.0.0.1", 1, coalesce_ms=-1)
    with pytest.raises(ConfigError, match="read_size must be at least 1 byte"):
        SocketTextReceiver("127.0.0.1", 1, read_size=0)


def test_include_timestamp_adds_when_the_lines_were_read(tracker):
    server = OneShotServer(b"a\nb\n")
    try:
        receiver = SocketTextReceiver("127.0.0.1", server.port, include_timestamp=True)
        sup = supervise(tracker, receiver, receiver_restart_delay_ms=10_000)
        sup.start()
        tracker.wait_for(lambda: tracker.records() >= 2)
        tables = [tracker.stored_table(sup)]
        sup.stop("test over")
        sup.await_termination(15)
    finally:
        server.close()
    rows = [row for t in tables for row in t.to_pylist()]
    assert [r["value"] for r in rows[:2]] == ["a", "b"]
    assert str(tables[0].schema.field("timestamp").type) == "timestamp[us, tz=UTC]"
    assert all(r["timestamp"] is not None for r in rows)


class CountingSocket(socket.socket):
    """A client socket that counts its reads."""

    reads = 0

    def recv_into(self, *args, **kwargs):
        CountingSocket.reads += 1
        return super().recv_into(*args, **kwargs)


def test_a_source_sending_often_wakes_the_reader_once_a_window(tracker, monkeypatch):
    """Within a window the socket wakes the reader only for 1 MiB or the window's end
    (SO_RCVLOWAT): 100 small sends cost a few reads, not 100; between windows the first
    byte still wakes it (the second burst is stored too)."""
    from spark_receivers.receivers import socket_text

    create_connection = socket.create_connection

    def connect(address, timeout=None):
        plain = create_connection(address, timeout)
        return CountingSocket(fileno=plain.detach())

    monkeypatch.setattr(socket_text.socket, "create_connection", connect)
    monkeypatch.setattr(CountingSocket, "reads", 0)
    second = threading.Event()

    def serve(conn: socket.socket) -> None:
        for i in range(100):
            conn.sendall(f"line {i}\n".encode())
            threading.Event().wait(0.002)
        second.wait(30)
        conn.sendall(b"after\n")

    server = ScriptedServer(serve)
    receiver = SocketTextReceiver("127.0.0.1", server.port, coalesce_ms=1000)
    sup = supervise(tracker, receiver, receiver_restart_delay_ms=10_000)
    try:
        sup.start()
        tracker.wait_for(lambda: tracker.records() >= 100)
        reads = CountingSocket.reads
        second.set()
        tracker.wait_for(lambda: tracker.records() >= 101)
        values = tracker.stored_table(sup).column("value").to_pylist()
    finally:
        sup.stop("test over")
        sup.await_termination(15)
        server.close()
    assert values == [f"line {i}" for i in range(100)] + ["after"]
    # A few reads a window (the wake, what is queued, the empty read): a slow machine may
    # spread the sends over several windows; one read per send would be 100 or more.
    assert reads <= 30, f"{reads} reads for 100 sends"


def test_a_stop_during_a_window_stores_what_the_socket_still_holds(tracker):
    """Bytes queued in the socket below the wake threshold are read and stored at a stop,
    not left behind (here far more than one read's worth)."""
    sent = threading.Event()

    def serve(conn: socket.socket) -> None:
        conn.sendall(b"first\n")  # its read opens a 1 s window
        threading.Event().wait(0.1)
        conn.sendall(b"".join(f"line {i}\n".encode() for i in range(10_000)))
        sent.set()

    server = ScriptedServer(serve)
    receiver = SocketTextReceiver("127.0.0.1", server.port, coalesce_ms=1000, read_size=4096)
    sup = supervise(tracker, receiver, receiver_restart_delay_ms=10_000)
    try:
        sup.start()
        assert sent.wait(15)
        threading.Event().wait(0.1)  # queued in the socket; the window is still open
    finally:
        sup.stop("test over")
        sup.await_termination(15)
        server.close()
    assert tracker.records() == 10_001
