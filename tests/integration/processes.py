"""Helpers of the crash tests: wait for a condition, kill -9 a whole process session."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Callable


def wait_until(predicate: Callable[[], object], timeout_s: float, what: str) -> None:
    """Poll ``predicate`` until it holds; fail naming ``what`` after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.1)
    raise AssertionError(f"timed out after {timeout_s}s waiting for {what}")


def session_pids(sid: int) -> list[int]:
    """Every process of session ``sid`` (from /proc)."""
    pids = []
    for entry in filter(str.isdigit, os.listdir("/proc")):
        with contextlib.suppress(OSError, IndexError, ValueError), open(f"/proc/{entry}/stat") as f:
            if int(f.read().rsplit(")", 1)[1].split()[3]) == sid:
                pids.append(int(entry))
    return pids


def kill_session(proc: subprocess.Popen) -> None:
    """kill -9 a process started with ``start_new_session`` and everything it started."""
    for pid in session_pids(proc.pid):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    proc.wait(30)
