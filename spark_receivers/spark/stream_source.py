"""Receiver streams as a Structured Streaming source (``format("spark_receivers")``).

A stream made with :meth:`StreamingContext.structured_stream` does not feed
DStream batches: its blocks go to a **block log** on the driver whose positions
count records (docs/decisions/0004). This Python data source reads that log:

* ``latestOffset(start, limit)`` appends every block received so far to the log
  (an event in the driver WAL, before it answers) and returns
  ``{"stream_id": s, "position": end}``, at most ``maxRecordsPerTrigger`` records
  past ``start`` when that option is set (``ReadMaxRows``);
* ``partitions(start, end)`` asks for the blocks and row slices of ``[start, end)``,
  which are the same on every call, also after a driver restart (the log is
  rebuilt from the WAL), cut into at most ``max_partitions`` tasks of equal row counts;
* ``read`` fetches each block from the receiver's block server (authenticated), or
  from the receiver WAL under ``checkpoint_dir`` when that receiver is gone, and
  yields the slice as Arrow record batches;
* ``commit(end)`` lets the driver forget the blocks below ``end``: the receivers
  drop them from their stores and their WAL segments are cleaned.

The offset methods run in a Python process of their own on the driver, the reads
on executors: both reach the driver's tracker over its endpoint with the
application's secret (the ``auth_secret`` option, redacted from plans). The
options are filled by :meth:`StructuredReceiverStream.source_options`.
"""

from __future__ import annotations

import base64
from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import pyarrow as pa
from pyspark.sql.datasource import (
    DataSource,
    DataSourceStreamReader,
    InputPartition,
)
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadLimit, ReadMaxRows

from spark_receivers.errors import ConfigError, OffsetError
from spark_receivers.rpc import messages as m
from spark_receivers.spark.block_source import (
    SECRET_OPTION,
    arrow_schema_of,
    conform,
    split_rows,
    tls_from_options,
)

if TYPE_CHECKING:
    from pyspark.sql import SparkSession
    from pyspark.sql.types import StructType

    from spark_receivers.rpc.transport import EndpointClient

FORMAT = "spark_receivers"
MAX_RECORDS_OPTION = "maxRecordsPerTrigger"


def _required(options: Mapping[str, str], key: str) -> str:
    value = options.get(key)
    if not value:
        msg = (
            f"option {key!r} is missing: read the stream with "
            "StructuredReceiverStream.read_stream(), or pass .options(**stream.source_options())"
        )
        raise ConfigError(msg)
    return value


def max_records_option(options: Mapping[str, str]) -> int | None:
    """``maxRecordsPerTrigger`` as a positive int, or None when unset.

    Spark hands options over case-insensitively (lower-cased once copied to a dict).
    """
    raw = next((v for k, v in options.items() if k.lower() == MAX_RECORDS_OPTION.lower()), None)
    if raw is None or raw == "":
        return None
    try:
        value = int(raw)
    except ValueError:
        value = 0
    if value <= 0:
        msg = f"option {MAX_RECORDS_OPTION}={raw!r} must be a positive integer (records)"
        raise ConfigError(msg)
    return value


class _TrackerClient:
    """Calls the driver's tracker; the gRPC channel is opened lazily, never pickled."""

    def __init__(self, options: Mapping[str, str]) -> None:
        self.address = _required(options, "tracker")
        self.secret = _required(options, SECRET_OPTION)
        self.timeout_s = float(options.get("timeout_s", "60"))
        self.tls = tls_from_options(options)
        self._client: EndpointClient | None = None

    def call(self, message: Any) -> Any:
        from spark_receivers.rpc.transport import EndpointClient

        if self._client is None:
            self._client = EndpointClient(self.address, self.secret, self.timeout_s, self.tls)
        return self._client.call(message)

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_client": None}


def slice_runs(slices: list[list[Any]], parts: int) -> list[list[list[Any]]]:
    """``[block info, first, rows]`` slices in at most ``parts`` runs of equal row counts.

    :func:`~spark_receivers.spark.block_source.split_rows` on the slices (decision 0025): a
    slice across the end of a run is cut in two. The same slices always give the same runs.
    """
    sized = [{"num_records": s[2], "slice": s} for s in slices]
    return [
        [
            [
                x["slice"][0],
                x["slice"][1] + first,
                (x["num_records"] if end is None else end) - first,
            ]
            for x, first, end in run
        ]
        for run in split_rows(sized, parts)
    ]


class SlicePartition(InputPartition):  # type: ignore[misc]
    """Row slices of consecutive blocks, read by one task: ``[block info, first, rows]``."""

    def __init__(self, index: int, slices: list[list[Any]]) -> None:
        super().__init__(index)
        self.slices = slices


