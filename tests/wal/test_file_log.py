"""Spark's WriteAheadLogSuite scenarios, for file-based and batched logs, append and close modes."""

from __future__ import annotations

import logging
import os
import random
import threading

import pytest
from wal_helpers import (
    STEP_MS,
    LogKind,
    generate_data,
    make_log,
    read_all,
    segment_files,
    truncate,
    write_and_close,
    write_data,
)

from spark_receivers.errors import CorruptRecordError, WriteAheadLogError
from spark_receivers.util.clock import ManualClock
from spark_receivers.wal import BatchedWriteAheadLog, FileBasedWriteAheadLog, RecordHandle
from spark_receivers.wal.faults import FaultInjector
from spark_receivers.wal.framing import encode_frame

# ---------------------------------------------------------------- all four kinds


def test_read_all_logs_after_write(kind: LogKind, log_dir: str) -> None:
    data = generate_data(20)
    write_and_close(kind, log_dir, data)
    assert read_all(kind, log_dir) == data


def test_write_logs_across_several_rolled_files(kind: LogKind, log_dir: str) -> None:
    data = generate_data(10)
    write_and_close(kind, log_dir, data)
    files = segment_files(log_dir)
    assert len(files) > 1
    names = [os.path.basename(f) for f in files]
    if not kind.close_after_write:
        # writes every 500 ms, 1 s segments: a new segment at 0, 1000, 2000, ...
        assert names == [f"log-{t}-{t + 1000}" for t in range(0, 10 * STEP_MS, 1000)]
    else:
        assert len(names) == len(data) or kind.batched
    assert read_all(kind, log_dir) == data


def test_read_all_across_several_restarts(kind: LogKind, log_dir: str) -> None:
    first, second = generate_data(6, seed=1), generate_data(6, seed=2)
    write_and_close(kind, log_dir, first)
    write_and_close(kind, log_dir, second, start_ms=100_000)
    assert read_all(kind, log_dir) == first + second


@pytest.mark.parametrize("wait", [True, False], ids=["sync", "async"])
def test_clean_old_logs(kind: LogKind, log_dir: str, wait: bool) -> None:
    data = generate_data(20)
    log = make_log(kind, log_dir)
    write_data(log, data)  # times 0 .. 9500
    before = segment_files(log_dir)
    log.clean(5000, wait=wait)
    if not wait:
        inner = log.wrapped if isinstance(log, BatchedWriteAheadLog) else log
        assert isinstance(inner, FileBasedWriteAheadLog)
        assert inner.wait_for_cleanups(5.0)
    after = segment_files(log_dir)
    assert 0 < len(after) < len(before)
    for path in after:
        end = int(os.path.basename(path).split(".")[0].split("-")[2])
        assert end >= 5000
    for path in set(before) - set(after):
        assert int(os.path.basename(path).split(".")[0].split("-")[2]) < 5000
    log.close()
    recovered = read_all(kind, log_dir)
    # What is left is a suffix of what was written: every record with time >= 4000.
    assert recovered == data[len(data) - len(recovered) :]
    assert data[8:] == recovered or data[9:] == recovered


def test_handling_file_errors_while_reading_rotating_logs(kind: LogKind, log_dir: str) -> None:
    clock = ManualClock()
    first = generate_data(10, seed=1)
    write_and_close(kind, log_dir, first, start_ms=clock.get_time_ms())
    files1 = segment_files(log_dir)
    assert len(files1) > 1
    clock.advance(100_000)
    second = generate_data(10, seed=2)
    write_and_close(kind, log_dir, second, start_ms=clock.get_time_ms())
    files2 = segment_files(log_dir)
    assert len(files2) > len(files1)
    assert read_all(kind, log_dir) == first + second
    for path in files1:
        truncate(path, 1)  # basically unreadable
    assert read_all(kind, log_dir) == second


def test_no_directory_or_file_created_until_first_write(kind: LogKind, log_dir: str) -> None:
    log = make_log(kind, log_dir)
    assert list(log.read_all()) == []
    log.clean(10_000, wait=True)
    assert not os.path.exists(log_dir)
    log.write(b"first", 0)
    assert len(segment_files(log_dir)) == 1
    log.close()
    assert not os.path.exists(log_dir + "-never")
    make_log(kind, log_dir + "-never").close()
    assert not os.path.exists(log_dir + "-never")


def test_close_is_idempotent_and_write_after_close_raises(kind: LogKind, log_dir: str) -> None:
    log = make_log(kind, log_dir)
    log.write(b"a", 0)
    log.close()
    log.close()
    with pytest.raises(WriteAheadLogError, match="close"):
        log.write(b"b", 1)
    assert list(log.read_all()) == [b"a"]


def test_concurrent_writers_all_recovered(kind: LogKind, log_dir: str) -> None:
    log = make_log(kind, log_dir)
    clock = ManualClock()
    results: dict[bytes, RecordHandle] = {}
    errors: list[BaseException] = []

    def writer(tid: int) -> None:
        try:
            for i in range(25):
                item = f"t{tid}-{i}".encode()
                results[item] = log.write(item, clock.get_time_ms())
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=writer, args=(t,)) for t in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert not errors
    log.close()
    recovered = read_all(kind, log_dir)
    assert sorted(recovered) == sorted(results)
    for tid in range(6):  # each thread's own records keep their order
        mine = [r for r in recovered if r.startswith(f"t{tid}-".encode())]
        assert mine == [f"t{tid}-{i}".encode() for i in range(25)]


