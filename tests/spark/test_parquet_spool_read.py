"""A batch's spooled Parquet blocks read by Spark's own reader (decision 0026), on local Spark."""

from __future__ import annotations

import datetime as dt
import decimal
import os
import shutil
from types import SimpleNamespace

import pyarrow as pa
import pytest
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    BooleanType,
    ByteType,
    DateType,
    DecimalType,
    DoubleType,
    FloatType,
    IntegerType,
    LongType,
    MapType,
    StringType,
    StructField,
    StructType,
    TimestampNTZType,
    TimestampType,
)

from spark_receivers.config import StreamingConfig
from spark_receivers.receiver.block_placement import write_spool_file
from spark_receivers.receiver.block_spool import close_quietly, make_spool
from spark_receivers.rpc import messages as m
from spark_receivers.rpc.auth import new_secret
from spark_receivers.rpc.transport import FlightEndpoint
from spark_receivers.spark import block_source
from spark_receivers.spark.block_source import (
    arrow_schema_of,
    blocks_dataframe,
    spark_reads_spool,
    spooled_parquet,
)

pytestmark = pytest.mark.spark

UTC = dt.UTC
EVERY_TYPE = StructType(
    [
        StructField("id", LongType()),
        StructField("flag", BooleanType()),
        StructField("small", ByteType()),
        StructField("n", IntegerType()),
        StructField("f", FloatType()),
        StructField("x", DoubleType()),
        StructField("amount", DecimalType(12, 3)),
        StructField("text", StringType()),
        StructField("raw", BinaryType()),
        StructField("day", DateType()),
        StructField("at", TimestampType()),
        StructField("local_at", TimestampNTZType()),
        StructField("tags", ArrayType(StringType())),
        StructField("attrs", MapType(StringType(), IntegerType())),
        StructField(
            "point", StructType([StructField("k", StringType()), StructField("v", DoubleType())])
        ),
    ]
)


def rows(start: int, n: int) -> list[dict]:
    out = []
    for i in range(start, start + n):
        null = i % 7 == 3  # every column but the id is null in some rows
        out.append(
            {
                "id": i,
                "flag": None if null else i % 2 == 0,
                "small": None if null else i % 100 - 50,
                "n": None if null else i * 3,
                "f": None if null else i / 4,
                "x": None if null else i / 3,
                "amount": None if null else decimal.Decimal(i) / 1000,
                "text": None if null else f"line {i} \u00e9t\u00e9",
                "raw": None if null else bytes([i % 256, 0, 255]),
                "day": None if null else dt.date(2026, 1, 1) + dt.timedelta(days=i),
                "at": None
                if null
                else dt.datetime(2026, 12, 1, tzinfo=UTC) + dt.timedelta(microseconds=i * 1_001),
                "local_at": None if null else dt.datetime(2026, 12, 1) + dt.timedelta(seconds=i),
                "tags": None if null else [f"t{i}", None, ""],
                "attrs": None if null else [("a", i), ("b", None)],
                "point": None if null else {"k": f"k{i}", "v": i * 0.5},
            }
        )
    return out


def block_table(start: int, n: int) -> pa.Table:
    return pa.Table.from_pylist(rows(start, n), schema=arrow_schema_of(EVERY_TYPE))


@pytest.fixture
def spool(tmp_path):
    """A live spool (its ``.alive`` lock held, as by a running keeper)."""
    path, lock = make_spool(str(tmp_path))
    assert path
    yield path
    close_quietly(lock)
    shutil.rmtree(path, ignore_errors=True)


def spooled(
    spool: str, i: int, table: pa.Table, server: str = "127.0.0.1:9"
) -> m.ReceivedBlockInfo:
    name = f"input-0-1-{i}"
    path = write_spool_file(spool, name, table, parquet=True)
    return m.ReceivedBlockInfo(0, name, table.num_rows, 0, server, local_file=str(path))


def by_id(df) -> list:
    return sorted((r.asDict(recursive=True) for r in df.collect()), key=lambda r: r["id"])


