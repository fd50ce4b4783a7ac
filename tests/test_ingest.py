"""The ingest command: source URIs, sinks, durations, and a real run."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from spark_receivers.errors import ConfigError
from spark_receivers.ingest import parse_duration_ms, receiver_for
from spark_receivers.receivers import (
    FileTailReceiver,
    GeneratorReceiver,
    HttpReceiver,
    MqttReceiver,
    RedisStreamReceiver,
    SocketTextReceiver,
)


def test_durations():
    assert parse_duration_ms("1s") == 1000
    assert parse_duration_ms("500ms") == 500
    assert parse_duration_ms("2m") == 120_000
    assert parse_duration_ms("250") == 250
    with pytest.raises(ConfigError, match="--batch-interval must look like"):
        parse_duration_ms("soon")


@pytest.mark.parametrize(
    ("uri", "kind"),
    [
        ("socket://127.0.0.1:9999", SocketTextReceiver),
        ("http://127.0.0.1:8080/ingest?token=t", HttpReceiver),
        ("file:///var/log/app", FileTailReceiver),
        ("redis://127.0.0.1:6379/events?group=g", RedisStreamReceiver),
        ("mqtt://127.0.0.1:1883/sensors", MqttReceiver),
        ("generator://?rate=10", GeneratorReceiver),
    ],
)
def test_every_source_scheme(uri, kind):
    assert isinstance(receiver_for(uri), kind)


@pytest.mark.parametrize(
    ("uri", "message"),
    [
        ("kafka://broker:9092/topic", "scheme must be one of socket, http, file, redis, mqtt"),
        ("socket://127.0.0.1", "needs a port"),
        ("redis://127.0.0.1:6379/events", "needs a stream and a group"),
        ("mqtt://127.0.0.1:1883", "needs a topic"),
    ],
)
def test_bad_sources_fail_clearly(uri, message):
    with pytest.raises(ConfigError, match=message):
        receiver_for(uri)


@pytest.mark.spark
def test_ingest_generator_to_parquet_end_to_end(tmp_path):
    out = tmp_path / "out"
    env = {**os.environ, "SPARK_LOCAL_IP": "127.0.0.1", "PYSPARK_PYTHON": sys.executable}
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "spark_receivers.cli",
            "ingest",
            "--source",
            "generator://?rate=500",
            "--sink",
            f"parquet:{out}",
            "--seconds",
            "20",
            "--batch-interval",
            "1s",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    m = re.search(
        r"done: (\d+) batches, ([\d,]+) records processed, ([\d,]+) received", proc.stderr
    )
    assert m, proc.stderr[-2000:]
    processed = int(m.group(2).replace(",", ""))
    received = int(m.group(3).replace(",", ""))
    assert processed == received > 0
    assert re.search(r"batch \d\d:\d\d:\d\d +in", proc.stderr)  # live progress lines

    import pyarrow.parquet as pq

    rows = sum(
        pq.read_table(str(d)).num_rows for d in out.iterdir() if d.name.startswith("batch_time_ms=")
    )
    assert rows == processed
