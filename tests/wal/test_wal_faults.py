"""ENOSPC / EIO on write, open, close and fsync: no handle, no ack, progress once cleared.

Also the write -> read_all round trip through the real file log as a property.
"""

from __future__ import annotations

import errno
import os
import tempfile
from dataclasses import dataclass

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from wal_helpers import segment_files, truncate

from spark_receivers.errors import WriteAheadLogError
from spark_receivers.wal import FileBasedWriteAheadLog, RecordHandle
from spark_receivers.wal.faults import FaultInjector
from spark_receivers.wal.framing import HEADER_SIZE

ERRNOS = [errno.ENOSPC, errno.EIO]
MAX_FAILURES = 3
SETTINGS = settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck))


def open_log(kind: str, log_dir: str, faults: FaultInjector, close: bool) -> FileBasedWriteAheadLog:
    """``fsync`` faults go through the local fsync hook, the rest through the pyarrow layer."""
    if kind == "fsync":
        return FileBasedWriteAheadLog(
            log_dir, fsync_hook=faults.fsync, close_file_after_write=close, max_failures=3
        )
    return FileBasedWriteAheadLog(
        log_dir, filesystem=faults.filesystem(), close_file_after_write=close, max_failures=3
    )


@pytest.mark.parametrize("err", ERRNOS, ids=["ENOSPC", "EIO"])
@pytest.mark.parametrize("kind", ["write", "fsync", "open"])
@pytest.mark.parametrize("close", [False, True], ids=["append", "close"])
def test_fault_fails_the_write_and_progress_resumes(
    tmp_path: object, kind: str, err: int, close: bool
) -> None:
    faults = FaultInjector()
    log_dir = os.path.join(str(tmp_path), "wal")
    log = open_log(kind, log_dir, faults, close)
    acked = [log.write(b"before", 0)]
    faults.fail_next(kind, MAX_FAILURES, err)
    with pytest.raises(WriteAheadLogError, match="after 3 attempts") as info:
        log.write(b"failed", 100_000)  # a new segment: open faults apply too
    assert isinstance(info.value.__cause__, OSError)
    assert info.value.__cause__.errno == err
    assert faults.raised[kind] == MAX_FAILURES
    acked.append(log.write(b"after", 100_001))  # the fault is cleared
    assert [log.read(h) for h in acked] == [b"before", b"after"]
    log.close()
    recovered = list(FileBasedWriteAheadLog(log_dir).read_all())
    assert recovered == [b"before", b"after"]


def test_fault_on_close_in_object_mode_is_a_failed_write(tmp_path: object) -> None:
    faults = FaultInjector()
    log_dir = os.path.join(str(tmp_path), "wal")
    log = FileBasedWriteAheadLog(
        log_dir, filesystem=faults.filesystem(), close_file_after_write=True
    )
    faults.fail_next("close", MAX_FAILURES, errno.EIO)
    with pytest.raises(WriteAheadLogError):
        log.write(b"never-committed", 0)
    assert segment_files(log_dir) == []
    log.write(b"ok", 1)
    assert list(log.read_all()) == [b"ok"]
    log.close()


@dataclass(frozen=True)
class Op:
    faults: int
    kind: str
    err: int


ops = st.lists(
    st.builds(
        Op,
        st.integers(0, MAX_FAILURES + 1),
        st.sampled_from(["write", "fsync"]),
        st.sampled_from(ERRNOS),
    ),
    min_size=1,
    max_size=8,
)


@SETTINGS
@given(ops, st.booleans(), st.booleans())
def test_property_faults_never_yield_a_handle_and_never_lose_an_ack(
    operations: list[Op], close: bool, local: bool
) -> None:
    faults = FaultInjector()
    with tempfile.TemporaryDirectory() as tmp:
        log_dir = os.path.join(tmp, "wal")
        log = open_log("fsync" if local else "write", log_dir, faults, close)
        acked: list[tuple[bytes, RecordHandle]] = []
        for i, op in enumerate(operations):
            faults.clear()
            kind = "fsync" if local else "write"
            faults.fail_next(kind, op.faults, op.err)
            data = f"record-{i}".encode()
            if op.faults >= MAX_FAILURES:
                with pytest.raises(WriteAheadLogError):
                    log.write(data, i * 100)
            else:
                acked.append((data, log.write(data, i * 100)))
        faults.clear()
        for data, handle in acked:
            assert log.read(handle) == data
        log.close()
        recovered = list(FileBasedWriteAheadLog(log_dir).read_all())
        assert recovered == [data for data, _ in acked]


@SETTINGS
@given(
    st.lists(st.tuples(st.binary(max_size=200), st.integers(0, 5000)), min_size=1, max_size=15),
    st.booleans(),
    st.sampled_from([0.5, 1, 60]),
)
def test_property_write_read_all_round_trip(
    items: list[tuple[bytes, int]], close: bool, rolling_s: float
) -> None:
    items = sorted(items, key=lambda it: it[1])  # replay order is time order
    with tempfile.TemporaryDirectory() as tmp:
        log = FileBasedWriteAheadLog(
            os.path.join(tmp, "wal"), rolling_interval_s=rolling_s, close_file_after_write=close
        )
        handles = [log.write(data, t) for data, t in items]
        log.close()
        reopened = FileBasedWriteAheadLog(os.path.join(tmp, "wal"))
        assert list(reopened.read_all()) == [data for data, _ in items]
        assert [reopened.read(h) for h in handles] == [data for data, _ in items]


@settings(max_examples=15, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.lists(st.binary(max_size=40), min_size=1, max_size=5))
def test_property_torn_last_record_in_a_segment_file(records: list[bytes]) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        log_dir = os.path.join(tmp, "wal")
        log = FileBasedWriteAheadLog(log_dir)
        handles = [log.write(r, 0) for r in records]
        log.close()
        (path,) = segment_files(log_dir)
        last = handles[-1].offset
        for cut in range(last, last + HEADER_SIZE + len(records[-1])):
            truncate(path, cut)
            assert list(FileBasedWriteAheadLog(log_dir).read_all()) == records[:-1]
