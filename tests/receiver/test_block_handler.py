"""Block handlers (Spark's ReceivedBlockHandlerSuite) and the supervisor's storing path."""

from __future__ import annotations

import errno
import os
import threading

import pyarrow as pa
import pytest

from spark_receivers.config import StreamingConfig
from spark_receivers.errors import (
    BlockStoreError,
    ConfigError,
    ReceiverError,
    WriteAheadLogError,
)
from spark_receivers.receiver.block_placement import InProcessSink
from spark_receivers.receiver.block_store import BlockStore, StorageLevel
from spark_receivers.receiver.block_writer import (
    BlockStoreBasedBlockHandler,
    WriteAheadLogBasedBlockHandler,
)
from spark_receivers.receiver.receiver import Receiver
from spark_receivers.receiver.supervisor import ReceiverSupervisor
from spark_receivers.rpc import messages as m
from spark_receivers.rpc.auth import new_secret
from spark_receivers.rpc.transport import EndpointClient, FlightEndpoint
from spark_receivers.util.clock import ManualClock
from spark_receivers.wal import (
    CheckpointLayout,
    FileBasedWriteAheadLog,
    RecordHandle,
    WriteAheadLog,
)
from spark_receivers.wal.block_records import decode_block, read_block_from_wal
from spark_receivers.wal.faults import FaultInjector


def received_data_dir(checkpoint_dir: str, stream_id: int) -> str:
    return CheckpointLayout(checkpoint_dir).receiver_wal_dir(stream_id)


def table(start: int, n: int = 10) -> pa.Table:
    return pa.table({"value": [f"r{i}" for i in range(start, start + n)]})


def config(**overrides) -> StreamingConfig:
    values = {
        "receiver_wal_enabled": True,
        "receiver_wal_rolling_interval_s": 1,
        "receiver_wal_fsync": False,
        "block_store_timeout_s": 5.0,
    }
    values.update(overrides)
    return StreamingConfig(**values)


def in_process(store: BlockStore) -> InProcessSink:
    return InProcessSink(store, lambda: "127.0.0.1:1")


def wal_handler(ckpt, clock=None, wal=None, **cfg) -> WriteAheadLogBasedBlockHandler:
    return WriteAheadLogBasedBlockHandler(
        in_process(BlockStore(StorageLevel.MEMORY_ONLY)), 0, str(ckpt), config(**cfg), clock, wal
    )


def test_block_store_handler_stores_and_counts_records():
    store = BlockStore()
    handler = BlockStoreBasedBlockHandler(in_process(store))
    result = handler.store_block("input-0-1-0", table(0, 7), 100)
    assert (result.block_id, result.num_records, result.wal_handle) == ("input-0-1-0", 7, None)
    assert result.size_bytes > 0
    assert result.locations == ("127.0.0.1:1",)
    assert store.get("input-0-1-0") == table(0, 7)


def test_block_store_handler_raises_when_the_store_throws():
    class Broken(BlockStore):
        def put(self, name, table, generated_ms):
            raise OSError(errno.ENOSPC, "disk full")

    with pytest.raises(BlockStoreError, match="input-0-1-0") as info:
        BlockStoreBasedBlockHandler(in_process(Broken())).store_block("input-0-1-0", table(0), 1)
    assert isinstance(info.value.__cause__, OSError)


def test_wal_handler_needs_a_checkpoint_dir():
    with pytest.raises(ConfigError, match="without checkpoint directory set"):
        WriteAheadLogBasedBlockHandler(in_process(BlockStore()), 0, "", config())


def test_wal_handler_stores_blocks_that_read_back_from_the_wal_segments(tmp_path):
    clock = ManualClock(10_000)
    handler = wal_handler(tmp_path, clock)
    tables = [table(i * 10, 10 + i) for i in range(6)]
    results = []
    for i, t in enumerate(tables):
        results.append(handler.store_block(f"input-0-1-{i}", t, clock.get_time_ms()))
        clock.advance(400)  # several records per 1 s segment, several segments
    assert [r.num_records for r in results] == [t.num_rows for t in tables]
    assert all(r.wal_handle is not None for r in results)
    assert handler.log_dir == os.path.join(str(tmp_path), "receivedData", "0")
    segments = sorted(n for n in os.listdir(handler.log_dir) if n.startswith("log-"))
    assert len(segments) >= 2
    # The block store and the WAL hold the same data.
    for i, t in enumerate(tables):
        assert handler.sink.store.get(f"input-0-1-{i}") == t
    # Every handle reads back, through the reader batch tasks use.
    for r, t in zip(results, tables, strict=True):
        assert read_block_from_wal(str(tmp_path), 0, r.wal_handle) == t
    handler.close()
    # And a full replay of the segments gives every block, in order.
    replayed = [decode_block(rec) for rec in FileBasedWriteAheadLog(handler.log_dir).read_all()]
    assert replayed == tables