# -------------------------------------------------------------- file log only


@pytest.fixture(params=[False, True], ids=["append", "close"])
def close_after_write(request: pytest.FixtureRequest) -> bool:
    return request.param


def test_reader_after_corrupted_write(log_dir: str) -> None:
    data = generate_data(10)
    log = FileBasedWriteAheadLog(log_dir, rolling_interval_s=3600)
    for item in data:
        log.write(item, 0)
    log.close()
    (path,) = segment_files(log_dir)
    length = os.path.getsize(path)
    with open(path, "ab") as f:  # append some garbage
        f.write(b"\x01" * 10)
    assert read_all(LogKind(False, False), log_dir) == data
    with open(path, "ab") as f:  # and more, longer than a header
        f.write(random.Random(3).randbytes(500))
    assert read_all(LogKind(False, False), log_dir) == data
    truncate(path, length - 1)  # cut the last byte: all but the last
    assert read_all(LogKind(False, False), log_dir) == data[:-1]


def test_missing_file_on_read(close_after_write: bool, log_dir: str) -> None:
    log = FileBasedWriteAheadLog(log_dir, close_file_after_write=close_after_write)
    handle = log.write(b"gone", 0)
    log.close()
    os.remove(handle.path)
    with pytest.raises(WriteAheadLogError, match="does not exist") as info:
        log.read(handle)
    assert handle.path in str(info.value)
    assert list(log.read_all()) == []


def test_random_reads_by_handle(close_after_write: bool, log_dir: str) -> None:
    data = generate_data(30)
    log = FileBasedWriteAheadLog(
        log_dir, rolling_interval_s=1, close_file_after_write=close_after_write
    )
    handles = write_data(log, data)
    pairs = list(zip(handles, data, strict=True))
    random.Random(5).shuffle(pairs)
    for handle, item in pairs:
        assert handle.length == len(item)
        assert log.read(handle) == item
        assert log.read(RecordHandle.from_dict(handle.to_dict())) == item
    log.close()
    reopened = FileBasedWriteAheadLog(log_dir)
    assert [reopened.read(h) for h in handles] == data


def test_read_verifies_the_handle(log_dir: str) -> None:
    log = FileBasedWriteAheadLog(log_dir)
    first = log.write(b"first-record", 0)
    second = log.write(b"second", 0)
    bad_length = RecordHandle(first.path, first.offset, first.length + 1)
    with pytest.raises(CorruptRecordError, match=f"offset {first.offset}"):
        log.read(bad_length)
    with pytest.raises(CorruptRecordError, match="offset 3"):
        log.read(RecordHandle(first.path, 3, first.length))
    with pytest.raises(CorruptRecordError, match="the file is only"):
        log.read(RecordHandle(first.path, 10_000, 1))
    outside = RecordHandle(os.path.join(log_dir, "..", "elsewhere", "log-0-1"), 0, 1)
    with pytest.raises(WriteAheadLogError, match=r"refused|not inside"):
        log.read(outside)
    with open(second.path, "r+b") as f:  # flip a payload byte of the second record
        f.seek(second.offset + 12)
        byte = f.read(1)
        f.seek(second.offset + 12)
        f.write(bytes([byte[0] ^ 0xFF]))
    with pytest.raises(CorruptRecordError, match=f"{second.path} at offset {second.offset}"):
        log.read(second)
    log.close()


def test_reopened_log_with_torn_tail_writes_a_new_file(log_dir: str) -> None:
    log = FileBasedWriteAheadLog(log_dir, rolling_interval_s=3600)
    log.write(b"one", 0)
    log.write(b"two", 10)
    log.close()
    (path,) = segment_files(log_dir)
    with open(path, "ab") as f:
        f.write(encode_frame(b"torn-record")[:-3])
    size = os.path.getsize(path)
    log = FileBasedWriteAheadLog(log_dir, rolling_interval_s=3600)
    handle = log.write(b"three", 0)  # same time range as the torn segment
    log.close()
    assert handle.path != path
    assert os.path.basename(handle.path) == "log-0-3600000.1"
    assert os.path.getsize(path) == size
    assert list(FileBasedWriteAheadLog(log_dir).read_all()) == [b"one", b"two", b"three"]


def test_corrupt_frame_mid_file_raises_naming_file_and_offset(log_dir: str) -> None:
    log = FileBasedWriteAheadLog(log_dir)
    handles = [log.write(item, 0) for item in generate_data(5)]
    log.close()
    target = handles[2]
    with open(target.path, "r+b") as f:
        f.seek(target.offset + 1)  # inside the length field
        f.write(b"\x7f")
    with pytest.raises(CorruptRecordError) as info:
        list(FileBasedWriteAheadLog(log_dir).read_all())
    assert target.path in str(info.value)
    assert f"offset {target.offset}" in str(info.value)


