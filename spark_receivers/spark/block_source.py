"""Reads a batch's blocks as a DataFrame, through the Python Data Source API.

Each batch is ``spark.read.format("spark_receivers_blocks")`` with the batch's
blocks in its options and the stream's schema. The blocks, in allocation order,
are grouped into at most ``max_partitions`` partitions (the default parallelism:
one Python task per block costs more than the reading) of about equal record
counts; each is read on an executor as Arrow record batches from the block
server of the receiver that holds it (authenticated), falling back to the block's record in
the receiver write-ahead log under the ``checkpoint_dir`` option. A block that
cannot be read fails the batch with an error that names it — or, with
``lost_block_policy=skip``, is left out and reported to the driver's tracker
(``ReportLostBlock``): never silently skipped.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import asdict
from typing import TYPE_CHECKING, Any

import pyarrow as pa
from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition

from spark_receivers.rpc.messages import ReceivedBlockInfo
from spark_receivers.rpc.tls import TlsConfig
from spark_receivers.spark.cluster import is_local_master

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.types import StructType

FORMAT = "spark_receivers_blocks"
SECRET_OPTION = "auth_secret"  # matches spark.redaction.regex, so plans redact it
BATCH_KEY_OPTION = "batch_key"
"""``<stream id>:<batch time ms>``: names the batch's relation in a plan (the reader ignores
it; ``driver/batch_reader.py`` counts the queries that read it)."""
_TLS_OPTIONS = ("cert_file", "key_file", "ca_file", "server_name")


def tls_options(tls: TlsConfig | None) -> dict[str, str]:
    """Reader options carrying the TLS settings (paths, no secrets); empty without TLS."""
    if tls is None:
        return {}
    options = {f"tls_{name}": getattr(tls, name) or "" for name in _TLS_OPTIONS}
    return {**options, "tls_client_auth": "true" if tls.client_auth else "false"}


def tls_from_options(options: Mapping[str, str]) -> TlsConfig | None:
    """The TLS settings :func:`tls_options` put in reader options (None: plaintext)."""
    if not options.get("tls_ca_file"):
        return None
    return TlsConfig(
        options["tls_cert_file"],
        options["tls_key_file"],
        options["tls_ca_file"],
        options.get("tls_server_name") or None,
        options.get("tls_client_auth") == "true",
    )


class BlockPartition(InputPartition):  # type: ignore[misc]
    """Consecutive blocks read by one task."""

    def __init__(self, index: int, blocks: list[dict[str, Any]]) -> None:
        super().__init__(index)
        self.blocks = blocks


def group_blocks(blocks: list[dict[str, Any]], max_partitions: int) -> list[list[dict[str, Any]]]:
    """Split ``blocks`` (in order) into at most ``max_partitions`` runs of similar record counts.

    >>> [len(g) for g in group_blocks([{"num_records": 10}] * 5, 2)]
    [3, 2]
    """
    n = max(1, min(len(blocks), max_partitions))
    total = sum(max(1, b["num_records"]) for b in blocks)
    groups: list[list[dict[str, Any]]] = [[]]
    seen = 0
    for i, block in enumerate(blocks):
        left = len(blocks) - i
        # Close the current run once it holds its share, or when each remaining
        # group needs one of the remaining blocks.
        if (
            groups[-1]
            and len(groups) < n
            and (seen >= total * len(groups) / n or left <= n - len(groups))
        ):
            groups.append([])
        groups[-1].append(block)
        seen += max(1, block["num_records"])
    return groups


def arrow_schema_of(schema: StructType) -> pa.Schema:
    """The Arrow schema Spark expects back from ``read`` for ``schema``."""
    from pyspark.sql.pandas.types import to_arrow_schema

    return to_arrow_schema(schema, timezone="UTC")


def conform(table: pa.Table, schema: pa.Schema | None) -> pa.Table:
    """``table`` cast to the Arrow types Spark expects (e.g. ``timestamp[ms]`` → ``[us]``)."""
    if schema is None or table.schema.equals(schema):
        return table
    return table.cast(schema)


class BlockReader(DataSourceReader):  # type: ignore[misc]
    """Partitions = runs of blocks; ``read`` streams their record batches in order."""

    def __init__(self, options: Mapping[str, str], schema: StructType | None = None) -> None:
        self._schema = schema  # Spark's; its Arrow form is built where read() runs
        self._blocks = json.loads(options["blocks"])
        self._secret = options[SECRET_OPTION]
        self._tls = tls_from_options(options)
        self._timeout_s = float(options.get("timeout_s", "60"))
        self._checkpoint_dir = options.get("checkpoint_dir") or None
        self._lost_block_policy = options.get("lost_block_policy", "fail")
        self._tracker = options.get("tracker") or None
        self._max_partitions = int(options.get("max_partitions", "0")) or len(self._blocks)

    def partitions(self) -> Sequence[InputPartition]:
        """Runs of consecutive blocks, at most ``max_partitions``.

        Without blocks (a warm-up read), ``max_partitions`` empty partitions.
        """
        if not self._blocks:
            return [BlockPartition(i, []) for i in range(max(1, self._max_partitions))]
        groups = group_blocks(self._blocks, self._max_partitions)
        return [BlockPartition(i, g) for i, g in enumerate(groups)]

    def _arrow_schema(self) -> pa.Schema | None:
        return arrow_schema_of(self._schema) if self._schema is not None else None

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        """Yield the record batches of the partition's blocks, block after block."""
        from spark_receivers.errors import BlockNotFoundError
        from spark_receivers.spark.block_fetch import fetch_block, report_lost_block

        assert isinstance(partition, BlockPartition)
        for block in partition.blocks:
            info = ReceivedBlockInfo.from_dict(block)
            try:
                table = fetch_block(
                    info, self._secret, self._timeout_s, self._checkpoint_dir, tls=self._tls
                )
            except BlockNotFoundError as e:
                if self._lost_block_policy != "skip":
                    raise
                report_lost_block(self._tracker, self._secret, info, str(e), self._tls)
                continue
            yield from conform(table, self._arrow_schema()).to_batches()


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
        return BlockReader(self.options, schema)