def test_spooled_parquet_is_read_by_sparks_reader_with_every_value_as_python_tasks_read_it(
    spark, spool
):
    infos = [spooled(spool, i, block_table(i * 40, 40)) for i in range(3)]
    by_spark = blocks_dataframe(spark, infos, EVERY_TYPE, "unused", parquet_spool=True)
    assert sorted(by_spark.inputFiles()) == sorted(f"file://{b.local_file}" for b in infos)
    by_tasks = blocks_dataframe(spark, infos, EVERY_TYPE, "unused", parquet_spool=False)
    assert by_tasks.inputFiles() == []  # mapInArrow tasks decode the same files
    assert by_spark.schema == by_tasks.schema == EVERY_TYPE
    read = by_id(by_spark)
    assert read == by_id(by_tasks)
    assert [r["id"] for r in read] == list(range(120))
    assert read[0]["at"] is not None and read[3]["text"] is None


def test_blocks_of_a_gone_keeper_or_with_no_file_are_read_by_tasks_beside_the_parquet_read(
    spark, spool, tmp_path
):
    plain = pa.table({"value": [f"r{i}" for i in range(30)]})
    schema = StructType([StructField("value", StringType())])
    served = {"input-0-1-8": plain.slice(0, 10), "input-0-1-9": plain.slice(10, 10)}
    secret = new_secret()
    server = FlightEndpoint(
        "test-blocks", "127.0.0.1", secret, m.SUPERVISOR_MESSAGES, lambda _: True,
        lambda ticket: served[ticket.decode()],
    )  # fmt: skip
    try:
        live = spooled(spool, 0, plain.slice(20, 10))
        dead_spool, lock = make_spool(str(tmp_path))
        dead = spooled(dead_spool, 8, served["input-0-1-8"], server.address)
        close_quietly(lock)  # its keeper is gone: the file is on disk, not to be read
        fetched = m.ReceivedBlockInfo(0, "input-0-1-9", 10, 0, server.address)
        infos = [dead, fetched, live]
        assert spooled_parquet(infos) == [live]
        df = blocks_dataframe(spark, infos, schema, secret, parquet_spool=True)
        assert df.inputFiles() == [f"file://{live.local_file}"]
        assert sorted(r.value for r in df.collect()) == sorted(plain.column(0).to_pylist())
    finally:
        server.close()


def test_a_file_that_is_not_its_blocks_own_in_a_spool_is_never_handed_to_spark(spool, tmp_path):
    good = spooled(spool, 0, block_table(0, 3))
    outside = tmp_path / "input-0-1-1.abc.parquet"  # a Parquet file, but in no spool
    shutil.copy(good.local_file, outside)
    link = os.path.join(spool, "input-0-1-2.abc.parquet")
    os.symlink(good.local_file, link)
    others = [
        m.ReceivedBlockInfo(0, "input-0-1-1", 3, 0, None, local_file=str(outside)),
        m.ReceivedBlockInfo(0, "input-0-1-2", 3, 0, None, local_file=link),
        m.ReceivedBlockInfo(0, "input-0-1-3", 3, 0, None, local_file=good.local_file),
    ]
    assert spooled_parquet([good, *others]) == [good]


def test_more_files_than_one_listing_takes_are_read_as_a_union(spark, spool, monkeypatch):
    monkeypatch.setattr(block_source, "FILES_PER_READ", 2)
    infos = [spooled(spool, i, block_table(i * 10, 10)) for i in range(5)]
    df = blocks_dataframe(spark, infos, EVERY_TYPE, "unused", parquet_spool=True)
    assert len(df.inputFiles()) == 5
    assert [r["id"] for r in by_id(df)] == list(range(50))


@pytest.mark.parametrize(
    ("kind", "master", "changes", "expected"),
    [
        ("classic", "local[4]", {}, True),
        ("classic", "local", {}, True),
        ("classic", "local[4]", {"batch_parquet_spool": False}, False),
        ("classic", "local[4]", {"block_keeper_spool": False}, False),
        ("classic", "local[4]", {"block_keeper_enabled": False}, False),
        ("classic", "spark://127.0.0.1:7077", {}, False),
        ("classic", "local-cluster[2,1,1024]", {}, False),
        ("connect", "local[4]", {}, False),
    ],
)
def test_the_driver_reads_spooled_parquet_only_where_its_jvm_runs_every_task(
    kind, master, changes, expected
):
    side = SimpleNamespace(kind=kind, master=master)
    config = StreamingConfig(**{"batch_parquet_spool": True, **changes})
    assert spark_reads_spool(side, config) is expected
    assert spark_reads_spool(side, StreamingConfig(**changes)) is False  # off by default
