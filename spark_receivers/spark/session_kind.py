"""Classic session or Spark Connect: the one place that knows which one the driver runs on.

Everything the driver asks of Spark beyond DataFrames goes through a :class:`SparkSide`:
the conf, the master, the application id, the default parallelism, job groups and their
cancellation, the executors alive, and running one task per item
(:meth:`SparkSide.run_located`: receivers, block keepers, the start-up probe).

- :class:`ClassicSide` wraps a ``SparkContext`` (py4j): tasks are a located RDD whose
  partitions prefer the executors the tracker chose, as Spark's ReceiverTracker does.
- :class:`ConnectSide` wraps a Spark Connect session (``SparkSession.builder.remote``):
  no SparkContext, no RDD, no JVM in this process. Tasks are one DataFrame job,
  ``spark.range(0, n, 1, n).mapInArrow(...)``, one partition per item; a job group is a
  Connect operation tag (``addTag``/``interruptTag``, per thread). Connect cannot say
  where a partition runs: with ``strict`` a task whose first attempt lands on an executor
  its item did not name does nothing and is reported refused, and the caller launches it
  again (docs/decisions/0015-receivers-on-spark-connect.md).

:func:`spark_side` picks the side for a session (or a ``SparkContext``).
"""

from __future__ import annotations

import logging
import os
import pickle
import re
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

from spark_receivers.spark.cluster import is_local_master, located_rdd

if TYPE_CHECKING:
    from pyspark import SparkContext

log = logging.getLogger(__name__)

__all__ = [
    "ClassicSide",
    "ConnectSide",
    "Located",
    "SparkSide",
    "is_connect",
    "spark_side",
]

Located = tuple[Any, Sequence[object]]
"""One task's item and the locations it prefers (``str()``: ``executor_<host>_<id>`` or host)."""

SIMPLIFIED_TRACEBACK_CONF = "spark.sql.execution.pyspark.udf.simplifiedTraceback.enabled"
"""Spark's SQL conf (default true) under which its SQL runners set the variable below."""
SIMPLIFIED_TRACEBACK_ENV = "SPARK_SIMPLIFIED_TRACEBACK"
_ENVIRONMENT_LOCK = threading.Lock()
"""Held while a located RDD's function is made with the variable in ``sc.environment``."""

EXECUTORS_TTL_S = 5.0
"""How long a Connect side trusts the executors its last discovery job saw."""


def is_connect(spark: Any) -> bool:
    """True for a Spark Connect session (``pyspark.sql.connect.session.SparkSession``)."""
    return type(spark).__module__.startswith("pyspark.sql.connect")


def spark_side(spark: Any) -> SparkSide:
    """The side of ``spark``: a SparkSession (classic or Connect), a SparkContext, or a side."""
    if isinstance(spark, SparkSide):
        return spark
    if is_connect(spark):
        return ConnectSide(spark)
    sc = getattr(spark, "sparkContext", None)
    return ClassicSide(sc if sc is not None else spark)


def _local_cores(master: str) -> int | None:
    m = re.fullmatch(r"local\[(\d+|\*)(?:,\d+)?\]", master)
    if master == "local":
        return 1
    if m is None:
        return None
    return (os.cpu_count() or 1) if m.group(1) == "*" else int(m.group(1))


class SparkSide:
    """What the driver asks of Spark beyond DataFrames (see the module doc)."""

    kind = "classic"

    @property
    def master(self) -> str:
        """The master URL (``local[2]``, ``spark://...``)."""
        raise NotImplementedError

    @property
    def app_id(self) -> str:
        """The Spark application id."""
        raise NotImplementedError

    @property
    def python_exec(self) -> str:
        """The Python this driver's Python workers run ('' when not this process's concern)."""
        return ""

    def conf(self) -> dict[str, str]:
        """The application's static conf."""
        raise NotImplementedError

    def default_parallelism(self) -> int:
        """Spark's default parallelism (task slots in local mode)."""
        raise NotImplementedError

    def set_job_group(self, group: str, description: str, interrupt: bool = False) -> None:
        """Jobs this thread starts from now on belong to ``group``."""
        raise NotImplementedError

    def set_job_description(self, description: str) -> None:
        """The description of the jobs this thread starts from now on (where it is shown)."""

    def clear_job_group(self) -> None:
        """Jobs this thread starts from now on belong to no group."""
        raise NotImplementedError

    def cancel_job_group(self, group: str) -> None:
        """Cancel the running jobs of ``group``."""
        raise NotImplementedError

    def cancel_all(self) -> None:
        """Cancel every running job of this application (this session's, on Connect)."""
        raise NotImplementedError

    def executors(self) -> list[tuple[str, str]]:
        """The executors alive now as ``(host, executor id)`` (the driver in local mode)."""
        raise NotImplementedError

    def wait_for_executors(self, timeout_s: float = 60.0) -> list[tuple[str, str]]:
        """Make sure the executors registered before the first placement; the executors."""
        raise NotImplementedError

    def run_located(
        self, items: Sequence[Located], func: Callable[..., Iterable[Any]], strict: bool
    ) -> tuple[list[Any], list[int]]:
        """Run ``func`` over each item in a task of its own; ``(outputs, refused items)``.

        ``func`` is a ``mapPartitions`` function: it gets an iterator over its one item.
        ``strict``: a task that cannot be placed where its item says is refused (its index
        in ``refused``) rather than run elsewhere; the classic side places every task
        through preferred locations and refuses none.
        """
        raise NotImplementedError

    def add_py_file(self, path: str) -> None:
        """Ship a zip to every executor's Python path."""
        raise NotImplementedError

    def _local_driver(self) -> list[tuple[str, str]]:
        from spark_receivers.rpc.hosts import local_host

        conf = self.conf()
        return [(conf.get("spark.driver.host") or local_host(conf), "driver")]


