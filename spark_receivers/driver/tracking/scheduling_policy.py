"""Where receivers run: the driver's placement of receivers on executors.

Placement happens in two phases, as in Spark Streaming:

* **Global scheduling** (:meth:`ReceiverSchedulingPolicy.schedule_receivers`) when the
  tracker starts: every receiver gets a list of candidate locations so that receivers are
  spread evenly over the executors while preferred hosts are respected. The tracker stores
  the candidates in :attr:`ReceiverTrackingInfo.scheduled_locations` and refuses a
  registration from an executor outside them.
* **Local scheduling** (:meth:`ReceiverSchedulingPolicy.reschedule_receiver`) when one
  receiver restarts or registers without candidates: the executors are weighted by the
  receivers already running or scheduled on them, and the idle (or least-loaded) ones are
  returned.

Locations are strings on the wire (Spark's ``getPreferredLocations`` form):
``executor_<host>_<executor id>`` for an executor and the bare host for a host.
:func:`parse_task_location` turns such a string back into a location object.

Everything here is pure and synchronous: no I/O, no locks, safe to call from any thread.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol, TypeAlias

__all__ = [
    "ExecutorCacheTaskLocation",
    "HostTaskLocation",
    "ReceiverLike",
    "ReceiverSchedulingPolicy",
    "ReceiverState",
    "ReceiverTrackingInfo",
    "TaskLocation",
    "parse_task_location",
]

_EXECUTOR_TAG = "executor_"
# Spark's HDFS-cache tag. HDFS caching does not exist here; such a location still names a
# host, so it is read as that host.
_HDFS_CACHE_TAG = "hdfs_cache_"


@dataclass(frozen=True, slots=True)
class ExecutorCacheTaskLocation:
    """One executor: a host and the executor's id on it.

    ``str()`` gives Spark's form ``executor_<host>_<executor_id>``, which
    :func:`parse_task_location` reads back.
    """

    host: str
    executor_id: str

    def __str__(self) -> str:
        return f"{_EXECUTOR_TAG}{self.host}_{self.executor_id}"


@dataclass(frozen=True, slots=True)
class HostTaskLocation:
    """A host, any executor on it. ``str()`` is the bare host name."""

    host: str

    def __str__(self) -> str:
        return self.host


TaskLocation: TypeAlias = ExecutorCacheTaskLocation | HostTaskLocation
"""A place a receiver may run: one executor, or any executor of a host."""


def parse_task_location(location: str) -> TaskLocation:
    """Parse a location string in Spark's form.

    ``executor_<host>_<id>`` gives an :class:`ExecutorCacheTaskLocation` (the host ends at
    the first ``_`` after the tag: host names cannot contain ``_``); anything else is a
    :class:`HostTaskLocation`. Spark's ``hdfs_cache_<host>`` is read as that host.

    >>> parse_task_location("executor_node1_7")
    ExecutorCacheTaskLocation(host='node1', executor_id='7')
    >>> parse_task_location("node1")
    HostTaskLocation(host='node1')

    Raises:
        ValueError: the string is empty, or has the executor tag but no host or id.
    """
    if not location:
        msg = "a task location must be a host or executor_<host>_<id>, got an empty string"
        raise ValueError(msg)
    if location.startswith(_HDFS_CACHE_TAG):
        return parse_task_location(location.removeprefix(_HDFS_CACHE_TAG))
    if location.startswith(_EXECUTOR_TAG):
        host, sep, executor_id = location.removeprefix(_EXECUTOR_TAG).partition("_")
        if not sep or not host or not executor_id:
            msg = f"an executor location must look like executor_<host>_<id>, got {location!r}"
            raise ValueError(msg)
        return ExecutorCacheTaskLocation(host, executor_id)
    return HostTaskLocation(location)


class ReceiverState(enum.Enum):
    """Where a receiver is in its life, as seen by the driver.

    INACTIVE (not scheduled, or stopped) → SCHEDULED (candidate locations chosen, its job
    submitted) → ACTIVE (registered from an executor) → INACTIVE again when it stops or is
    restarted elsewhere.
    """

    INACTIVE = 0
    SCHEDULED = 1
    ACTIVE = 2


@dataclass(frozen=True, slots=True)
class ReceiverTrackingInfo:
    """What the driver knows about one receiver; an immutable snapshot.

    A SCHEDULED receiver has ``scheduled_locations``; an ACTIVE one has
    ``running_executor``. Build a changed copy with :func:`dataclasses.replace`.

    Raises:
        ValueError: at construction, if a SCHEDULED receiver has no scheduled locations or
            an ACTIVE one has no running executor.
    """

    receiver_id: int
    state: ReceiverState
    scheduled_locations: tuple[TaskLocation, ...] | None
    running_executor: ExecutorCacheTaskLocation | None
    name: str | None = None
    endpoint: str | None = None
    error_message: str | None = None
    error_time_ms: int | None = None

    def __post_init__(self) -> None:
        if self.state is ReceiverState.SCHEDULED and self.scheduled_locations is None:
            msg = f"receiver {self.receiver_id} is SCHEDULED but has no scheduled_locations"
            raise ValueError(msg)
        if self.state is ReceiverState.ACTIVE and self.running_executor is None:
            msg = f"receiver {self.receiver_id} is ACTIVE but has no running_executor"
            raise ValueError(msg)


class ReceiverLike(Protocol):
    """What the policy needs from a receiver: its stream id and preferred host (or None)."""

    @property
    def stream_id(self) -> int:
        """The id of the receiver's input stream."""
        ...

    @property
    def preferred_location(self) -> str | None:
        """The host (or location string) the receiver should run on, if any."""
        ...


