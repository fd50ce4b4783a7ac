"""How often a receiver may fail and be restarted before the context gives up on it.

A receiver that can never work (its port is taken, a poison record it must
fail on, a broker that stays down) would otherwise restart for ever: the
stream goes quiet and nothing says why. The tracker counts every **failure
followed by a restart** of each receiver (see :class:`RestartCounter`); once
more than ``max_restarts`` of them fall within ``window_ms``, the context fails
with the last failure as its cause.

What counts as one failure, as the driver sees it: a ``DeregisterReceiver``
that carries an error (the receiver stopped or restarted itself after an
error), or a receiver job that failed or ended without deregistering. The
two often come together (a receiver stopped with an error and then its task
failed): a failure is counted once, until the receiver runs again (a new
registration or a new job).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from spark_receivers.config import StreamingConfig

__all__ = ["RestartCounter", "RestartPolicy"]


@dataclass(frozen=True)
class RestartPolicy:
    """At most ``max_restarts`` restarts within ``window_ms`` (``-1``: no limit)."""

    max_restarts: int = 20
    window_ms: int = 600_000

    @classmethod
    def of(cls, config: StreamingConfig) -> RestartPolicy:
        """The policy of ``spark.receivers.receiver.maxRestarts`` and ``.restartWindow``."""
        return cls(config.receiver_max_restarts, round(config.receiver_restart_window_s * 1000))

    def describe(self) -> str:
        """The policy with its Spark keys, as error messages name it."""
        return (
            f"spark.receivers.receiver.maxRestarts={self.max_restarts}, "
            f"spark.receivers.receiver.restartWindow={self.window_ms / 1000:g}s"
        )


class RestartCounter:
    """One receiver's recent failures under a :class:`RestartPolicy`.

    Not thread-safe: the tracker calls it under its lock.
    """

    def __init__(self, policy: RestartPolicy) -> None:
        self.policy = policy
        self._times: deque[int] = deque()
        self._pending = False
        self.gave_up = False
        """True once the policy was exceeded: the receiver must not run again."""

    def failed(self, now_ms: int) -> bool:
        """Count a failure (once until :meth:`running`); True when the policy is now exceeded."""
        if self._pending or self.gave_up:
            return False
        self._pending = True
        self._times.append(now_ms)
        while self._times and self._times[0] <= now_ms - self.policy.window_ms:
            self._times.popleft()
        limit = self.policy.max_restarts
        if limit >= 0 and len(self._times) > limit:
            self.gave_up = True
            return True
        return False

    def running(self) -> None:
        """The receiver runs again (registered, or its job was launched)."""
        self._pending = False

    @property
    def recent(self) -> int:
        """Failures counted within the window as of the last one."""
        return len(self._times)


def give_up_error(stream_id: int, name: str, counter: RestartCounter, last: str) -> Exception:
    """The error a context fails with once ``counter`` gave up; ``last``: the last failure."""
    from spark_receivers.errors import ReceiverError

    policy = counter.policy
    msg = (
        f"receiver {stream_id} ({name}) failed {counter.recent} times within "
        f"{policy.window_ms / 1000:g}s and is not restarted again ({policy.describe()}); "
        f"last failure: {last}"
    )
    return ReceiverError(msg)