class ClassicSide(SparkSide):
    """A classic session's SparkContext (py4j); see the module doc."""

    kind = "classic"

    def __init__(self, sc: SparkContext) -> None:
        self.sc = sc

    @property
    def master(self) -> str:
        """See :meth:`SparkSide.master`."""
        return self.sc.master or ""

    @property
    def app_id(self) -> str:
        """See :meth:`SparkSide.app_id`."""
        return self.sc.applicationId or ""

    @property
    def python_exec(self) -> str:
        """See :meth:`SparkSide.python_exec`."""
        return getattr(self.sc, "pythonExec", None) or ""

    def conf(self) -> dict[str, str]:
        """See :meth:`SparkSide.conf`."""
        return dict(self.sc.getConf().getAll())

    def default_parallelism(self) -> int:
        """See :meth:`SparkSide.default_parallelism`."""
        return self.sc.defaultParallelism

    def set_job_group(self, group: str, description: str, interrupt: bool = False) -> None:
        """See :meth:`SparkSide.set_job_group`."""
        self.sc.setJobGroup(group, description, interruptOnCancel=interrupt)

    def set_job_description(self, description: str) -> None:
        """See :meth:`SparkSide.set_job_description`."""
        self.sc.setJobDescription(description)

    def clear_job_group(self) -> None:
        """See :meth:`SparkSide.clear_job_group`."""
        self.sc.setLocalProperty("spark.jobGroup.id", None)  # type: ignore[arg-type]
        self.sc.setLocalProperty("spark.job.description", None)  # type: ignore[arg-type]

    def cancel_job_group(self, group: str) -> None:
        """See :meth:`SparkSide.cancel_job_group`."""
        self.sc.cancelJobGroup(group)

    def cancel_all(self) -> None:
        """See :meth:`SparkSide.cancel_all`."""
        self.sc.cancelAllJobs()

    def executors(self) -> list[tuple[str, str]]:
        """See :meth:`SparkSide.executors`."""
        sc = self.sc
        js = sc._jsc.sc()  # type: ignore[union-attr]
        if is_local_master(sc.master or ""):
            return self._local_driver()
        hosts: list[str] = []
        keys = js.getExecutorMemoryStatus().keysIterator()
        while keys.hasNext():
            host = str(keys.next()).rsplit(":", 1)[0]
            if host not in hosts:
                hosts.append(host)
        scheduler = js.taskScheduler()
        found: list[tuple[str, str]] = []
        for host in hosts:
            ids = scheduler.getExecutorsAliveOnHost(host)
            if ids.isDefined():
                for executor_id in sorted(str(ids.get().mkString("\n")).split("\n"), key=_id_order):
                    if executor_id and executor_id != "driver":
                        found.append((host, executor_id))
        return found

    def wait_for_executors(self, timeout_s: float = 60.0) -> list[tuple[str, str]]:
        """See :meth:`SparkSide.wait_for_executors`."""
        if is_local_master(self.master):
            return self.executors()
        app = self.app_id
        if app not in _waited_apps:
            # As Spark's ReceiverTracker does before placing receivers: a job of many small
            # tasks returns only once an executor registered, and gives the others time to.
            # In the JVM alone: a Python job of 50 map and 20 reduce tasks cost 14-20 s of a
            # driver's restart on a 2-core standalone cluster (issue 30's chaos timeline).
            self.sc._jsc.sc().range(0, 50, 1, 50).count()
            _waited_apps.add(app)
        return _wait_for(self, timeout_s)

    def run_located(
        self, items: Sequence[Located], func: Callable[..., Iterable[Any]], strict: bool
    ) -> tuple[list[Any], list[int]]:
        """See :meth:`SparkSide.run_located`."""
        rdd = located_rdd(self.sc, items).mapPartitions(func)
        self._with_sql_worker_env(rdd)
        return rdd.collect(), []

    def _with_sql_worker_env(self, rdd: Any) -> None:
        """Make ``rdd``'s Python function now, in the environment SQL's Python tasks get.

        An executor keeps one Python daemon for each environment its Python tasks ask
        for. Spark's SQL runners (the batch reads through our data source, ``mapInArrow``)
        add ``SPARK_SIMPLIFIED_TRACEBACK=1`` to the function's environment unless
        :data:`SIMPLIFIED_TRACEBACK_CONF` is false; its RDD runner does not. So
        receivers, keeper tasks and probes had a daemon of their own on every executor,
        started again in every application: ~1.1 CPU-s each (the second of two daemons
        of a local ``ingest``, 2026-11-29), and on a loaded machine seconds more before
        the first batch with records. The function takes a copy of ``sc.environment``
        when it is made (``PipelinedRDD._jrdd``), so the variable is there only then.
        """
        if self.sc.getConf().get(SIMPLIFIED_TRACEBACK_CONF, "true").strip().lower() != "true":
            return
        # The dict is swapped, never changed in place: a batch thread making its own
        # function at this moment iterates whichever dict it read (py4j converts it key by
        # key), and changing that one under it failed a batch with "dictionary changed
        # size during iteration" (a receiver relaunched while a batch was built).
        with _ENVIRONMENT_LOCK:
            env = self.sc.environment
            made = {**env, SIMPLIFIED_TRACEBACK_ENV: "1"}
            self.sc.environment = made
            try:
                rdd._jrdd  # noqa: B018  (made and kept by PySpark's PipelinedRDD)
            finally:
                if self.sc.environment is made:
                    self.sc.environment = env

    def add_py_file(self, path: str) -> None:
        """See :meth:`SparkSide.add_py_file`."""
        self.sc.addPyFile(path)


