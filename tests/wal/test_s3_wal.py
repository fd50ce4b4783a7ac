"""The file-based and batched logs on an S3-compatible store (moto in server mode).

Close-after-write mode, the one S3 needs: every record is its own object. These
tests FAIL (never skip) when moto is missing or cannot start; ``moto[server]``
is a dev dependency.
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Iterator

import pyarrow.fs as pafs
import pytest
from wal_helpers import generate_data, write_data

from spark_receivers.errors import CorruptRecordError, WriteAheadLogError
from spark_receivers.wal import BatchedWriteAheadLog, FileBasedWriteAheadLog, RecordHandle
from spark_receivers.wal.framing import encode_frame

BUCKET = "wal-tests"
_dirs = itertools.count()


@pytest.fixture(scope="module")
def moto_endpoint() -> Iterator[str]:
    from moto.server import ThreadedMotoServer  # ImportError fails the tests on purpose

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    try:
        host, port = server.get_host_and_port()
        yield f"{host}:{port}"
    finally:
        server.stop()


@pytest.fixture(scope="module")
def s3(moto_endpoint: str) -> pafs.S3FileSystem:
    fs = pafs.S3FileSystem(
        endpoint_override=moto_endpoint,
        scheme="http",
        access_key="testing",
        secret_key="testing",
        region="us-east-1",
        allow_bucket_creation=True,
        retry_strategy=pafs.AwsStandardS3RetryStrategy(max_attempts=2),
    )
    fs.create_dir(BUCKET)
    return fs


@pytest.fixture
def s3_dir() -> str:
    return f"{BUCKET}/wal-{next(_dirs)}"


def s3_log(fs: pafs.FileSystem, path: str) -> FileBasedWriteAheadLog:
    return FileBasedWriteAheadLog(
        path, filesystem=fs, close_file_after_write=True, rolling_interval_s=1
    )


def object_names(fs: pafs.FileSystem, path: str) -> list[str]:
    selector = pafs.FileSelector(path, allow_not_found=True)
    return sorted(info.base_name for info in fs.get_file_info(selector))


def test_nothing_created_until_the_first_write(s3: pafs.S3FileSystem, s3_dir: str) -> None:
    log = s3_log(s3, s3_dir)
    assert list(log.read_all()) == []
    log.clean(10_000, wait=True)
    assert s3.get_file_info(s3_dir).type == pafs.FileType.NotFound
    log.write(b"x", 0)
    assert object_names(s3, s3_dir) == ["log-0-1000"]
    log.close()


def test_write_read_all_and_read_by_handle(s3: pafs.S3FileSystem, s3_dir: str) -> None:
    data = generate_data(12)
    log = s3_log(s3, s3_dir)
    handles = write_data(log, data)
    assert len(object_names(s3, s3_dir)) == len(data)
    pairs = list(zip(handles, data, strict=True))
    random.Random(1).shuffle(pairs)
    for handle, item in pairs:
        assert handle.path.startswith(s3_dir + "/")
        assert log.read(RecordHandle.from_dict(handle.to_dict())) == item
    log.close()
    assert list(s3_log(s3, s3_dir).read_all()) == data


def test_same_time_writes_never_overwrite(s3: pafs.S3FileSystem, s3_dir: str) -> None:
    log = s3_log(s3, s3_dir)
    handles = [log.write(bytes([i]) * 3, 7) for i in range(4)]
    log.close()
    assert len({h.path for h in handles}) == 4
    restarted = s3_log(s3, s3_dir)  # a new writer, same time: still no overwrite
    restarted.write(b"later", 7)
    restarted.close()
    assert list(s3_log(s3, s3_dir).read_all()) == [bytes([i]) * 3 for i in range(4)] + [b"later"]


@pytest.mark.parametrize("wait", [True, False], ids=["sync", "async"])
def test_clean_old_logs(s3: pafs.S3FileSystem, s3_dir: str, wait: bool) -> None:
    data = generate_data(10)
    log = s3_log(s3, s3_dir)
    write_data(log, data)  # times 0..4500, one object each, end = time + 1000
    log.clean(3000, wait=wait)
    if not wait:
        assert log.wait_for_cleanups(10.0)
    assert list(log.read_all()) == data[4:]  # objects whose end >= 3000: times >= 2000
    log.close()


def test_torn_and_corrupt_objects(s3: pafs.S3FileSystem, s3_dir: str) -> None:
    log = s3_log(s3, s3_dir)
    handles = write_data(log, [b"one", b"two", b"three"])
    with s3.open_output_stream(handles[1].path) as out:  # a torn object
        out.write(encode_frame(b"two")[:-1])
    assert list(log.read_all()) == [b"one", b"three"]
    with pytest.raises(CorruptRecordError, match=f"{handles[1].path} at offset 0"):
        log.read(handles[1])
    with s3.open_output_stream(handles[2].path) as out:  # damaged, then a valid frame
        frame = bytearray(encode_frame(b"three"))
        frame[13] ^= 0xFF
        out.write(bytes(frame) + encode_frame(b"extra"))
    with pytest.raises(CorruptRecordError, match=f"{handles[2].path} at offset 0"):
        list(log.read_all())
    s3.delete_file(handles[0].path)
    with pytest.raises(WriteAheadLogError, match="does not exist"):
        log.read(handles[0])
    log.close()


def test_batched_log_on_s3(s3: pafs.S3FileSystem, s3_dir: str) -> None:
    data = generate_data(8)
    log = BatchedWriteAheadLog(s3_log(s3, s3_dir))
    handles = write_data(log, data)
    assert log.read_batch(handles[3]) == [data[3]]
    log.close()
    assert list(BatchedWriteAheadLog(s3_log(s3, s3_dir)).read_all()) == data


def test_uri_resolution(s3: pafs.S3FileSystem, moto_endpoint: str) -> None:
    uri = (
        f"s3://testing:testing@{BUCKET}/wal-uri?endpoint_override={moto_endpoint}"
        "&scheme=http&region=us-east-1"
    )
    log = FileBasedWriteAheadLog(uri, close_file_after_write=True)
    handle = log.write(b"via-uri", 1)
    assert handle.path.startswith(f"{BUCKET}/wal-uri/")
    assert list(log.read_all()) == [b"via-uri"]
    assert log.read(handle) == b"via-uri"
    log.close()
