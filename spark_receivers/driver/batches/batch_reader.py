"""Builds each batch's DataFrames, keeps their rows for repeated actions, warms the path up.

The job scheduler asks :meth:`BatchReader.read` for a receiver stream's DataFrame of one
batch and :meth:`BatchReader.release` when the batch ended.

**Repeated actions** (docs/decisions/0008-batches-as-users-write-them.md): a batch's
DataFrame is a ``mapInArrow`` read of its blocks (``spark/block_source.py``): every action
on it would fetch every block again over Arrow Flight. A persisted DataFrame
(``MEMORY_ONLY``) is read once: the first action reads the blocks and leaves the rows on
the executors that read them, and every later action of the batch reads those (Spark's
DStream re-reads its blocks from the executors' BlockManager the same way). A partition that
did not fit in memory is read from its block again, so nothing changes but the speed. When
the batch ends the rows are dropped (``unpersist``, not waited for), also those of a batch
DataFrame the user persisted.

**Which batches are cached** (decisions 0013 and 0023): building the cache was a quarter of
the JVM's CPU in a line count (issue 31's profile), and a batch that gets one action gains
nothing from it; since the blocks are read from the keeper's mapped spool, reading them a
second time also costs less than building the cache and reading it (decision 0023's
measurement). With ``batch_cache`` on (the default) a stream's batch is persisted when the
stream's last batch that was read was read :data:`CACHE_FROM_READS` times or more (three
actions, or a self-union and an action: each read of the relation counts); otherwise it is
not, and each action reads the blocks. The first batch of a stream is not cached (nothing is
known, and one or two actions are the common forms). The reads are counted by a Spark
``QueryExecutionListener`` (through py4j's callback server) that finds each batch's
relation, by its alias, in every query's plan. The listener's events come a little after
the action (the JVM's listener bus), so a batch's count is read when the stream's next batch
is built. A stream whose function gains a third action pays it once (that batch reads its
blocks three times; the next ones are cached); one that loses it builds one cache more.
Where the listener cannot be installed (no JVM: Spark Connect) every batch is cached, and it
is logged once.

The batch's rows are cached **without compression** (decision 0011): the rows live for one
batch, and finding a compression for each column of each batch (dictionary and run-length
trials over every value) cost the first action more than the memory it saved, which made
the cache a loss for ``count()`` + one action. How the setting is switched off for the
batch's cache alone, in a classic session and on Spark Connect, is the job of
``cache_compression.py`` (``persist_uncompressed`` and ``ConnectCacheSetting``). A batch
without blocks
is one empty DataFrame per stream, made once, over an empty local relation (most actions
on it run no Spark job).

**Cold start**: the first read starts Python workers on the executors, imports Arrow
Flight in them, opens Flight
connections and runs the SQL engine's first shuffle — seconds, which used to land on the
first batches and build a backlog. :meth:`BatchReader.warm_up` pays them before the first
batch: it serves a small block from a Flight endpoint of its own and runs two actions on it
(a ``count()`` and a grouped count, one read task per task slot the batches will use)
through exactly the batch path.

Threads: ``read``/``release`` run on batch threads; ``warm_up`` on the thread that starts
the context (bounded by its timeout).
"""

from __future__ import annotations

import logging
import re
import shutil
import tempfile
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from typing import TYPE_CHECKING, Any, ClassVar

from spark_receivers.driver.batches.cache_compression import (
    CONNECT_CACHE_SETTING,
    persist_uncompressed,
)
from spark_receivers.rpc import messages as m
from spark_receivers.rpc.hosts import EndpointNetwork
from spark_receivers.rpc.tls import TlsConfig
from spark_receivers.spark import block_source
from spark_receivers.spark.session_kind import spark_side

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.types import StructType

    from spark_receivers.stream import ReceiverInputStream

log = logging.getLogger(__name__)

__all__ = [
    "CACHE_FROM_READS",
    "WARM_UP_JOB_GROUP",
    "BatchReader",
    "ScanCounter",
]

