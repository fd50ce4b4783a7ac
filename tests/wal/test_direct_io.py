"""The receiver WAL's direct-I/O segments: padded frames, the same records, the fall-backs."""

from __future__ import annotations

import errno
import fcntl
import logging
import os
import stat
from typing import Any

import pyarrow as pa
import pytest
from wal_helpers import generate_data, segment_files

from spark_receivers.config import StreamingConfig
from spark_receivers.receiver.block_placement import InProcessSink
from spark_receivers.receiver.block_store import BlockStore, StorageLevel
from spark_receivers.receiver.block_writer import WriteAheadLogBasedBlockHandler
from spark_receivers.wal import FileBasedWriteAheadLog
from spark_receivers.wal import _storage as storage_module
from spark_receivers.wal.block_records import read_block_from_wal
from spark_receivers.wal.framing import DIRECT_IO_ALIGN, HEADER_SIZE, encode_frame

O_DIRECT = getattr(os, "O_DIRECT", 0)
pytestmark = pytest.mark.skipif(not O_DIRECT, reason="O_DIRECT is Linux's")

# Records around a block's edge: header + payload just under, at and over 4096 bytes.
EDGE = [DIRECT_IO_ALIGN - HEADER_SIZE + d for d in (-1, 0, 1)]


def supports_direct_io(directory: str) -> bool:
    """Whether this filesystem opens files with O_DIRECT (the test's own probe)."""
    probe = os.path.join(directory, "probe")
    try:
        fd = os.open(probe, os.O_WRONLY | os.O_CREAT | O_DIRECT, 0o644)
    except OSError as e:
        if e.errno == errno.EINVAL:
            return False
        raise
    finally:
        if os.path.exists(probe):
            os.unlink(probe)
    os.close(fd)
    return True


def records() -> list[bytes]:
    return [b"", b"x"] + [bytes([n % 251]) * n for n in EDGE] + generate_data(5) + [b"z" * 70_000]


def test_records_round_trip_in_padded_frames(tmp_path: Any) -> None:
    log_dir = str(tmp_path / "wal")
    os.makedirs(log_dir)
    direct = supports_direct_io(log_dir)
    data = records()
    log = FileBasedWriteAheadLog(log_dir, rolling_interval_s=3600, direct_io=True)
    handles = [log.write(item, 0) for item in data]
    assert log._storage.direct_io is direct  # type: ignore[attr-defined]
    (path,) = segment_files(log_dir)
    if direct:
        fd = log._writer._fd  # type: ignore[union-attr]
        assert fcntl.fcntl(fd, fcntl.F_GETFL) & O_DIRECT
        assert all(h.offset % DIRECT_IO_ALIGN == 0 for h in handles)
        assert os.path.getsize(path) % DIRECT_IO_ALIGN == 0
    assert [log.read(h) for h in handles] == data
    log.close()
    assert list(FileBasedWriteAheadLog(log_dir).read_all()) == data


def test_buffered_and_direct_segments_read_back_together(tmp_path: Any) -> None:
    log_dir = str(tmp_path / "wal")
    first, second = generate_data(4), generate_data(4, seed=9)
    for direct, data, start in ((False, first, 0), (True, second, 10_000)):
        log = FileBasedWriteAheadLog(log_dir, rolling_interval_s=1, direct_io=direct)
        for i, item in enumerate(data):
            log.write(item, start + i * 100)
        log.close()
    assert list(FileBasedWriteAheadLog(log_dir).read_all()) == first + second


def test_a_torn_direct_write_leaves_every_acknowledged_record(tmp_path: Any) -> None:
    log_dir = str(tmp_path / "wal")
    data = generate_data(3)
    log = FileBasedWriteAheadLog(log_dir, rolling_interval_s=3600, direct_io=True)
    for item in data:
        log.write(item, 0)
    log.close()
    (path,) = segment_files(log_dir)
    with open(path, "ab") as f:  # a crash mid-write: half a frame, then zeros to the block
        torn = encode_frame(b"never acknowledged" * 100)[:700]
        f.write(torn + bytes(DIRECT_IO_ALIGN - len(torn)))
    assert list(FileBasedWriteAheadLog(log_dir).read_all()) == data


def test_a_failed_sync_cuts_the_frame_and_the_retry_goes_to_a_new_file(tmp_path: Any) -> None:
    log_dir = str(tmp_path / "wal")
    record_syncs = []

    def fsync(fd: int) -> None:
        if stat.S_ISREG(os.fstat(fd).st_mode):  # not the directories' syncs
            record_syncs.append(fd)
            if len(record_syncs) == 2:  # the second record's
                raise OSError(errno.EIO, "injected")
        os.fdatasync(fd)

    log = FileBasedWriteAheadLog(log_dir, rolling_interval_s=3600, fsync_hook=fsync, direct_io=True)
    one = log.write(b"one", 0)
    two = log.write(b"two" * 2000, 0)
    assert two.path != one.path
    assert os.path.getsize(one.path) == DIRECT_IO_ALIGN  # the failed frame was cut off
    assert [log.read(one), log.read(two)] == [b"one", b"two" * 2000]
    log.close()
    assert list(FileBasedWriteAheadLog(log_dir).read_all()) == [b"one", b"two" * 2000]