def test_wal_handler_with_a_uri_checkpoint_dir(tmp_path):
    handler = wal_handler(f"file://{tmp_path}")
    result = handler.store_block("input-0-1-0", table(0), 1_000)
    handler.close()
    assert result.wal_handle["path"].startswith(str(tmp_path))
    assert read_block_from_wal(f"file://{tmp_path}", 0, result.wal_handle) == table(0)


def test_a_failed_wal_write_fails_the_block_and_leaves_nothing_in_the_store(tmp_path):
    faults = FaultInjector()
    log_dir = received_data_dir(str(tmp_path), 0)
    wal = FileBasedWriteAheadLog(log_dir, fsync_hook=faults.fsync, max_failures=2)
    handler = wal_handler(tmp_path, wal=wal)
    faults.fail_next("fsync", 2, errno.EIO)
    with pytest.raises(BlockStoreError, match=r"input-0-1-0.*write-ahead log failed") as info:
        handler.store_block("input-0-1-0", table(0), 1_000)
    assert isinstance(info.value.__cause__, WriteAheadLogError)
    handler._pool.submit(lambda: None).result()  # the store put's done-callback has run
    assert "input-0-1-0" not in handler.sink.store
    # Progress resumes once the fault is cleared.
    ok = handler.store_block("input-0-1-1", table(10), 1_001)
    assert read_block_from_wal(str(tmp_path), 0, ok.wal_handle) == table(10)
    handler.close()


def test_an_oversized_block_is_refused(tmp_path):
    log_dir = received_data_dir(str(tmp_path), 0)
    wal = FileBasedWriteAheadLog(log_dir, fsync=False, max_record_bytes=1024)
    handler = wal_handler(tmp_path, wal=wal)
    with pytest.raises(BlockStoreError, match="max_record_bytes"):
        handler.store_block("input-0-1-0", table(0, 1000), 1_000)
    handler._pool.submit(lambda: None).result()
    assert len(handler.sink.store) == 0
    handler.close()


def test_a_throwing_block_store_fails_the_block(tmp_path):
    class Broken(BlockStore):
        def put(self, name, table, generated_ms):
            raise OSError(errno.ENOSPC, "spill disk full")

    handler = WriteAheadLogBasedBlockHandler(in_process(Broken()), 0, str(tmp_path), config())
    with pytest.raises(BlockStoreError, match=r"block store failed.*spill disk full"):
        handler.store_block("input-0-1-0", table(0), 1_000)
    handler.close()


class StuckLog(WriteAheadLog):
    def __init__(self) -> None:
        self.release = threading.Event()

    def write(self, data: bytes, time_ms: int) -> RecordHandle:
        self.release.wait(30)
        raise WriteAheadLogError("released")

    def read(self, handle):
        raise NotImplementedError

    def read_all(self):
        return iter(())

    def clean(self, threshold_time_ms, wait):
        pass

    def close(self):
        self.release.set()


def test_a_wal_write_past_the_block_store_timeout_fails_the_block(tmp_path):
    handler = wal_handler(tmp_path, wal=StuckLog(), block_store_timeout_s=0.2)
    with pytest.raises(BlockStoreError, match=r"not stored within block_store_timeout_s=0\.2"):
        handler.store_block("input-0-1-0", table(0), 1_000)
    handler.close()
    assert "input-0-1-0" not in handler.sink.store


def test_wal_cleanup_deletes_old_segments_only(tmp_path):
    clock = ManualClock(10_000)
    handler = wal_handler(tmp_path, clock)
    handles = []
    for i in range(8):
        handles.append(handler.store_block(f"input-0-1-{i}", table(i), clock.get_time_ms()))
        clock.advance(1000)
    before = sorted(os.listdir(handler.log_dir))
    handler.cleanup_old_blocks(14_500)
    assert isinstance(handler.wal, FileBasedWriteAheadLog)
    assert handler.wal.wait_for_cleanups(10)
    after = sorted(os.listdir(handler.log_dir))
    assert 0 < len(after) < len(before)
    # Records at or after the threshold are all still readable.
    for i, h in enumerate(handles):
        if 10_000 + i * 1000 >= 14_500:
            assert read_block_from_wal(str(tmp_path), 0, h.wal_handle) == table(i)
    with pytest.raises(WriteAheadLogError, match="does not exist"):
        read_block_from_wal(str(tmp_path), 0, handles[0].wal_handle)
    handler.close()


def test_handles_outside_the_receiver_wal_are_refused(tmp_path):
    handler = wal_handler(tmp_path)
    good = handler.store_block("input-0-1-0", table(0), 1_000).wal_handle
    handler.close()
    outside = dict(good, path=str(tmp_path / "elsewhere" / "log-1-2"))
    with pytest.raises(WriteAheadLogError, match="not inside"):
        read_block_from_wal(str(tmp_path), 0, outside)
    with pytest.raises(WriteAheadLogError, match=r"'\.\.'"):
        read_block_from_wal(str(tmp_path), 0, dict(good, path=good["path"] + "/../../x"))
    with pytest.raises(WriteAheadLogError, match="not inside"):
        read_block_from_wal(str(tmp_path), 1, good)  # another stream's directory


