"""The cluster as the driver's PySpark sees it: is the master local, and located RDDs.

A located RDD is one placed on the executors the driver chose. One answer each, for
every caller: the receiver launcher, the keeper starter, the deployment's probe of the
executors, the batch reader's partition count, the command line.
"""

from __future__ import annotations

import pickle
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pyspark import RDD, SparkContext

__all__ = ["is_local_master", "located_rdd"]


def is_local_master(master: str) -> bool:
    """True for ``local``/``local[N]``/``local[*]``: one process, its executor the driver.

    The Python workers are then children of this driver's JVM.
    """
    return master == "local" or master.startswith("local[")


def located_rdd(sc: SparkContext, items: Sequence[tuple[Any, Sequence[object]]]) -> RDD[Any]:
    """An RDD with one partition per item, holding the item and preferring its locations.

    PySpark's ``parallelize`` cannot carry preferred locations, so the RDD is made on the
    JVM with ``SparkContext.makeRDD(seq of (element, locations))``, each element the
    pickled item; a location is its ``str`` (``executor_<host>_<id>`` or a host).
    """
    from pyspark.rdd import RDD
    from pyspark.serializers import CPickleSerializer

    jvm = sc._jvm
    assert jvm is not None

    def scala_seq(values: Sequence[Any]) -> Any:
        java_list = jvm.java.util.ArrayList()
        for value in values:
            java_list.add(value)
        return jvm.scala.jdk.javaapi.CollectionConverters.asScala(java_list).toSeq()

    class_tag = jvm.scala.reflect.ClassTag.apply(jvm.java.lang.Class.forName("[B"))
    elements = [
        jvm.scala.Tuple2(bytearray(pickle.dumps(item)), scala_seq([str(loc) for loc in locs]))
        for item, locs in items
    ]
    jrdd = sc._jsc.sc().makeRDD(scala_seq(elements), class_tag)  # type: ignore[union-attr]
    return RDD(jrdd.toJavaRDD(), sc, CPickleSerializer())
