"""Reads a batch's blocks as a DataFrame, through the Python Data Source API.

Each batch is ``spark.read.format("spark_receivers_blocks")`` with the batch's
blocks in its options and the stream's schema; each block is one partition,
read on an executor as Arrow record batches from the block server of the
receiver that holds it (authenticated). A block that cannot be read fails the
batch with an error that names it: never silently skipped.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import asdict
from typing import TYPE_CHECKING, Any

import pyarrow as pa
from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition

from spark_receivers.rpc.messages import ReceivedBlockInfo

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.types import StructType

FORMAT = "spark_receivers_blocks"
SECRET_OPTION = "auth_secret"  # matches spark.redaction.regex, so plans redact it


class BlockPartition(InputPartition):  # type: ignore[misc]
    """One block to read."""

    def __init__(self, block: dict[str, Any]) -> None:
        super().__init__(block["block_id"])
        self.block = block


class BlockReader(DataSourceReader):  # type: ignore[misc]
    """Partitions = blocks; ``read`` streams one block's record batches."""

    def __init__(self, options: Mapping[str, str]) -> None:
        self._blocks = json.loads(options["blocks"])
        self._secret = options[SECRET_OPTION]
        self._timeout_s = float(options.get("timeout_s", "60"))

    def partitions(self) -> Sequence[InputPartition]:
        """One partition per block, in allocation order."""
        return [BlockPartition(b) for b in self._blocks]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        """Yield the block's Arrow record batches."""
        from spark_receivers.spark.block_fetch import fetch_block

        assert isinstance(partition, BlockPartition)
        table = fetch_block(ReceivedBlockInfo(**partition.block), self._secret, self._timeout_s)
        yield from table.to_batches()


class BlockDataSource(DataSource):  # type: ignore[misc]
    """The ``spark_receivers_blocks`` data source (batch reads of received blocks)."""

    @classmethod
    def name(cls) -> str:
        """The format name."""
        return FORMAT

    def schema(self) -> str:
        """The default one-string-column schema (streams pass theirs explicitly)."""
        return "value string"

    def reader(self, schema: StructType) -> DataSourceReader:
        """A reader over the blocks in the options."""
        return BlockReader(self.options)


def register(spark: SparkSession) -> None:
    """Register the data source with ``spark`` (idempotent)."""
    spark.dataSource.register(BlockDataSource)


def blocks_dataframe(
    spark: SparkSession, blocks: Sequence[ReceivedBlockInfo], schema: StructType, secret: str
) -> DataFrame:
    """A DataFrame over ``blocks`` (an empty one when there are none)."""
    if not blocks:
        return spark.createDataFrame([], schema)
    payload = json.dumps([asdict(b) for b in blocks], separators=(",", ":"))
    return (
        spark.read.format(FORMAT)
        .schema(schema)
        .option("blocks", payload)
        .option(SECRET_OPTION, secret)
        .load()
    )
