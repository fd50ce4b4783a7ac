"""PySpark's worker daemon with the modules of our tasks imported once, before it forks.

Spark starts a Python daemon per executor (and kind of task environment) and the daemon
forks a worker for every task slot that needs one. Each forked worker then imports what its
task needs: a receiver's, a block keeper's or a batch read's task imports pyarrow (and
numpy), Arrow Flight and our task modules, 1.1-1.3 s of CPU in every worker on a 2-core
machine. A receiver that restarts, a batch read that needs one more worker and every new
executor pay it again (the test suite forks some 500 workers: their imports were a quarter
of its CPU; decision 0020 says how much of that this saves, since each daemon pays them
once, about 1 s).

With ``spark.python.daemon.module=spark_receivers.spark.worker_daemon`` (the command line
sets it for the sessions it starts; docs/deploy.md) the daemon imports them once and every
worker starts with them already loaded, its pages shared copy-on-write with the daemon.
What the imports made is then frozen out of the cyclic collector
(:func:`spark_receivers.spark.worker_heap.freeze_heap`), so the full collection PySpark
runs after each task of a reused worker does not walk it.

Why PySpark's own daemon imports nothing heavy: a fork copies only the thread that calls
it, so a library that started threads at import would leave each worker with locks held by
threads that do not exist in it. After its imports this daemon lists its threads
(``/proc/self/task``). One is expected: pyarrow's jemalloc starts its background thread
(``jemalloc_bg_thd``) at import, and jemalloc is made to be forked (it takes its locks
before a fork and resets them in the child, which runs without that thread). Any other
thread (numpy's OpenBLAS pool when ``OMP_NUM_THREADS`` is above 1, say: PySpark sets it to
``spark.task.cpus``) and the daemon does not fork from this state: it replaces itself
(``exec``: same PID, same pipes to the executor) with PySpark's plain daemon, which is what
runs without this setting. A failed import does the same.

Before its imports it takes off ``sys.path`` what Spark put there for a Spark without an
installed PySpark: ``$SPARK_HOME/python/lib/pyspark.zip``, the py4j zip beside it and
Spark's core jar. Spark always puts them first on its workers' ``PYTHONPATH``; when PySpark is
pip-installed, ``SPARK_HOME`` is the installed package itself, the zip holds the same files
and the installed py4j is the zip's version. From the zip, PySpark's modules are compiled
from source in every daemon (a zip keeps no bytecode: 2.2 CPU-s to import what takes 0.8
from the installed files), and every new worker's first task re-read the directories of
the zip and of the 6,000-entry jar (PySpark clears the import caches when a task adds its
files to ``sys.path``: 0.29 CPU-s a worker). Measured on a 2-core machine, 2026-11-29.
"""

from __future__ import annotations

import importlib
import importlib.machinery
import importlib.metadata
import os
import sys
import threading

__all__ = [
    "FORK_SAFE_THREADS",
    "PRELOADED",
    "main",
    "preload",
    "redundant_spark_paths",
    "threads",
]

PRELOADED = (
    "pyarrow",
    "pyarrow.flight",
    "pyspark.worker",
    "pyspark.sql.pandas.serializers",
    "spark_receivers.spark.block_fetch",
    "spark_receivers.spark.block_source",
    "spark_receivers.spark.keeper_task",
    "spark_receivers.spark.receiver_task",
)
"""What a worker of our tasks imports (a batch read's ``mapInArrow``, a receiver's and a
block keeper's task: each had all of these, numpy through pyarrow, and none had pandas).
Each import here is paid once per daemon, whether its workers need it or not: the suite's
daemons forked 2-3 workers each, so a module few workers import costs more than it saves."""


FORK_SAFE_THREADS = frozenset({"jemalloc_bg_thd"})
"""Threads (by their kernel name) a fork may leave behind: jemalloc's background thread."""


def redundant_spark_paths(path: list[str], spark_home: str | None) -> list[str]:
    """The entries of ``path`` that Spark added for workers and the installed PySpark replaces.

    Only when ``spark_home`` is the directory of the ``pyspark`` package found on the rest
    of ``path`` (a pip-installed PySpark: the zip was built from the same files): its
    ``python/lib/pyspark.zip``, its ``jars/spark-core_*.jar`` (Spark adds the jar that holds
    its Python runner; no Python module is in it), and its py4j zip when the installed py4j
    has the zip's version. Anything else (a Spark distribution beside another PySpark, a
    user's zip) stays.
    """
    if not spark_home:
        return []
    home = os.path.realpath(spark_home)

    def under(entry: str, folder: str, prefix: str, suffix: str) -> bool:
        name = os.path.basename(entry)
        inside = os.path.realpath(os.path.dirname(entry)) == os.path.join(home, folder)
        return inside and name.startswith(prefix) and name.endswith(suffix)

    spark_zips = [p for p in path if under(p, "python/lib", "pyspark.zip", ".zip")]
    py4j_zips = [p for p in path if under(p, "python/lib", "py4j-", "-src.zip")]
    core_jars = [p for p in path if under(p, "jars", "spark-core_", ".jar")]
    if not spark_zips:
        return []
    spark_added = {*spark_zips, *py4j_zips, *core_jars}
    rest = [p for p in path if p not in spark_added]
    spec = importlib.machinery.PathFinder.find_spec("pyspark", rest)
    places = list(spec.submodule_search_locations or []) if spec is not None else []
    if not any(os.path.realpath(p) == home for p in places):
        return []
    found = [*spark_zips, *core_jars]
    if py4j_zips and importlib.machinery.PathFinder.find_spec("py4j", rest) is not None:
        try:
            version = importlib.metadata.version("py4j")
        except importlib.metadata.PackageNotFoundError:
            version = None
        found += [p for p in py4j_zips if os.path.basename(p) == f"py4j-{version}-src.zip"]
    return found


def threads() -> list[str] | None:
    """The names of this process's threads but the calling one; None where it cannot say."""
    me = str(threading.get_native_id())
    try:
        names = []
        for tid in os.listdir("/proc/self/task"):
            if tid != me:
                with open(f"/proc/self/task/{tid}/comm", encoding="utf-8") as f:
                    names.append(f.read().strip())
    except OSError:
        return None
    return names


def preload(modules: tuple[str, ...] = PRELOADED) -> str | None:
    """Import ``modules``; why this process must not fork from here, or None if it may."""
    for name in modules:
        try:
            importlib.import_module(name)
        except Exception as e:  # noqa: BLE001 - the plain daemon runs instead
            return f"importing {name} failed: {e!r}"
    others = threads()
    if others is None:
        return "cannot list this process's threads (no /proc/self/task)"
    unsafe = [name for name in others if name not in FORK_SAFE_THREADS]
    if unsafe:
        return f"the imports started threads a fork would lose: {', '.join(unsafe)}"
    return None


def main() -> None:
    """Preload, then run PySpark's daemon here, or exec PySpark's plain one."""
    redundant = redundant_spark_paths(sys.path, os.environ.get("SPARK_HOME"))
    sys.path[:] = [p for p in sys.path if p not in redundant]
    reason = preload()
    if reason is not None:
        print(
            f"spark_receivers.spark.worker_daemon: {reason}; running pyspark.daemon instead",
            file=sys.stderr,
            flush=True,
        )
        os.execv(sys.executable, [sys.executable, "-m", "pyspark.daemon", *sys.argv[1:]])
    from pyspark import daemon

    from spark_receivers.spark.worker_heap import freeze_heap

    freeze_heap()
    daemon.manager()


if __name__ == "__main__":
    main()
