"""BatchedWriteAheadLog: serialization, batching, failure propagation and shutdown."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from spark_receivers.errors import CorruptRecordError, WriteAheadLogError
from spark_receivers.wal import (
    BatchedWriteAheadLog,
    FileBasedWriteAheadLog,
    RecordHandle,
    WriteAheadLog,
    deserialize_batch,
    serialize_batch,
)
from spark_receivers.wal.batched_log import BATCH_MAGIC

WAIT_S = 5.0


class BlockingLog(WriteAheadLog):
    """An in-memory WAL whose writes can be held until released, or made to fail."""

    def __init__(self) -> None:
        self.records: list[tuple[bytes, int]] = []
        self.gate = threading.Event()
        self.gate.set()
        self.entered = threading.Event()
        self.fail_with: BaseException | None = None
        self.closed = False

    def write(self, data: bytes, time_ms: int) -> RecordHandle:
        self.entered.set()
        assert self.gate.wait(WAIT_S)
        if self.fail_with is not None:
            raise self.fail_with
        self.records.append((data, time_ms))
        return RecordHandle("/mem", len(self.records) - 1, len(data))

    def read(self, handle: RecordHandle) -> bytes:
        return self.records[handle.offset][0]

    def read_all(self) -> Iterator[bytes]:
        return iter([data for data, _ in self.records])

    def clean(self, threshold_time_ms: int, wait: bool) -> None:
        self.records = [r for r in self.records if r[1] >= threshold_time_ms]

    def close(self) -> None:
        self.closed = True


class Writer(threading.Thread):
    def __init__(self, log: WriteAheadLog, data: bytes, time_ms: int) -> None:
        super().__init__(daemon=True)
        self.log, self.data, self.time_ms = log, data, time_ms
        self.handle: RecordHandle | None = None
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            self.handle = self.log.write(self.data, self.time_ms)
        except BaseException as exc:
            self.error = exc


def hold_first_write(inner: BlockingLog, log: BatchedWriteAheadLog) -> Writer:
    """Start a write and wait until the writer thread is stuck inside the wrapped write."""
    inner.gate.clear()
    first = Writer(log, b"first", 1)
    first.start()
    assert inner.entered.wait(WAIT_S)
    return first


def queue_writers(log: BatchedWriteAheadLog, items: list[tuple[bytes, int]]) -> list[Writer]:
    writers = [Writer(log, data, t) for data, t in items]
    for w in writers:
        w.start()
    with log._cond:
        assert log._cond.wait_for(lambda: len(log._queue) == len(items), WAIT_S)
    return writers


def join_all(writers: list[Writer]) -> None:
    for w in writers:
        w.join(WAIT_S)
        assert not w.is_alive()


# ------------------------------------------------------------------ serialization


@given(st.lists(st.binary(max_size=100), max_size=20))
@settings(max_examples=80, deadline=None)
def test_serialize_deserialize_round_trip(records: list[bytes]) -> None:
    assert deserialize_batch(serialize_batch(records)) == records


@given(st.binary(max_size=200))
@settings(max_examples=200, deadline=None)
def test_deserialize_garbage_raises_corrupt_record_error(garbage: bytes) -> None:
    try:
        records = deserialize_batch(garbage)
    except CorruptRecordError:
        return
    assert serialize_batch(records) == garbage  # only an exact encoding is accepted


@pytest.mark.parametrize(
    ("blob", "match"),
    [
        (b"NOPE\x00\x00\x00\x00", "bad magic"),
        (BATCH_MAGIC + b"\xff\xff\xff\xff", "count 4294967295 cannot fit"),
        (BATCH_MAGIC + b"\x00\x00\x00\x01" + b"\x7f\xff\xff\xff", "only 0 left"),
        (serialize_batch([b"a"]) + b"x", "1 trailing bytes"),
        (serialize_batch([b"a", b"b"])[:-2], "item 1 length cut"),
        (serialize_batch([b"a", b"bb"])[:-1], "item 1 says 2 bytes"),
    ],
)
def test_deserialize_names_the_inconsistency(blob: bytes, match: str) -> None:
    with pytest.raises(CorruptRecordError, match=match):
        deserialize_batch(blob)


# ---------------------------------------------------------------------- batching


def test_concurrent_writes_share_one_record_and_handle() -> None:
    inner = BlockingLog()
    log = BatchedWriteAheadLog(inner)
    first = hold_first_write(inner, log)
    writers = queue_writers(log, [(b"a", 5), (b"b", 9), (b"c", 7)])
    inner.gate.set()
    join_all([first, *writers])
    assert first.handle is not None and first.error is None
    handles = {w.handle for w in writers}
    assert len(handles) == 1 and None not in handles
    assert len(inner.records) == 2
    assert deserialize_batch(inner.records[1][0]) == [b"a", b"b", b"c"]
    assert list(log.read_all()) == [b"first", b"a", b"b", b"c"]
    log.close()


def test_batch_is_named_with_its_newest_time() -> None:
    inner = BlockingLog()
    log = BatchedWriteAheadLog(inner)
    first = hold_first_write(inner, log)
    writers = queue_writers(log, [(b"x", 3), (b"y", 12), (b"z", 8)])
    inner.gate.set()
    join_all([first, *writers])
    assert [t for _, t in inner.records] == [1, 12]
    log.close()


def test_wrapped_log_failures_reach_every_waiter() -> None:
    inner = BlockingLog()
    log = BatchedWriteAheadLog(inner)
    first = hold_first_write(inner, log)
    writers = queue_writers(log, [(b"a", 2), (b"b", 3), (b"c", 4)])
    cause = OSError(5, "disk on fire")
    inner.fail_with = cause
    inner.gate.set()
    join_all([first, *writers])
    for w in [first, *writers]:
        assert w.handle is None
        assert isinstance(w.error, WriteAheadLogError)
        assert w.error.__cause__ is cause
    inner.fail_with = None
    assert log.write(b"after", 10) is not None  # the writer thread survived
    log.close()


def test_shutdown_fails_what_is_queued() -> None:
    inner = BlockingLog()
    log = BatchedWriteAheadLog(inner)
    first = hold_first_write(inner, log)
    writers = queue_writers(log, [(b"a", 2), (b"b", 3)])
    closer = threading.Thread(target=log.close, daemon=True)
    closer.start()
    with log._cond:
        assert log._cond.wait_for(lambda: log._closed, WAIT_S)
    inner.gate.set()
    closer.join(WAIT_S)
    join_all([first, *writers])
    assert first.handle is not None  # the batch in flight completes
    for w in writers:
        assert isinstance(w.error, WriteAheadLogError)
        assert "closed" in str(w.error)
    assert inner.closed
    with pytest.raises(WriteAheadLogError, match="closed"):
        log.write(b"late", 5)
    log.close()  # idempotent


def test_a_dead_writer_thread_fails_every_waiter() -> None:
    class Fatal(BaseException):
        pass

    inner = BlockingLog()
    log = BatchedWriteAheadLog(inner)
    first = hold_first_write(inner, log)
    writers = queue_writers(log, [(b"a", 2)])
    inner.fail_with = Fatal("boom")
    inner.gate.set()
    join_all([first, *writers])
    log._thread.join(WAIT_S)
    assert not log._thread.is_alive()
    for w in [first, *writers]:
        assert isinstance(w.error, WriteAheadLogError)
    with pytest.raises(WriteAheadLogError, match="died"):
        log.write(b"more", 3)
    log.close()


def test_timeout_withdraws_a_queued_write() -> None:
    inner = BlockingLog()
    log = BatchedWriteAheadLog(inner, batching_timeout_s=0.2)
    inner.gate.clear()
    first = Writer(log, b"first", 1)
    first.start()
    assert inner.entered.wait(WAIT_S)
    with pytest.raises(WriteAheadLogError, match="withdrawn"):
        log.write(b"second", 2)
    first.join(WAIT_S)
    assert isinstance(first.error, WriteAheadLogError)
    assert "may or may not be durable" in str(first.error)
    inner.gate.set()
    log.close()
    assert list(inner.read_all()) == [serialize_batch([b"first"])]


def test_read_by_handle_is_not_supported_but_read_batch_is(tmp_path: object) -> None:
    log = BatchedWriteAheadLog(FileBasedWriteAheadLog(f"{tmp_path}/wal"))
    handle = log.write(b"only", 0)
    with pytest.raises(WriteAheadLogError, match="read_batch"):
        log.read(handle)
    assert log.read_batch(handle) == [b"only"]
    log.close()


def test_clean_is_delegated() -> None:
    inner = BlockingLog()
    log = BatchedWriteAheadLog(inner)
    log.write(b"old", 1)
    log.write(b"new", 100)
    log.clean(50, wait=True)
    assert list(log.read_all()) == [b"new"]
    log.close()


def test_invalid_timeout_is_refused() -> None:
    with pytest.raises(WriteAheadLogError, match="batching_timeout_s must be > 0, got 0"):
        BatchedWriteAheadLog(BlockingLog(), batching_timeout_s=0)
