"""The network and TLS keys on local Spark: where endpoints bind, what they advertise,
which ports they take, TLS end to end, and a wrong setting failing start() by name."""

from __future__ import annotations

import socket
import sys
import threading
from pathlib import Path

import pyarrow.flight as flight
import pytest

from spark_receivers import ConfigError, StreamingConfig, StreamingContext
from spark_receivers.testing import SequenceReceiver

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "rpc"))
from test_tls import make_cert
from waiting import wait_until

# Bounds, not verdicts: a context's start (the warm-up, the receiver's Python worker and
# block keeper) took minutes beside a CPU hog on the 2-core machine.
pytestmark = [pytest.mark.spark, pytest.mark.timeout(600)]
WAIT_S = 240


def free_range(size: int) -> tuple[int, int]:
    """A start port whose next ``size`` ports were free a moment ago."""
    for _ in range(50):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            first = s.getsockname()[1]
        if first + size > 65535:
            continue
        try:
            for port in range(first, first + size):
                with socket.socket() as t:
                    t.bind(("127.0.0.1", port))
        except OSError:
            continue
        return first, first + size - 1
    raise AssertionError("no free port range")


def run_records(
    spark, config: StreamingConfig, n: int = 2000
) -> tuple[list[str], StreamingContext, list[str]]:
    records = [f"net-{i:05d}" for i in range(n)]
    ssc = StreamingContext(spark, 500, config=config)
    seen: list[str] = []
    lock = threading.Lock()

    def collect(df, t):
        values = [r.value for r in df.collect()]
        with lock:
            seen.extend(values)

    ssc.receiver_stream(SequenceReceiver(records, mode="list", chunk=100)).foreach_batch(collect)
    ssc.start()
    return records, ssc, seen


def test_ports_and_advertised_hosts_come_from_the_keys(spark):
    first, last = free_range(10)
    config = StreamingConfig(
        driver_host="localhost",
        driver_bind_address="127.0.0.1",
        driver_ports=f"{first}-{first + 4}",
        executor_ports=f"{first + 5}-{last}",
    )
    records, ssc, seen = run_records(spark, config)
    try:
        assert wait_until(lambda: len(seen) >= len(records), WAIT_S)
        host, port = ssc.status().tracker_address.rsplit(":", 1)
        # The name is advertised as the one address it resolves to that is bound.
        assert host == "127.0.0.1" and first <= int(port) <= first + 4
        endpoint = ssc.status().receivers[0].endpoint
        assert endpoint.startswith("127.0.0.1:")
        assert first + 5 <= int(endpoint.rsplit(":", 1)[1]) <= last
    finally:
        ssc.stop(graceful=True)
    assert sorted(seen) == records


@pytest.mark.parametrize(
    ("conf", "message"),
    [
        (
            {"spark.receivers.driver.bindAddress": "203.0.113.9"},
            r"spark.receivers.driver.bindAddress='203.0.113.9' is not an address of this machine",
        ),
        (
            {"spark.receivers.driver.host": "0.0.0.0"},
            r"spark.receivers.driver.host\) is advertised",
        ),
        ({"spark.receivers.driver.ports": "9-8"}, r"spark.receivers.driver.ports\) must be 0"),
        (
            {
                "spark.receivers.rpc.tls.enabled": "true",
                "spark.receivers.rpc.tls.certFile": "/nonexistent/c.pem",
                "spark.receivers.rpc.tls.keyFile": "/nonexistent/c.key",
                "spark.receivers.rpc.tls.caFile": "/nonexistent/ca.pem",
            },
            r"spark.receivers.rpc.tls.certFile='/nonexistent/c.pem' cannot be read on the driver",
        ),
    ],
)
def test_a_wrong_network_setting_fails_start_naming_the_key(spark, conf, message):
    for key, value in conf.items():
        spark.conf.set(key, value)
    built: list[StreamingContext] = []
    try:
        with pytest.raises(ConfigError, match=message):
            built.append(StreamingContext(spark, 500))
            built[0].receiver_stream(SequenceReceiver(["x"])).foreach_batch(lambda df, t: None)
            built[0].start()
        # A setting checked at start(): nothing started, the context can be fixed and retried.
        assert all(ssc.state.name == "INITIALIZED" for ssc in built)
    finally:
        for key in conf:
            spark.conf.unset(key)


def test_tls_end_to_end_and_plaintext_is_refused(spark, tmp_path):
    cert, key = make_cert(tmp_path, "local")
    config = StreamingConfig(
        rpc_tls_enabled=True,
        rpc_tls_cert_file=cert,
        rpc_tls_key_file=key,
        rpc_tls_ca_file=cert,
    )
    records, ssc, seen = run_records(spark, config)
    try:
        assert wait_until(lambda: len(seen) >= len(records), WAIT_S)
        raw = flight.FlightClient(f"grpc+tcp://{ssc.status().tracker_address}")
        with pytest.raises(flight.FlightError):
            raw.list_actions(options=flight.FlightCallOptions(timeout=5))
        raw.close()
    finally:
        ssc.stop(graceful=True)
    assert sorted(seen) == records