_waited_apps: set[str] = set()
"""Applications whose registration job ran: their executors registered once already."""


def expected_executors(side: SparkSide) -> int:
    """How many executors the application asks for (0 when unknown)."""
    m = re.fullmatch(r"local-cluster\[\s*(\d+)\s*,.*\]", side.master)
    if m:
        return int(m.group(1))
    instances = side.conf().get("spark.executor.instances")
    return int(instances) if instances and instances.isdigit() else 0


def _wait_for(side: SparkSide, timeout_s: float) -> list[tuple[str, str]]:
    want = expected_executors(side)
    deadline = time.monotonic() + timeout_s
    executors = side.executors()
    while len(executors) < want and time.monotonic() < deadline:
        time.sleep(0.2)
        executors = side.executors()
    if len(executors) < want:
        log.warning(
            "only %d of %d executors registered after %.0fs", len(executors), want, timeout_s
        )
    return executors


def _id_order(executor_id: str) -> tuple[int, str]:
    return (int(executor_id), "") if executor_id.isdigit() else (1 << 30, executor_id)


class ConnectSide(SparkSide):
    """A Spark Connect session: DataFrame jobs and operation tags; see the module doc."""

    kind = "connect"

    def __init__(self, spark: Any) -> None:
        self.spark = spark
        self._conf: dict[str, str] | None = None
        self._seen: tuple[float, list[tuple[str, str]]] | None = None
        self._lock = threading.Lock()

    @property
    def master(self) -> str:
        """See :meth:`SparkSide.master`."""
        return self.conf().get("spark.master", "")

    @property
    def app_id(self) -> str:
        """See :meth:`SparkSide.app_id`."""
        return self.conf().get("spark.app.id", "")

    def conf(self) -> dict[str, str]:
        """See :meth:`SparkSide.conf`."""
        # The server's session conf holds the application's static conf too.
        if self._conf is None:
            self._conf = {str(k): str(v) for k, v in self.spark.conf.getAll.items()}
        return self._conf

    def default_parallelism(self) -> int:
        """See :meth:`SparkSide.default_parallelism`."""
        cores = _local_cores(self.master)
        if cores is not None:
            return cores
        configured = self.conf().get("spark.default.parallelism", "")
        if configured.isdigit():
            return int(configured)
        # spark.range without a partition count gets the default parallelism.
        from pyspark.sql.functions import spark_partition_id

        parts = self.spark.range(0, 1 << 16).select(spark_partition_id()).distinct().count()
        return max(1, int(parts))

    def set_job_group(self, group: str, description: str, interrupt: bool = False) -> None:
        """See :meth:`SparkSide.set_job_group`."""
        self.spark.clearTags()
        self.spark.addTag(group)

    def clear_job_group(self) -> None:
        """See :meth:`SparkSide.clear_job_group`."""
        self.spark.clearTags()

    def cancel_job_group(self, group: str) -> None:
        """See :meth:`SparkSide.cancel_job_group`."""
        self.spark.interruptTag(group)

    def cancel_all(self) -> None:
        """See :meth:`SparkSide.cancel_all`."""
        self.spark.interruptAll()

    def executors(self) -> list[tuple[str, str]]:
        """See :meth:`SparkSide.executors`."""
        if is_local_master(self.master):
            return self._local_driver()
        with self._lock:
            seen = self._seen
            if seen is not None and time.monotonic() - seen[0] < EXECUTORS_TTL_S:
                return list(seen[1])
        found = self._discover()
        with self._lock:
            self._seen = (time.monotonic(), found)
        return list(found)

    def _discover(self) -> list[tuple[str, str]]:
        """The executors that ran a task of a small job, one task per default slot."""
        n = max(2, self.default_parallelism())
        rows, _ = self.run_located([(i, ()) for i in range(n)], _where_am_i, strict=False)
        found: list[tuple[str, str]] = []
        for host, executor_id in rows:
            if (host, executor_id) not in found and executor_id != "driver":
                found.append((host, executor_id))
        return sorted(found, key=lambda e: _id_order(e[1]))

    def wait_for_executors(self, timeout_s: float = 60.0) -> list[tuple[str, str]]:
        """See :meth:`SparkSide.wait_for_executors`."""
        if is_local_master(self.master):
            return self.executors()
        return _wait_for(self, timeout_s)

    def run_located(
        self, items: Sequence[Located], func: Callable[..., Iterable[Any]], strict: bool
    ) -> tuple[list[Any], list[int]]:
        """See :meth:`SparkSide.run_located`."""
        plan = [(item, [_where(loc) for loc in locs] if strict else []) for item, locs in items]
        n = len(plan)
        if n == 0:
            return [], []
        task = _connect_task(plan, func)
        rows = self.spark.range(0, n, 1, n).mapInArrow(task, "refused long, out binary").collect()
        outputs: list[Any] = []
        refused: list[int] = []
        for row in rows:
            if row["refused"] is not None:
                refused.append(int(row["refused"]))
            else:
                outputs.append(pickle.loads(row["out"]))
        return outputs, refused

    def add_py_file(self, path: str) -> None:
        """See :meth:`SparkSide.add_py_file`."""
        self.spark.addArtifacts(path, pyfile=True)


