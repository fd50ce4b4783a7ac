"""`spark-receivers ingest --checkpoint DIR --wal`: kill -9 it, start it again, lose nothing.

And with the ``table:`` sink: the restarted process, which has a new (empty) in-memory
catalog, finds the table's earlier batches and never writes a batch twice.
"""

from __future__ import annotations

import glob
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections import Counter
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from processes import kill_session, port_for_a_later_server, wait_until

pytestmark = pytest.mark.spark


def output_counts(out: Path) -> Counter[str]:
    """How often each value is in the complete batch directories of the parquet sink."""
    values: Counter[str] = Counter()
    for d in glob.glob(str(out / "batch_time_ms=*")):
        if os.path.exists(os.path.join(d, "_SUCCESS")):
            for f in glob.glob(os.path.join(d, "*.parquet")):
                values.update(pq.read_table(f).column("value").to_pylist())
    return values


def output_lines(out: Path) -> set[str]:
    """Every value in the complete batch directories of the parquet sink."""
    return set(output_counts(out))


@pytest.mark.timeout(1200)
def test_ingest_with_checkpoint_and_wal_survives_kill_9(tmp_path):
    data, out, ckpt = tmp_path / "data", tmp_path / "out", tmp_path / "ckpt"
    data.mkdir()
    cmd = [sys.executable, "-m", "spark_receivers.cli", "ingest", "--no-ui"]
    cmd += ["--source", f"file://{data}?pattern=*.log", "--sink", f"parquet:{out}"]
    # 2 s batches: after the kill every batch time of the down time is run on restart
    # (a JVM start under load: a minute); 1 s batches doubled that work, showing nothing more.
    cmd += ["--checkpoint", str(ckpt), "--wal", "--batch-interval", "2s"]
    env = {**os.environ, "SPARK_LOCAL_IP": "127.0.0.1", "PYSPARK_PYTHON": sys.executable}
    logs = [open(tmp_path / f"ingest{i}.log", "w+") for i in (1, 2)]  # noqa: SIM115
    procs: list[subprocess.Popen] = []
    written: set[str] = set()
    done = threading.Event()

    def write_lines() -> None:
        with (data / "app.log").open("a") as f:
            for chunk in range(60):
                lines = [f"line {chunk} {i}" for i in range(100)]
                f.write("".join(x + "\n" for x in lines))
                f.flush()
                written.update(lines)
                time.sleep(0.25)
        done.set()

    def start(i: int) -> subprocess.Popen:
        p = subprocess.Popen(cmd, stdout=logs[i], stderr=subprocess.STDOUT, env=env,
                             start_new_session=True)  # fmt: skip
        procs.append(p)
        return p

    try:
        first = start(0)
        writer = threading.Thread(target=write_lines, daemon=True)
        writer.start()
        wait_until(lambda: len(output_lines(out)) >= 500, 180, "the first batches")
        kill_session(first)
        assert first.returncode == -signal.SIGKILL
        second = start(1)

        def log2() -> str:
            logs[1].flush()
            return Path(logs[1].name).read_text()

        wait_until(lambda: "ingesting" in log2(), 180, "the restarted ingest")
        assert "recovering from the checkpoint" in log2()
        assert done.wait(120), "the writer did not finish"
        wait_until(lambda: written <= output_lines(out), 180, "every line in the sink")

        def batch_lines() -> list[str]:
            return [x for x in log2().splitlines() if x.startswith("batch ")]

        # The receiver starts before the batches the crash left are redone: it is ACTIVE
        # when the first of them completes (it used to stay SCHEDULED behind them).
        wait_until(batch_lines, 180, "the first redone batch")
        assert batch_lines()[0].endswith("receivers 0=ACTIVE"), batch_lines()[:3]
        second.send_signal(signal.SIGINT)  # Ctrl-C: graceful stop
        # It drains what was received first: on a machine busy many times over (a run
        # beside a CPU hog took more than 120 s), a bound, not a speed.
        second.wait(480)
        assert second.returncode == 0, log2()[-3000:]
        assert len(written) == 6000
        # Exactly once (issue 33): the file tail resumes after the position the recovered
        # driver accepted, so no line the first run stored is stored again.
        twice = {v: n for v, n in output_counts(out).items() if n > 1}
        assert twice == {}, f"{len(twice)} lines in the sink more than once: {list(twice)[:5]}"
    finally:
        for p in procs:
            if p.poll() is None:
                kill_session(p)
        for f in logs:
            f.close()


