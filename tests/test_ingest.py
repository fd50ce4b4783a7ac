"""``spark-receivers ingest`` run for real: a subprocess on local Spark, bounded, no UI.

The command's parsing and checks are tested without Spark in ``test_cli_*.py``.
"""

from __future__ import annotations

import glob
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pyarrow.parquet as pq
import pytest

pytestmark = pytest.mark.spark

TOKEN = "s3cret-token"
DONE = re.compile(r"done: (\d+) batches, ([\d,]+) records processed, ([\d,]+) received")


def ingest_env() -> dict[str, str]:
    return {**os.environ, "SPARK_LOCAL_IP": "127.0.0.1", "PYSPARK_PYTHON": sys.executable}


def ingest_cmd(*argv: str) -> list[str]:
    return [sys.executable, "-m", "spark_receivers", "ingest", "--no-ui", *argv]


def counts(log: str) -> tuple[int, int]:
    m = DONE.search(log)
    assert m, log[-3000:]
    return int(m.group(2).replace(",", "")), int(m.group(3).replace(",", ""))


BATCH_LINE = re.compile(r"^batch \S+\s+in\s+([\d,]+) \(.*\bproc\b", re.MULTILINE)


def completed_records(log: str) -> int:
    """Records of the batches the run's output says completed (its ``batch ... proc`` lines)."""
    return sum(int(n.replace(",", "")) for n in BATCH_LINE.findall(log))


def parquet_rows(out: Path) -> int:
    """Rows in the committed (``_SUCCESS``) batch directories of a parquet sink."""
    total = 0
    for d in glob.glob(str(out / "batch_time_ms=*")):
        if os.path.exists(os.path.join(d, "_SUCCESS")):
            total += sum(pq.read_table(f).num_rows for f in glob.glob(os.path.join(d, "*.parquet")))
    return total


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_for(predicate, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.2)
    raise AssertionError(f"timed out after {timeout_s}s waiting for {what}")


def run_until(cmd: list[str], log_path: Path, predicate, what: str) -> tuple[int, str]:
    """Run ``cmd`` until ``predicate()`` holds, then Ctrl-C it; its exit status and output."""
    with open(log_path, "w") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=ingest_env())
    try:
        wait_for(lambda: "ingesting" in log_path.read_text(), 180, "the ingest to start")
        wait_for(predicate, 180, what)
        proc.send_signal(signal.SIGINT)  # a graceful stop
        proc.wait(180)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(30)
    return proc.returncode, log_path.read_text()


def test_generator_to_parquet_exits_0_with_every_record_processed(tmp_path):
    out = tmp_path / "out"
    cmd = ingest_cmd("--source", "generator://?rate=2000", "--sink", f"parquet:{out}")
    code, text = run_until(
        cmd, tmp_path / "log", lambda: parquet_rows(out) >= 1000, "records in the sink"
    )
    assert code == 0, text[-4000:]
    processed, received = counts(text)
    assert processed == received >= 1000
    assert re.search(r"batch \d\d:\d\d:\d\d +in", text)  # live progress lines
    assert parquet_rows(out) == processed
    assert "write-ahead log is off" not in text  # the generator acknowledges nothing


def json_rows(out: Path) -> int:
    files = glob.glob(str(out / "batch=*" / "*.json"))
    return sum(len(Path(f).read_text().splitlines()) for f in files)


def test_format_sink_with_a_batch_path(tmp_path):
    out = tmp_path / "json"
    cmd = ingest_cmd("--source", "generator://?rate=200", "--sink", "format:json")
    cmd += [
        "--sink-option",
        f"path={out}/batch={{batch_time_ms}}",
        "--sink-option",
        "mode=overwrite",
    ]
    code, text = run_until(cmd, tmp_path / "log", lambda: json_rows(out) >= 200, "json rows")
    assert code == 0, text[-4000:]
    processed, _ = counts(text)
    assert json_rows(out) == processed
    files = glob.glob(str(out / "*/*.json"))
    assert all(json.loads(x)["value"] for f in files for x in Path(f).read_text().splitlines())
    assert f"-> format:json (path={out}/batch={{batch_time_ms}}, mode=overwrite)" in text


class Poster:
    """POSTs numbered lines to the HTTP source until told to stop; remembers the 200s."""

    def __init__(self, port: int) -> None:
        self.url = f"http://127.0.0.1:{port}/ingest"
        self.acked: list[str] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        n = 0
        while not self.stop.is_set():
            lines = [f"line {n + i}" for i in range(5)]
            body = "".join(x + "\n" for x in lines).encode()
            request = urllib.request.Request(
                self.url, body, {"Authorization": f"Bearer {TOKEN}"}, method="POST"
            )
            try:
                with urllib.request.urlopen(request, timeout=15) as answer:
                    if answer.status == 200:
                        self.acked.extend(lines)
            except (urllib.error.URLError, OSError):
                pass  # the receiver is not up yet, or is gone: not acknowledged
            n += 5
            time.sleep(0.02)


