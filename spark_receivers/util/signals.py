"""Waits of the main thread that let Python signal handlers run (Ctrl-C, SIGTERM).

Linux gives a signal sent to a process to any of its threads that does not block it, and
a Spark driver has dozens (py4j, the listener bus, the block keepers' servers). When
another thread takes it, CPython only notes the signal; the handler runs once the main
thread executes Python code again. A main thread blocked in ``Event.wait()`` with no
timeout never does: the ``ingest`` of a fresh-clone test run on 2026-11-27 ignored a
Ctrl-C for 8 minutes that way. So the main thread waits in slices.
"""

from __future__ import annotations

import threading
import time

__all__ = ["SLICE_S", "wait_event"]

SLICE_S = 0.25
"""The longest the main thread sleeps before it runs the handlers of signals taken by
other threads: a Ctrl-C is seen within this."""


def wait_event(event: threading.Event, timeout_s: float | None = None) -> bool:
    """``event.wait(timeout_s)`` that a signal handler can interrupt from the main thread.

    On other threads (signal handlers never run there) this is ``event.wait``.
    """
    if threading.current_thread() is not threading.main_thread():
        return event.wait(timeout_s)
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    while True:
        left = SLICE_S if deadline is None else min(SLICE_S, deadline - time.monotonic())
        if left <= 0:
            return event.is_set()
        if event.wait(left):
            return True
