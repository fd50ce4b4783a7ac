"""Processes seen from /proc: trees, RSS, open files, TCP peers; kill -9 by pid.

Everything here reads /proc of this machine only and never touches a process it
was not pointed at: callers filter by their own cluster (an executor's command line
names the cluster's directory; a block keeper's working directory is under it).
"""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Iterable


def _stat_fields(pid: int) -> list[str]:
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()


def parent_of(pid: int) -> int | None:
    """The parent pid (None when the process is gone)."""
    try:
        return int(_stat_fields(pid)[1])
    except (OSError, IndexError, ValueError):
        return None


def all_pids() -> list[int]:
    return [int(p) for p in os.listdir("/proc") if p.isdigit()]


def children_map() -> dict[int, list[int]]:
    """``{parent: [children]}`` of every process now."""
    out: dict[int, list[int]] = {}
    for pid in all_pids():
        ppid = parent_of(pid)
        if ppid is not None:
            out.setdefault(ppid, []).append(pid)
    return out


def descendants(pid: int, children: dict[int, list[int]] | None = None) -> list[int]:
    """Every process below ``pid`` (not itself)."""
    children = children_map() if children is None else children
    out, todo = [], list(children.get(pid, []))
    while todo:
        p = todo.pop()
        out.append(p)
        todo.extend(children.get(p, []))
    return out


def cmdline(pid: int) -> list[str]:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return [a.decode(errors="replace") for a in f.read().split(b"\0") if a]
    except OSError:
        return []


def cwd_of(pid: int) -> str:
    try:
        return os.readlink(f"/proc/{pid}/cwd")
    except OSError:
        return ""


def session_of(pid: int) -> int | None:
    try:
        return int(_stat_fields(pid)[3])
    except (OSError, IndexError, ValueError):
        return None


def session_pids(sid: int) -> list[int]:
    return [p for p in all_pids() if session_of(p) == sid]


def rss_bytes(pid: int) -> int:
    """Resident set size (0 when gone)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError):
        pass
    return 0


def open_fds(pid: int) -> int:
    try:
        return len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return 0


def _socket_inodes(pid: int) -> set[int]:
    inodes = set()
    with contextlib.suppress(OSError):
        for fd in os.listdir(f"/proc/{pid}/fd"):
            with contextlib.suppress(OSError):
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
                if target.startswith("socket:["):
                    inodes.add(int(target[8:-1]))
    return inodes


def established_to(port: int) -> dict[int, str]:
    """``{socket inode: remote}`` of the TCP connections ESTABLISHED to ``port`` (IPv4)."""
    out = {}
    with contextlib.suppress(OSError), open("/proc/net/tcp") as f:
        next(f)
        for line in f:
            parts = line.split()
            remote, state, inode = parts[2], parts[3], int(parts[9])
            if state == "01" and int(remote.split(":")[1], 16) == port:
                out[inode] = remote
    return out


def connected_to(pids: Iterable[int], port: int) -> list[int]:
    """Those of ``pids`` that hold an established TCP connection to ``port``."""
    wanted = set(established_to(port))
    return [p for p in pids if _socket_inodes(p) & wanted]


def kill9(pids: Iterable[int]) -> list[int]:
    """SIGKILL each pid; return those that existed."""
    killed = []
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
            killed.append(pid)
    return killed


def under(directory: str) -> list[int]:
    """Processes whose working directory is ``directory`` or below it."""
    root = os.path.realpath(directory)
    return [p for p in all_pids() if (cwd_of(p) + "/").startswith(root + "/")]
