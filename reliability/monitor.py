"""What a run observes from outside, sampled on threads of its own.

:class:`Progress` samples the consumer group's acknowledged count and the sink's
newest complete batch (every 250 ms) and answers "has it progressed since t?".
:class:`MemorySampler` keeps the peak RSS of the driver (its Python and JVM) and of
each executor (its JVM, the Python workers below it and its block keeper).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from reliability import procs
from reliability.redis_source import Group
from reliability.sink import SinkWatch


@dataclass(frozen=True)
class Sample:
    mono: float
    wall_ms: int
    acked: int
    newest_batch_ms: int


class Progress:
    """Samples of (acked, newest complete batch); see the module doc."""

    def __init__(self, group: Group, sink: SinkWatch, every_s: float = 0.25) -> None:
        self._group, self._sink, self._every = group, sink, every_s
        self._cond = threading.Condition()
        self.last: Sample | None = None
        self.errors = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="chaos-progress", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self._every):
            try:
                sample = Sample(
                    time.monotonic(),
                    int(time.time() * 1000),
                    self._group.acked(),
                    self._sink.poll(),
                )
            except Exception:  # a Redis hiccup: the next sample will tell
                self.errors += 1
                continue
            with self._cond:
                self.last = sample
                self._cond.notify_all()

    def now(self) -> Sample:
        with self._cond:
            self._cond.wait_for(lambda: self.last is not None, 30)
            assert self.last is not None
            return self.last

    def wait(self, predicate: Callable[[Sample], bool], timeout_s: float) -> Sample | None:
        """The first sample for which ``predicate`` holds, or None after ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        with self._cond:
            while True:
                if self.last is not None and predicate(self.last):
                    return self.last
                left = deadline - time.monotonic()
                if left <= 0:
                    return None
                self._cond.wait(left)

    def recovered_after(self, base: Sample, timeout_s: float) -> Sample | None:
        """Both new acknowledgements and a batch newer than ``base`` completed in the sink."""
        return self.wait(
            lambda s: s.acked > base.acked and s.newest_batch_ms > base.wall_ms, timeout_s
        )

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)


class MemorySampler:
    """Peak RSS of the driver and of each executor (every ``every_s``)."""

    def __init__(
        self, driver_pids: Callable[[], list[int]], executors: Callable[[], dict[str, int]],
        every_s: float = 2.0,
    ) -> None:  # fmt: skip
        self._driver_pids, self._executors, self._every = driver_pids, executors, every_s
        self.driver_peak = 0
        self.executor_peak = 0
        self.keeper_peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="chaos-memory", daemon=True)
        self._thread.start()

    def sample(self) -> tuple[int, dict[int, int], int]:
        """``(driver RSS, {executor JVM pid: RSS of its tree and keeper}, peak keeper RSS)``."""
        driver = sum(procs.rss_bytes(p) for p in self._driver_pids())
        children = procs.children_map()
        per_executor, keeper_max = {}, 0
        for jvm in self._executors().values():
            tree = {jvm, *procs.descendants(jvm, children)}
            work = procs.cwd_of(jvm)
            keepers = [p for p in procs.under(work) if p not in tree] if work else []
            keeper_max = max([keeper_max, *(procs.rss_bytes(p) for p in keepers)])
            per_executor[jvm] = sum(procs.rss_bytes(p) for p in (*tree, *keepers))
        return driver, per_executor, keeper_max

    def _run(self) -> None:
        while not self._stop.wait(self._every):
            driver, executors, keeper = self.sample()
            self.driver_peak = max(self.driver_peak, driver)
            self.executor_peak = max([self.executor_peak, *executors.values()])
            self.keeper_peak = max(self.keeper_peak, keeper)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)