# --- the supervisor's storing path, against a fake driver endpoint -------------------


class FakeTracker:
    """A tracker endpoint that accepts registration and records AddBlocks."""

    def __init__(self, secret: str) -> None:
        self.blocks: list[m.ReceivedBlockInfo] = []
        self.endpoint = FlightEndpoint(
            "fake-tracker", "127.0.0.1", secret, m.TRACKER_MESSAGES, self.handle
        )

    def handle(self, message):
        if isinstance(message, m.AddBlocks):
            self.blocks.extend(message.block_infos)
            return [True] * len(message.block_infos)
        return True


class Idle(Receiver):
    def on_start(self) -> None:
        pass

    def on_stop(self) -> None:
        pass


@pytest.fixture
def supervised(tmp_path):
    secret = new_secret()
    tracker = FakeTracker(secret)
    receiver = Idle()
    # The task's own block store: these tests look at it next to the WAL.
    cfg = config(
        checkpoint_dir=str(tmp_path), receiver_drain_timeout_s=1.0, block_keeper_enabled=False
    )
    sup = ReceiverSupervisor(
        receiver, 0, tracker.endpoint.address, secret, cfg, "127.0.0.1", "driver"
    )
    sup.start()
    yield receiver, sup, tracker, secret
    sup.block_store.clear()
    sup.stop("test over")
    tracker.endpoint.close()


def test_supervisor_reports_wal_handles_and_refuses_blocks_whose_wal_write_failed(
    supervised, tmp_path
):
    receiver, sup, tracker, _ = supervised
    assert isinstance(sup.block_handler, WriteAheadLogBasedBlockHandler)
    receiver.store(["a", "b", "c"], reliable=True)
    (info,) = tracker.blocks
    assert info.num_records == 3 and info.wal_handle is not None
    assert read_block_from_wal(str(tmp_path), 0, info.wal_handle).column(0).to_pylist() == [
        "a",
        "b",
        "c",
    ]

    faults = FaultInjector()
    sup.block_handler.wal = FileBasedWriteAheadLog(
        received_data_dir(str(tmp_path), 0), fsync_hook=faults.fsync, max_failures=1
    )
    faults.fail_next("fsync", 1, errno.ENOSPC)
    with pytest.raises(BlockStoreError, match="write-ahead log failed"):
        receiver.store(["lost"], reliable=True)
    assert len(tracker.blocks) == 1  # no AddBlock for it
    receiver.store(["d"], reliable=True)  # cleared: progress resumes
    assert [b.num_records for b in tracker.blocks] == [3, 1]


def test_supervisor_store_raises_when_the_driver_refuses_the_block(supervised):
    receiver, _sup, tracker, _ = supervised
    tracker.handle = lambda message: (
        [False] * len(message.block_infos) if isinstance(message, m.AddBlocks) else True
    )
    tracker.endpoint._handler = tracker.handle
    with pytest.raises(ReceiverError, match="Failed to add block"):
        receiver.store(["x"], reliable=True)


def test_cleanup_old_blocks_cleans_the_receiver_wal_not_the_block_store(tmp_path):
    secret = new_secret()
    tracker = FakeTracker(secret)
    clock = ManualClock(1_000_000)  # the WAL's record times and its rolling come from it
    cfg = config(
        checkpoint_dir=str(tmp_path), receiver_drain_timeout_s=1.0, block_keeper_enabled=False
    )
    sup = ReceiverSupervisor(
        Idle(), 0, tracker.endpoint.address, secret, cfg, "127.0.0.1", "driver", clock
    )
    sup.start()
    try:
        handler = sup.block_handler  # the pipe's: the one CleanupOldBlocks reaches
        for i in range(4):
            handler.store_block(f"input-0-1-{i}", table(i), clock.get_time_ms())
            clock.advance(2_000)
        log_dir = received_data_dir(str(tmp_path), 0)
        before = len([n for n in os.listdir(log_dir) if n.startswith("log-")])
        client = EndpointClient(sup.endpoint, secret)
        try:
            assert client.call(m.CleanupOldBlocks(1_005_000)) is True
        finally:
            client.close()
        wal = getattr(handler.wal, "wal", handler.wal)  # under the metrics' timing wrapper
        assert isinstance(wal, FileBasedWriteAheadLog)
        assert wal.wait_for_cleanups(10)
        after = len([n for n in os.listdir(log_dir) if n.startswith("log-")])
        assert after < before
        assert len(sup.block_store) == 4  # in-memory blocks leave by id (RemoveBlocks) only
    finally:
        sup.block_store.clear()
        sup.stop("test over")
        tracker.endpoint.close()
