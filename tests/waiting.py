"""Waiting in tests: poll a condition, bounded in time, instead of sleeping a fixed time."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable


def wait_until(
    predicate: Callable[[], object], timeout_s: float = 15.0, interval_s: float = 0.05
) -> bool:
    """Poll ``predicate`` every ``interval_s`` until it holds or ``timeout_s`` passes.

    Whether it held: it is asked once more at the deadline, so a condition that became
    true while the last pause ran is not reported as a timeout.
    """
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        threading.Event().wait(interval_s)
    return bool(predicate())
