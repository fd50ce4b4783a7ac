"""The objects a Python worker keeps for life, frozen out of the cyclic garbage collector.

PySpark's daemon makes a reused worker run ``gc.collect()`` after every task: a full
collection that walks every tracked object of the process. A worker that has run a batch
read holds some 75,000 of them, nearly all from its imports (pyarrow, PySpark's SQL and
serializer modules, compiled from PySpark's zip when Spark puts it first on the path), and
a full collection over them took 30-35 ms of CPU; with up to four read tasks a batch, the
batch read's workers spent over half their CPU in that collector (``perf``, 2026-11-30).
``gc.freeze()`` moves every object alive at the call into a generation no collection
walks; reference counting still frees them, only a cycle among them is never collected.

- :func:`freeze_heap`: collect, then freeze (our worker daemon calls it once its imports
  are done, before the first fork, so workers inherit the frozen state).
- :func:`freeze_in_task`: the same, once per process and only inside a Spark task (a
  worker forked by PySpark's own daemon, or by ours after the imports of its first task).
  The read paths call it first thing; in a driver or a test it does nothing.

What the first task has alive at that point (its function, its deserializers) is frozen
with the imports; a cycle among them would stay, once per worker. Objects made later are
collected as before.
"""

from __future__ import annotations

import gc
import os

__all__ = ["freeze_heap", "freeze_in_task"]

_frozen_in: int | None = None  # the pid that froze its heap last (a fork inherits it)


def freeze_heap() -> int:
    """Collect what is garbage now, then freeze the rest; how many objects are frozen."""
    global _frozen_in
    gc.collect()
    gc.freeze()
    _frozen_in = os.getpid()
    return gc.get_freeze_count()


def freeze_in_task() -> bool:
    """:func:`freeze_heap` once per process, in a Spark task only; True when it froze now."""
    if _frozen_in == os.getpid():
        return False
    from pyspark import TaskContext

    if TaskContext.get() is None:  # a driver, a test: its collections are its own
        return False
    freeze_heap()
    return True