@pytest.mark.timeout(780)  # above the sum of its waits
def test_a_failing_sink_ends_the_run_at_once_with_honest_counts(tmp_path):
    """Issue 24's "200 OK then lost": the sink's directory is replaced by a file mid-run."""
    out, port = tmp_path / "out", free_port()
    log_path = tmp_path / "ingest.log"
    cmd = ingest_cmd("--source", f"http://127.0.0.1:{port}/ingest?token={TOKEN}")
    # no --seconds; 2 s batches: at 500 ms a run beside a CPU hog and other work (load 17)
    # fell behind by more than a minute before its first rows were written
    cmd += ["--sink", f"parquet:{out}", "--batch-interval", "2s"]
    poster = Poster(port)
    with open(log_path, "w") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=ingest_env())
    try:
        wait_for(lambda: "ingesting" in log_path.read_text(), 180, "the ingest to start")
        poster.thread.start()
        # A batch that completed with records (its write returned): with only its files
        # committed the rename could fail that very batch and leave nothing processed.
        wait_for(lambda: completed_records(log_path.read_text()) > 0, 300, "a completed batch")
        moved = tmp_path / "moved"
        os.rename(out, moved)
        out.write_text("the sink's directory is now a file")
        proc.wait(180)  # it must end by itself: nothing tells it to stop
    finally:
        poster.stop.set()
        if proc.poll() is None:
            proc.kill()
            proc.wait(30)
    text = log_path.read_text()
    assert proc.returncode == 1, text[-4000:]
    last = text.strip().splitlines()[-1]
    assert last.startswith("error: the stream failed: "), last
    assert "Parent path is not a directory" in last or "not a directory" in last.lower(), last
    processed, received = counts(text)
    failed = re.search(r"\d+ batch\(es\) failed \(([\d,]+) records\)", text)
    assert failed, text[-3000:]
    # The batch whose write failed may have committed its files before the step that
    # failed (the rename can land mid-commit): its rows may be there, never counted.
    assert processed <= parquet_rows(moved) <= processed + int(failed.group(1).replace(",", ""))
    assert processed > 0
    assert received >= len(poster.acked) > processed  # 200s were given after the sink broke
    lost = re.search(r"([\d,]+) received records were not processed and are lost", text)
    assert lost and int(lost.group(1).replace(",", "")) == received - processed
    assert re.search(r"FAILED, nothing of it counts as processed", text)
    assert "warning: the write-ahead log is off: an HTTP 200 to the client only means" in text
    assert TOKEN not in text
    assert f"ingesting http://127.0.0.1:{port}/ingest?token=*** -> parquet:{out}" in text


@pytest.mark.timeout(300)
@pytest.mark.parametrize(
    "source",
    [
        f"redis://:{TOKEN}@127.0.0.1:{{port}}/s?group=g",
        # issue 36 (nats:// and ws:// take the same path: a server the run watches)
        f"amqp://app:{TOKEN}@127.0.0.1:{{port}}/%2F?queue=q",
    ],
    ids=["redis", "amqp"],
)
def test_an_unreachable_broker_ends_the_run_with_status_1_and_its_reason(tmp_path, source):
    """Issue 24: an unreachable broker or Redis is not a run that reads nothing and exits 0."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))  # bound, never listening: every connection is refused
        port = taken.getsockname()[1]
        cmd = ingest_cmd("--source", source.format(port=port))
        cmd += ["--sink", "console", "--unreachable-timeout", "3s"]  # no --seconds
        done = subprocess.run(
            cmd, capture_output=True, text=True, timeout=240, env=ingest_env(), check=False
        )
    text = done.stdout + done.stderr
    assert done.returncode == 1, text[-4000:]
    assert f"warning: 127.0.0.1:{port} cannot be reached now (Connection refused)" in text
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith(
        f"error: the stream failed: ReceiverError: the source's server 127.0.0.1:{port} has "
        "been unreachable for "
    ), last
    assert "(Connection refused); the receiver's last error: " in last
    assert f"stopping: the source's server 127.0.0.1:{port}" in text
    assert TOKEN not in text


def test_progress_json_and_the_status_page_of_a_real_run(tmp_path):
    """``--progress json``: one progress JSON per batch on stdout; the page serves /metrics."""
    out = tmp_path / "out"
    cmd = [
        sys.executable, "-m", "spark_receivers", "ingest", "--progress", "json",
        "--conf", "spark.receivers.ui.port=0", "--conf", "spark.ui.enabled=false",
        "--source", "generator://?rate=2000", "--sink", f"parquet:{out}",
    ]  # fmt: skip
    stdout, stderr = tmp_path / "stdout", tmp_path / "stderr"
    with open(stdout, "w") as o, open(stderr, "w") as e:
        proc = subprocess.Popen(cmd, stdout=o, stderr=e, env=ingest_env())
    try:
        wait_for(lambda: "status page http://" in stderr.read_text(), 180, "the status page")
        url = re.search(r"status page (http://\S+)", stderr.read_text()).group(1)
        wait_for(lambda: parquet_rows(out) >= 1000, 180, "records in the sink")
        with urllib.request.urlopen(url + "metrics", timeout=10) as r:
            metrics = r.read().decode()
        assert re.search(r'spark_receivers_records_received_total\{.*stream="0".*\} [1-9]', metrics)
        proc.send_signal(signal.SIGINT)
        proc.wait(180)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(30)
    assert proc.returncode == 0, stderr.read_text()[-4000:]
    progress = [json.loads(line) for line in stdout.read_text().splitlines()]
    assert progress and all({"batchId", "numInputRows", "sources"} <= set(p) for p in progress)
    processed, _ = counts(stderr.read_text())
    assert sum(p["numInputRows"] for p in progress if not p["failed"]) == processed
    assert not re.search(r"batch \d\d:\d\d:\d\d +in", stderr.read_text())  # no batch lines
