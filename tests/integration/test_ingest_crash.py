"""`spark-receivers ingest --checkpoint DIR --wal`: kill -9 it, start it again, lose nothing."""

from __future__ import annotations

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
from processes import kill_session, wait_until

pytestmark = pytest.mark.spark


def output_lines(out: Path) -> set[str]:
    """Every value in the complete batch directories of the parquet sink."""
    values: set[str] = set()
    for d in glob.glob(str(out / "batch_time_ms=*")):
        if os.path.exists(os.path.join(d, "_SUCCESS")):
            for f in glob.glob(os.path.join(d, "*.parquet")):
                values.update(pq.read_table(f).column("value").to_pylist())
    return values


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

        def log2() -> str:
            logs[1].flush()
            return Path(logs[1].name).read_text()

        wait_until(lambda: "ingesting" in log2(), 180, "the restarted ingest")
        assert "recovering from the checkpoint" in log2()
        assert done.wait(120), "the writer did not finish"
        wait_until(lambda: written <= output_lines(out), 180, "every line in the sink")
        second.send_signal(signal.SIGINT)  # Ctrl-C: graceful stop
        second.wait(120)
        assert second.returncode == 0, log2()[-3000:]
        assert len(written) == 6000
    finally:
        for p in procs:
            if p.poll() is None:
                kill_session(p)
        for f in logs:
            f.close()
