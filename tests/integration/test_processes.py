"""The crash tests' helpers that find processes: they must find the test's own, only."""

from __future__ import annotations

import subprocess
import sys

from processes import executor_pids


def fake_executor(app_id: str, port: int, executor_id: str) -> subprocess.Popen:
    """A process whose command line is an executor's (Python ignores the extra arguments)."""
    args = ["org.apache.spark.executor.CoarseGrainedExecutorBackend"]
    args += ["--driver-url", f"spark://CoarseGrainedScheduler@127.0.0.1:{port}"]
    args += ["--executor-id", executor_id, "--hostname", "127.0.0.1", "--app-id", app_id]
    code = "import sys; sys.stdin.read()"  # until the test closes its stdin
    return subprocess.Popen([sys.executable, "-c", code, *args], stdin=subprocess.PIPE)


def test_executors_of_two_applications_with_the_same_id_are_told_apart_by_driver_port():
    """Two standalone Masters name their first applications alike when they register in the
    same second (2026-11-29: the chaos test's and the tests' cluster's, app-...-0000)."""
    same = "app-20261129081139-0000"
    ours = [fake_executor(same, 40001, "0"), fake_executor(same, 40001, "1")]
    theirs = [fake_executor(same, 40002, "0"), fake_executor("app-other", 40001, "2")]
    try:
        found = executor_pids({"spark.app.id": same, "spark.driver.port": "40001"})
        assert found == {"0": ours[0].pid, "1": ours[1].pid}
        found = executor_pids({"spark.app.id": same, "spark.driver.port": "40002"})
        assert found == {"0": theirs[0].pid}
    finally:
        for p in ours + theirs:
            p.stdin.close()  # type: ignore[union-attr]
            p.wait(30)
