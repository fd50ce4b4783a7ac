"""Running receivers as Spark jobs: :class:`ReceiverLauncher` and its RDD helpers.

Each receiver runs as a one-partition, one-task Spark job that prefers the
executors the tracker chose, submitted from a driver thread of its own under its
own job group (so that stopping can cancel it), as Spark's ReceiverTracker does.
When the job ends (the receiver stopped, failed, or its executor was lost) the
launcher tells the tracker, waits ``receiver_restart_delay_ms`` and submits it
again where the tracker says, until the launcher stops. A launcher thread that
dies for any other reason (a py4j error, say) fails the context through
``on_fatal`` instead of leaving the receiver silently gone.

PySpark's ``parallelize`` cannot carry preferred locations, so a receiver's
one-partition RDD is made on the JVM with ``SparkContext.makeRDD(seq of
(element, locations))`` — the call Spark's ReceiverTracker makes — and wrapped
as a PySpark RDD whose element is the pickled stream id
(:func:`spark_receivers.spark.cluster.located_rdd`).

On Spark Connect there is no RDD: the job is a one-partition ``mapInArrow`` over
``spark.range`` (:class:`spark_receivers.spark.session_kind.ConnectSide`), and its
group an operation tag. Connect cannot prefer an executor, so a task that lands on one
the tracker did not choose starts no receiver and the job is launched again, at most
:data:`MAX_PLACEMENT_TRIES` times; the last try runs wherever it lands, and the tracker
accepts its receiver there (:meth:`ReceiverJobs.place_anywhere`).
"""

from __future__ import annotations

import logging
import re
import threading
import traceback
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

from spark_receivers.driver.tracking.scheduling_policy import (
    ExecutorCacheTaskLocation,
    TaskLocation,
)
from spark_receivers.errors import ConfigError, ReceiverError
from spark_receivers.spark.receiver_task import ReceiverTaskSpec, make_task_function
from spark_receivers.spark.session_kind import spark_side
from spark_receivers.util.clock import Clock, SystemClock

log = logging.getLogger(__name__)


class ReceiverJobs(Protocol):
    """What a launcher asks of the tracker around each job it runs for a receiver."""

    def job_starting(self, stream_id: int) -> Sequence[TaskLocation] | None:
        """Count a launch; return where the job should run (None: do not launch)."""
        ...

    def job_ended(self, stream_id: int, failure: str, detail: str = "") -> None:
        """The job ended (``failure``: '' or one line; ``detail``: its full traceback)."""
        ...

    def restart_receiver(self, stream_id: int) -> Sequence[TaskLocation] | None:
        """Reschedule after a job ended; None when the tracker is stopping."""
        ...

    def place_anywhere(self, stream_id: int) -> None:
        """Accept the running job's receiver from any executor, until the job ends."""
        ...


class Launcher(Protocol):
    """Runs receiver jobs for the tracker; on Spark, a :class:`ReceiverLauncher`."""

    def alive_executors(self) -> list[ExecutorCacheTaskLocation]:
        """The executors alive now."""
        ...

    def launch(self, stream_id: int, jobs: ReceiverJobs) -> None:
        """Start running the receiver's job, again each time it ends, until stopped."""
        ...


def check_local_cores(master: str, receivers: int) -> None:
    """Refuse a ``local[N]`` master whose N cores the receivers would all hold.

    Each receiver's task holds a core for as long as it runs: with N <= receivers
    no batch could ever run. Raises :class:`ConfigError` saying what to use.
    """
    m = re.fullmatch(r"local\[(\d+)(?:,\d+)?\]", master)
    cores = 1 if master == "local" else int(m.group(1)) if m else None
    if cores is not None and cores <= receivers:
        msg = (
            f"master {master!r} has {cores} core(s) but {receivers} receiver(s): each "
            "receiver holds a core for good, so no batch could run; "
            f"use local[{receivers + 2}]"
        )
        raise ConfigError(msg)


def alive_executors(spark: Any) -> list[ExecutorCacheTaskLocation]:
    """Executors alive now, as locations (the driver itself in local mode).

    ``spark``: a SparkContext, a session (classic or Spark Connect) or its side
    (:mod:`spark_receivers.spark.session_kind`). A location's host is the one Spark
    knows the executor by (its task locations compare them); locally
    ``spark.driver.host``, which Spark always sets.
    """
    return [ExecutorCacheTaskLocation(h, e) for h, e in spark_side(spark).executors()]


