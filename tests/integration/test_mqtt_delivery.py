"""Acknowledged MQTT messages reach the sink: ingest next to a control subscriber (issue 36).

"Acknowledged" is PUBACKed by the broker to the publisher. The tests run
``spark-receivers ingest`` (a local Spark; the burst and the broker SIGTERM scenarios
share one, in turn) against a mosquitto started by scripts/services.sh with the
settings docs/receivers.md asks for (persistence when the broker restarts), publishes
with paho, and compares what the job wrote with what a control subscriber on the same
broker got: a message the control got and the job did not is the job's loss; one
neither got is the broker's.
"""

from __future__ import annotations

import os
import subprocess
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import paho.mqtt.client as mqtt
import pyarrow.parquet as pq
import pytest
from ingest_run import ROOT, IngestRun
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

# Each scenario runs ingest, on a Spark of its own, until every acknowledged message is
# written: more than the default 300 s on a loaded machine.
pytestmark = [pytest.mark.spark, pytest.mark.timeout(1200)]

SERVICES = ROOT / "scripts" / "services.sh"
# What docs/receivers.md asks of a broker (scripts/services.sh starts mosquitto so).
DOCUMENTED = "max_inflight_messages 1000\nmax_queued_messages 1000000\n"


class Broker:
    """A mosquitto of this test, by scripts/services.sh, stopped with SIGTERM by its PID."""

    def __init__(self, root: Path, persistence: bool) -> None:
        root.mkdir(parents=True, exist_ok=True)
        conf = root / "broker.conf"
        extra = f"persistence true\npersistence_location {root / 'db'}/\n" if persistence else ""
        (root / "db").mkdir(exist_ok=True)
        conf.write_text(DOCUMENTED + extra)
        self.env = {
            **os.environ,
            "SPARK_RECEIVERS_SERVICES_DIR": str(root / "services"),
            "SPARK_RECEIVERS_MOSQUITTO_CONF": str(conf),
        }
        self.port = 0
        self.port = self.start()

    def _services(self, *args: str) -> str:
        done = subprocess.run(
            ["bash", str(SERVICES), *args],
            env=self.env,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert done.returncode == 0, done.stderr
        return done.stdout

    def start(self) -> int:
        return int(self._services("start", "mosquitto", str(self.port)).split()[-1])

    def stop(self) -> None:
        """SIGTERM (mosquitto saves its persistence file on the way out)."""
        self._services("stop", "mosquitto")


@pytest.fixture
def broker(tmp_path) -> Iterator[Broker]:
    b = Broker(tmp_path / "broker", persistence=True)
    yield b
    b.stop()


class Control:
    """A paho subscriber with a persistent session on the same topic: what the broker sent."""

    def __init__(self, port: int, topic: str, qos: int) -> None:
        self.got: set[str] = set()
        self._lock = threading.Lock()
        self._subscribed = threading.Event()
        self.client = mqtt.Client(
            mqtt.CallbackAPIVersion.VERSION2,
            client_id=f"control-{uuid.uuid4().hex[:8]}",
            protocol=mqtt.MQTTv5,
        )
        self.client.on_message = self._on_message
        self.client.on_connect = lambda c, *_: c.subscribe(topic, qos)
        self.client.on_subscribe = lambda *_: self._subscribed.set()
        self.client.reconnect_delay_set(0.2, 1)
        props = Properties(PacketTypes.CONNECT)
        props.SessionExpiryInterval = 3600
        self.client.connect("127.0.0.1", port, clean_start=False, properties=props)
        self.client.loop_start()
        assert self._subscribed.wait(30), "the control subscriber never subscribed"

    def _on_message(self, client, userdata, message) -> None:
        with self._lock:
            self.got.add(message.payload.decode())

    def close(self) -> None:
        self.client.disconnect()
        self.client.loop_stop()


class Publisher:
    """A paho publisher that keeps what it could not send and sends it again on reconnect."""

    def __init__(self, port: int) -> None:
        self.client = mqtt.Client(
            mqtt.CallbackAPIVersion.VERSION2,
            client_id=f"pub-{uuid.uuid4().hex[:8]}",
            clean_session=False,
        )
        self.client.max_queued_messages_set(0)
        self.client.reconnect_delay_set(0.2, 1)
        self.client.connect("127.0.0.1", port)
        self.client.loop_start()
        self.sent: dict[str, mqtt.MQTTMessageInfo] = {}

    def publish(self, topic: str, payload: str, qos: int) -> None:
        self.sent[payload] = self.client.publish(topic, payload, qos=qos)

    def wait_connected(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while not self.client.is_connected() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert self.client.is_connected(), "the publisher did not reconnect"

    def acked(self, timeout_s: float) -> set[str]:
        """The messages the broker PUBACKed (PUBCOMPed at QoS 2), waiting up to ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and not all(i.is_published() for i in self.sent.values()):
            time.sleep(0.2)
        return {p for p, i in self.sent.items() if i.is_published()}

    def close(self) -> None:
        self.client.disconnect()
        self.client.loop_stop()


def written(out: Path) -> list[str]:
    """What the parquet sink wrote so far (every committed part file of every batch)."""
    values: list[str] = []
    for part in sorted(out.glob("batch_time_ms=*/part-*.parquet")):
        values += pq.read_table(part).column("value").to_pylist()
    return values


def ingest(tmp_path: Path, port: int, topic: str, name: str, *extra: str) -> IngestRun:
    return IngestRun(
        [
            "--no-ui",
            *("--source", f"mqtt://127.0.0.1:{port}/{topic}{''.join(extra)}"),
            *("--sink", f"parquet:{tmp_path / 'out'}", "--progress", "lines"),
            # 2 s batches: half the batches (each a Spark job) of 1 s for the same messages
            *("--batch-interval", "2s"),
        ],
        tmp_path / f"{name}.log",
    )


def wait_written(out: Path, want: set[str], timeout_s: float) -> set[str]:
    deadline = time.monotonic() + timeout_s
    got = set(written(out))
    while not want <= got and time.monotonic() < deadline:
        time.sleep(1.0)
        got = set(written(out))
    return got


def finish(run: IngestRun) -> None:
    """Ctrl-C: a graceful stop; it must end 0 (every received record processed)."""
    run.interrupt()
    assert run.wait(300) == 0, run.text()[-3000:]


@dataclass
class Delivery:
    """What the broker acknowledged to the publisher, what the job and the control got."""

    acked: set[str]
    got: set[str]
    control: set[str] = field(default_factory=set)


@dataclass
class SharedRun:
    burst: Delivery | None = None
    sigterm: Delivery | None = None
    status: int | None = None
    log: str = ""


@pytest.fixture(scope="module")
def burst_then_sigterm(tmp_path_factory) -> Iterator[SharedRun]:
    """One ingest (one local Spark) for the burst and the broker SIGTERM scenarios, in turn
    on one topic: first the burst the moment it says it is ingesting, then 4,000 messages
    with a broker stop and restart. Each test checks its own scenario's messages."""
    root = tmp_path_factory.mktemp("burst-then-sigterm")
    broker = Broker(root / "broker", persistence=True)
    topic = f"shared/{uuid.uuid4().hex[:8]}"
    control = Control(broker.port, topic, 1)
    publisher = Publisher(broker.port)
    run = ingest(root, broker.port, topic, "ingest")
    out = root / "out"
    result = SharedRun()
    try:
        # The burst: 3,000 QoS 1 messages published the moment ingest says it is ingesting.
        run.wait_for(lambda t: "ingesting" in t, 300, "ingest to start")
        for i in range(3000):
            publisher.publish(topic, f"b{i}", 1)
        acked = publisher.acked(60)
        result.burst = Delivery(acked, wait_written(out, acked, 300))
        # The broker (persistence on) stopped with SIGTERM a third of the way.
        for i in range(4000):
            publisher.publish(topic, f"m{i}", 1)
            if i == 1333:
                publisher.acked(60)  # what was sent before the stop is the broker's
                broker.stop()
                broker.start()
                publisher.wait_connected(60)  # publish() refuses while it reconnects
            time.sleep(0.002)
        acked = {p for p in publisher.acked(120) if p.startswith("m")}
        result.sigterm = Delivery(acked, wait_written(out, acked, 400))
        run.interrupt()  # Ctrl-C: a graceful stop; it must end 0
        result.status = run.wait(300)
        result.log = run.text()[-3000:]
    finally:
        run.stop()
        publisher.close()
        control.close()
        broker.stop()
    result.burst.control = {p for p in control.got if p.startswith("b")}
    result.sigterm.control = {p for p in control.got if p.startswith("m")}
    yield result


def test_a_burst_published_as_the_job_starts_is_delivered_whole(burst_then_sigterm):
    """3,000 QoS 1 messages published the moment ingest says it is ingesting: before, the
    receiver's task subscribed seconds later and every one of them was lost."""
    burst = burst_then_sigterm.burst
    assert burst is not None
    assert burst.acked == {f"b{i}" for i in range(3000)}
    assert burst_then_sigterm.status == 0, burst_then_sigterm.log
    assert burst.control >= burst.acked  # the broker dropped nothing
    lost = len(burst.acked - burst.got)
    assert burst.got >= burst.acked, f"the job lost {lost} acknowledged messages"


def test_a_broker_stopped_with_sigterm_and_restarted_loses_nothing_acknowledged(
    burst_then_sigterm,
):
    """4,000 QoS 1 messages, the broker (persistence on, as the docs say) stopped with
    SIGTERM a third of the way and started again; the job restarts its receiver."""
    sigterm = burst_then_sigterm.sigterm
    assert sigterm is not None
    assert len(sigterm.acked) == 4000
    assert burst_then_sigterm.status == 0, burst_then_sigterm.log
    assert sigterm.control >= sigterm.acked  # persistence kept the sessions and their queues
    lost = len(sigterm.acked - sigterm.got)
    assert sigterm.got >= sigterm.acked, f"the job lost {lost} acknowledged messages"


def test_qos_2_messages_are_all_delivered_across_a_restart_of_the_job(tmp_path, broker):
    """QoS 2, the job stopped (Ctrl-C) while messages flow and restarted from its
    session: before, what paho had answered PUBREC to but not yet stored was lost."""
    topic = f"qos2/{uuid.uuid4().hex[:8]}"
    control = Control(broker.port, topic, 2)
    publisher = Publisher(broker.port)
    same_session = f"?qos=2&client_id=qos2-{uuid.uuid4().hex[:8]}"  # both runs: one session
    first = ingest(tmp_path, broker.port, topic, "first", same_session)
    second = None
    try:
        first.wait_for(lambda t: "ingesting" in t, 300, "the first ingest to start")
        for i in range(1000):
            publisher.publish(topic, f"m{i}", 2)
        first.wait_for(lambda t: len(written(tmp_path / "out")) > 0, 300, "a first batch")
        for i in range(1000, 1500):  # flowing while the job stops
            publisher.publish(topic, f"m{i}", 2)
        finish(first)
        second = ingest(tmp_path, broker.port, topic, "second", same_session)
        second.wait_for(lambda t: "ingesting" in t, 300, "the second ingest to start")
        for i in range(1500, 2000):
            publisher.publish(topic, f"m{i}", 2)
        acked = publisher.acked(60)
        assert len(acked) == 2000
        got = wait_written(tmp_path / "out", acked, 300)
        finish(second)
    finally:
        first.stop()
        if second is not None:
            second.stop()
        publisher.close()
        control.close()
    assert control.got >= acked
    assert got >= acked, f"the job lost {len(acked - got)} acknowledged messages"
