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
"""

from __future__ import annotations

import logging
import re
import threading
import time
import traceback
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from spark_receivers.driver.tracking.scheduling_policy import (
    ExecutorCacheTaskLocation,
    TaskLocation,
)
from spark_receivers.errors import ConfigError, ReceiverError
from spark_receivers.rpc.hosts import local_host
from spark_receivers.spark.cluster import is_local_master, located_rdd
from spark_receivers.spark.receiver_task import ReceiverTaskSpec, make_task_function
from spark_receivers.util.clock import Clock, SystemClock

if TYPE_CHECKING:
    from pyspark import RDD, SparkContext

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


def expected_executors(sc: SparkContext) -> int:
    """How many executors the application asks for (0 when unknown)."""
    m = re.fullmatch(r"local-cluster\[\s*(\d+)\s*,.*\]", sc.master or "")
    if m:
        return int(m.group(1))
    instances = sc.getConf().get("spark.executor.instances")
    return int(instances) if instances and instances.isdigit() else 0


def alive_executors(sc: SparkContext) -> list[ExecutorCacheTaskLocation]:
    """Executors alive now, as locations (the driver itself in local mode).

    A location's host is the one Spark knows the executor by (its task locations
    compare them); locally ``spark.driver.host``, which Spark always sets.
    """
    js = sc._jsc.sc()  # type: ignore[union-attr]
    if is_local_master(sc.master or ""):
        conf = sc.getConf()
        host = conf.get("spark.driver.host") or local_host(dict(conf.getAll()))
        return [ExecutorCacheTaskLocation(host, "driver")]
    hosts: list[str] = []
    keys = js.getExecutorMemoryStatus().keysIterator()
    while keys.hasNext():
        host = str(keys.next()).rsplit(":", 1)[0]
        if host not in hosts:
            hosts.append(host)
    scheduler = js.taskScheduler()
    executors: list[ExecutorCacheTaskLocation] = []
    for host in hosts:
        ids = scheduler.getExecutorsAliveOnHost(host)
        if ids.isDefined():
            for executor_id in sorted(str(ids.get().mkString("\n")).split("\n"), key=_id_order):
                if executor_id and executor_id != "driver":
                    executors.append(ExecutorCacheTaskLocation(host, executor_id))
    return executors


def _id_order(executor_id: str) -> tuple[int, str]:
    return (int(executor_id), "") if executor_id.isdigit() else (1 << 30, executor_id)


def wait_for_executors(
    sc: SparkContext, timeout_s: float = 60.0
) -> list[ExecutorCacheTaskLocation]:
    """Make sure executors registered before the first placement (not needed locally).

    Runs a small job, as Spark does, then waits until the expected number of
    executors is alive or ``timeout_s`` passes.
    """
    if is_local_master(sc.master or ""):
        return alive_executors(sc)
    sc.parallelize(range(50), 50).map(lambda x: (x % 10, 1)).reduceByKey(
        lambda a, b: a + b, 20
    ).collect()
    want = expected_executors(sc)
    deadline = time.monotonic() + timeout_s
    executors = alive_executors(sc)
    while len(executors) < want and time.monotonic() < deadline:
        time.sleep(0.2)
        executors = alive_executors(sc)
    if len(executors) < want:
        log.warning(
            "only %d of %d executors registered after %.0fs", len(executors), want, timeout_s
        )
    return executors


def receiver_rdd(sc: SparkContext, stream_id: int, locations: Sequence[TaskLocation]) -> RDD[Any]:
    """A one-partition RDD holding ``stream_id`` that prefers ``locations``."""
    return located_rdd(sc, [(stream_id, locations)])


class ReceiverLauncher:
    """Submits every receiver's job and relaunches it until :meth:`stop`; see the module doc.

    ``specs`` holds each stream's task spec (the receiver, the tracker's address,
    the secret, the config it runs with). ``on_fatal(error)`` is called when a
    launcher thread dies of something other than its job ending.
    """

    def __init__(
        self,
        sc: SparkContext,
        specs: Mapping[int, ReceiverTaskSpec],
        restart_delay_ms: int,
        on_fatal: Callable[[BaseException], None],
        clock: Clock | None = None,
    ) -> None:
        self._sc = sc
        self._specs = dict(specs)
        self._restart_delay_ms = restart_delay_ms
        self._on_fatal = on_fatal
        self._clock = clock or SystemClock()
        self._app_id = sc.applicationId
        self._threads: dict[int, threading.Thread] = {}
        self._stopping = threading.Event()

    def wait_for_executors(self, timeout_s: float = 60.0) -> list[ExecutorCacheTaskLocation]:
        """Make sure the executors registered before the first placement."""
        return wait_for_executors(self._sc, timeout_s)

    def alive_executors(self) -> list[ExecutorCacheTaskLocation]:
        """The executors alive now (the driver itself in local mode)."""
        return alive_executors(self._sc)

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
                self._sc.cancelJobGroup(self.job_group(stream_id))
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
            failure, detail = self._run_job(stream_id, name, locations, task)
            if self._stopping.is_set():
                return
            jobs.job_ended(stream_id, failure, detail)
            due = self._clock.get_time_ms() + self._restart_delay_ms
            self._clock.wait_till_time(due, self._stopping)
            if self._stopping.is_set() or jobs.restart_receiver(stream_id) is None:
                return

    def _run_job(
        self, stream_id: int, name: str, locations: Sequence[TaskLocation], task: Any
    ) -> tuple[str, str]:
        """Run one job of the receiver: ``('', '')`` when it ended, else why (one line, all)."""
        sc = self._sc
        sc.setJobGroup(
            self.job_group(stream_id),
            describe_receiver_job(stream_id, name, locations),
            interruptOnCancel=True,
        )
        try:
            receiver_rdd(sc, stream_id, locations).mapPartitions(task).collect()
        except Exception as e:  # noqa: BLE001 - any job failure means: restart the receiver
            return summarize_failure(e), "".join(traceback.format_exception(e)).strip()
        finally:
            sc.setLocalProperty("spark.jobGroup.id", None)  # type: ignore[arg-type]
            sc.setLocalProperty("spark.job.description", None)  # type: ignore[arg-type]
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
