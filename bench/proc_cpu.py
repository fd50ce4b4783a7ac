"""CPU-seconds per process of a process tree, by kind, from ``/proc`` (Linux only).

:class:`TreeSampler` walks the descendants of one root process every ``period_s`` and keeps
each process's user + system CPU (:func:`bench.harness.stat_cpu_seconds`), and each JVM
thread's (the JDK names a Java thread's native thread after it, cut to 15 characters).
:meth:`TreeSampler.window` gives the CPU each process used between two moments, grouped by
:func:`classify`: the benchmark child's own Python (the driver), the JVM, the block keeper,
the receiver's task (the Python worker holding the TCP connection to the load generator),
the data source's planning workers and the other Python task workers.

Block keepers are started detached (their parent is init), so they are found by their
files instead (:func:`keepers_of`). A process that starts and ends between two samples is
not seen, and one that ends loses what it used since its last sample; PySpark reuses its
workers, so at a period of 0.25 s that is little (the section prints the tree's total next
to the machine's busy cores).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import threading
import time
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from bench.harness import stat_cpu_seconds

__all__ = [
    "KINDS",
    "ProcessInfo",
    "TreeSampler",
    "WindowCpu",
    "classify",
    "descendants",
    "keepers_of",
    "sockets_to_port",
    "thread_group",
    "tree_cpu_seconds",
]

DRIVER = "driver Python"
JVM = "JVM"
KEEPER = "block keeper"
RECEIVER = "receiver task (Python worker)"
PLANNER = "data source plan workers"
TASK_WORKERS = "other Python task workers"
DAEMONS = "PySpark daemons"
OTHER = "other"
KINDS = (DRIVER, JVM, RECEIVER, KEEPER, TASK_WORKERS, PLANNER, DAEMONS, OTHER)
"""Every kind :func:`classify` gives, in the order the section prints them."""


@dataclass(frozen=True)
class ProcessInfo:
    """What :func:`classify` needs of a process: its id, parent, name and command line."""

    pid: int
    ppid: int
    comm: str
    cmdline: tuple[str, ...]


def classify(
    proc: ProcessInfo, root: int, procs: Mapping[int, ProcessInfo], receivers: Iterable[int] = ()
) -> str:
    """The kind of ``proc`` in the tree under ``root`` (see :data:`KINDS`).

    ``receivers``: the pids found holding the load generator's connection. A PySpark worker
    is forked by a daemon (``python -m pyspark.daemon [worker module]``) and keeps its
    command line, so a worker of the planning daemon
    (``pyspark.sql.worker.plan_data_source_read`` and friends) says so.
    """
    if proc.pid == root:
        return DRIVER
    if proc.comm == "java":
        return JVM
    line = " ".join(proc.cmdline)
    if "spark_receivers.receiver.block_keeper" in line and "-c" not in proc.cmdline:
        return KEEPER  # (its launcher, ``python -c ...``, exits at once)
    if proc.pid in set(receivers):
        return RECEIVER
    if "pyspark.sql.worker" in line:
        return PLANNER
    if "pyspark.daemon" in line or "pyspark.worker" in line:
        parent = procs.get(proc.ppid)
        if parent is not None and parent.comm == "java":
            return DAEMONS  # the daemon itself (a worker's parent is its daemon)
        return TASK_WORKERS
    return OTHER


_DIGITS = re.compile(r"[#\-_ ]?\d+$")


def thread_group(comm: str) -> str:
    """A JVM thread's group: its name without a trailing number (``GC Thread#3``: ``GC Thread``)."""
    name = comm.strip()
    while True:
        cut = _DIGITS.sub("", name)
        if cut == name:
            return name or "?"
        name = cut


def _read_info(pid: int) -> ProcessInfo | None:
    try:
        with open(f"/proc/{pid}/stat") as f:
            head, _, rest = f.read().rpartition(")")
        comm = head.split("(", 1)[1]
        ppid = int(rest.split()[1])
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            args = tuple(a.decode(errors="replace") for a in f.read().split(b"\0") if a)
    except (OSError, IndexError, ValueError):
        return None
    return ProcessInfo(pid, ppid, comm, args)


