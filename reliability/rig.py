"""What a chaos or soak run starts on this machine, and the one teardown both use.

A :class:`Rig` starts a standalone cluster (Master + 2 Workers) and a ``redis-server`` with a
consumer group, and stops everything the run then hands it (the driver, producers, samplers)
in the reverse order, whatever way the run ends: each part is stopped even when stopping an
earlier one raised, and a driver still running is killed with its whole session (its JVM
with it). Every process is stopped by its PID; nothing is left on the machine.
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from types import TracebackType
from typing import Protocol, TypeVar

from reliability.cluster import StandaloneCluster
from reliability.driver import IngestDriver
from reliability.redis_source import Group, RedisServer

__all__ = ["Rig"]


class _Stoppable(Protocol):
    def stop(self) -> object: ...


S = TypeVar("S", bound=_Stoppable)


class Rig:
    """A cluster, a redis-server and a consumer group, and the teardown of everything.

    Use as a context manager; :meth:`keep` hands it anything with ``stop()``,
    :meth:`keep_driver` the run's driver.
    """

    def __init__(self, root: Path, stream: str, group: str) -> None:
        self.root, self._stream, self._group_name = root, stream, group
        self.cluster = StandaloneCluster(root / "cluster")
        self._stack = contextlib.ExitStack()
        self._redis: RedisServer | None = None
        self._group: Group | None = None

    def __enter__(self) -> Rig:
        try:
            self._stack.callback(self.cluster.stop)
            self.cluster.start()
            self._redis = RedisServer(self.root / "redis")
            self._stack.callback(self._redis.stop)
            self._group = Group(self._redis, self._stream, self._group_name)
            self._stack.callback(self._group.close)
        except BaseException:
            self._stack.close()
            raise
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._stack.close()

    @property
    def redis(self) -> RedisServer:
        if self._redis is None:
            raise RuntimeError("the rig is not started: use it in a `with` block")
        return self._redis

    @property
    def group(self) -> Group:
        if self._group is None:
            raise RuntimeError("the rig is not started: use it in a `with` block")
        return self._group

    def keep(self, part: S) -> S:
        """Stop ``part`` when the rig closes (before what was handed over earlier)."""
        self._stack.callback(part.stop)
        return part

    def keep_driver(self, driver: IngestDriver) -> IngestDriver:
        """Kill -9 ``driver``'s session when the rig closes, unless it has exited by then."""

        def kill() -> None:
            if driver.proc is not None and driver.exited() is None:
                driver.kill9()

        self._stack.callback(kill)
        return driver
