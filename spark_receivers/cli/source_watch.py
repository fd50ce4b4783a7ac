"""``ingest --unreachable-timeout``: end a run whose source server stays unreachable.

A receiver whose server (socket, Redis, MQTT) cannot be reached keeps restarting
with backoff, and the restart policy fails the context only after minutes. For
the command that is a run that reads nothing and, stopped by ``--seconds``, would
exit 0. :class:`SourceWatch` lets it end sooner and say why: the server counts as
unreachable when **both** the receiver keeps reporting errors (one within the last
minute), with no new record received, **and** the command cannot open a TCP
connection to it, for ``--unreachable-timeout``. Requiring both keeps a driver
outside the executors' network (which cannot reach a server they can) from ending
a healthy run; probing only while the receiver fails keeps a healthy run from
opening connections of its own.

No Spark here: the caller gives it the receiver's :class:`ReceiverStatus`.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Callable

from spark_receivers.driver.observe.status import ReceiverStatus

__all__ = ["REACH_TIMEOUT_S", "SourceWatch", "unreachable"]

REACH_TIMEOUT_S = 2.0


def unreachable(host: str, port: int, timeout_s: float = REACH_TIMEOUT_S) -> str | None:
    """Why a TCP connection to ``host:port`` cannot be opened now; None when it can."""
    try:
        with socket.create_connection((host, port), timeout=timeout_s):
            return None
    except OSError as e:
        return e.strerror or str(e) or type(e).__name__


class SourceWatch:
    """Whether a source's server has been unreachable for ``timeout_s``, the receiver failing.

    Call :meth:`check` now and then (every ``probe_every_s``) from one thread. The
    server is probed only while the receiver is failing (an error within the last
    ``recent_error_s``, or ``timeout_s`` if longer): a healthy run opens no
    connections of its own (a broker logs each one). ``probe``, ``monotonic`` and
    ``wall_ms`` are injectable for tests.
    """

    probe_every_s = 2.0
    recent_error_s = 60.0
    """An error this recent means the receiver is failing (its backoff is 30 s at most
    by default, so a receiver that keeps failing reports more often than that)."""

    def __init__(
        self,
        server: tuple[str, int],
        timeout_s: float,
        *,
        probe: Callable[[str, int], str | None] = unreachable,
        monotonic: Callable[[], float] = time.monotonic,
        wall_ms: Callable[[], int] = lambda: int(time.time() * 1000),
    ) -> None:
        if not timeout_s > 0:
            msg = f"timeout_s must be > 0, got {timeout_s!r}"
            raise ValueError(msg)
        self.server = server
        self.timeout_s = timeout_s
        self._probe = probe
        self._monotonic = monotonic
        self._wall_ms = wall_ms
        self._since: float | None = None
        """When the server was first found unreachable in the current streak (monotonic)."""
        self._records_at = 0
        self._problem = ""

    def check(self, receiver: ReceiverStatus) -> str | None:
        """Probe the server if the receiver fails; the reason to end the run once it is time."""
        if receiver.records > self._records_at or not self._failing(receiver):
            self._since = None  # records came in, or no recent error: not down
            self._records_at = receiver.records
            return None
        problem = self._probe(*self.server)
        if problem is None:
            self._since = None
            return None
        self._problem = problem
        if self._since is None:
            self._since = self._monotonic()
        if self._monotonic() - self._since < self.timeout_s:
            return None
        return self.reason(receiver)

    def down_at_stop(self, receiver: ReceiverStatus) -> str | None:
        """At the end of a run: the reason, if the server is unreachable and the receiver failing.

        A run stopped as asked while its source could not be reached did not do its
        job, even before ``timeout_s`` passed.
        """
        if self._since is None:
            return None  # reachable at the last check, or never checked
        if receiver.records > self._records_at or not self._failing(receiver):
            return None
        problem = self._probe(*self.server)
        if problem is None:
            return None
        self._problem = problem
        return self.reason(receiver)

    def _failing(self, receiver: ReceiverStatus) -> bool:
        window_ms = round(max(self.timeout_s, self.recent_error_s) * 1000)
        return (
            bool(receiver.last_error_message)
            and receiver.last_error_time_ms >= self._wall_ms() - window_ms
        )

    def reason(self, receiver: ReceiverStatus) -> str:
        """One line: the server, how long, why, and the receiver's last error."""
        host, port = self.server
        down_s = 0.0 if self._since is None else self._monotonic() - self._since
        last = " ".join(receiver.last_error_message.split())
        return (
            f"the source's server {host}:{port} has been unreachable for {down_s:.0f}s "
            f"({self._problem}); the receiver's last error: {last}"
        )
