"""HttpReceiver against real HTTP requests (its aiohttp server on 127.0.0.1)."""

from __future__ import annotations

import json
import logging
import re
import socket
import threading
import time
import urllib.error
import urllib.request
from datetime import UTC, datetime

import pyarrow as pa
import pytest
from harness import HarnessSupervisor, free_port
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from waiting import wait_until

from spark_receivers.errors import ConfigError, ReceiverError
from spark_receivers.receiver.schema import DEFAULT_SCHEMA
from spark_receivers.receivers import HttpReceiver
from spark_receivers.receivers.http_body import parse_body
from spark_receivers.receivers.http_idempotency import IdempotencyKeys, Seen
from spark_receivers.receivers.http_keyed_stores import KeyedStores
from spark_receivers.receivers.http_server import ClientErrorLog


def post(port, body: bytes, token=None, path="/ingest", timeout=10, key=None):
    request = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=body, method="POST")
    if key is not None:
        request.add_header("Idempotency-Key", key)
    if token is not None:
        request.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status, dict(response.headers), json.loads(response.read())
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers), json.loads(e.read() or b"{}")


def running(receiver: HttpReceiver, **kwargs) -> HarnessSupervisor:
    sup = HarnessSupervisor(receiver, **kwargs).start()
    assert wait_until(lambda: receiver.bound_port is not None, 10), "server did not bind"
    return sup


@pytest.fixture
def make():
    started: list[HarnessSupervisor] = []

    def make(*, supervisor_kwargs=None, **kwargs) -> tuple[HttpReceiver, HarnessSupervisor]:
        kwargs.setdefault("host", "127.0.0.1")
        kwargs.setdefault("port", free_port())
        receiver = HttpReceiver(**kwargs)
        sup = running(receiver, **(supervisor_kwargs or {}))
        started.append(sup)
        return receiver, sup

    yield make
    for sup in started:
        sup.shutdown()


def test_posted_lines_are_stored_in_order_before_the_200(make):
    receiver, sup = make()
    status, _, body = post(receiver.bound_port, b"a\nb\r\nc d\n")
    assert (status, body) == (200, {"stored": 3})
    # acknowledged means already stored, reliably, as one batch
    assert sup.reliable_batches == [["a", "b", "c d"]]
    status, _, body = post(receiver.bound_port, b"last line without newline")
    assert (status, body) == (200, {"stored": 1})
    assert sup.records == ["a", "b", "c d", "last line without newline"]
    assert post(receiver.bound_port, b"")[0:3:2] == (200, {"stored": 0})


def test_a_lines_body_is_stored_as_one_arrow_table(make):
    receiver, sup = make()
    lines = [f"line {i} é" for i in range(3000)]
    status, _, body = post(receiver.bound_port, ("\r\n".join(lines) + "\n").encode())
    assert (status, body) == (200, {"stored": 3000})
    assert sup.tables_stored == 1  # split and checked by Arrow: no str per line
    assert sup.reliable_batches == [lines]


@given(st.text(alphabet="ab\r\n é中", max_size=40))
def test_a_lines_body_in_arrow_has_the_lines_of_the_text(text):
    expected = text.split("\n")
    if text.endswith("\n"):
        expected.pop()
    expected = [line.removesuffix("\r") for line in expected] if text else []
    records = parse_body(text.encode(), "lines", DEFAULT_SCHEMA, 1 << 20)
    assert list(records if isinstance(records, list) else records.to_pylist()) == expected


def test_port_zero_binds_a_free_port_and_writes_the_address_file(tmp_path):
    address_file = tmp_path / "address"
    receiver = HttpReceiver(host="127.0.0.1", port=0, address_file=str(address_file))
    sup = running(receiver)
    try:
        assert receiver.bound_port and receiver.bound_port > 0
        assert address_file.read_text().strip() == f"127.0.0.1:{receiver.bound_port}"
        assert post(receiver.bound_port, b"x\n")[0] == 200
    finally:
        sup.shutdown()


def test_bearer_token_is_required_when_configured(make):
    receiver, sup = make(token="s3cret")
    port = receiver.bound_port
    status, headers, _ = post(port, b"x\n")
    assert status == 401
    assert headers.get("WWW-Authenticate", "").startswith("Bearer")
    assert post(port, b"x\n", token="wrong")[0] == 401
    assert post(port, b"x\n", token="s3cret-and-more")[0] == 401
    assert post(port, b"y\n", token="s3cret")[0] == 200
    assert sup.records == ["y"]


