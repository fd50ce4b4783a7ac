"""BatchReader: a batch's blocks are read once however many actions run on it."""

from __future__ import annotations

import threading
from types import SimpleNamespace

import pyarrow as pa
import pytest
from pyspark.sql import functions as F

from spark_receivers.driver.batches.batch_reader import CACHE_FROM_READS, BatchReader
from spark_receivers.receiver.schema import DEFAULT_SCHEMA
from spark_receivers.rpc import messages as m
from spark_receivers.rpc.auth import new_secret
from spark_receivers.rpc.hosts import EndpointNetwork
from spark_receivers.rpc.transport import FlightEndpoint

pytestmark = pytest.mark.spark


class CountingStore:
    """A block server that counts how often each block is fetched."""

    def __init__(self, blocks: dict[str, pa.Table]) -> None:
        self.blocks = blocks
        self.reads: dict[str, int] = dict.fromkeys(blocks, 0)
        self.lock = threading.Lock()
        self.secret = new_secret()
        self.server = FlightEndpoint(
            "store", "127.0.0.1", self.secret, (), lambda _: None, self._read
        )

    def _read(self, ticket: bytes) -> pa.Table:
        with self.lock:
            self.reads[ticket.decode()] += 1
        return self.blocks[ticket.decode()]

    def infos(self) -> list[m.ReceivedBlockInfo]:
        return [
            m.ReceivedBlockInfo(0, name, t.num_rows, 0, self.server.address)
            for name, t in self.blocks.items()
        ]


@pytest.fixture()
def store():
    blocks = {
        f"input-0-1-{i}": pa.table({"value": [f"w{i} x{j}" for j in range(100)]}) for i in range(3)
    }
    s = CountingStore(blocks)
    yield s
    s.server.close()


CUT_BLOCK = "input-0-1-1"
"""Two read tasks share the fixture's 300 rows at row 150: the middle block is cut between
them and both fetch it (decision 0025); the others are fetched once per read of the batch."""


def fetched(store: CountingStore, reads: int, tasks: int = 2) -> dict[str, int]:
    """What ``store`` serves for ``reads`` reads of the batch by ``tasks`` read tasks."""
    counts = dict.fromkeys(store.blocks, reads)
    if tasks == 2:
        counts[CUT_BLOCK] = 2 * reads
    return counts


STREAM = SimpleNamespace(stream_id=0, receiver=SimpleNamespace(schema=DEFAULT_SCHEMA))


def _settle(spark) -> None:
    """Wait until the JVM delivered the listener events so far (the actions a reader counts)."""
    spark.sparkContext._jsc.sc().listenerBus().waitUntilEmpty()


def _rdds_with_cached_blocks(spark) -> set[int]:
    """Ids of the RDDs with partitions in the executors' storage (Spark's storage status)."""
    return {info.id() for info in spark.sparkContext._jsc.sc().getRDDStorageInfo()}


def _grouped(df) -> list[tuple[str, int]]:
    return sorted((r["value"], r["count"]) for r in df.groupBy("value").count().collect())


@pytest.fixture()
def reader(spark, store):
    r = BatchReader(spark, store.secret, None, 2, cache=True)
    yield r
    r.close()


def _actions(df, n: int) -> None:
    """``n`` actions on a batch: its count, then grouped counts."""
    assert df.count() == 300
    for _ in range(n - 1):
        assert _grouped(df)[0] == ("w0 x0", 1)


@pytest.mark.parametrize("actions", [1, 2])
def test_a_batch_that_gets_one_or_two_actions_builds_no_cache(spark, store, reader, actions):
    # Two reads of the blocks cost less than a cache built and read (decision 0023): the
    # first batch of a stream is not cached, nor any after it.
    assert actions < CACHE_FROM_READS
    for t in (1000, 2000, 3000):
        before = _rdds_with_cached_blocks(spark)
        df = reader.read(STREAM, t, store.infos())  # type: ignore[arg-type]
        assert not df.is_cached
        _actions(df, actions)
        _settle(spark)
        assert spark._jsparkSession.sharedState().cacheManager().isEmpty()
        assert _rdds_with_cached_blocks(spark) - before == set()
        reader.release(t)
    assert store.reads == fetched(store, 3 * actions)  # one read per action


