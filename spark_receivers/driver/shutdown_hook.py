"""Stop the streaming context gracefully on SIGTERM (``stop_gracefully_on_shutdown``)."""

from __future__ import annotations

import logging
import os
import signal
import threading
from collections.abc import Callable
from typing import Any

__all__ = ["SigtermHook"]

log = logging.getLogger(__name__)


class SigtermHook:
    """While installed, SIGTERM runs ``stop()`` on a thread of its own.

    Once ``is_stopped()`` is true, SIGTERM does what it did before the hook (the
    previous handler, or the default: the process ends). Python runs signal handlers
    on the main thread only, so :meth:`install` and :meth:`restore` act only there
    (``install`` elsewhere logs a warning and does nothing).
    """

    def __init__(self, stop: Callable[[], None], is_stopped: Callable[[], bool]) -> None:
        self._stop = stop
        self._is_stopped = is_stopped
        self._previous: Any = None

    def install(self) -> None:
        """Take over SIGTERM; idempotent."""
        if threading.current_thread() is not threading.main_thread():
            log.warning("stop_gracefully_on_shutdown needs start() on the main thread; ignored")
            return
        if self._previous is not None:
            return
        previous = signal.getsignal(signal.SIGTERM)

        def on_sigterm(signum: int, frame: Any) -> None:
            if self._is_stopped():
                # Stopped already: behave as without us (handlers run on the main
                # thread, where signal.signal works, so restore here).
                signal.signal(signal.SIGTERM, previous)
                if callable(previous):
                    previous(signum, frame)
                elif previous == signal.SIG_DFL:
                    os.kill(os.getpid(), signal.SIGTERM)
                return
            log.warning("SIGTERM: stopping the streaming context gracefully")
            # Never block inside a signal handler: stop on a thread of its own.
            threading.Thread(target=self._stop, name="streaming-shutdown").start()

        signal.signal(signal.SIGTERM, on_sigterm)
        self._previous = previous

    def restore(self) -> None:
        """Give SIGTERM back its previous handler (on the main thread); idempotent."""
        previous, self._previous = self._previous, None
        if previous is not None and threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, previous)
