"""Helpers of the crash tests: the chaos harness, waiting, kill -9 of a process session, ports."""

from __future__ import annotations

import contextlib
import importlib.util
import os
import random
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

CHAOS = Path(__file__).resolve().parents[2] / "scripts" / "chaos_local.py"


def port_for_a_later_server(host: str = "127.0.0.1") -> int:
    """A free port below the kernel's ephemeral range, for a server that binds it later.

    A port from ``bind(0)`` is an ephemeral one: while a test's server is still starting
    (a JVM, a Spark task: tens of seconds) or down between a kill -9 and its restart, the
    kernel may give that port to any outgoing connection on the machine (the other test
    worker's Spark opens hundreds), and the server cannot listen. Ports below the range
    are never handed out that way; one is picked at random and checked free.
    """
    with open("/proc/sys/net/ipv4/ip_local_port_range", encoding="ascii") as f:
        low = int(f.read().split()[0])
    rng = random.SystemRandom()
    for _ in range(200):
        port = rng.randrange(max(1024, low - 12_000), low)
        with socket.socket() as s, contextlib.suppress(OSError):
            s.bind((host, port))
            return port
    raise AssertionError(f"no free port below {low} on {host} after 200 tries")


def load_chaos_harness() -> ModuleType:
    """``scripts/chaos_local.py`` as module ``chaos_harness`` (AckingSource, ReliableTcpReceiver).

    It is registered with cloudpickle by value: executors cannot import it by name.
    """
    from pyspark import cloudpickle

    module = sys.modules.get("chaos_harness")
    if module is not None:
        return module
    spec = importlib.util.spec_from_file_location("chaos_harness", CHAOS)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["chaos_harness"] = module
    spec.loader.exec_module(module)
    cloudpickle.register_pickle_by_value(module)
    return module


def holds_within(predicate: Callable[[], object], timeout_s: float, poll_s: float = 0.2) -> bool:
    """Poll ``predicate`` until it holds or ``timeout_s`` passes; whether it held."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(poll_s)
    return bool(predicate())


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


def executor_pids(app_id: str) -> dict[str, int]:
    """The executor JVMs of application ``app_id``: ``{executor id: pid}`` (from /proc).

    Filtered by ``--app-id``: other applications on this machine (another test run, a
    colleague's) have executors with the same ids.
    """
    pids = {}
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                args = [a.decode(errors="replace") for a in f.read().split(b"\0") if a]
        except OSError:
            continue
        if (
            "--executor-id" in args
            and any("CoarseGrainedExecutorBackend" in a for a in args)
            and "--app-id" in args
            and args[args.index("--app-id") + 1] == app_id
        ):
            pids[args[args.index("--executor-id") + 1]] = int(entry)
    return pids
