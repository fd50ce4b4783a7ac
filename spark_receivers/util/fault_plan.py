"""A testing aid: faults a chaos run switches on for a while, read from a fault-plan file.

Off by default. With ``spark.receivers.testing.faultPlan=/path/plan.json`` (the
config field ``fault_plan``; executors get it with the receiver's task config),
each receiver's task reads that file (again whenever it changes) and, while a
fault it lists is on, fails on purpose:

* ``partition``: the receiver is cut off from the driver. Its calls to the
  driver (``RegisterReceiver``, ``AddBlock``, ``GetReplicaTargets``, ...) and the
  driver's calls to its block server (``StopReceiver``, ``CleanupOldBlocks``, ...)
  fail with :class:`~spark_receivers.errors.RpcError` at once (``"mode": "fail"``,
  a refused connection) or after hanging until the fault ends or the call's
  timeout passes (``"mode": "hang"``, dropped packets). Nothing is sent: a cut
  ``AddBlock`` never reaches the driver. The executor's block keeper stays
  reachable.
* ``wal_disk``: the receiver write-ahead log's ``fdatasync`` (after each record,
  and of the directory when a segment is created) raises ``OSError`` with
  ``ENOSPC`` or ``EIO``. The log cuts the frame it just wrote and retries on a
  new segment, as after a failed ``write``; the block is not stored, so there
  is no ``AddBlock`` and no acknowledgement.

The file is JSON, written whole and renamed into place by the harness
(:meth:`FaultPlan.write`)::

    {"faults": [
      {"kind": "partition", "stream": 0, "from_ms": 1767225600000,
       "until_ms": 1767225630000, "mode": "hang"},
      {"kind": "wal_disk", "stream": 0, "from_ms": 1767225700000,
       "until_ms": 1767225720000, "errno": "ENOSPC"}
    ]}

Times are wall-clock epoch milliseconds (every process of a one-machine cluster
shares the clock; on several hosts, synchronise them); ``stream`` may be left
out (every stream). A missing file means no fault; a file that cannot be read or
parsed raises :class:`~spark_receivers.errors.ConfigError` from the hook, naming
it. The hooks are one-line call sites: :func:`cut_client` (the supervisor's
client of the driver), :func:`cut_check` (its block server), and
:func:`wal_fsync_hook` (its WAL); each returns the plain object, or None, when no
plan is configured.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import threading
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

from spark_receivers.errors import ConfigError, RpcError
from spark_receivers.util.clock import Clock, SystemClock

if TYPE_CHECKING:
    from spark_receivers.config import StreamingConfig

__all__ = [
    "FAULT_PLAN_KEY",
    "FaultPlan",
    "PlannedFault",
    "cut_check",
    "cut_client",
    "wal_fsync_hook",
]

log = logging.getLogger(__name__)

FAULT_PLAN_KEY = "spark.receivers.testing.faultPlan"
KINDS = ("partition", "wal_disk")
MODES = ("fail", "hang")
ERRNOS = {"ENOSPC": errno.ENOSPC, "EIO": errno.EIO}


@dataclass(frozen=True)
class PlannedFault:
    """One fault of a plan: ``kind`` is on for ``stream`` (None: all) in ``[from_ms, until_ms)``."""

    kind: str
    from_ms: int
    until_ms: int
    stream: int | None = None
    mode: str = "fail"
    """``partition``: ``fail`` at once or ``hang`` until the fault ends (or the call's timeout)."""
    errno: str = "EIO"
    """``wal_disk``: ``ENOSPC`` or ``EIO``."""

    def __post_init__(self) -> None:
        problems = []
        if self.kind not in KINDS:
            problems.append(f"kind must be one of {', '.join(KINDS)}, got {self.kind!r}")
        for name in ("from_ms", "until_ms"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                problems.append(f"{name} must be an integer >= 0 (epoch ms), got {value!r}")
        if not problems and self.until_ms <= self.from_ms:
            problems.append(f"until_ms ({self.until_ms}) must be after from_ms ({self.from_ms})")
        if self.stream is not None and (
            isinstance(self.stream, bool) or not isinstance(self.stream, int)
        ):
            problems.append(f"stream must be an integer or absent, got {self.stream!r}")
        if self.mode not in MODES:
            problems.append(f"mode must be one of {', '.join(MODES)}, got {self.mode!r}")
        if self.errno not in ERRNOS:
            problems.append(f"errno must be one of {', '.join(ERRNOS)}, got {self.errno!r}")
        if problems:
            msg = f"bad fault {asdict(self)}: {'; '.join(problems)}"
            raise ConfigError(msg)

    def covers(self, kind: str, stream_id: int, now_ms: int) -> bool:
        """Whether this fault is on for ``kind`` and ``stream_id`` at ``now_ms``."""
        return (
            self.kind == kind
            and self.stream in (None, stream_id)
            and self.from_ms <= now_ms < self.until_ms
        )


class FaultPlan:
    """The faults listed in a plan file, read again whenever the file changes.

    Thread-safe; :meth:`active` costs one ``stat`` when the file did not change.
    """

    def __init__(self, path: str, clock: Clock | None = None) -> None:
        self.path = path
        self.clock: Clock = clock or SystemClock()
        self._lock = threading.Lock()
        self._seen: tuple[int, int] | None = None
        self._faults: tuple[PlannedFault, ...] = ()

    def faults(self) -> tuple[PlannedFault, ...]:
        """Every fault the file lists now (none when it does not exist)."""
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            return ()
        except OSError as e:
            msg = f"{FAULT_PLAN_KEY}: cannot stat {self.path}: {e}"
            raise ConfigError(msg) from e
        key = (st.st_mtime_ns, st.st_size)
        with self._lock:
            if key == self._seen:
                return self._faults
        faults = self.load(self.path)
        with self._lock:
            self._seen, self._faults = key, faults
        return faults

    def active(self, kind: str, stream_id: int) -> PlannedFault | None:
        """The fault of ``kind`` on for ``stream_id`` now, if any."""
        now = self.clock.get_time_ms()
        for fault in self.faults():
            if fault.covers(kind, stream_id, now):
                return fault
        return None

    def hold(self, fault: PlannedFault, timeout_s: float | None) -> None:
        """Wait (a ``hang`` partition) until ``fault`` ends or ``timeout_s`` passes."""
        until = fault.until_ms
        if timeout_s is not None:
            until = min(until, self.clock.get_time_ms() + round(timeout_s * 1000))
        self.clock.wait_till_time(until)

    @staticmethod
    def load(path: str) -> tuple[PlannedFault, ...]:
        """Parse a plan file; :class:`ConfigError` naming it when it is not a valid plan."""
        try:
            with open(path, encoding="utf-8") as f:
                data = json.load(f)
        except FileNotFoundError:
            return ()
        except (OSError, ValueError) as e:
            msg = f"{FAULT_PLAN_KEY}: cannot read the fault plan {path}: {e}"
            raise ConfigError(msg) from e
        items = data.get("faults") if isinstance(data, dict) else None
        if not isinstance(items, list) or not all(isinstance(x, dict) for x in items):
            msg = f'{FAULT_PLAN_KEY}: {path} must hold {{"faults": [{{...}}, ...]}}'
            raise ConfigError(msg)
        fields = set(PlannedFault.__dataclass_fields__)
        for item in items:
            unknown = sorted(set(item) - fields)
            if unknown:
                msg = f"{FAULT_PLAN_KEY}: {path}: unknown fault field(s) {unknown} in {item}"
                raise ConfigError(msg)
        return tuple(PlannedFault(**item) for item in items)

    @staticmethod
    def write(path: str, faults: Sequence[PlannedFault]) -> None:
        """Write a plan whole, then rename it into place: readers never see half a file."""
        tmp = f"{path}.tmp-{os.getpid()}"
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump({"faults": [asdict(x) for x in faults]}, f)
        os.replace(tmp, path)


_announced: set[str] = set()


def _plan_of(config: StreamingConfig, clock: Clock | None) -> FaultPlan | None:
    path = config.fault_plan
    if not path:
        return None
    if path not in _announced:  # once per process: it is never on by accident
        _announced.add(path)
        log.warning("fault plan %s is configured (%s): a testing aid", path, FAULT_PLAN_KEY)
    return FaultPlan(path, clock)


def _cut_error(plan: FaultPlan, fault: PlannedFault, stream_id: int, call: str) -> RpcError:
    msg = (
        f"{call} failed: receiver {stream_id} is cut off from the driver until {fault.until_ms} "
        f"(injected partition, {FAULT_PLAN_KEY}={plan.path})"
    )
    return RpcError(msg)


class CutClient:
    """An endpoint client whose calls fail while the plan cuts ``stream_id`` off."""

    def __init__(self, client: Any, plan: FaultPlan, stream_id: int) -> None:
        self._client = client
        self._plan = plan
        self._stream_id = stream_id

    def _check(self, call: str, timeout_s: float | None) -> None:
        fault = self._plan.active("partition", self._stream_id)
        if fault is None:
            return
        if fault.mode == "hang":
            self._plan.hold(fault, timeout_s or getattr(self._client, "_timeout_s", None))
        raise _cut_error(self._plan, fault, self._stream_id, f"{call} to {self._client.address}")

    def call(self, message: Any, timeout_s: float | None = None) -> Any:
        """The client's ``call``, unless cut off."""
        self._check(type(message).__name__, timeout_s)
        return self._client.call(message, timeout_s)

    def ping(self, timeout_s: float | None = None) -> int:
        """The client's ``ping``, unless cut off."""
        self._check("ping", timeout_s)
        return int(self._client.ping(timeout_s))

    def __getattr__(self, name: str) -> Any:
        return getattr(self._client, name)


def cut_client(
    client: Any, config: StreamingConfig, stream_id: int, clock: Clock | None = None
) -> Any:
    """``client`` (of the driver), cut off during the plan's partitions of ``stream_id``."""
    plan = _plan_of(config, clock)
    return client if plan is None else CutClient(client, plan, stream_id)


def cut_check(
    config: StreamingConfig, stream_id: int, clock: Clock | None = None
) -> Callable[[str], None] | None:
    """For a receiver's block server: ``check(call)`` raises while ``stream_id`` is cut off."""
    plan = _plan_of(config, clock)
    if plan is None:
        return None

    def check(call: str) -> None:
        fault = plan.active("partition", stream_id)
        if fault is not None:
            if fault.mode == "hang":
                plan.hold(fault, config.block_store_timeout_s)
            raise _cut_error(plan, fault, stream_id, f"the driver's {call}")

    return check


def wal_fsync_hook(
    config: StreamingConfig, stream_id: int, clock: Clock | None = None
) -> Callable[[int], None] | None:
    """An ``fsync_hook`` for the receiver WAL of ``stream_id``: fails during ``wal_disk`` faults."""
    plan = _plan_of(config, clock)
    if plan is None:
        return None
    sync = getattr(os, "fdatasync", os.fsync)

    def fsync(fd: int) -> None:
        fault = plan.active("wal_disk", stream_id)
        if fault is not None:
            code = ERRNOS[fault.errno]
            raise OSError(code, f"{os.strerror(code)} (injected by {FAULT_PLAN_KEY})")
        sync(fd)

    return fsync