def descendants(root: int) -> dict[int, ProcessInfo]:
    """``root`` and every process below it, by pid (a scan of ``/proc``)."""
    infos: dict[int, ProcessInfo] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            info = _read_info(int(entry))
            if info is not None:
                infos[info.pid] = info
    children: dict[int, list[int]] = defaultdict(list)
    for info in infos.values():
        children[info.ppid].append(info.pid)
    out: dict[int, ProcessInfo] = {}
    stack = [root]
    while stack:
        pid = stack.pop()
        if pid in infos and pid not in out:
            out[pid] = infos[pid]
            stack.extend(children.get(pid, ()))
    return out


def tree_cpu_seconds(root: int) -> float:
    """User + system CPU seconds of ``root`` and every process below it now (gone ones not)."""
    total = 0.0
    for pid in descendants(root):
        with contextlib.suppress(OSError):  # ended since the scan
            total += stat_cpu_seconds(f"/proc/{pid}/stat")
    return total


def keepers_of(jvms: Iterable[int]) -> list[int]:
    """The block keepers watching these JVMs (started detached, so outside their tree).

    Found by their files in :func:`spark_receivers.receiver.keeper_process.keeper_dir`,
    named ``<watched pid>-<hash>.json`` and holding the keeper's pid.
    """
    from spark_receivers.receiver.keeper_process import keeper_dir

    found = []
    for jvm in jvms:
        for path in keeper_dir().glob(f"{jvm}-*.json"):
            with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
                found.append(int(json.loads(path.read_text())["pid"]))
    return found


def _socket_inodes(port: int) -> set[str]:
    """Inodes of the TCP sockets connected to ``port`` on the remote side (IPv4 and IPv6)."""
    found: set[str] = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as f:
                rows = f.read().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            cols = row.split()
            if len(cols) > 9 and int(cols[2].rsplit(":", 1)[1], 16) == port:
                found.add(cols[9])
    return found


def sockets_to_port(pids: Iterable[int], port: int) -> list[int]:
    """The pids among ``pids`` holding a TCP connection to remote ``port``."""
    inodes = _socket_inodes(port)
    if not inodes:
        return []
    holders = []
    for pid in pids:
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue
        for fd in fds:
            try:
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if target.startswith("socket:[") and target[8:-1] in inodes:
                holders.append(pid)
                break
    return holders


@dataclass
class WindowCpu:
    """CPU-seconds used within a window: per kind, per process, per JVM thread group."""

    seconds: float
    by_kind: dict[str, float] = field(default_factory=dict)
    by_pid: dict[int, tuple[str, float]] = field(default_factory=dict)
    jvm_threads: dict[str, float] = field(default_factory=dict)

    @property
    def total(self) -> float:
        return sum(self.by_kind.values())