class ReceiverSchedulingPolicy:
    """Spread receivers evenly over executors, honouring preferred hosts.

    Stateless and thread-safe: every call works only on its arguments. Ties are broken by
    the order of ``executors`` (then of ``receivers``), so results are deterministic.

    Example::

        policy = ReceiverSchedulingPolicy()
        executors = [ExecutorCacheTaskLocation(f"node{i}", str(i)) for i in (1, 2)]
        placement = policy.schedule_receivers(receivers, executors)  # {stream_id: [locations]}
    """

    def schedule_receivers(
        self,
        receivers: Sequence[ReceiverLike],
        executors: Sequence[ExecutorCacheTaskLocation],
    ) -> dict[int, list[TaskLocation]]:
        """Choose candidate locations for every receiver at start-up.

        1. A receiver with a preferred host gets that host's executor with the fewest
           receivers so far; a host without executors (not up yet, or gone) is kept as a
           :class:`HostTaskLocation`.
        2. Every receiver still without a candidate gets the executor with the fewest
           receivers so far, which deals them out round-robin.
        3. Every executor left idle is added to the receiver with the fewest candidates, so
           a restarted receiver has somewhere else to go.

        Returns a dict from stream id to its candidates (in ``receivers`` order); the lists
        are empty when there are no executors, and the dict is empty when there are no
        receivers.

        Raises:
            ValueError: two receivers have the same stream id.
        """
        _check_unique_ids(receivers)
        if not receivers:
            return {}
        if not executors:
            return {r.stream_id: [] for r in receivers}

        executors_on_host: dict[str, list[ExecutorCacheTaskLocation]] = {}
        # Insertion order = order of ``executors``: min() then breaks ties by that order.
        load: dict[ExecutorCacheTaskLocation, int] = {}
        for executor in executors:
            if executor not in load:
                load[executor] = 0
                executors_on_host.setdefault(executor.host, []).append(executor)

        candidates: list[list[TaskLocation]] = [[] for _ in receivers]

        for chosen, receiver in zip(candidates, receivers, strict=True):
            host = receiver.preferred_location
            if host is None:
                continue
            on_host = executors_on_host.get(host)
            if on_host:
                least_loaded = min(on_host, key=load.__getitem__)
                chosen.append(least_loaded)
                load[least_loaded] += 1
            else:
                # The host may come up later, or it is not in the cluster: keep it as a host
                # preference and let the task scheduler decide.
                chosen.append(parse_task_location(host))

        for chosen in candidates:
            if not chosen:
                least_loaded = min(load, key=load.__getitem__)
                chosen.append(least_loaded)
                load[least_loaded] += 1

        for executor in [e for e, n in load.items() if n == 0]:
            min(candidates, key=len).append(executor)

        return {r.stream_id: chosen for r, chosen in zip(receivers, candidates, strict=True)}

    def reschedule_receiver(
        self,
        receiver_id: int,
        preferred_location: str | None,
        receiver_tracking_info_map: Mapping[int, ReceiverTrackingInfo],
        executors: Sequence[ExecutorCacheTaskLocation],
    ) -> list[TaskLocation]:
        """Choose candidate locations for one receiver that (re)starts or registers.

        Each executor gets a weight from the receivers in ``receiver_tracking_info_map``:
        an ACTIVE receiver adds 1.0 to its running executor; a SCHEDULED one adds
        ``1 / len(scheduled_locations)`` to each executor among its candidates; an
        INACTIVE one adds nothing. (The caller marks the restarting receiver INACTIVE
        first, so it does not weigh against itself; ``receiver_id`` is informational.)

        Returns the preferred location (if any), then the idle executors (weight 0) if
        there are any, else every executor of minimum weight; without executors, an empty
        list (the receiver may run anywhere). Candidates are listed in ``executors`` order.

        Unlike Spark, which also ranks executors that are in the weights but no longer in
        ``executors``, only the given (live) executors are ever returned.
        """
        del receiver_id  # Spark's signature carries it; the weights do not depend on it.
        if not executors:
            return []

        chosen: dict[TaskLocation, None] = {}  # an ordered set
        if preferred_location is not None:
            chosen[parse_task_location(preferred_location)] = None

        weights = _executor_weights(receiver_tracking_info_map.values())
        live = list(dict.fromkeys(executors))
        idle = [e for e in live if e not in weights]
        if idle:
            chosen.update(dict.fromkeys(idle))
        else:
            min_weight = min(weights[e] for e in live)
            chosen.update(dict.fromkeys(e for e in live if weights[e] == min_weight))
        return list(chosen)


def _executor_weights(
    infos: Iterable[ReceiverTrackingInfo],
) -> dict[ExecutorCacheTaskLocation, float]:
    """Sum, per executor, how likely each tracked receiver is to run there."""
    weights: dict[ExecutorCacheTaskLocation, float] = {}
    for info in infos:
        match info.state:
            case ReceiverState.ACTIVE if info.running_executor is not None:
                weights[info.running_executor] = weights.get(info.running_executor, 0.0) + 1.0
            case ReceiverState.SCHEDULED if info.scheduled_locations:
                # Host-only candidates count in the share but weigh on no executor.
                share = 1.0 / len(info.scheduled_locations)
                for location in info.scheduled_locations:
                    if isinstance(location, ExecutorCacheTaskLocation):
                        weights[location] = weights.get(location, 0.0) + share
            case _:
                pass
    return weights


def _check_unique_ids(receivers: Sequence[ReceiverLike]) -> None:
    seen: set[int] = set()
    for receiver in receivers:
        if receiver.stream_id in seen:
            msg = f"two receivers have stream id {receiver.stream_id}; stream ids must be unique"
            raise ValueError(msg)
        seen.add(receiver.stream_id)
