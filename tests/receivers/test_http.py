"""HttpReceiver against real HTTP requests (its aiohttp server on 127.0.0.1)."""

from __future__ import annotations

import json
import threading
import urllib.error
import urllib.request

import pyarrow as pa
import pytest
from harness import HarnessSupervisor, free_port, wait_until

from spark_receivers.errors import ConfigError
from spark_receivers.receivers import HttpReceiver


def post(port, body: bytes, token=None, path="/ingest", timeout=10):
    request = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=body, method="POST")
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
    assert sup.records == [{"user": "ann", "clicks": 3}, {"user": "bob"}]
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