class TreeSampler:
    """Samples the CPU of ``root``'s process tree every ``period_s`` on a thread of its own.

    ``port``: the load generator's port; the task worker holding a connection to it is the
    receiver's (looked for until found). Use as a context manager; :meth:`mark` records a
    moment (a sample taken then) and :meth:`window` the CPU between two marks.
    """

    def __init__(self, root: int, port: int | None = None, period_s: float = 0.25) -> None:
        self.root = root
        self.port = port
        self._period_s = period_s
        self._lock = threading.Lock()
        self._infos: dict[int, ProcessInfo] = {}
        self._receivers: list[int] = []
        self._connected_at: float | None = None
        # Per pid, and per (jvm pid, tid): the samples (time, cpu seconds), in order.
        self._cpu: dict[int, list[tuple[float, float]]] = defaultdict(list)
        self._threads: dict[tuple[int, int], list[tuple[float, float]]] = defaultdict(list)
        self._thread_names: dict[tuple[int, int], str] = {}
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._sampled_at = -1.0
        self._thread = threading.Thread(target=self._run, name="tree-sampler", daemon=True)

    def __enter__(self) -> TreeSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._wake.set()
        self._thread.join(10)

    @property
    def connected_at(self) -> float | None:
        """When a process of the tree was first seen connected to ``port`` (monotonic)."""
        return self._connected_at

    @property
    def receivers(self) -> list[int]:
        """The pids seen holding the connection to ``port``."""
        with self._lock:
            return list(self._receivers)

    def pids_of(self, kind: str) -> list[int]:
        """The pids of one kind seen so far."""
        with self._lock:
            infos, receivers = dict(self._infos), list(self._receivers)
        return [p for p, i in infos.items() if classify(i, self.root, infos, receivers) == kind]

    def info(self, pid: int) -> ProcessInfo | None:
        """What was read of process ``pid`` (None if never seen)."""
        with self._lock:
            return self._infos.get(pid)

    def wait_connected(self, timeout_s: float) -> float | None:
        """Wait until the tree connects to ``port``; when it did (monotonic), or None."""
        deadline = time.monotonic() + timeout_s
        while self._connected_at is None and time.monotonic() < deadline:
            if self._stop.is_set() or not os.path.exists(f"/proc/{self.root}"):
                return None
            self._wake.wait(self._period_s)
            self._wake.clear()
        return self._connected_at

    def _sample(self) -> float:
        """Read the tree's CPU now; returns the time the samples are stamped with."""
        now = time.monotonic()
        tree = descendants(self.root)
        jvms = [p for p, i in tree.items() if i.comm == "java"]
        for keeper in keepers_of(jvms):
            tree.update(descendants(keeper))
        with self._lock:
            self._infos.update(tree)
        if self.port is not None and (self._connected_at is None or not self._receivers):
            holders = sockets_to_port(tree, self.port)
            if holders:
                with self._lock:
                    if self._connected_at is None:
                        self._connected_at = now
                    workers = [p for p in holders if tree[p].comm != "java" and p != self.root]
                    self._receivers = workers
        for pid, info in tree.items():
            try:
                cpu = stat_cpu_seconds(f"/proc/{pid}/stat")
            except (OSError, IndexError, ValueError):
                continue
            self._cpu[pid].append((now, cpu))
            if info.comm == "java":
                self._sample_threads(pid, now)
        return now

    def _sample_threads(self, pid: int, now: float) -> None:
        try:
            tids = os.listdir(f"/proc/{pid}/task")
        except OSError:
            return
        for tid in tids:
            key = (pid, int(tid))
            try:
                cpu = stat_cpu_seconds(f"/proc/{pid}/task/{tid}/stat")
                if key not in self._thread_names:
                    with open(f"/proc/{pid}/task/{tid}/comm") as f:
                        self._thread_names[key] = f.read().strip()
            except (OSError, IndexError, ValueError):
                continue
            self._threads[key].append((now, cpu))

    def _run(self) -> None:
        while not self._stop.is_set():
            self._sampled_at = self._sample()
            self._wake.set()
            self._stop.wait(self._period_s)

    def mark(self, timeout_s: float = 60.0) -> float:
        """The time of the first sample begun at or after this call (waits for it).

        A window between two marks then has a sample at each end, however late the
        sampler's thread runs on a busy machine. Raises ``TimeoutError`` after
        ``timeout_s`` without one (the sampler stopped).
        """
        called = time.monotonic()
        deadline = called + timeout_s
        while self._sampled_at < called:
            if self._stop.is_set() or time.monotonic() > deadline:
                msg = f"the sampler took no sample in {timeout_s:g}s"
                raise TimeoutError(msg)
            self._wake.clear()
            if self._sampled_at < called:
                self._wake.wait(self._period_s * 2 + 1)
        return self._sampled_at

    def window(self, start_s: float, end_s: float) -> WindowCpu:
        """CPU-seconds per kind, process and JVM thread group used in ``[start_s, end_s]``."""
        with self._lock:
            infos, receivers = dict(self._infos), list(self._receivers)
        out = WindowCpu(end_s - start_s)
        for pid, samples in list(self._cpu.items()):
            used = _used(samples, start_s, end_s)
            if pid not in infos or used <= 0:
                continue
            kind = classify(infos[pid], self.root, infos, receivers)
            out.by_kind[kind] = out.by_kind.get(kind, 0.0) + used
            out.by_pid[pid] = (kind, used)
        for key, samples in list(self._threads.items()):
            used = _used(samples, start_s, end_s)
            if used > 0:
                group = thread_group(self._thread_names.get(key, "?"))
                out.jvm_threads[group] = out.jvm_threads.get(group, 0.0) + used
        return out


def _used(samples: list[tuple[float, float]], start_s: float, end_s: float) -> float:
    """CPU used between ``start_s`` and ``end_s`` from ``(time, cumulative cpu)`` samples.

    A process first seen after ``start_s`` counts from zero (it was born in the window); one
    last seen before ``end_s`` counts up to its last sample (it ended).
    """
    before = [c for t, c in samples if t <= start_s]
    inside = [c for t, c in samples if t <= end_s]
    if not inside:
        return 0.0
    return inside[-1] - (before[-1] if before else 0.0)
