"""A whole streaming context with its checkpoint on S3 (moto in server mode): both WALs and
the checkpoint file go through pyarrow's S3 filesystem; ``s3a://`` is read as ``s3://``.

FAILS (never skips) when moto cannot start; ``moto[server]`` is a dev dependency.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator

import pyarrow.fs as pafs
import pytest

from spark_receivers import StreamingConfig, StreamingContext
from spark_receivers.testing import SequenceReceiver
from spark_receivers.wal.layout import CheckpointLayout

pytestmark = pytest.mark.spark

BUCKET = "checkpoints"


@pytest.fixture(scope="module")
def moto_endpoint() -> Iterator[str]:
    from moto.server import ThreadedMotoServer  # ImportError fails the test on purpose

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    try:
        host, port = server.get_host_and_port()
        fs = pafs.S3FileSystem(
            endpoint_override=f"{host}:{port}",
            scheme="http",
            access_key="testing",
            secret_key="testing",
            region="us-east-1",
            allow_bucket_creation=True,
        )
        fs.create_dir(BUCKET)
        yield f"{host}:{port}"
    finally:
        server.stop()


def uri(scheme: str, endpoint: str, path: str) -> str:
    # Credentials in the URI: the Python workers were started before this test and do
    # not see environment variables set now.
    return (
        f"{scheme}://testing:testing@{BUCKET}/{path}"
        f"?endpoint_override={endpoint}&scheme=http&region=us-east-1"
    )


S3_CONFIG = StreamingConfig(
    receiver_wal_enabled=True,
    receiver_wal_close_file_after_write=True,  # S3 has no append: one object per record
    driver_wal_close_file_after_write=True,
)


def run(spark, checkpoint_dir: str, records: list[str]) -> list[str]:
    config = S3_CONFIG
    ssc = StreamingContext(spark, 500, checkpoint_dir=checkpoint_dir, config=config)
    seen: list[str] = []
    lock = threading.Lock()

    def collect(df, batch_time_ms: int) -> None:
        values = [r.value for r in df.collect()]
        with lock:
            seen.extend(values)

    ssc.receiver_stream(SequenceReceiver(records, mode="reliable", chunk=200)).foreach_batch(
        collect
    )
    ssc.start()
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and len(seen) < len(records):
            time.sleep(0.2)
    finally:
        ssc.stop(graceful=True)
    assert ssc.status().failure is None
    return seen


def test_both_wals_and_the_checkpoint_on_s3_through_the_s3a_alias(spark, moto_endpoint, caplog):
    records = [f"s3-{i:05d}" for i in range(1000)]  # 5 blocks of 200: 5 WAL objects
    checkpoint_dir = uri("s3a", moto_endpoint, "run-1")
    with caplog.at_level(logging.INFO, logger="spark_receivers.wal.layout"):
        seen = run(spark, checkpoint_dir, records)
    assert sorted(seen) == records
    assert "reading the s3a:// location as s3://" in caplog.text
    assert "testing:testing" not in caplog.text  # no credentials in the log line

    layout = CheckpointLayout(checkpoint_dir)
    fs = layout.filesystem
    assert isinstance(fs, pafs.S3FileSystem)
    assert fs.get_file_info(layout.checkpoint_file).type == pafs.FileType.File
    for directory in (layout.driver_wal_dir, layout.receiver_wal_dir(0)):
        objects = fs.get_file_info(pafs.FileSelector(directory, recursive=True))
        assert [o for o in objects if o.type == pafs.FileType.File], directory

    # A new driver recovers from the checkpoint on S3 (driver WAL replayed from S3).
    def create() -> StreamingContext:
        ssc = StreamingContext(spark, 500, checkpoint_dir=checkpoint_dir, config=S3_CONFIG)
        ssc.receiver_stream(SequenceReceiver([])).foreach_batch(lambda df, t: None)
        return ssc

    again = StreamingContext.get_or_create(checkpoint_dir, create)
    assert again.recovered_from_checkpoint
    again.start()
    again.stop(graceful=True)
    assert again.status().failure is None


def test_s3_uri_without_the_alias(spark, moto_endpoint):
    records = [f"plain-{i:04d}" for i in range(500)]
    assert sorted(run(spark, uri("s3", moto_endpoint, "run-2"), records)) == records
