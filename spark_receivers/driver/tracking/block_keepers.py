"""The driver's view of the block keepers: where they are, replica targets, losses.

Every executor runs one block keeper per context
(:mod:`spark_receivers.receiver.block_keeper`): supervisors start the keeper of
their executor, and on a cluster the driver starts one on every other executor
with a short Spark job (:mod:`spark_receivers.spark.keeper_task`), again whenever
an executor without one appears (one replacing an executor that died, say).

:class:`BlockKeepers` answers the tracker endpoint's keeper messages (gRPC
threads):

* ``RegisterBlockKeeper``: a keeper serves blocks on an executor;
* ``GetReplicaTargets``: the keepers a receiver may copy its blocks to — those on
  live executors other than its own, rotated by stream id so that receivers
  spread their replicas;
* ``ReportReplication``: a receiver's blocks got fewer (or again all) of their
  copies: posted to listeners as ``on_replication_changed``, kept for ``status()``;
* ``ReportLostBlock``: a batch ran without a block in no store
  (``lostBlockPolicy=skip``): posted as ``on_block_lost``, counted.

When the context stops, :meth:`BlockKeepers.release` tells every keeper to drop
its blocks and end (through the outbox, never under a lock).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from spark_receivers.config import StreamingConfig
from spark_receivers.driver.observe.listener import (
    BlockLost,
    BlockLostInfo,
    ListenerBus,
    ReplicationChanged,
    ReplicationInfo,
)
from spark_receivers.driver.tracking.receiver_launcher import alive_executors
from spark_receivers.driver.tracking.receiver_outbox import ReceiverOutbox
from spark_receivers.driver.tracking.scheduling_policy import ExecutorCacheTaskLocation
from spark_receivers.errors import RpcError
from spark_receivers.receiver.receiver import Receiver
from spark_receivers.receiver.storage_level import StorageLevel
from spark_receivers.rpc import messages as m
from spark_receivers.spark.cluster import is_local_master
from spark_receivers.spark.keeper_task import KeeperTaskSpec, make_keeper_task
from spark_receivers.spark.session_kind import SparkSide, spark_side
from spark_receivers.util.clock import Clock, SystemClock

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

log = logging.getLogger(__name__)

__all__ = [
    "KEEPER_TRACKER_MESSAGES",
    "BlockKeepers",
    "KeeperStarter",
    "keeper_starter",
    "start_keepers",
]

KEEPER_TRACKER_MESSAGES = (
    m.RegisterBlockKeeper,
    m.GetReplicaTargets,
    m.ReportReplication,
    m.ReportLostBlock,
)
"""The tracker messages :meth:`BlockKeepers.handle` answers."""

ALIVE_CACHE_MS = 2000
"""How long the list of live executors is reused (asking is a call into the JVM)."""


class BlockKeepers:
    """Registry of block keepers and replication state; see the module doc. Thread-safe.

    ``alive_executors()`` lists the executors alive now; ``batch_of(block_id)``
    finds the batch a block was allocated to (-1 when none).
    """

    def __init__(
        self,
        bus: ListenerBus,
        outbox: ReceiverOutbox,
        alive_executors: Callable[[], Sequence[ExecutorCacheTaskLocation]],
        batch_of: Callable[[str], int],
        clock: Clock | None = None,
    ) -> None:
        self._bus = bus
        self._outbox = outbox
        self._alive_executors = alive_executors
        self._batch_of = batch_of
        self._clock = clock or SystemClock()
        self._lock = threading.Lock()
        self._keepers: dict[str, str] = {}
        self._alive: set[str] = set()
        self._alive_at: int | None = None
        self._copies: dict[int, tuple[int, int]] = {}
        self._lost: dict[str, int] = {}
        self._released = False

    # --- the endpoint (gRPC threads) -----------------------------------------------

    def handle(self, message: Any) -> Any:
        """Answer one keeper message (see the module doc)."""
        match message:
            case m.RegisterBlockKeeper(executor_id=executor, endpoint=endpoint):
                return self.register(executor, endpoint)
            case m.GetReplicaTargets(stream_id=sid, executor_id=executor):
                return self.targets(sid, executor)
            case m.ReportReplication(stream_id=sid, wanted=w, achieved=a, message=text):
                self._replication(sid, w, a, text)
                return None
            case m.ReportLostBlock(stream_id=sid, block_id=b, num_records=n, reason=why):
                self._lost_block(sid, b, n, why)
                return None
        msg = f"unexpected message {message!r:.100}"
        raise RpcError(msg)

    def register(self, executor_id: str, endpoint: str) -> bool:
        """A keeper serves on ``executor_id`` at ``endpoint`` (a newer one replaces it)."""
        with self._lock:
            if self._released:
                return False
            before = self._keepers.get(executor_id)
            self._keepers[executor_id] = endpoint
        if before != endpoint:
            log.info("block keeper of executor %s at %s", executor_id, endpoint)
        return True

    def targets(self, stream_id: int, executor_id: str) -> list[str]:
        """Keepers on live executors other than ``executor_id``, rotated by ``stream_id``."""
        alive = self._live_executor_ids()
        with self._lock:
            found = [
                endpoint
                for executor, endpoint in sorted(self._keepers.items())
                if executor != executor_id and executor in alive
            ]
        if not found:
            return found
        k = stream_id % len(found)
        return found[k:] + found[:k]

    def _live_executor_ids(self) -> set[str]:
        now = self._clock.get_time_ms()
        with self._lock:
            if self._alive_at is not None and now - self._alive_at < ALIVE_CACHE_MS:
                return set(self._alive)
        alive = {e.executor_id for e in self._alive_executors()}
        with self._lock:
            self._alive, self._alive_at = alive, now
        return alive

    def _replication(self, stream_id: int, wanted: int, achieved: int, text: str) -> None:
        with self._lock:
            self._copies[stream_id] = (achieved, wanted)
        if achieved < wanted:
            log.warning("receiver %d: %s", stream_id, text)
        info = ReplicationInfo(stream_id, wanted, achieved, text, self._clock.get_time_ms())
        self._bus.post(ReplicationChanged(info))

    def _lost_block(self, stream_id: int, block_id: str, records: int, reason: str) -> None:
        with self._lock:
            if block_id in self._lost:
                return  # read again by a second action: counted once
            self._lost[block_id] = records
        batch = self._batch_of(block_id)
        log.error("batch %d ran without lost block %s (%d records)", batch, block_id, records)
        self._bus.post(BlockLost(BlockLostInfo(batch, stream_id, block_id, records, reason)))

    # --- views and stop ------------------------------------------------------------------

    def keepers(self) -> dict[str, str]:
        """Executor id → keeper endpoint, for every keeper registered."""
        with self._lock:
            return dict(self._keepers)

    def missing(self, executors: Sequence[ExecutorCacheTaskLocation]) -> list[Any]:
        """The executors of ``executors`` without a registered keeper."""
        with self._lock:
            return [e for e in executors if e.executor_id not in self._keepers]

    def copies(self) -> dict[int, tuple[int, int]]:
        """Per stream, ``(copies, wanted)`` as its receiver last reported."""
        with self._lock:
            return dict(self._copies)

    def lost(self) -> tuple[int, int]:
        """Blocks and records that batches ran without."""
        with self._lock:
            return len(self._lost), sum(self._lost.values())

    def release(self) -> None:
        """Tell every keeper to drop its blocks and end; later registrations are refused."""
        with self._lock:
            self._released = True
            endpoints = sorted(set(self._keepers.values()))
        for endpoint in endpoints:
            self._outbox.send(endpoint, m.ReleaseKeeper())


class KeeperStarter:
    """Starts keepers on executors that have none: at once, then every ``interval_s``.

    ``start(executors)`` runs the keeper job (on Spark, :func:`start_keepers`).
    The first round runs in :meth:`start`, on the caller's thread, so that the
    receivers launched after it find a replica target for their very first
    block (a block kept once while no other keeper exists has no copy to fall
    back on); later rounds run on this object's thread. A failed job is logged
    and tried again at the next round: an executor without a keeper only means
    fewer replica targets, which the receivers report.
    """

    def __init__(
        self,
        keepers: BlockKeepers,
        alive_executors: Callable[[], Sequence[ExecutorCacheTaskLocation]],
        start: Callable[[list[ExecutorCacheTaskLocation]], object],
        interval_s: float = 5.0,
    ) -> None:
        self._keepers = keepers
        self._alive_executors = alive_executors
        self._start = start
        self._interval_s = interval_s
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, name="block-keeper-starter", daemon=True)
        self.rounds = 0

    def start(self) -> None:
        """Run the first round, then start the thread for the next ones."""
        self._round()
        self._thread.start()

    def stop(self, timeout_s: float = 10.0) -> None:
        """Stop starting keepers; wait up to ``timeout_s`` for a job in progress."""
        self._stopping.set()
        if self._thread.is_alive():
            self._thread.join(timeout_s)

    def _run(self) -> None:
        while not self._stopping.wait(self._interval_s):
            self._round()

    def _round(self) -> None:
        try:
            missing = self._keepers.missing(self._alive_executors())
            if missing:
                log.info("starting block keepers on %s", [str(e) for e in missing])
                self._start(missing)
        except Exception as e:  # noqa: BLE001 - logged; tried again next round
            if not self._stopping.is_set():
                log.warning("could not start block keepers: %s", e)
        self.rounds += 1


def keeper_starter(
    spark: SparkSession | SparkSide,
    receivers: Sequence[Receiver],
    config: StreamingConfig,
    keepers: BlockKeepers,
    tracker_address: str,
    secret: str,
) -> KeeperStarter | None:
    """A :class:`KeeperStarter` (not started) when some receiver keeps replicas on a cluster.

    None in local mode (one executor: no other to copy to), with block keepers
    off, with the receiver WAL on (one copy, as in Spark), or when every
    receiver's level keeps one copy.
    """
    side = spark_side(spark)
    replicated = any(StorageLevel.of(r.storage_level).replication > 1 for r in receivers)
    if (
        not replicated
        or not config.block_keeper_enabled
        or config.receiver_wal_enabled
        or is_local_master(side.master)
    ):
        return None
    spec = KeeperTaskSpec(tracker_address, secret, config.as_dict())
    group = f"spark-receivers-{side.app_id}-block-keepers"
    return KeeperStarter(
        keepers,
        lambda: alive_executors(side),
        lambda missing: start_keepers(side, missing, spec, group),
    )


def start_keepers(
    spark: Any,
    executors: Sequence[ExecutorCacheTaskLocation],
    spec: KeeperTaskSpec,
    job_group: str,
) -> list[str]:
    """Run one keeper task per executor, each preferring it; ``"<executor> <address>"`` each.

    A task may run elsewhere when its executor has no free slot (on Spark Connect,
    wherever Connect puts it); the keepers it starts register themselves, and the caller
    tries again for what is missing.
    """
    side = spark_side(spark)
    task: Any = make_keeper_task(spec)
    side.set_job_group(job_group, "spark-receivers: start block keepers", interrupt=True)
    try:
        items = [(i, [loc]) for i, loc in enumerate(executors)]
        return side.run_located(items, task, strict=False)[0]
    finally:
        side.clear_job_group()