def test_a_filesystem_without_direct_io_is_written_buffered(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    real_open = os.open

    def refusing_open(path: str, flags: int, *args: Any) -> int:
        if flags & O_DIRECT:  # what an old tmpfs does: creates the file, then EINVAL
            os.close(real_open(path, flags & ~O_DIRECT, *args))
            raise OSError(errno.EINVAL, "Invalid argument", path)
        return real_open(path, flags, *args)

    monkeypatch.setattr(storage_module.os, "open", refusing_open)
    log_dir = str(tmp_path / "wal")
    data = generate_data(4)
    with caplog.at_level(logging.INFO, logger=storage_module.__name__):
        log = FileBasedWriteAheadLog(log_dir, rolling_interval_s=3600, direct_io=True)
        handles = [log.write(item, 0) for item in data]
    assert "no O_DIRECT on this filesystem" in caplog.text
    assert log._storage.direct_io is False  # type: ignore[attr-defined]
    (path,) = segment_files(log_dir)
    assert os.path.getsize(path) == sum(len(encode_frame(item)) for item in data)  # no padding
    assert [log.read(h) for h in handles] == data
    log.close()


def refuse_direct_writes(log_dir: str, monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Make ``log_dir`` a filesystem that opens with O_DIRECT but refuses such writes;
    the offsets of the refused writes are appended to the list returned."""
    os.makedirs(log_dir)
    if not supports_direct_io(log_dir):
        pytest.fail(f"{log_dir}: this machine's temporary directory should allow O_DIRECT")
    real_pwrite = os.pwrite
    refused: list[int] = []

    def pwrite(fd: int, data: Any, offset: int) -> int:
        if fcntl.fcntl(fd, fcntl.F_GETFL) & O_DIRECT:
            refused.append(offset)
            raise OSError(errno.EINVAL, "Invalid argument")
        return real_pwrite(fd, data, offset)

    monkeypatch.setattr(storage_module.os, "pwrite", pwrite)
    return refused


def test_a_refused_direct_write_is_written_through_the_cache(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    log_dir = str(tmp_path / "wal")
    refused = refuse_direct_writes(log_dir, monkeypatch)
    with caplog.at_level(logging.INFO, logger=storage_module.__name__):
        log = FileBasedWriteAheadLog(log_dir, rolling_interval_s=3600, direct_io=True)
        handles = [log.write(item, 0) for item in (b"one", b"two")]
    assert refused == [0]  # once: the flag is gone from that file after it
    assert "direct write refused" in caplog.text
    assert [log.read(h) for h in handles] == [b"one", b"two"]
    log.close()
    assert list(FileBasedWriteAheadLog(log_dir).read_all()) == [b"one", b"two"]


def test_after_a_refused_direct_write_later_segments_are_opened_buffered(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    log_dir = str(tmp_path / "wal")
    refused = refuse_direct_writes(log_dir, monkeypatch)
    real_open = os.open
    direct_opens = []

    def open_(path: str, flags: int, *args: Any) -> int:
        if flags & O_DIRECT:
            direct_opens.append(path)
        return real_open(path, flags, *args)

    monkeypatch.setattr(storage_module.os, "open", open_)
    with caplog.at_level(logging.INFO, logger=storage_module.__name__):
        log = FileBasedWriteAheadLog(log_dir, rolling_interval_s=1, direct_io=True)
        # One record per segment: each time is past the last segment's end.
        handles = [log.write(item, t) for t, item in ((0, b"one"), (5_000, b"two"), (9_000, b"3"))]
    assert len(segment_files(log_dir)) == 3
    assert len(direct_opens) == 1 and refused == [0]  # the first segment only
    assert caplog.text.count("direct write refused") == 1
    assert [log.read(h) for h in handles] == [b"one", b"two", b"3"]
    log.close()
    assert list(FileBasedWriteAheadLog(log_dir).read_all()) == [b"one", b"two", b"3"]


def test_the_receiver_wal_writes_direct_unless_configured_off(tmp_path: Any) -> None:
    checkpoint = str(tmp_path / "ckpt")
    os.makedirs(checkpoint)
    expected = supports_direct_io(checkpoint)
    block = pa.table({"value": [f"line {i}" for i in range(1000)]})
    for on in (True, False):
        config = StreamingConfig(receiver_wal_enabled=True, receiver_wal_direct_io=on)
        sink = InProcessSink(BlockStore(StorageLevel.MEMORY_ONLY), lambda: "127.0.0.1:1")
        handler = WriteAheadLogBasedBlockHandler(sink, 0, checkpoint, config)
        try:
            results = [handler.store_block(f"input-0-{on}-{i}", block, 1000) for i in range(2)]
            assert handler.wal._storage.direct_io is (on and expected)  # type: ignore[attr-defined]
        finally:
            handler.close()
        handles = [r.wal_handle for r in results]
        assert all(h is not None for h in handles)
        assert (handles[1]["offset"] % DIRECT_IO_ALIGN == 0) is (on and expected)
        assert all(read_block_from_wal(checkpoint, 0, h) == block for h in handles)
    assert StreamingConfig().receiver_wal_direct_io is True