def test_batches_that_get_three_actions_read_every_block_once_from_the_second(spark, store, reader):
    assert CACHE_FROM_READS == 3
    expected = [(f"w{i} x{j}", 1) for i in range(3) for j in range(100)]
    for n, t in enumerate((1000, 2000, 3000)):
        before = _rdds_with_cached_blocks(spark)
        df = reader.read(STREAM, t, store.infos())  # type: ignore[arg-type]
        assert df.count() == 300
        assert _grouped(df) == sorted(expected)
        assert _grouped(df) == sorted(expected)
        _settle(spark)
        assert df.is_cached == (n > 0)  # nothing known of the first batch: not cached
        assert store.reads == fetched(store, 3 + n)  # the first read three times
        if n > 0:
            assert _rdds_with_cached_blocks(spark) - before  # the cache Spark built for it
        reader.release(t)


def test_the_cache_follows_what_the_batches_do(spark, store, reader):
    def batch(t: int, actions: int) -> tuple[bool, int]:
        reads = sum(store.reads.values())
        df = reader.read(STREAM, t, store.infos())  # type: ignore[arg-type]
        _actions(df, actions)
        _settle(spark)
        cached = df.is_cached
        reader.release(t)
        return cached, (sum(store.reads.values()) - reads) // sum(fetched(store, 1).values())

    assert batch(1000, 1) == (False, 1)  # nothing known yet: not cached
    assert batch(2000, 2) == (False, 2)  # two reads: still no cache
    # A third action the previous batches did not have: read three times (the cache was
    # not built for it), and the batches after it are cached.
    assert batch(3000, 3) == (False, 3)
    assert batch(4000, 3) == (True, 1)
    assert batch(5000, 1) == (True, 1)
    assert batch(6000, 1) == (False, 1)


def test_a_batch_the_user_persisted_is_dropped_with_the_batch(spark, store, reader):
    for t in (1000, 2000):
        df = reader.read(STREAM, t, store.infos())  # type: ignore[arg-type]
        if t == 2000:
            assert not df.is_cached  # one action before: not cached by the reader
            df.persist()
        assert df.count() == 300
        _settle(spark)
        reader.release(t)
        assert not df.is_cached
    assert spark._jsparkSession.sharedState().cacheManager().isEmpty()


@pytest.mark.parametrize(("rows_per_task", "tasks"), [(0, 2), (1_000, 1), (150, 2), (100, 2)])
def test_a_small_batch_is_read_by_fewer_tasks(spark, store, rows_per_task, tasks):
    reader = BatchReader(
        spark, store.secret, None, 2, cache=False, rows_per_read_task=rows_per_task
    )
    df = reader.read(STREAM, 1000, store.infos())  # type: ignore[arg-type]
    assert df.rdd.getNumPartitions() == tasks  # 300 rows in 3 blocks, at most 2 tasks
    assert sorted(r["value"] for r in df.collect()) == sorted(
        f"w{i} x{j}" for i in range(3) for j in range(100)
    )
    assert store.reads == fetched(store, 1, tasks)
    reader.release(1000)
    reader.close()


def test_a_self_union_counts_as_two_reads(spark, store, reader):
    # A self-union and a count: three reads of the relation, so the next batch is cached.
    for t, self_union, cached in ((1000, False, False), (2000, True, False), (3000, True, True)):
        df = reader.read(STREAM, t, store.infos())  # type: ignore[arg-type]
        assert df.is_cached == cached
        if self_union:
            assert df.union(df).count() == 600
        assert df.count() == 300
        _settle(spark)
        reader.release(t)
    assert store.reads == fetched(store, 5)  # 1, 3 (not cached), 1


def test_batches_share_their_read_input_and_mix_in_one_query(spark, store):
    # The batches' reads map one range DataFrame per task count (made once): two batches
    # over it, held together, still read their own blocks, in a union and in a join.
    reader = BatchReader(spark, store.secret, None, 2, cache=False)
    try:
        first = reader.read(STREAM, 1000, store.infos())  # type: ignore[arg-type]
        second = reader.read(STREAM, 2000, store.infos())  # type: ignore[arg-type]
        assert list(reader._task_ranges._by_tasks) == [2]  # one input, made once
        assert first.union(second).count() == 600
        joined = first.join(
            second.withColumnRenamed("value", "other"), F.col("value") == F.col("other")
        )
        in_both = sorted(r["value"] for r in joined.collect())
        assert in_both == sorted(f"w{i} x{j}" for i in range(3) for j in range(100))
        _settle(spark)
        reader.release(1000)
        reader.release(2000)
    finally:
        reader.close()