class ReceiverStreamReader(DataSourceStreamReader):  # type: ignore[misc]
    """Offsets over one stream's block log; see the module doc."""

    def __init__(self, options: Mapping[str, str], schema: StructType | None = None) -> None:
        self._schema = schema  # Spark's; its Arrow form is built where read() runs
        self._tracker = _TrackerClient(options)
        self._stream_id = int(_required(options, "stream_id"))
        self._max_records = max_records_option(options)
        self._max_partitions = max(1, int(options.get("max_partitions", "1")))
        self._checkpoint_dir = options.get("checkpoint_dir") or None

    def _position(self, offset: Mapping[str, Any], what: str) -> int:
        stream = offset.get("stream_id")
        if stream != self._stream_id:
            msg = (
                f"the {what} offset {dict(offset)} belongs to stream {stream}, but this query "
                f"reads stream {self._stream_id}: use a new checkpointLocation for a new stream"
            )
            raise OffsetError(msg)
        return int(offset["position"])

    def _offset(self, position: int) -> dict[str, int]:
        return {"stream_id": self._stream_id, "position": position}

    def initialOffset(self) -> dict[str, int]:
        """The first position the driver still holds (0 for a fresh block log)."""
        return self._offset(self._tracker.call(m.StreamOffsets(self._stream_id))["base"])

    def getDefaultReadLimit(self) -> ReadLimit:
        """``ReadMaxRows(maxRecordsPerTrigger)`` when set, else everything available."""
        if self._max_records is None:
            return ReadAllAvailable()
        return ReadMaxRows(self._max_records)

    def latestOffset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, int]:
        """Append what was received to the log; the end offset within ``limit``."""
        max_records = limit.max_rows if isinstance(limit, ReadMaxRows) else -1
        begin = self._position(start, "start")
        end = self._tracker.call(m.AllocateOffsets(self._stream_id, begin, max_records))
        return self._offset(end)

    def reportLatestOffset(self) -> dict[str, int]:
        """Where the log would end if every block received so far were appended."""
        status = self._tracker.call(m.StreamOffsets(self._stream_id))
        return self._offset(status["end"] + status["queued"])

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> Sequence[InputPartition]:
        """The row slices of ``[start, end)``, in at most ``max_partitions`` tasks."""
        begin, finish = self._position(start, "start"), self._position(end, "end")
        slices = self._tracker.call(m.GetOffsetRange(self._stream_id, begin, finish))
        if not slices:
            return [SlicePartition(0, [])]
        return [
            SlicePartition(i, run) for i, run in enumerate(slice_runs(slices, self._max_partitions))
        ]

    def _arrow_schema(self) -> pa.Schema | None:
        return arrow_schema_of(self._schema) if self._schema is not None else None

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        """Fetch each block of the partition and yield its slice."""
        from spark_receivers.spark.block_fetch import fetch_block
        from spark_receivers.spark.worker_heap import freeze_in_task

        assert isinstance(partition, SlicePartition)
        freeze_in_task()  # the worker's imports, out of PySpark's collection after each task
        for info, first, rows in partition.slices:
            table = fetch_block(
                m.ReceivedBlockInfo.from_dict(info),
                self._tracker.secret,
                self._tracker.timeout_s,
                self._checkpoint_dir,
                tls=self._tracker.tls,
            )
            yield from conform(table.slice(first, rows), self._arrow_schema()).to_batches()

    def commit(self, end: dict[str, Any]) -> None:
        """Let the driver forget (and the receivers drop) the blocks below ``end``."""
        self._tracker.call(m.CommitOffsets(self._stream_id, self._position(end, "end")))

    def stop(self) -> None:
        """Close the connection to the tracker."""
        self._tracker.close()


class ReceiverStreamDataSource(DataSource):  # type: ignore[misc]
    """The ``spark_receivers`` data source: receiver streams for Structured Streaming."""

    @classmethod
    def name(cls) -> str:
        """The format name."""
        return FORMAT

    def schema(self) -> StructType:
        """The receiver's declared Arrow schema, asked of the driver's tracker."""
        from pyspark.sql.pandas.types import from_arrow_schema

        described = describe_stream(self.options)
        return from_arrow_schema(described["schema"])

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        """A reader over the stream's block log."""
        options = dict(self.options)
        if not options.get("stream_id"):
            options["stream_id"] = str(describe_stream(options)["stream_id"])
        return ReceiverStreamReader(options, schema)


def describe_stream(options: Mapping[str, str]) -> dict[str, Any]:
    """Ask the tracker which stream the ``stream`` (or ``stream_id``) option names."""
    stream = options.get("stream") or options.get("stream_id")
    if not stream:
        msg = "option 'stream' is missing: the stream id or the receiver's name"
        raise ConfigError(msg)
    client = _TrackerClient(options)
    try:
        described = dict(client.call(m.DescribeStream(stream)))
    finally:
        client.close()
    described["schema"] = pa.ipc.read_schema(pa.py_buffer(base64.b64decode(described["schema"])))
    return described


def register(spark: SparkSession) -> None:
    """Register the data source with ``spark`` (idempotent)."""
    spark.dataSource.register(ReceiverStreamDataSource)