def wait_for_executors(spark: Any, timeout_s: float = 60.0) -> list[ExecutorCacheTaskLocation]:
    """Make sure executors registered before the first placement (not needed locally).

    Runs a small job, as Spark does, then waits until the expected number of
    executors is alive or ``timeout_s`` passes.
    """
    found = spark_side(spark).wait_for_executors(timeout_s)
    return [ExecutorCacheTaskLocation(h, e) for h, e in found]


MAX_PLACEMENT_TRIES = 5
"""Launches of a receiver's job that may be refused for landing on an executor the
tracker did not choose (Spark Connect has no preferred locations); the last one runs
wherever it lands, and the tracker accepts it there."""


class ReceiverLauncher:
    """Submits every receiver's job and relaunches it until :meth:`stop`; see the module doc.

    ``specs`` holds each stream's task spec (the receiver, the tracker's address,
    the secret, the config it runs with). ``on_fatal(error)`` is called when a
    launcher thread dies of something other than its job ending.
    """

    def __init__(
        self,
        sc: Any,
        specs: Mapping[int, ReceiverTaskSpec],
        restart_delay_ms: int,
        on_fatal: Callable[[BaseException], None],
        clock: Clock | None = None,
    ) -> None:
        self._side = spark_side(sc)
        self._specs = dict(specs)
        self._restart_delay_ms = restart_delay_ms
        self._on_fatal = on_fatal
        self._clock = clock or SystemClock()
        self._app_id = self._side.app_id
        self._threads: dict[int, threading.Thread] = {}
        self._stopping = threading.Event()

    def wait_for_executors(self, timeout_s: float = 60.0) -> list[ExecutorCacheTaskLocation]:
        """Make sure the executors registered before the first placement."""
        return wait_for_executors(self._side, timeout_s)

    def alive_executors(self) -> list[ExecutorCacheTaskLocation]:
        """The executors alive now (the driver itself in local mode)."""
        return alive_executors(self._side)

    def job_group(self, stream_id: int) -> str:
        """The Spark job group of a receiver's jobs."""
        return f"spark-receivers-{self._app_id}-receiver-{stream_id}"

    def launch(self, stream_id: int, jobs: ReceiverJobs) -> None:
        """Start the thread that runs the receiver's job, again after each end."""
        thread = threading.Thread(
            target=self._run,
            args=(stream_id, jobs),
            name=f"receiver-launcher-{stream_id}",
            daemon=True,
        )
        self._threads[stream_id] = thread
        thread.start()

    def stop(self, timeout_s: float | None) -> None:
        """Stop relaunching; wait for the jobs to end, cancel those that do not.

        Each job gets ``timeout_s`` (None: no bound) to end by itself (its
        receiver was told to stop and release), then its job group is cancelled.
        """
        self._stopping.set()
        wake = getattr(self._clock, "wake_all", None)
        if wake is not None:
            wake()
        for stream_id, thread in self._threads.items():
            thread.join(timeout_s)
            if thread.is_alive():
                log.warning("receiver %d did not stop in time; cancelling its job", stream_id)
                self._side.cancel_job_group(self.job_group(stream_id))
        for stream_id, thread in self._threads.items():
            thread.join(30)
            if thread.is_alive():
                log.warning("receiver %d: its launcher thread is still running", stream_id)

    def _run(self, stream_id: int, jobs: ReceiverJobs) -> None:
        try:
            self._keep_launching(stream_id, jobs)
        except BaseException as e:
            if self._stopping.is_set():
                log.info("launcher of receiver %d ended while stopping: %s", stream_id, e)
                return
            log.exception("the launcher of receiver %d died", stream_id)
            msg = f"the launcher of receiver {stream_id} died: {e}"
            error = ReceiverError(msg)
            error.__cause__ = e
            self._on_fatal(error)

    def _keep_launching(self, stream_id: int, jobs: ReceiverJobs) -> None:
        spec = self._specs[stream_id]
        task = make_task_function(spec)
        name = spec.receiver.name
        while not self._stopping.is_set():
            locations = jobs.job_starting(stream_id)
            if locations is None:
                return
            failure, detail = self._run_job(stream_id, jobs, name, locations, task)
            if self._stopping.is_set():
                return
            jobs.job_ended(stream_id, failure, detail)
            due = self._clock.get_time_ms() + self._restart_delay_ms
            self._clock.wait_till_time(due, self._stopping)
            if self._stopping.is_set() or jobs.restart_receiver(stream_id) is None:
                return

    def _run_job(
        self,
        stream_id: int,
        jobs: ReceiverJobs,
        name: str,
        locations: Sequence[TaskLocation],
        task: Any,
    ) -> tuple[str, str]:
        """Run one job of the receiver: ``('', '')`` when it ended, else why (one line, all)."""
        side = self._side
        side.set_job_group(
            self.job_group(stream_id),
            describe_receiver_job(stream_id, name, locations),
            interrupt=True,
        )
        try:
            for attempt in range(1, MAX_PLACEMENT_TRIES + 1):
                strict = attempt < MAX_PLACEMENT_TRIES
                if not strict:
                    jobs.place_anywhere(stream_id)  # else the tracker refuses it in turn
                _, refused = side.run_located([(stream_id, locations)], task, strict=strict)
                if not refused or self._stopping.is_set():
                    break
                log.info(
                    "receiver %d landed on an executor the tracker did not choose (%s); "
                    "launching it again (try %d of %d)",
                    stream_id,
                    ", ".join(str(loc) for loc in locations),
                    attempt + 1,
                    MAX_PLACEMENT_TRIES,
                )
        except Exception as e:  # noqa: BLE001 - any job failure means: restart the receiver
            return summarize_failure(e), "".join(traceback.format_exception(e)).strip()
        finally:
            side.clear_job_group()
        return "", ""


