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
from collections.abc import Callable, Mapping
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


def executor_pids(app_conf: Mapping[str, str]) -> dict[str, int]:
    """The executor JVMs of the application whose conf is ``app_conf``: ``{executor id: pid}``.

    ``app_conf``: the driver's conf (``dict(sc.getConf().getAll())``, or ``SparkSide.conf()``
    through Connect), for ``spark.app.id`` and ``spark.driver.port``. An executor (from
    /proc) is the application's when both its ``--app-id`` and the port of its
    ``--driver-url`` match: an id alone is not unique on this machine. A standalone Master
    names its applications ``app-<yyyyMMddHHmmss>-<n>``, so two Masters (the tests' cluster
    and a scenario's own, on the two test workers) whose first applications register in the
    same second give them the same id; on 2026-11-29 that had a Connect test look at the
    chaos test's executor 0 for the one it had killed (and a kill by id could hit another
    test's executor). The driver's port is the application's own while it runs.
    """
    app_id, port = app_conf["spark.app.id"], app_conf["spark.driver.port"]
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
            and _after(args, "--app-id") == app_id
            and _after(args, "--driver-url").rsplit(":", 1)[-1] == port
        ):
            pids[_after(args, "--executor-id")] = int(entry)
    return pids


def _after(args: list[str], flag: str) -> str:
    """The value that follows ``flag`` in ``args`` ('' when it is absent or last)."""
    i = args.index(flag) + 1 if flag in args else len(args)
    return args[i] if i < len(args) else ""
