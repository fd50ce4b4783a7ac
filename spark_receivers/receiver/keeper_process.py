"""Finding, or starting, the block keeper of this executor (one per executor and context).

A supervisor (or the driver's keeper task on an executor without receivers) calls
:func:`ensure_local_keeper`. Keepers are found through a small file per executor
JVM and context secret under a private directory (``<tmp>/spark-receivers-keepers-
<uid>``, mode 0700), written under an exclusive ``flock`` so that two tasks on the
same executor never start two keepers. The file holds the keeper's address and
pid, never the secret: the keeper gets its settings on its stdin.

The keeper is started detached (a session of its own, so a task's process group
being killed does not take it along) with this worker's ``sys.path`` (so a package
shipped with ``--py-files`` imports there too) and watches the executor's JVM: it
ends when the executor does. Its log goes next to its file (``<key>.log``). The files
of keepers whose keeper and executor are both gone are deleted when the next keeper is
looked for (a log that is not empty is kept: it says why a keeper ended).
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import hashlib
import json
import logging
import os
import select
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from spark_receivers.errors import BlockStoreError
from spark_receivers.receiver.block_keeper import KeeperSettings, process_alive, process_start
from spark_receivers.rpc.hosts import executor_jvm

log = logging.getLogger(__name__)

__all__ = ["KeeperHandle", "ensure_local_keeper", "executor_jvm_pid", "keeper_dir"]

START_TIMEOUT_S = 30.0
"""How long a starting keeper may take to say its address."""

_LAUNCH = (
    "import os, sys\n"
    "if os.fork():\n"
    "    os._exit(0)\n"
    "os.execv(sys.executable, [sys.executable, '-m', 'spark_receivers.receiver.block_keeper'])\n"
)
"""Started by the spawner, exits at once: the keeper is its child, then nobody's (no zombie)."""


@dataclass(frozen=True)
class KeeperHandle:
    """A running keeper: where it serves, its pid, the process it watches."""

    address: str
    pid: int
    watch_pid: int
    spool_dir: str = ""
    """Where a receiver of this host writes blocks for ``AdoptBlock`` ('': no spool)."""


def keeper_dir() -> Path:
    """The private directory of keeper files of this user."""
    path = Path(tempfile.gettempdir()) / f"spark-receivers-keepers-{os.getuid()}"
    path.mkdir(mode=0o700, exist_ok=True)
    return path


def executor_jvm_pid() -> int:
    """The pid of the JVM this Python worker serves (this process when there is none).

    The walk up ``/proc`` is :func:`spark_receivers.rpc.hosts.executor_jvm`'s.
    """
    jvm = executor_jvm()
    return jvm.pid if jvm is not None else os.getpid()


def ensure_local_keeper(
    settings: KeeperSettings, *, restart: bool = False, watch_pid: int | None = None
) -> KeeperHandle:
    """The keeper of this executor and context (``settings.secret``), started if none runs.

    ``settings`` say how to start one (its watched process is filled in: the
    executor's JVM, or ``watch_pid``). ``restart`` starts a new one even when a
    keeper is on file (the caller found it not answering; the old process, if
    alive, is killed). Raises :class:`BlockStoreError` when a keeper cannot be
    started.
    """
    watch = watch_pid or executor_jvm_pid()
    key = f"{watch}-{hashlib.sha256(settings.secret.encode()).hexdigest()[:16]}"
    base = keeper_dir()
    _prune(base, key)
    with _locked(base / f"{key}.lock"):
        known = _read_handle(base / f"{key}.json")
        if known is not None and process_alive(known.pid):
            if not restart:
                return known
            with contextlib.suppress(OSError):
                os.kill(known.pid, 9)
        settings = dataclasses.replace(
            settings,
            watch_pid=watch,
            watch_start=process_start(watch),
            spill_dir=settings.spill_dir or _local_dir(),
        )
        handle = _start(settings, base / f"{key}.log")
        (base / f"{key}.json").write_text(json.dumps(asdict(handle)))
        return handle


def _prune(base: Path, keep: str) -> None:
    """Delete the files of keepers whose keeper and watched process both ended."""
    for found in base.glob("*.json"):
        key = found.stem
        if key == keep:
            continue
        handle = _read_handle(found)
        if handle is None or process_alive(handle.pid) or process_alive(handle.watch_pid):
            continue
        for path in (found, base / f"{key}.lock", base / f"{key}.log"):
            with contextlib.suppress(OSError):
                if path.suffix != ".log" or path.stat().st_size == 0:
                    path.unlink()


def _local_dir() -> str | None:
    """The executor's first local directory (Spark sets ``SPARK_LOCAL_DIRS``), if any."""
    dirs = os.environ.get("SPARK_LOCAL_DIRS", "")
    first = dirs.split(",")[0].strip()
    return first if first and os.path.isdir(first) else None


def _read_handle(path: Path) -> KeeperHandle | None:
    try:
        return KeeperHandle(**json.loads(path.read_text()))
    except (OSError, ValueError, TypeError):
        return None


@contextlib.contextmanager
def _locked(path: Path):  # type: ignore[no-untyped-def]
    fd = os.open(path, os.O_CREAT | os.O_RDWR, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing releases the lock


def _start(settings: KeeperSettings, log_path: Path) -> KeeperHandle:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
    with open(log_path, "ab") as log_file:
        launcher = subprocess.Popen(
            [sys.executable, "-c", _LAUNCH],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=log_file,
            env=env,
            start_new_session=True,
            close_fds=True,
        )
    assert launcher.stdin is not None and launcher.stdout is not None
    stdout = launcher.stdout
    launcher.stdin.write(json.dumps(asdict(settings)).encode())
    launcher.stdin.close()
    launcher.wait(START_TIMEOUT_S)
    deadline = time.monotonic() + START_TIMEOUT_S
    line = b""
    while not line.endswith(b"\n"):
        left = deadline - time.monotonic()
        ready, _, _ = select.select([stdout], [], [], max(0.0, left))
        chunk = os.read(stdout.fileno(), 4096) if ready else b""
        if not chunk:
            stdout.close()
            msg = (
                f"the block keeper did not start within {START_TIMEOUT_S:.0f}s "
                f"(it ended, or is still starting); its log: {log_path}"
            )
            raise BlockStoreError(msg)
        line += chunk
    stdout.close()
    started = json.loads(line.decode())
    log.info("started the block keeper at %s (pid %d)", started["address"], started["pid"])
    return KeeperHandle(
        started["address"],
        int(started["pid"]),
        settings.watch_pid,
        str(started.get("spool_dir") or ""),
    )
