"""One message over the record limit among small ones: the job goes on and delivers the others.

Issue 36: a 100 MB MQTT payload was PUBACKed and the driver's JVM died with
OutOfMemoryError holding it as one row; nothing reached the sink and the run took
about 15 min to end. A 100 MB Redis entry among 100 small ones: all 101 XACKed,
none delivered. Now a record longer than spark.receivers.receiver.maxRecordBytes
(1 MiB) goes by the receiver's bad_record_policy. Real servers (scripts/services.sh),
real clients (paho, redis-cli), the real ``ingest``. The large record here is 2 MB:
over the 1 MiB limit is what puts it under the policy; 100 MB only made each test
move a few hundred MB around. Marked ``slow``.
"""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from pathlib import Path

import paho.mqtt.client as mqtt
import pyarrow.parquet as pq
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "receivers"))

from ingest_run import IngestRun
from service_fixtures import mosquitto_port, redis_url  # noqa: F401

pytestmark = [pytest.mark.spark, pytest.mark.slow, pytest.mark.timeout(1200)]

LARGE = 2 * 1000 * 1000  # over the default max_record_bytes (1 MiB)


def written(out: Path) -> list[str]:
    values: list[str] = []
    for part in sorted(out.glob("batch_time_ms=*/part-*.parquet")):
        values += pq.read_table(part).column("value").to_pylist()
    return values


def test_an_mqtt_message_over_the_record_limit_is_dead_lettered_and_the_job_goes_on(
    tmp_path,
    mosquitto_port,  # noqa: F811
):
    topic = f"large/{uuid.uuid4().hex[:8]}"
    dead = tmp_path / "dead"
    out = tmp_path / "out"
    source = (
        f"mqtt://127.0.0.1:{mosquitto_port}/{topic}"
        f"?bad_record_policy=dead_letter&dead_letter_dir={dead}"
    )
    run = IngestRun(
        ["--no-ui", "--source", source, "--sink", f"parquet:{out}", "--progress", "lines"],
        tmp_path / "ingest.log",
    )
    publisher = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2)
    publisher.connect("127.0.0.1", mosquitto_port)
    publisher.loop_start()
    try:
        run.wait_for(lambda t: "ingesting" in t, 300, "ingest to start")
        small = [f"small {i}" for i in range(100)]
        infos = [publisher.publish(topic, v, qos=1) for v in small[:50]]
        infos.append(publisher.publish(topic, b"L" * LARGE, qos=1))
        infos += [publisher.publish(topic, v, qos=1) for v in small[50:]]
        for info in infos:
            info.wait_for_publish(120)
        assert all(info.is_published() for info in infos)  # PUBACKed, the big one too
        run.wait_for(lambda t: len(written(out)) >= 100, 300, "the small messages")
        # still running: a message after the big one gets through too
        publisher.publish(topic, "after", qos=1).wait_for_publish(30)
        run.wait_for(lambda t: "after" in written(out), 120, "a message after it")
        run.interrupt()
        assert run.wait(300) == 0, run.text()[-3000:]
    finally:
        run.stop()
        publisher.disconnect()
        publisher.loop_stop()
    assert sorted(written(out)) == sorted([*small, "after"])
    (letters,) = dead.glob("stream-0-*.jsonl")
    (letter,) = [json.loads(line) for line in letters.read_text().splitlines()]
    assert letter["key"] == f"topic {topic}" and letter["bytes"] == LARGE
    assert (dead / letter["file"]).stat().st_size == LARGE
    assert "OutOfMemoryError" not in run.text()


def test_a_redis_entry_over_the_record_limit_is_skipped_and_the_small_ones_delivered(
    tmp_path,
    redis_url,  # noqa: F811
):
    import redis

    stream = f"large-{uuid.uuid4().hex[:8]}"
    port = redis_url.rsplit(":", 1)[1].split("/")[0]
    client = redis.Redis.from_url(redis_url, decode_responses=True)
    try:
        for i in range(50):
            client.xadd(stream, {"value": f"small {i}"})
        subprocess.run(  # the real client; the value from stdin
            ["redis-cli", "-p", port, "-x", "XADD", stream, "*", "value"],
            input=b"L" * LARGE,
            capture_output=True,
            check=True,
            timeout=120,
        )
        for i in range(50, 100):
            client.xadd(stream, {"value": f"small {i}"})
        out = tmp_path / "out"
        run = IngestRun(
            [
                "--no-ui",
                *("--source", f"redis://127.0.0.1:{port}/{stream}?group=g"),
                *("--sink", f"parquet:{out}", "--progress", "lines"),
            ],
            tmp_path / "ingest.log",
        )
        try:
            run.wait_for(lambda t: len(written(out)) >= 100, 400, "the small entries")
            client.xadd(stream, {"value": "after"})
            run.wait_for(lambda t: "after" in written(out), 120, "an entry after it")
            run.interrupt()
            assert run.wait(300) == 0, run.text()[-3000:]
        finally:
            run.stop()
        assert sorted(written(out)) == sorted([f"small {i}" for i in range(100)] + ["after"])
        assert client.xpending(stream, "g")["pending"] == 0  # the big one acked by "skip"
        size = len("value") + LARGE  # its field name and value
        assert f"is {size:,} bytes, longer than max_record_bytes=1,048,576" in run.text()
    finally:
        client.delete(stream)
        client.close()
