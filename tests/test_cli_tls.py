"""``rediss://`` and ``mqtts://`` sources against real TLS servers (no Spark).

A throwaway CA and a server certificate for 127.0.0.1 are made with ``openssl``;
redis-server and mosquitto (installed by ``scripts/services.sh install``) are started
with TLS listeners on free loopback ports and stopped by PID. The receivers the
URIs name run in the in-process harness of the receivers' tests.
"""

from __future__ import annotations

import getpass
import shutil
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent / "receivers"))
from harness import HarnessSupervisor, free_port

from spark_receivers.cli.sources import parse_source

PASSWORD = "tls-s3cret"


def need(binary: str) -> str:
    path = shutil.which(binary) or shutil.which(binary, path="/usr/sbin:/sbin")
    if path is None:
        pytest.fail(f"{binary} is missing: run scripts/services.sh install all")
    return path


@pytest.fixture(scope="module")
def certs(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("tls")
    openssl = need("openssl")

    def run(*args: str) -> None:
        subprocess.run([openssl, *args], cwd=d, check=True, capture_output=True, timeout=60)

    run("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.pem",
        "-days", "1", "-subj", "/CN=spark-receivers-test-ca")  # fmt: skip
    run("req", "-newkey", "rsa:2048", "-nodes", "-keyout", "server.key", "-out", "server.csr",
        "-subj", "/CN=localhost")  # fmt: skip
    (d / "ext.cnf").write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
    run("x509", "-req", "-in", "server.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
        "-CAcreateserial", "-out", "server.pem", "-days", "1", "-extfile", "ext.cnf")  # fmt: skip
    return d


def serve(cmd: list[str], port: int, log: Path) -> subprocess.Popen:
    import socket

    with open(log, "w") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return proc
        except OSError:
            if proc.poll() is not None:
                break
            time.sleep(0.1)
    proc.kill()
    proc.wait(10)
    pytest.fail(f"{cmd[0]} did not listen on {port}: {log.read_text()[-2000:]}")


def stop(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(10)


@pytest.fixture(scope="module")
def tls_redis(certs: Path) -> Iterator[int]:
    port = free_port()
    cmd = [need("redis-server"), "--port", "0", "--tls-port", str(port), "--bind", "127.0.0.1"]
    cmd += [
        "--tls-cert-file",
        str(certs / "server.pem"),
        "--tls-key-file",
        str(certs / "server.key"),
    ]
    cmd += ["--tls-ca-cert-file", str(certs / "ca.pem"), "--tls-auth-clients", "no"]
    cmd += ["--requirepass", PASSWORD, "--save", "", "--appendonly", "no", "--dir", str(certs)]
    proc = serve(cmd, port, certs / "redis.log")
    yield port
    stop(proc)


@pytest.fixture(scope="module")
def tls_mosquitto(certs: Path) -> Iterator[int]:
    port = free_port()
    conf = certs / "mosquitto.conf"
    conf.write_text(
        f"listener {port} 127.0.0.1\n"
        f"cafile {certs / 'ca.pem'}\ncertfile {certs / 'server.pem'}\n"
        f"keyfile {certs / 'server.key'}\nallow_anonymous true\npersistence false\n"
        f"user {getpass.getuser()}\n"  # as services.sh: no switch to a user of its own
    )
    proc = serve([need("mosquitto"), "-c", str(conf)], port, certs / "mosquitto.log")
    yield port
    stop(proc)


def test_rediss_uri_reads_db_2_over_tls_with_its_password(certs, tls_redis):
    import redis

    ca = certs / "ca.pem"
    stream, group = f"s-{uuid.uuid4().hex[:6]}", "g"
    src = parse_source(
        f"rediss://:{PASSWORD}@127.0.0.1:{tls_redis}/2/{stream}?group={group}&ca_certs={ca}"
    )
    assert PASSWORD not in src.display + src.describe()
    client = redis.Redis(
        host="127.0.0.1", port=tls_redis, db=2, password=PASSWORD, ssl=True, ssl_ca_certs=str(ca)
    )
    for i in range(20):
        client.xadd(stream, {"value": f"r{i}"})
    sup = HarnessSupervisor(src.receiver).start()
    try:
        assert sup.wait_for(20) == [f"r{i}" for i in range(20)]
    finally:
        sup.shutdown()
    assert client.xpending(stream, group)["pending"] == 0  # XACKed over the same connection
    other_db = redis.Redis(
        host="127.0.0.1", port=tls_redis, db=0, password=PASSWORD, ssl=True, ssl_ca_certs=str(ca)
    )
    assert other_db.exists(stream) == 0  # it read db 2, not db 0


def test_mqtts_uri_subscribes_over_tls(certs, tls_mosquitto):
    import paho.mqtt.client as mqtt

    ca = certs / "ca.pem"
    topic = f"tls/{uuid.uuid4().hex[:6]}"
    src = parse_source(
        f"mqtts://127.0.0.1:{tls_mosquitto}/{topic}?ca_certs={ca}&client_id=cli-{uuid.uuid4().hex[:6]}"
    )
    sup = HarnessSupervisor(src.receiver).start()
    publisher = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=f"pub-{uuid.uuid4().hex}")
    publisher.tls_set(ca_certs=str(ca))
    publisher.connect("127.0.0.1", tls_mosquitto)
    publisher.loop_start()
    try:
        assert src.receiver.wait_subscribed(15), "the TLS receiver did not subscribe"
        infos = [publisher.publish(topic, f"m{i}", qos=1) for i in range(30)]
        for info in infos:
            info.wait_for_publish(10)
        assert sup.wait_for(30) == [f"m{i}" for i in range(30)]
    finally:
        publisher.disconnect()
        publisher.loop_stop()
        sup.shutdown()


def test_mqtts_refuses_a_broker_it_cannot_verify(tls_mosquitto):
    """Without the test CA (the system's CAs only) the handshake fails: no silent plaintext."""
    src = parse_source(f"mqtts://127.0.0.1:{tls_mosquitto}/t?client_id=cli-{uuid.uuid4().hex[:6]}")
    sup = HarnessSupervisor(src.receiver).start()
    try:
        deadline = time.monotonic() + 15
        while not sup.restarts and time.monotonic() < deadline:
            time.sleep(0.1)
        assert sup.restarts, "the receiver should have failed to connect"
        assert (
            "certificate verify failed" in sup.restarts[0].lower()
            or "ssl" in sup.restarts[0].lower()
        )
        assert not src.receiver.wait_subscribed(0)
    finally:
        sup.shutdown()
