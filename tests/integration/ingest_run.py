"""``spark-receivers ingest`` as a child process: its log, its exit status, a stop by its PID.

The tests of real sources end to end (tests/integration/test_source_findings.py,
test_observability.py) run the command a user runs, on its own local Spark.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


class IngestRun:
    """One ``ingest`` child with its output in ``log`` (stdout and stderr together)."""

    def __init__(self, args: Sequence[str], log: Path, env: dict[str, str] | None = None) -> None:
        self.log = log
        self._out = open(log, "w")  # noqa: SIM115 - closed in stop()
        cmd = [sys.executable, "-m", "spark_receivers", "ingest", *args]
        child_env = {k: v for k, v in os.environ.items() if k != "SPARK_CONF_DIR"}
        child_env.update(env or {})
        self.proc = subprocess.Popen(
            cmd,
            stdout=self._out,
            stderr=subprocess.STDOUT,
            cwd=ROOT,
            env=child_env,
            start_new_session=True,
        )

    def text(self) -> str:
        """What the command printed so far."""
        return self.log.read_text(errors="replace")

    def wait_for(self, predicate: Callable[[str], object], timeout_s: float, what: str) -> str:
        """Poll the output until ``predicate(text)`` holds; fail naming ``what`` (and the log)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            text = self.text()
            if predicate(text):
                return text
            if self.proc.poll() is not None:
                break
            time.sleep(0.2)
        text = self.text()
        if predicate(text):
            return text
        raise AssertionError(f"waiting for {what}; ingest said:\n{text[-4000:]}")

    def wait(self, timeout_s: float) -> int:
        """The exit status, once it ends (fails after ``timeout_s``, stopping it)."""
        try:
            return self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.stop()
            raise AssertionError(
                f"ingest did not end within {timeout_s}s; it said:\n{self.text()[-4000:]}"
            ) from None

    def interrupt(self) -> None:
        """Ctrl-C (a graceful stop)."""
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGINT)

    def stop(self) -> None:
        """Stop it and every process of its session (its JVM, Python workers), by their PIDs."""
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(30)
        else:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)  # children it left behind
        self._out.close()

    def last_line(self) -> str:
        """The last non-empty line it printed."""
        lines = [line for line in self.text().splitlines() if line.strip()]
        return lines[-1] if lines else ""
