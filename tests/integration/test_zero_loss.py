"""Zero data loss on real processes: kill -9 a reliable receiver's Python worker mid-stream.

Runs ``scripts/chaos_local.py`` (its own driver process and local Spark, both WALs on)
with a few kills (``make chaos`` is the cluster chaos of scripts/chaos.py). Every record
the source had acknowledged must be in some batch's output; only records the source had to
send again (because they were never acknowledged) may appear twice.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.spark

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "chaos_local.py"


def test_every_acked_record_survives_receiver_kills():
    env = dict(os.environ, SPARK_LOCAL_IP="127.0.0.1", PYSPARK_PYTHON=sys.executable)
    args = ["--kills", "3", "--max-gap-s", "1.0", "--drain-s", "60", "--seed", "7", "--json"]
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), *args],
        capture_output=True,
        text=True,
        timeout=280,
        env=env,
        start_new_session=True,
    )
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    assert lines, (
        f"no summary (exit {proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}"
    )
    out = json.loads(lines[-1])
    assert "error" not in out, out
    assert out["kills"] == 3
    assert out["acked"] > 0 and out["all_acked"], out
    assert out["lost"] == 0, out
    assert out["bad_duplicates"] == 0, out
    assert out["never_sent_delivered"] == 0, out
    assert out["connections"] >= 4  # the receiver came back after every kill
    assert proc.returncode == 0, proc.stderr[-3000:]