def register(spark: SparkSession) -> None:
    """Register the data source with ``spark`` (idempotent)."""
    spark.dataSource.register(BlockDataSource)


def default_read_partitions(sc: Any, receivers: int, configured: int = 0) -> int:
    """Read tasks per stream and batch: ``configured`` (``batch_read_partitions``), or one wave.

    This is the most a batch gets: the batch reader gives a small batch fewer
    (``driver/batch_reader.py``, ``ROWS_PER_READ_TASK``) when it is not configured.

    One wave is the task slots the receivers leave free (each holds a slot for as
    long as it runs); in local mode also no more than the host's cores, since
    ``local[N]`` may offer more slots than there are cores, and on a busy core
    every extra Python read task costs more than it reads.
    """
    if configured:
        return configured
    from spark_receivers.spark.session_kind import spark_side

    side = spark_side(sc)
    free = side.default_parallelism() - receivers
    if is_local_master(side.master):
        free = min(free, os.cpu_count() or 1)
    return max(1, free)


def blocks_dataframe(
    spark: SparkSession,
    blocks: Sequence[ReceivedBlockInfo],
    schema: StructType,
    secret: str,
    checkpoint_dir: str | None = None,
    max_partitions: int | None = None,
    lost_block_policy: str = "fail",
    tracker: str | None = None,
    tls: TlsConfig | None = None,
    batch_key: str | None = None,
) -> DataFrame:
    """A DataFrame over ``blocks`` (an empty one when there are none).

    ``checkpoint_dir`` lets readers fall back to the receiver WAL;
    ``max_partitions`` defaults to Spark's default parallelism;
    ``lost_block_policy`` ``skip`` leaves out a block in no store (reported to
    the ``tracker`` endpoint) instead of failing the read; ``batch_key`` names the
    relation in plans (:data:`BATCH_KEY_OPTION`).
    """
    if not blocks:
        return spark.createDataFrame([], schema)
    if max_partitions is None:
        from spark_receivers.spark.session_kind import spark_side

        max_partitions = spark_side(spark).default_parallelism()
    payload = json.dumps([asdict(b) for b in blocks], separators=(",", ":"))
    reader = (
        spark.read.format(FORMAT)
        .schema(schema)
        .option("blocks", payload)
        .option(SECRET_OPTION, secret)
        .option("max_partitions", str(max(1, max_partitions)))
    )
    if checkpoint_dir:
        reader = reader.option("checkpoint_dir", checkpoint_dir)
    if lost_block_policy != "fail":
        reader = reader.option("lost_block_policy", lost_block_policy)
    if tracker:
        reader = reader.option("tracker", tracker)
    if batch_key:
        reader = reader.option(BATCH_KEY_OPTION, batch_key)
    return reader.options(**tls_options(tls)).load()