WARM_UP_JOB_GROUP = "spark-receivers-warm-up"
WARM_UP_ROWS = 50_000
"""Rows per warm-up block: enough for the JVM to compile the per-row loops of the read (and
of the cache, where batches are cached) and the aggregation (a few thousand rows leave them
interpreted, and the first real batches then run several times slower)."""
WARM_UP_ROUNDS = 2
CACHE_FROM_READS = 3
"""Reads of a stream's last batch from which its next batch is cached (decision 0023): at two
the two reads of the blocks cost less than a cache built and read once."""
ROWS_PER_READ_TASK = 250_000
"""Rows a batch needs per read task beyond the first (when ``batch.readPartitions`` is left
to its default): a smaller batch is read by fewer tasks. One task, one partition: a
``count()`` then needs no shuffle (one job, one stage, nothing for adaptive execution to
plan again), and each task saved is a Python worker's round trip and a task's submission
(the profile of issue 31: planning and job submission were 44 % of the JVM's samples in the
line count at 150,000 lines a batch)."""


class ScanCounter:
    """A Spark ``QueryExecutionListener`` (a py4j callback) counting reads of batches.

    For every query that ran (or failed) it finds the batches its plan reads, by the alias
    :func:`block_source.batch_alias` gave each batch's DataFrame, and hands their keys to
    ``on_scans``, once per time the plan names one (a self-union reads a batch twice).
    Runs on the JVM's listener bus thread through py4j; never raises into the JVM.
    """

    _ALIAS = re.compile(r"SubqueryAlias " + block_source.BATCH_ALIAS_PREFIX + r"(\d+)_(\d+)\b")

    def __init__(self, on_scans: Callable[[list[str]], None]) -> None:
        self._on_scans = on_scans

    def onSuccess(self, func_name: str, qe: Any, duration_ns: int) -> None:  # Java's name
        """A query ended: count its batch reads."""
        self._count(qe)

    def onFailure(self, func_name: str, qe: Any, exception: Any) -> None:  # Java's name
        """A query failed: count its batch reads all the same (they may have run)."""
        self._count(qe)

    def _count(self, qe: Any) -> None:
        try:
            # One py4j call: the plan's text (a walk of its nodes is a call per node).
            plan = str(qe.logical().toString())
            keys = [f"{s}:{t}" for s, t in self._ALIAS.findall(plan)]
            if keys:
                self._on_scans(keys)
        except Exception:  # a count missed costs one cache, never a result
            log.debug("could not count the batch reads of a query", exc_info=True)

    class Java:
        """py4j: the Java interface this object implements."""

        implements: ClassVar[list[str]] = ["org.apache.spark.sql.util.QueryExecutionListener"]


_listener_fallback_logged = threading.Event()