def test_body_over_the_limit_is_413_and_nothing_is_stored(make):
    receiver, sup = make(max_body_bytes=1000)
    status, _, body = post(receiver.bound_port, b"z" * 999 + b"\n" + b"z" * 10)
    assert status == 413
    assert "max_body_bytes=1000" in body["error"]
    assert post(receiver.bound_port, b"ok\n")[0] == 200
    assert sup.records == ["ok"]


def test_a_line_over_max_record_bytes_is_413_naming_it_and_nothing_is_stored(make):
    """The body is within max_body_bytes but one of its lines is longer than a record may
    be (issue 36: such a row kills the executor's JVM)."""
    receiver, sup = make()  # the default limit, 1 MiB
    long_line = b"z" * (1024 * 1024 + 1)
    status, _, body = post(receiver.bound_port, b"fine\n" + long_line + b"\r\nafter\n")
    assert status == 413
    assert body["error"] == "line 2 is 1,048,577 bytes, longer than max_record_bytes=1,048,576"
    assert sup.records == []
    assert post(receiver.bound_port, b"z" * (1024 * 1024) + b"\n")[0] == 200  # at the limit
    roomy, sup2 = make(max_record_bytes=2 * 1024 * 1024)
    assert post(roomy.bound_port, b"fine\n" + long_line + b"\n")[0] == 200
    assert len(sup2.records) == 2


def test_invalid_utf8_is_400_naming_the_line(make):
    receiver, sup = make()
    status, _, body = post(receiver.bound_port, b"fine\nalso fine\nbad \xff here\n")
    assert status == 400
    assert "line 3" in body["error"] and "UTF-8" in body["error"]
    assert sup.records == []


def test_json_lines_are_stored_as_raw_json_strings(make):
    receiver, sup = make(format="json")
    status, _, body = post(receiver.bound_port, b'{"a": 1}\n\n  [1, 2]\n"s"\n')
    assert (status, body) == (200, {"stored": 3})
    assert sup.records == ['{"a": 1}', "[1, 2]", '"s"']
    status, _, body = post(receiver.bound_port, b'{"a": 1}\n{"b": oops}\n')
    assert status == 400
    assert "line 2" in body["error"] and "JSON" in body["error"]
    assert len(sup.records) == 3


def test_json_lines_become_dicts_under_a_multi_column_schema(make):
    schema = pa.schema([("user", pa.string()), ("clicks", pa.int64())])
    receiver, sup = make(format="json", schema=schema)
    status, _, _ = post(receiver.bound_port, b'{"user": "ann", "clicks": 3}\n{"user": "bob"}\n')
    assert status == 200
    # read by pyarrow.json into the schema's columns: a missing field is a null
    assert sup.records == [{"user": "ann", "clicks": 3}, {"user": "bob", "clicks": None}]
    status, _, body = post(receiver.bound_port, b'{"user": "cy", "clicks": "many"}\n')
    assert status == 400 and "line 1" in body["error"] and "clicks" in body["error"]
    status, _, body = post(receiver.bound_port, b'{"user": "d"}\n[1]\n')
    assert status == 400 and "line 2" in body["error"]


def test_failed_store_is_503_with_retry_after(make):
    receiver, sup = make()
    sup.fail_stores = OSError("disk full")
    status, headers, body = post(receiver.bound_port, b"x\n")
    assert status == 503
    assert headers["Retry-After"] == "1"
    assert "could not be stored" in body["error"]
    sup.fail_stores = None
    assert post(receiver.bound_port, b"x\n")[0] == 200


def test_slow_store_and_rate_limit_are_429_with_retry_after(make):
    receiver, sup = make(max_store_wait_s=0.3, supervisor_kwargs={"max_rate": 10})
    # 10 records/s: 100 records would wait 10 s > 0.3 s, refused before storing
    status, headers, body = post(receiver.bound_port, b"x\n" * 100)
    assert status == 429 and headers["Retry-After"] == "1" and "rate limit" in body["error"]
    assert sup.records == []
    sup.store_delay_s = 1.0
    status, _, body = post(receiver.bound_port, b"y\n")
    assert status == 429 and "max_store_wait_s" in body["error"]


