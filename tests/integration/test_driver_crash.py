"""Driver crash: kill -9 the driver mid-batch, restart it with get_or_create, lose nothing.

The driver runs as a subprocess (``driver_crash_scenario.py``) with a checkpoint
dir, both WALs, a reliable receiver and an idempotent Parquet sink keyed by
batch time. The test kills its whole process tree while a batch is running,
restarts it, and checks: the re-run batch holds exactly the records it held
before the crash, every acknowledged record is in some batch's output, and a
record the source sent only once is in exactly one batch. With ``--state`` (the
local test) a count per key kept by ``update_state_by_key`` ends equal to the
count of the batches' records: the state of an uninterrupted run over them. The second driver is
stopped with SIGTERM (``stop_gracefully_on_shutdown``).
"""

from __future__ import annotations

import glob
import json
import os
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from processes import kill_session, load_chaos_harness, wait_until

pytestmark = pytest.mark.spark

SCENARIO = Path(__file__).with_name("driver_crash_scenario.py")


def manifests(out: str) -> dict[tuple[int, int], list[int]]:
    found = {}
    for path in glob.glob(os.path.join(out, "manifests", "*.json")):
        t, pid = Path(path).stem.split("-")
        with open(path) as f:
            found[(int(t), int(pid))] = json.load(f)
    return found


def batch_dirs(out: str, kind: str = "batch") -> dict[int, str]:
    """``<out>/<kind>=<time>`` directories Spark completed (with _SUCCESS), by time."""
    found = {}
    for path in glob.glob(os.path.join(out, f"{kind}=*")):
        if os.path.exists(os.path.join(path, "_SUCCESS")):
            found[int(path.rsplit("=", 1)[1])] = path
    return found


def outputs(out: str) -> dict[int, list[int]]:
    """The records of every batch's Parquet directory (complete ones: with _SUCCESS)."""
    result = {}
    for t, path in batch_dirs(out).items():
        files = sorted(glob.glob(os.path.join(path, "*.parquet")))
        result[t] = [int(v) for f in files for v in pq.read_table(f)["value"].to_pylist()]
    return result


@pytest.mark.timeout(480)
def test_driver_crash_mid_batch_recovers_the_same_batches_and_loses_nothing(tmp_path):
    crash_and_recover(tmp_path, ("--state",))


def crash_and_recover(tmp_path: Path, extra_args: tuple[str, ...] = ()) -> None:
    """The scenario of the module doc (``extra_args``: more arguments of the driver's)."""
    source = load_chaos_harness().AckingSource(rate=1000)
    ckpt, out = str(tmp_path / "ckpt"), str(tmp_path / "out")
    env = dict(os.environ, SPARK_LOCAL_IP="127.0.0.1", PYSPARK_PYTHON=sys.executable)
    cmd = [sys.executable, str(SCENARIO), "--checkpoint", ckpt, "--out", out]
    cmd += ["--port", str(source.port), *extra_args]
    logs = [open(tmp_path / f"driver{i}.log", "w+") for i in (1, 2)]  # noqa: SIM115
    procs: list[subprocess.Popen] = []

    def start(i: int) -> subprocess.Popen:
        slow = ["--slow-ms", "1500" if i == 0 else "0"]  # the first run is killed mid-batch
        p = subprocess.Popen(
            cmd + slow, stdout=logs[i], stderr=subprocess.STDOUT, env=env, start_new_session=True
        )
        procs.append(p)
        return p

    def log_text(i: int) -> str:
        logs[i].flush()
        return Path(logs[i].name).read_text()

    try:
        first = start(0)
        wait_until(lambda: len(manifests(out)) >= 2, 150, "two non-empty batches")
        seen = set(manifests(out))
        wait_until(lambda: set(manifests(out)) - seen, 60, "a batch in progress")
        (victim,) = sorted(set(manifests(out)) - seen)[-1:]
        kill_session(first)  # mid-batch: its manifest is written, it has not completed
        before = manifests(out)
        assert first.returncode == -signal.SIGKILL

        second = start(1)
        wait_until(lambda: "RECOVERED" in log_text(1), 150, "the recovered driver")
        rerun = json.loads(log_text(1).split("RECOVERED ", 1)[1].splitlines()[0])
        assert victim[0] in rerun, (victim, rerun)
        wait_until(
            lambda: any(t == victim[0] and pid == second.pid for t, pid in manifests(out)),
            120,
            f"the re-run of batch {victim[0]}",
        )
        after = manifests(out)
        # The re-run batch holds exactly the records it held before the crash.
        assert after[(victim[0], second.pid)] == before[victim]

        total = source.finish()
        assert source.wait_for(lambda: source.committed >= total, 90), "not everything acked"
        acked = source.committed

        def all_acked_in_manifests() -> bool:
            seen = {v for values in manifests(out).values() for v in values}
            return all(s in seen for s in range(acked))

        wait_until(all_acked_in_manifests, 120, "every acked record in a batch")
        second.send_signal(signal.SIGTERM)  # stop_gracefully_on_shutdown
        second.wait(90)
        assert second.returncode == 0, log_text(1)[-3000:]
        assert "STOPPED" in log_text(1)

        counts: Counter = Counter()
        for values in outputs(out).values():
            counts.update(values)
        lost = [s for s in range(acked) if counts[s] == 0]
        assert lost == []
        twice = [s for s, c in counts.items() if c > 1 and source.send_counts[s] <= 1]
        assert twice == [], f"records sent once but in two batches: {twice[:10]}"
        # Every batch output equals its last manifest (the sink is idempotent).
        final = outputs(out)
        last_manifest = {
            t: v
            for (t, _), v in sorted(manifests(out).items(), key=lambda x: x[0][1] == second.pid)
        }
        for t, values in final.items():
            assert sorted(values) == last_manifest.get(t, [])  # empty batches: no manifest
        if "--state" in extra_args:
            # The state after the last batch counts every record of every batch once: what
            # an uninterrupted run gives (a batch counted twice, or skipped, after the
            # restart from the saved state would not).
            states = batch_dirs(out, "state")
            assert max(states) == max(final)
            table = pq.read_table(states[max(states)])
            got = dict(zip(table["key"].to_pylist(), table["n"].to_pylist(), strict=True))
            want = Counter(str(v % 10) for values in final.values() for v in values)
            assert got == dict(want)
    finally:
        for p in procs:
            if p.poll() is None:
                kill_session(p)
        source.close()
        for f in logs:
            f.close()
