"""A short chaos in `make test`: the faults no other test makes, on a real cluster, under load.

Runs ``scripts/chaos.py`` in a process of its own (it starts its own Master, Workers and
redis-server, and stops them by PID): kill -9 of the receiver's worker and of an executor
JVM, the receiver cut off from the driver, and ENOSPC then EIO on its WAL's fsync, all in
one `ingest` run that must lose nothing acknowledged. No driver kill here: a kill -9 of the
driver and the restart from the checkpoint are what test_driver_crash.py,
test_ingest_crash.py, test_broker_ingest_crash.py and test_exactly_once.py do, and the
restart took 84 s of a quiet run with the old arguments, while the test took 222-227 s in
the suite (2026-11-29). ``make chaos`` runs every kind, the
driver's included, more times, at 20,000 records/s for 10 minutes; ``CHAOS_ARGS=--quick``
runs each kind once.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.spark

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "chaos.py"


@pytest.mark.timeout(1200)
def test_short_chaos_loses_nothing_acknowledged():
    args = ["--duration", "30", "--rate", "2000", "--workers", "1", "--executors", "1"]
    args += ["--drivers", "0", "--partitions", "1", "--partition-s", "8"]
    args += ["--disk-faults", "1", "--disk-fault-s", "5", "--seed", "23", "--json"]
    env = dict(os.environ, SPARK_LOCAL_IP="127.0.0.1", PYSPARK_PYTHON=sys.executable)
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), *args],
        capture_output=True,
        text=True,
        timeout=1150,
        env=env,
        start_new_session=True,
    )
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    assert lines, f"no summary ({proc.returncode}):\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}"
    out = json.loads(lines[-1])
    print("\n".join(line for line in proc.stdout.splitlines() if line.startswith(("|", " "))))
    done = out["faults_done"]
    assert done == {
        "worker": 1, "executor": 1, "driver": 0, "partition": 1, "enospc": 1, "eio": 1
    }, out["faults"]  # fmt: skip
    assert out["sent"] > 0 and out["acked"] == out["sent"], out
    assert out["lost"] == 0 and out["unacked_end"] == 0, out
    assert out["duplicated_unexplained"] == 0, out
    assert all(f["acks_while_on"] == 0 for f in out["faults"] if f["kind"] == "partition"), out
    assert all(f["error_reported"] for f in out["faults"] if f["kind"] in ("enospc", "eio")), out
    assert out["driver_exit"] == 0 and not out["unplanned_driver_exits"], out
    assert out["ok"] and proc.returncode == 0, out
