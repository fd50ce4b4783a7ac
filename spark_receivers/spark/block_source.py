"""Reads a batch's blocks as a DataFrame: a ``mapInArrow`` over one row per read task.

Each batch is ``spark.range(n, numPartitions=n).mapInArrow(BlockRead(...), schema)`` (the
batch reader makes each ``range`` once: :class:`TaskRanges`): the
rows of the blocks, in allocation order, are cut into at most ``max_partitions`` runs of
equal row counts (:func:`split_rows`: a block may be split between two runs; one Python
task per block costs more than the reading), and task ``i`` reads run ``i`` on an executor
as Arrow record batches from
the block server of the receiver that holds each block (authenticated), falling back to
the block's record in the receiver write-ahead log under ``checkpoint_dir``. A block that
cannot be read fails the batch with an error that names it — or, with
``lost_block_policy=skip``, is left out and reported to the driver's tracker
(``ReportLostBlock``): never silently skipped.

**In local mode, when turned on** (``spark.receivers.batch.parquetSpool``, off by default;
decision 0026) the receivers of this host write their blocks' spool files as Parquet, and
the blocks whose file is in a live keeper's spool are read by Spark's own Parquet reader
(``spark.read.schema(...).parquet(files)``): no Python read task, no Arrow-to-rows
conversion in the JVM. The other blocks of the batch (no file, a keeper gone) are read by
the ``mapInArrow`` above, and the two are one DataFrame (``union``). Spark orders a
read's files by size, so rows come block by block but not in block order.

Why not the Python Data Source API (used until 2026-11-28, decision 0019): a data source
is planned for every new DataFrame, by Python planner processes on the driver (create the
source, plan the read), and every batch is a new DataFrame. That planning was the largest
share of the JVM's per-batch work (decisions 0011, 0013) and about half of a small
batch's ``count()``. A ``mapInArrow`` is planned by Spark alone; its tasks run in the same
reused Python workers as any Arrow UDF. The batch's DataFrame is aliased
(:func:`batch_alias`) so that the batch reader can find its reads in query plans.
"""

from __future__ import annotations

import bisect
import os
import threading
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import asdict
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from spark_receivers.receiver.block_spool import (
    PARQUET_SUFFIX,
    SPOOL_PREFIX,
    is_our_file,
    is_spool_file,
    spool_alive,
)
from spark_receivers.rpc.messages import ReceivedBlockInfo
from spark_receivers.rpc.tls import TlsConfig
from spark_receivers.spark.cluster import is_local_master
from spark_receivers.spark.worker_heap import freeze_in_task

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.types import StructType

    from spark_receivers.config import StreamingConfig
    from spark_receivers.spark.session_kind import SparkSide

SECRET_OPTION = "auth_secret"  # matches spark.redaction.regex, so plans redact it
BATCH_ALIAS_PREFIX = "spark_receivers_batch_"
"""The alias of a batch's DataFrame starts so, then ``<stream id>_<batch time ms>``: it
names the batch in query plans (``driver/batches/batch_reader.py`` counts the queries
that read it)."""
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


Piece = tuple[dict[str, Any], int, "int | None"]
"""A block's rows ``[first, end)`` as a read task reads them; ``end`` None: to the block's end."""

SNAP_SHARE = 20
"""A cut within 1/``SNAP_SHARE`` of a run's share from a block's edge moves to that edge."""


def split_rows(blocks: list[dict[str, Any]], parts: int) -> list[list[Piece]]:
    """Cut the rows of ``blocks`` (in order) into at most ``parts`` runs of equal row counts.

    A block that straddles the end of a run is cut there, so each read task gets its share
    of the batch's rows rather than a whole number of blocks: five equal blocks in two
    runs were three against two, and the batch waited for the larger (decision 0025). A
    cut close to a block's edge (:data:`SNAP_SHARE`) goes to the edge, so that no read
    fetches a block for a sliver of it. The piece that ends a block reads to its last row
    (``end`` None) whatever ``num_records`` says, so a miscounted block loses nothing.
    Blocks with no rows ride along in the run they fall in; runs are never empty.

    >>> [[(b["block_id"], first, end) for b, first, end in run]
    ...  for run in split_rows([{"block_id": i, "num_records": 10} for i in range(3)], 2)]
    [[(0, 0, None), (1, 0, 5)], [(1, 5, None), (2, 0, None)]]
    """
    sizes = [max(0, b["num_records"]) for b in blocks]
    total = sum(sizes)
    n = max(1, min(parts, total))
    slack = total // n // SNAP_SHARE
    starts = [0]
    for size in sizes:
        starts.append(starts[-1] + size)
    cuts = []
    for k in range(1, n):
        cut = total * k // n
        i = bisect.bisect_right(starts, cut) - 1  # the block holding row ``cut``
        lo, hi = starts[i], starts[i] + sizes[i]
        cuts.append(lo if cut - lo <= slack else hi if hi - cut <= slack else cut)
    cuts.sort()
    runs: list[list[Piece]] = [[]]
    c = 0
    for block, start, size in zip(blocks, starts, sizes, strict=False):
        first = 0
        while c < len(cuts) and cuts[c] - start < size:
            at = cuts[c] - start
            c += 1
            if at > first:
                runs[-1].append((block, first, at))
                first = at
            if runs[-1]:
                runs.append([])
        runs[-1].append((block, first, None))
    return runs


