"""What a run ran on: the machine (cores, memory, CPU, OS, Java, Python, PySpark, load), its
busy CPU, and the commit of the checkout with the paths that differ from it.

Read by ``bench/record.py`` for the header of every generated section.
"""

from __future__ import annotations

import os
import platform
import re
import subprocess
import time
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

__all__ = [
    "RECORD_OUTPUTS",
    "Machine",
    "busy_cpu_seconds",
    "core_speed",
    "git_state",
    "load_average",
]

RECORD_OUTPUTS = ("BENCHMARKS.md", "RELIABILITY.md", "README.md", "bench/results/", "docs/img/")
"""What the records themselves change: left out when asking whether the tree was dirty."""


def busy_cpu_seconds() -> float | None:
    """CPU seconds every core of the machine spent busy since boot (``/proc/stat``: all but
    idle and iowait); None where there is no ``/proc/stat``."""
    try:
        with open("/proc/stat") as f:
            fields = f.readline().split()[1:]
    except OSError:
        return None
    values = [float(x) for x in fields[:8]]  # user nice system idle iowait irq softirq steal
    return (sum(values) - values[3] - values[4]) / os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True)
class Machine:
    """What a run ran on; :meth:`detect` reads it from this host (load average: now)."""

    cores: int
    cpu_model: str
    memory_gb: float
    java_version: str
    pyspark_version: str
    python_version: str
    os: str
    load_average: tuple[float, float, float]
    core_speed: float | None = None  # M steps/s of core_speed()'s loop; None in older records

    @classmethod
    def detect(cls) -> Machine:
        return cls(
            cores=os.cpu_count() or 0,
            cpu_model=_cpu_model(),
            memory_gb=round(_memory_gb(), 1),
            java_version=_java_version(),
            pyspark_version=_pyspark_version(),
            python_version=platform.python_version(),
            os=_os_name(),
            load_average=load_average(),
            core_speed=core_speed(),
        )

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Machine:
        return cls(**{**d, "load_average": tuple(d["load_average"])})


SPEED_STEPS = 3_000_000


def core_speed(repeats: int = 3) -> float:
    """How fast one core of this host runs Python: M steps/s of a fixed loop, best of ``repeats``.

    Hosts of one kind (the same core count, memory and CPU name) differed by more than 2x
    here: the same fresh-clone test suite ran 20-23 min on some and 10 min on another
    (2026-11-29). This figure tells such hosts apart in a record. CPU time of this process
    (not wall time), so other work on the machine changes it less; the best of a few runs,
    so a descheduled one does not count. About 0.3 s of CPU on the host that measured 10 min.
    """
    best = float("inf")
    for _ in range(max(1, repeats)):
        start = time.process_time()
        total = 0
        for i in range(SPEED_STEPS):
            total += i
        best = min(best, time.process_time() - start)
    return round(SPEED_STEPS / max(best, 1e-9) / 1e6, 1)


def load_average() -> tuple[float, float, float]:
    one, five, fifteen = os.getloadavg()
    return round(one, 2), round(five, 2), round(fifteen, 2)


def _cpu_model() -> str:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return platform.processor() or "unknown"
    m = re.search(r"^model name\s*:\s*(.+)$", text, re.MULTILINE)
    return m.group(1).strip() if m else (platform.processor() or "unknown")


def _memory_gb() -> float:
    try:
        m = re.search(r"^MemTotal:\s*(\d+) kB", Path("/proc/meminfo").read_text(), re.MULTILINE)
    except OSError:
        return 0.0
    return int(m.group(1)) / 1024**2 if m else 0.0


def _java_version() -> str:
    try:
        out = subprocess.run(
            ["java", "-version"], capture_output=True, text=True, timeout=30, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"unknown ({e})"
    lines = (out.stderr or out.stdout).strip().splitlines()
    return lines[0].strip() if lines else "unknown"


def _pyspark_version() -> str:
    try:
        return metadata.version("pyspark")
    except metadata.PackageNotFoundError:
        return "not installed"


def _os_name() -> str:
    name = platform.system()
    try:
        text = Path("/etc/os-release").read_text()
        m = re.search(r'^PRETTY_NAME="?([^"\n]+)"?$', text, re.MULTILINE)
        if m:
            name = m.group(1)
    except OSError:
        pass  # not Linux, or a minimal image: the kernel name below is enough
    return f"{name}, kernel {platform.release()} ({platform.machine()})"


def git_state(root: Path) -> tuple[str, list[str]]:
    """``(commit, changed paths)`` of the checkout at ``root``.

    The changed paths are those ``git status`` lists (tracked and untracked, ignored files
    left out) except the records themselves (:data:`RECORD_OUTPUTS`): a run that follows
    another in ``make bench`` finds the first one's section and raw file uncommitted, and
    they do not change what is measured. ``("unknown", [])`` outside a git checkout.
    """

    def git(*args: str) -> str:
        return subprocess.run(
            ["git", "-C", str(root), *args], capture_output=True, text=True, check=True, timeout=60
        ).stdout

    try:
        commit = git("rev-parse", "--short=12", "HEAD").strip()
        status = git("status", "--porcelain=v1", "--untracked-files=all")
    except (OSError, subprocess.SubprocessError):
        return "unknown (not a git checkout)", []
    changed = []
    for line in status.splitlines():
        path = line[3:].split(" -> ")[-1].strip('"')
        if not path.startswith(RECORD_OUTPUTS):
            changed.append(path)
    return commit, changed
