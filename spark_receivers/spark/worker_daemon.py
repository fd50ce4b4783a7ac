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
"""

from __future__ import annotations

import importlib
import os
import sys
import threading

__all__ = ["FORK_SAFE_THREADS", "PRELOADED", "main", "preload", "threads"]

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
    reason = preload()
    if reason is not None:
        print(
            f"spark_receivers.spark.worker_daemon: {reason}; running pyspark.daemon instead",
            file=sys.stderr,
            flush=True,
        )
        os.execv(sys.executable, [sys.executable, "-m", "pyspark.daemon", *sys.argv[1:]])
    from pyspark import daemon

    daemon.manager()


if __name__ == "__main__":
    main()