def arrow_schema_of(schema: StructType) -> pa.Schema:
    """The Arrow schema Spark expects back from ``read`` for ``schema``."""
    from pyspark.sql.pandas.types import to_arrow_schema

    return to_arrow_schema(schema, timezone="UTC")


def conform(table: pa.Table, schema: pa.Schema | None) -> pa.Table:
    """``table`` cast to the Arrow types Spark expects (e.g. ``timestamp[ms]`` → ``[us]``)."""
    if schema is None or table.schema.equals(schema):
        return table
    return table.cast(schema)


class BlockRead:
    """The ``mapInArrow`` function of a batch: task ``i`` yields the pieces of run ``i``.

    Pickled with the task (the secret travels as the data source's options did, inside the
    task, never in a plan's text). Its input is the ``id`` column of a ``range`` with one
    row per task; ``runs`` come from :func:`split_rows`.
    """

    def __init__(
        self,
        runs: list[list[Piece]],
        schema: StructType,
        secret: str,
        checkpoint_dir: str | None,
        lost_block_policy: str,
        tracker: str | None,
        tls: TlsConfig | None,
        timeout_s: float = 60.0,
    ) -> None:
        self._runs = runs
        self._schema = schema  # Spark's; its Arrow form is built where the task runs
        self._secret = secret
        self._checkpoint_dir = checkpoint_dir
        self._lost_block_policy = lost_block_policy
        self._tracker = tracker
        self._tls = tls
        self._timeout_s = timeout_s

    def __call__(self, ids: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        """Read the runs named by the task's ids, piece after piece."""
        freeze_in_task()  # the worker's imports, out of PySpark's collection after each task
        arrow_schema = arrow_schema_of(self._schema)
        for batch in ids:
            for index in batch.column(0).to_pylist():
                for block, first, end in self._runs[index]:
                    # A lost block cut between runs is reported by its first piece only.
                    table = self._fetch(block, report=first == 0)
                    if table is None:
                        continue
                    if first or end is not None:  # zero-copy: a mapped spool file stays mapped
                        table = table.slice(first, None if end is None else end - first)
                    yield from conform(table, arrow_schema).to_batches()

    def _fetch(self, block: dict[str, Any], report: bool = True) -> pa.Table | None:
        from spark_receivers.errors import BlockNotFoundError
        from spark_receivers.spark.block_fetch import fetch_block, report_lost_block

        info = ReceivedBlockInfo.from_dict(block)
        try:
            return fetch_block(
                info, self._secret, self._timeout_s, self._checkpoint_dir, tls=self._tls
            )
        except BlockNotFoundError as e:
            if self._lost_block_policy != "skip":
                raise
            if report:
                report_lost_block(self._tracker, self._secret, info, str(e), self._tls)
            return None


def batch_alias(batch_key: str) -> str:
    """The alias naming a batch (``<stream id>:<batch time ms>``) in query plans."""
    return BATCH_ALIAS_PREFIX + batch_key.replace(":", "_")


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


def spark_reads_spool(side: SparkSide, config: StreamingConfig) -> bool:
    """Whether a context's batches read spooled Parquet blocks with Spark's reader.

    ``spark.receivers.batch.parquetSpool`` on, with keepers that keep a spool, in a
    classic session of local mode: there the driver's JVM runs every task, on the host
    whose keepers hold the files. Decided once by the driver, which tells the receivers
    (their task's config) and its batch reader.
    """
    return (
        config.batch_parquet_spool
        and config.block_keeper_enabled
        and config.block_keeper_spool
        and side.kind == "classic"
        and is_local_master(side.master)
    )


def spooled_parquet(blocks: Sequence[ReceivedBlockInfo]) -> list[ReceivedBlockInfo]:
    """The blocks of ``blocks`` held as Parquet files in the spool of a keeper that lives.

    A keeper's files stay until the driver removes their blocks (after the batch), or
    until its spool is swept a minute after the keeper is gone: a block whose keeper is
    gone now is read by ``mapInArrow`` (a replica, or the WAL).
    """
    alive: dict[str, bool] = {}
    found = []
    for b in blocks:
        path = b.local_file
        if path is None or not path.endswith(PARQUET_SUFFIX):
            continue
        spool = os.path.dirname(path)
        if spool not in alive:
            ours = os.path.basename(spool).startswith(SPOOL_PREFIX)
            alive[spool] = ours and spool_alive(spool)
        # Only a spool's own block file: the path came from a receiver, Spark opens it.
        name = os.path.basename(path)
        if alive[spool] and is_spool_file(name, b.block_id) and is_our_file(path):
            found.append(b)
    return found


FILES_PER_READ = 32
"""At most this many files in one ``spark.read.parquet``: Spark lists more with a job of
their own (``spark.sql.sources.parallelPartitionDiscovery.threshold``, 32 by default);
a batch of more files is read as a union of reads."""


def _parquet_read(spark: SparkSession, files: list[str], schema: StructType) -> DataFrame:
    """Spark's Parquet reader over ``files`` (unions of :data:`FILES_PER_READ`)."""
    reads = [
        spark.read.schema(schema).parquet(*files[i : i + FILES_PER_READ])
        for i in range(0, len(files), FILES_PER_READ)
    ]
    df = reads[0]
    for more in reads[1:]:
        df = df.union(more)
    return df


class TaskRanges:
    """The read's input, ``spark.range(n)`` in ``n`` partitions, made once per task count.

    A DataFrame is immutable, so every batch with ``n`` read tasks can map the same one: a
    new ``range`` each batch cost a Dataset and its schema fetched through py4j: building
    a batch's DataFrame without an action (driver and JVM) took 2-7 ms of CPU less in
    each of six alternated rounds, 22.7-27.8 ms against 26.1-31.2 ms a batch
    (``bench/results/probes-20261202/batch_frame_probe.log``, two runs, after 300 batches
    of JIT warm-up). One per session user (the batch reader): it holds the session's
    DataFrames. Thread-safe.
    """

    def __init__(self, spark: SparkSession) -> None:
        self._spark = spark
        self._by_tasks: dict[int, DataFrame] = {}
        self._lock = threading.Lock()

    def __call__(self, tasks: int) -> DataFrame:
        """``spark.range(0, tasks, 1, tasks)``, the same object for the same ``tasks``."""
        with self._lock:
            df = self._by_tasks.get(tasks)
            if df is None:
                df = self._by_tasks[tasks] = self._spark.range(0, tasks, 1, tasks)
            return df


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
    parquet_spool: bool = False,
    task_ranges: TaskRanges | None = None,
) -> DataFrame:
    """A DataFrame over ``blocks`` (an empty one when there are none).

    ``checkpoint_dir`` lets readers fall back to the receiver WAL;
    ``max_partitions`` defaults to Spark's default parallelism;
    ``lost_block_policy`` ``skip`` leaves out a block in no store (reported to
    the ``tracker`` endpoint) instead of failing the read; ``batch_key`` names the
    batch in plans (:func:`batch_alias`); ``parquet_spool`` (:func:`spark_reads_spool`):
    the blocks spooled as Parquet by a live keeper are read by Spark's Parquet reader;
    ``task_ranges``: the read's input ranges, kept across batches (made for this call
    otherwise).
    """
    if not blocks:
        return spark.createDataFrame([], schema)
    if max_partitions is None:
        from spark_receivers.spark.session_kind import spark_side

        max_partitions = spark_side(spark).default_parallelism()
    spooled = spooled_parquet(blocks) if parquet_spool else []
    rest = list(blocks)
    df: DataFrame | None = None
    if spooled:
        df = _parquet_read(spark, [b.local_file for b in spooled if b.local_file], schema)
        taken = {b.block_id for b in spooled}
        rest = [b for b in blocks if b.block_id not in taken]
    if rest:
        runs = split_rows([asdict(b) for b in rest], max(1, max_partitions))
        read = BlockRead(runs, schema, secret, checkpoint_dir, lost_block_policy, tracker, tls)
        ids = (task_ranges or TaskRanges(spark))(len(runs))
        mapped = ids.mapInArrow(read, schema)
        df = mapped if df is None else df.union(mapped)
    assert df is not None
    return df.alias(batch_alias(batch_key)) if batch_key else df
