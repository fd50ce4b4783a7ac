"""`spark-receivers ingest --checkpoint DIR --wal`: kill -9 it, start it again, lose nothing."""

from __future__ import annotations

import contextlib
import glob
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest

pytestmark = pytest.mark.spark


def session_pids(sid: int) -> list[int]:
    pids = []
    for entry in filter(str.isdigit, os.listdir("/proc")):
        with contextlib.suppress(OSError), open(f"/proc/{entry}/stat") as f:
            if int(f.read().rsplit(")", 1)[1].split()[3]) == sid:
                pids.append(int(entry))
    return pids


def kill_session(proc: subprocess.Popen) -> None:
    """kill -9 the command and everything it started (its JVM, Python workers)."""
    for pid in session_pids(proc.pid):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    proc.wait(30)


def output_lines(out: Path) -> set[str]:
    """Every value in the complete batch directories of the parquet sink."""
    values: set[str] = set()
    for d in glob.glob(str(out / "batch_time_ms=*")):
        if os.path.exists(os.path.join(d, "_SUCCESS")):
            for f in glob.glob(os.path.join(d, "*.parquet")):
                values.update(pq.read_table(f).column("value").to_pylist())
    return values


def wait_until(predicate, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.2)
    raise AssertionError(f"timed out after {timeout_s}s waiting for {what}")


@pytest.mark.timeout(420)
def test_ingest_with_checkpoint_and_wal_survives_kill_9(tmp_path):
    data, out, ckpt = tmp_path / "data", tmp_path / "out", tmp_path / "ckpt"
    data.mkdir()
    cmd = [sys.executable, "-m", "spark_receivers.cli", "ingest"]
    cmd += ["--source", f"file://{data}?pattern=*.log", "--sink", f"parquet:{out}"]
    cmd += ["--checkpoint", str(ckpt), "--wal", "--batch-interval", "1s"]
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
        assert done.wait(120), "the writer did not finish"
        wait_until(lambda: written <= output_lines(out), 180, "every line in the sink")
        second.send_signal(signal.SIGINT)  # Ctrl-C: graceful stop
        second.wait(120)
        logs[1].flush()
        assert second.returncode == 0, Path(logs[1].name).read_text()[-3000:]
        assert len(written) == 6000
    finally:
        for p in procs:
            if p.poll() is None:
                kill_session(p)
        for f in logs:
            f.close()
