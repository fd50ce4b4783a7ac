"""Every bad argument is one line ``error: ...`` on stderr, exit 2, and no JVM starts.

The cases run in one child interpreter (the real ``main``, the real stderr), which
then reports whether PySpark ever launched its gateway: it must not have.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

SECRET = "s3cret"

# (argv, what the one line says) — the bad cases of issues 22 and 24, and their kin.
BAD = [
    (["ingest", "--source", "generator://?rate=abc", "--sink", "console"],
     "error: source generator://?rate=abc: parameter rate must be a finite number > 0, got 'abc'"),
    (["ingest", "--source", "kafka://broker:9092/t", "--sink", "console"],
     "error: unknown source kafka://broker:9092/t (scheme 'kafka'): use one of socket://, "
     "http://, file://, redis://, rediss://, mqtt://, mqtts://, amqp://, amqps://, nats://, "
     "ws://, wss://, generator://"),
    (["ingest", "--source", "generator://", "--sink", "kafka:topic"],
     "error: unknown sink 'kafka:topic': use console, parquet:DIR, table:NAME or format:NAME"),
    (["ingest", "--source", "file://relative/dir", "--sink", "console"],
     "error: source file://relative/dir: a file source needs an absolute directory: "
     "file:///path/to/dir (three slashes); did you mean file://"),
    (["ingest", "--source", f"http://127.0.0.1:99999/ingest?token={SECRET}", "--sink", "console"],
     "error: source http://127.0.0.1:99999/ingest?token=***: port must be an integer in "
     "1-65535, got '99999'"),
    (["ingest", "--source", f"redis://:{SECRET}@127.0.0.1:99999/s?group=g", "--sink", "console"],
     "error: source redis://:***@127.0.0.1:99999/s?group=g: port must be an integer in "
     "1-65535, got '99999'"),
    (["ingest", "--source", "http://127.0.0.1:0/ingest", "--sink", "console"],
     "error: source http://127.0.0.1:0/ingest: port must be an integer in 1-65535, got '0'"),
    (["ingest", "--source", "generator://", "--sink", "console", "--seconds", "-1"],
     "error: --seconds must be a finite duration > 0"),
    (["ingest", "--source", "generator://", "--sink", "console", "--seconds", "inf"],
     "error: --seconds must be a finite duration > 0"),
    (["ingest", "--source", "generator://", "--sink", "console", "--seconds", "nan"],
     "error: --seconds must be a finite duration > 0"),
    (["ingest", "--source", "generator://", "--sink", "console", "--batch-interval", "1 sec ago"],
     "error: --batch-interval must be a duration such as 500ms, 2s, 1min or 1h"),
    (["ingest", "--source", "generator://", "--sink", "console", "--unreachable-timeout", "0"],
     "error: --unreachable-timeout must be > 0"),
    (["ingest", "--source", "generator://", "--sink", "console", "--unreachable-timeout=-1s"],
     "error: --unreachable-timeout must be a finite duration > 0"),
    (["demo", "--batch-interval=-5s"], "error: --batch-interval must be a duration"),
    (["demo", "--seconds", "inf"], "error: --seconds must be a finite duration > 0"),
    (["demo", "--rate", "nan"], "error: --rate must be a finite number of lines/s > 0"),
    (["ingest", "--source", "generator://", "--sink", "console", "--wal"],
     "error: --wal needs --checkpoint DIR"),
    (["ingest", "--source", "generator://", "--sink", "console", "--conf", "nokey"],
     "error: --conf must be KEY=VALUE, got 'nokey'"),
    (["ingest", "--source", "generator://", "--sink", "console", "--conf",
      "spark.streaming.receiver.maxRate=lots"],
     "error: spark.streaming.receiver.maxRate must be a number, got 'lots'"),
    (["ingest", "--source", "generator://", "--sink", "console", "--deploy-mode", "cluster"],
     "error: --deploy-mode cluster is not supported"),
    (["ingest", "--source", "generator://", "--sink", "console", "--deploy-mode", "yarn"],
     "error: argument --deploy-mode: invalid choice: 'yarn'"),
    (["ingest", "--sink", "console"],
     "error: the following arguments are required: --source (see spark-receivers ingest --help)"),
    (["ingest", "--source", "generator://", "--sink", "console", "--bogus"],
     "error: unrecognized arguments: --bogus"),
    (["ingest", "--source", "generator://", "--sink", "format:json", "--sink-option", "x"],
     "error: --sink-option must be KEY=VALUE, got 'x'"),
    (["ingest", "--source", f"mqtt://user:{SECRET}@127.0.0.1/t?qos=7", "--sink", "console"],
     "error: source mqtt://user:***@127.0.0.1/t?qos=7: parameter qos must be one of 0, 1, 2"),
    (["ingest", "--source", "generator://", "--sink", "console", "--master", "local[1]"],
     "error: master 'local[1]' has 1 core(s) but 1 receiver(s)"),
    # an invalid topic filter (issue 36): refused here, not after a 60 s run that ends 0
    (["ingest", "--source", "mqtt://127.0.0.1/a/%23/b", "--sink", "console"],
     "error: source mqtt://127.0.0.1/a/%23/b: invalid MQTT topic filter 'a/#/b': '#' must be "
     "the last level (logs/# or #), got it at level 2 of 3"),
    (["ingest", "--source", f"mqtt://u:{SECRET}@127.0.0.1/sensors/a+/temp", "--sink", "console"],
     "error: source mqtt://u:***@127.0.0.1/sensors/a+/temp: invalid MQTT topic filter "
     "'sensors/a+/temp': '+' must stand alone in a level (sensors/+/temp), got level 'a+'"),
]  # fmt: skip

CHILD = r"""
import contextlib, io, json, sys
from spark_receivers.cli import main
results = []
for argv in json.loads(sys.argv[1]):
    err, out = io.StringIO(), io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(out):
        code = main(argv)
    results.append({"code": code, "stderr": err.getvalue(), "stdout": out.getvalue()})
