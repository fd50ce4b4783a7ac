"""`ingest amqp://... | nats://... --checkpoint DIR --wal`: kill -9 the driver, start it
again with the same command, and every message the broker confirmed is in the sink (issue 36).

The driver, its local executor and the receiver die together (the whole process session):
what the receiver had acked is in the WAL and the checkpoint; what it had not is still the
broker's (AMQP requeues a dead consumer's unacked deliveries; JetStream delivers them again
after AckWait to the same durable consumer, whose name comes from the checkpoint's job id).
"""

from __future__ import annotations

import asyncio
import glob
import os
import signal
import subprocess
import sys
import threading
import uuid
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from processes import kill_session, wait_until

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "receivers"))

from service_fixtures import amqp_url, nats_url  # noqa: F401

pytestmark = pytest.mark.spark

MESSAGES = 4000


def output_values(out: Path) -> set[str]:
    """Every value in the complete batch directories of the parquet sink."""
    values: set[str] = set()
    for d in glob.glob(str(out / "batch_time_ms=*")):
        if os.path.exists(os.path.join(d, "_SUCCESS")):
            for f in glob.glob(os.path.join(d, "*.parquet")):
                values.update(pq.read_table(f).column("value").to_pylist())
    return values


def amqp_source(url: str) -> tuple[str, object]:
    import pika

    queue = f"crash-{uuid.uuid4().hex[:8]}"
    with pika.BlockingConnection(pika.URLParameters(url)) as conn:
        conn.channel().queue_declare(queue, durable=True)

    def publish(confirmed: set[str]) -> None:
        with pika.BlockingConnection(pika.URLParameters(url)) as conn:
            ch = conn.channel()
            ch.confirm_delivery()
            for chunk in range(MESSAGES // 100):
                for i in range(100):
                    body = f"msg {chunk} {i}"
                    ch.basic_publish(
                        "", queue, body.encode(), pika.BasicProperties(delivery_mode=2)
                    )
                    confirmed.add(body)  # the broker confirmed it
                conn.sleep(0.2)

    return f"{url}?queue={queue}", publish


def nats_source(url: str) -> tuple[str, object]:
    import nats

    stream = f"crash-{uuid.uuid4().hex[:8]}"
    creds, server = url.split("//")[1].split("@")
    user, password = creds.split(":")

    async def publish_all(confirmed: set[str]) -> None:
        nc = await nats.connect(f"nats://{server}", user=user, password=password)
        try:
            js = nc.jetstream()
            await js.add_stream(name=stream, subjects=[f"{stream}.>"])
            for chunk in range(MESSAGES // 100):
                for i in range(100):
                    body = f"msg {chunk} {i}"
                    await js.publish(f"{stream}.a", body.encode())
                    confirmed.add(body)  # JetStream stored it
                await asyncio.sleep(0.2)
        finally:
            await nc.close()

    return f"{url}?stream={stream}&ack_wait=3s", lambda c: asyncio.run(publish_all(c))


@pytest.mark.timeout(600)
@pytest.mark.parametrize("broker", ["amqp", "nats"])
def test_ingest_from_a_broker_survives_a_kill_9_of_the_driver(tmp_path, broker, request):
    url = request.getfixturevalue(f"{broker}_url")
    source, publish = (amqp_source if broker == "amqp" else nats_source)(url)
    out, ckpt = tmp_path / "out", tmp_path / "ckpt"
    cmd = [sys.executable, "-m", "spark_receivers.cli", "ingest", "--no-ui"]
    cmd += ["--source", source, "--sink", f"parquet:{out}"]
    # 2 s batches: the restart runs a batch for each batch time of the down time
    cmd += ["--checkpoint", str(ckpt), "--wal", "--batch-interval", "2s"]
    env = {**os.environ, "SPARK_LOCAL_IP": "127.0.0.1", "PYSPARK_PYTHON": sys.executable}
    logs = [open(tmp_path / f"ingest{i}.log", "w+") for i in (1, 2)]  # noqa: SIM115
    procs: list[subprocess.Popen] = []
    confirmed: set[str] = set()
    published = threading.Event()

    def start(i: int) -> subprocess.Popen:
        p = subprocess.Popen(cmd, stdout=logs[i], stderr=subprocess.STDOUT, env=env,
                             start_new_session=True)  # fmt: skip
        procs.append(p)
        return p

    def run_publisher() -> None:
        publish(confirmed)
        published.set()

    try:
        first = start(0)
        threading.Thread(target=run_publisher, daemon=True).start()
        wait_until(lambda: len(output_values(out)) >= 500, 240, "the first batches")
        kill_session(first)
        assert first.returncode == -signal.SIGKILL
        second = start(1)

        def log2() -> str:
            logs[1].flush()
            return Path(logs[1].name).read_text()

        wait_until(lambda: "recovering from the checkpoint" in log2(), 180, "the restart")
        assert published.wait(180), "the publisher did not finish"
        wait_until(lambda: confirmed <= output_values(out), 240, "every confirmed message")
        second.send_signal(signal.SIGINT)  # Ctrl-C: graceful stop
        second.wait(120)
        assert second.returncode == 0, log2()[-3000:]
        assert len(confirmed) == MESSAGES
        assert url.split(":")[2].split("@")[0] not in log2()  # the password, never printed
    finally:
        for p in procs:
            if p.poll() is None:
                kill_session(p)
        for f in logs:
            f.close()
