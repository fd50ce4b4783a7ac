"""BatchReader: a batch's blocks are read once however many actions run on it."""

from __future__ import annotations

import threading
from types import SimpleNamespace

import pyarrow as pa
import pytest

from spark_receivers.driver.batches.batch_reader import BatchReader
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


def test_a_batch_that_gets_one_action_builds_no_cache(spark, store, reader):
    # The first batch of a stream is cached (nothing is known yet); from then on the
    # stream's batches got one action each, so none builds a cache.
    for t in (1000, 2000, 3000):
        before = _rdds_with_cached_blocks(spark)
        df = reader.read(STREAM, t, store.infos())  # type: ignore[arg-type]
        assert df.count() == 300
        _settle(spark)
        if t > 1000:
            assert not df.is_cached
            assert spark._jsparkSession.sharedState().cacheManager().isEmpty()
            assert _rdds_with_cached_blocks(spark) - before == set()
        reader.release(t)
    assert store.reads == dict.fromkeys(store.blocks, 3)  # one read per batch


def test_a_batch_that_gets_two_actions_reads_every_block_once(spark, store, reader):
    expected = [(f"w{i} x{j}", 1) for i in range(3) for j in range(100)]
    for n, t in enumerate((1000, 2000, 3000), start=1):
        before = _rdds_with_cached_blocks(spark)
        df = reader.read(STREAM, t, store.infos())  # type: ignore[arg-type]
        assert df.count() == 300
        assert _grouped(df) == sorted(expected)
        _settle(spark)
        assert store.reads == dict.fromkeys(store.blocks, n)  # the blocks read once a batch
        assert df.is_cached
        assert _rdds_with_cached_blocks(spark) - before  # the cache Spark built for it
        reader.release(t)


def test_the_cache_follows_what_the_batches_do(spark, store, reader):
    def batch(t: int, actions: int) -> tuple[bool, int]:
        reads = sum(store.reads.values())
        df = reader.read(STREAM, t, store.infos())  # type: ignore[arg-type]
        assert df.count() == 300
        if actions > 1:
            assert _grouped(df)[0] == ("w0 x0", 1)
        _settle(spark)
        cached = df.is_cached
        reader.release(t)
        return cached, (sum(store.reads.values()) - reads) // len(store.blocks)

    assert batch(1000, 1) == (True, 1)  # nothing known yet: cached
    assert batch(2000, 1) == (False, 1)
    # A second action the previous batches did not have: read twice (the cache was not
    # built for it), and the batches after it are cached.
    assert batch(3000, 2) == (False, 2)
    assert batch(4000, 2) == (True, 1)
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
    assert store.reads == dict.fromkeys(store.blocks, 1)
    reader.release(1000)
    reader.close()


def test_a_self_union_counts_as_two_reads(spark, store, reader):
    for t, self_union, cached in ((1000, False, True), (2000, True, False), (3000, True, True)):
        df = reader.read(STREAM, t, store.infos())  # type: ignore[arg-type]
        assert df.is_cached == cached
        assert (df.union(df) if self_union else df).count() == (600 if self_union else 300)
        _settle(spark)
        reader.release(t)
    assert store.reads == dict.fromkeys(store.blocks, 4)  # 1, 2 (not cached), 1


@pytest.mark.parametrize("cache", [True, False])
def test_a_second_action_reads_no_block_again_with_the_batch_cache(spark, store, cache):
    reader = BatchReader(spark, store.secret, None, 2, cache=cache)
    df = reader.read(STREAM, 1000, store.infos())  # type: ignore[arg-type]
    assert df.count() == 300
    assert df.groupBy("value").count().count() == 300
    assert df.filter(df.value.startswith("w1")).count() == 100
    expected = 1 if cache else 3  # every action read every block again without the cache
    assert store.reads == dict.fromkeys(store.blocks, expected)
    reader.release(1000)
    assert not df.is_cached
    reader.release(1000)  # twice: nothing left to drop
    reader.close()


def test_release_later_drops_the_batch_caches_off_the_calling_thread(spark, store):
    # The job scheduler's batch thread hands the drop over and goes on; close() waits
    # for every drop handed over, in batch order, and a release after it drops at once.
    reader = BatchReader(spark, store.secret, None, 2, cache=True)
    callers: list[str] = []
    frames = []
    for t in (1000, 2000):
        df = reader.read(STREAM, t, store.infos())  # type: ignore[arg-type]
        assert df.is_cached  # the first batch of a stream; the user persists the second
        if t == 2000:
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
        df = reader.read(STREAM, 1000, s.infos())  # type: ignore[arg-type]
        assert df.count() == rows
        assert spark.conf.get(key) == "true"
        assert _first_cached_batch_bytes(spark, df) >= 10_000 * len(value)
        own = spark.createDataFrame([(value,)] * rows, "value string").cache()
        assert own.count() == rows
        assert _first_cached_batch_bytes(spark, own) < 10_000  # the session's: compressed
        own.unpersist(blocking=True)
        reader.release(1000)
    finally:
        spark.conf.unset(key)
        s.server.close()