from pyspark import SparkContext
print(json.dumps({"results": results, "gateway": SparkContext._gateway is not None}))
"""


@pytest.fixture(scope="module")
def outcomes():
    env = {k: v for k, v in os.environ.items() if k != "SPARK_CONF_DIR"}
    done = subprocess.run(
        [sys.executable, "-c", CHILD, json.dumps([argv for argv, _ in BAD])],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["gateway"] is False, "a JVM was started for a bad argument"
    return report["results"]


@pytest.mark.parametrize(("index", "expected"), [(i, e) for i, (_, e) in enumerate(BAD)])
def test_bad_case_is_one_line_exit_2_before_spark(outcomes, index, expected):
    result = outcomes[index]
    assert result["code"] == 2, result
    lines = result["stderr"].splitlines()
    assert len(lines) == 1, result["stderr"]
    assert lines[0].startswith(expected), lines[0]
    assert SECRET not in result["stderr"] + result["stdout"]


def test_version_and_python_dash_m():
    for module in ("spark_receivers", "spark_receivers.cli"):
        done = subprocess.run(
            [sys.executable, "-m", module, "--version"],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert done.returncode == 0, done.stderr
        assert done.stdout.startswith("spark-receivers 0.1.0.dev0 (pyspark 4.")


def test_check_prints_the_run_without_spark_and_without_secrets():
    done = subprocess.run(
        [
            sys.executable, "-m", "spark_receivers", "ingest", "--check",
            "--source", f"redis://:{SECRET}@127.0.0.1:6380/2/events?group=g",
            "--sink", "table:events", "--conf", f"spark.authenticate.secret={SECRET}",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert SECRET not in done.stdout + done.stderr
    assert (
        "receiver    RedisStreamReceiver(stream='events', group='g', "
        "url='redis://:***@127.0.0.1:6380/2', field='value')"
    ) in done.stdout
    assert "warning: the write-ahead log is off: an XACK only means" in done.stderr
