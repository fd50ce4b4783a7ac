"""Submitting receiver jobs to Spark: executors alive, and RDDs with preferred locations.

PySpark's ``parallelize`` cannot carry preferred locations, so a receiver's
one-partition RDD is made on the JVM with ``SparkContext.makeRDD(seq of
(element, locations))`` — the call Spark's ReceiverTracker makes — and wrapped
as a PySpark RDD whose element is the pickled stream id.
"""

from __future__ import annotations

import logging
import pickle
import re
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from spark_receivers.driver.scheduling_policy import ExecutorCacheTaskLocation, TaskLocation

if TYPE_CHECKING:
    from pyspark import RDD, SparkContext

log = logging.getLogger(__name__)


def is_local_master(master: str) -> bool:
    """True for ``local``/``local[N]``/``local[*]`` (one process, executor "driver")."""
    return master == "local" or master.startswith("local[")


def expected_executors(sc: SparkContext) -> int:
    """How many executors the application asks for (0 when unknown)."""
    m = re.fullmatch(r"local-cluster\[\s*(\d+)\s*,.*\]", sc.master or "")
    if m:
        return int(m.group(1))
    instances = sc.getConf().get("spark.executor.instances")
    return int(instances) if instances and instances.isdigit() else 0


def alive_executors(sc: SparkContext) -> list[ExecutorCacheTaskLocation]:
    """Executors alive now, as locations (the driver itself in local mode)."""
    js = sc._jsc.sc()  # type: ignore[union-attr]
    if is_local_master(sc.master or ""):
        host = sc.getConf().get("spark.driver.host") or "localhost"
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
    from pyspark.rdd import RDD
    from pyspark.serializers import CPickleSerializer

    jvm = sc._jvm
    assert jvm is not None

    def scala_seq(items: Sequence[Any]) -> Any:
        java_list = jvm.java.util.ArrayList()
        for item in items:
            java_list.add(item)
        return jvm.scala.jdk.javaapi.CollectionConverters.asScala(java_list).toSeq()

    class_tag = jvm.scala.reflect.ClassTag.apply(jvm.java.lang.Class.forName("[B"))
    element = jvm.scala.Tuple2(
        bytearray(pickle.dumps(stream_id)), scala_seq([str(loc) for loc in locations])
    )
    jrdd = sc._jsc.sc().makeRDD(scala_seq([element]), class_tag)  # type: ignore[union-attr]
    return RDD(jrdd.toJavaRDD(), sc, CPickleSerializer())
