"""The faults of a chaos run, each applied, checked and timed from outside.

Kinds: ``worker`` (kill -9 of the receiver's Python worker: the process of our
cluster connected to our Redis), ``executor`` (kill -9 of an executor JVM of our
cluster, the receiver's most of the time; its Worker starts a new one),
``driver`` (kill -9 of the ``ingest`` process and its JVM, then a new one that
recovers from the checkpoint), ``partition`` (the receiver cut off from the
driver through the fault plan, ``hang`` and ``fail`` modes in turn) and
``enospc``/``eio`` (the receiver WAL's fsync fails through the fault plan).

Each :meth:`FaultRunner.apply` returns a :class:`FaultEvent`: when, what, the
records pending in the group right after a kill (a crash may deliver those twice,
and only those), acknowledgements seen while a cut or a disk fault was on (must be
0), and the recovery time: from the kill, or from the end of the fault's window,
to the first moment both new acknowledgements and a newer complete batch in the
sink are seen.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from reliability import procs
from reliability.driver import IngestDriver
from reliability.monitor import Progress
from reliability.redis_source import Group
from spark_receivers.util.fault_plan import FaultPlan, PlannedFault

KINDS = ("worker", "executor", "driver", "partition", "enospc", "eio")
DISK_ERRORS = {
    "enospc": ("ENOSPC", "No space left on device"),
    "eio": ("EIO", "Input/output error"),
}


@dataclass
class FaultEvent:
    kind: str
    at_s: float
    """Seconds since the run started."""
    detail: str = ""
    recovery_s: float | None = None
    pending_after: set[int] = field(default_factory=set, repr=False)
    acks_while_on: int | None = None
    error_reported: bool | None = None


class FaultRunner:
    """Applies faults to one run's processes; see the module doc."""

    def __init__(
        self,
        *,
        driver: IngestDriver,
        executors: Callable[[], dict[str, int]],  # {executor id: JVM pid} of our cluster
        redis_port: int,
        group: Group,
        progress: Progress,
        plan_path: Path,
        window_s: dict[str, float],
        stall_s: float,
        rng: random.Random,
        started: float,
    ) -> None:
        self.driver, self._executors, self._redis_port = driver, executors, redis_port
        self.group, self.progress, self.plan_path = group, progress, plan_path
        self.window_s, self.stall_s, self.rng, self.started = window_s, stall_s, rng, started
        self.planned: list[PlannedFault] = []
        self.partitions = 0
        self.driver_killed = False
        """True from a planned driver kill until its restart (the watchdog leaves it alone)."""

    # --- finding our processes --------------------------------------------------------

    def receiver_workers(self) -> list[int]:
        """Python workers of our executors connected to our Redis: the receiver's."""
        children = procs.children_map()
        below = [p for jvm in self._executors().values() for p in procs.descendants(jvm, children)]
        return procs.connected_to(below, self._redis_port)

    def _wait_for_workers(self, timeout_s: float) -> list[int]:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            found = self.receiver_workers()
            if found:
                return found
            time.sleep(0.2)
        return []

    # --- applying ---------------------------------------------------------------------

    def apply(self, kind: str) -> FaultEvent:
        event = FaultEvent(kind, round(time.monotonic() - self.started, 1))
        if kind in ("worker", "executor", "driver"):
            getattr(self, f"_kill_{kind}")(event)
            killed = time.monotonic()
            event.pending_after = self.group.pending_values()
            if kind == "driver":
                self.driver.start()
                self.driver_killed = False
            # The baseline is taken after the kill: an ack the killed process sent just
            # before dying must not count as the recovery.
            base = self.progress.wait(lambda s: s.mono >= killed + 0.3, 10) or self.progress.now()
            since = killed
        else:
            base = self._window(kind, event)
            since = base.mono
        if not event.detail.startswith("skipped"):
            found = self.progress.recovered_after(base, self.stall_s)
            event.recovery_s = None if found is None else round(found.mono - since, 1)
        return event

    def _kill_worker(self, event: FaultEvent) -> None:
        pids = self._wait_for_workers(60)
        if not pids:
            event.detail = "skipped: no receiver worker found within 60 s"
            return
        event.detail = f"worker pid {procs.kill9(pids)}"

    def _kill_executor(self, event: FaultEvent) -> None:
        executors = self._executors()
        workers = self._wait_for_workers(30)
        hosting = {
            eid for eid, jvm in executors.items()
            if any(jvm in _ancestors(w) for w in workers)
        }  # fmt: skip
        others = sorted(set(executors) - hosting)
        choose_other = others and (not hosting or self.rng.random() < 0.3)
        pool = others if choose_other else sorted(hosting)
        if not pool:
            event.detail = "skipped: no executor of ours alive"
            return
        eid = self.rng.choice(pool)
        role = "receiver's" if eid in hosting else "other"
        event.detail = f"executor {eid} ({role}) JVM pid {procs.kill9([executors[eid]])}"

    def _kill_driver(self, event: FaultEvent) -> None:
        self.driver_killed = True
        event.detail = f"driver #{self.driver.starts} pids {self.driver.kill9()}"

    def _window(self, kind: str, event: FaultEvent):  # -> Sample at the window's end
        length = self.window_s[kind]
        now_ms = int(time.time() * 1000)
        if kind == "partition":
            self.partitions += 1
            mode = "hang" if self.partitions % 2 else "fail"
            fault = PlannedFault("partition", now_ms, now_ms + int(length * 1000), 0, mode=mode)
            event.detail = f"receiver cut off from the driver for {length:g} s ({mode})"
        else:
            code, _ = DISK_ERRORS[kind]
            fault = PlannedFault("wal_disk", now_ms, now_ms + int(length * 1000), 0, errno=code)
            event.detail = f"receiver WAL fsync fails with {code} for {length:g} s"
        log_before = len(self.driver.log_text(self.driver.starts))
        self.planned.append(fault)
        FaultPlan.write(str(self.plan_path), self.planned)
        on = self.progress.wait(lambda s: s.wall_ms >= fault.from_ms + 1000, length)
        off = self.progress.wait(lambda s: s.wall_ms >= fault.until_ms - 300, length + 5)
        if on is not None and off is not None:
            event.acks_while_on = off.acked - on.acked
        end = self.progress.wait(lambda s: s.wall_ms >= fault.until_ms, 10)
        if kind in DISK_ERRORS:
            text = self.driver.log_text(self.driver.starts)[log_before:]
            event.error_reported = DISK_ERRORS[kind][1] in text
        return end if end is not None else self.progress.now()


def _ancestors(pid: int) -> list[int]:
    out = []
    while True:
        parent = procs.parent_of(pid)
        if parent is None or parent <= 1:
            return out
        out.append(parent)
        pid = parent