def _where(loc: object) -> tuple[str, str]:
    """``(host, executor id)`` of a location ('' for an executor id it does not name)."""
    return (str(getattr(loc, "host", loc)), str(getattr(loc, "executor_id", "")))


def _where_am_i(_: Iterator[Any]) -> Iterator[tuple[str, str]]:
    from spark_receivers.spark.receiver_task import executor_host, executor_id

    yield (executor_host(), executor_id())


def _connect_task(
    plan: list[tuple[Any, list[tuple[str, str]]]],
    func: Callable[..., Iterable[Any]],
) -> Callable[[Iterator[Any]], Iterator[Any]]:
    """The ``mapInArrow`` function: partition ``i`` runs ``func`` over item ``i``.

    A partition whose executor is not one its item names (when it names any) yields one
    row with ``refused`` set and runs nothing. Only a task's first attempt is judged: Spark
    retries a task whose executor was lost (or whose attempt failed) on another executor,
    and refusing that retry would have the caller launch it again for the executor that
    died; the retry runs ``func``, which decides (a receiver's task returns at once on a
    retry, so its job ends and the tracker places the receiver again), as on the classic
    side, where preferred locations do not bind a retry either.
    """

    def run(batches: Iterator[Any]) -> Iterator[Any]:
        """See :meth:`SparkSide.run`."""
        import pyarrow as pa
        from pyspark import TaskContext

        from spark_receivers.spark.receiver_task import executor_host, executor_id

        ctx = TaskContext.get()
        first = ctx is None or ctx.attemptNumber() == 0
        schema = pa.schema([("refused", pa.int64()), ("out", pa.binary())])
        for batch in batches:
            for index in batch.column(0).to_pylist():
                item, wanted = plan[index]
                if first and wanted and not _placed(wanted, executor_host(), executor_id()):
                    yield pa.record_batch(
                        [pa.array([index], pa.int64()), pa.array([None], pa.binary())],
                        schema=schema,
                    )
                    continue
                for out in func(iter([item])):
                    yield pa.record_batch(
                        [pa.array([None], pa.int64()), pa.array([pickle.dumps(out)])],
                        schema=schema,
                    )

    return run


def _placed(wanted: list[tuple[str, str]], host: str, executor: str) -> bool:
    """True when this executor matches a wanted location (its id, or its host when no id)."""
    for want_host, want_id in wanted:
        if want_id and want_id == executor:
            return True
        if not want_id and want_host == host:
            return True
    return False