def test_stopping_receiver_answers_503_then_closes(make):
    receiver, sup = make()
    port = receiver.bound_port
    sup.store_delay_s = 1.0
    results = []
    t = threading.Thread(target=lambda: results.append(post(port, b"in flight\n")))
    t.start()
    assert wait_until(lambda: receiver._in_flight == 1, 5)
    receiver._closing = True  # what on_stop does first
    assert post(port, b"late\n")[0] == 503
    sup.shutdown()
    t.join(10)
    # the request being stored when the stop came still completes and is stored
    assert results[0][0] == 200 and sup.records == ["in flight"]
    with pytest.raises(OSError):
        post(port, b"after stop\n", timeout=2)


def test_restart_binds_again_on_the_same_port(make):
    receiver, sup = make()
    port = receiver.bound_port
    sup.restart_receiver("test restart", None, 50)
    assert wait_until(lambda: sup.restarts and receiver._thread is not None, 5)
    assert wait_until(lambda: post_ok(port), 10)
    assert sup.records[-1] == "again"


def post_ok(port) -> bool:
    try:
        return post(port, b"again\n", timeout=2)[0] == 200
    except OSError:
        return False


def test_bad_options_are_refused_naming_the_key():
    with pytest.raises(ConfigError, match="format"):
        HttpReceiver(format="xml")
    with pytest.raises(ConfigError, match="port"):
        HttpReceiver(port=70000)
    with pytest.raises(ConfigError, match="max_body_bytes"):
        HttpReceiver(max_body_bytes=0)
    with pytest.raises(ConfigError, match="default schema"):
        HttpReceiver(schema=pa.schema([("a", pa.int64()), ("b", pa.string())]))


# --- hostile and broken clients ------------------------------------------------------


