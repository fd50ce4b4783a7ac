"""The ``table:NAME`` sink: an external Parquet table that survives restarts without duplicates.

Why external and re-registered: Spark's default catalog lives in the driver's
memory, so a restarted ``ingest`` would not know the table, and ``saveAsTable``
would then meet the files of the earlier run (``LOCATION_ALREADY_EXISTS``). So
the table is declared with an explicit location (``path`` or
``<spark.sql.warehouse.dir>/<name>``) at every start, its partitions recovered
from the files there, and every batch written into its own ``batch_time_ms``
partition with ``INSERT OVERWRITE ... PARTITION (batch_time_ms=<t>)``: only that
partition is replaced, whatever the session's ``partitionOverwriteMode``. A batch
that runs again after a crash replaces what its first run wrote; it is never
appended twice. ``DROP TABLE`` leaves the files.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING

from spark_receivers.errors import ConfigError
from spark_receivers.spark.session_kind import is_connect

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.types import StructType

log = logging.getLogger(__name__)

__all__ = ["BATCH_COLUMN", "open_table", "table_schema"]

BATCH_COLUMN = "batch_time_ms"


def table_schema(schema: pa.Schema) -> StructType:
    """The table's Spark schema: the receiver's columns, then ``batch_time_ms BIGINT``."""
    from pyspark.sql.pandas.types import from_arrow_schema
    from pyspark.sql.types import LongType, StructField, StructType

    fields = list(from_arrow_schema(schema).fields)
    if any(f.name == BATCH_COLUMN for f in fields):
        msg = f"sink table: the records already have a column {BATCH_COLUMN!r}"
        raise ConfigError(msg)
    return StructType([*fields, StructField(BATCH_COLUMN, LongType(), nullable=False)])


def open_table(
    spark: SparkSession,
    name: str,
    path: str | None,
    schema: pa.Schema,
    say: Callable[[str], None] = log.info,
) -> Callable[[DataFrame, int], None]:
    """Register ``name`` over its location (see the module doc); return the batch writer.

    ``say`` is told how many batch partitions earlier runs left. Refuses
    (:class:`ConfigError`) an existing table whose columns differ from the records'.
    """
    wanted = table_schema(schema)
    database, _, _table = name.rpartition(".")
    if database:
        spark.sql(f"CREATE DATABASE IF NOT EXISTS `{database}`")
    quoted = ".".join(f"`{p}`" for p in name.split("."))
    if not spark.catalog.tableExists(name):
        location = path or _default_location(spark, name)
        _mkdirs(spark, location)
        spark.sql(
            f"CREATE TABLE IF NOT EXISTS {quoted} ({wanted.toDDL()}) USING parquet "
            f"PARTITIONED BY ({BATCH_COLUMN}) LOCATION '{_sql_string(location)}'"
        )
        spark.sql(f"ALTER TABLE {quoted} RECOVER PARTITIONS")
    existing = spark.table(name).schema
    if [(f.name, f.dataType) for f in existing] != [(f.name, f.dataType) for f in wanted]:
        msg = (
            f"sink table:{name}: the table exists with columns {existing.simpleString()}, "
            f"but the records are {wanted.simpleString()}; write to another table"
        )
        raise ConfigError(msg)
    partitions = spark.sql(f"SHOW PARTITIONS {quoted}").count()
    say(f"table {name}: {partitions} batch partition(s) from earlier runs")

    columns = ", ".join(f"`{f.name}`" for f in wanted.fields if f.name != BATCH_COLUMN)

    def table(df: DataFrame, batch_time_ms: int) -> None:
        # A static partition spec: only this batch's partition is replaced, whatever
        # the session's partitionOverwriteMode.
        view = f"spark_receivers_batch_{batch_time_ms}"
        df.createOrReplaceTempView(view)
        try:
            spark.sql(
                f"INSERT OVERWRITE TABLE {quoted} PARTITION ({BATCH_COLUMN}={batch_time_ms}) "
                f"SELECT {columns} FROM {view}"
            )
        finally:
            spark.catalog.dropTempView(view)

    table.__name__ = f"table:{name}"
    return table


def _default_location(spark: SparkSession, name: str) -> str:
    warehouse = str(spark.conf.get("spark.sql.warehouse.dir") or "spark-warehouse").rstrip("/")
    database, _, table = name.rpartition(".")
    return f"{warehouse}/{database}.db/{table}" if database else f"{warehouse}/{table}"


def _mkdirs(spark: SparkSession, location: str) -> None:
    """Create the location through Hadoop's filesystem (RECOVER PARTITIONS needs it)."""
    if is_connect(spark):
        msg = (
            f"sink table: creates its table's directory {location} through Hadoop's "
            "FileSystem, which a Spark Connect client cannot reach; create the table first "
            "(it is then reused), or use the sink parquet:DIR or format:NAME with --remote"
        )
        raise ConfigError(msg)
    sc = spark.sparkContext
    jvm = sc._jvm
    assert jvm is not None
    hadoop_path = jvm.org.apache.hadoop.fs.Path(location)
    fs = hadoop_path.getFileSystem(sc._jsc.hadoopConfiguration())  # type: ignore[union-attr]
    fs.mkdirs(hadoop_path)


def _sql_string(text: str) -> str:
    return text.replace("\\", "\\\\").replace("'", "\\'")