def test_clean_never_deletes_the_open_segment(log_dir: str) -> None:
    log = FileBasedWriteAheadLog(log_dir, rolling_interval_s=1)
    log.write(b"a", 0)
    log.clean(1_000_000, wait=True)
    log.write(b"b", 10)  # still the same open segment, which must still exist
    log.close()
    assert list(FileBasedWriteAheadLog(log_dir).read_all()) == [b"a", b"b"]


def test_deletion_errors_are_logged_not_raised(
    close_after_write: bool, log_dir: str, caplog: pytest.LogCaptureFixture
) -> None:
    faults = FaultInjector()
    log = FileBasedWriteAheadLog(
        log_dir,
        filesystem=faults.filesystem(),
        rolling_interval_s=1,
        close_file_after_write=close_after_write,
    )
    data = generate_data(10)
    write_data(log, data)  # times 0..4500
    faults.fail_next("delete", 1)
    with caplog.at_level(logging.WARNING):
        log.clean(3000, wait=True)
    assert faults.raised["delete"] == 1
    assert "could not delete old WAL segment" in caplog.text
    recovered = list(log.read_all())
    # the segment whose deletion failed is still read; the others are gone
    assert recovered[-4:] == data[-4:]
    assert set(recovered) <= set(data)
    faults.fail_next("delete", 100)
    log.clean(3000, wait=False)
    assert log.wait_for_cleanups(5.0)
    log.close()


def test_a_write_error_is_retried_on_a_new_file(close_after_write: bool, log_dir: str) -> None:
    faults = FaultInjector()
    log = FileBasedWriteAheadLog(
        log_dir, filesystem=faults.filesystem(), close_file_after_write=close_after_write
    )
    log.write(b"one", 0)
    faults.fail_next("write", 2)
    handle = log.write(b"two", 0)  # third attempt succeeds
    assert log.read(handle) == b"two"
    log.close()
    assert list(FileBasedWriteAheadLog(log_dir).read_all()) == [b"one", b"two"]


def test_parallel_recovery_keeps_order(log_dir: str) -> None:
    data = generate_data(60)
    log = FileBasedWriteAheadLog(log_dir, close_file_after_write=True, recovery_threads=4)
    write_data(log, data, step_ms=1)
    assert len(segment_files(log_dir)) == 60
    assert list(log.read_all()) == data
    log.close()


def test_same_time_writes_in_close_mode_get_distinct_files(log_dir: str) -> None:
    log = FileBasedWriteAheadLog(log_dir, close_file_after_write=True)
    handles = [log.write(bytes([i]), 42) for i in range(5)]
    assert len({h.path for h in handles}) == 5
    assert list(log.read_all()) == [bytes([i]) for i in range(5)]
    log.close()


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"rolling_interval_s": 0}, "rolling_interval_s must be > 0, got 0"),
        ({"max_failures": 0}, "max_failures must be >= 1, got 0"),
        ({"max_record_bytes": -1}, "max_record_bytes must be > 0, got -1"),
    ],
)
def test_invalid_configuration_is_refused(log_dir: str, kwargs: dict, match: str) -> None:
    with pytest.raises(WriteAheadLogError, match=match):
        FileBasedWriteAheadLog(log_dir, **kwargs)


def test_invalid_writes_are_refused(log_dir: str) -> None:
    log = FileBasedWriteAheadLog(log_dir, max_record_bytes=10)
    with pytest.raises(WriteAheadLogError, match="above max_record_bytes=10"):
        log.write(b"x" * 11, 0)
    with pytest.raises(WriteAheadLogError, match="time_ms must be an int >= 0"):
        log.write(b"x", -1)
    with pytest.raises(TypeError):
        log.write("text", 0)  # type: ignore[arg-type]
    assert not os.path.exists(log_dir)


def test_any_contiguous_buffer_is_written_as_its_bytes(log_dir: str) -> None:
    import array

    import pyarrow as pa

    log = FileBasedWriteAheadLog(log_dir)
    words = array.array("I", [1, 2, 3])  # a view with 4-byte items, not "B"
    sources = [bytearray(b"ba"), memoryview(words), memoryview(pa.py_buffer(b"arrow"))]
    handles = [log.write(s, i) for i, s in enumerate(sources)]
    assert [h.length for h in handles] == [2, 12, 5]
    assert [log.read(h) for h in handles] == [b"ba", words.tobytes(), b"arrow"]
    with pytest.raises(TypeError, match="contiguous"):
        log.write(memoryview(b"abcdef")[::2], 9)
    log.close()
    assert list(FileBasedWriteAheadLog(log_dir).read_all()) == [b"ba", words.tobytes(), b"arrow"]


def test_uri_log_dir(tmp_path: object) -> None:
    log_dir = os.path.join(str(tmp_path), "uri-wal")
    log = FileBasedWriteAheadLog("file://" + log_dir)
    handle = log.write(b"via-uri", 5)
    assert handle.path.startswith(log_dir)
    assert list(log.read_all()) == [b"via-uri"]
    log.close()
