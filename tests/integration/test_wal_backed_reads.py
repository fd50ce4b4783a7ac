"""Batch reads of blocks: store first, WAL fallback (Spark's WriteAheadLogBackedBlockRDDSuite)."""

from __future__ import annotations

import os

import pyarrow as pa
import pytest
from pyspark.sql.types import StringType, StructField, StructType

from spark_receivers.config import StreamingConfig
from spark_receivers.errors import BlockNotFoundError
from spark_receivers.receiver.block_placement import InProcessSink
from spark_receivers.receiver.block_store import BlockStore
from spark_receivers.receiver.block_writer import WriteAheadLogBasedBlockHandler
from spark_receivers.rpc import messages as m
from spark_receivers.rpc.auth import new_secret
from spark_receivers.rpc.transport import FlightEndpoint
from spark_receivers.spark import block_source
from spark_receivers.spark.block_fetch import LOST_BLOCK_RE, fetch_block, lost_blocks_in

pytestmark = pytest.mark.spark

SCHEMA = StructType([StructField("value", StringType())])


class Blocks:
    """Blocks stored by a real WAL block handler, served by a real block server."""

    def __init__(self, ckpt: str) -> None:
        self.secret = new_secret()
        self.store = BlockStore()
        cfg = StreamingConfig(receiver_wal_enabled=True, receiver_wal_fsync=False)
        self.handler = WriteAheadLogBasedBlockHandler(
            InProcessSink(self.store, lambda: self.server.address), 0, ckpt, cfg
        )
        self.server = FlightEndpoint(
            "test-blocks",
            "127.0.0.1",
            self.secret,
            m.SUPERVISOR_MESSAGES,
            lambda message: True,
            lambda ticket: self.store.get(ticket.decode()),
        )
        self.infos: list[m.ReceivedBlockInfo] = []
        self.values: list[str] = []

    def add(self, n_blocks: int, per_block: int = 50) -> None:
        for _ in range(n_blocks):
            i = len(self.infos)
            values = [f"b{i}-r{j}" for j in range(per_block)]
            stored = self.handler.store_block(
                f"input-0-1-{i}", pa.table({"value": values}), 1_000 + i
            )
            self.infos.append(
                m.ReceivedBlockInfo(
                    0,
                    stored.block_id,
                    stored.num_records,
                    1_000 + i,
                    self.server.address,
                    stored.size_bytes,
                    stored.wal_handle,
                )
            )
            self.values.extend(values)

    def close(self) -> None:
        self.server.close()
        self.handler.close()


@pytest.fixture
def blocks(tmp_path):
    b = Blocks(str(tmp_path))
    yield b
    b.close()


def read(spark, infos, ckpt, secret) -> list[str]:
    df = block_source.blocks_dataframe(spark, infos, SCHEMA, secret, ckpt)
    return sorted(r.value for r in df.collect())


def test_data_only_in_the_block_store(spark, blocks, tmp_path):
    blocks.add(3)
    infos = [m.ReceivedBlockInfo(**{**b.__dict__, "wal_handle": None}) for b in blocks.infos]
    assert read(spark, infos, str(tmp_path), blocks.secret) == sorted(blocks.values)


def test_data_only_in_the_wal(spark, blocks, tmp_path):
    blocks.add(3)
    blocks.store.clear()
    assert read(spark, blocks.infos, str(tmp_path), blocks.secret) == sorted(blocks.values)
    recovered = [b.without_store() for b in blocks.infos]  # as after a driver restart
    assert read(spark, recovered, str(tmp_path), blocks.secret) == sorted(blocks.values)


def test_data_in_both_is_read_from_the_block_store_first(spark, blocks, tmp_path):
    blocks.add(2)
    # Remove the WAL segments: the read still succeeds, so it came from the store.
    for name in os.listdir(blocks.handler.log_dir):
        os.remove(os.path.join(blocks.handler.log_dir, name))
    assert read(spark, blocks.infos, str(tmp_path), blocks.secret) == sorted(blocks.values)


def test_some_blocks_in_the_store_some_only_in_the_wal(spark, blocks, tmp_path):
    blocks.add(4)
    blocks.store.remove([blocks.infos[0].block_id, blocks.infos[2].block_id])
    assert read(spark, blocks.infos, str(tmp_path), blocks.secret) == sorted(blocks.values)


def test_store_gone_falls_back_to_the_wal(spark, blocks, tmp_path):
    blocks.add(3)
    blocks.server.close()  # the receiver's task (or executor) is gone
    assert read(spark, blocks.infos, str(tmp_path), blocks.secret) == sorted(blocks.values)


def test_a_block_in_neither_fails_the_batch_naming_it(spark, blocks, tmp_path):
    blocks.add(2)
    blocks.server.close()
    for name in os.listdir(blocks.handler.log_dir):
        os.remove(os.path.join(blocks.handler.log_dir, name))
    with pytest.raises(Exception, match=blocks.infos[0].block_id.replace("-", r"\-")):
        read(spark, blocks.infos[:1], str(tmp_path), blocks.secret)
    with pytest.raises(BlockNotFoundError, match="was it cleaned"):
        fetch_block(blocks.infos[0], blocks.secret, 5, str(tmp_path))


def test_without_wal_a_lost_block_fails_the_batch_and_is_reported(spark, blocks):
    blocks.add(1)
    blocks.server.close()
    lost = m.ReceivedBlockInfo(**{**blocks.infos[0].__dict__, "wal_handle": None})
    with pytest.raises(Exception, match="receiver_wal_enabled") as info:
        read(spark, [lost], None, blocks.secret)
    error = info.value
    assert [x.group(1) for x in LOST_BLOCK_RE.finditer(str(error))][:1] == [lost.block_id]

    # The driver finds the lost block in Spark's wrapped error, for the listener event
    # (JobScheduler.batch_failed posts on_block_lost with these).
    ((block_id, stream_id, records, reason),) = lost_blocks_in(error)
    assert (block_id, stream_id, records) == (lost.block_id, 0, 50)
    assert "receiver_wal_enabled" in reason