def raw_exchange(port: int, data: bytes, timeout: float = 10.0) -> tuple[int | None, bytes]:
    """Send raw bytes; return the status of the answer (None: closed without one) and it all."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
        sock.sendall(data)
        return read_answer(sock)


def read_answer(sock: socket.socket) -> tuple[int | None, bytes]:
    received = b""
    while True:
        try:
            chunk = sock.recv(65536)
        except (ConnectionResetError, TimeoutError):
            break
        if not chunk:
            break
        received += chunk
        head, sep, body = received.partition(b"\r\n\r\n")
        if sep:
            length = re.search(rb"(?i)content-length:\s*(\d+)", head)
            if length and len(body) >= int(length.group(1)):
                break
    match = re.match(rb"HTTP/1\.[01] (\d{3})", received)
    return (int(match.group(1)) if match else None), received


def request_bytes(body: bytes, headers: dict[bytes, bytes] | None = None) -> bytes:
    lines = [b"POST /ingest HTTP/1.1", b"Host: 127.0.0.1", b"Connection: close"]
    lines += [k + b": " + v for k, v in (headers or {}).items()]
    lines += [b"Content-Length: " + str(len(body)).encode(), b"", b""]
    return b"\r\n".join(lines) + body


def test_a_non_ascii_authorization_header_is_401(make):
    receiver, sup = make(token="s3cret")
    for value in (b"Bearer s\xc3\xa9cret", b"Bearer \xff\xfe", "Bearer ü".encode("latin-1")):
        status, _ = raw_exchange(
            receiver.bound_port, request_bytes(b"x\n", {b"Authorization": value})
        )
        assert status == 401, value
    assert sup.records == []


@pytest.mark.parametrize(
    "line",
    [
        b"[" * 100_000 + b"]" * 100_000,
        b'{"n": ' + b"9" * 5000 + b"}",
        b'{"n": NaN}',
        b'{"n": Infinity}',
        b"-Infinity",
        b'{"n": 1e999}',
    ],
    ids=["nested-100000", "int-5000-digits", "NaN", "Infinity", "-Infinity", "1e999"],
)
def test_json_that_python_would_choke_on_or_bend_is_400(make, line):
    receiver, sup = make(format="json")
    status, _, body = post(receiver.bound_port, b'{"ok": 1}\n' + line + b"\n")
    assert status == 400 and body["error"].startswith("line 2 is not valid JSON")
    assert sup.records == []


def test_headers_that_do_not_arrive_in_time_are_408_and_closed(make):
    receiver, sup = make(header_timeout_s=0.5)
    with socket.create_connection(("127.0.0.1", receiver.bound_port), timeout=10) as sock:
        sock.sendall(b"POST /ingest HTTP/1.1\r\nHost: x\r\n")  # ... and nothing more
        status, answer = read_answer(sock)  # bounded by the socket timeout
    assert status == 408 and b"header" in answer
    assert receiver._guard.timed_out == 1
    # an idle keep-alive connection gets the same deadline after its request
    with socket.create_connection(("127.0.0.1", receiver.bound_port), timeout=10) as sock:
        sock.sendall(request_bytes(b"a\n").replace(b"Connection: close", b"Connection: keep-alive"))
        status, answer = read_answer(sock)
        assert status == 200
        assert sock.recv(100) == b""  # closed after the idle deadline, answered nothing more
    assert sup.records == ["a"]


def test_a_body_that_does_not_arrive_in_time_is_408(make):
    receiver, sup = make(body_timeout_s=0.5)
    with socket.create_connection(("127.0.0.1", receiver.bound_port), timeout=10) as sock:
        sock.sendall(b"POST /ingest HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\npartial")
        status, answer = read_answer(sock)
    assert status == 408 and b"body_timeout_s=0.5" in answer
    assert sup.records == []


def test_connections_beyond_the_cap_are_503_with_retry_after_when_all_are_busy(make):
    receiver, sup = make(max_connections=5, retry_after_s=2)
    port = receiver.bound_port
    sup.store_delay_s = 2.0  # five requests being stored hold every place
    results: list[int] = []
    threads = [
        threading.Thread(target=lambda i=i: results.append(post(port, f"{i}\n".encode())[0]))
        for i in range(5)
    ]
    for t in threads:
        t.start()
    try:
        assert wait_until(lambda: receiver._pending == 5, 5)
        status, answer = raw_exchange(port, request_bytes(b"x\n"))
        assert status == 503 and b"Retry-After: 2" in answer and b"max_connections=5" in answer
        assert wait_until(lambda: receiver._guard.lingering == 0, 5)  # closed after its linger
    finally:
        for t in threads:
            t.join(10)
    assert results == [200] * 5
    assert wait_until(lambda: receiver._guard.open == 0, 5)
    assert post(port, b"x\n")[0] == 200  # places free again


def test_at_the_cap_a_new_client_takes_the_place_of_the_slowest(make):
    receiver, sup = make(max_connections=5, header_timeout_s=30.0)
    port = receiver.bound_port
    held = [socket.create_connection(("127.0.0.1", port), timeout=10) for _ in range(5)]
    try:
        for sock in held:
            sock.sendall(b"POST /ingest HTTP/1.1\r\n")  # slow clients holding every place
        assert wait_until(lambda: receiver._guard.open == 5, 5)
        # once they waited a second for their headers, a client that sends at once gets in
        assert post_until_served(port, b"real\n", attempts=50)[0] == 200
        assert receiver._guard.evicted >= 1
        status, answer = read_answer(held[0])  # the oldest slow one was closed, with a 408
        assert status == 408 and b"max_connections" in answer
    finally:
        for sock in held:
            sock.close()
    assert sup.records == ["real"]


def test_requests_beyond_max_pending_are_503_with_retry_after(make):
    receiver, sup = make(max_pending_requests=1)
    sup.store_delay_s = 1.0
    port = receiver.bound_port
    results = []
    t = threading.Thread(target=lambda: results.append(post(port, b"slow\n")))
    t.start()
    try:
        assert wait_until(lambda: receiver._pending == 1, 5)
        status, headers, body = post(port, b"another\n")
        assert status == 503 and headers["Retry-After"] == "1"
        assert "max_pending_requests=1" in body["error"]
    finally:
        t.join(10)
    assert results[0][0] == 200 and sup.records == ["slow"]


def slowloris(
    port: int, connections: int, stop: threading.Event, reconnect: bool = False
) -> list[socket.socket]:
    """Open connections and trickle header bytes into them until ``stop``.

    With ``reconnect``, every connection the server closes is opened again at once.
    """
    socks: list[socket.socket] = []

    def open_one() -> None:
        try:
            sock = socket.create_connection(("127.0.0.1", port), timeout=5)
            sock.sendall(b"POST /ingest HTTP/1.1\r\n")
            socks.append(sock)
        except OSError:
            pass

    for _ in range(connections):
        open_one()

    def trickle() -> None:
        while not stop.wait(0.2):
            for sock in list(socks):
                try:
                    sock.sendall(b"X")
                except OSError:
                    socks.remove(sock)
                    sock.close()
                    if reconnect and not stop.is_set():
                        open_one()

    threading.Thread(target=trickle, daemon=True).start()
    return socks


def post_until_served(port: int, body: bytes, attempts: int) -> tuple[int, int]:
    """Post like a real client: on 503 wait Retry-After (scaled down) and retry; (status, tries)."""
    for attempt in range(1, attempts + 1):
        try:
            status = post(port, body, timeout=5)[0]
        except OSError:
            status = 0
        if status == 200:
            return status, attempt
        threading.Event().wait(0.2)
    return status, attempts


def test_a_real_client_is_served_while_slowloris_holds_connections(make):
    """Slow clients below the cap cost a place each, nothing else; above it, even while they
    keep opening connections, a client that sends its request at once is served."""
    receiver, sup = make(max_connections=20, header_timeout_s=5.0)
    port = receiver.bound_port
    stop = threading.Event()
    attackers = [slowloris(port, 15, stop, reconnect=True)]
    try:
        assert wait_until(lambda: receiver._guard.open >= 15, 5)
        assert post(port, b"real 1\n", timeout=5)[0] == 200  # at once: the loop is not blocked
        attackers.append(slowloris(port, 60, stop, reconnect=True))  # far beyond the cap
        assert wait_until(lambda: receiver._guard.refused > 0, 10)
        status, _tries = post_until_served(port, b"real 2\n", attempts=50)
        assert status == 200
    finally:
        stop.set()
        threading.Event().wait(0.5)  # the trickling threads see it and stop reconnecting
        for sock in [s for socks in attackers for s in socks]:
            sock.close()
    assert sup.records == ["real 1", "real 2"]


def test_client_errors_are_logged_one_line_each_and_rate_limited(make, caplog):
    receiver, _sup = make(format="json", token="t")
    port = receiver.bound_port
    caplog.set_level(logging.DEBUG)
    started = time.monotonic()
    for _i in range(40):
        post(port, b"{bad json\n", token="t")
        post(port, b"x\n", token="wrong")
        raw_exchange(port, b"NOT HTTP AT ALL\r\n\r\n")
        raw_exchange(port, b"POST /ingest HTTP/1.1\r\nX: " + b"a" * 10_000 + b"\r\n\r\n")
    records = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert records, "client errors were not logged at all"
    assert all(r.exc_info is None and r.exc_text is None for r in records)
    windows = int((time.monotonic() - started) / 10.0) + 2  # 10 s windows these calls spanned
    assert len(records) <= 5 * windows  # 160 client errors: at most a burst of 5 per window
    assert receiver._errors.total >= 120


def test_client_error_log_rate_limit_and_its_count():
    now = [0.0]
    errors = ClientErrorLog("r", burst=2, window_s=10.0, clock=lambda: now[0])
    assert [errors.client_error(f"e{i}") for i in range(5)] == [True, True, False, False, False]
    now[0] = 10.0
    assert errors.suppressed == 3
    assert errors.client_error("later") is True and errors.suppressed == 0


HEADER_NAMES = [
    b"Authorization",
    b"Content-Type",
    b"Content-Encoding",
    b"Transfer-Encoding",
    b"Expect",
    b"Content-Length",
    b"X-Anything",
]
HEADER_VALUES = [
    b"Bearer tok",
    b"Bearer \xff",
    b"gzip",
    b"deflate",
    b"chunked",
    b"100-continue",
    b"7",
]


@settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    headers=st.lists(
        st.tuples(
            st.one_of(
                st.sampled_from(HEADER_NAMES),
                st.binary(max_size=20).filter(lambda b: b"\r" not in b and b"\n" not in b),
            ),
            st.one_of(
                st.sampled_from(HEADER_VALUES),
                st.binary(max_size=200).filter(lambda b: b"\r" not in b and b"\n" not in b),
            ),
        ),
        max_size=6,
    ),
    body=st.one_of(
        st.binary(max_size=400),
        st.text(max_size=200).map(str.encode),
        st.recursive(
            st.one_of(st.none(), st.booleans(), st.integers(), st.floats(), st.text(max_size=10)),
            lambda children: (
                st.lists(children, max_size=4)
                | st.dictionaries(st.text(max_size=5), children, max_size=4)
            ),
            max_leaves=20,
        ).map(lambda v: json.dumps(v).encode()),
    ),
)
def test_fuzz_headers_and_bodies_never_get_a_5xx(fuzz_receiver, headers, body):
    receiver, _ = fuzz_receiver
    extra = b"".join(name + b": " + value + b"\r\n" for name, value in headers)
    data = (
        b"POST /ingest HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n"
        + extra
        + b"Authorization: Bearer tok\r\nContent-Length: "
        + str(len(body)).encode()
        + b"\r\n\r\n"
        + body
    )
    status, answer = raw_exchange(receiver.bound_port, data)
    assert status is not None and status < 500, answer[:300]


@pytest.fixture(scope="module")
def fuzz_receiver():
    receiver = HttpReceiver(host="127.0.0.1", port=free_port(), token="tok", format="json")
    sup = running(receiver)
    yield receiver, sup
    sup.shutdown()


def test_include_timestamp_is_when_the_request_arrived(make):
    receiver, sup = make(include_timestamp=True)
    before = datetime.now(UTC)
    assert post(receiver.bound_port, b"a\nb\n")[0] == 200
    rows = sup.records
    assert [r["value"] for r in rows] == ["a", "b"]
    assert rows[0]["timestamp"] == rows[1]["timestamp"]
    assert before <= rows[0]["timestamp"] <= datetime.now(UTC)


def test_expect_is_answered_only_for_an_admitted_request(make):
    receiver, sup = make(token="tok")
    port = receiver.bound_port
    good = {b"Authorization": b"Bearer tok"}
    status, answer = raw_exchange(port, request_bytes(b"a\n", {**good, b"Expect": b"\x80"}))
    assert status == 417  # aiohttp's own handler answers 500 to bytes that are not UTF-8
    status, answer = raw_exchange(
        port, request_bytes(b"b\n", {b"Authorization": b"Bearer no", b"Expect": b"100-continue"})
    )
    assert status == 401 and b"100 Continue" not in answer  # refused before the body is sent
    status, answer = raw_exchange(port, request_bytes(b"c\n", {**good, b"Expect": b"100-continue"}))
    assert answer.startswith(b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK")
    assert sup.records == ["c"]


def test_a_repeated_idempotency_key_gets_the_first_answer_and_stores_nothing(make):
    receiver, sup = make()
    port = receiver.bound_port
    status, headers, body = post(port, b"a\nb\n", key="order-1")
    assert (status, body) == (200, {"stored": 2}) and "Idempotent-Replayed" not in headers
    status, headers, body = post(port, b"a\nb\n", key="order-1")  # the client's retry
    assert (status, body) == (200, {"stored": 2}) and headers["Idempotent-Replayed"] == "true"
    assert post(port, b"c\n", key="order-2")[0] == 200  # another key is stored
    assert post(port, b"c\n")[0] == 200  # no key: stored every time
    assert sup.records == ["a", "b", "c", "c"]
    assert receiver.idempotency.replayed == 1


def test_a_refused_request_with_a_key_may_be_retried_and_stored(make):
    receiver, sup = make()
    sup.fail_stores = OSError("disk full")
    assert post(receiver.bound_port, b"x\n", key="k")[0] == 503
    sup.fail_stores = None
    assert post(receiver.bound_port, b"x\n", key="k")[0:1] == (200,)
    assert post(receiver.bound_port, b"x\n", key="k")[1]["Idempotent-Replayed"] == "true"
    assert sup.records == ["x"]


def test_a_key_whose_slow_store_got_a_429_is_replayed_once_the_store_ends(make):
    receiver, sup = make(max_store_wait_s=0.3)
    sup.store_delay_s = 1.0
    assert post(receiver.bound_port, b"y\n", key="slow")[0] == 429  # the store goes on
    status, headers, _ = post(receiver.bound_port, b"y\n", key="slow")
    assert status == 409 and headers["Retry-After"] == "1"  # still being stored
    assert wait_until(lambda: sup.records == ["y"], 10)
    sup.store_delay_s = 0.0
    assert wait_until(lambda: post(receiver.bound_port, b"y\n", key="slow")[0] == 200, 10)
    assert sup.records == ["y"]


def test_keys_are_forgotten_after_the_window_and_the_oldest_beyond_the_cap():
    now = [100.0]
    keys = IdempotencyKeys(window_s=60.0, max_keys=2, now=lambda: now[0])
    for key in ("a", "b", "c"):  # "a" is dropped for "c" (at most 2 keys)
        assert keys.begin(key) is None
        keys.finish(key, {"stored": 1})
    assert keys.begin("a") is None  # forgotten: stored again
    keys.abandon("a")
    assert keys.begin("c") == Seen({"stored": 1})
    assert keys.begin("x") is None and keys.begin("x") == Seen(None, busy=True)
    now[0] += 61.0  # the window passed
    assert keys.begin("c") is None


def _restarted(port: int, positions: list[str], **kwargs) -> tuple[HttpReceiver, HarnessSupervisor]:
    """A new receiver object on ``port`` (a restarted task) whose driver kept ``positions``."""
    again = HttpReceiver(host="127.0.0.1", port=port, **kwargs)
    sup = HarnessSupervisor(again)
    sup.positions = list(positions)
    sup.start()
    assert wait_until(lambda: again.bound_port is not None, 10)
    return again, sup


def test_every_key_of_the_window_survives_a_restart_through_the_accepted_position(make):
    port = free_port()
    _, sup = make(port=port)
    keys = [f"order-{i}" for i in range(20)]
    for i, key in enumerate(keys):
        assert post(port, f"r{i}\n".encode() * (i % 3 + 1), key=key)[0] == 200
    assert post(port, b"", key="empty")[0] == 200  # remembered, nothing stored
    assert post(port, b"last\n", key="last")[0] == 200
    sup.shutdown()
    again, sup2 = _restarted(port, sup.positions)
    try:
        for i, key in enumerate([*keys, "empty", "last"]):  # every client retries
            status, headers, body = post(port, b"retry\n", key=key)
            stored = 0 if key == "empty" else 1 if key == "last" else i % 3 + 1
            assert (status, body, headers.get("Idempotent-Replayed")) == (
                200,
                {"stored": stored},
                "true",
            ), key
        assert sup2.records == []  # nothing stored twice
        assert post(port, b"new\n", key="order-new")[0] == 200  # a new key is stored
        assert sup2.records == ["new"]
        assert again.idempotency.replayed == len(keys) + 2
    finally:
        sup2.shutdown()


def test_a_restart_forgets_keys_past_the_window_or_pushed_out_of_the_position(make):
    port = free_port()
    _, sup = make(port=port, idempotency_position_bytes=200)
    for i in range(10):
        assert post(port, b"x\n", key=f"key-{i}")[0] == 200
    last = sup.positions[-1]
    assert len(last.encode()) <= 200 and '"key-9"' in last and '"key-0"' not in last
    sup.shutdown()
    _, sup2 = _restarted(port, sup.positions)
    try:
        assert post(port, b"x\n", key="key-9")[1].get("Idempotent-Replayed") == "true"
        assert post(port, b"x\n", key="key-0")[1].get("Idempotent-Replayed") is None
        assert sup2.records == ["x"]  # key-0 was pushed out: stored again (at least once)
    finally:
        sup2.shutdown()


def test_keys_come_back_from_a_position_with_their_age_and_only_inside_the_window():
    now, wall = [1000.0], [5_000_000]
    first = IdempotencyKeys(60.0, 10, now=lambda: now[0], wall_now_ms=lambda: wall[0])
    assert first.begin("a") is None
    first.finish("a", {"stored": 3})
    now[0] += 40.0
    wall[0] += 40_000
    assert first.begin("b") is None
    position = first.position_with([("b", 2)], 4096)
    assert json.loads(position) == {"idempotency_keys": [["a", 3, 5_000_000], ["b", 2, 5_040_000]]}
    # Another process, another monotonic clock, 10 s later on the wall clock.
    later, wall2 = [7.0], [5_050_000]
    second = IdempotencyKeys(60.0, 10, now=lambda: later[0], wall_now_ms=lambda: wall2[0])
    assert second.remember_position(position) == 2
    assert second.begin("a") == Seen({"stored": 3}) and second.begin("b") == Seen({"stored": 2})
    later[0] += 11.0  # "a" is 61 s old now: its window is over; "b" is 21 s old
    assert second.begin("a") is None and second.begin("b") == Seen({"stored": 2})
    # An older release's position: one key, read as stored now.
    third = IdempotencyKeys(60.0, 10)
    assert third.remember_position('{"idempotency_key":"k","stored":4}') == 1
    assert third.begin("k") == Seen({"stored": 4})
    assert third.remember_position("not json") == 0 and third.remember_position(None) == 0


def test_keyed_stores_made_while_one_is_stored_go_together_as_one_block():
    keys = IdempotencyKeys(60.0, 100)
    release = threading.Event()
    stores: list[tuple[list, object, dict]] = []

    def store(records, times_us, position) -> None:
        stores.append((list(records), times_us, json.loads(position)))
        if len(stores) == 1:
            assert release.wait(30)  # the first group is slow: the others queue meanwhile

    keyed = KeyedStores(keys, store, 4096)
    threads = [
        threading.Thread(target=keyed.store, args=(k, [f"{k}1", f"{k}2"], t))
        for k, t in (("a", 10), ("b", 20), ("c", 30), ("d", 40))
    ]
    threads[0].start()
    assert wait_until(lambda: len(stores) == 1, 10)
    for t in threads[1:]:
        t.start()
    assert wait_until(lambda: keyed.queued == 3, 10)
    release.set()
    for t in threads:
        t.join(10)
    assert keyed.groups == 2 and len(stores) == 2
    records, times, position = stores[1]
    assert sorted(records) == ["b1", "b2", "c1", "c2", "d1", "d2"]
    assert sorted(zip(records, times, strict=True))[0] == ("b1", 20)
    named = [k for k, _, _ in position["idempotency_keys"]]
    assert named[0] == "a" and sorted(named[1:]) == ["b", "c", "d"]  # the earlier group too
    assert all(keys.begin(k) == Seen({"stored": 2}) for k in "abcd")


def test_a_failed_group_fails_each_of_its_requests_and_remembers_none_of_their_keys():
    keys = IdempotencyKeys(60.0, 100)

    def store(records, times_us, position) -> None:
        raise OSError("disk full")

    keyed = KeyedStores(keys, store, 4096)
    for key in ("x", "y"):
        assert keys.begin(key) is None
        with pytest.raises(ReceiverError, match="disk full"):
            keyed.store(key, ["r"], 1)
        keys.abandon(key)  # as the receiver does when the store raised
        assert keys.begin(key) is None  # a retry is stored


def test_concurrent_keyed_requests_all_survive_a_restart(make):
    port = free_port()
    _, sup = make(port=port)
    sup.store_delay_s = 0.05  # stores overlap: the requests group
    answers: dict[str, int] = {}

    def client(i: int) -> None:
        for j in range(5):
            key = f"client-{i}-{j}"
            answers[key] = post(port, f"{key}\n".encode(), key=key)[0]

    threads = [threading.Thread(target=client, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert set(answers.values()) == {200} and len(answers) == 30
    assert sorted(sup.records) == sorted(answers)
    sup.shutdown()
    again, sup2 = _restarted(port, sup.positions)
    try:
        for key in answers:
            assert post(port, f"{key}\n".encode(), key=key)[1].get("Idempotent-Replayed") == "true"
        assert sup2.records == []
        assert again.idempotency.replayed == 30
    finally:
        sup2.shutdown()


def test_idempotency_options_and_overlong_keys_are_refused(make):
    with pytest.raises(ConfigError, match="idempotency_window_s"):
        HttpReceiver(idempotency_window_s=-1)
    with pytest.raises(ConfigError, match="max_idempotency_keys"):
        HttpReceiver(max_idempotency_keys=0)
    with pytest.raises(ConfigError, match="idempotency_position_bytes"):
        HttpReceiver(idempotency_position_bytes=0)
    receiver, sup = make()
    status, _, body = post(receiver.bound_port, b"x\n", key="k" * 256)
    assert status == 400 and "Idempotency-Key" in body["error"]
    assert sup.records == []