@pytest.mark.parametrize("cache", [True, False])
def test_later_actions_read_no_block_again_with_the_batch_cache(spark, store, cache):
    reader = BatchReader(spark, store.secret, None, 2, cache=cache)
    for t in (1000, 2000):  # the first batch's three actions decide the second's cache
        df = reader.read(STREAM, t, store.infos())  # type: ignore[arg-type]
        assert df.count() == 300
        assert df.groupBy("value").count().count() == 300
        assert df.filter(df.value.startswith("w1")).count() == 100
        _settle(spark)
        reader.release(t)
        assert not df.is_cached
    reader.release(2000)  # twice: nothing left to drop
    # Every action read every block again without the cache; with it, the second batch
    # read them once.
    expected = 3 + (1 if cache else 3)
    assert store.reads == fetched(store, expected)
    reader.close()


def test_release_later_drops_the_batch_caches_off_the_calling_thread(spark, store):
    # The job scheduler's batch thread hands the drop over and goes on; close() waits
    # for every drop handed over, in batch order, and a release after it drops at once.
    reader = BatchReader(spark, store.secret, None, 2, cache=True)
    callers: list[str] = []
    frames = []
    for t in (1000, 2000):
        df = reader.read(STREAM, t, store.infos())  # type: ignore[arg-type]
        assert not df.is_cached  # one action a batch: not cached; the user persists both
        df.persist()
        assert df.count() == 300
        unpersist = df.unpersist

        def recording(*args, _unpersist=unpersist, **kwargs):
            callers.append(threading.current_thread().name)
            return _unpersist(*args, **kwargs)

        df.unpersist = recording  # type: ignore[method-assign]
        frames.append(df)
        reader.release_later(t)
    reader.close()
    assert len(callers) == 2
    assert all(name.startswith("batch-release") for name in callers)
    assert not any(df.is_cached for df in frames)
    assert spark._jsparkSession.sharedState().cacheManager().isEmpty()
    late = reader.read(STREAM, 3000, store.infos())  # type: ignore[arg-type]
    late.persist()
    assert late.count() == 300
    reader.release_later(3000)  # closed: dropped here and now
    assert not late.is_cached


def test_batches_without_blocks_share_one_empty_frame_and_read_nothing(spark, store):
    reader = BatchReader(spark, store.secret, None, 2, cache=True)
    first = reader.read(STREAM, 1000, [])  # type: ignore[arg-type]
    assert first.count() == 0
    assert reader.read(STREAM, 2000, []) is first  # type: ignore[arg-type]
    reader.release(1000)
    assert sum(store.reads.values()) == 0


def test_warm_up_runs_the_batch_path_and_leaves_nothing_cached(spark):
    reader = BatchReader(spark, "unused", None, 2, cache=True)
    here = EndpointNetwork("127.0.0.1", "127.0.0.1")
    assert reader.warm_up(here, 120) is True
    assert reader.warm_up(here, 0) is True  # 0: no warm-up at all
    assert spark._jsparkSession.sharedState().cacheManager().isEmpty()  # released


def _first_cached_batch_bytes(spark, df) -> int:
    """Bytes of the column buffers of the first cached batch of ``df`` (compressed or not)."""
    cached = spark._jsparkSession.sharedState().cacheManager().lookupCachedData(df._jdf)
    batch = cached.get().cachedRepresentation().cacheBuilder().cachedColumnBuffers().first()
    return sum(len(b) for b in batch.buffers())


def test_the_batch_cache_is_uncompressed_and_the_session_setting_stays(spark):
    # One value repeated: compressed (run-length or dictionary) a cached batch of 10,000
    # rows takes a few hundred bytes; uncompressed, its 10,000 x 100 bytes and more.
    rows, value = 20_000, "x" * 100
    s = CountingStore({"input-0-1-0": pa.table({"value": [value] * rows})})
    key = "spark.sql.inMemoryColumnarStorage.compressed"
    try:
        spark.conf.set(key, "true")  # the user's explicit choice, for the user's own caches
        reader = BatchReader(spark, s.secret, None, 2, cache=True)
        first = reader.read(STREAM, 1000, s.infos())  # type: ignore[arg-type]
        for _ in range(CACHE_FROM_READS):  # so that the next batch is cached
            assert first.count() == rows
        _settle(spark)
        reader.release(1000)
        df = reader.read(STREAM, 2000, s.infos())  # type: ignore[arg-type]
        assert df.is_cached
        assert df.count() == rows
        assert spark.conf.get(key) == "true"
        assert _first_cached_batch_bytes(spark, df) >= 10_000 * len(value)
        own = spark.createDataFrame([(value,)] * rows, "value string").cache()
        assert own.count() == rows
        assert _first_cached_batch_bytes(spark, own) < 10_000  # the session's: compressed
        own.unpersist(blocking=True)
        reader.release(2000)
    finally:
        spark.conf.unset(key)
        s.server.close()