def table_values(location: Path) -> Counter[str]:
    """Every value in the batch partitions of the table's files, with its count."""
    values: Counter[str] = Counter()
    for f in glob.glob(str(location / "batch_time_ms=*" / "*.parquet")):
        values.update(pq.read_table(f).column("value").to_pylist())
    return values


class Poster:
    """POSTs numbered lines once each (never retried); remembers those answered 200."""

    def __init__(self, port: int) -> None:
        self.url = f"http://127.0.0.1:{port}/ingest"
        self.acked: set[str] = set()
        self.sent = 0
        self.stop = threading.Event()
        self.errors: list[str] = []
        """The last answers that were not 200 (what a failed wait shows)."""
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self.stop.is_set():
            lines = [f"req {self.sent} line {i}" for i in range(10)]
            self.sent += 1
            body = "".join(x + "\n" for x in lines).encode()
            try:
                with urllib.request.urlopen(self.url, body, timeout=15) as answer:
                    if answer.status == 200:
                        self.acked.update(lines)
            except Exception as e:
                # Down (the kill, the restart), refused, or cut off: these lines are not
                # acked. Any error is kept for the failure message: catching network errors
                # only, a cut-off answer (http.client.HTTPException) once ended this thread
                # without a word.
                self.errors = [*self.errors[-4:], f"request {self.sent - 1}: {e!r}"]
                time.sleep(0.2)
            time.sleep(0.02)


@pytest.mark.timeout(600)
def test_table_sink_across_kill_9_and_restart_writes_every_acked_record_once(tmp_path):
    warehouse, ckpt = tmp_path / "warehouse", tmp_path / "ckpt"
    port = port_for_a_later_server()  # it must stay free across the kill and the restart
    cmd = [sys.executable, "-m", "spark_receivers", "ingest", "--no-ui"]
    cmd += ["--source", f"http://127.0.0.1:{port}/ingest", "--sink", "table:events"]
    # 2 s batches: the restart runs a batch for each batch time of the down time (a JVM
    # start under load: a minute); 500 ms batches made that four times the work.
    cmd += ["--checkpoint", str(ckpt), "--wal", "--batch-interval", "2s"]
    cmd += ["--conf", f"spark.sql.warehouse.dir={warehouse}"]
    env = {**os.environ, "SPARK_LOCAL_IP": "127.0.0.1", "PYSPARK_PYTHON": sys.executable}
    location = warehouse / "events"
    logs = [tmp_path / f"ingest{i}.log" for i in (1, 2)]
    procs: list[subprocess.Popen] = []
    poster = Poster(port)

    def start(i: int) -> subprocess.Popen:
        with open(logs[i], "w") as log:
            p = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env,
                                 start_new_session=True)  # fmt: skip
        procs.append(p)
        return p

    try:
        first = start(0)
        wait_until(lambda: "ingesting" in logs[0].read_text(), 180, "the first ingest")
        assert "table events: 0 batch partition(s) from earlier runs" in logs[0].read_text()
        poster.thread.start()
        try:
            wait_until(
                lambda: sum(table_values(location).values()) >= 300, 180, "rows in the table"
            )
        except AssertionError as e:
            tail = logs[0].read_text()[-3000:]
            raise AssertionError(
                f"{e}; poster sent {poster.sent} requests, {len(poster.acked)} lines acked, "
                f"thread alive {poster.thread.is_alive()}, last errors {poster.errors}; "
                f"ingest log:\n{tail}"
            ) from None
        kill_session(first)
        assert first.returncode == -signal.SIGKILL
        acked_before_kill = set(poster.acked)
        second = start(1)
        wait_until(lambda: "ingesting" in logs[1].read_text(), 180, "the restarted ingest")
        text = logs[1].read_text()
        assert "recovering from the checkpoint" in text
        assert "table events: 0 batch" not in text  # it found the first run's partitions
        assert acked_before_kill
        wait_until(lambda: len(poster.acked) >= len(acked_before_kill) + 300, 180, "new acks")
        poster.stop.set()
        poster.thread.join(30)
        acked = set(poster.acked)
        wait_until(lambda: acked <= set(table_values(location)), 180, "every acked line")
        second.send_signal(signal.SIGINT)  # Ctrl-C: graceful stop
        second.wait(180)
        assert second.returncode == 0, logs[1].read_text()[-3000:]
    finally:
        poster.stop.set()
        for p in procs:
            if p.poll() is None:
                kill_session(p)
    values = table_values(location)
    twice = {v: n for v, n in values.items() if n > 1}
    assert twice == {}, f"{len(twice)} values written more than once, e.g. {list(twice)[:5]}"
    assert acked <= set(values)