class BatchReader:
    """One DataFrame per receiver stream and batch; see the module doc. Thread-safe."""

    ROWS_PER_READ_TASK = ROWS_PER_READ_TASK

    def __init__(
        self,
        spark: SparkSession,
        secret: str,
        checkpoint_dir: str | None,
        read_partitions: int,
        cache: bool,
        lost_block_policy: str = "fail",
        tls: TlsConfig | None = None,
        rows_per_read_task: int = 0,
        tracker: str | None = None,
        parquet_spool: bool = False,
    ) -> None:
        self._spark = spark
        self._side = spark_side(spark)
        self._rows_per_task = rows_per_read_task
        self._secret = secret
        self._checkpoint_dir = checkpoint_dir
        self.read_partitions = read_partitions
        self._cache = cache
        self._lost_block_policy = lost_block_policy
        self._tls = tls
        self._parquet_spool = parquet_spool
        """Blocks spooled as Parquet are read by Spark's reader (``block_source``)."""
        self._task_ranges = block_source.TaskRanges(spark)
        """The reads' input ranges, one per task count, kept across batches."""
        self.tracker = tracker
        """The tracker endpoint read tasks report lost blocks to (``lostBlockPolicy=skip``)."""
        self._lock = threading.Lock()
        self._empty: dict[int, DataFrame] = {}
        self._frames: dict[int, list[tuple[DataFrame, bool]]] = {}
        """Batch time → its DataFrames, each with whether this reader persisted it."""
        self._releaser: ThreadPoolExecutor | None = None
        self._closed = False
        self._counter: ScanCounter | None = None
        self._counting = False  # the counter is registered with the session
        self._no_counting = False  # it could not be: every batch is cached
        self._scans: dict[tuple[int, int], int] = {}
        """(stream id, batch time) → reads of that batch's relation the listener counted."""
        self._last_read: dict[int, int] = {}
        """Stream id → the time of its last batch read from blocks."""
        self._cache_next: dict[int, bool] = {}
        """Stream id → its batches are cached (its last counted batch was read
        ``CACHE_FROM_READS`` times or more)."""
        self._connect_setting: bool | None = None
        """Connect: None before the first cached batch; then whether this reader holds the
        session's cache compression off (:class:`ConnectCacheSetting`, released at close)."""

    def read(
        self, stream: ReceiverInputStream, batch_time_ms: int, blocks: list[m.ReceivedBlockInfo]
    ) -> DataFrame:
        """The DataFrame of ``stream`` in batch ``batch_time_ms`` over ``blocks``."""
        from pyspark.sql.pandas.types import from_arrow_schema

        schema = from_arrow_schema(stream.receiver.schema)
        if not blocks:
            with self._lock:
                df = self._empty.get(stream.stream_id)
            if df is None:
                # From an empty Arrow table: a LocalRelation the optimizer sees is empty, so
                # most actions on it run no Spark job (createDataFrame([]) is a Python RDD:
                # every action ran Python tasks on every core, 300-500 ms).
                df = self._spark.createDataFrame(stream.receiver.schema.empty_table(), schema)
                with self._lock:
                    df = self._empty.setdefault(stream.stream_id, df)
            return df
        cache = self._cache and self._wants_cache(stream.stream_id, batch_time_ms)
        return self._read_blocks(
            blocks, schema, batch_time_ms, cache, f"{stream.stream_id}:{batch_time_ms}"
        )

    def _wants_cache(self, stream_id: int, batch_time_ms: int) -> bool:
        """Cache this batch of the stream? From the reads of its last batch (module doc)."""
        if not self._start_counting():
            return True
        with self._lock:
            last = self._last_read.get(stream_id)
            self._last_read[stream_id] = batch_time_ms
            if last is not None:
                reads = self._scans.get((stream_id, last))
                if reads is not None:  # none: no action read it, or its events are late
                    self._cache_next[stream_id] = reads >= CACHE_FROM_READS
                for done in [k for k in self._scans if k[0] == stream_id and k[1] <= last]:
                    del self._scans[done]
            return self._cache_next.get(stream_id, False)

    def _start_counting(self) -> bool:
        """Register the read counter with the session once; False where it cannot be."""
        if self._counting:
            return True
        if self._no_counting:
            return False
        with self._lock:
            if self._counting or self._no_counting:
                return self._counting
            if self._side.kind == "connect":
                # No listener reaches a Connect client: every batch is cached.
                self._no_counting = True
                log.info("Spark Connect: every batch is cached (no query listener here)")
                return False
            try:
                from pyspark.java_gateway import ensure_callback_server_started

                sc = self._spark.sparkContext
                ensure_callback_server_started(sc._gateway)
                counter = ScanCounter(self._count_scans)
                self._spark._jsparkSession.listenerManager().register(counter)
            except Exception as e:  # noqa: BLE001 - every batch is cached instead
                self._no_counting = True
                if not _listener_fallback_logged.is_set():
                    _listener_fallback_logged.set()
                    log.warning(
                        "every batch is cached (could not count the actions on a batch: %s); "
                        "see docs/decisions/0013",
                        e,
                    )
                return False
            self._counter = counter
            self._counting = True
            return True

    def _count_scans(self, keys: list[str]) -> None:
        """The listener found these batch keys (``stream:time``) in a query that ran."""
        with self._lock:
            for key in keys:
                stream, _, t = key.partition(":")
                try:
                    k = (int(stream), int(t))
                except ValueError:
                    continue
                if self._last_read.get(k[0], k[1]) <= k[1]:  # not a batch already judged
                    self._scans[k] = self._scans.get(k, 0) + 1

    def close(self) -> None:
        """Wait for the drops handed over, unregister the counter, put the setting back.

        The Connect cache setting (:class:`ConnectCacheSetting`). Idempotent.
        """
        with self._lock:
            self._closed = True
            releaser, self._releaser = self._releaser, None
            counter, self._counter, self._counting = self._counter, None, False
            held, self._connect_setting = self._connect_setting, False
        if releaser is not None:
            releaser.shutdown(wait=True)  # each drop is bounded: unpersist is not waited for
        if held:
            CONNECT_CACHE_SETTING.release(self._spark)
        if counter is None:
            return
        try:
            self._spark._jsparkSession.listenerManager().unregister(counter)
        except Exception:  # the session may be stopping: it goes with it
            log.debug("could not unregister the batch read counter", exc_info=True)

    def _read_blocks(
        self,
        blocks: list[m.ReceivedBlockInfo],
        schema: StructType,
        key: int,
        cache: bool,
        batch_key: str | None = None,
    ) -> DataFrame:
        df = block_source.blocks_dataframe(
            self._spark,
            blocks,
            schema,
            self._secret,
            self._checkpoint_dir,
            self.partitions_for(blocks),
            self._lost_block_policy,
            self.tracker,
            tls=self._tls,
            batch_key=batch_key,
            parquet_spool=self._parquet_spool,
            task_ranges=self._task_ranges,
        )
        if cache:
            df = self._persist(df)
        with self._lock:  # also uncached: a persist() of the user's is dropped with the batch
            self._frames.setdefault(key, []).append((df, cache))
        return df

    def _persist(self, df: DataFrame) -> DataFrame:
        """``df`` cached uncompressed (on Connect: the session's setting, held till close)."""
        if self._side.kind != "connect":
            return persist_uncompressed(self._spark, df)
        from pyspark import StorageLevel

        self._hold_connect_setting()
        return df.persist(StorageLevel.MEMORY_ONLY)

    def _hold_connect_setting(self) -> None:
        """Connect: hold the session's cache compression off, once per reader (till close)."""
        with self._lock:  # a conf round trip to the server, the first time on a session
            if self._side.kind == "connect" and self._connect_setting is None:
                self._connect_setting = CONNECT_CACHE_SETTING.hold(self._spark)

    def partitions_for(self, blocks: list[m.ReceivedBlockInfo]) -> int:
        """Read tasks for a batch of ``blocks``: one per ``rows_per_read_task`` rows begun.

        At most ``read_partitions``; always ``read_partitions`` without ``rows_per_read_task``.
        """
        if self._rows_per_task <= 0:
            return self.read_partitions
        rows = sum(max(0, b.num_records) for b in blocks)
        return max(1, min(self.read_partitions, -(-rows // self._rows_per_task)))

    def release(self, batch_time_ms: int) -> None:
        """The batch ended: drop the rows its DataFrames kept (not waited for)."""
        with self._lock:
            frames = self._frames.pop(batch_time_ms, [])
        self._drop(batch_time_ms, frames)

    def release_later(self, batch_time_ms: int) -> None:
        """:meth:`release`, on a thread of the reader's: the batch thread goes on at once.

        For the job scheduler, whose next batch waits for the end of this one: dropping a
        cache is a round trip to Spark per DataFrame (on Spark Connect an RPC, ~10 ms), which
        needs no batch to wait. The drops run in batch order; :meth:`close` waits for them.
        After ``close`` it is :meth:`release`.
        """
        with self._lock:
            frames = self._frames.pop(batch_time_ms, [])
            if not frames:
                return
            if not self._closed:
                if self._releaser is None:
                    self._releaser = ThreadPoolExecutor(1, thread_name_prefix="batch-release")
                self._releaser.submit(self._drop, batch_time_ms, frames)
                return
        self._drop(batch_time_ms, frames)

    def _drop(self, batch_time_ms: int, frames: list[tuple[DataFrame, bool]]) -> None:
        for df, persisted_here in frames:
            try:
                # A frame this reader persisted needs no look (on Connect, a round trip):
                # only one the user may have persisted is asked whether it is cached.
                if persisted_here or df.is_cached:
                    df.unpersist(blocking=False)
            except Exception:  # the session may be stopping: the rows go with it
                log.warning(
                    "could not drop the cached rows of batch %d", batch_time_ms, exc_info=True
                )

    def warm_up(self, network: EndpointNetwork, timeout_s: float) -> bool:
        """Run the batch path once on a small block of our own; False if it did not finish.

        Bounded by ``timeout_s`` (its Spark jobs are then cancelled); a failure is logged,
        never raised: batches work without the warm-up, only their first ones are slower.
        """
        if timeout_s <= 0:
            return True
        done = threading.Event()
        thread = threading.Thread(
            target=self._warm_up, args=(network, done), name="block-reader-warm-up", daemon=True
        )
        thread.start()
        if not done.wait(timeout_s):
            log.warning("the block reader's warm-up did not finish within %.0f s", timeout_s)
            self._side.cancel_job_group(WARM_UP_JOB_GROUP)
            return False
        return True

    def _warm_up(self, network: EndpointNetwork, done: threading.Event) -> None:
        try:
            self._warm_up_once(network)
        except Exception as e:  # noqa: BLE001 - only a head start: batches work without it
            log.warning("the block reader's warm-up failed (the first batches pay it): %s", e)
        finally:
            done.set()  # whatever failed, start() does not wait out the whole timeout

    def _warm_up_once(self, network: EndpointNetwork) -> None:
        import pyarrow as pa
        from pyspark.sql.types import StringType, StructField, StructType

        from spark_receivers.receiver.block_placement import write_spool_file
        from spark_receivers.receiver.block_spool import close_quietly, make_spool
        from spark_receivers.rpc.auth import new_secret
        from spark_receivers.rpc.transport import FlightEndpoint

        words = [f"{i:010d} warm up the batch path w{i % 97}" for i in range(WARM_UP_ROWS)]
        table = pa.table({"value": pa.array(words, pa.string())})
        secret = new_secret()
        server = FlightEndpoint(
            "block-reader-warm-up",
            network.bind_host,
            secret,
            (),
            lambda _: None,
            lambda _ticket: table,
            tls=self._tls,
            **network.endpoint_kwargs(),
        )
        reader: BatchReader | None = None
        spool, spool_lock = "", -1
        # The path the first batches take: read, not cached, where the actions are counted
        # (decision 0023); cached where they cannot be (Spark Connect).
        cache = self._cache and not self._start_counting()
        if cache:
            # Held by this reader first: the warm-up's reader then only counts on it, and
            # the session's setting is not put back and set again between the two.
            self._hold_connect_setting()
        try:
            reader = BatchReader(
                self._spark,
                secret,
                None,
                self.read_partitions,
                cache,
                tls=self._tls,
                parquet_spool=self._parquet_spool,
            )
            self._side.set_job_group(
                WARM_UP_JOB_GROUP, "spark-receivers: warm up the batch path", True
            )
            infos = [
                m.ReceivedBlockInfo(0, f"input-0-0-{i}", table.num_rows, 0, server.address)
                for i in range(self.read_partitions)
            ]
            if self._parquet_spool:  # the first batches read spooled Parquet: so does this
                spool, spool_lock = make_spool(tempfile.gettempdir())
                infos = [
                    replace(b, local_file=str(write_spool_file(spool, b.block_id, table, True)))
                    for b in infos
                ]
            schema = StructType([StructField("value", StringType())])
            for round_ in range(WARM_UP_ROUNDS):
                df = reader._read_blocks(infos, schema, -1 - round_, cache)
                df.count()
                # A grouped count over a few distinct string keys, as a word count has.
                df.selectExpr("substring_index(value, ' ', -1) AS k").groupBy("k").count().collect()
        finally:
            if reader is not None:
                for round_ in range(WARM_UP_ROUNDS):
                    reader.release(-1 - round_)
                reader.close()
            server.close()
            close_quietly(spool_lock)
            if spool:
                shutil.rmtree(spool, ignore_errors=True)