def describe_receiver_job(stream_id: int, name: str, locations: Sequence[TaskLocation]) -> str:
    """The Spark UI description of a receiver's job: ``Receiver 0: socket-... on executor 1``."""
    executors = [loc.executor_id for loc in locations if isinstance(loc, ExecutorCacheTaskLocation)]
    if executors:
        where = ("executor " if len(executors) == 1 else "executors ") + ", ".join(executors)
    else:
        where = ", ".join(str(loc) for loc in locations) or "any executor"
    return f"Receiver {stream_id}: {name} on {where}"


def summarize_failure(error: BaseException, limit: int = 300) -> str:
    """One line saying why a job failed: the first line of its text that says something.

    py4j's errors start with ``An error occurred while calling o57.collect.``; the
    line after it (``Job aborted due to stage failure: ...``) is the one to show.
    When the text holds a Python worker's traceback, the exception that ended it
    (``ModuleNotFoundError: No module named 'x'``) comes first.
    """
    lines = [line.strip().removeprefix(": ").strip() for line in str(error).splitlines()]
    first = next(
        (x for x in lines if x and not x.startswith("An error occurred while calling")), ""
    )
    if not first:
        return type(error).__name__
    raised = _python_exception(str(error))
    if raised:
        first = f"{raised} (from: {first})"
    return first[:limit]


_PYTHON_RAISED = re.compile(r"^([A-Za-z_][\w.]*(?:Error|Exception|Exit|Interrupt)\b.*)$", re.M)


def _python_exception(text: str) -> str:
    """The exception line that ends the last Python traceback in ``text`` ('' if none)."""
    start = text.rfind("Traceback (most recent call last):")
    if start < 0:
        return ""
    found = _PYTHON_RAISED.findall(text[start:])
    return found[0].strip() if found else ""


def task_specs(
    receivers: Sequence[Any],
    tracker_address: str,
    secret: str,
    config: dict[str, Any],
    overrides: Mapping[int, dict[str, Any]] | None = None,
    app_id: str = "",
) -> dict[int, ReceiverTaskSpec]:
    """The task spec of each receiver (``overrides``: config changes per stream id)."""
    overrides = overrides or {}
    return {
        r.stream_id: ReceiverTaskSpec(
            r,
            r.stream_id,
            tracker_address,
            secret,
            {**config, **overrides.get(r.stream_id, {})},
            app_id,
        )
        for r in receivers
    }
